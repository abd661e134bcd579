//! What the in-process shmem tests share: a session of their own whose shared memory and ipc
//! socket file are removed when the test ends, passed or failed.

use std::path::PathBuf;

use ferromq_core::{Channel, ChannelConfig, Message, Method, SocketType, Transport};
use ferromq_shm::{ShmBuffer, ShmOptions, ShmTransport};

pub struct TestSession {
    name: String,
    ipc_path: PathBuf,
}

impl TestSession {
    /// Session `<tag>-<pid>`, with an ipc address in the temporary directory.
    pub fn new(tag: &str) -> TestSession {
        let name = format!("{tag}-{}", std::process::id());
        let ipc_path = std::env::temp_dir().join(format!("ferromq-{name}.ipc"));
        TestSession { name, ipc_path }
    }

    /// The session's name, as object names and errors show it.
    #[allow(dead_code, reason = "not every test file that has this module asks")]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session's ipc address.
    pub fn address(&self) -> String {
        format!("ipc://{}", self.ipc_path.display())
    }

    /// A transport of this session with `options` (their session replaced).
    pub fn transport(&self, options: ShmOptions) -> ShmTransport {
        ShmTransport::new(ShmOptions {
            session: self.name.clone(),
            ..options
        })
    }
    /// A transport of this session with a 4 MiB segment whose allocations wait at most 5 s:
    /// for tests whose messages go through the segment many times over.
    #[allow(dead_code, reason = "not every test file that has this module asks")]
    pub fn small_transport(&self) -> ShmTransport {
        self.transport(ShmOptions {
            segment_size: 4 << 20,
            allocation_timeout: std::time::Duration::from_secs(5),
            ..ShmOptions::default()
        })
    }
}

impl Drop for TestSession {
    fn drop(&mut self) {
        let uid = ferromq_shm::names::current_uid();
        let _ = ferromq_shm::cleanup::clean_session(uid, &self.name, true);
        let _ = std::fs::remove_file(&self.ipc_path);
    }
}

/// A channel named `data` of `transport`, bound or connected at `address`; `busy_poll`: the
/// channel option `busyPoll`.
#[allow(
    dead_code,
    reason = "not every test file that has this module opens channels"
)]
pub async fn open_channel(
    transport: &ShmTransport,
    socket_type: SocketType,
    method: Method,
    address: &str,
    busy_poll: bool,
) -> Channel {
    let mut config = ChannelConfig::new("data", socket_type, method).with_address(address);
    config.busy_poll = busy_poll;
    let mut channel = Channel::open(transport, config, "data").await.unwrap();
    match method {
        Method::Bind => {
            channel.bind_configured().await.unwrap();
        }
        Method::Connect => channel.connect_configured().await.unwrap(),
    }
    channel
}

/// A pull bound and a push connected at `address` (channels named `data`, no busy poll).
#[allow(
    dead_code,
    reason = "not every test file that has this module opens a pair"
)]
pub async fn pull_and_push(transport: &ShmTransport, address: &str) -> (Channel, Channel) {
    let pull = open_channel(transport, SocketType::Pull, Method::Bind, address, false).await;
    let push = open_channel(transport, SocketType::Push, Method::Connect, address, false).await;
    (pull, push)
}

/// Sends `message` through `push` and returns what `pull` receives: a connection's ring is made
/// with the connection, so a test sends one message in and out before what it measures.
#[allow(
    dead_code,
    reason = "not every test file that has this module sends first"
)]
pub async fn one_message_through(
    push: &mut Channel,
    pull: &mut Channel,
    message: Message,
) -> Message {
    push.send(message)
        .await
        .map_err(|failed| failed.error)
        .unwrap();
    pull.receive().await.unwrap()
}

/// Whether `message` lies in a shared-memory block or region of its own (not inline, not heap).
#[allow(dead_code, reason = "not every test file that has this module asks")]
pub fn is_block(message: &Message) -> bool {
    message
        .buffer()
        .is_some_and(|buffer| buffer.as_any().downcast_ref::<ShmBuffer>().is_some())
}

/// Blocks referenced in `transport`'s segment, or released and not reclaimed yet.
#[allow(dead_code, reason = "not every test file that has this module asks")]
pub fn live_blocks(transport: &ShmTransport) -> u64 {
    transport.memory_figures().unwrap().live_blocks
}

/// Makes and drops one 64 KiB block: the sender reclaims what receivers released at its
/// allocations.
#[allow(dead_code, reason = "not every test file that has this module asks")]
pub async fn reclaim_released(transport: &ShmTransport) {
    drop(transport.new_message(64 << 10).await.unwrap());
}

/// Waits (yielding) until no more blocks are referenced than `before` (the rings); panics
/// naming the segment's figures when they do not come back.
#[allow(dead_code, reason = "not every test file that has this module asks")]
pub async fn blocks_back_to(transport: &ShmTransport, before: u64) {
    for _ in 0..1000 {
        reclaim_released(transport).await;
        if live_blocks(transport) <= before {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "blocks still referenced: {:?}",
        transport.memory_figures().unwrap()
    );
}
