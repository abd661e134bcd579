//! The ofi transport: libfabric reliable-datagram endpoints between hosts (verbs on
//! InfiniBand/RoCE, tcp anywhere), with shared memory on both ends and no copy in between.
//!
//! Selecting it is configuration only: `transport = "ofi"` on a channel whose address is
//! `tcp://host:port` (libfabric's `tcp;ofi_rxm`) or `verbs://host:port` (`verbs;ofi_rxm`); the
//! channel key `provider` names another provider. The address is where the zmq side channel
//! binds; the libfabric endpoint picks its own port on the same interface and tells the peer.
//!
//! - `fabric` (private): the only module that calls libfabric.
//! - `engine`: one thread per endpoint posts operations and polls the completion queue, and
//!   keeps the registration cache (each shm segment or region registered once).
//! - `protocol`: the side channel's messages (hello, announce, grant, heartbeat, bye) and the
//!   tags of data operations.
//! - `socket`: the async socket and the per-channel driver task that speaks the protocol.
//!
//! # Zero copy
//! A message in shared memory is sent from its segment (registered once); a message is
//! received into a block of the receiving device's shm segment when the device has shmem
//! channels, so a relay that receives over ofi and forwards over shmem copies nothing, and one
//! that receives over shmem and forwards over ofi neither. Heap messages are sent from the heap.
//!
//! # Guarantees
//! - Flow control by credits: at most `sndBufSize` messages in flight per channel (a full window
//!   makes `send` wait), at most `rcvBufSize` messages and a bounded number of bytes posted for
//!   receiving; nothing is dropped.
//! - Messages larger than the provider's maximum (or `ofi-max-chunk-size`) travel in chunks and
//!   are reassembled in place.
//! - `send` returns once the message is accepted; `close` waits until every accepted message
//!   reached the peer, giving up after `linger` in which nothing moved (no chunk left, no grant
//!   came). A message accepted before any peer existed waits for
//!   one (it is not lost); one never granted by a peer that died goes to the next peer.
//! - A peer that dies (no heartbeat for `ofi-peer-timeout-ms`, a broken side channel, a failed
//!   completion) is reported by the next send or receive as `ferromq_core::Error::PeerGone`,
//!   with the number of messages lost in transfer; nothing hangs.
//!
//! Without the `ofi` feature this crate is empty.
#![cfg(feature = "ofi")]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod driver;
mod engine;
mod fabric;
mod protocol;
mod socket;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferromq_core::{ChannelConfig, Result, Socket, Transport};

pub use engine::EngineStats;

/// Entry points for `ferromq-fuzz` (crates/fuzz): the side channel's frame decoder, reachable
/// from outside the crate. Not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::protocol::{Control, PROTOCOL_VERSION, tag_base};

    /// Decodes a side-channel frame as the socket does, goes through an announce as the
    /// receiver does (seqs counted from `first_seq`, sizes summed, tags made), and encodes what
    /// it decoded; `None` when the frame is refused.
    pub fn decode_and_encode_control_frame(frame: &[u8]) -> Option<Vec<u8>> {
        let control = Control::decode(frame)?;
        if let Control::Announce {
            first_seq,
            messages,
        } = &control
        {
            for (seq, sizes) in (*first_seq..).zip(messages) {
                let total: u64 = sizes.iter().sum();
                std::hint::black_box((total, tag_base(seq, sizes.len().saturating_sub(1))));
            }
        }
        Some(control.encode())
    }

    /// One encoded frame of each side-channel message.
    pub fn control_frame_examples() -> Vec<Vec<u8>> {
        [
            Control::Hello {
                version: PROTOCOL_VERSION,
                socket_type: "push".into(),
                provider: "tcp;ofi_rxm".into(),
                address: vec![2, 0, 0x1f, 0x90, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            },
            Control::Welcome {
                address: vec![2, 0, 0x1f, 0x91, 127, 0, 0, 1],
            },
            Control::Refused {
                reason: "channel 'data' already has a peer (ofi channels are one-to-one)".into(),
            },
            Control::Announce {
                first_seq: 7,
                messages: vec![vec![0, 64, 1 << 26], vec![1], vec![]],
            },
            Control::Announce {
                first_seq: u64::MAX - 2,
                messages: vec![vec![4096; 16]],
            },
            Control::Grant {
                seqs: vec![7, 8, 9],
            },
            Control::Heartbeat,
            Control::Bye,
            Control::Farewell,
        ]
        .iter()
        .map(Control::encode)
        .collect()
    }
}

/// Gives SIGINT and SIGTERM back to their default disposition when a shared library installed
/// a handler for them before `main`.
///
/// Debian's libfabric links the PSM libraries (`libinfinipath`), whose load-time constructor
/// installs SIGINT/SIGTERM handlers that end the process. tokio's signal handling chains to a
/// handler it finds installed, so Ctrl-C would kill a device before its orderly shutdown ran.
/// Call this before installing signal handlers (ferromq's launcher and devices do).
pub fn reclaim_termination_signals() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: SIG_DFL is a valid disposition; this runs before ferromq installs its own
        // handlers, so it removes only what a library installed. The previous action is put back
        // when it was the default or "ignore" (a background job's SIGINT stays ignored).
        let previous = unsafe { sigaction(signal, &default) };
        if let Ok(previous) = previous
            && matches!(previous.handler(), SigHandler::SigIgn)
        {
            // SAFETY: as above; restoring the disposition we just read.
            let _ = unsafe { sigaction(signal, &previous) };
        }
    }
}

/// Options of the ofi transport (device properties `ofi-*`).
#[derive(Clone)]
pub struct OfiOptions {
    /// Where received messages are allocated (the device's shmem transport, so that forwarding
    /// over shmem copies nothing); `None`: the heap.
    pub receive_memory: Option<Arc<dyn Transport>>,
    /// Largest single libfabric operation; larger parts are split (`ofi-max-chunk-size`).
    pub max_chunk: usize,
    /// Bytes a receiving channel posts at most at once, beyond one message
    /// (`ofi-receive-window`).
    pub receive_window: usize,
    /// Silence after which the peer counts as dead (`ofi-peer-timeout-ms`).
    pub peer_timeout: Duration,
    /// Largest message (all parts) a receiver accepts a peer's announcement of
    /// (`ofi-max-message-size`); a peer announcing more is refused.
    pub max_message_size: u64,
}

impl Default for OfiOptions {
    fn default() -> Self {
        OfiOptions {
            receive_memory: None,
            max_chunk: 8 << 20,
            receive_window: 256 << 20,
            peer_timeout: Duration::from_secs(5),
            max_message_size: 4 << 30,
        }
    }
}

impl OfiOptions {
    /// The device properties [`OfiOptions::from_device`] reads.
    pub const PROPERTIES: [&'static str; 4] = [
        "ofi-max-chunk-size",
        "ofi-receive-window",
        "ofi-peer-timeout-ms",
        "ofi-max-message-size",
    ];

    /// The options for a device: its receive memory, and the defaults overridden by the
    /// properties [`OfiOptions::PROPERTIES`] names.
    ///
    /// # Errors
    /// [`ferromq_core::Error::Config`] naming a property whose value is not a number of the
    /// right kind.
    pub fn from_device(
        device: &ferromq_core::TransportOptions,
    ) -> ferromq_core::Result<OfiOptions> {
        let defaults = OfiOptions::default();
        Ok(OfiOptions {
            receive_memory: device.receive_memory.clone(),
            max_chunk: device
                .size("ofi-max-chunk-size")?
                .unwrap_or(defaults.max_chunk),
            receive_window: device
                .size("ofi-receive-window")?
                .unwrap_or(defaults.receive_window),
            peer_timeout: device
                .millis("ofi-peer-timeout-ms")?
                .unwrap_or(defaults.peer_timeout),
            max_message_size: device
                .number("ofi-max-message-size")?
                .unwrap_or(defaults.max_message_size),
        })
    }
}

impl std::fmt::Debug for OfiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfiOptions")
            .field(
                "receive_memory",
                &self.receive_memory.as_ref().map(|memory| memory.name()),
            )
            .field("max_chunk", &self.max_chunk)
            .field("receive_window", &self.receive_window)
            .field("max_message_size", &self.max_message_size)
            .field("peer_timeout", &self.peer_timeout)
            .finish()
    }
}

/// The address schemes an ofi channel binds and connects (`tcp://`, `verbs://`;
/// [`ferromq_core::TransportTraits::schemes`]).
pub const SCHEMES: [&str; 2] = ["tcp", "verbs"];

/// Adds the ofi transport to `registry` under [`OfiTransport::NAME`], configured per device
/// from the properties `ofi-max-chunk-size`, `ofi-receive-window`, `ofi-peer-timeout-ms` and
/// `ofi-max-message-size`; it receives into the memory it is given (the device's shmem).
pub fn register(registry: &mut ferromq_core::TransportRegistry) {
    registry.register(
        OfiTransport::NAME,
        ferromq_core::TransportTraits::PLAIN
            .wanting_receive_memory()
            .without_ipc()
            .taking_schemes(&SCHEMES)
            .reading(&OfiOptions::PROPERTIES),
        |options| {
            let transport: Arc<dyn ferromq_core::Transport> =
                Arc::new(OfiTransport::new(OfiOptions::from_device(options)?));
            Ok(transport)
        },
    );
}

/// The ofi transport (`transport = "ofi"`).
#[derive(Debug, Clone)]
pub struct OfiTransport {
    options: Arc<OfiOptions>,
    stats: Arc<EngineStats>,
}

impl OfiTransport {
    /// The configuration name of this transport.
    pub const NAME: &'static str = "ofi";

    /// A transport with `options`.
    pub fn new(options: OfiOptions) -> OfiTransport {
        OfiTransport {
            options: Arc::new(options),
            stats: Arc::default(),
        }
    }

    /// Counters over every endpoint this transport opened: registrations (the cache's misses),
    /// bytes sent and received.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }
}

#[async_trait]
impl Transport for OfiTransport {
    fn name(&self) -> &'static str {
        OfiTransport::NAME
    }

    async fn new_message(&self, size: usize) -> Result<ferromq_core::Message> {
        match &self.options.receive_memory {
            Some(memory) => memory.new_message(size).await,
            None => ferromq_core::Message::try_new(size).map_err(|error| {
                ferromq_core::Error::Allocation {
                    transport: OfiTransport::NAME,
                    source: format!("{size} bytes: {error}").into(),
                }
            }),
        }
    }

    async fn create_socket(
        &self,
        config: &ChannelConfig,
        socket_name: &str,
    ) -> Result<Box<dyn Socket>> {
        config.validate()?;
        Ok(Box::new(socket::OfiSocket::new(
            config,
            socket_name,
            Arc::clone(&self.options),
            Arc::clone(&self.stats),
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::OfiOptions;

    /// Each key the transport says it reads (the keys a built-in device takes for it) is read:
    /// a malformed value under it is refused, naming it.
    #[test]
    fn every_listed_property_is_read() {
        for key in OfiOptions::PROPERTIES {
            let mut device = ferromq_core::TransportOptions::for_session("s");
            device.properties.insert(key.to_owned(), "abc".to_owned());
            let error = OfiOptions::from_device(&device).expect_err(key);
            assert!(
                error.to_string().contains(&format!("{key:?}")),
                "{key}: {error}"
            );
        }
    }
}
