//! What the in-process shmem tests share: a session of their own whose shared memory and ipc
//! socket file are removed when the test ends, passed or failed.

use std::path::PathBuf;

use ferromq_core::{Channel, ChannelConfig, Method, SocketType};
use ferromq_shm::{ShmOptions, ShmTransport};

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
