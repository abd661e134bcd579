//! What a receiver leaves untaken in its descriptor ring is released once both ends are done
//! with the ring, by whichever end finishes last: the producer when the receiver left first,
//! the receiver when the producer closed first. Before, those messages' blocks stayed in the
//! sender's segment until the session's memory was removed (a receiver restarted a few times
//! left the sender's segment full). A receiver that releases what its sender handed over to it
//! (the sender's close reported it delivered) reports it lost.

use std::time::Duration;

use ferromq_core::{Channel, ChannelConfig, Message, Method, SocketType, Transport};
use ferromq_shm::{ShmOptions, ShmTransport};

mod support;
use support::TestSession;

const SEGMENT: usize = 8 << 20;
const MESSAGE: usize = 64 << 10;
/// 2.5 MiB of messages: with them leaked, 6 MiB no longer fit in the segment.
const SENT: usize = 40;
const TAKEN: usize = 5;
const PUSH_PULL: (SocketType, SocketType) = (SocketType::Push, SocketType::Pull);

/// A bound push and a connected pull of one transport, the pull having taken a first message
/// (its ring is adopted), then `SENT` messages of `MESSAGE` bytes sent and `TAKEN` of them
/// taken.
async fn stream_with_untaken(
    name: &str,
    (sending, receiving): (SocketType, SocketType),
) -> (ShmTransport, Channel, Channel, TestSession) {
    let session = TestSession::new(&format!("untaken-{name}"));
    let transport = session.transport(ShmOptions {
        segment_size: SEGMENT,
        ..ShmOptions::default()
    });
    let address = session.address();
    let mut config = ChannelConfig::new("data", sending, Method::Bind).with_address(&address);
    // A close waits this long for the receiver to take what is left.
    config.linger = 100;
    let mut push = Channel::open(&transport, config, "data").await.unwrap();
    push.bind_configured().await.unwrap();
    let mut config = ChannelConfig::new("data", receiving, Method::Connect).with_address(&address);
    config.linger = 100;
    let mut pull = Channel::open(&transport, config, "data").await.unwrap();
    pull.connect_configured().await.unwrap();
    if receiving == SocketType::Sub {
        pull.subscribe("").await.unwrap();
        // A publisher drops what it sends before its subscriber is connected (ZeroMQ's slow
        // joiner): it sends until the subscriber gets one, which then takes the rest.
        loop {
            push.send(Message::from("first")).await.unwrap();
            if tokio::time::timeout(Duration::from_millis(10), pull.receive())
                .await
                .is_ok()
            {
                break;
            }
        }
        while tokio::time::timeout(Duration::from_millis(100), pull.receive())
            .await
            .is_ok()
        {}
    } else {
        push.send(Message::from("first")).await.unwrap();
        assert_eq!(pull.receive().await.unwrap().data(), b"first");
    }
    for _ in 0..SENT {
        let message = transport.new_message(MESSAGE).await.unwrap();
        push.send(message).await.unwrap();
    }
    for _ in 0..TAKEN {
        assert_eq!(pull.receive().await.unwrap().data().len(), MESSAGE);
    }
    (transport, push, pull, session)
}

/// Whether the sender's segment has room for 6 MiB (it has not while the untaken messages
/// hold theirs).
fn room_for_six_mib(transport: &ShmTransport) -> bool {
    transport.try_new_message(6 << 20).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_releases_what_a_receiver_that_left_did_not_take() {
    let (transport, mut push, mut pull, _cleanup) =
        stream_with_untaken("receiver-first", PUSH_PULL).await;
    assert!(!room_for_six_mib(&transport));
    pull.close().await.unwrap();
    drop(pull);
    // The sender says what was not taken, and gives the memory back.
    let closed = push.close().await;
    assert!(
        matches!(closed, Err(ferromq_core::Error::Undelivered { n_messages, .. }) if n_messages == (SENT - TAKEN) as u64),
        "{closed:?}"
    );
    drop(push);
    assert!(
        room_for_six_mib(&transport),
        "the untaken messages still hold their blocks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_releases_what_it_did_not_take_after_its_sender_closed() {
    let (transport, mut push, mut pull, _cleanup) =
        stream_with_untaken("sender-first", PUSH_PULL).await;
    // The receiver lives: what its ring holds is handed over to it.
    let closed = tokio::time::timeout(Duration::from_secs(20), push.close())
        .await
        .unwrap();
    assert!(closed.is_ok(), "{closed:?}");
    drop(push);
    assert!(
        !room_for_six_mib(&transport),
        "the receiver may still take them"
    );
    // It closes without taking them: they are lost, and the sender reported them delivered, so
    // the receiver says so (it used to close `Ok`, and the loss went unreported).
    let closed = pull.close().await;
    assert!(
        matches!(closed, Err(ferromq_core::Error::Undelivered { n_messages, .. }) if n_messages == (SENT - TAKEN) as u64),
        "{closed:?}"
    );
    drop(pull);
    assert!(
        room_for_six_mib(&transport),
        "the untaken messages still hold their blocks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_releases_what_a_subscriber_that_left_did_not_take() {
    let (transport, mut publisher, mut subscriber, _cleanup) =
        stream_with_untaken("subscriber-first", (SocketType::Pub, SocketType::Sub)).await;
    assert!(!room_for_six_mib(&transport));
    subscriber.close().await.unwrap();
    drop(subscriber);
    let _ = publisher.close().await;
    drop(publisher);
    assert!(
        room_for_six_mib(&transport),
        "the untaken messages still hold their blocks"
    );
}
