//! Managed segments: blocks allocated by the segment's owner, released by whoever drops the last
//! reference, in any process.
//!
//! # Block layout
//! Each block is a 64-byte range followed by its data, both 64-byte aligned. Its header,
//! `refcount: AtomicU32 | magic: AtomicU32 | capacity: AtomicU64 | data_offset: AtomicU64 | ...`,
//! lies in that range, right before the data, or, for a block of at least
//! [`TABLE_HEADERS_FROM`] bytes made for a message while a slot is free, in a slot of the
//! segment's **table of large-block headers**: 64-byte slots between the segment's header and
//! its first block, at most [`MAX_TABLE_PAGES`] pages, one per MiB of the segment. The
//! descriptor that travels names the data offset and where the header is
//! ([`crate::wire::HeaderAt`]); the receiver checks the magic, that the header names that data
//! offset, the capacity and the reference count before touching a byte.
//!
//! Why a table: a receiver's first touch of a header in memory it has not looked at is a page
//! fault, and for a large block the header's page is the block's own (or the tail of the one
//! before): a `call_buffer` of 64 MiB in memory new to its destination paid ~2.5 µs for that
//! fault and another 1-1.5 µs for the page table of a new 2 MiB stretch, the whole difference
//! to a call of 4 KiB (issue 14). The table's pages are mapped once, when a receiver opens the
//! segment (`map_header_table`), so a receiver that only passes a large block on, or reads a
//! part of it, touches no page of it it does not read. Small blocks keep their headers before
//! their data: their neighbours' headers share their pages, which one fault maps together.
//!
//! # Ownership
//! A new block has one reference, held by the [`ShmBuffer`] inside a `Message`. Sending moves that
//! reference to the receiver (the sender's handle is disarmed, not dropped); a publisher adds one
//! reference per extra subscriber. Dropping a handle decrements; at zero the block is garbage,
//! and the owner's next allocation reclaims it (first in FIFO order, everything when short of
//! room).
//!
//! # Allocations
//! A message holds its `ShmBuffer` in a box. When the message is done, the box comes back
//! through [`MessageBuffer::recycle`]: the reference is released, the segment let go, and the
//! empty box kept in a per-thread spare list (up to [`MAX_SPARE_BUFFERS`]) for the next buffer
//! made on that thread, so sending and receiving cost no heap allocation in steady state. Per
//! thread, not process-wide: a shared list behind a lock measured slower than the allocator.

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use ferromq_core::MessageBuffer;

use crate::allocator::Allocator;
use crate::error::ShmError;
use crate::protocol::{BlockCells, BlockRefs, FirstTouch, NotLive};
use crate::segment::{HEADER_SIZE, Segment};
use crate::wire::{HeaderAt, WireRange};

/// Alignment of blocks and their headers.
pub const BLOCK_ALIGN: usize = 64;

/// Message blocks of at least this many bytes get a header in the segment's table while a
/// slot is free: from this size on, the pages around an inline header are the block's own data
/// (a read fault maps the 64 KiB-aligned window around the faulting page).
pub const TABLE_HEADERS_FROM: usize = 64 << 10;
/// The table's size at most, in pages of 4 KiB (64 slots each): 1024 slots.
pub const MAX_TABLE_PAGES: usize = 16;
const PAGE: usize = 4096;
/// Bytes of segment per page of the table.
const BYTES_PER_TABLE_PAGE: usize = 1 << 20;

/// Pages of the table of large-block headers in a managed segment of `len` bytes: one per MiB
/// of data, at most [`MAX_TABLE_PAGES`] (a 2 GiB segment spends 64 KiB on it, one of less than
/// 1 MiB nothing). Owner and receivers compute it from the object's length alike.
fn table_pages(len: usize) -> usize {
    (len.saturating_sub(HEADER_SIZE) / BYTES_PER_TABLE_PAGE).min(MAX_TABLE_PAGES)
}

/// Slots of the table in a managed segment of `len` bytes.
fn table_slots(len: usize) -> usize {
    table_pages(len) * PAGE / BLOCK_ALIGN
}

/// Where a managed segment of `len` bytes has its first block: after its header and its table.
pub fn data_start(len: usize) -> usize {
    HEADER_SIZE + table_pages(len) * PAGE
}

/// The offset of the header in slot `slot` of the table.
fn slot_header(slot: usize) -> usize {
    HEADER_SIZE + slot * BLOCK_ALIGN
}

/// The slot of the table whose header is at `header_offset`.
fn header_slot(header_offset: usize) -> usize {
    (header_offset - HEADER_SIZE) / BLOCK_ALIGN
}

/// The offset of header slot `slot`, `None` past the table of a segment of `len` bytes.
fn slot_offset(len: usize, slot: u32) -> Option<usize> {
    let slot = usize::try_from(slot).ok()?;
    (slot < table_slots(len)).then(|| slot_header(slot))
}

/// Maps the pages of `segment`'s table of large-block headers into this process (a read of
/// each), so that adopting a large block costs no page fault (see "Block layout"). Done once,
/// when the segment is opened or made: a read fault also maps the pages around that exist,
/// so a table of 16 pages costs a few faults.
pub(crate) fn map_header_table(segment: &Segment) {
    for page in 0..table_pages(segment.len()) {
        if let Some(word) = segment.atomic_u32(HEADER_SIZE + page * PAGE) {
            std::hint::black_box(word.load(Ordering::Relaxed));
        }
    }
}

fn align_up(size: usize) -> usize {
    size.div_ceil(BLOCK_ALIGN).max(1) * BLOCK_ALIGN
}

/// Bytes a block holding `size` bytes takes of a segment: its inline header, then its data
/// in units of [`BLOCK_ALIGN`] (see "Block layout").
pub fn block_footprint(size: usize) -> usize {
    align_up(size).saturating_add(BLOCK_ALIGN)
}

/// Bytes of a segment of `len` bytes that blocks can take: all after [`data_start`].
pub fn block_room(len: usize) -> usize {
    len.saturating_sub(data_start(len))
}

/// A block the owner handed out: where its header is, and its range (its inline header's 64
/// bytes, then its data).
#[derive(Debug, Clone, Copy)]
struct Held {
    header: usize,
    range: usize,
    total: usize,
}

impl Held {
    /// Its header's slot in the table, `None` when the header is before the data.
    fn slot(&self) -> Option<u16> {
        (self.header != self.range).then(|| header_slot(self.header) as u16)
    }
}

struct OwnerState {
    allocator: Allocator,
    /// Blocks handed out and not yet reclaimed, oldest first.
    outstanding: VecDeque<Held>,
    /// Blocks that live as long as a socket (descriptor rings): kept apart, so that one of them
    /// at the front of `outstanding` does not hold back the reclaiming of every later block.
    long_lived: Vec<Held>,
    /// Free slots of the table of large-block headers, the most recently freed last (its line
    /// is the likeliest to be in the caches).
    free_slots: Vec<u16>,
}

/// A segment this process created and allocates from.
pub struct OwnedSegment {
    segment: Arc<Segment>,
    state: crate::lock::ShortLock<OwnerState>,
}

impl OwnedSegment {
    /// Takes ownership of a freshly created segment.
    pub fn new(segment: Segment) -> OwnedSegment {
        let allocator = Allocator::new(data_start(segment.len()), segment.len());
        map_header_table(&segment);
        // Slot 0 is taken first.
        let free_slots = (0..table_slots(segment.len()) as u16).rev().collect();
        segment
            .header()
            .largest_free
            .store(allocator.largest_free() as u64, Ordering::Relaxed);
        OwnedSegment {
            segment: Arc::new(segment),
            state: crate::lock::ShortLock::new(OwnerState {
                allocator,
                outstanding: VecDeque::new(),
                long_lived: Vec::new(),
                free_slots,
            }),
        }
    }

    /// The segment.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// Bytes a message can have at most in this segment.
    pub fn max_message_size(&self) -> usize {
        self.capacity() - BLOCK_ALIGN
    }

    /// A block for a message of `size` bytes with one reference, or `None` when there is no
    /// room now; its header in the table when it is large and a slot is free.
    pub fn allocate(&self, size: usize) -> Option<ShmBuffer> {
        self.allocate_block(size, size >= TABLE_HEADERS_FROM)
    }

    /// [`OwnedSegment::allocate`] with the header right before the data, as a block reference
    /// (`wire::encode_block_ref`, which names no header) needs.
    pub fn allocate_with_header_before_data(&self, size: usize) -> Option<ShmBuffer> {
        self.allocate_block(size, false)
    }

    fn allocate_block(&self, size: usize, header_in_table: bool) -> Option<ShmBuffer> {
        let capacity = align_up(size);
        let total = capacity + BLOCK_ALIGN;
        let mut state = self.state.lock();
        // A recycled block of this size first; released blocks are reclaimed (which refills
        // the cache) only when it has none, so the receivers' reference counts are read in
        // runs, not one cache miss per allocation.
        let (range, from_cache) = match state.allocator.take_cached(total) {
            Some(offset) => (offset, true),
            None => (self.reclaim_and_allocate(&mut state, total)?, false),
        };
        let header = match header_in_table.then(|| state.free_slots.pop()).flatten() {
            Some(slot) => slot_header(usize::from(slot)),
            None => range,
        };
        let held = Held {
            header,
            range,
            total,
        };
        self.publish_block(held, capacity);
        state.outstanding.push_back(held);
        // A recycled range leaves the largest free range as it was unless it was the last of
        // its size: then only the counts change (the tree lookup was 1-2 % of the sender).
        if from_cache && state.allocator.has_cached(total) {
            self.publish_counts(&state);
        } else {
            self.publish_usage(&state);
        }
        drop(state);
        Some(self.handle(held, capacity))
    }

    /// A block that will live as long as a socket (a descriptor ring), from the free ranges
    /// (not the recycling cache); reclaimed like any other once unreferenced.
    pub fn allocate_long_lived(&self, size: usize) -> Option<ShmBuffer> {
        let capacity = align_up(size);
        let total = capacity + BLOCK_ALIGN;
        let mut state = self.state.lock();
        let range = self.reclaim_and_allocate(&mut state, total)?;
        let held = Held {
            header: range,
            range,
            total,
        };
        self.publish_block(held, capacity);
        state.long_lived.push(held);
        self.publish_usage(&state);
        drop(state);
        Some(self.handle(held, capacity))
    }

    /// `total` bytes from the free ranges, after reclaiming the oldest released blocks, or
    /// every released block when that is not enough.
    fn reclaim_and_allocate(&self, state: &mut OwnerState, total: usize) -> Option<usize> {
        self.reclaim(state, false);
        match state.allocator.allocate(total) {
            Some(offset) => Some(offset),
            None => {
                self.reclaim(state, true);
                state.allocator.allocate(total)
            }
        }
    }

    /// Makes `held` live with one reference.
    fn publish_block(&self, held: Held, capacity: usize) {
        block_at(&self.segment, held.header)
            .expect("allocated blocks lie inside the segment")
            .publish(capacity as u64, (held.range + BLOCK_ALIGN) as u64);
    }

    /// The handle of `held`, just published.
    fn handle(&self, held: Held, capacity: usize) -> ShmBuffer {
        ShmBuffer::new_block(
            Arc::clone(&self.segment),
            held.header,
            held.range + BLOCK_ALIGN,
            capacity,
        )
    }

    /// Frees blocks nobody references: the oldest ones in order, or all of them when `everything`.
    fn reclaim(&self, state: &mut OwnerState, everything: bool) {
        let released = |segment: &Segment, held: Held| {
            refs_at(segment, held.header).is_some_and(|refs| refs.is_released())
        };
        let mut n_freed = 0;
        if everything {
            let mut kept = VecDeque::with_capacity(state.outstanding.len());
            while let Some(held) = state.outstanding.pop_front() {
                if released(&self.segment, held) {
                    self.release(state, held);
                    n_freed += 1;
                } else {
                    kept.push_back(held);
                }
            }
            state.outstanding = kept;
        } else {
            while let Some(&held) = state.outstanding.front() {
                if !released(&self.segment, held) {
                    break;
                }
                state.outstanding.pop_front();
                self.release(state, held);
                n_freed += 1;
            }
        }
        let mut long_lived = std::mem::take(&mut state.long_lived);
        long_lived.retain(|&held| {
            let free = released(&self.segment, held);
            if free {
                self.release(state, held);
                n_freed += 1;
            }
            !free
        });
        state.long_lived = long_lived;
        if n_freed > 0 {
            self.publish_usage(state);
        }
    }

    /// Makes `held`, released, unadoptable and its range (and header slot) free again.
    fn release(&self, state: &mut OwnerState, held: Held) {
        if let Some(block) = block_at(&self.segment, held.header) {
            block.retire();
        }
        state.allocator.free(held.range, held.total);
        if let Some(slot) = held.slot() {
            state.free_slots.push(slot);
        }
    }

    /// Publishes the bytes in use and the live blocks in the segment's header (what `ferromq shm
    /// list`, `top` and the metrics read).
    fn publish_counts(&self, state: &OwnerState) {
        let header = self.segment.header();
        let data_size = self.capacity();
        header.used_bytes.store(
            (data_size - state.allocator.free_bytes()) as u64,
            Ordering::Relaxed,
        );
        header.live_blocks.store(
            (state.outstanding.len() + state.long_lived.len()) as u64,
            Ordering::Relaxed,
        );
    }

    /// [`OwnedSegment::publish_counts`] and the largest free range.
    fn publish_usage(&self, state: &OwnerState) {
        self.publish_counts(state);
        self.segment
            .header()
            .largest_free
            .store(state.allocator.largest_free() as u64, Ordering::Relaxed);
    }

    /// Reclaims everything releasable and reports (free bytes, blocks still referenced).
    pub fn collect(&self) -> (usize, usize) {
        let mut state = self.state.lock();
        self.reclaim(&mut state, true);
        state.allocator.flush();
        self.publish_usage(&state);
        (
            state.allocator.free_bytes(),
            state.outstanding.len() + state.long_lived.len(),
        )
    }

    /// Free bytes when nothing is allocated.
    pub fn capacity(&self) -> usize {
        self.segment.len() - data_start(self.segment.len())
    }

    /// The "segment full" error for a request of `requested` bytes after `waited_ms`.
    pub fn full_error(&self, requested: usize, waited_ms: u64) -> ShmError {
        let header = self.segment.header();
        ShmError::SegmentFull {
            name: self.segment.name().to_string(),
            size: self.capacity(),
            used: header.used_bytes.load(Ordering::Relaxed),
            live_blocks: header.live_blocks.load(Ordering::Relaxed),
            largest_free: header.largest_free.load(Ordering::Relaxed),
            requested,
            waited_ms,
        }
    }
}

/// Messages of at least this many bytes have their block's header first touched by a write
/// ([`FirstTouch::Write`]): a read fault maps the pages of the 64 KiB-aligned window around the
/// header that are there (the kernel's default fault-around), and from this size on the pages
/// after the header are all the block's own data, not further blocks' headers (before it lie
/// at most 15 pages of earlier blocks), so mapping one page is the cheaper fault.
const FIRST_TOUCH_BY_WRITE_FROM: usize = 64 << 10;

/// The shared fields of a block header.
/// A block's header in a mapped segment; its protocol steps are `protocol.rs`'s (model-checked).
type BlockHeader<'a> = BlockCells<'a, AtomicU32, AtomicU64>;

/// The reference count of the block whose header is at `header_offset`, `None` outside the
/// segment: what a holder's steps and the owner's reclaim check need (one cell looked up, not
/// the header's four).
fn refs_at(segment: &Segment, header_offset: usize) -> Option<BlockRefs<'_, AtomicU32>> {
    Some(BlockRefs {
        refcount: segment.atomic_u32(header_offset)?,
    })
}

/// The header of the block at `header_offset`, `None` outside the segment.
fn block_at(segment: &Segment, header_offset: usize) -> Option<BlockHeader<'_>> {
    Some(BlockCells {
        refcount: segment.atomic_u32(header_offset)?,
        magic: segment.atomic_u32(header_offset + 4)?,
        capacity: segment.atomic_u64(header_offset + 8)?,
        data_offset: segment.atomic_u64(header_offset + 16)?,
    })
}

/// What a [`ShmBuffer`] releases when it drops.
enum Release {
    /// One reference of a managed block.
    Block,
    /// A region buffer: the creator is told through its acknowledgement queue.
    Region(crate::region::Acknowledge, u64),
    /// Nothing (the handle was sent on).
    Nothing,
}

/// A message buffer in shared memory: a managed block or a range of an unmanaged region.
pub struct ShmBuffer {
    /// `None` only in a recycled buffer waiting in a spare list, which nobody else sees.
    segment: Option<Arc<Segment>>,
    /// A managed block's header (0 for a region's range).
    header_offset: usize,
    data_offset: usize,
    capacity: usize,
    release: Release,
    /// Set through a shared borrow when the handle's reference was handed to a receiver:
    /// dropping it then releases nothing.
    handed_on: AtomicBool,
}

/// How many empty buffer boxes each thread keeps for reuse.
pub const MAX_SPARE_BUFFERS: usize = 1024;

thread_local! {
    /// Empty buffer boxes left by messages finished on this thread, for its next buffers.
    #[allow(clippy::vec_box, reason = "the boxes themselves are what is kept for reuse")]
    static SPARE_BUFFERS: RefCell<Vec<Box<ShmBuffer>>> = const { RefCell::new(Vec::new()) };
}

impl ShmBuffer {
    /// The buffer in a box, reusing a spare box when there is one.
    pub(crate) fn boxed(self) -> Box<ShmBuffer> {
        // `try_with` fails only while the thread is being torn down: then allocate.
        let spare = SPARE_BUFFERS
            .try_with(|spare| spare.borrow_mut().pop())
            .ok()
            .flatten();
        match spare {
            Some(mut boxed) => {
                // The spare holds nothing: overwriting it releases nothing.
                *boxed = self;
                boxed
            }
            None => Box::new(self),
        }
    }

    /// Releases what the buffer holds (its reference, or its region range) and lets the
    /// segment go; afterwards the buffer is empty and its drop does nothing.
    fn release(&mut self) {
        let release = std::mem::replace(&mut self.release, Release::Nothing);
        if std::mem::take(self.handed_on.get_mut()) {
            self.segment = None;
            return;
        }
        match release {
            Release::Block => {
                if let Some(segment) = &self.segment
                    && let Some(refs) = refs_at(segment, self.header_offset)
                {
                    refs.release(1);
                }
            }
            Release::Region(acknowledge, hint) => {
                acknowledge(
                    (self.data_offset - crate::region::REGION_DATA_START) as u64,
                    self.capacity as u64,
                    hint,
                );
            }
            Release::Nothing => {}
        }
        self.segment = None;
    }

    /// Keeps the empty box for the next buffer, unless enough are kept already.
    fn keep_spare(mut self: Box<Self>) {
        self.release();
        // During the thread's teardown the box is simply freed.
        let _ = SPARE_BUFFERS.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < MAX_SPARE_BUFFERS {
                spare.push(self);
            }
        });
    }

    fn segment_ref(&self) -> &Arc<Segment> {
        self.segment
            .as_ref()
            .expect("only recycled buffers, which nobody else holds, have no segment")
    }

    fn new_block(
        segment: Arc<Segment>,
        header_offset: usize,
        data_offset: usize,
        capacity: usize,
    ) -> ShmBuffer {
        ShmBuffer {
            segment: Some(segment),
            header_offset,
            data_offset,
            capacity,
            release: Release::Block,
            handed_on: AtomicBool::new(false),
        }
    }

    /// A region range whose release calls `acknowledge(offset, size, hint)`.
    pub(crate) fn new_region(
        segment: Arc<Segment>,
        data_offset: usize,
        size: usize,
        acknowledge: crate::region::Acknowledge,
        hint: u64,
    ) -> ShmBuffer {
        ShmBuffer {
            segment: Some(segment),
            header_offset: 0,
            data_offset,
            capacity: size,
            release: Release::Region(acknowledge, hint),
            handed_on: AtomicBool::new(false),
        }
    }

    /// Takes over one reference of the block `range` names in `segment` (its data offset and
    /// the bytes used), its header `header`, as a descriptor from the wire says, after checking
    /// that it is a live block holding that many bytes; returns it with the bytes used.
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] for anything that is not a live block of that size.
    pub(crate) fn adopt_block(
        segment: Arc<Segment>,
        range: WireRange,
        header: HeaderAt,
    ) -> Result<(ShmBuffer, usize), ShmError> {
        let bad = |reason: String| ShmError::BadDescriptor {
            reason: format!("{}: {reason}", segment.name()),
        };
        // Numbers from the wire: neither may wrap on the way to a range of memory.
        let (Ok(data_offset), Ok(size)) =
            (usize::try_from(range.offset), usize::try_from(range.size))
        else {
            return Err(bad(format!(
                "range {range} does not fit this machine's addresses"
            )));
        };
        if !data_offset.is_multiple_of(BLOCK_ALIGN)
            || data_offset < data_start(segment.len()) + BLOCK_ALIGN
        {
            return Err(bad(format!("offset {data_offset} is not a block offset")));
        }
        let (header_offset, touch) = match header {
            HeaderAt::BeforeData if size >= FIRST_TOUCH_BY_WRITE_FROM => {
                (data_offset - BLOCK_ALIGN, FirstTouch::Write)
            }
            HeaderAt::BeforeData => (data_offset - BLOCK_ALIGN, FirstTouch::Read),
            // The table's pages were mapped when the segment was opened.
            HeaderAt::Slot(slot) => {
                let offset = slot_offset(segment.len(), slot).ok_or_else(|| {
                    bad(format!(
                        "header slot {slot} is past the segment's table of {} slots",
                        table_slots(segment.len())
                    ))
                })?;
                (offset, FirstTouch::Read)
            }
        };
        let block = block_at(&segment, header_offset).ok_or_else(|| {
            bad(format!(
                "offset {data_offset} is outside the segment of {} bytes",
                segment.len()
            ))
        })?;
        let capacity = match block.live_capacity(touch, data_offset as u64) {
            Ok(capacity) => capacity as usize,
            Err(NotLive::NoBlock) => {
                return Err(bad(format!("no live block at offset {data_offset}")));
            }
            Err(NotLive::Released) => {
                return Err(bad(format!(
                    "the block at offset {data_offset} was already released"
                )));
            }
            Err(NotLive::OtherBlock) => {
                return Err(bad(format!(
                    "the header at offset {header_offset} belongs to another block than the one \
                     at offset {data_offset}"
                )));
            }
        };
        if size > capacity || segment.bytes(data_offset, capacity).is_none() {
            return Err(bad(format!(
                "{size} bytes at offset {data_offset} exceed the block's {capacity}"
            )));
        }
        Ok((
            ShmBuffer::new_block(segment, header_offset, data_offset, capacity),
            size,
        ))
    }

    /// [`ShmBuffer::adopt_block`] for a block that a block reference names (a ring's, or a
    /// ring entry's: `wire::encode_block_ref`), whose header is before its data.
    pub(crate) fn adopt_referenced_block(
        segment: Arc<Segment>,
        range: WireRange,
    ) -> Result<(ShmBuffer, usize), ShmError> {
        ShmBuffer::adopt_block(segment, range, HeaderAt::BeforeData)
    }

    /// The segment holding the bytes.
    pub fn segment(&self) -> &Arc<Segment> {
        self.segment_ref()
    }

    /// Offset of the first data byte in the segment.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Where a managed block's header is, as a descriptor says it.
    pub(crate) fn header_at(&self) -> HeaderAt {
        if self.header_offset + BLOCK_ALIGN == self.data_offset {
            HeaderAt::BeforeData
        } else {
            HeaderAt::Slot(header_slot(self.header_offset) as u32)
        }
    }

    /// Bytes the block (or range) holds, whatever a message uses of them.
    pub(crate) fn block_capacity(&self) -> usize {
        self.capacity
    }

    /// True for a range of an unmanaged region.
    pub fn is_region(&self) -> bool {
        matches!(self.release, Release::Region(..))
    }

    /// The region hint (0 for managed blocks).
    pub fn hint(&self) -> u64 {
        match &self.release {
            Release::Region(_, hint) => *hint,
            _ => 0,
        }
    }

    /// The references its block has now (`None` for a region's range), for tests that count
    /// them.
    #[cfg(test)]
    pub(crate) fn block_references(&self) -> Option<u32> {
        self.refs().map(|refs| refs.references())
    }

    /// A managed block's reference count (`None` for a region's range).
    fn refs(&self) -> Option<BlockRefs<'_, AtomicU32>> {
        match self.release {
            Release::Block => refs_at(self.segment_ref(), self.header_offset),
            _ => None,
        }
    }

    /// Adds `n` references for `n` more receivers of the same block (pub/sub fan-out).
    pub(crate) fn add_references(&self, n: u32) {
        if let Some(refs) = self.refs() {
            refs.add(n);
        }
    }

    /// Takes back `n` references added with [`ShmBuffer::add_references`] for receivers that did
    /// not get the block after all.
    pub(crate) fn release_references(&self, n: u32) {
        if let Some(refs) = self.refs() {
            refs.release(n);
        }
    }

    /// Gives up this handle without releasing its reference: the receiver now holds it.
    pub(crate) fn disarm(mut self) {
        self.release = Release::Nothing;
    }

    /// [`ShmBuffer::disarm`] through a shared borrow, for a handle still inside its message:
    /// the message's drop then releases nothing (and recycles the box), and the message is
    /// not moved, which matters right after a descriptor's stores (`ShmSocket::try_send_parts`).
    pub(crate) fn hand_on(&self) {
        self.handed_on.store(true, Ordering::Relaxed);
    }

    /// [`ShmBuffer::disarm`] for a boxed handle, keeping the box for the next buffer.
    pub(crate) fn disarm_boxed(mut self: Box<Self>) {
        self.release = Release::Nothing;
        self.keep_spare();
    }
}

impl MessageBuffer for ShmBuffer {
    fn as_bytes(&self) -> &[u8] {
        self.segment_ref()
            .bytes(self.data_offset, self.capacity)
            .expect("a buffer's range was checked when it was made")
    }

    fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        // Writable only by the single owner: a block with one reference held by this handle.
        // Region ranges belong to their creator, who writes them through the region.
        if !self.refs()?.is_sole_reference() {
            return None;
        }
        let (data_offset, capacity) = (self.data_offset, self.capacity);
        // SAFETY: this handle holds the block's only reference, in every process, so nobody else
        // reads or writes the range; the borrow of `self` keeps any other slice from this handle
        // from coexisting.
        unsafe { self.segment_ref().bytes_mut(data_offset, capacity) }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }

    fn transport_name(&self) -> &'static str {
        "shmem"
    }

    fn registrable_memory(&self) -> Option<ferromq_core::RegistrableMemory> {
        let segment = self.segment.as_ref()?;
        let (base, len) = segment.mapping_range();
        let owner: Arc<dyn Any + Send + Sync> = Arc::clone(segment) as _;
        Some(ferromq_core::RegistrableMemory {
            base: base as usize,
            len,
            owner,
        })
    }

    fn recycle(self: Box<Self>) {
        self.keep_spare();
    }
}

impl Drop for ShmBuffer {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Seek as _, SeekFrom};

    use super::*;

    /// The kernel's default fault-around: a read fault maps the page cache's pages of the
    /// 64 KiB-aligned window around the faulting address.
    const FAULT_AROUND: usize = 64 << 10;

    /// Whether the page at `address` is mapped in this process (`/proc/self/pagemap`, bit 63;
    /// readable without privileges, which only hide the frame numbers).
    fn is_mapped(pagemap: &mut std::fs::File, address: usize) -> bool {
        let mut entry = [0u8; 8];
        pagemap
            .seek(SeekFrom::Start((address / PAGE * 8) as u64))
            .and_then(|_| pagemap.read_exact(&mut entry))
            .expect("/proc/self/pagemap must be readable for this test");
        u64::from_le_bytes(entry) >> 63 == 1
    }

    /// Whether `/dev/shm` may be backed by huge pages (its `huge=` mount option, or the
    /// system's `shmem_enabled` forcing them): a fault there maps a whole huge page, read or
    /// write.
    fn dev_shm_may_use_huge_pages() -> bool {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let dev_shm_huge = mounts.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"/dev/shm")
                && fields.get(3).is_some_and(|options| {
                    options
                        .split(',')
                        .any(|option| option.starts_with("huge=") && option != "huge=never")
                })
        });
        let forced = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            .is_ok_and(|setting| setting.contains("[force]"));
        dev_shm_huge || forced
    }

    /// What a receiver maps adopting a large block made by `allocate` in memory it has not
    /// looked at: an 8 MiB segment gets a 1 MiB block, then the large one, both written (so
    /// that the large block's window holds nothing the receiver maps on opening the segment,
    /// and no hole); the receiver opens the segment as a session does (its table of headers
    /// mapped) and adopts the large block. Returns the large block and the pages of the
    /// fault-around window around the range right before its data (its header's, when the
    /// header is there) that the receiver mapped, as segment offsets. The window is where the
    /// kernel puts it: 64 KiB-aligned in the receiver's addresses.
    fn pages_a_receiver_maps_adopting(
        tag: &str,
        allocate: impl Fn(&OwnedSegment, usize) -> Option<ShmBuffer>,
    ) -> (ShmBuffer, Vec<usize>) {
        let object = crate::segment::TestObject::segment(tag);
        let name = object.0.clone();
        let owned = OwnedSegment::new(Segment::create(name.clone(), 8 << 20).unwrap());
        let mut first = owned.allocate(1 << 20).unwrap();
        first.as_bytes_mut().unwrap().fill(7);
        let mut large = allocate(&owned, FIRST_TOUCH_BY_WRITE_FROM).unwrap();
        large.as_bytes_mut().unwrap().fill(7);
        let before_data = large.data_offset() - BLOCK_ALIGN;

        let receiver = Arc::new(Segment::open(name.clone()).unwrap());
        map_header_table(&receiver);
        let base = receiver.mapping_range().0 as usize;
        let window_start = (base + before_data) / FAULT_AROUND * FAULT_AROUND - base;
        let window = window_start..window_start + FAULT_AROUND;
        let owner_base = owned.segment().mapping_range().0 as usize;
        let mut pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        for page in window.clone().step_by(PAGE) {
            assert!(
                is_mapped(&mut pagemap, owner_base + page),
                "the owner wrote the page at {page}"
            );
        }
        large.add_references(1);
        let range = WireRange {
            offset: large.data_offset() as u64,
            size: FIRST_TOUCH_BY_WRITE_FROM as u64,
        };
        let (adopted, used) =
            ShmBuffer::adopt_block(Arc::clone(&receiver), range, large.header_at()).unwrap();
        assert_eq!(used, FIRST_TOUCH_BY_WRITE_FROM);
        let mapped = window
            .step_by(PAGE)
            .filter(|&page| is_mapped(&mut pagemap, base + page))
            .collect();
        drop(adopted);
        (large, mapped)
    }

    /// A receiver adopting a large block whose header is before its data, in memory it has not
    /// looked at, maps the header's page only, none of the others of its fault-around window
    /// (the block's data, which it may never read, and the tail of the block before): its
    /// first touch of the header is a write. Read first, the kernel's fault-around maps every
    /// page of the window the owner wrote (issue 14's `call_buffer` of 64 MiB in memory new to
    /// the destination paid ~1.7 µs more for it). Not where `/dev/shm` may use huge pages: any
    /// fault there maps a huge page.
    #[test]
    fn a_large_block_new_to_its_receiver_maps_only_its_header_page() {
        if dev_shm_may_use_huge_pages() {
            eprintln!("skipped: /dev/shm may be backed by huge pages here");
            return;
        }
        let (large, mapped) = pages_a_receiver_maps_adopting(
            "first-touch",
            OwnedSegment::allocate_with_header_before_data,
        );
        assert_eq!(large.header_at(), HeaderAt::BeforeData);
        let header_page = (large.data_offset() - BLOCK_ALIGN) / PAGE * PAGE;
        assert_eq!(mapped, vec![header_page], "pages the receiver mapped");
    }

    /// A receiver adopting a large block whose header is in the table maps no page around the
    /// block at all: the table's pages were mapped when it opened the segment (issue 14's
    /// `call_buffer` of 64 MiB in memory new to its destination then costs what one of 4 KiB
    /// does).
    #[test]
    fn a_large_block_with_its_header_in_the_table_maps_no_page_of_its_receiver() {
        if dev_shm_may_use_huge_pages() {
            eprintln!("skipped: /dev/shm may be backed by huge pages here");
            return;
        }
        let (large, mapped) = pages_a_receiver_maps_adopting("table-touch", OwnedSegment::allocate);
        assert_eq!(
            large.header_at(),
            HeaderAt::Slot(1),
            "after the 1 MiB block's"
        );
        assert_eq!(mapped, Vec::<usize>::new(), "pages the receiver mapped");
    }

    /// Large message blocks take the table's slots while there are any, then have their
    /// headers before their data; a slot comes back when its block is reclaimed. Small blocks
    /// and blocks that a block reference names never take one.
    #[test]
    fn large_blocks_take_table_slots_while_there_are_any() {
        let object = crate::segment::TestObject::segment("table-slots");
        // Room for ~2000 blocks of the smallest large size, against 1024 slots.
        let owned = OwnedSegment::new(Segment::create(object.0.clone(), 128 << 20).unwrap());
        assert_eq!(data_start(128 << 20), HEADER_SIZE + MAX_TABLE_PAGES * PAGE);
        assert_eq!(table_slots(128 << 20), 1024);
        let small = owned.allocate(TABLE_HEADERS_FROM - 1).unwrap();
        assert_eq!(small.header_at(), HeaderAt::BeforeData);
        let referenced = owned
            .allocate_with_header_before_data(TABLE_HEADERS_FROM)
            .unwrap();
        assert_eq!(referenced.header_at(), HeaderAt::BeforeData);

        let mut blocks: Vec<ShmBuffer> = (0..1025)
            .map(|_| owned.allocate(TABLE_HEADERS_FROM).unwrap())
            .collect();
        let at: Vec<HeaderAt> = blocks.iter().map(ShmBuffer::header_at).collect();
        assert_eq!(at[..2], [HeaderAt::Slot(0), HeaderAt::Slot(1)]);
        assert_eq!(at[1023], HeaderAt::Slot(1023));
        assert_eq!(at[1024], HeaderAt::BeforeData, "the table is full");
        drop(blocks.swap_remove(7));
        owned.collect();
        assert_eq!(
            owned.allocate(TABLE_HEADERS_FROM).unwrap().header_at(),
            HeaderAt::Slot(7),
            "a reclaimed block's slot is taken again"
        );
    }

    /// A descriptor whose header slot is past the table, or holds another block's header, is
    /// refused, and names what is wrong.
    #[test]
    fn a_descriptor_naming_a_slot_of_another_block_or_none_is_refused() {
        let object = crate::segment::TestObject::segment("table-refusals");
        let owned = OwnedSegment::new(Segment::create(object.0.clone(), 8 << 20).unwrap());
        let first = owned.allocate(TABLE_HEADERS_FROM).unwrap();
        let second = owned.allocate(TABLE_HEADERS_FROM).unwrap();
        let range = WireRange {
            offset: second.data_offset() as u64,
            size: 1,
        };
        let adopt = |header| {
            ShmBuffer::adopt_block(Arc::clone(owned.segment()), range, header)
                .err()
                .expect("refused")
                .to_string()
        };
        assert!(adopt(first.header_at()).contains("belongs to another block"));
        assert!(adopt(HeaderAt::Slot(7 * 64)).contains("past the segment's table of 448 slots"));
        assert!(adopt(HeaderAt::BeforeData).contains("no live block"));
    }
}
