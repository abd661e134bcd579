//! The shared-memory transport: on one host, a message moves between processes without its
//! payload being copied; one of at most `shm-inline-max` bytes (256 by default) travels inside
//! its descriptor instead (`small`).
//!
//! Selecting it is configuration only (`transport = "shmem"`); device code does not change.
//!
//! - [`segment`]: one mapped object (`/dev/shm/ferromq_<uid>_<session>_...`, mode 0600) with a
//!   header of usage figures and attached processes; the only module that touches raw memory.
//! - [`allocator`] and [`managed`]: each process allocates only from segments it owns; blocks
//!   carry an atomic reference count, so any process can release a block and the owner reclaims
//!   it. No cross-process lock exists, so a process dying at any instant can leak at most the
//!   blocks it held, never wedge or corrupt the allocator.
//! - `delivery`: per-socket counters in the sender's segment header that receivers advance as
//!   they hand messages out: the back-pressure bound (`sndBufSize` in flight) and the proof,
//!   at close, that everything accepted was taken.
//! - [`wire`]: the descriptor records (inline payloads up to 256 bytes, block and region
//!   descriptors), checked against the segment before any byte is read. Between a push and a
//!   pull they go through a descriptor ring in the push's segment, one per connection (`ring`:
//!   no socket operation per message; zeromq carries the ring's announcement and the doorbell
//!   of a consumer that sleeps); the other patterns send them in frames over zeromq.
//! - [`small`]: messages of at most 256 bytes (and `shm-inline-max`), made in process memory and
//!   copied into their descriptor, which is cheaper than a block for so few bytes.
//! - [`region`]: unmanaged regions the user fills, with release callbacks (single or bulk).
//! - [`cleanup`]: removal of a session's memory when its last process leaves or dies, the
//!   watchdog, and what `ferromq shm list` and `clean` use.
//!
//! ```no_run
//! # async fn demo() -> ferromq_core::Result<()> {
//! use ferromq_core::{Channel, ChannelConfig, Method, SocketType, Transport};
//! use ferromq_shm::{ShmOptions, ShmTransport};
//!
//! let transport = ShmTransport::new(ShmOptions { session: "demo".into(), ..ShmOptions::default() });
//! let config = ChannelConfig::new("data", SocketType::Push, Method::Bind).with_address("ipc:///tmp/demo");
//! let mut channel = Channel::open(&transport, config, "data").await?;
//! channel.bind_configured().await?;
//! let mut message = transport.new_message(8 << 20).await?; // 8 MiB in shared memory
//! message.data_mut().fill(7);
//! channel.send(message).await.map_err(|failed| failed.error)?; // only a descriptor travels
//! # Ok(()) }
//! ```
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    clippy::multiple_unsafe_ops_per_block
)]
#![warn(missing_docs)]

pub mod allocator;
mod bell;
pub mod cleanup;
mod delivery;
mod error;
mod lock;
pub mod managed;
pub mod names;
mod protocol;
pub mod region;
mod ring;
pub mod segment;
mod session;
pub mod small;
mod socket;
pub mod wire;

use std::sync::Arc;

use async_trait::async_trait;
use ferromq_core::{ChannelConfig, Error, Message, Result, Socket, Transport};

pub use cleanup::run_watchdog_if_requested;
pub use error::ShmError;
pub use managed::ShmBuffer;
pub use region::{RegionBlock, RegionCallback, UnmanagedRegion};
pub use ring::monotonic_ns;
pub use session::ShmOptions;

/// Adds the shmem transport to `registry` under [`ShmTransport::NAME`], configured per device
/// from its session and the properties [`ShmOptions::PROPERTIES`] names (FairMQ's
/// `--shm-segment-size` and friends).
pub fn register(registry: &mut ferromq_core::TransportRegistry) {
    registry.register(
        ShmTransport::NAME,
        ferromq_core::TransportTraits::PLAIN
            .lending_shared_memory()
            .on_one_host()
            .reading(&ShmOptions::PROPERTIES),
        |options| {
            let transport: Arc<dyn ferromq_core::Transport> =
                Arc::new(ShmTransport::new(ShmOptions::from_device(options)?));
            Ok(transport)
        },
    );
}

/// The shmem transport (`transport = "shmem"`).
#[derive(Clone)]
pub struct ShmTransport {
    session: Arc<session::Session>,
}

impl ShmTransport {
    /// The configuration name of this transport.
    pub const NAME: &'static str = "shmem";

    /// A transport for one device (one process's view of a session).
    pub fn new(options: ShmOptions) -> ShmTransport {
        ShmTransport {
            session: Arc::new(session::Session::new(options)),
        }
    }

    /// The options it was made with.
    pub fn options(&self) -> &ShmOptions {
        &self.session.options
    }

    /// Creates an unmanaged region of `size` usable bytes; `callback` hears of every buffer
    /// the framework releases.
    ///
    /// # Errors
    /// [`ShmError::NoSpace`] and the other creation errors.
    pub async fn create_region(
        &self,
        size: usize,
        callback: RegionCallback,
    ) -> Result<UnmanagedRegion, ShmError> {
        self.session.create_region(size, callback).await
    }

    /// Region created/destroyed events of this transport's session.
    pub fn region_events(&self) -> tokio::sync::mpsc::UnboundedReceiver<cleanup::RegionEvent> {
        cleanup::watch_regions(
            self.session.uid,
            &self.session.options.session,
            std::time::Duration::from_millis(50),
        )
    }

    /// This process's managed segment (created on first use): its name and usable bytes.
    ///
    /// # Errors
    /// The segment's creation error.
    pub async fn segment_info(&self) -> Result<(String, usize), ShmError> {
        let owned = self.session.own_segment().await?;
        Ok((owned.segment().name().to_string(), owned.capacity()))
    }

    /// Reclaims released blocks of this process's segment; returns (free bytes, blocks still
    /// referenced).
    ///
    /// # Errors
    /// The segment's creation error.
    pub async fn collect(&self) -> Result<(usize, usize), ShmError> {
        Ok(self.session.own_segment().await?.collect())
    }
}

impl std::fmt::Debug for ShmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmTransport")
            .field("session", &self.session.options.session)
            .finish()
    }
}

#[async_trait]
impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        ShmTransport::NAME
    }

    async fn new_message(&self, size: usize) -> Result<Message> {
        self.session
            .new_message(size)
            .await
            .map_err(|error| Error::Allocation {
                transport: ShmTransport::NAME,
                source: Box::new(error),
            })
    }

    fn try_new_message(&self, size: usize) -> Option<Message> {
        self.session.try_new_message(size)
    }

    fn memory_figures(&self) -> Option<ferromq_core::MemoryFigures> {
        self.session.memory_figures()
    }

    async fn create_socket(
        &self,
        config: &ChannelConfig,
        socket_name: &str,
    ) -> Result<Box<dyn Socket>> {
        config.validate()?;
        config.refuse_provider()?;
        Ok(Box::new(
            socket::ShmSocket::new(Arc::clone(&self.session), config, socket_name).await?,
        ))
    }
}
