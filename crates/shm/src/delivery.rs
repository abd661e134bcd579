//! Delivery counting: how a shmem sender knows what its receivers took, so that it can bound
//! what is in flight and never report a clean close while a message still waits somewhere.
//!
//! Every push and pair socket claims one counter slot in the header of its process's managed
//! segment ([`DELIVERY_COUNTERS`] per segment) and names it in each descriptor frame
//! ([`DeliveryRef`]). A receiver adds one to that counter each time it hands a message to its
//! device: not when the frame arrives, so a message still queued in a receiver that stops or
//! crashes counts as not delivered. The sender writes the counter only when it claims the slot
//! (below) and reads it after that:
//!
//! - **Back-pressure**: `send` waits while `sndBufSize` messages are sent and not yet taken, so a
//!   stalled receiver stops the sender instead of filling shared memory. What the ring of a
//!   receiver that died, or that finished with it first, held is not waited for: no receiver
//!   will take it (the socket counts it, `socket.rs`'s `ConnectionRing::finish_gone`, and it
//!   is still reported lost at the close). A send that waits for room looks for such rings
//!   once the receivers stopped taking, a send that does not wait (`try_send_parts`) at every
//!   [`ASK_LOST_EVERY`]th refusal for a full window.
//! - **Close**: the sender waits until every message it accepted was taken; `linger` bounds how
//!   long it waits *without progress*. What is left then was handed over if its descriptor was
//!   written to receivers that are all still there (a stopped receiver is): it waits in their
//!   sockets and the session's memory outlives the sender. With a receiver gone, what is in
//!   the rings of those still there is handed over ring by ring. Only the rest is reported as
//!   [`Error::Undelivered`](ferromq_core::Error::Undelivered) (the socket decides, see
//!   `socket.rs`). What was handed over is the receiver's to report: a receiver that closes
//!   without taking it returns `Undelivered` with its count (the sender marked its rings
//!   handed over, `ring.rs`), so a loss is reported once, by one side.
//!
//! The counters live in the segment header, never in a block, so that a receiver's late add (the
//! sender gave up and dropped its socket) can only touch a counter, never message memory. A
//! counter word holds the slot's generation in its top 16 bits and the count in the other 48;
//! every claim of a slot starts a new generation (count 0), and every reference names the
//! generation it was made for ([`DeliveryRef::generation`]). A receiver adds only while the word
//! still holds its reference's generation (a compare-exchange), so a late add of a former user
//! (a receiver taking, after its sender closed, what was handed over to it) never counts for
//! the socket that claimed the slot since, however soon. Generations wrap after 65 535 claims
//! of one slot (0 marks a slot never claimed), and a freed slot is claimed again only after
//! every other free one ([`DeliverySlots`]): a former user's receiver would have to hold its
//! reference through 14 million claims of the process's counters for its add to count again. A count wraps after
//! 2^48 messages of one socket; what is in flight is computed modulo that, so only 2^48
//! messages in flight at once could be miscounted.
//!
//! # Cancellation and peer death
//! Waiting for room or for the close is cancel-safe: nothing is taken or sent while waiting.
//! A receiver that dies takes nothing more: once its connection's ring is dropped (the wait
//! looks, and so does a send that does not wait, at every [`ASK_LOST_EVERY`]th refusal), what
//! it held leaves the window and the close's wait; otherwise the sender's wait ends after
//! `linger` of silence (close, which then reports what was not taken) or at the send timeout
//! (send).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ShmError;
use crate::managed::OwnedSegment;
use crate::segment::{DELIVERY_COUNTERS, Segment};
use crate::wire::DeliveryRef;

/// The count's bits of a counter word; the generation is above them.
const COUNT_MASK: u64 = (1 << 48) - 1;
const GENERATION_SHIFT: u32 = 48;

/// The free counter slots of one process's segment, claimed oldest-freed first: a slot goes
/// back to the end of the line, so a new socket (a device's next INIT DEVICE) does not take
/// over the counter its predecessor's receivers may still add to for what was handed over to
/// them (which would make the new socket count those as its own messages taken).
/// A slot goes with the generation of its last claim (0: never claimed; a zeroed counter word
/// is no claim's).
pub(crate) struct DeliverySlots {
    free: Mutex<std::collections::VecDeque<(u16, u16)>>,
}

impl Default for DeliverySlots {
    fn default() -> DeliverySlots {
        const _: () = assert!(DELIVERY_COUNTERS < u16::MAX as usize);
        DeliverySlots {
            free: Mutex::new(
                (0..DELIVERY_COUNTERS as u16)
                    .map(|slot| (slot, 0))
                    .collect(),
            ),
        }
    }
}

/// A sending socket's counter: what it sent, and (read from shared memory) what was taken.
pub(crate) struct SentCounter {
    segment: Arc<Segment>,
    slots: Arc<DeliverySlots>,
    slot: u16,
    generation: u16,
    n_sent: u64,
    /// What was taken when the counter was last read: `send` reads the shared counter only
    /// when this says the window may be full, so the receiver's cache line stays its own.
    known_taken: u64,
    /// Messages sent that no receiver will ever take, as the socket last counted them: what
    /// the rings of receivers that died or left held (their memory is released). Outside the
    /// window, or a receiver killed with the window full would stop every later send; still
    /// in flight for the close, which reports them lost.
    known_lost: u64,
    /// Sends that did not wait refused for a full window ([`SentCounter::has_room_now`]).
    n_tries_refused: u64,
}

/// How long a full window is polled by yielding, without the receivers taking anything, before
/// the sender sleeps between looks: a receiver that keeps taking is followed closely (sleeping
/// a timer tick would leave it idle), a stalled one costs no CPU.
pub(crate) const SPIN_FOR: Duration = Duration::from_micros(200);
/// How often (in refusals for a full window) a send that does not wait asks what the rings of
/// gone receivers held.
const ASK_LOST_EVERY: u64 = 64;
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
        let (slot, last_generation) = slots
            .free
            .lock()
            .expect("delivery slots poisoned")
            .pop_front()?;
        let generation = match last_generation.wrapping_add(1) {
            0 => 1,
            generation => generation,
        };
        let segment = Arc::clone(owned.segment());
        // From here on, only adds made for this generation count.
        segment
            .delivery_counter(u32::from(slot))
            .expect("claimed slots exist")
            .store(u64::from(generation) << GENERATION_SHIFT, Ordering::Release);
        Some(SentCounter {
            segment,
            slots: Arc::clone(slots),
            slot,
            generation,
            n_sent: 0,
            known_taken: 0,
            known_lost: 0,
            n_tries_refused: 0,
        })
    }

    /// What a frame names so that its receiver counts here.
    pub(crate) fn reference(&self) -> DeliveryRef {
        DeliveryRef {
            segment: crate::wire::ObjectRef::of(self.segment.name()),
            slot: self.slot,
            generation: self.generation,
        }
    }

    /// What the receivers took, modulo 2^48.
    fn n_taken(&self) -> u64 {
        taken_at(&self.segment, self.slot)
    }

    fn untaken(&self, taken: u64) -> u64 {
        untaken(self.n_sent, taken)
    }

    /// What the window holds when `taken` were taken: those not taken that a receiver may
    /// still take.
    fn in_window(&self, taken: u64) -> u64 {
        self.untaken(taken).saturating_sub(self.known_lost)
    }

    /// Messages sent and not yet taken.
    pub(crate) fn in_flight(&self) -> u64 {
        self.untaken(self.n_taken())
    }

    /// [`SentCounter::in_flight`] for a reader apart from the socket, as of what was sent so
    /// far: a closing socket, which sends nothing more, lends it to the task that finishes its
    /// rings.
    pub(crate) fn in_flight_view(&self) -> InFlightView {
        InFlightView {
            segment: Arc::clone(&self.segment),
            slot: self.slot,
            n_sent: self.n_sent,
        }
    }

    /// Counts one more message accepted for sending; every [`QUEUE_LOOK_EVERY`] messages
    /// `figures.queued` is set to what is sent and not taken, less what the rings of gone
    /// receivers held as last counted (no receiver will take those: not queued, lost), so
    /// reading the receivers' counter stays rare.
    pub(crate) fn note_sent(&mut self, figures: &ferromq_core::SendFigures) {
        self.n_sent += 1;
        if self.n_sent.is_multiple_of(QUEUE_LOOK_EVERY) {
            self.known_taken = self.n_taken();
            figures
                .queued
                .store(self.in_window(self.known_taken), Ordering::Relaxed);
        }
    }

    /// True when the window holds fewer than `capacity` messages (0: no bound), without
    /// waiting: those sent, not taken and not known lost (as last counted).
    pub(crate) fn has_room(&mut self, capacity: usize) -> bool {
        let capacity = capacity as u64;
        if capacity == 0 || self.in_window(self.known_taken) < capacity {
            return true;
        }
        self.known_taken = self.n_taken();
        self.in_window(self.known_taken) < capacity
    }

    /// [`SentCounter::has_room`] for a send that does not wait: a full window also asks
    /// `known_lost` (see [`SentCounter::wait_for_room`]) at every [`ASK_LOST_EVERY`]th refusal,
    /// so a sender that only ever tries is not shut out for good by a receiver that died
    /// holding the window full, and one that tries at a window a live receiver keeps full (a
    /// device's send tries first, then waits) neither looks at the rings nor reads the clock
    /// at every try.
    pub(crate) fn has_room_now(&mut self, capacity: usize, known_lost: impl Fn() -> u64) -> bool {
        if self.has_room(capacity) {
            return true;
        }
        self.n_tries_refused += 1;
        if !self.n_tries_refused.is_multiple_of(ASK_LOST_EVERY) {
            return false;
        }
        self.known_lost = known_lost();
        self.has_room(capacity)
    }

    /// Waits until the window holds fewer than `capacity` messages (0: no bound); false when
    /// `deadline` came first. Also gives up (false) as soon as `abandon` says so: the socket
    /// failed and nothing more will be taken. `known_lost` (how many sent messages no receiver
    /// will take, see `known_lost`) is asked at each look once the receivers' count stopped
    /// moving for [`SPIN_FOR`]: a receiver that died leaves room, and a wait that a live
    /// receiver ends soon (a sender at a full window, message after message) does not look
    /// at the rings.
    pub(crate) async fn wait_for_room(
        &mut self,
        capacity: usize,
        deadline: Option<Instant>,
        abandon: impl Fn() -> bool,
        known_lost: impl Fn() -> u64,
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
            if self.in_window(taken) < capacity {
                return true;
            }
            let now = Instant::now();
            if now - progress_at >= SPIN_FOR {
                self.known_lost = known_lost();
                if self.in_window(taken) < capacity {
                    return true;
                }
            }
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
    /// taken, or once only those no receiver will take are left (`known_lost`, asked at each
    /// look); returns how many were not taken, those included, and how many of them no receiver
    /// will take as `known_lost` said at the last look (not waited for).
    pub(crate) async fn wait_until_taken(
        &self,
        linger: Duration,
        known_lost: impl Fn() -> u64,
    ) -> (u64, u64) {
        let mut left = self.in_flight();
        let mut progress_at = Instant::now();
        let mut lost = known_lost();
        while left > lost {
            if progress_at.elapsed() >= linger {
                break;
            }
            tokio::time::sleep(POLL_PAUSE.min(linger)).await;
            let now_left = self.in_flight();
            if now_left < left {
                progress_at = Instant::now();
            }
            left = now_left;
            lost = known_lost();
        }
        (left, lost.min(left))
    }
}

/// What slot `slot` of `segment` counts taken, modulo 2^48.
fn taken_at(segment: &Segment, slot: u16) -> u64 {
    segment
        .delivery_counter(u32::from(slot))
        .expect("claimed slots exist")
        .load(Ordering::Acquire)
        & COUNT_MASK
}

/// Messages sent and not taken, when `n_sent` were sent and `taken` taken (both modulo 2^48).
/// More taken than sent (a forged or repeated frame naming this claim) reads as none in
/// flight, as a count that saturated would: never as 2^48 in flight, which would stop every
/// send.
fn untaken(n_sent: u64, taken: u64) -> u64 {
    let untaken = n_sent.wrapping_sub(taken) & COUNT_MASK;
    if untaken > COUNT_MASK / 2 { 0 } else { untaken }
}

/// A closing socket's [`SentCounter::in_flight`], read where the socket is not.
pub(crate) struct InFlightView {
    segment: Arc<Segment>,
    slot: u16,
    n_sent: u64,
}

impl InFlightView {
    /// Messages sent and not yet taken.
    pub(crate) fn get(&self) -> u64 {
        untaken(self.n_sent, taken_at(&self.segment, self.slot))
    }
}

impl Drop for SentCounter {
    fn drop(&mut self) {
        self.slots
            .free
            .lock()
            .expect("delivery slots poisoned")
            .push_back((self.slot, self.generation));
    }
}

/// A receiver's handle on the counter a sender named.
pub(crate) struct TakenCounter {
    segment: Arc<Segment>,
    slot: u16,
    generation: u16,
}

impl TakenCounter {
    /// The counter `delivery` names in `segment` (the sender's).
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] for a slot past [`DELIVERY_COUNTERS`].
    pub(crate) fn new(segment: Arc<Segment>, delivery: DeliveryRef) -> Result<Self, ShmError> {
        if segment.delivery_counter(u32::from(delivery.slot)).is_none() {
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
            generation: delivery.generation,
        })
    }

    /// Counts one message handed to the device, unless the slot was claimed again since the
    /// reference was made (its sender closed: the add is no longer anyone's).
    pub(crate) fn count_taken(&self) {
        let Some(counter) = self.segment.delivery_counter(u32::from(self.slot)) else {
            return;
        };
        let generation = u64::from(self.generation);
        let mut word = counter.load(Ordering::Relaxed);
        while word >> GENERATION_SHIFT == generation {
            let added = (word & !COUNT_MASK) | (word.wrapping_add(1) & COUNT_MASK);
            match counter.compare_exchange_weak(word, added, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::TestObject;

    /// A segment of its own (removed when the first value drops) and its counter slots.
    fn counters(tag: &str) -> (TestObject, OwnedSegment, Arc<DeliverySlots>) {
        let object = TestObject::segment(tag);
        let owned = OwnedSegment::new(Segment::create(object.0.clone(), 1 << 20).unwrap());
        (object, owned, Arc::new(DeliverySlots::default()))
    }

    /// A socket that closes frees its slot; the next socket of the process takes another one,
    /// not the slot whose receivers may still add to it for what was handed over to them.
    #[test]
    fn a_freed_slot_is_claimed_after_every_other() {
        let (_object, owned, slots) = counters("delivery-slots");
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

    /// A receiver that takes, late, what an earlier socket handed over to it adds nothing to
    /// the counter of the socket that claimed the slot since: that socket's messages are not
    /// its predecessor's, however soon the slot came back.
    #[test]
    fn a_late_take_of_a_former_user_of_a_slot_counts_nothing_for_its_new_user() {
        let (_object, owned, slots) = counters("delivery-generation");
        let mut first = SentCounter::claim(&owned, &slots).unwrap();
        let first_ref = first.reference();
        let first_receiver = TakenCounter::new(Arc::clone(owned.segment()), first_ref).unwrap();
        let figures = ferromq_core::SendFigures::default();
        first.note_sent(&figures);
        first.note_sent(&figures);
        first_receiver.count_taken();
        assert_eq!(first.in_flight(), 1);
        // The first socket closes with one message handed over and not yet taken; every other
        // slot is claimed, so the next claim is its slot.
        drop(first);
        let mut others = Vec::new();
        for _ in 1..DELIVERY_COUNTERS {
            others.push(SentCounter::claim(&owned, &slots).unwrap());
        }
        let mut second = SentCounter::claim(&owned, &slots).unwrap();
        assert_eq!(second.slot, first_ref.slot);
        assert_ne!(second.reference(), first_ref, "a reused slot is named anew");
        let second_receiver =
            TakenCounter::new(Arc::clone(owned.segment()), second.reference()).unwrap();
        second.note_sent(&figures);
        second.note_sent(&figures);
        // The first socket's receiver takes what was handed over to it.
        first_receiver.count_taken();
        assert_eq!(
            second.in_flight(),
            2,
            "the former user's take counted for the new one"
        );
        second_receiver.count_taken();
        assert_eq!(second.in_flight(), 1);
        second_receiver.count_taken();
        assert_eq!(second.in_flight(), 0);
    }

    /// The send-queue figure (`top`, the metrics) leaves out what the rings of gone receivers
    /// held: it said those were queued for as long as the socket lived.
    #[test]
    fn the_queue_figure_leaves_out_what_gone_receivers_held() {
        let (_object, owned, slots) = counters("delivery-queued");
        let mut sent = SentCounter::claim(&owned, &slots).unwrap();
        let receiver = TakenCounter::new(Arc::clone(owned.segment()), sent.reference()).unwrap();
        let figures = ferromq_core::SendFigures::default();
        for _ in 0..QUEUE_LOOK_EVERY / 2 {
            sent.note_sent(&figures);
        }
        receiver.count_taken();
        // A receiver died holding 100 of them (as its sender counted at a wait for room).
        sent.known_lost = 100;
        for _ in 0..QUEUE_LOOK_EVERY / 2 {
            sent.note_sent(&figures);
        }
        assert_eq!(
            figures.queued.load(Ordering::Relaxed),
            QUEUE_LOOK_EVERY - 1 - 100
        );
        assert_eq!(
            sent.in_flight(),
            QUEUE_LOOK_EVERY - 1,
            "still in flight for the close"
        );
    }

    /// A send that does not wait asks what gone receivers held at every [`ASK_LOST_EVERY`]th
    /// refusal for a full window, not at each (a device's send tries at every message), and is
    /// let through once that frees room.
    #[test]
    fn a_try_asks_what_gone_receivers_held_every_so_often() {
        let (_object, owned, slots) = counters("delivery-try-asks");
        let mut sent = SentCounter::claim(&owned, &slots).unwrap();
        let figures = ferromq_core::SendFigures::default();
        for _ in 0..5 {
            sent.note_sent(&figures);
        }
        let asked = std::cell::Cell::new(0);
        let known_lost = || {
            asked.set(asked.get() + 1);
            5
        };
        for _ in 1..ASK_LOST_EVERY {
            assert!(!sent.has_room_now(5, known_lost));
        }
        assert_eq!(
            asked.get(),
            0,
            "asked before the {ASK_LOST_EVERY}th refusal"
        );
        assert!(sent.has_room_now(5, known_lost));
        assert_eq!(asked.get(), 1);
        assert_eq!(sent.in_flight(), 5, "still in flight for the close");
    }

    /// A count that wraps past its 48 bits keeps its generation, and what is in flight stays
    /// right across the wrap.
    #[test]
    fn a_count_wraps_within_its_generation() {
        let (_object, owned, slots) = counters("delivery-wrap");
        let mut sent = SentCounter::claim(&owned, &slots).unwrap();
        let receiver = TakenCounter::new(Arc::clone(owned.segment()), sent.reference()).unwrap();
        let word = owned
            .segment()
            .delivery_counter(u32::from(sent.slot))
            .unwrap();
        let generation = u64::from(sent.generation) << GENERATION_SHIFT;
        // 2^48 - 1 messages sent and taken, then two more sent.
        word.store(generation | COUNT_MASK, Ordering::Release);
        sent.n_sent = COUNT_MASK + 2;
        assert_eq!(sent.in_flight(), 2);
        receiver.count_taken();
        assert_eq!(
            word.load(Ordering::Acquire),
            generation,
            "the count wrapped to 0"
        );
        assert_eq!(sent.in_flight(), 1);
        receiver.count_taken();
        assert_eq!(sent.in_flight(), 0);
        // One add too many (a forged or repeated frame) is not 2^48 messages in flight.
        receiver.count_taken();
        assert_eq!(sent.in_flight(), 0);
        assert!(sent.has_room(1));
    }
}
