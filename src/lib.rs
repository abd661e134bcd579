//! ferromq: an async dataflow runtime for pipelines that move gigabytes per second between
//! processes.
//!
//! This crate is the facade: it re-exports the public API of the member crates so that a user
//! puts one dependency in their `Cargo.toml`.
//!
//! # A tour
//! - [`Message`] owns its bytes and moves without copying; [`Parts`] is a multipart message.
//! - [`Channel`] is one end of a channel (push/pull, pub/sub, req/rep, pair); [`Sender`] and
//!   [`Receiver`] are its typed halves, with the codec chosen by the payload type
//!   ([`Json`], [`Postcard`], [`Pod`], or raw bytes).
//! - [`ChannelConfig`] uses FairMQ's key names and defaults.
//! - Transports are picked by configuration: [`transport_by_name`] maps `"zeromq"` to
//!   [`ZmqTransport`].
//! - [`device`]: a [`device::Device`] is an async actor driven through FairMQ's state machine;
//!   `ferromq_cli::run_device_main` gives its binary FairMQ's command-line options.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use ferromq::prelude::*;
//!
//! let transport = ferromq::transport_by_name("zeromq").unwrap();
//! let push = ChannelConfig::new("data", SocketType::Push, Method::Bind).with_address("inproc://tour");
//! let pull = ChannelConfig::new("data", SocketType::Pull, Method::Connect).with_address("inproc://tour");
//! let mut sender = Channel::open(transport.as_ref(), push, "data").await?.into_sender::<Json<Vec<u32>>>();
//! let mut receiver = Channel::open(transport.as_ref(), pull, "data").await?.into_receiver::<Json<Vec<u32>>>();
//! sender.channel().bind_configured().await?;
//! receiver.channel().connect_configured().await?;
//! sender.send(Json(vec![1, 2, 3])).await?;
//! assert_eq!(receiver.receive().await?.0, vec![1, 2, 3]);
//! # Ok::<(), ferromq::Error>(()) }).unwrap();
//! ```
//!
//! # Feature flags
//! - `zeromq` (default): the zeromq transport (tcp, ipc, inproc) over the pure-Rust `zeromq` crate.
//! - `shmem` (default): the shared-memory transport, zero-copy between processes on one host.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use ferromq_core::*;
pub use ferromq_device::{available_transports, transport_by_name};
#[cfg(feature = "ofi")]
pub use ferromq_ofi::{OfiOptions, OfiTransport};
#[cfg(feature = "shmem")]
pub use ferromq_shm::{ShmOptions, ShmTransport, UnmanagedRegion};
#[cfg(feature = "zeromq")]
pub use ferromq_zmq::ZmqTransport;

/// Devices: the [`Device`](device::Device) trait, its context, runner, controller and control.
pub mod device {
    pub use ferromq_device::*;
}

/// The `#[async_trait]` attribute that `impl Device` blocks need.
pub use ferromq_device::async_trait;

/// What device code usually needs, in one import.
pub mod prelude {
    pub use ferromq_core::{
        Address, BoxError, Channel, ChannelConfig, Decode, Encode, Json, Message, Method, Parts,
        Payload, Pod, Postcard, Receiver, Sender, SocketType, Transport,
    };
    pub use ferromq_device::{Device, DeviceContext, Flow};
}
