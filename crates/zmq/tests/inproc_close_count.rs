//! An inproc pull that closes while its push is sending accounts for every message the push's
//! `send` accepted: each was received before the close or is counted by the close's
//! `Undelivered`. A send that had room set aside before the close and writes into it just
//! after the count (another thread, past its check that the receiver is open) is the case this
//! guards: the close waits for such a write instead of leaving the message in an inbox nobody
//! reads (`inproc.rs`'s unit tests drive that interleaving by hand).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ferromq_core::{Channel, ChannelConfig, Error, Message, Method, SocketType};

mod support;

async fn open(socket_type: SocketType, method: Method, address: &str) -> Channel {
    let mut config = ChannelConfig::new("data", socket_type, method).with_address(address);
    // Room for the whole stream: the push is never held back, so the close meets it mid-send.
    config.snd_buf_size = 100_000;
    config.rcv_buf_size = 100_000;
    support::open(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_closing_mid_stream_accounts_for_every_accepted_message() {
    const ROUNDS: usize = 300;
    for round in 0..ROUNDS {
        let address = format!("inproc://close-count-{}-{round}", std::process::id());
        let mut pull = open(SocketType::Pull, Method::Bind, &address).await;
        let mut push = open(SocketType::Push, Method::Connect, &address).await;
        let accepted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sender = tokio::spawn({
            let accepted = Arc::clone(&accepted);
            let stop = Arc::clone(&stop);
            async move {
                while !stop.load(Ordering::Relaxed) {
                    // Once the pull is gone nothing takes a message: the timeout hands it back
                    // (not accepted, so not owed).
                    match push
                        .send_timeout(Message::from("m"), Duration::from_millis(5))
                        .await
                    {
                        Ok(()) => {
                            accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(failed) if matches!(failed.error, Error::Timeout { .. }) => {}
                        Err(failed) => panic!("send: {}", failed.error),
                    }
                }
                push
            }
        });
        // Take a few, so that the push is streaming when the close comes.
        let mut n_received = 0_u64;
        while n_received < 50 {
            pull.receive().await.expect("receive");
            n_received += 1;
        }
        let n_unread = match pull.close().await {
            Ok(()) => 0,
            Err(Error::Undelivered { n_messages, .. }) => n_messages,
            Err(error) => panic!("close: {error}"),
        };
        // The pull is gone: the push accepts nothing more (its sends time out).
        stop.store(true, Ordering::Relaxed);
        let mut push = sender.await.expect("the sender task");
        push.close().await.expect("close push");
        let n_accepted = accepted.load(Ordering::Relaxed);
        assert_eq!(
            n_accepted,
            n_received + n_unread,
            "round {round}: the push accepted {n_accepted}, the pull received {n_received} \
             and its close counted {n_unread} unread"
        );
    }
}
