//! A req, rep or pair makes a connection's descriptor ring in its own segment at its first send
//! on that connection. When the segment is full then, the send waits for room as a message's
//! allocation does, and fails naming the segment only once the allocation timeout has passed
//! (it used to fail at once, naming the segment: a full segment is backpressure, not an error).
//! A push makes the ring when the connection comes; one that came while the segment was full
//! gets its ring once there is room (it used to get nothing, for ever).
//!
//! A req or rep whose connection has a ring takes a message in turn at once, without a
//! runtime (`Channel::try_send_parts`, which a device's send tries first): it used to hand
//! every message back to the waiting way, a future and a descriptor record allocated per send.
//!
//! A push whose ring is full looks again at once while its consumer keeps taking: it used to
//! wait for a timer due "now", which tokio rounds up to the next millisecond, so a sender of
//! messages whose entries fill the ring before its delivery window (256-byte messages travel
//! inside their entries) slept up to a millisecond per ringful.

use std::time::Duration;

use ferromq_core::{Channel, ChannelConfig, Message, Method, SocketType, Transport};
use ferromq_shm::{ShmOptions, ShmTransport};

mod support;
use support::TestSession;

/// A bound rep (or pair) and a connected req (or pair) of one transport (one segment), with
/// `allocation_timeout`.
async fn pair_of_channels(
    name: &str,
    allocation_timeout: Duration,
    (bound, connecting): (SocketType, SocketType),
) -> (ShmTransport, Channel, Channel, TestSession) {
    let session = TestSession::new(&format!("ring-room-{name}"));
    let transport = session.transport(ShmOptions {
        segment_size: 4 << 20,
        allocation_timeout,
        ..ShmOptions::default()
    });
    let address = session.address();
    let mut server = open(&transport, bound, Method::Bind, &address).await;
    server.bind_configured().await.unwrap();
    let mut client = open(&transport, connecting, Method::Connect, &address).await;
    client.connect_configured().await.unwrap();
    (transport, server, client, session)
}

/// Channel `data` of `transport` at `address`, not bound or connected yet.
async fn open(
    transport: &ShmTransport,
    socket_type: SocketType,
    method: Method,
    address: &str,
) -> Channel {
    let config = ChannelConfig::new("data", socket_type, method).with_address(address);
    Channel::open(transport, config, "data").await.unwrap()
}

/// Messages of 256 KiB held until the segment has no room for another (nor for a ring, which
/// is a little larger).
fn fill_segment(transport: &ShmTransport) -> Vec<Message> {
    let mut held = Vec::new();
    while let Some(message) = transport.try_new_message(256 << 10) {
        held.push(message);
        assert!(held.len() < 64, "a 4 MiB segment never fills");
    }
    assert!(!held.is_empty());
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_ring_finds_the_segment_full_waits_for_room_then_goes() {
    let (transport, mut rep, mut req, _cleanup) = pair_of_channels(
        "wait",
        Duration::from_secs(30),
        (SocketType::Rep, SocketType::Req),
    )
    .await;
    let held = fill_segment(&transport);
    let mut request = tokio::spawn(async move {
        req.send(Message::from("ping"))
            .await
            .map_err(|failed| failed.error.to_string())?;
        Ok::<_, String>(req)
    });
    // The request waits for room (before, it failed at once).
    let early = tokio::time::timeout(Duration::from_millis(300), &mut request).await;
    assert!(
        early.is_err(),
        "the send ended while the segment was full: {early:?}"
    );
    drop(held);
    let mut req = tokio::time::timeout(Duration::from_secs(20), request)
        .await
        .expect("the request went once there was room")
        .unwrap()
        .unwrap();
    let asked = rep.receive().await.unwrap();
    assert_eq!(asked.data(), b"ping");
    rep.send(Message::from("pong")).await.unwrap();
    let answer = req.receive().await.unwrap();
    assert_eq!(answer.data(), b"pong");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_finds_no_room_for_its_ring_fails_after_the_allocation_timeout() {
    let (transport, _rep, mut req, session) = pair_of_channels(
        "timeout",
        Duration::from_millis(400),
        (SocketType::Rep, SocketType::Req),
    )
    .await;
    let _held = fill_segment(&transport);
    let started = tokio::time::Instant::now();
    let failed = tokio::time::timeout(Duration::from_secs(20), req.send(Message::from("ping")))
        .await
        .expect("the send gave up after the allocation timeout")
        .expect_err("no room ever came");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "failed before the allocation timeout: {:?}",
        started.elapsed()
    );
    // The error and its sources, as a device's log or `anyhow` prints them.
    let mut text = failed.error.to_string();
    let mut source = std::error::Error::source(&failed.error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    assert!(
        text.contains(session.name())
            && text.contains("has no room")
            && text.contains("after waiting"),
        "the error names the segment and its wait: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_puller_that_connected_while_the_segment_was_full_gets_messages_once_room_comes() {
    let (transport, mut push, mut first_pull, session) = pair_of_channels(
        "push",
        Duration::from_secs(30),
        (SocketType::Push, SocketType::Pull),
    )
    .await;
    // The first connection gets a ring: records travel by rings from now on.
    push.send(Message::from("one")).await.unwrap();
    assert_eq!(first_pull.receive().await.unwrap().data(), b"one");
    let held = fill_segment(&transport);
    let address = session.address();
    let mut second_pull = open(&transport, SocketType::Pull, Method::Connect, &address).await;
    second_pull.connect_configured().await.unwrap();
    // Its handshake completes in the background: give the push's task time to take the new
    // connection in while the segment is still full (were it later, the connection would find
    // room and the test would prove nothing, never fail).
    let _ = tokio::time::timeout(Duration::from_millis(300), std::future::pending::<()>()).await;
    // The first puller leaves, and room comes. Until the push sees the first puller gone its
    // ring may take a message or two; the second puller then gets the rest.
    first_pull.close().await.unwrap();
    drop(first_pull);
    drop(held);
    let reached_the_second = async {
        loop {
            push.send(Message::from("two")).await.unwrap();
            if let Ok(received) =
                tokio::time::timeout(Duration::from_millis(50), second_pull.receive()).await
            {
                return received.unwrap();
            }
        }
    };
    let received = tokio::time::timeout(Duration::from_secs(20), reached_the_second)
        .await
        .expect("the puller that connected while the segment was full got a ring");
    assert_eq!(received.data(), b"two");
}

/// With the clock paused (after the connection is made), a push of 20 000 messages of 256
/// bytes, whose entries fill its ring every ~700 messages, to a pull of the same runtime that
/// keeps taking, one message per turn: every message arrives and no time passes. Waiting for ring room on a timer
/// (rounded up to the next millisecond) never ends here: the clock advances only when the
/// runtime is idle, and the pull, spinning on its empty ring, never lets it be; on a real clock
/// that wait cost a millisecond per ringful. A watchdog thread turns the hang into a failure.
#[test]
fn a_push_whose_ring_is_full_follows_a_consumer_that_keeps_taking_without_a_timer() {
    const N_MESSAGES: u64 = 20_000;
    const TAG: &str = "ring-room-full-ring";
    // The same session as the runtime thread's: removed here too when that thread hangs.
    let cleanup = TestSession::new(TAG);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = runtime.block_on(async {
            let session = TestSession::new(TAG);
            let transport = session.transport(ShmOptions {
                segment_size: 16 << 20,
                ..ShmOptions::default()
            });
            let address = session.address();
            let mut pull = open(&transport, SocketType::Pull, Method::Bind, &address).await;
            pull.bind_configured().await.unwrap();
            let mut push = open(&transport, SocketType::Push, Method::Connect, &address).await;
            push.connect_configured().await.unwrap();
            // The ring is made and announced with the first message.
            push.send(transport.new_message(256).await.unwrap())
                .await
                .map_err(|failed| failed.error)
                .unwrap();
            pull.receive().await.unwrap();
            tokio::time::pause();
            let paused_at = tokio::time::Instant::now();
            let send = async {
                for idx in 0..N_MESSAGES {
                    let mut message = transport.new_message(256).await.unwrap();
                    message.data_mut()[..8].copy_from_slice(&idx.to_le_bytes());
                    push.send(message)
                        .await
                        .map_err(|failed| failed.error)
                        .unwrap();
                }
            };
            // One message per turn of the runtime, where the sender may send a hundred: the
            // ring fills.
            let receive = async {
                for idx in 0..N_MESSAGES {
                    let message = pull.receive().await.unwrap();
                    assert_eq!(message.data()[..8], idx.to_le_bytes());
                    tokio::task::yield_now().await;
                }
            };
            tokio::join!(send, receive);
            let waited = paused_at.elapsed();
            tokio::time::resume();
            push.close().await.unwrap();
            pull.close().await.unwrap();
            drop(session);
            waited
        });
        let _ = done.send(outcome);
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(waited) => assert_eq!(
            waited,
            Duration::ZERO,
            "the sender waited on the clock for room its consumer had freed"
        ),
        Err(_) => {
            drop(cleanup);
            panic!(
                "20 000 messages through a ring that fills did not arrive within 60 s: the sender \
             waits for ring room on a timer"
            )
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_req_and_a_rep_with_rings_take_a_message_in_turn_without_waiting() {
    let (transport, mut rep, mut req, _session) = pair_of_channels(
        "try-send",
        Duration::from_secs(10),
        (SocketType::Rep, SocketType::Req),
    )
    .await;
    let message = |tag: &[u8]| {
        let mut message = transport.try_new_message(64).unwrap();
        message.data_mut()[..tag.len()].copy_from_slice(tag);
        message
    };
    // The first request makes the connection's ring (the waiting way: it may have to).
    req.send(message(b"request 0"))
        .await
        .map_err(|failed| failed.error)
        .unwrap();
    for round in 0..3u8 {
        let request = rep.receive().await.unwrap();
        assert_eq!(request.data()[..9], *format!("request {round}").as_bytes());
        assert!(
            rep.try_send_parts(message(format!("reply {round}").as_bytes()).into())
                .is_ok(),
            "round {round}: the rep handed its reply back"
        );
        let reply = req.receive().await.unwrap();
        assert_eq!(reply.data()[..7], *format!("reply {round}").as_bytes());
        if round < 2 {
            let next = format!("request {}", round + 1);
            assert!(
                req.try_send_parts(message(next.as_bytes()).into()).is_ok(),
                "round {round}: the req handed its request back"
            );
        }
    }
    // Out of turn (a reply is due), the req takes nothing.
    req.send(message(b"request 3"))
        .await
        .map_err(|failed| failed.error)
        .unwrap();
    assert!(req.try_send_parts(message(b"early").into()).is_err());
    rep.receive().await.unwrap();
}

/// A pair whose connection's ring is full waits for its peer to take, and that wait is its
/// back-pressure: counted in the channel's send-wait figure, as a push's wait for its window
/// is (`ferromq top`'s "wait %"). Found by a contract sweep: a pair blocked on a full ring
/// showed 0 % where a zeromq pair showed 100 %.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_waiting_on_a_full_ring_counts_the_wait() {
    let (_transport, mut receiver, mut sender, _cleanup) = pair_of_channels(
        "pairwait",
        Duration::from_secs(30),
        (SocketType::Pair, SocketType::Pair),
    )
    .await;
    // The first message makes the connection's ring.
    sender.send(Message::from("first")).await.unwrap();
    assert_eq!(receiver.receive().await.unwrap().data(), b"first");
    // Small messages travel inside their ring entries: the ring fills long before sndBufSize.
    let mut n_sent = 0_usize;
    while sender
        .try_send_parts(Message::from(vec![7_u8; 256]).into())
        .is_ok()
    {
        n_sent += 1;
        assert!(
            n_sent < 1000,
            "sndBufSize (1000) came before the ring was full"
        );
    }
    let counters = sender.counters();
    // The task hands the channel back: a socket dropped unclosed takes what it sent along.
    let blocked = tokio::spawn(async move {
        sender
            .send(Message::from(vec![7_u8; 256]))
            .await
            .map_err(|failed| failed.error.to_string())?;
        Ok::<_, String>(sender)
    });
    let mut look = tokio::time::interval(Duration::from_millis(5));
    tokio::time::timeout(Duration::from_secs(20), async {
        while counters.snapshot().send_waited_ns == 0 {
            look.tick().await;
        }
    })
    .await
    .expect("the send's wait for room is counted while it waits");
    for n in 0..=n_sent {
        tokio::time::timeout(Duration::from_secs(20), receiver.receive())
            .await
            .unwrap_or_else(|_| panic!("message {n} of {} never came", n_sent + 1))
            .unwrap();
    }
    let _sender = tokio::time::timeout(Duration::from_secs(20), blocked)
        .await
        .expect("the send went once the peer took")
        .unwrap()
        .unwrap();
}
