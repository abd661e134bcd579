//! Round-trip latency over req/rep, 64 B and 1 MiB, zeromq ipc and shmem (one process).
//! Run alone with `cargo bench --bench latency`.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ferromq::prelude::*;
use ferromq::{ShmOptions, ShmTransport, ZmqTransport};

fn latency(criterion: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let pid = std::process::id();
    let session = format!("bench-latency-{pid}");
    let dir = std::env::temp_dir();
    let shm: Box<dyn Transport> = Box::new(ShmTransport::new(ShmOptions {
        session: session.clone(),
        segment_size: 256 << 20,
        ..ShmOptions::default()
    }));
    let cases: Vec<(&str, Box<dyn Transport>, String)> = vec![
        (
            "zeromq-ipc",
            Box::new(ZmqTransport::new()),
            format!("ipc://{}/ferromq-lat-{pid}.ipc", dir.display()),
        ),
        (
            "shmem",
            shm,
            format!("ipc://{}/ferromq-lat-shm-{pid}.ipc", dir.display()),
        ),
    ];
    let mut group = criterion.benchmark_group("round_trip");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (name, transport, address) in cases {
        let (mut rep, mut req) = runtime.block_on(async {
            let rep_config =
                ChannelConfig::new("data", SocketType::Rep, Method::Bind).with_address(&address);
            let mut rep = Channel::open(transport.as_ref(), rep_config, "data")
                .await
                .expect("rep");
            rep.bind_configured().await.expect("bind");
            let req_config =
                ChannelConfig::new("data", SocketType::Req, Method::Connect).with_address(&address);
            let mut req = Channel::open(transport.as_ref(), req_config, "data")
                .await
                .expect("req");
            req.connect_configured().await.expect("connect");
            (rep, req)
        });
        for size in [64usize, 1 << 20] {
            group.bench_with_input(BenchmarkId::new(name, size), &size, |bencher, &size| {
                bencher.iter_custom(|n_iterations| {
                    runtime.block_on(async {
                        let started = Instant::now();
                        for _ in 0..n_iterations {
                            let request = transport.new_message(size).await.expect("message");
                            let client = async {
                                req.send(request).await.expect("send");
                                req.receive().await.expect("reply");
                            };
                            let server = async {
                                let request = rep.receive().await.expect("request");
                                rep.send(request).await.expect("echo");
                            };
                            tokio::join!(client, server);
                        }
                        started.elapsed()
                    })
                });
            });
        }
    }
    group.finish();
    let _ = ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), &session, true);
}

criterion_group!(benches, latency);
criterion_main!(benches);
