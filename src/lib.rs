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
//! - Transports are picked by configuration: [`transports`] is the [`TransportRegistry`] of
//!   this build, which maps `"zeromq"` to [`ZmqTransport`], `"shmem"` to [`ShmTransport`]; a
//!   device runner is given one, and a program may add transports of its own to it.
//! - [`device`]: a [`device::Device`] is an async actor driven through FairMQ's state machine;
//!   [`run_device_main`] gives its binary FairMQ's command-line options (`--id`,
//!   `--channel-config`, `--mq-config`, `--control`, `--transport`, ...), exactly as
//!   `ferromq device KIND` has them. This crate is the only dependency a device needs:
//!
//! ```no_run
//! use ferromq::prelude::*;
//!
//! struct Counter;
//!
//! #[ferromq::async_trait]
//! impl Device for Counter {
//!     async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
//!         while ctx.next_iteration() {
//!             let message = ctx.receive("data").await?;
//!             println!("{} bytes", message.len());
//!         }
//!         Ok(())
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     ferromq::run_device_main(|_options: &ferromq::DeviceOptions| Counter)
//! }
//! ```
//!
//! - [`rpc`]: remote invocation between devices (call, call_return, call_buffer, broadcast),
//!   with aggregation of small calls.
//! - Shared memory: [`ShmTransport`], [`UnmanagedRegion`] (buffers you fill, with release
//!   callbacks: [`RegionCallback`], [`RegionBlock`]). [`run_device_main`] also makes the binary
//!   able to act as its session's cleanup watchdog, which removes the session's shared memory when
//!   every process using it has crashed. A program that drives devices or shmem channels itself,
//!   without [`run_device_main`], gets the same by calling [`run_watchdog_if_requested`] first
//!   thing in `main`.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use ferromq::prelude::*;
//!
//! let transport = ferromq::transports().create_default("zeromq", "tour").unwrap();
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
//! - `cli` (default): [`run_device_main`], [`run_device`] and [`DeviceOptions`], FairMQ's device
//!   command line for your own binaries (the library of the `ferromq` binary; needs `shmem`),
//!   and [`Signals`] for a binary that stops in order on SIGINT/SIGTERM itself.
//! - `ofi`: the ofi transport over libfabric (RDMA with verbs, or tcp); needs libfabric >= 1.17
//!   (`libfabric-dev`) to build.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "cli")]
pub use ferromq_cli::{
    BuiltinOptions, ControlMode, DeviceOptions, Signals, block_on, run_device, run_device_main,
};
pub use ferromq_core::*;
#[cfg(feature = "ofi")]
pub use ferromq_ofi::{OfiOptions, OfiTransport};
#[cfg(feature = "shmem")]
pub use ferromq_shm::{
    RegionBlock, RegionCallback, ShmBuffer, ShmError, ShmOptions, ShmTransport, UnmanagedRegion,
    run_watchdog_if_requested,
};
#[cfg(feature = "zeromq")]
pub use ferromq_zmq::ZmqTransport;

/// The transports of this build of ferromq (its `zeromq`, `shmem` and `ofi` features), under
/// their configuration names: what [`device::DeviceRunner::new`] takes. Add a transport of your
/// own with [`TransportRegistry::register`].
pub fn transports() -> TransportRegistry {
    #[allow(unused_mut, reason = "empty without transport features")]
    let mut registry = TransportRegistry::new();
    #[cfg(feature = "zeromq")]
    ferromq_zmq::register(&mut registry);
    #[cfg(feature = "shmem")]
    ferromq_shm::register(&mut registry);
    #[cfg(feature = "ofi")]
    ferromq_ofi::register(&mut registry);
    registry
}

/// Devices: the [`Device`](device::Device) trait, its context, runner, controller and control.
pub mod device {
    pub use ferromq_device::*;
}

/// The shared-memory transport's parts: segments, regions, descriptors, and the cleanup of a
/// session's objects (what `ferromq shm list` and `clean` use).
#[cfg(feature = "shmem")]
pub mod shm {
    pub use ferromq_shm::*;
}

/// Remote invocation between devices: typed calls, results, buffers and broadcasts over
/// channels of any transport, with calls packed into frames (`trad`, `ovfl`).
pub mod rpc {
    pub use ferromq_rpc::*;
}

/// Distributed Monte-Carlo tree search on [`rpc`]: a game in, a search over worker processes
/// out (Hex and tic-tac-toe built in; `examples/mcts-hex.rs`).
pub mod mcts {
    pub use ferromq_mcts::*;
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
