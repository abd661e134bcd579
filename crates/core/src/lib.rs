//! The bottom of ferromq: messages, channel configuration and the transport traits.
//!
//! `ferromq-core` knows no transport library and no configuration file format. Transports
//! (`ferromq-zmq`, `ferromq-shm`, `ferromq-ofi`) implement [`Transport`] and [`Socket`];
//! devices hold [`Channel`]s and typed [`Sender`]/[`Receiver`] halves, and never see which
//! transport is underneath.
//!
//! - [`Message`] owns its bytes and moves without copying; [`Parts`] is a multipart message.
//! - [`ChannelConfig`] uses FairMQ's key names and defaults; [`Address`] parses channel addresses.
//! - [`Error`] names the channel it is about; [`SendError`] hands an unsent message back.
//! - [`Payload`] chooses a codec by type: raw bytes, [`Json`], [`Postcard`], [`Pod`].
//! - [`TransportRegistry`] maps configured transport names to transports; the binary fills it.
//!
//! ```
//! use ferromq_core::{Address, ChannelConfig, Message, Method, SocketType};
//! let config = ChannelConfig::new("data", SocketType::Push, Method::Bind).with_address("ipc:///tmp/x");
//! assert!(matches!(config.parsed_address(), Ok(Some(Address::Ipc { .. }))));
//! let message = Message::from(vec![1u8, 2, 3]);
//! assert_eq!(message.len(), 3);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod address;
mod config;
mod error;
mod keys;
mod message;
mod registry;
mod spin;
mod tap;
mod transport;
mod typed;

pub use address::{Address, AddressError, TcpHost};
pub use config::{
    ChannelConfig, ConfigError, Endpoint, MAX_NUM_SOCKETS, MAX_SECONDS, Method, SocketType,
};
pub use error::{
    BoxError, ChannelLabel, CodecError, Error, Result, SendError, error_chain, with_unread_at_close,
};
pub use keys::{CHANNEL_KEYS, ChannelKey, KeyKind, KeyValue, channel_key, known_channel_keys};
pub use message::{
    Message, MessageBuffer, Parts, PartsIntoIter, RegistrableMemory, UsedSizeError, copied_bytes,
    record_copy,
};
pub use registry::{MakeTransport, TransportOptions, TransportRegistry, TransportTraits};
pub use spin::{DEFAULT_SPIN_US, SpinPolicy, WaitOutcome};
pub use tap::{Direction, TapReceiver, TapSlot, Tapped};
pub use transport::{
    Channel, ChannelCounters, CounterSnapshot, MemoryFigures, SendFigures, SendPermit, SendWait,
    Socket, Transport, yield_once,
};
pub use typed::{Decode, Encode, Json, Payload, Pod, Postcard, Receiver, Sender};
