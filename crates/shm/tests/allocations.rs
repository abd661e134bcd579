//! Issue 13 §4: a message's own life on the shmem hot path costs no heap allocation. A counting
//! global allocator counts every heap allocation of the process (every thread) while 100 000
//! messages go from a push to a pull (and from a pair to a pair, and from a publisher to a
//! subscriber) of one session,
//! each made from the transport's memory, sent, received and dropped, after a warm-up that lets
//! every queue reach its working size.
//!
//! Descriptors go from the push to the pull through a descriptor ring in shared memory (issue
//! 13 §2): no frame, no zmq.rs message, no waker per batch. With frames through zmq.rs this was
//! 0.188 allocations per message; with rings it is 0.000 (a publisher with frames: 2.0, with
//! rings 0.000; a pair with frames through zmq.rs DEALERs 15.0, with rings 0.000). The bound leaves room for the rare
//! doorbell (a frame through the socket when the receiver waits), never for one allocation per
//! message or per run of messages.
use std::sync::Arc;

use ferromq_core::{Channel, ChannelConfig, Method, SocketType, Transport};
use ferromq_shm::{ShmOptions, ShmTransport};

#[global_allocator]
static ALLOCATOR: ferromq_alloc_count::Counting = ferromq_alloc_count::Counting;

const WARM_UP: u64 = 20_000;
const MEASURED: u64 = 100_000;
/// A message in a block of the segment; [`SMALL`]: one that travels inside its descriptor.
const SIZE: usize = 1024;
const SMALL: usize = 64;

/// Sends `n_messages` numbered from `first` through `sender` and receives them in order through
/// `receiver`.
async fn stream(
    size: usize,
    transport: &dyn Transport,
    sender: &mut Channel,
    receiver: &mut Channel,
    first: u64,
    n_messages: u64,
) {
    let send = async {
        for idx in first..first + n_messages {
            let mut message = match transport.try_new_message(size) {
                Some(message) => message,
                None => transport.new_message(size).await.expect("allocate"),
            };
            message.data_mut()[..8].copy_from_slice(&idx.to_le_bytes());
            sender
                .send(message)
                .await
                .map_err(|failed| failed.error)
                .expect("send");
        }
    };
    let receive = async {
        for idx in first..first + n_messages {
            let received = receiver.receive().await.expect("receive");
            assert_eq!(received.data()[..8], idx.to_le_bytes());
        }
    };
    tokio::join!(send, receive);
}

/// Heap allocations per message while `MEASURED` messages go from a `sender` socket to a
/// `receiver` socket of one session (in one process, on one thread), after a warm-up.
fn allocations_per_message(
    name: &str,
    sender: SocketType,
    receiver: SocketType,
    size: usize,
) -> f64 {
    // The count is the process's: one measurement at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let session = format!("allocations-{name}-{}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let per_message = runtime.block_on(async {
        let transport = Arc::new(ShmTransport::new(ShmOptions {
            session: session.clone(),
            segment_size: 64 << 20,
            ..ShmOptions::default()
        }));
        let path = std::env::temp_dir().join(format!("ferromq-{session}.ipc"));
        let address = format!("ipc://{}", path.display());
        let receiver_config =
            ChannelConfig::new("data", receiver, Method::Bind).with_address(&address);
        let sender_config =
            ChannelConfig::new("data", sender, Method::Connect).with_address(&address);
        let mut receiver = Channel::open(transport.as_ref(), receiver_config, "data")
            .await
            .unwrap();
        receiver.bind_configured().await.unwrap();
        if receiver.label().socket_type == SocketType::Sub {
            receiver.subscribe("").await.unwrap();
        }
        let mut sender = Channel::open(transport.as_ref(), sender_config, "data")
            .await
            .unwrap();
        sender.connect_configured().await.unwrap();
        if sender.label().socket_type == SocketType::Pub {
            // A publisher drops what it sends before its subscriber is connected (ZeroMQ's
            // slow joiner): it sends until the subscriber gets one.
            subscriber_connected(transport.as_ref(), &mut sender, &mut receiver).await;
        }
        stream(
            size,
            transport.as_ref(),
            &mut sender,
            &mut receiver,
            0,
            WARM_UP,
        )
        .await;
        let before = ferromq_alloc_count::allocations();
        stream(
            size,
            transport.as_ref(),
            &mut sender,
            &mut receiver,
            WARM_UP,
            MEASURED,
        )
        .await;
        let allocations = ferromq_alloc_count::allocations() - before;
        sender.close().await.unwrap();
        receiver.close().await.unwrap();
        let _ = std::fs::remove_file(&path);
        allocations as f64 / MEASURED as f64
    });
    let _ = ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), &session, true);
    println!("{name}: {per_message:.4} heap allocations per message");
    per_message
}

/// Sends marker messages (numbered `u64::MAX`) until the subscriber receives one, then drains
/// any that follow it.
async fn subscriber_connected(
    transport: &dyn Transport,
    publisher: &mut Channel,
    subscriber: &mut Channel,
) {
    loop {
        let mut marker = transport.new_message(SIZE).await.expect("allocate");
        marker.data_mut()[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        publisher
            .send(marker)
            .await
            .map_err(|failed| failed.error)
            .expect("send");
        let got =
            tokio::time::timeout(std::time::Duration::from_millis(10), subscriber.receive()).await;
        if got.is_ok() {
            break;
        }
    }
    // Markers sent after the first that arrived.
    while let Ok(Ok(_)) =
        tokio::time::timeout(std::time::Duration::from_millis(100), subscriber.receive()).await
    {
    }
}

/// Fails when a message from `sender` to `receiver` costs `bound` heap allocations or more.
fn assert_fewer_allocations_than(
    name: &str,
    (sender, receiver): (SocketType, SocketType),
    size: usize,
    bound: f64,
) {
    let per_message = allocations_per_message(name, sender, receiver, size);
    assert!(
        per_message < bound,
        "{name}: {per_message:.4} heap allocations per message"
    );
}

#[test]
fn a_message_on_the_shmem_hot_path_costs_no_heap_allocation() {
    assert_fewer_allocations_than(
        "pushpull",
        (SocketType::Push, SocketType::Pull),
        SIZE,
        0.002,
    );
}

/// A small message travels inside its descriptor (`small.rs`): its buffers on both sides come
/// from the spare lists, so it costs no allocation either.
#[test]
fn a_small_message_travelling_inline_costs_no_heap_allocation() {
    for (name, ends, bound) in [
        (
            "pushpull-small",
            (SocketType::Push, SocketType::Pull),
            0.002,
        ),
        ("pair-small", (SocketType::Pair, SocketType::Pair), 0.002),
        ("pubsub-small", (SocketType::Pub, SocketType::Sub), 0.01),
    ] {
        assert_fewer_allocations_than(name, ends, SMALL, bound);
    }
}

/// The same from one pair to the other, through the ring the sending pair made for its
/// connection.
#[test]
fn a_message_between_pairs_costs_no_heap_allocation() {
    assert_fewer_allocations_than("pair", (SocketType::Pair, SocketType::Pair), SIZE, 0.002);
}

/// The same through a publisher's descriptor rings to a subscriber. A subscriber that sleeps
/// waits on zmq.rs DEALERs, whose every receive allocates, and its doorbell is a zmq.rs
/// message: a few allocations per sleep (measured 0.001 per message in a debug build, 0.000 in
/// a release build), hence a bound above the push's that still fails for one allocation per
/// run of messages (up to 32).
#[test]
fn a_published_message_costs_no_heap_allocation() {
    assert_fewer_allocations_than("pubsub", (SocketType::Pub, SocketType::Sub), SIZE, 0.01);
}
