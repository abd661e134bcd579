//! What a `call_return` costs in heap allocations, both members counted (they share this
//! process): two members of one shmem session on one thread, a counting global allocator over
//! 20 000 round trips of 64 bytes each way to a synchronous handler, after a warm-up.
//!
//! 10.0 per round trip when this test was written: each dispatcher turned the frame's parts
//! into a `Vec` (2), the handler's result went into a vector of postcard's own that started
//! empty and grew (an allocation and three reallocations: 4), and the result's bytes were
//! copied into a `Vec` for the caller (1). Now a synchronous handler encodes into a buffer its
//! dispatcher lends it call after call, a frame's parts are iterated where they are, and a
//! result of up to 64 bytes travels to its caller inline. What is left: the caller's oneshot
//! for the result, and each dispatcher's wait for its frame (the transport's receive future,
//! boxed by `Socket::receive_parts`).

use std::sync::Arc;

use ferromq_core::{Address, Transport};
use ferromq_rpc::{Aggregation, Handlers, Inbound, Member, Rpc, RpcOptions};
use ferromq_shm::{ShmOptions, ShmTransport};

mod support;
use support::Session;

#[global_allocator]
static ALLOCATOR: ferromq_alloc_count::Counting = ferromq_alloc_count::Counting;

ferromq_rpc::procedures! {
    /// 64 bytes each way, as `ferromq bench rpc`'s round trips.
    Echo = "allocations-echo": [[u8; 32]; 2] => [[u8; 32]; 2];
}

const WARM_UP: u64 = 5_000;
const MEASURED: u64 = 20_000;

#[test]
fn a_round_trip_to_a_synchronous_handler_allocates_at_most_three_times() {
    // Its shared memory and ipc files go when the test ends, passed or failed.
    let session = Session::new("allocations");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let per_call = runtime.block_on(async {
        let transport: Arc<dyn Transport> = Arc::new(ShmTransport::new(ShmOptions {
            session: session.0.clone(),
            segment_size: 64 << 20,
            ..ShmOptions::default()
        }));
        let mut inbounds = Vec::new();
        for idx in 0..2 {
            let path = std::env::temp_dir().join(format!("ferromq-{}-m{idx}.ipc", session.0));
            let address: Address = format!("ipc://{}", path.display())
                .parse()
                .expect("an address");
            inbounds.push(
                Inbound::bind(transport.as_ref(), &address)
                    .await
                    .expect("bound"),
            );
        }
        let members: Vec<Member> = inbounds
            .iter()
            .enumerate()
            .map(|(idx, inbound)| Member {
                name: format!("m{idx}"),
                address: inbound.address().clone(),
            })
            .collect();
        let options = || RpcOptions {
            aggregation: Aggregation::None,
            ..RpcOptions::default()
        };
        let mut rpcs = Vec::new();
        for (idx, inbound) in inbounds.into_iter().enumerate() {
            let handlers = Handlers::new().on_sync::<Echo, _>(|_, args| args);
            rpcs.push(
                Rpc::start(
                    Arc::clone(&transport),
                    idx,
                    &members,
                    inbound,
                    handlers,
                    options(),
                )
                .await
                .expect("started"),
            );
        }
        let args = [[7; 32], [9; 32]];
        for _ in 0..WARM_UP {
            assert_eq!(rpcs[0].call_return::<Echo>(1, &args).await.unwrap(), args);
        }
        let before = ferromq_alloc_count::allocations();
        for _ in 0..MEASURED {
            assert_eq!(rpcs[0].call_return::<Echo>(1, &args).await.unwrap(), args);
        }
        let allocations = ferromq_alloc_count::allocations() - before;
        for rpc in rpcs {
            rpc.shutdown().await.expect("shut down");
        }
        allocations as f64 / MEASURED as f64
    });
    println!("{per_call:.3} heap allocations per call_return");
    assert!(
        per_call < 3.5,
        "{per_call:.3} heap allocations per call_return (both members)"
    );
}
