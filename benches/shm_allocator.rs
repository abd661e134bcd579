//! The shared-memory allocator: the pure offset allocator, and whole allocate/free pairs through
//! the transport (segment blocks, reference counts, reclaim), with 1 and 2 threads.
//! Run alone with `cargo bench --bench shm_allocator`.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferromq::{ShmOptions, ShmTransport, Transport};
use ferromq_shm::allocator::Allocator;

fn allocator(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("shm_allocator");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(1));
    group.bench_function("offsets_pair_4k", |bencher| {
        let mut allocator = Allocator::new(4096, 4096 + (1 << 30));
        bencher.iter(|| {
            let offset = allocator.allocate(4096).expect("room");
            allocator.free(offset, 4096);
        });
    });
    let session = format!("bench-alloc-{}", std::process::id());
    for n_threads in [1usize, 2] {
        group.bench_with_input(
            BenchmarkId::new("transport_mixed_sizes", n_threads),
            &n_threads,
            |bencher, &n_threads| {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(n_threads)
                    .enable_all()
                    .build()
                    .expect("runtime");
                let transport = ShmTransport::new(ShmOptions {
                    session: session.clone(),
                    segment_size: 1 << 30,
                    ..ShmOptions::default()
                });
                bencher.iter_custom(|n_iterations| {
                    runtime.block_on(async {
                        let started = Instant::now();
                        let tasks: Vec<_> = (0..n_threads)
                            .map(|thread_idx| {
                                let transport = transport.clone();
                                tokio::spawn(async move {
                                    for iteration in 0..n_iterations / n_threads as u64 + 1 {
                                        let size = 64 << ((iteration as usize + thread_idx) % 12);
                                        drop(transport.new_message(size).await.expect("room"));
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("task");
                        }
                        started.elapsed()
                    })
                });
            },
        );
    }
    group.finish();
    let _ = ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), &session, true);
}

criterion_group!(benches, allocator);
criterion_main!(benches);
