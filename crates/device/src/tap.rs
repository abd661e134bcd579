//! Serving a channel's tap to a recorder (`ferromq record`), and the stream's format.
//!
//! A `tap` request on a device's control endpoint (the read-only one included: a tap observes)
//! opens a tap on the named channel ([`ferromq_core::TapSlot`]) and binds a push socket next to
//! the device's presence entry; a task forwards every copy there as one multipart message:
//! first a [`TapHeader`] part, then the message's parts, boundaries kept. When the tap closes
//! (`untap`, another tap on the channel, or the recorder gone: nothing taken for
//! [`RECORDER_SILENCE`]), a last header-only message with [`TapKind::End`] carries the final
//! count of missed messages; a device at its end closes its taps too and waits up to
//! [`TAP_FLUSH`] for the copies still queued and the end to go out. The device's
//! own sends and receives never wait for any of this: what does not fit in the tap's queue
//! ([`TAP_QUEUE`]) is counted missed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use ferromq_core::{Channel, ChannelConfig, Message, Method, Parts, SocketType, Transport};

use crate::runner::DeviceController;

/// Copies a tap holds for its recorder before it counts messages as missed.
pub const TAP_QUEUE: usize = 8192;

/// How long the forwarder waits for a recorder to take a copy before it takes it for gone and
/// closes the tap.
pub const RECORDER_SILENCE: Duration = Duration::from_secs(5);

/// How long a device at its end waits for its taps' forwarders to hand their last copies and
/// the tap's end to their recorders: bounded, since a device never waits long for an observer.
pub const TAP_FLUSH: Duration = Duration::from_secs(2);

/// The size of an encoded [`TapHeader`].
pub const HEADER_LEN: usize = 25;

/// What a tap stream message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapKind {
    /// A copy of a message the channel received.
    In,
    /// A copy of a message the channel sent.
    Out,
    /// The tap closed: no message follows.
    End,
}

/// The first part of every tap stream message (little-endian: sequence u64, nanoseconds since
/// the tap opened u64, messages missed so far u64, kind u8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapHeader {
    /// The message's number since the tap opened (for `End`: how many were numbered).
    pub sequence: u64,
    /// When it passed, since the tap opened.
    pub at: Duration,
    /// Messages missed so far (the tap's queue was full).
    pub missed: u64,
    /// What follows.
    pub kind: TapKind,
}

impl TapHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0; HEADER_LEN];
        bytes[..8].copy_from_slice(&self.sequence.to_le_bytes());
        let nanos = u64::try_from(self.at.as_nanos()).unwrap_or(u64::MAX);
        bytes[8..16].copy_from_slice(&nanos.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.missed.to_le_bytes());
        bytes[24] = match self.kind {
            TapKind::In => 0,
            TapKind::Out => 1,
            TapKind::End => 2,
        };
        bytes
    }

    /// Reads a header; `None` when `bytes` is not one.
    pub fn decode(bytes: &[u8]) -> Option<TapHeader> {
        if bytes.len() != HEADER_LEN {
            return None;
        }
        let word =
            |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
        let kind = match bytes[24] {
            0 => TapKind::In,
            1 => TapKind::Out,
            2 => TapKind::End,
            _ => return None,
        };
        Some(TapHeader {
            sequence: word(0),
            at: Duration::from_nanos(word(8)),
            missed: word(16),
            kind,
        })
    }
}

/// Opens a tap on `controller`'s channel `channel`, binds its stream at `address` over
/// `transport` and forwards copies there until the tap closes. Returns the bound address and
/// the channel's configuration (`key=value,...`).
///
/// # Errors
/// The device has no channel of that name (the names it has are listed), or the stream's
/// socket cannot be bound.
pub async fn serve(
    transport: &dyn Transport,
    controller: &DeviceController,
    channel: &str,
    address: &str,
) -> Result<(String, String), String> {
    let configs = controller.channel_configs();
    let Some((_, config)) = configs.iter().find(|(name, _)| name == channel) else {
        let names: Vec<&str> = configs.iter().map(|(name, _)| name.as_str()).collect();
        return Err(if names.is_empty() {
            format!("no channel {channel:?}: the device has no channels (yet)")
        } else {
            format!("no channel {channel:?}; its channels: {}", names.join(", "))
        });
    };
    let stream_config = ChannelConfig {
        rate_logging: 0,
        linger: 1000,
        ..ChannelConfig::new("tap", SocketType::Push, Method::Bind).with_address(address)
    };
    let mut stream = Channel::open(transport, stream_config, "tap")
        .await
        .map_err(|error| error.to_string())?;
    let bound = stream
        .bind_configured()
        .await
        .map_err(|error| error.to_string())?
        .to_string();
    let owner = controller.clone();
    let channel_name = channel.to_owned();
    controller
        .tap_forwarded(channel, TAP_QUEUE, move |tap| {
            tokio::spawn(forward(tap, stream, owner, channel_name))
        })
        .map_err(|refused| refused.to_string())?;
    Ok((bound, config.clone()))
}

/// Sends every copy of `tap` down `stream` until the tap closes, then its end; closes the tap
/// itself when the recorder takes nothing for [`RECORDER_SILENCE`].
async fn forward(
    mut tap: ferromq_core::TapReceiver,
    mut stream: Channel,
    controller: DeviceController,
    channel: String,
) {
    let mut numbered = 0;
    while let Some(copy) = tap.copies.recv().await {
        numbered = copy.sequence + 1;
        let header = TapHeader {
            sequence: copy.sequence,
            at: copy.at,
            missed: tap.missed.load(Ordering::Relaxed),
            kind: match copy.direction {
                ferromq_core::Direction::In => TapKind::In,
                ferromq_core::Direction::Out => TapKind::Out,
            },
        };
        let mut parts = Parts::with_capacity(copy.parts.len() + 1);
        parts.push(Message::from(Bytes::copy_from_slice(&header.encode())));
        for part in copy.parts {
            parts.push(Message::from(part));
        }
        if stream
            .send_parts_timeout(parts, RECORDER_SILENCE)
            .await
            .is_err()
        {
            tracing::info!(device = %controller.id(), %channel, "the recorder is gone: tap closed");
            controller.untap(&channel);
            let _ = stream.close().await;
            return;
        }
    }
    // Closed (untap, or replaced): the last word says how many were missed in all.
    let missed = tap.missed.load(Ordering::Relaxed);
    let end = TapHeader {
        sequence: numbered,
        at: Duration::ZERO,
        missed,
        kind: TapKind::End,
    };
    let _ = stream
        .send_timeout(
            Message::from(Bytes::copy_from_slice(&end.encode())),
            RECORDER_SILENCE,
        )
        .await;
    let _ = stream.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_and_garbage_is_refused() {
        let header = TapHeader {
            sequence: 7,
            at: Duration::from_micros(1500),
            missed: 3,
            kind: TapKind::Out,
        };
        assert_eq!(TapHeader::decode(&header.encode()), Some(header));
        assert_eq!(TapHeader::decode(&[0; 24]), None);
        let mut bad = header.encode();
        bad[24] = 9;
        assert_eq!(TapHeader::decode(&bad), None);
    }
}
