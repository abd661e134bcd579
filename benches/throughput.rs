//! Throughput per transport and message size, sender and receiver in one process (two tasks).
//!
//! Two-process figures come from `ferromq bench`; these catch regressions quickly. Run alone
//! with `cargo bench --bench throughput`.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferromq::prelude::*;
use ferromq::{ShmOptions, ShmTransport, ZmqTransport};

const SIZES: [usize; 5] = [64, 1024, 64 << 10, 1 << 20, 8 << 20];

struct Pair {
    transport: Box<dyn Transport>,
    push: Channel,
    pull: Channel,
}

async fn connected_pair(transport: Box<dyn Transport>, address: &str) -> Pair {
    let pull_config =
        ChannelConfig::new("data", SocketType::Pull, Method::Bind).with_address(address);
    let mut pull = Channel::open(transport.as_ref(), pull_config, "data")
        .await
        .expect("open pull");
    let bound = pull
        .bind_configured()
        .await
        .expect("bind")
        .for_local_connect();
    let push_config = ChannelConfig::new("data", SocketType::Push, Method::Connect)
        .with_address(bound.to_string());
    let mut push = Channel::open(transport.as_ref(), push_config, "data")
        .await
        .expect("open push");
    push.connect_configured().await.expect("connect");
    Pair {
        transport,
        push,
        pull,
    }
}

fn throughput(criterion: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let pid = std::process::id();
    let dir = std::env::temp_dir();
    let session = format!("bench-throughput-{pid}");
    let shm: Box<dyn Transport> = Box::new(ShmTransport::new(ShmOptions {
        session: session.clone(),
        segment_size: 1 << 30,
        ..ShmOptions::default()
    }));
    let cases: Vec<(&str, Box<dyn Transport>, String)> = vec![
        (
            "inproc",
            Box::new(ZmqTransport::new()),
            format!("inproc://bench-{pid}"),
        ),
        (
            "zeromq-ipc",
            Box::new(ZmqTransport::new()),
            format!("ipc://{}/ferromq-bench-{pid}.ipc", dir.display()),
        ),
        (
            "zeromq-tcp",
            Box::new(ZmqTransport::new()),
            "tcp://127.0.0.1:0".to_owned(),
        ),
        (
            "shmem",
            shm,
            format!("ipc://{}/ferromq-bench-shm-{pid}.ipc", dir.display()),
        ),
    ];
    let mut group = criterion.benchmark_group("throughput");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (name, transport, address) in cases {
        let mut pair = runtime.block_on(connected_pair(transport, &address));
        for size in SIZES {
            let n_msgs: u64 = if size >= 1 << 20 {
                16
            } else if size >= 64 << 10 {
                64
            } else {
                1024
            };
            group.throughput(Throughput::Elements(n_msgs));
            group.bench_with_input(BenchmarkId::new(name, size), &size, |bencher, &size| {
                bencher.iter_custom(|n_iterations| {
                    let started = Instant::now();
                    runtime.block_on(async {
                        for _ in 0..n_iterations {
                            let Pair {
                                transport,
                                push,
                                pull,
                            } = &mut pair;
                            let sender = async {
                                for _ in 0..n_msgs {
                                    let message =
                                        transport.new_message(size).await.expect("message");
                                    push.send(message).await.expect("send");
                                }
                            };
                            let receiver = async {
                                for _ in 0..n_msgs {
                                    pull.receive().await.expect("receive");
                                }
                            };
                            tokio::join!(sender, receiver);
                        }
                    });
                    started.elapsed()
                });
            });
        }
    }
    group.finish();
    let _ = ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), &session, true);
}

criterion_group!(benches, throughput);
criterion_main!(benches);
