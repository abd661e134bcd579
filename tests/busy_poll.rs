//! busyPoll receives deliver every message, in order, on a current-thread runtime (where a spin
//! loop that never yielded would starve the transport's own tasks). No timing is asserted.

use std::time::Duration;

use ferromq::prelude::*;
use ferromq::{ShmOptions, ShmTransport, ZmqTransport};

/// Two busy-polled channels: one of `binder` type bound at `address`, one of `connector` type
/// connected to it.
async fn busy_pair(
    transport: &dyn Transport,
    address: &str,
    binder: SocketType,
    connector: SocketType,
) -> (Channel, Channel) {
    let busy = |socket_type, method| ChannelConfig {
        busy_poll: true,
        ..ChannelConfig::new("data", socket_type, method).with_address(address)
    };
    let mut bound_channel = Channel::open(transport, busy(binder, Method::Bind), "data")
        .await
        .unwrap();
    let bound = bound_channel
        .bind_configured()
        .await
        .unwrap()
        .for_local_connect();
    let mut connected = Channel::open(
        transport,
        ChannelConfig {
            address: Some(bound.to_string()),
            ..busy(connector, Method::Connect)
        },
        "data",
    )
    .await
    .unwrap();
    connected.connect_configured().await.unwrap();
    (bound_channel, connected)
}

async fn ping_pong(transport: &dyn Transport, address: &str) {
    let (mut rep, mut req) = busy_pair(transport, address, SocketType::Rep, SocketType::Req).await;
    let server = async {
        for _ in 0..2000 {
            let request = rep.receive().await.unwrap();
            rep.send(request).await.unwrap();
        }
        // A busy receive still honours its timeout.
        let nothing = rep.receive_timeout(Duration::from_millis(20)).await;
        assert!(
            matches!(nothing, Err(ferromq::Error::Timeout { .. })),
            "{nothing:?}"
        );
    };
    let client = async {
        for msg_idx in 0..2000u64 {
            let mut request = transport.new_message(64).await.unwrap();
            request.data_mut()[..8].copy_from_slice(&msg_idx.to_le_bytes());
            req.send(request).await.unwrap();
            let reply = req.receive().await.unwrap();
            assert_eq!(reply.data()[..8], msg_idx.to_le_bytes());
        }
    };
    tokio::join!(server, client);
}

#[tokio::test(flavor = "current_thread")]
async fn busy_poll_round_trips_over_zeromq_ipc() {
    let path = std::env::temp_dir().join(format!("ferromq-busy-{}.ipc", std::process::id()));
    ping_pong(&ZmqTransport::new(), &format!("ipc://{}", path.display())).await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "current_thread")]
async fn busy_poll_round_trips_over_shmem() {
    let shm = ShmTestSession::new("busy", 16 << 20);
    ping_pong(&shm.transport, &shm.address).await;
}

/// A shmem transport of a session of its own and an ipc address; the session's shared memory
/// and the ipc file are removed however the test ends.
struct ShmTestSession {
    transport: ShmTransport,
    address: String,
    session: String,
    path: std::path::PathBuf,
}

impl ShmTestSession {
    fn new(tag: &str, segment_size: usize) -> ShmTestSession {
        let session = format!("test-{tag}-{}", std::process::id());
        let path = std::env::temp_dir().join(format!("ferromq-{tag}-{}.ipc", std::process::id()));
        ShmTestSession {
            transport: ShmTransport::new(ShmOptions {
                session: session.clone(),
                segment_size,
                ..ShmOptions::default()
            }),
            address: format!("ipc://{}", path.display()),
            session,
            path,
        }
    }
}

impl Drop for ShmTestSession {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = ferromq_shm::cleanup::clean_session(
            ferromq_shm::names::current_uid(),
            &self.session,
            true,
        );
    }
}

/// A busy-polled pull finds ring entries by their headers, racing the producer entry by entry
/// (`ring.rs`, "Headers as readiness"): 200 000 messages of 0 to 299 bytes through a push and a
/// pull on two threads, well over a hundred wraps of the ring, arrive whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_polled_shmem_stream_arrives_whole_and_in_order() {
    const N_MESSAGES: u64 = 200_000;
    fn payload(msg_idx: u64) -> Vec<u8> {
        let len = (msg_idx * 37 % 300) as usize;
        (0..len)
            .map(|byte_idx| (msg_idx as usize).wrapping_mul(31).wrapping_add(byte_idx) as u8)
            .collect()
    }
    let shm = ShmTestSession::new("busy-stream", 64 << 20);
    let (mut pull, mut push) = busy_pair(
        &shm.transport,
        &shm.address,
        SocketType::Pull,
        SocketType::Push,
    )
    .await;
    let sender = tokio::spawn(async move {
        for msg_idx in 0..N_MESSAGES {
            push.send(Message::from(payload(msg_idx))).await.unwrap();
        }
        push
    });
    for msg_idx in 0..N_MESSAGES {
        let message = tokio::time::timeout(Duration::from_secs(60), pull.receive())
            .await
            .unwrap_or_else(|_| panic!("message {msg_idx} never came"))
            .unwrap();
        assert!(
            message.data() == payload(msg_idx).as_slice(),
            "message {msg_idx} differs or is out of order"
        );
    }
    let mut push = sender.await.unwrap();
    push.close().await.unwrap();
    pull.close().await.unwrap();
}
