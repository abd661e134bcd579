//! The devices every pipeline needs, so that a topology can be built without writing code.
//!
//! Each device reads its options from properties (set by `ferromq device KIND --msg-size ...` or
//! a topology's `[devices.x.properties]`); [`Builtin::create`] makes one by name.
//!
//! | kind | channels (default names) | properties |
//! |---|---|---|
//! | `sampler` | out `data` | `msg-size`, `text`, `payload-file`, `rate`, `checksum` |
//! | `bsampler` | out `data` | `msg-size`, `msg-rate`, `same-msg`, `num-parts` |
//! | `sink` | in `data` | `verify` |
//! | `processor` | in `data-in`, out `data-out` | `touch` |
//! | `splitter` | in `data-in`, out `data-out[i]` | `routing` (`round-robin` or `key`) |
//! | `merger` | in `data-in[i]`, out `data-out` | |
//! | `proxy` | in `data-in`, out `data-out` | |
//! | `multiplier` | in `data-in`, out `data-out[i]` | |
//! | `client` | req `data` | `msg-size` |
//! | `server` | rep `data` | |
//! | `stf-source` | in `requests`, out `data-out[i]` (one per builder) | `stf-size` |
//! | `builder` | in `data-in`, out `requests[i]` (one per source) | `max-outstanding` |
//!
//! `in-channel` and `out-channel` rename the channels. `--max-iterations` bounds the messages a
//! sampler sends and a sink receives.
//!
//! # Checksums
//! With `checksum` (on by default for `sampler`), the first 8 bytes of each message are the
//! FNV-1a hash of the rest; a `sink` with `verify` checks it and fails on the first mismatch.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod event_building;
mod forwarders;
mod pacing;
mod reqrep;
mod sampler;
mod sink;

use ferromq_device::{Device, DeviceContext, DeviceError};

pub use event_building::{Builder as EventBuilder, StfSource};
pub use forwarders::{Merger, Multiplier, Processor, Proxy, Splitter};
pub use pacing::Pacer;
pub use reqrep::{Client, Server};
pub use sampler::{BenchmarkSampler, Sampler};
pub use sink::{Sink, SinkSummary};

/// The built-in device kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// Sends generated, text or file messages.
    Sampler,
    /// FairMQ's benchmark sampler.
    BenchmarkSampler,
    /// Counts (and verifies) what it receives.
    Sink,
    /// Passes messages on, optionally touching every byte.
    Processor,
    /// One input to N outputs.
    Splitter,
    /// N inputs to one output.
    Merger,
    /// Forwards unchanged.
    Proxy,
    /// One input copied to N outputs.
    Multiplier,
    /// Sends requests and checks the replies.
    Client,
    /// Echoes requests.
    Server,
    /// Event-building source of sub-timeframes.
    StfSource,
    /// Event builder.
    Builder,
}

impl Builtin {
    /// Every kind with its name.
    pub const ALL: [(&'static str, Builtin); 12] = [
        ("sampler", Builtin::Sampler),
        ("bsampler", Builtin::BenchmarkSampler),
        ("sink", Builtin::Sink),
        ("processor", Builtin::Processor),
        ("splitter", Builtin::Splitter),
        ("merger", Builtin::Merger),
        ("proxy", Builtin::Proxy),
        ("multiplier", Builtin::Multiplier),
        ("client", Builtin::Client),
        ("server", Builtin::Server),
        ("stf-source", Builtin::StfSource),
        ("builder", Builtin::Builder),
    ];

    /// The kind called `name`.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL
            .iter()
            .find(|(kind_name, _)| *kind_name == name)
            .map(|(_, kind)| *kind)
    }

    /// The names, for help texts and errors.
    pub fn names() -> Vec<&'static str> {
        Builtin::ALL.iter().map(|(name, _)| *name).collect()
    }

    /// A new device of this kind.
    pub fn create(self) -> Box<dyn Device> {
        match self {
            Builtin::Sampler => Box::new(Sampler::default()),
            Builtin::BenchmarkSampler => Box::new(BenchmarkSampler::default()),
            Builtin::Sink => Box::new(Sink::default()),
            Builtin::Processor => Box::new(Processor::default()),
            Builtin::Splitter => Box::new(Splitter::default()),
            Builtin::Merger => Box::new(Merger::default()),
            Builtin::Proxy => Box::new(Proxy::default()),
            Builtin::Multiplier => Box::new(Multiplier::default()),
            Builtin::Client => Box::new(Client::default()),
            Builtin::Server => Box::new(Server::default()),
            Builtin::StfSource => Box::new(StfSource::default()),
            Builtin::Builder => Box::new(EventBuilder::default()),
        }
    }
}

/// FNV-1a, 64 bits: fast, dependency-free, enough to catch corruption and misrouting.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes the checksum header of `message` (its first 8 bytes hash the rest).
pub fn write_checksum(message: &mut [u8]) {
    if message.len() < 8 {
        return;
    }
    let hash = fnv1a(&message[8..]);
    message[..8].copy_from_slice(&hash.to_le_bytes());
}

/// True when the first 8 bytes of `message` hash the rest.
pub fn checksum_ok(message: &[u8]) -> bool {
    message.len() >= 8 && message[..8] == fnv1a(&message[8..]).to_le_bytes()
}

pub(crate) fn channel_property(ctx: &DeviceContext, key: &str, default: &str) -> String {
    ctx.property_text(key).unwrap_or_else(|| default.to_owned())
}

/// The sockets of channel `base` (`data-out[0]`, `data-out[1]`, or just `data-out`).
pub(crate) fn sockets_of(ctx: &DeviceContext, base: &str) -> Result<Vec<String>, DeviceError> {
    let names = ctx.sub_channel_names(base);
    if names.is_empty() {
        return Err(DeviceError::UnknownChannel {
            device: ctx.id().to_owned(),
            name: base.to_owned(),
            available: ctx.channel_names().join(", "),
        });
    }
    Ok(names)
}

pub(crate) fn bool_property(
    ctx: &DeviceContext,
    key: &str,
    default: bool,
) -> Result<bool, DeviceError> {
    ctx.property_or(key, default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_round_trip_and_detection() {
        let mut message = b"01234567payload".to_vec();
        write_checksum(&mut message);
        assert!(checksum_ok(&message));
        message[10] ^= 1;
        assert!(!checksum_ok(&message));
        assert!(!checksum_ok(b"short"));
    }

    #[test]
    fn every_kind_has_a_name() {
        for (name, kind) in Builtin::ALL {
            assert_eq!(Builtin::from_name(name), Some(kind));
        }
        assert_eq!(Builtin::from_name("teleporter"), None);
    }
}
