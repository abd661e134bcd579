//! A busy-polled receive (channel option `busyPoll`) spins on its rings instead of sleeping, and
//! within a poll while no other task runs. It must still let the runtime's other tasks run
//! between two of its looks, also those that yielded with tokio's `yield_now` (a sender waiting
//! for room in a ring does): they run only once the runtime has turned its drivers, which it
//! does when its run queue is empty. A receive that woke itself at once stayed on the run queue,
//! and they got a turn only at its looks at its socket, one in 16.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ferromq_core::{Error, Message, Method, SocketType};
use ferromq_shm::ShmOptions;

mod support;
use support::TestSession;

#[tokio::test]
async fn a_busy_polled_receive_lets_a_task_that_yielded_run_between_its_looks() {
    let session = TestSession::new("busy-poll-turns");
    let transport = session.transport(ShmOptions {
        segment_size: 4 << 20,
        ..ShmOptions::default()
    });
    let address = session.address();
    let mut pull =
        support::open_channel(&transport, SocketType::Pull, Method::Bind, &address, true).await;
    let mut push = support::open_channel(
        &transport,
        SocketType::Push,
        Method::Connect,
        &address,
        false,
    )
    .await;
    // One message in and out first, so that the receive below spins on a ring.
    let first = support::one_message_through(&mut push, &mut pull, Message::from("first")).await;
    assert_eq!(first.data(), b"first");

    let turns = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let yielding = tokio::spawn({
        let (turns, stop) = (Arc::clone(&turns), Arc::clone(&stop));
        async move {
            while !stop.load(Ordering::Relaxed) {
                turns.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });
    // In a task, as a device's code runs (the `block_on` future of a current-thread runtime is
    // polled only between the runtime's turns). Each poll of the receive is one look at the
    // ring: a busy-polled receive yields after each look that finds nothing.
    let receiving = tokio::spawn(async move {
        let mut n_looks = 0u64;
        let received = {
            let mut receive = std::pin::pin!(pull.receive_timeout(Duration::from_millis(200)));
            std::future::poll_fn(|context| {
                n_looks += 1;
                receive.as_mut().poll(context)
            })
            .await
        };
        (pull, received, n_looks)
    });
    let (mut pull, received, n_looks) = receiving.await.unwrap();
    assert!(
        matches!(received, Err(Error::Timeout { .. })),
        "nothing was sent: {received:?}"
    );
    stop.store(true, Ordering::Relaxed);
    yielding.await.unwrap();
    let turns = turns.load(Ordering::Relaxed);
    assert!(
        n_looks > 100,
        "the receive looked {n_looks} times in 200 ms"
    );
    assert!(
        turns * 4 >= n_looks,
        "a task that yielded ran {turns} times while the busy-polled receive looked {n_looks} \
         times"
    );
    push.close().await.unwrap();
    pull.close().await.unwrap();
}
