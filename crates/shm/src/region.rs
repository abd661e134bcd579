//! Unmanaged regions: shared memory the user owns and fills; messages are sub-ranges of it.
//!
//! # Acknowledgements
//! When the last receiver drops a region message, the creator must hear of it. Each process that
//! releases region buffers claims one single-producer ring in the region's header and appends
//! `(offset, size, hint)` there; only the creator consumes. A single-producer ring needs no lock,
//! and a producer that dies mid-append leaves nothing half-visible (the entry is published by
//! the index store that follows it). The creator polls the rings every millisecond while idle
//! and immediately again while they hold entries, so acknowledgements are batched under load and
//! never held back when idle (FairMQ could wait up to 500 ms). A release never waits for the
//! creator: one that finds its ring full (the creator stopped or slow) is queued in the process
//! and moved into the ring, in order, by a short-lived thread of its own (see `AckProducer`).
//! That queue dies with the process, so a process that leaves (its transport's session
//! dropped) first waits for it to reach the ring: while the creator lives, at most
//! `ACK_FLUSH_LIMIT` (10 s, then it warns with the number lost). A creator that died gets
//! nothing; its region goes with the session.
//!
//! # Ownership
//! The region's bytes are the creator's; a range lent to a message in flight cannot be written
//! through the region until its acknowledgement returns ([`UnmanagedRegion::fill`] refuses).
//! The framework removes the region only when the creator drops it, after a last delivery of
//! the acknowledgements already queued.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferromq_core::Message;

use crate::error::ShmError;
use crate::managed::ShmBuffer;
use crate::protocol::AckRing;
use crate::segment::{HEADER_SIZE, ProcessId, Segment};

const N_RINGS: usize = 32;
const RING_LEN: usize = 1024;
/// Ring: owner pid (u64 slot), head, tail, then RING_LEN entries of three u64.
const RING_BYTES: usize = 8 * 3 + RING_LEN * 24;
/// Offset of the first data byte in a region object.
pub const REGION_DATA_START: usize = (HEADER_SIZE + N_RINGS * RING_BYTES).div_ceil(4096) * 4096;

/// One released region range, as the creator's callback receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionBlock {
    /// Offset in the region's data.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
    /// The hint given when the message was made.
    pub hint: u64,
}

/// Called once per released buffer.
pub type SingleCallback = Box<dyn Fn(RegionBlock) + Send + Sync>;
/// Called once per batch of released buffers.
pub type BulkCallback = Box<dyn Fn(&[RegionBlock]) + Send + Sync>;

/// How a region's creator hears of released buffers.
pub enum RegionCallback {
    /// Once per buffer.
    Single(SingleCallback),
    /// Once per batch of buffers.
    Bulk(BulkCallback),
}

fn ring_offset(ring_idx: usize) -> usize {
    HEADER_SIZE + ring_idx * RING_BYTES
}

/// Appends acknowledgements to this process's ring of a region.
///
/// A release never waits: acknowledgements usually come from a message dropped on an async
/// worker, and the creator may be stopped (SIGSTOP) or busy with its ring full. One that finds
/// the ring full joins a queue in this process, which a thread of the producer's own moves into
/// the ring, oldest first, as the creator makes room; it ends when the queue is empty, or drops
/// the queue (with a warning) when the creator died, since nobody will read the ring again.
pub(crate) struct AckProducer {
    segment: Arc<Segment>,
    ring_idx: Mutex<Option<usize>>,
    overflow: Mutex<Overflow>,
}

/// Acknowledgements waiting for room in the ring, in release order.
#[derive(Default)]
struct Overflow {
    queued: std::collections::VecDeque<RegionBlock>,
    /// A thread is moving `queued` into the ring.
    draining: bool,
}

/// What became of one acknowledgement offered to the ring.
enum Offered {
    Written,
    Full,
    /// No ring could be claimed: the region is shared by more processes than it has rings.
    Lost,
}

impl AckProducer {
    pub(crate) fn new(segment: Arc<Segment>) -> AckProducer {
        AckProducer {
            segment,
            ring_idx: Mutex::new(None),
            overflow: Mutex::default(),
        }
    }

    fn claim(&self, claimed: &mut Option<usize>) -> Option<usize> {
        if let Some(ring_idx) = *claimed {
            return Some(ring_idx);
        }
        let me = u64::from(std::process::id());
        for ring_idx in 0..N_RINGS {
            let owner = self.segment.atomic_u64(ring_offset(ring_idx))?;
            let head = self.segment.atomic_u64(ring_offset(ring_idx) + 8)?;
            let tail = self.segment.atomic_u64(ring_offset(ring_idx) + 16)?;
            let current = owner.load(Ordering::Acquire);
            // A ring is free when unowned, or owned by a dead process and fully drained.
            let reusable = current == 0
                || (!(ProcessId {
                    pid: current as u32,
                    start_time: 0,
                })
                .is_alive()
                    && head.load(Ordering::Acquire) == tail.load(Ordering::Acquire));
            if reusable
                && owner
                    .compare_exchange(current, me, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                *claimed = Some(ring_idx);
                return Some(ring_idx);
            }
        }
        None
    }

    /// Queues one acknowledgement for the creator; never waits.
    ///
    /// The ring has one producer slot per process; threads of this process take turns (the
    /// locks), or two releases at once would write the same slot and one would be lost.
    pub(crate) fn push(self: &Arc<Self>, block: RegionBlock) {
        let mut overflow = self
            .overflow
            .lock()
            .expect("acknowledgement queue poisoned");
        // Behind earlier ones still queued: the creator hears of releases in order.
        if overflow.queued.is_empty() {
            match self.offer(block) {
                Offered::Written => return,
                Offered::Lost => {
                    tracing::error!(region = %self.segment.name(), "no free acknowledgement ring: a region buffer release is lost");
                    return;
                }
                Offered::Full => {}
            }
        }
        overflow.queued.push_back(block);
        if !overflow.draining {
            let producer = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("ferromq-region-ack".to_owned())
                .spawn(move || producer.drain_overflow());
            match spawned {
                Ok(_) => overflow.draining = true,
                // The next release tries again; until then the queue waits.
                Err(error) => {
                    tracing::warn!(%error, "cannot start the thread that queues region acknowledgements");
                }
            }
        }
    }

    /// Writes `block` into this process's ring if it has room.
    fn offer(&self, block: RegionBlock) -> Offered {
        let mut claimed = self.ring_idx.lock().expect("ring claim poisoned");
        let Some(ring_idx) = self.claim(&mut claimed) else {
            return Offered::Lost;
        };
        let Some(ring) = ack_ring(&self.segment, ring_idx) else {
            return Offered::Lost;
        };
        if ring.offer([block.offset, block.size, block.hint]) {
            Offered::Written
        } else {
            Offered::Full
        }
    }

    /// Moves queued acknowledgements into the ring, oldest first, while it has room; whether
    /// one moved.
    fn move_queued(&self, overflow: &mut Overflow) -> bool {
        let mut moved = false;
        while let Some(&block) = overflow.queued.front() {
            match self.offer(block) {
                Offered::Written => moved = true,
                Offered::Full => break,
                Offered::Lost => {}
            }
            overflow.queued.pop_front();
        }
        moved
    }

    /// The region's object name, for messages.
    pub(crate) fn region_name(&self) -> String {
        self.segment.name().to_string()
    }

    fn creator(&self) -> ProcessId {
        ProcessId {
            pid: self.segment.name().creator_pid,
            start_time: 0,
        }
    }

    /// Waits until every acknowledgement queued for want of room is in the ring, the creator
    /// is gone, or `deadline` has passed; how many are still queued. A process that leaves calls
    /// it (`Session`'s drop): the queue lives in this process, and an exit would lose it while
    /// the creator still waits for those ranges. Moves them itself where no thread does.
    pub(crate) fn flush(&self, deadline: std::time::Instant) -> usize {
        self.until_settled(|overflow| {
            let moved = !overflow.draining && self.move_queued(overflow);
            if overflow.queued.is_empty()
                || std::time::Instant::now() >= deadline
                || !self.creator().is_alive()
            {
                return ControlFlow::Break(overflow.queued.len());
            }
            ControlFlow::Continue(moved)
        })
    }

    /// The overflow thread: moves queued acknowledgements into the ring as room appears.
    fn drain_overflow(self: Arc<Self>) {
        let creator = self.creator();
        self.until_settled(|overflow| {
            let moved = self.move_queued(overflow);
            if !overflow.queued.is_empty() && !creator.is_alive() {
                tracing::warn!(region = %self.segment.name(), n_acknowledgements = overflow.queued.len(), "the region's creator is gone: its queued acknowledgements are dropped");
                overflow.queued.clear();
            }
            if overflow.queued.is_empty() {
                overflow.draining = false;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(moved)
        });
    }

    /// Looks at the queue, under its lock, until `look` ends the wait (`Break`); `look` says
    /// whether it moved something (`Continue(moved)`). Between looks it pauses from 50 µs,
    /// doubling up to 10 ms while the ring stays full, back to 50 µs after a look that moved.
    fn until_settled<R>(&self, mut look: impl FnMut(&mut Overflow) -> ControlFlow<R, bool>) -> R {
        let mut pause = Duration::from_micros(50);
        loop {
            let moved = {
                let mut overflow = self
                    .overflow
                    .lock()
                    .expect("acknowledgement queue poisoned");
                match look(&mut overflow) {
                    ControlFlow::Break(settled) => return settled,
                    ControlFlow::Continue(moved) => moved,
                }
            };
            if moved {
                pause = Duration::from_micros(50);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

/// Ring `ring_idx` of a region, `None` when the region is too small to hold it.
fn ack_ring<'a>(
    segment: &'a Segment,
    ring_idx: usize,
) -> Option<AckRing<'a, AtomicU64, impl Fn(u64, usize) -> Option<&'a AtomicU64>>> {
    let base = ring_offset(ring_idx);
    Some(AckRing {
        head: segment.atomic_u64(base + 8)?,
        tail: segment.atomic_u64(base + 16)?,
        len: RING_LEN as u64,
        entry: move |position: u64, field: usize| {
            segment.atomic_u64(base + 24 + (position as usize % RING_LEN) * 24 + field * 8)
        },
    })
}

/// Takes every queued acknowledgement out of the region's rings.
fn drain(segment: &Segment, into: &mut Vec<RegionBlock>) {
    for ring_idx in 0..N_RINGS {
        let Some(ring) = ack_ring(segment, ring_idx) else {
            continue;
        };
        ring.drain(|[offset, size, hint]| into.push(RegionBlock { offset, size, hint }));
    }
}

/// The ranges of a region lent to messages and not released: offset -> size.
pub(crate) type LentRanges = Mutex<BTreeMap<u64, u64>>;

/// A region of shared memory owned by its creator.
pub struct UnmanagedRegion {
    segment: Arc<Segment>,
    index: u32,
    data_size: usize,
    lent: Arc<Mutex<BTreeMap<u64, u64>>>,
    acknowledge: Acknowledge,
    stop: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl UnmanagedRegion {
    pub(crate) fn create(
        segment: Segment,
        index: u32,
        callback: RegionCallback,
    ) -> UnmanagedRegion {
        let segment = Arc::new(segment);
        let data_size = segment.len() - REGION_DATA_START;
        let lent: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
        let producer = Arc::new(AckProducer::new(Arc::clone(&segment)));
        let acknowledge: Acknowledge =
            Arc::new(move |offset, size, hint| producer.push(RegionBlock { offset, size, hint }));
        let stop = Arc::new(AtomicBool::new(false));
        // A plain thread: polling must not depend on the device's runtime being driven.
        let poller = {
            let (segment, lent, stop) =
                (Arc::clone(&segment), Arc::clone(&lent), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("ferromq-region-{index}"))
                .spawn(move || poll_acknowledgements(&segment, &lent, &stop, &callback))
                .ok()
        };
        UnmanagedRegion {
            segment,
            index,
            data_size,
            lent,
            acknowledge,
            stop,
            poller,
        }
    }

    /// Usable bytes.
    pub fn size(&self) -> usize {
        self.data_size
    }

    /// The ranges lent to messages and not released, for the transport's figures.
    pub(crate) fn lent_ranges(&self) -> std::sync::Weak<LentRanges> {
        Arc::downgrade(&self.lent)
    }

    /// The object name (what `ferromq shm list` shows).
    pub fn name(&self) -> String {
        self.segment.name().to_string()
    }

    /// The region's index among this process's regions.
    pub fn index(&self) -> u32 {
        self.index
    }

    fn check(&self, offset: usize, size: usize) -> Result<(), ShmError> {
        if offset
            .checked_add(size)
            .is_none_or(|end| end > self.data_size)
        {
            return Err(ShmError::BadDescriptor {
                reason: format!(
                    "{}: range {offset}+{size} is outside the region's {} bytes",
                    self.name(),
                    self.data_size
                ),
            });
        }
        Ok(())
    }

    /// Writes into `offset..offset + bytes.len()` through `fill`.
    ///
    /// # Errors
    /// As [`UnmanagedRegion::fill`].
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<(), ShmError> {
        self.fill(offset, bytes.len(), |range| range.copy_from_slice(bytes))
    }

    /// Lets `fill` write `offset..offset + size` (e.g. a detector readout).
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] when the range is outside the region or overlaps a range lent
    /// to a message that has not been acknowledged yet.
    pub fn fill(
        &self,
        offset: usize,
        size: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), ShmError> {
        self.check(offset, size)?;
        let lent = self.lent.lock().expect("lent ranges poisoned");
        let overlapping = lent
            .range(..(offset + size) as u64)
            .next_back()
            .is_some_and(|(&start, &len)| start + len > offset as u64);
        if overlapping {
            return Err(ShmError::BadDescriptor {
                reason: format!(
                    "{}: range {offset}+{size} is lent to a message in flight",
                    self.name()
                ),
            });
        }
        // SAFETY: only the creator writes region bytes, and only outside lent ranges (checked
        // above while holding the lock that `message` takes to lend a range); receivers read
        // lent ranges only.
        let bytes = unsafe { self.segment.bytes_mut(REGION_DATA_START + offset, size) }
            .expect("range checked above");
        fill(bytes);
        Ok(())
    }

    /// A message over `offset..offset + size`, without copying. `hint` comes back in the
    /// callback when the buffer is released.
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] when the range is outside the region or already lent.
    pub fn message(&self, offset: usize, size: usize, hint: u64) -> Result<Message, ShmError> {
        self.check(offset, size)?;
        let mut lent = self.lent.lock().expect("lent ranges poisoned");
        let overlapping = lent
            .range(..(offset + size).max(offset + 1) as u64)
            .next_back()
            .is_some_and(|(&start, &len)| start + len.max(1) > offset as u64);
        if overlapping {
            return Err(ShmError::BadDescriptor {
                reason: format!("{}: range {offset}+{size} is already lent", self.name()),
            });
        }
        lent.insert(offset as u64, size as u64);
        let buffer = ShmBuffer::new_region(
            Arc::clone(&self.segment),
            REGION_DATA_START + offset,
            size,
            Arc::clone(&self.acknowledge),
            hint,
        );
        Ok(Message::from_buffer(buffer.boxed()))
    }

    /// Ranges lent and not yet acknowledged.
    pub fn n_lent(&self) -> usize {
        self.lent.lock().expect("lent ranges poisoned").len()
    }
}

fn poll_acknowledgements(
    segment: &Segment,
    lent: &Mutex<BTreeMap<u64, u64>>,
    stop: &AtomicBool,
    callback: &RegionCallback,
) {
    let mut batch = Vec::new();
    loop {
        let stopping = stop.load(Ordering::Acquire);
        drain(segment, &mut batch);
        if !batch.is_empty() {
            {
                let mut lent = lent.lock().expect("lent ranges poisoned");
                for block in &batch {
                    lent.remove(&block.offset);
                }
            }
            match callback {
                RegionCallback::Single(single) => batch.iter().for_each(|block| single(*block)),
                RegionCallback::Bulk(bulk) => bulk(&batch),
            }
            batch.clear();
            continue;
        }
        if stopping {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Drop for UnmanagedRegion {
    fn drop(&mut self) {
        // The poller delivers what is already acknowledged, then stops; then the region goes.
        self.stop.store(true, Ordering::Release);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        if let Err(error) = Segment::remove(self.segment.name()) {
            tracing::warn!(%error, "removing a region failed");
        }
    }
}

/// What a region buffer's release calls: `(offset, size, hint)` back to the creator.
pub(crate) type Acknowledge = Arc<dyn Fn(u64, u64, u64) + Send + Sync>;

/// How long a process that leaves waits for the creators of the regions it released buffers of
/// to make room for the acknowledgements their rings could not take (see
/// [`AckProducer::flush`]).
pub(crate) const ACK_FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// The acknowledgement closure for a region opened from the wire, and the producer behind it
/// (flushed when the session is dropped).
pub(crate) fn remote_acknowledger(segment: Arc<Segment>) -> (Arc<AckProducer>, Acknowledge) {
    let producer = Arc::new(AckProducer::new(segment));
    let pushing = Arc::clone(&producer);
    let acknowledge: Acknowledge =
        Arc::new(move |offset, size, hint| pushing.push(RegionBlock { offset, size, hint }));
    (producer, acknowledge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{ObjectKind, ObjectName, current_uid};

    /// Issue 12 §3: a release whose ring is full (the creator is stopped, or slow) used to spin
    /// on the releasing thread, an async worker, until the creator made room. Now every release
    /// returns at once, and the creator still hears of every one, in order, once it reads.
    #[test]
    fn releases_to_a_full_ring_never_wait_and_arrive_in_order() {
        const N_RELEASES: u64 = RING_LEN as u64 * 3 + 7;
        let name = ObjectName::new(
            current_uid(),
            &format!("ack-test-{}", std::process::id()),
            ObjectKind::Region,
            std::process::id(),
            0,
        );
        let segment = Arc::new(Segment::create(name.clone(), REGION_DATA_START + 4096).unwrap());
        let producer = Arc::new(AckProducer::new(Arc::clone(&segment)));
        // Nobody reads the ring while this thread releases: all but RING_LEN must queue.
        let (done, released) = std::sync::mpsc::channel();
        let releaser = {
            let producer = Arc::clone(&producer);
            std::thread::spawn(move || {
                for offset in 0..N_RELEASES {
                    producer.push(RegionBlock {
                        offset,
                        size: 1,
                        hint: offset * 2,
                    });
                }
                let _ = done.send(());
            })
        };
        let waited = released.recv_timeout(Duration::from_secs(20));
        // The creator reads now, until it has them all.
        let mut heard = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while (heard.len() as u64) < N_RELEASES && std::time::Instant::now() < deadline {
            drain(&segment, &mut heard);
            std::thread::yield_now();
        }
        releaser.join().unwrap();
        let _ = Segment::remove(&name);
        assert!(waited.is_ok(), "releases waited for the creator to read");
        let offsets: Vec<u64> = heard.iter().map(|block| block.offset).collect();
        assert_eq!(offsets, (0..N_RELEASES).collect::<Vec<_>>());
        assert!(heard.iter().all(|block| block.hint == block.offset * 2));
    }
}
