//! Devices: FairMQ's state machine around a user's async code.
//!
//! A user implements [`Device`] (hooks `init`, `init_task`, `run` or `on_data`, `reset_task`,
//! `reset`); a [`DeviceRunner`] owns it with its [`DeviceConfig`] and executes the state machine
//! of [`state`]; a [`DeviceController`] requests transitions and observes states. The
//! [`control`] module drives a controller: the static sequence, a clean shutdown from any state,
//! and the external control endpoint (JSON over a zmq REP socket) a launcher uses.
//!
//! Transports are not this crate's business: the runner gets a
//! [`TransportRegistry`](ferromq_core::TransportRegistry) from the binary and makes each
//! channel's transport from it by name, so this crate compiles no transport.
//!
//! Binding and connecting are done by the runner from the channel configuration; hooks reach
//! channels by name through [`DeviceContext`] (`data`, `data[1]`), raw or typed, and
//! [`DeviceContext::poll`] waits on several channels fairly.
//!
//! ```
//! use ferromq_core::{BoxError, ChannelConfig, Message, Method, SocketType};
//! use ferromq_device::{control, Device, DeviceConfig, DeviceContext, DeviceRunner};
//!
//! struct Hello;
//!
//! #[ferromq_device::async_trait]
//! impl Device for Hello {
//!     async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
//!         while ctx.next_iteration() {
//!             ctx.send("data", Message::from("hello")).await?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let channel = ChannelConfig::new("data", SocketType::Pub, Method::Bind).with_address("inproc://hello");
//! let mut config = DeviceConfig::new("hello").with_channel(channel).unwrap();
//! config.max_iterations = 3;
//! let mut transports = ferromq_core::TransportRegistry::new();
//! ferromq_zmq::register(&mut transports);
//! let (runner, controller) = DeviceRunner::new(Hello, config, std::sync::Arc::new(transports));
//! let device = tokio::spawn(runner.run());
//! control::run_static(&controller).await.unwrap();
//! device.await.unwrap().unwrap();
//! # });
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
pub mod control;
mod device;
mod error;
pub mod metrics;
pub mod presence;
pub mod rates;
mod runner;
pub mod state;
mod stop;
pub mod tap;

/// The attribute `impl Device` blocks need (the trait has async methods and is object-safe).
pub use async_trait::async_trait;
pub use config::{DEFAULT_TRANSPORT, DeviceConfig, SocketConfig};
pub use device::{ChannelId, Device, DeviceContext, Flow, parse_property};
pub use error::{DeviceError, Result};
/// An error and its causes on one line (core's, for device code that has only this crate).
pub use ferromq_core::error_chain;
pub use runner::{
    CHANNEL_PROPERTY_PREFIX, DeviceController, DeviceRunner, StateChange, read_address_property,
};
pub use state::{State, Transition};
