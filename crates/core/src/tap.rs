//! Copies of what passes through a channel, for a recorder (`ferromq record`).
//!
//! Every [`Channel`](crate::Channel) has a [`TapSlot`]; it costs one relaxed atomic load per
//! message while nobody taps. A tap ([`TapSlot::open`]) gets a bounded queue: each message the
//! channel sends or receives is numbered, and copied into the queue when it has room (the
//! parts' bytes, so that the message itself moves on untouched, zero-copy as before). When the
//! queue is full the message is counted as missed instead: a recorder that cannot keep up never
//! slows the channel and never blocks it, and the gaps in the numbers say exactly what it
//! missed. A send that fails records nothing (the message may be sent again).
//!
//! Dropping the receiving end closes the tap: the next message notices and the slot goes back
//! to costing one load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::Parts;

/// Which way a tapped message went through its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received.
    In,
    /// Sent.
    Out,
}

/// One tapped message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tapped {
    /// Its number among the messages since the tap opened, from 0 (gaps: missed ones).
    pub sequence: u64,
    /// When it passed, since the tap opened.
    pub at: Duration,
    /// Which way.
    pub direction: Direction,
    /// Its parts, copied.
    pub parts: Vec<Bytes>,
}

/// The open tap of a slot.
#[derive(Debug)]
struct OpenTap {
    queue: mpsc::Sender<Tapped>,
    next: AtomicU64,
    missed: Arc<AtomicU64>,
    opened: Instant,
}

/// Where a channel offers copies of its messages to a tap, if one is open.
#[derive(Debug, Default)]
pub struct TapSlot {
    active: AtomicBool,
    open: Mutex<Option<Arc<OpenTap>>>,
}

/// What [`TapSlot::open`] gives: the copies, and how many messages did not fit.
#[derive(Debug)]
pub struct TapReceiver {
    /// The copies, in order.
    pub copies: mpsc::Receiver<Tapped>,
    /// Messages numbered but not copied (the queue was full).
    pub missed: Arc<AtomicU64>,
}

impl TapSlot {
    /// Opens a tap with room for `capacity` copies (at least 1), replacing one already open
    /// (whose receiver then ends).
    pub fn open(&self, capacity: usize) -> TapReceiver {
        let (queue, copies) = mpsc::channel(capacity.max(1));
        let missed = Arc::new(AtomicU64::new(0));
        let tap = OpenTap {
            queue,
            next: AtomicU64::new(0),
            missed: Arc::clone(&missed),
            opened: Instant::now(),
        };
        *self.open.lock().expect("tap slot poisoned") = Some(Arc::new(tap));
        self.active.store(true, Ordering::Release);
        TapReceiver { copies, missed }
    }

    /// Closes the tap, if one is open.
    pub fn close(&self) {
        self.active.store(false, Ordering::Release);
        self.open.lock().expect("tap slot poisoned").take();
    }

    /// Whether a tap is open (it may have closed on its receiver's side since).
    pub fn is_open(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The open tap, for one message: `None` (one atomic load) while nobody taps.
    fn current(&self) -> Option<Arc<OpenTap>> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        self.open.lock().expect("tap slot poisoned").clone()
    }

    /// Offers a copy of `parts`, which went `direction`.
    pub(crate) fn offer(&self, direction: Direction, parts: &Parts) {
        if let Some(prepared) = self.prepare(parts) {
            prepared.commit(direction);
        }
    }

    /// Copies `parts` if a tap is open and has room, before they go: [`PreparedCopy::commit`]
    /// once they went, or drop it (nothing is recorded). `None` while nobody taps.
    pub(crate) fn prepare(&self, parts: &Parts) -> Option<PreparedCopy> {
        let tap = self.current()?;
        let copy = match tap.queue.clone().try_reserve_owned() {
            Ok(permit) => Some((
                permit,
                parts
                    .iter()
                    .map(|part| Bytes::copy_from_slice(part.data()))
                    .collect(),
            )),
            Err(mpsc::error::TrySendError::Full(_)) => None,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.close();
                return None;
            }
        };
        Some(PreparedCopy { tap, copy })
    }
}

/// A message's copy (or, the queue being full, its place) waiting for the message to go.
pub(crate) struct PreparedCopy {
    tap: Arc<OpenTap>,
    copy: Option<(mpsc::OwnedPermit<Tapped>, Vec<Bytes>)>,
}

impl PreparedCopy {
    /// The message went `direction`: it is numbered, and its copy queued or counted missed.
    pub(crate) fn commit(self, direction: Direction) {
        let sequence = self.tap.next.fetch_add(1, Ordering::Relaxed);
        match self.copy {
            Some((permit, parts)) => {
                permit.send(Tapped {
                    sequence,
                    at: self.tap.opened.elapsed(),
                    direction,
                    parts,
                });
            }
            None => {
                self.tap.missed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    fn parts(text: &str) -> Parts {
        let mut parts = Parts::new();
        parts.push(Message::from(text.as_bytes().to_vec()));
        parts.push(Message::from(b"second".to_vec()));
        parts
    }

    #[test]
    fn copies_are_numbered_and_a_full_queue_counts_misses() {
        let slot = TapSlot::default();
        slot.offer(Direction::Out, &parts("before")); // nobody taps: nothing
        let mut tap = slot.open(2);
        for text in ["a", "b", "c", "d"] {
            slot.offer(Direction::Out, &parts(text));
        }
        let first = tap.copies.try_recv().unwrap();
        let second = tap.copies.try_recv().unwrap();
        assert_eq!((first.sequence, second.sequence), (0, 1));
        assert_eq!(first.parts, [Bytes::from("a"), Bytes::from("second")]);
        assert_eq!(tap.missed.load(Ordering::Relaxed), 2);
        slot.offer(Direction::In, &parts("e"));
        let third = tap.copies.try_recv().unwrap();
        assert_eq!((third.sequence, third.direction), (4, Direction::In));
    }

    #[test]
    fn a_dropped_receiver_closes_the_tap() {
        let slot = TapSlot::default();
        let tap = slot.open(4);
        assert!(slot.is_open());
        drop(tap);
        slot.offer(Direction::Out, &parts("x"));
        assert!(!slot.is_open());
    }
}
