//! The zeromq transport: tcp and ipc over the pure-Rust `zeromq` crate (zmq.rs), plus inproc and
//! pair, which zmq.rs lacks, implemented here.
//!
//! [`ZmqTransport`] is selected by `transport = "zeromq"`; device code sees only
//! [`ferromq_core::Transport`]. On the wire it speaks ZMTP 3, so a ferromq device talks to any
//! libzmq program (FairMQ devices with `--transport zeromq` included) over push/pull, pub/sub
//! and req/rep; ferromq's pair is a DEALER on both ends and talks to ferromq pairs.
//!
//! # Backpressure
//! zmq.rs queues 100 000 messages per peer with no way to change it, and fails a send when no
//! peer is connected. ferromq bounds what it hands to zmq.rs by `sndBufSize` (a full queue makes
//! `send` wait, or time out with the message handed back) and makes a send with no peer wait for
//! one. Pub never waits: over tcp and ipc each subscriber has a queue of `sndBufSize`
//! messages, and one whose queue is full misses the message (counted as lost for a slow
//! subscriber), as ZeroMQ documents; the others are not held back.
//!
//! # Shutdown
//! zmq.rs has no linger: what is queued when a socket drops is lost. `close` waits up to the
//! channel's `linger` until zmq.rs has encoded every accepted message, then lets its writer flush.
//!
//! # Copies and allocation
//! A [`ferromq_core::Message`] becomes zmq.rs frames with `Message::into_bytes`, which never
//! copies (transport memory stays alive inside the `Bytes`). zmq.rs's encoder then copies each
//! frame into the connection's write buffer: one copy per message on the send side, which is
//! zmq.rs's design. Received frames arrive as `Bytes` and become messages without a copy.
//! Inproc moves messages without any copy.
//!
//! ```
//! # tokio_test();
//! # fn tokio_test() { tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use ferromq_core::{Channel, ChannelConfig, Message, Method, SocketType, Transport};
//! use ferromq_zmq::ZmqTransport;
//!
//! let transport = ZmqTransport::new();
//! let push = ChannelConfig::new("data", SocketType::Push, Method::Bind).with_address("inproc://doc");
//! let pull = ChannelConfig::new("data", SocketType::Pull, Method::Connect).with_address("inproc://doc");
//! let mut sender = Channel::open(&transport, push, "data").await.unwrap();
//! let mut receiver = Channel::open(&transport, pull, "data").await.unwrap();
//! sender.bind_configured().await.unwrap();
//! receiver.connect_configured().await.unwrap();
//! sender.send(Message::from("hello")).await.unwrap();
//! assert_eq!(receiver.receive().await.unwrap().data(), b"hello");
//! # }) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod flow;
pub use flow::InFlight;
mod handshake;
mod heap_pool;
pub use handshake::PeerRules;
mod inproc;
mod net;
mod socket;
mod zmtp;
mod zmtp_channel;
pub use socket::ZmqSocket;
pub use zmtp_channel::PeerLink;

/// Binding and connecting zmq.rs sockets the way ferromq does, for transports that use zmq.rs
/// sockets of their own (the shmem transport's metadata channel).
pub mod endpoint {
    use std::path::PathBuf;

    use ferromq_core::{Address, ChannelLabel, Error, TcpHost};

    /// Binds a zmq.rs socket to `address` the way ferromq binds: its own listener (exact
    /// address-in-use errors, port 0 resolved, stale ipc socket files removed), handed to zmq.rs.
    /// Returns the address actually bound and, for ipc, the socket file, which zmq.rs removes
    /// when the listener stops (and this function removes when zmq.rs refuses the listener).
    ///
    /// # Errors
    /// [`Error::AddressInUse`], [`Error::Bind`], [`Error::UnsupportedAddress`] (inproc).
    pub async fn bind(
        socket: &mut impl zeromq::Socket,
        label: &ChannelLabel,
        address: &Address,
    ) -> Result<(Address, Option<PathBuf>), Error> {
        let label = label.clone().with_address(address.to_string());
        let (listener, bound, path) = match address {
            Address::Tcp { host, port } => {
                let (listener, bound) = crate::net::bind_tcp(&label, host, *port)?;
                (listener, bound, None)
            }
            Address::Ipc { path } => (
                crate::net::bind_ipc(&label, path)?,
                address.clone(),
                Some(path.clone()),
            ),
            other => {
                return Err(Error::UnsupportedAddress {
                    channel: label,
                    address: other.to_string(),
                    reason: "tcp:// and ipc:// addresses bind here; inproc:// has its own sockets",
                });
            }
        };
        if let Err(source) = socket.bind_listener(listener).await {
            // A listener zmq.rs refused never started, so its socket file is ours to remove.
            if let Some(path) = &path {
                let _ = std::fs::remove_file(path);
            }
            return Err(Error::Bind {
                channel: label,
                source: Box::new(source),
            });
        }
        Ok((bound, path))
    }

    /// The zmq.rs endpoint string to connect to `address`.
    ///
    /// # Errors
    /// [`Error::UnsupportedAddress`] for `tcp://*` and inproc.
    pub fn connect_endpoint(label: &ChannelLabel, address: &Address) -> Result<String, Error> {
        match address {
            Address::Tcp {
                host: TcpHost::Any, ..
            }
            | Address::Inproc { .. } => Err(Error::UnsupportedAddress {
                channel: label.clone(),
                address: address.to_string(),
                reason: "connect to tcp://host:port or ipc://path",
            }),
            _ => Ok(address.to_string()),
        }
    }
}

use async_trait::async_trait;
use ferromq_core::{ChannelConfig, Result, Socket, Transport};

/// The first bytes of every descriptor frame the shmem transport sends over this transport (see
/// [`ZmqTransport::with_peer_rules`]). A zeromq receiver that gets such a frame reports a
/// shmem peer instead of delivering it as a payload. It is defined here, by the carrier of
/// those frames, so that ferromq-core knows no transport's wire format.
pub const SHMEM_DESCRIPTOR_MAGIC: &[u8; 8] = b"FMQSHM03";
/// The shortest shmem descriptor frame (its header, no records).
pub const SHMEM_DESCRIPTOR_MIN_LEN: usize = 32;

/// The zeromq transport (`transport = "zeromq"`).
#[derive(Debug, Clone, Copy)]
pub struct ZmqTransport {
    rules: PeerRules,
    /// Whether push, pull, pair and pub sockets over tcp and ipc are ferromq's own (a peer's
    /// death loses nothing queued; a stalled subscriber holds back no one: see
    /// `zmtp_channel.rs`) rather than zmq.rs's. shmem's carrier has
    /// them for their connections, which get descriptor rings
    /// ([`ZmqTransport::own_zmtp_with_peer_rules`]).
    own_zmtp: bool,
}

impl Default for ZmqTransport {
    fn default() -> ZmqTransport {
        ZmqTransport::new()
    }
}

impl ZmqTransport {
    /// The configuration name of this transport.
    pub const NAME: &'static str = "zeromq";

    /// The transport. Its receivers report a shmem peer ([`ferromq_core::Error::TransportMismatch`])
    /// instead of delivering its descriptor frames as data.
    pub fn new() -> ZmqTransport {
        ZmqTransport {
            rules: PeerRules::ZEROMQ,
            own_zmtp: true,
        }
    }

    /// The transport as the carrier of another transport's frames (shmem's descriptors): its
    /// sockets announce and check peers by `rules` (see [`PeerRules`]).
    pub fn with_peer_rules(rules: PeerRules) -> ZmqTransport {
        ZmqTransport {
            rules,
            own_zmtp: false,
        }
    }

    /// [`ZmqTransport::with_peer_rules`] whose push, pull, pair and pub over tcp and ipc are
    /// ferromq's own (the shmem transport's descriptor carrier: its push and pair report each
    /// connection, see [`ZmqSocket::next_peer`]); other patterns stay on zmq.rs.
    pub fn own_zmtp_with_peer_rules(rules: PeerRules) -> ZmqTransport {
        ZmqTransport {
            rules,
            own_zmtp: true,
        }
    }

    /// A socket for `config`, by type (what [`Transport::create_socket`] boxes).
    ///
    /// # Errors
    /// The configuration's problem ([`ChannelConfig::validate`]).
    pub fn create_zmq_socket(
        &self,
        config: &ChannelConfig,
        socket_name: &str,
    ) -> Result<ZmqSocket> {
        config.validate()?;
        Ok(socket::ZmqSocket::new(
            config,
            socket_name,
            self.rules,
            self.own_zmtp,
        ))
    }
}

/// Adds the zeromq transport to `registry` under [`ZmqTransport::NAME`]; it takes no options.
pub fn register(registry: &mut ferromq_core::TransportRegistry) {
    registry.register(
        ZmqTransport::NAME,
        ferromq_core::TransportTraits::PLAIN,
        |_options| Ok(std::sync::Arc::new(ZmqTransport::new())),
    );
}

#[async_trait]
impl Transport for ZmqTransport {
    fn name(&self) -> &'static str {
        ZmqTransport::NAME
    }

    /// From 64 KiB on, a recycled buffer of this thread when there is one (see `heap_pool.rs`:
    /// its bytes are an earlier message's, not zeroes); an error naming the transport when the
    /// memory cannot be had.
    async fn new_message(&self, size: usize) -> Result<ferromq_core::Message> {
        heap_pool::message(size).map_err(|error| ferromq_core::Error::Allocation {
            transport: ZmqTransport::NAME,
            source: format!("{size} bytes: {error}").into(),
        })
    }

    fn try_new_message(&self, size: usize) -> Option<ferromq_core::Message> {
        heap_pool::message(size).ok()
    }

    async fn create_socket(
        &self,
        config: &ChannelConfig,
        socket_name: &str,
    ) -> Result<Box<dyn Socket>> {
        config.refuse_provider()?;
        Ok(Box::new(self.create_zmq_socket(config, socket_name)?))
    }
}
