//! Delivery counting: how a shmem sender knows what its receivers took, so that it can bound
//! what is in flight and never report a clean close while a message still waits somewhere.
//!
//! Every push and pair socket claims one counter slot in the header of its process's managed
//! segment ([`DELIVERY_COUNTERS`] per segment) and names it in each descriptor frame
//! ([`DeliveryRef`]). A receiver adds one to that counter each time it hands a message to its
//! device: not when the frame arrives, so a message still queued in a receiver that stops or
//! crashes counts as not delivered. The sender only reads the counter:
//!
//! - **Back-pressure**: `send` waits while `sndBufSize` messages are sent and not yet taken, so a
//!   stalled receiver stops the sender instead of filling shared memory.
//! - **Close**: the sender waits until every message it accepted was taken; `linger` bounds how
//!   long it waits *without progress*. What is left then was handed over if its descriptor was
//!   written to receivers that are all still there (a stopped receiver is): it waits in their
//!   sockets and the session's memory outlives the sender. Otherwise it is reported as
//!   [`Error::Undelivered`](ferromq_core::Error::Undelivered) (the socket decides, see
//!   `socket.rs`). What was handed over is the receiver's to report: a receiver that closes
//!   without taking it returns `Undelivered` with its count (the sender marked its rings
//!   handed over, `ring.rs`), so a loss is reported once, by one side.
//!
//! The counters live in the segment header, never in a block, so that a receiver's late add (the
//! sender gave up and dropped its socket) can only touch a counter, never message memory. A slot
//! freed is claimed again only after every other free slot ([`DeliverySlots`]); it starts from
//! the counter's value at the claim, so only late adds of a former user (a receiver taking what
//! was handed over to it) can inflate what it sees as taken, and the later the reuse, the fewer
//! of those remain. A process that opens and closes sockets fast can still reuse a slot soon:
//! only a generation in every frame's reference would make this exact.
//!
//! # Cancellation and peer death
//! Waiting for room or for the close is cancel-safe: nothing is taken or sent while waiting.
//! A receiver that dies takes nothing more: the sender's wait ends after `linger` of silence
//! (close, which then reports what was not taken) or at the send timeout (send).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ShmError;
use crate::managed::OwnedSegment;
use crate::segment::{DELIVERY_COUNTERS, Segment};
use crate::wire::DeliveryRef;

/// The free counter slots of one process's segment, claimed oldest-freed first: a slot goes
/// back to the end of the line, so a new socket (a device's next INIT DEVICE) does not take
/// over the counter its predecessor's receivers may still add to for what was handed over to
/// them (which would make the new socket count those as its own messages taken).
pub(crate) struct DeliverySlots {
    free: Mutex<std::collections::VecDeque<u32>>,
}

impl Default for DeliverySlots {
    fn default() -> DeliverySlots {
        DeliverySlots {
            free: Mutex::new((0..DELIVERY_COUNTERS as u32).collect()),
        }
    }
}

/// A sending socket's counter: what it sent, and (read from shared memory) what was taken.
pub(crate) struct SentCounter {
    segment: Arc<Segment>,
    slots: Arc<DeliverySlots>,
    slot: u32,
    /// The counter's value when the slot was claimed.
    base: u64,
    n_sent: u64,
    /// What was taken when the counter was last read: `send` reads the shared counter only
    /// when this says the window may be full, so the receiver's cache line stays its own.
    known_taken: u64,
}

/// How long a full window is polled by yielding, without the receivers taking anything, before
/// the sender sleeps between looks: a receiver that keeps taking is followed closely (sleeping
/// a timer tick would leave it idle), a stalled one costs no CPU.
pub(crate) const SPIN_FOR: Duration = Duration::from_micros(200);
/// How often (in messages sent) a sender refreshes the send-queue figure.
const QUEUE_LOOK_EVERY: u64 = 256;
pub(crate) const POLL_PAUSE: Duration = Duration::from_millis(1);

/// How long a sender waits for room without progress before each of its looks gives way.
pub(crate) const GIVE_WAY_AFTER: Duration = Duration::from_micros(20);

/// Once a sender has waited [`GIVE_WAY_AFTER`] for room that did not come, lets a runnable
/// thread of this CPU run before it looks again (`sched_yield`; at once back when nothing else
/// here is runnable): the receiver it waits for may be that thread. A doorbell is a datagram,
/// and the kernel wakes its reader as if the writer were about to sleep (a "sync" wake-up): on
/// the writer's CPU when the machine is busy, not on an idle one; or the two share a CPU because
/// devices outnumber cores. A sender that spun through its runtime alone
/// (`tokio::task::yield_now`) kept its woken receiver off that CPU until the spin ended and it
/// slept a timer tick, the CPU idle meanwhile: a 64-byte device pair on one CPU made 0.40 M
/// msg/s, 1.32-1.35 M giving way (test: `tests/shm_processes.rs`,
/// `a_sender_and_its_receiver_on_one_cpu_take_turns_without_sleeping`).
///
/// Not before: a receiver on another CPU that keeps taking frees room within microseconds,
/// and a sender that gave way at once handed its CPU to whatever else ran there for a whole
/// time slice (a busy loop beside the sampler of a pair on two CPUs: 0.80-0.89x the rate; after
/// 20 or 50 µs, 0.93-1.07x; 20 gave the pair on one CPU a little more than 50).
/// A receiver spinning on empty rings never gives way: a receiver sharing its sender's CPU
/// holds it only for its 50 µs spin before it sleeps (unless busy-polled), and a system call
/// per look after 5 µs made the default rpc round trip slower (`call_return` p50 +15 %).
pub(crate) fn give_way(waited: Duration) {
    if waited >= GIVE_WAY_AFTER {
        std::thread::yield_now();
    }
}

impl SentCounter {
    /// Claims a slot of `owned`; `None` when all [`DELIVERY_COUNTERS`] are in use (the socket
    /// then sends without counting: no back-pressure beyond zeromq's, no drain on close).
    pub(crate) fn claim(owned: &OwnedSegment, slots: &Arc<DeliverySlots>) -> Option<SentCounter> {
        let slot = slots
            .free
            .lock()
            .expect("delivery slots poisoned")
            .pop_front()?;
        let segment = Arc::clone(owned.segment());
        let base = segment
            .delivery_counter(slot)
            .expect("claimed slots exist")
            .load(Ordering::Acquire);
        Some(SentCounter {
            segment,
            slots: Arc::clone(slots),
            slot,
            base,
            n_sent: 0,
            known_taken: 0,
        })
    }

    /// What a frame names so that its receiver counts here.
    pub(crate) fn reference(&self) -> DeliveryRef {
        DeliveryRef {
            segment: crate::wire::ObjectRef::of(self.segment.name()),
            slot: self.slot,
        }
    }

    fn n_taken(&self) -> u64 {
        self.segment
            .delivery_counter(self.slot)
            .expect("claimed slots exist")
            .load(Ordering::Acquire)
            .wrapping_sub(self.base)
    }

    /// Messages sent and not yet taken.
    pub(crate) fn in_flight(&self) -> u64 {
        self.n_sent.saturating_sub(self.n_taken())
    }

    /// Counts one more message accepted for sending; every [`QUEUE_LOOK_EVERY`] messages
    /// `figures.queued` is set to what is sent and not taken, so reading the receivers'
    /// counter stays rare.
    pub(crate) fn note_sent(&mut self, figures: &ferromq_core::SendFigures) {
        self.n_sent += 1;
        if self.n_sent.is_multiple_of(QUEUE_LOOK_EVERY) {
            self.known_taken = self.n_taken();
            figures.queued.store(
                self.n_sent.saturating_sub(self.known_taken),
                Ordering::Relaxed,
            );
        }
    }

    /// Waits until fewer than `capacity` messages are in flight (0: no bound); false when
    /// `deadline` came first.
    /// True when fewer than `capacity` messages are in flight (0: no bound), without waiting.
    pub(crate) fn has_room(&mut self, capacity: usize) -> bool {
        let capacity = capacity as u64;
        if capacity == 0 || self.n_sent.saturating_sub(self.known_taken) < capacity {
            return true;
        }
        self.known_taken = self.n_taken();
        self.n_sent.saturating_sub(self.known_taken) < capacity
    }

    /// Also gives up (false) as soon as `abandon` says so: the socket failed and nothing more
    /// will be taken.
    pub(crate) async fn wait_for_room(
        &mut self,
        capacity: usize,
        deadline: Option<Instant>,
        abandon: impl Fn() -> bool,
    ) -> bool {
        if self.has_room(capacity) {
            return true;
        }
        let capacity = capacity as u64;
        let mut progress_at = Instant::now();
        loop {
            let taken = self.n_taken();
            if taken != self.known_taken {
                self.known_taken = taken;
                progress_at = Instant::now();
            }
            if self.n_sent.saturating_sub(taken) < capacity {
                return true;
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) || abandon() {
                return false;
            }
            if now - progress_at < SPIN_FOR {
                give_way(now - progress_at);
                tokio::task::yield_now().await;
            } else {
                let pause = deadline.map_or(POLL_PAUSE, |deadline| {
                    POLL_PAUSE.min(deadline.saturating_duration_since(now))
                });
                tokio::time::sleep(pause).await;
            }
        }
    }

    /// Waits until every message sent was taken, giving up after `linger` in which nothing was
    /// taken; returns how many were not.
    pub(crate) async fn wait_until_taken(&self, linger: Duration) -> u64 {
        let mut left = self.in_flight();
        let mut progress_at = Instant::now();
        while left > 0 {
            if progress_at.elapsed() >= linger {
                break;
            }
            tokio::time::sleep(POLL_PAUSE.min(linger)).await;
            let now_left = self.in_flight();
            if now_left < left {
                progress_at = Instant::now();
            }
            left = now_left;
        }
        left
    }
}

impl Drop for SentCounter {
    fn drop(&mut self) {
        self.slots
            .free
            .lock()
            .expect("delivery slots poisoned")
            .push_back(self.slot);
    }
}

/// A receiver's handle on the counter a sender named.
pub(crate) struct TakenCounter {
    segment: Arc<Segment>,
    slot: u32,
}

impl TakenCounter {
    /// The counter `delivery` names in `segment` (the sender's).
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] for a slot past [`DELIVERY_COUNTERS`].
    pub(crate) fn new(segment: Arc<Segment>, delivery: DeliveryRef) -> Result<Self, ShmError> {
        if segment.delivery_counter(delivery.slot).is_none() {
            return Err(ShmError::BadDescriptor {
                reason: format!(
                    "delivery counter slot {} does not exist (at most {DELIVERY_COUNTERS})",
                    delivery.slot
                ),
            });
        }
        Ok(TakenCounter {
            segment,
            slot: delivery.slot,
        })
    }

    /// Counts one message handed to the device.
    pub(crate) fn count_taken(&self) {
        if let Some(counter) = self.segment.delivery_counter(self.slot) {
            counter.fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::TestObject;

    /// A socket that closes frees its slot; the next socket of the process takes another one,
    /// not the slot whose receivers may still add to it for what was handed over to them.
    #[test]
    fn a_freed_slot_is_claimed_after_every_other() {
        let object = TestObject::segment("delivery-slots");
        let owned = OwnedSegment::new(Segment::create(object.0.clone(), 1 << 20).unwrap());
        let slots = Arc::new(DeliverySlots::default());
        let first = SentCounter::claim(&owned, &slots).unwrap();
        let freed = first.slot;
        drop(first);
        let mut claimed = Vec::new();
        while let Some(counter) = SentCounter::claim(&owned, &slots) {
            claimed.push(counter);
        }
        assert_eq!(claimed.len(), DELIVERY_COUNTERS);
        assert_eq!(claimed.last().map(|counter| counter.slot), Some(freed));
    }
}
