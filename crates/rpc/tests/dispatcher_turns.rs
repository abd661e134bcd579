//! A dispatcher that finds frame after frame already there (so none of them makes it wait) still
//! lets the other tasks of its runtime run: it takes such frames without the select over stop,
//! loopback and channel, but spends the runtime's budget per frame as a channel's receive does,
//! so a run of one-call frames (which `YIELD_AFTER`, looked at every 8 calls of a frame, never
//! interrupts) gives the runtime a turn every 128 frames.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferromq_core::{Address, Transport};
use ferromq_rpc::{Aggregation, Handlers, Inbound, Member, Rpc, RpcOptions};

ferromq_rpc::procedures! {
    Mark = "turns-mark": u32 => ();
    Done = "turns-done": () => ();
}

/// Frames queued to the member itself before its dispatcher runs.
const N_FRAMES: u32 = 4096;

#[test]
fn a_dispatcher_fed_frame_after_frame_lets_the_other_tasks_run() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let transport: Arc<dyn Transport> = Arc::new(ferromq_zmq::ZmqTransport::new());
        let address: Address = "inproc://rpc-dispatcher-turns".parse().expect("an address");
        let inbound = Inbound::bind(transport.as_ref(), &address)
            .await
            .expect("bound");
        // What another task of the runtime had counted when each call ran.
        let ticks = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handlers = Handlers::new()
            .on_sync::<Mark, _>({
                let (ticks, seen) = (Arc::clone(&ticks), Arc::clone(&seen));
                move |_, _| seen.lock().unwrap().push(ticks.load(Ordering::Relaxed))
            })
            .on_sync::<Done, _>(|_, ()| ());
        let options = RpcOptions {
            aggregation: Aggregation::None,
            ..RpcOptions::default()
        };
        let members = [Member {
            name: "solo".to_owned(),
            address,
        }];
        let rpc = Rpc::start(transport, 0, &members, inbound, handlers, options)
            .await
            .expect("started");
        // One frame per call, all in the loopback before the dispatcher's next turn.
        for idx in 0..N_FRAMES {
            rpc.queue_call::<Mark>(0, &idx).expect("queued");
        }
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    ferromq_core::yield_once().await;
                }
            }
        });
        // Served after every mark: calls to one member run in order.
        rpc.call_return::<Done>(0, &()).await.expect("done");
        ticker.abort();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), N_FRAMES as usize, "every mark ran");
        let turns = seen.windows(2).filter(|pair| pair[1] > pair[0]).count();
        assert!(
            turns >= (N_FRAMES / 256) as usize,
            "the other task ran {turns} times while {N_FRAMES} one-call frames were served"
        );
        rpc.shutdown().await.expect("shut down");
    });
}
