//! Message creation and typed-codec encode/decode. Run alone with `cargo bench --bench messages`.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ferromq::prelude::*;

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Header {
    event_id: u64,
    orbit: u32,
    flags: u32,
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Event {
    event_id: u64,
    detector: String,
    energies: Vec<f32>,
}

fn messages(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("messages");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    group.bench_function("new_1kib", |bencher| bencher.iter(|| Message::new(1024)));
    group.bench_function("from_vec_1kib", |bencher| {
        bencher.iter(|| Message::from(vec![0u8; 1024]))
    });
    let event = Event {
        event_id: 7,
        detector: "TPC".to_owned(),
        energies: vec![1.5; 64],
    };
    group.bench_function("json_round_trip", |bencher| {
        bencher.iter(|| {
            Json::<Event>::decode(Json(event.clone()).encode().expect("encode")).expect("decode")
        })
    });
    group.bench_function("postcard_round_trip", |bencher| {
        bencher.iter(|| {
            Postcard::<Event>::decode(Postcard(event.clone()).encode().expect("encode"))
                .expect("decode")
        })
    });
    let header = Header {
        event_id: 7,
        orbit: 3,
        flags: 1,
    };
    group.bench_function("pod_round_trip", |bencher| {
        bencher
            .iter(|| Pod::<Header>::decode(Pod(header).encode().expect("encode")).expect("decode"))
    });
    group.finish();
}

criterion_group!(benches, messages);
criterion_main!(benches);
