//! The atomic steps of the two protocols that processes run over shared memory, written once
//! over small atomic traits so that the same code runs on `std` atomics in a mapped segment and,
//! in this module's tests, on [loom]'s, which runs each scenario under every interleaving and
//! every outcome the C++ memory model allows.
//!
//! - **Block references** ([`BlockCells`]; a holder's steps on the count alone, [`BlockRefs`]):
//!   the owner publishes a new block (one reference, its capacity, then the magic that makes it
//!   adoptable), a publisher adds references for more subscribers, receivers check a
//!   descriptor's block is live and release their reference, and the owner reclaims the block
//!   once the count is zero, retiring the magic before the range is reused. The model checks
//!   that a block is written again only after every receiver's reads of it happened (no data
//!   race on the bytes), and that a descriptor replayed after the last release never finds a
//!   live block.
//! - **The ends of a descriptor ring** ([`RingFinish`]): the producer and the consumer each
//!   mark themselves done; the model checks that exactly one of them is the last, and that it
//!   reads the other's last entry without a data race.
//! - **Entry headers of a descriptor ring** ([`EntryHeaders`]): the producer clears the header
//!   slot after an entry, then commits the entry by its header; a consumer that finds a header
//!   reads the entry. The model checks, across a wrap-around, that a consumer never reads an
//!   entry's bytes before they are whole, nor a stale header, nor one the producer cleared. It
//!   has no skip (a skip's header is committed, without clearing, after the entry it skips
//!   to: the same release store); `ring.rs`'s property tests wrap with skips.
//! - **Acknowledgement rings** ([`AckRing`]): one producer per ring appends `(offset, size,
//!   hint)` entries, the region's creator drains them. The model checks that the creator reads
//!   exactly what was appended, in order, across a wrap-around of a short ring.
//!
//! What the models cover is these steps and their memory orderings. How a descriptor travels
//! (a zeromq frame: a system call on each side, which orders everything before it) is modelled
//! as one release store and one acquire load. The allocator's bookkeeping is process-local
//! (behind a mutex) and is tested by its own property tests; miri is not available on this
//! project's machines (no toolchain component can be installed), so nothing runs under it.
//!
//! [loom]: https://docs.rs/loom

use std::sync::atomic::Ordering;

/// The 32-bit atomic operations the protocols use.
pub(crate) trait Atomic32 {
    fn load(&self, order: Ordering) -> u32;
    fn store(&self, value: u32, order: Ordering);
    fn fetch_add(&self, value: u32, order: Ordering) -> u32;
    fn fetch_sub(&self, value: u32, order: Ordering) -> u32;
    fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32>;
}

/// The 64-bit atomic operations the protocols use.
pub(crate) trait Atomic64 {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
}

macro_rules! atomic_impls {
    ($u32:ty, $u64:ty) => {
        impl Atomic32 for $u32 {
            fn load(&self, order: Ordering) -> u32 {
                <$u32>::load(self, order)
            }
            fn store(&self, value: u32, order: Ordering) {
                <$u32>::store(self, value, order);
            }
            fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
                <$u32>::fetch_add(self, value, order)
            }
            fn fetch_sub(&self, value: u32, order: Ordering) -> u32 {
                <$u32>::fetch_sub(self, value, order)
            }
            fn compare_exchange(
                &self,
                current: u32,
                new: u32,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u32, u32> {
                <$u32>::compare_exchange(self, current, new, success, failure)
            }
        }

        impl Atomic64 for $u64 {
            fn load(&self, order: Ordering) -> u64 {
                <$u64>::load(self, order)
            }
            fn store(&self, value: u64, order: Ordering) {
                <$u64>::store(self, value, order);
            }
        }
    };
}

atomic_impls!(std::sync::atomic::AtomicU32, std::sync::atomic::AtomicU64);
#[cfg(test)]
atomic_impls!(loom::sync::atomic::AtomicU32, loom::sync::atomic::AtomicU64);

/// The magic of a live managed block.
pub(crate) const BLOCK_MAGIC: u32 = 0xFE_22_0B_10;

/// Why a descriptor's block cannot be adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotLive {
    /// No live block there (never allocated, or reclaimed).
    NoBlock,
    /// The block is there but its last reference was released.
    Released,
    /// A live block's header, but of a block whose data lies elsewhere (a header slot the
    /// descriptor does not belong to).
    OtherBlock,
}

/// How a receiver first touches a block's header.
///
/// A header in memory this process has not looked at yet costs a page fault. A read fault on
/// shared memory also maps pages around it that the owner wrote (the kernel's fault-around,
/// within 64 KiB by default), which for a large block are its data, that a zero-copy receiver
/// may never read; a write fault maps the one page. Measured on this project's 2-core machine
/// (AMD EPYC, 2026-12-01, kernel 6.18, two mappings of one object in /dev/shm, each touch at a new
/// 64 MiB step): a first load ~4.8-5.3 µs, a first compare-and-swap ~2.5-2.9 µs. For small
/// blocks the pages around hold other blocks' headers, which the read maps in one fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstTouch {
    /// A load of the magic.
    Read,
    /// A compare-and-swap of the magic with itself.
    Write,
}

/// A managed block's header: reference count, magic, capacity and the offset of the block's
/// data (which a header outside the block ties to it).
pub(crate) struct BlockCells<'a, A, B> {
    pub(crate) refcount: &'a A,
    pub(crate) magic: &'a A,
    pub(crate) capacity: &'a B,
    pub(crate) data_offset: &'a B,
}

impl<A: Atomic32, B: Atomic64> BlockCells<'_, A, B> {
    /// Owner, allocating: one reference, the capacity and the data's offset, then the magic.
    /// The release store publishes them (and the owner's earlier writes) to whoever acquires
    /// the magic.
    pub(crate) fn publish(&self, capacity: u64, data_offset: u64) {
        self.refcount.store(1, Ordering::Relaxed);
        self.capacity.store(capacity, Ordering::Relaxed);
        self.data_offset.store(data_offset, Ordering::Relaxed);
        self.magic.store(BLOCK_MAGIC, Ordering::Release);
    }

    /// Owner, after [`BlockRefs::is_released`]: the block is no longer adoptable.
    pub(crate) fn retire(&self) {
        self.magic.store(0, Ordering::Release);
    }

    /// Receiver, adopting a descriptor that names the block's data at `data_offset`: the
    /// block's capacity if it is live and its data lies there. `touch` says how the header is
    /// first touched (see [`FirstTouch`]); both read the magic alike.
    pub(crate) fn live_capacity(
        &self,
        touch: FirstTouch,
        data_offset: u64,
    ) -> Result<u64, NotLive> {
        let magic = match touch {
            FirstTouch::Read => self.magic.load(Ordering::Acquire),
            // Writes the magic it finds back only when it is a live block's: a retiring
            // owner's store of 0 is never undone, and an RMW continues the publishing store's
            // release sequence, so later acquirers still see what the owner published.
            FirstTouch::Write => match self.magic.compare_exchange(
                BLOCK_MAGIC,
                BLOCK_MAGIC,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(magic) | Err(magic) => magic,
            },
        };
        if magic != BLOCK_MAGIC {
            return Err(NotLive::NoBlock);
        }
        let capacity = self.capacity.load(Ordering::Acquire);
        if self.data_offset.load(Ordering::Acquire) != data_offset {
            return Err(NotLive::OtherBlock);
        }
        if self.refcount.load(Ordering::Acquire) == 0 {
            return Err(NotLive::Released);
        }
        Ok(capacity)
    }
}

/// A block's reference count: the steps on the count alone, a holder's and the owner's check
/// that none is left, which need no other cell of the header. Kept apart from [`BlockCells`] so
/// that the hot steps (a sender checking, per write, that it still holds the only reference;
/// the owner looking at each outstanding block on a reclaim) look up one cell of the segment,
/// not four.
pub(crate) struct BlockRefs<'a, A> {
    pub(crate) refcount: &'a A,
}

impl<A: Atomic32> BlockRefs<'_, A> {
    /// A holder adds `n` references for `n` more receivers (pub/sub fan-out).
    pub(crate) fn add(&self, n: u32) {
        self.refcount.fetch_add(n, Ordering::AcqRel);
    }

    /// A holder gives up `n` references; the owner may reclaim the block once none is left.
    pub(crate) fn release(&self, n: u32) {
        self.refcount.fetch_sub(n, Ordering::AcqRel);
    }

    /// Owner, reclaiming: whether the last reference is gone. Acquire pairs with the releases'
    /// release half: every access to the block by a releasing holder happened before.
    pub(crate) fn is_released(&self) -> bool {
        self.refcount.load(Ordering::Acquire) == 0
    }

    /// Whether the caller's reference is the only one (it may then write the bytes).
    pub(crate) fn is_sole_reference(&self) -> bool {
        self.refcount.load(Ordering::Acquire) == 1
    }

    /// The references held now, for tests that count them.
    #[cfg(test)]
    pub(crate) fn references(&self) -> u32 {
        self.refcount.load(Ordering::Acquire)
    }
}

/// Which end of a descriptor ring (`ring.rs`) marks itself done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingEnd {
    Producer = 1,
    Consumer = 2,
}

/// The `finished` word of a descriptor ring: each end marks it once, after its last access to
/// the ring's entries; the end that finds the other's mark is the last one at the ring and
/// releases what it still holds. The compare-and-swap is acquire-release: the last end sees
/// everything the other did before its mark (the producer's last entries, the consumer's
/// last take).
pub(crate) struct RingFinish<'a, A> {
    pub(crate) finished: &'a A,
}

/// `finished` once the last end released what was left.
const RING_SETTLED: u32 = 3;

impl<A: Atomic32> RingFinish<'_, A> {
    /// Marks `end` done; true when the other end was done already (`end` is the last one).
    pub(crate) fn finish(&self, end: RingEnd) -> bool {
        let other = match end {
            RingEnd::Producer => RingEnd::Consumer,
            RingEnd::Consumer => RingEnd::Producer,
        };
        self.finished
            .compare_exchange(0, end as u32, Ordering::AcqRel, Ordering::Acquire)
            == Err(other as u32)
    }

    /// The last end: what was left is released (a producer that keeps an eye on a consumer
    /// still at the ring when it finished stops watching).
    pub(crate) fn settle(&self) {
        self.finished.store(RING_SETTLED, Ordering::Release);
    }

    /// Whether the last end released what was left.
    pub(crate) fn is_settled(&self) -> bool {
        self.finished.load(Ordering::Acquire) == RING_SETTLED
    }
}

/// The header words of a descriptor ring's entries as readiness (`ring.rs`, "Headers as
/// readiness"): a header slot is 0 until an entry is committed there, and no committed header is
/// 0.
pub(crate) struct EntryHeaders;

impl EntryHeaders {
    /// Producer: commits the entry whose header goes in `slot` (its bytes written before this
    /// call), after clearing `next`, the header slot just past the entry (free room), if given
    /// (a skip's next slot is the entry it skips to, committed before it). Release: a consumer
    /// that sees the header sees the bytes and the cleared slot.
    pub(crate) fn commit<A: Atomic64>(slot: &A, next: Option<&A>, header: u64) {
        debug_assert_ne!(header, 0, "a committed header is never 0");
        if let Some(next) = next {
            next.store(0, Ordering::Relaxed);
        }
        slot.store(header, Ordering::Release);
    }

    /// Consumer: the header committed in `slot`, if any (acquire: the entry's bytes may be read
    /// once it is).
    pub(crate) fn committed<A: Atomic64>(slot: &A) -> Option<u64> {
        let header = slot.load(Ordering::Acquire);
        (header != 0).then_some(header)
    }
}

/// One process's acknowledgement ring in a region's header: a single producer appends entries of
/// three words, the region's creator drains them. `entry(position, field)` is the word `field`
/// of the entry for `position` (wrapped by the ring's length).
pub(crate) struct AckRing<'a, B, E> {
    pub(crate) head: &'a B,
    pub(crate) tail: &'a B,
    pub(crate) len: u64,
    pub(crate) entry: E,
}

impl<'a, B: Atomic64 + 'a, E: Fn(u64, usize) -> Option<&'a B>> AckRing<'a, B, E> {
    /// Producer: appends `words` unless the ring is full (`false`). The entry is written before
    /// the head moves (release), so the consumer that sees the head sees the entry.
    pub(crate) fn offer(&self, words: [u64; 3]) -> bool {
        let position = self.head.load(Ordering::Relaxed);
        // Wrapping: a tail beyond the head (a corrupted header) reads as full, not as a panic.
        if position.wrapping_sub(self.tail.load(Ordering::Acquire)) >= self.len {
            return false;
        }
        for (field, word) in words.into_iter().enumerate() {
            if let Some(slot) = (self.entry)(position, field) {
                slot.store(word, Ordering::Relaxed);
            }
        }
        self.head.store(position + 1, Ordering::Release);
        true
    }

    /// Consumer: hands every entry appended so far to `take`, oldest first, then frees their
    /// slots (release: the reads happen before the producer, acquiring the tail, reuses them).
    pub(crate) fn drain(&self, mut take: impl FnMut([u64; 3])) {
        let end = self.head.load(Ordering::Acquire);
        let mut position = self.tail.load(Ordering::Relaxed);
        while position < end {
            let word = |field: usize| {
                (self.entry)(position, field).map_or(0, |slot| slot.load(Ordering::Relaxed))
            };
            take([word(0), word(1), word(2)]);
            position += 1;
        }
        self.tail.store(position, Ordering::Release);
    }
}

#[cfg(test)]
mod loom_models {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
    use loom::thread;

    use super::*;

    /// A block's header and bytes, and the descriptor "socket" between owner and receivers.
    struct Block {
        refcount: AtomicU32,
        magic: AtomicU32,
        capacity: AtomicU64,
        data_offset: AtomicU64,
        bytes: UnsafeCell<u64>,
        descriptor_sent: AtomicBool,
    }

    impl Block {
        fn new() -> Block {
            Block {
                refcount: AtomicU32::new(0),
                magic: AtomicU32::new(0),
                capacity: AtomicU64::new(0),
                data_offset: AtomicU64::new(0),
                bytes: UnsafeCell::new(0),
                descriptor_sent: AtomicBool::new(false),
            }
        }

        fn refs(&self) -> BlockRefs<'_, AtomicU32> {
            BlockRefs {
                refcount: &self.refcount,
            }
        }

        fn cells(&self) -> BlockCells<'_, AtomicU32, AtomicU64> {
            BlockCells {
                refcount: &self.refcount,
                magic: &self.magic,
                capacity: &self.capacity,
                data_offset: &self.data_offset,
            }
        }

        /// A receiver waits for the descriptor (a socket read: acquire).
        fn wait_for_descriptor(&self) {
            while !self.descriptor_sent.load(Ordering::Acquire) {
                thread::yield_now();
            }
        }
    }

    /// The data offset the block's descriptors name.
    const DATA: u64 = 128;

    fn model(scenario: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(scenario);
    }

    /// An owner publishes a block to two subscribers (one extra reference), each reads it and
    /// releases; the owner reclaims and writes the block again. Loom fails the model if that
    /// write could race with a subscriber's read, or a subscriber could see a dead block.
    #[test]
    fn a_block_is_written_again_only_after_every_reader_released_it() {
        model(|| {
            let block = Arc::new(Block::new());
            // SAFETY: no other thread runs yet.
            block.bytes.with_mut(|bytes| unsafe { *bytes = 7 });
            block.cells().publish(64, DATA);
            block.refs().add(1);
            block.descriptor_sent.store(true, Ordering::Release);
            let readers: Vec<_> = [FirstTouch::Read, FirstTouch::Write]
                .into_iter()
                .map(|touch| {
                    let block = Arc::clone(&block);
                    thread::spawn(move || {
                        block.wait_for_descriptor();
                        assert_eq!(block.cells().live_capacity(touch, DATA), Ok(64));
                        // SAFETY: this reader holds a reference; loom checks nobody writes.
                        let seen = block.bytes.with(|bytes| unsafe { *bytes });
                        assert_eq!(seen, 7);
                        block.refs().release(1);
                    })
                })
                .collect();
            while !block.refs().is_released() {
                thread::yield_now();
            }
            block.cells().retire();
            // SAFETY: the count is zero: loom checks every reader's access happened before.
            block.bytes.with_mut(|bytes| unsafe { *bytes = 8 });
            for reader in readers {
                reader.join().unwrap();
            }
        });
    }

    /// A receiver adopts the block (its header first touched by `first`), releases it and gets
    /// the same descriptor again, looked at by `replay`, while the owner reclaims and retires
    /// the block: the replay finds no live block. Returns the block, retired.
    fn adopt_release_and_replay(first: FirstTouch, replay: FirstTouch) -> Arc<Block> {
        let block = Arc::new(Block::new());
        block.cells().publish(64, DATA);
        block.descriptor_sent.store(true, Ordering::Release);
        let receiver = {
            let block = Arc::clone(&block);
            thread::spawn(move || {
                block.wait_for_descriptor();
                assert_eq!(block.cells().live_capacity(first, DATA), Ok(64));
                block.refs().release(1);
                // The same descriptor again, while the owner may be reclaiming.
                assert!(block.cells().live_capacity(replay, DATA).is_err());
            })
        };
        while !block.refs().is_released() {
            thread::yield_now();
        }
        block.cells().retire();
        receiver.join().unwrap();
        block
    }

    /// A descriptor replayed after its reference was released (a forged or duplicated frame)
    /// never finds a live block, whether the owner has reclaimed it by then or not.
    #[test]
    fn a_replayed_descriptor_never_adopts_a_released_block() {
        for first in [FirstTouch::Read, FirstTouch::Write] {
            model(move || {
                let block = adopt_release_and_replay(first, FirstTouch::Read);
                // And once the owner has retired the block.
                for touch in [FirstTouch::Read, FirstTouch::Write] {
                    assert_eq!(
                        block.cells().live_capacity(touch, DATA),
                        Err(NotLive::NoBlock)
                    );
                }
            });
        }
    }

    /// A receiver that first touches headers by writing (a compare-and-swap of the magic with
    /// itself, for large blocks) never makes a released or retired block adoptable, whether its
    /// replayed descriptor comes while the owner reclaims or after.
    ///
    /// Only "an error" is asserted after the owner's retiring store here, not which: loom keeps
    /// the modification order partial and lets a later access read the replay's own write of
    /// the magic, which C++'s atomicity of read-modify-writes orders before that store (the
    /// replay read the magic the first adoption wrote, and the owner's store comes after that
    /// one). Either answer refuses the block.
    #[test]
    fn a_header_first_touched_by_a_write_is_never_revived() {
        model(|| {
            let block = adopt_release_and_replay(FirstTouch::Write, FirstTouch::Write);
            assert!(
                block
                    .cells()
                    .live_capacity(FirstTouch::Write, DATA)
                    .is_err()
            );
        });
    }

    /// Three entries through a ring of two (so it fills and wraps): the consumer reads each
    /// entry whole, as written, in order. Beside each slot lies a plain cell the producer
    /// writes before offering and the consumer reads while draining, as a region's creator
    /// then reads the released range: loom fails the model if the ring's head and tail do not
    /// order those accesses (its words are atomics and would not show a race themselves).
    #[test]
    fn an_ack_ring_hands_over_every_entry_whole_and_in_order() {
        const LEN: u64 = 2;
        struct Ring {
            head: AtomicU64,
            tail: AtomicU64,
            words: Vec<AtomicU64>,
            beside: Vec<UnsafeCell<u64>>,
        }
        fn ring<'a>(
            shared: &'a Ring,
        ) -> AckRing<'a, AtomicU64, impl Fn(u64, usize) -> Option<&'a AtomicU64>> {
            AckRing {
                head: &shared.head,
                tail: &shared.tail,
                len: LEN,
                entry: move |position: u64, field: usize| {
                    shared.words.get((position % LEN) as usize * 3 + field)
                },
            }
        }
        model(|| {
            let shared = Arc::new(Ring {
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                words: (0..LEN * 3).map(|_| AtomicU64::new(0)).collect(),
                beside: (0..LEN).map(|_| UnsafeCell::new(0)).collect(),
            });
            let producer = {
                let shared = Arc::clone(&shared);
                thread::spawn(move || {
                    for idx in 1..=3u64 {
                        let position = idx - 1;
                        // Room first (what `offer` looks at), then the slot's cell.
                        while position - shared.tail.load(Ordering::Acquire) >= LEN {
                            thread::yield_now();
                        }
                        let cell = &shared.beside[(position % LEN) as usize];
                        // SAFETY: the consumer freed this slot (the tail passed it).
                        cell.with_mut(|value| unsafe { *value = idx });
                        assert!(ring(&shared).offer([idx, idx * 10, idx * 100]));
                    }
                })
            };
            let mut taken = Vec::new();
            while taken.len() < 3 {
                ring(&shared).drain(|entry| {
                    let cell = &shared.beside[((entry[0] - 1) % LEN) as usize];
                    // SAFETY: the producer wrote it before the head passed this entry.
                    let beside = cell.with(|value| unsafe { *value });
                    taken.push((entry, beside));
                });
                thread::yield_now();
            }
            producer.join().unwrap();
            let expected = [1u64, 2, 3].map(|idx| ([idx, idx * 10, idx * 100], idx));
            assert_eq!(taken, expected);
        });
    }

    /// Three entries through a ring of two header slots, each with a body cell beside it,
    /// where the producer needs the slot after an entry free too (it clears it): so the ring
    /// wraps and the producer clears and rewrites slots the consumer read a lap before. The
    /// consumer finds each entry by its header, reads the body the producer wrote before
    /// committing it, and frees the slot by its head (release). Loom fails the model if the
    /// consumer could read a body before it is whole, see a stale or cleared header as a new
    /// one, or the producer could write a body the consumer is still reading.
    #[test]
    fn a_committed_header_shows_its_whole_entry_and_nothing_stale() {
        const LEN: u64 = 2;
        struct Ring {
            head: AtomicU64,
            headers: Vec<AtomicU64>,
            bodies: Vec<UnsafeCell<u64>>,
        }
        model(|| {
            let shared = Arc::new(Ring {
                head: AtomicU64::new(0),
                headers: (0..LEN).map(|_| AtomicU64::new(0)).collect(),
                bodies: (0..LEN).map(|_| UnsafeCell::new(0)).collect(),
            });
            let slot = |position: u64| (position % LEN) as usize;
            let producer = {
                let shared = Arc::clone(&shared);
                thread::spawn(move || {
                    for idx in 1..=3u64 {
                        let position = idx - 1;
                        // Room for the entry and the slot after it.
                        while position + 1 - shared.head.load(Ordering::Acquire) >= LEN {
                            thread::yield_now();
                        }
                        // SAFETY: the consumer freed this slot (the head passed it).
                        shared.bodies[slot(position)].with_mut(|body| unsafe { *body = idx * 10 });
                        EntryHeaders::commit(
                            &shared.headers[slot(position)],
                            Some(&shared.headers[slot(position + 1)]),
                            idx,
                        );
                    }
                })
            };
            let mut taken = Vec::new();
            let mut position = 0u64;
            while taken.len() < 3 {
                match EntryHeaders::committed(&shared.headers[slot(position)]) {
                    Some(header) => {
                        // SAFETY: the producer wrote it before committing the header.
                        let body = shared.bodies[slot(position)].with(|body| unsafe { *body });
                        taken.push((header, body));
                        position += 1;
                        shared.head.store(position, Ordering::Release);
                    }
                    None => thread::yield_now(),
                }
            }
            producer.join().unwrap();
            assert_eq!(taken, vec![(1, 10), (2, 20), (3, 30)]);
        });
    }

    /// The producer writes its last entry and finishes; the consumer finishes (having taken
    /// nothing more). Exactly one of them finds the other done, and the one that does reads
    /// the last entry without racing its write.
    #[test]
    fn exactly_one_end_of_a_ring_is_last_and_it_sees_the_last_entry() {
        model(|| {
            let finished = Arc::new(AtomicU32::new(0));
            let entry = Arc::new(UnsafeCell::new(0u64));
            let n_last = Arc::new(AtomicU32::new(0));
            let producer = {
                let (finished, entry, n_last) = (
                    Arc::clone(&finished),
                    Arc::clone(&entry),
                    Arc::clone(&n_last),
                );
                thread::spawn(move || {
                    // SAFETY: only the producer writes the entry; loom checks the reads.
                    entry.with_mut(|entry| unsafe { *entry = 7 });
                    if (RingFinish {
                        finished: &*finished,
                    })
                    .finish(RingEnd::Producer)
                    {
                        // SAFETY: its own write.
                        assert_eq!(entry.with(|entry| unsafe { *entry }), 7);
                        n_last.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            if (RingFinish {
                finished: &*finished,
            })
            .finish(RingEnd::Consumer)
            {
                // SAFETY: the producer finished after its write; loom checks the ordering.
                assert_eq!(entry.with(|entry| unsafe { *entry }), 7);
                n_last.fetch_add(1, Ordering::Relaxed);
            }
            producer.join().unwrap();
            assert_eq!(
                n_last.load(Ordering::Relaxed),
                1,
                "exactly one end is the last"
            );
        });
    }
}
