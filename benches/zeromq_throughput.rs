//! Throughput of the zeromq transport in one process (inproc, ipc, tcp) across message sizes.
//!
//! Two-process figures come from `ferromq bench`; these are for spotting regressions quickly.
//! Run alone with `cargo bench --bench zeromq_throughput`.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferromq::ZmqTransport;
use ferromq::prelude::*;

const SIZES: [usize; 4] = [64, 1024, 64 * 1024, 1024 * 1024];

struct Pair {
    push: Channel,
    pull: Channel,
}

async fn connected_pair(address: &str) -> Pair {
    let transport = ZmqTransport::new();
    let pull_config =
        ChannelConfig::new("data", SocketType::Pull, Method::Bind).with_address(address);
    let mut pull = Channel::open(&transport, pull_config, "data")
        .await
        .expect("open pull");
    let bound = pull
        .bind_configured()
        .await
        .expect("bind")
        .for_local_connect();
    let push_config = ChannelConfig::new("data", SocketType::Push, Method::Connect)
        .with_address(bound.to_string());
    let mut push = Channel::open(&transport, push_config, "data")
        .await
        .expect("open push");
    push.connect_configured().await.expect("connect");
    Pair { push, pull }
}

fn throughput(criterion: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ipc_path = std::env::temp_dir().join(format!("ferromq-bench-{}.ipc", std::process::id()));
    let addresses = [
        ("inproc", format!("inproc://bench-{}", std::process::id())),
        ("ipc", format!("ipc://{}", ipc_path.display())),
        ("tcp", "tcp://127.0.0.1:0".to_owned()),
    ];
    let mut group = criterion.benchmark_group("zeromq_push_pull");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (transport_name, address) in &addresses {
        let mut pair = runtime.block_on(connected_pair(address));
        for size in SIZES {
            let n_msgs: u64 = if size >= 64 * 1024 { 64 } else { 1024 };
            group.throughput(Throughput::Bytes(size as u64 * n_msgs));
            group.bench_with_input(
                BenchmarkId::new(*transport_name, size),
                &size,
                |bencher, &size| {
                    bencher.iter_custom(|n_iterations| {
                        let started = Instant::now();
                        runtime.block_on(async {
                            for _ in 0..n_iterations {
                                let sender = async {
                                    for _ in 0..n_msgs {
                                        pair.push.send(Message::new(size)).await.expect("send");
                                    }
                                };
                                let receiver = async {
                                    for _ in 0..n_msgs {
                                        pair.pull.receive().await.expect("receive");
                                    }
                                };
                                tokio::join!(sender, receiver);
                            }
                        });
                        started.elapsed()
                    });
                },
            );
        }
    }
    group.finish();
    let _ = std::fs::remove_file(ipc_path);
}

criterion_group!(benches, throughput);
criterion_main!(benches);
