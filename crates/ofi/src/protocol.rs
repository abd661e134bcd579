//! The side channel's messages and the tags of data operations.
//!
//! Connection management travels over a small zmq side channel (ROUTER on the binding end,
//! DEALER on the connecting end), as in FairMQ's OFI transport; payload bytes travel only over
//! libfabric. One message goes like this:
//!
//! 1. the sender's `send` takes a credit (at most `sndBufSize` messages in flight) and returns;
//!    the sender announces the message: [`Control::Announce`] with its part sizes;
//! 2. the receiver, when it has a free slot (at most `rcvBufSize` messages posted or queued, and
//!    a bounded number of bytes posted), allocates each part in its own memory (its shm segment,
//!    so that a relay forwards over shmem without a copy), posts tagged receives and answers
//!    [`Control::Grant`];
//! 3. the sender posts tagged sends straight from the message's memory; their completion frees
//!    the credit.
//!
//! Tags keep chunks apart whatever order they arrive in: `seq` (30 bits) | part (12 bits) |
//! chunk (20 bits). Heartbeats in both directions tell a dead peer from a quiet one.

use serde::{Deserialize, Serialize};

/// Version of this protocol; peers with another refuse each other by name.
pub(crate) const PROTOCOL_VERSION: u16 = 1;

/// At most this many parts in one message (12 tag bits).
pub(crate) const MAX_PARTS: usize = 1 << 12;

/// At most this many chunks in one part (20 tag bits).
pub(crate) const MAX_CHUNKS: usize = 1 << 20;

const SEQ_BITS: u32 = 30;

/// The tag of chunk 0 of `part` of message `seq`; chunk `i` adds `i`.
pub(crate) fn tag_base(seq: u64, part: usize) -> u64 {
    ((seq & ((1 << SEQ_BITS) - 1)) << 32) | ((part as u64) << 20)
}

/// A side-channel message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Control {
    /// Connector to binder: who I am and where my endpoint is.
    Hello {
        version: u16,
        socket_type: String,
        provider: String,
        address: Vec<u8>,
    },
    /// Binder to connector: accepted; where my endpoint is.
    Welcome { address: Vec<u8> },
    /// Either way: the connection cannot be (a second peer, a wrong socket type, ...).
    Refused { reason: String },
    /// Sender to receiver: messages `first_seq`, `first_seq + 1`, ... with these part sizes
    /// are ready (one frame for a burst).
    Announce {
        first_seq: u64,
        messages: Vec<Vec<u64>>,
    },
    /// Receiver to sender: buffers for these messages are posted, send them.
    Grant { seqs: Vec<u64> },
    /// Either way: still alive.
    Heartbeat,
    /// Either way: closing in order, every accepted message was delivered.
    Bye,
    /// The answer to [`Control::Bye`]: the closing side waits for it, because zmq.rs has no
    /// linger and would otherwise drop the goodbye with its socket.
    Farewell,
}

impl Control {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut frame = b"FMQOFI".to_vec();
        frame.extend(postcard::to_stdvec(self).expect("control messages always encode"));
        frame
    }

    /// Decodes a frame; `None` for anything that is not an ofi control frame (a peer of
    /// another transport), and for an announce no sender makes: more than [`MAX_PARTS`] parts
    /// in a message, a total size beyond u64, or seqs beyond u64 (the receiver sums the sizes
    /// and counts seqs from `first_seq`, which overflowed: a panic in debug builds).
    pub(crate) fn decode(frame: &[u8]) -> Option<Control> {
        let control = postcard::from_bytes(frame.strip_prefix(b"FMQOFI")?).ok()?;
        if let Control::Announce {
            first_seq,
            messages,
        } = &control
        {
            // `(first_seq..).zip(messages)` computes one seq past the last message.
            let n_messages = u64::try_from(messages.len()).ok()?;
            first_seq
                .checked_add(n_messages)
                .filter(|&end| end < u64::MAX)?;
            for sizes in messages {
                if sizes.len() > MAX_PARTS {
                    return None;
                }
                sizes
                    .iter()
                    .try_fold(0_u64, |total, &size| total.checked_add(size))?;
            }
        }
        Some(control)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_of_different_messages_parts_and_chunks_differ() {
        let a = tag_base(1, 0);
        let b = tag_base(1, 1);
        let c = tag_base(2, 0);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b | (MAX_CHUNKS as u64 - 1), c);
        assert_eq!(tag_base(1 << SEQ_BITS, 0), tag_base(0, 0), "seq wraps");
        assert!(tag_base(u64::MAX, MAX_PARTS - 1) < (1 << 62));
    }

    #[test]
    fn control_frames_round_trip_and_foreign_frames_are_refused() {
        for control in [
            Control::Hello {
                version: PROTOCOL_VERSION,
                socket_type: "push".into(),
                provider: "tcp;ofi_rxm".into(),
                address: vec![1, 2, 3],
            },
            Control::Announce {
                first_seq: 7,
                messages: vec![vec![0, 64, 1 << 26], vec![1]],
            },
            Control::Grant { seqs: vec![7, 8] },
            Control::Bye,
        ] {
            assert_eq!(Control::decode(&control.encode()), Some(control));
        }
        assert_eq!(Control::decode(b"FMQSHM01...."), None);
        assert_eq!(Control::decode(b""), None);
    }

    /// A peer's announce decides allocations and tags on the receiver: `(first_seq..).zip(..)`
    /// and the sum of the sizes overflowed (a panic in debug builds), more than MAX_PARTS parts
    /// collide with the next message's tags. Such frames are refused like a foreign peer's.
    #[test]
    fn forged_announces_are_refused() {
        let announce = |first_seq, messages| Control::Announce {
            first_seq,
            messages,
        };
        for forged in [
            announce(u64::MAX, vec![vec![1]]),
            announce(u64::MAX - 1, vec![vec![1]]),
            announce(u64::MAX - 2, vec![vec![1], vec![2]]),
            announce(0, vec![vec![u64::MAX, 1]]),
            announce(0, vec![vec![1; MAX_PARTS + 1]]),
        ] {
            assert_eq!(Control::decode(&forged.encode()), None, "{forged:?}");
        }
        for fine in [
            announce(u64::MAX - 2, vec![vec![1]]),
            announce(0, vec![vec![u64::MAX], vec![0; MAX_PARTS]]),
        ] {
            assert_eq!(Control::decode(&fine.encode()), Some(fine));
        }
    }
}
