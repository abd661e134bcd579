//! What is particular to the ofi transport, between sockets of one process over libfabric's tcp
//! provider on loopback: multipart messages whose parts span chunks, shared memory and region
//! buffers on both ends without copies, a refused second peer, a peer that vanishes without a
//! goodbye, and announced sizes over the bound. Patterns, payload sizes, late binders and
//! killed peers are in the conformance suite (`crates/conformance/tests/ofi_tcp.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ferromq_core::{
    Address, Channel, ChannelConfig, Error, Message, Method, Parts, SocketType, Transport,
    copied_bytes,
};
use ferromq_ofi::{OfiOptions, OfiTransport};

/// Removes the session's shared memory when the test ends, passed or failed.
struct SessionCleanup(String);

impl Drop for SessionCleanup {
    fn drop(&mut self) {
        let uid = ferromq_shm::names::current_uid();
        let _ = ferromq_shm::cleanup::clean_session(uid, &self.0, true);
    }
}

fn transport() -> OfiTransport {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    OfiTransport::new(OfiOptions {
        max_chunk: 1 << 20,
        peer_timeout: Duration::from_millis(500),
        ..OfiOptions::default()
    })
}

fn config(name: &str, socket_type: SocketType, method: Method) -> ChannelConfig {
    let mut config = ChannelConfig::new(name, socket_type, method);
    config.rate_logging = 0;
    config.linger = 5000;
    config
}

/// A bound `binder` channel and a `connector` channel connected to it.
async fn pair_up(
    transport: &OfiTransport,
    binder: SocketType,
    connector: SocketType,
) -> (Channel, Channel) {
    pair_up_with(
        (transport, config("data", binder, Method::Bind)),
        (transport, config("data", connector, Method::Connect)),
    )
    .await
}

/// [`pair_up`] with a transport and a configuration of each end's own.
async fn pair_up_with(
    binder: (&OfiTransport, ChannelConfig),
    connector: (&OfiTransport, ChannelConfig),
) -> (Channel, Channel) {
    let mut bound = Channel::open(binder.0, binder.1, "data").await.unwrap();
    let address = bound
        .bind(&Address::parse("tcp://127.0.0.1:0").unwrap())
        .await
        .unwrap();
    let mut connected = Channel::open(connector.0, connector.1, "data")
        .await
        .unwrap();
    connected.connect(&address).await.unwrap();
    (bound, connected)
}

fn pattern(size: usize, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_messages_keep_their_parts() {
    let transport = transport();
    let (mut pull, mut push) = pair_up(&transport, SocketType::Pull, SocketType::Push).await;
    for round in 0..50u8 {
        let parts: Parts = vec![
            Message::from(vec![round; 8]),
            Message::empty(),
            Message::from(pattern(3 << 20, round)),
        ]
        .into();
        push.send_parts(parts).await.unwrap();
    }
    for round in 0..50u8 {
        let parts = pull.receive_parts().await.unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.get(0).unwrap().data(), &[round; 8]);
        assert!(parts.get(1).unwrap().is_empty());
        assert!(parts.get(2).unwrap().data() == pattern(3 << 20, round).as_slice());
    }
    push.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connector_is_refused_by_name() {
    let transport = transport();
    let (mut pull, mut push) = pair_up(&transport, SocketType::Pull, SocketType::Push).await;
    push.send(Message::from("first")).await.unwrap();
    assert_eq!(pull.receive().await.unwrap().data(), b"first");
    let address = Address::parse(pull.label().address.as_deref().unwrap()).unwrap();
    let mut intruder = Channel::open(
        &transport,
        config("late", SocketType::Push, Method::Connect),
        "late",
    )
    .await
    .unwrap();
    intruder.connect(&address).await.unwrap();
    let error = loop {
        match intruder.send(Message::from("second")).await {
            Ok(()) => tokio::task::yield_now().await,
            Err(failed) => break failed.error,
        }
    };
    assert!(
        error.to_string().contains("connect failed")
            && format!("{:?}", error).contains("already has a peer"),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_receiver_is_reported_to_the_sender() {
    let transport = transport();
    let (mut push, pull) = pair_up(&transport, SocketType::Push, SocketType::Pull).await;
    let mut pull = pull;
    push.send(Message::from("hello")).await.unwrap();
    assert_eq!(pull.receive().await.unwrap().data(), b"hello");
    drop(pull); // no goodbye: its driver stops answering heartbeats
    // Sends go on until the window is full, then wait; the peer's death ends the wait.
    let error = loop {
        match push
            .send_timeout(Message::from(vec![0; 1024]), Duration::from_secs(30))
            .await
        {
            Ok(()) => {}
            Err(failed) => break failed.error,
        }
    };
    assert!(matches!(error, Error::PeerGone { .. }), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_travels_without_copies_and_registers_once() {
    let session = format!("ofi-test-{}", std::process::id());
    let _cleanup = SessionCleanup(session.clone());
    let shm = Arc::new(ferromq_shm::ShmTransport::new(ferromq_shm::ShmOptions {
        session: session.clone(),
        segment_size: 256 << 20,
        ..ferromq_shm::ShmOptions::default()
    }));
    let transport = OfiTransport::new(OfiOptions {
        receive_memory: Some(shm.clone() as Arc<dyn Transport>),
        ..OfiOptions::default()
    });
    let (mut push, mut pull) = pair_up(&transport, SocketType::Push, SocketType::Pull).await;
    let copied_before = copied_bytes();
    for round in 0..100u32 {
        let mut message = shm.new_message(64 << 10).await.unwrap();
        message.data_mut()[..4].copy_from_slice(&round.to_le_bytes());
        push.send(message).await.unwrap();
    }
    for round in 0..100u32 {
        let message = pull.receive().await.unwrap();
        assert_eq!(message.memory_kind(), "shmem");
        assert_eq!(&message.data()[..4], &round.to_le_bytes());
    }
    assert_eq!(copied_bytes(), copied_before, "a payload was copied");
    // Sender and receiver share this process's one segment: registered once per endpoint, whole.
    assert_eq!(transport.stats().registrations.load(Ordering::Relaxed), 2);
    assert_eq!(
        transport.stats().registered_bytes.load(Ordering::Relaxed),
        2 * (256 << 20),
        "each registration covers the whole 256 MiB segment"
    );
    push.close().await.unwrap();
    pull.close().await.unwrap();
    drop((push, pull, transport));
    drop(shm);
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().contains(&session))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_buffers_are_sent_in_place_and_released_once() {
    use std::sync::atomic::AtomicUsize;

    use ferromq_shm::{RegionBlock, RegionCallback};

    let session = format!("ofi-region-{}", std::process::id());
    let _cleanup = SessionCleanup(session.clone());
    let shm = ferromq_shm::ShmTransport::new(ferromq_shm::ShmOptions {
        session: session.clone(),
        segment_size: 64 << 20,
        ..ferromq_shm::ShmOptions::default()
    });
    let n_buffers = 500usize;
    let released = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&released);
    let region = shm
        .create_region(
            n_buffers * 4096,
            RegionCallback::Bulk(Box::new(move |blocks: &[RegionBlock]| {
                counter.fetch_add(blocks.len(), Ordering::Relaxed);
            })),
        )
        .await
        .unwrap();
    let transport = transport();
    let (mut push, mut pull) = pair_up(&transport, SocketType::Push, SocketType::Pull).await;
    let copied_before = copied_bytes();
    for index in 0..n_buffers {
        region
            .write(index * 4096, &pattern(4096, index as u8))
            .unwrap();
        let message = region.message(index * 4096, 4096, index as u64).unwrap();
        push.send(message).await.unwrap();
    }
    for index in 0..n_buffers {
        let message = pull.receive().await.unwrap();
        assert!(message.data() == pattern(4096, index as u8).as_slice());
    }
    assert_eq!(copied_bytes(), copied_before, "a payload was copied");
    // The region is registered once, however many of its buffers are sent, and whole.
    assert_eq!(transport.stats().registrations.load(Ordering::Relaxed), 1);
    assert!(
        transport.stats().registered_bytes.load(Ordering::Relaxed) >= (n_buffers * 4096) as u64,
        "the registration covers the region's buffers"
    );
    // Every buffer goes back to the creator once its send completed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while released.load(Ordering::Relaxed) < n_buffers {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n_buffers} buffers released",
            released.load(Ordering::Relaxed)
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(released.load(Ordering::Relaxed), n_buffers);
    assert_eq!(region.n_lent(), 0);
    push.close().await.unwrap();
    pull.close().await.unwrap();
}

/// Sizes a peer announces come from the wire: a receiver allocates nothing beyond its
/// `ofi-max-message-size` and refuses the peer, naming the size and the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_announcing_more_than_max_message_size_is_refused() {
    let bounded = OfiTransport::new(OfiOptions {
        max_chunk: 1 << 20,
        peer_timeout: Duration::from_millis(500),
        max_message_size: 1 << 20,
        ..OfiOptions::default()
    });
    let sender = transport();
    let (mut pull, mut push) = pair_up_with(
        (&bounded, config("data", SocketType::Pull, Method::Bind)),
        (&sender, config("data", SocketType::Push, Method::Connect)),
    )
    .await;
    push.send(Message::from(vec![7; 2 << 20])).await.unwrap();
    let error = pull
        .receive_timeout(Duration::from_secs(30))
        .await
        .expect_err("a message over the bound must not be received");
    let text = format!("{error:#}");
    assert!(
        text.contains("2097152 bytes") && text.contains("ofi-max-message-size = 1048576"),
        "{text}"
    );
}

/// `linger` bounds silence, and bytes moving are not silence: a message of 1 GiB takes longer
/// than a `linger` of 250 ms to move over loopback, and a close still delivers it, because
/// every chunk (1 MiB here) that completes starts the silence again. Before, only a whole
/// message counted, and a close gave up on a large message still moving (how `ofi_drain`
/// failed in CI: four 64 MiB messages granted at once, their chunks interleaved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_waits_for_a_large_message_while_its_chunks_keep_moving() {
    const SIZE: usize = 1 << 30;
    let transport = OfiTransport::new(OfiOptions {
        max_chunk: 1 << 20,
        peer_timeout: Duration::from_secs(5),
        receive_window: 2 << 30,
        ..OfiOptions::default()
    });
    let mut push_config = config("data", SocketType::Push, Method::Connect);
    push_config.linger = 250;
    let (mut pull, mut push) = pair_up_with(
        (&transport, config("data", SocketType::Pull, Method::Bind)),
        (&transport, push_config),
    )
    .await;
    let mut large = vec![0u8; SIZE];
    large[SIZE - 1] = 7;
    push.send(Message::from(large)).await.unwrap();
    let started = std::time::Instant::now();
    push.close()
        .await
        .expect("the close waits while the message's chunks keep moving");
    let took = started.elapsed();
    let message = pull.receive().await.unwrap();
    assert_eq!(message.len(), SIZE);
    assert_eq!(message.data()[SIZE - 1], 7);
    // The test is worth something only if the message took longer than `linger` to move.
    assert!(took > Duration::from_millis(250), "1 GiB moved in {took:?}");
}
