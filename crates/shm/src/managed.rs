//! Managed segments: blocks allocated by the segment's owner, released by whoever drops the last
//! reference, in any process.
//!
//! # Block layout
//! Each block is a 64-byte header followed by its data, both 64-byte aligned:
//! `refcount: AtomicU32 | magic: AtomicU32 | capacity: AtomicU64 | ...`. The descriptor that travels
//! names the data offset; the receiver finds the header just before it and checks the magic, the
//! capacity and the reference count before touching a byte.
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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use ferromq_core::MessageBuffer;

use crate::allocator::Allocator;
use crate::error::ShmError;
use crate::protocol::{BlockCells, FirstTouch, NotLive};
use crate::segment::{HEADER_SIZE, Segment};
use crate::wire::WireRange;

/// Alignment of blocks and their headers.
pub const BLOCK_ALIGN: usize = 64;

fn align_up(size: usize) -> usize {
    size.div_ceil(BLOCK_ALIGN).max(1) * BLOCK_ALIGN
}

struct OwnerState {
    allocator: Allocator,
    /// Blocks handed out and not yet reclaimed: (header offset, total bytes), oldest first.
    outstanding: VecDeque<(usize, usize)>,
    /// Blocks that live as long as a socket (descriptor rings): kept apart, so that one of them
    /// at the front of `outstanding` does not hold back the reclaiming of every later block.
    long_lived: Vec<(usize, usize)>,
}

/// A segment this process created and allocates from.
pub struct OwnedSegment {
    segment: Arc<Segment>,
    state: crate::lock::ShortLock<OwnerState>,
}

impl OwnedSegment {
    /// Takes ownership of a freshly created segment.
    pub fn new(segment: Segment) -> OwnedSegment {
        let allocator = Allocator::new(HEADER_SIZE, segment.len());
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
            }),
        }
    }

    /// The segment.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// Bytes a message can have at most in this segment.
    pub fn max_message_size(&self) -> usize {
        self.segment.len() - HEADER_SIZE - BLOCK_ALIGN
    }

    /// A block of at least `size` bytes with one reference, or `None` when there is no room now.
    pub fn allocate(&self, size: usize) -> Option<ShmBuffer> {
        let capacity = align_up(size);
        let total = capacity + BLOCK_ALIGN;
        let mut state = self.state.lock();
        // A recycled block of this size first; released blocks are reclaimed (which refills
        // the cache) only when it has none, so the receivers' reference counts are read in
        // runs, not one cache miss per allocation.
        let (header_offset, from_cache) = match state.allocator.take_cached(total) {
            Some(offset) => (offset, true),
            None => (self.reclaim_and_allocate(&mut state, total)?, false),
        };
        self.publish_block(header_offset, capacity);
        state.outstanding.push_back((header_offset, total));
        // A recycled range leaves the largest free range as it was unless it was the last of
        // its size: then only the counts change (the tree lookup was 1-2 % of the sender).
        if from_cache && state.allocator.has_cached(total) {
            self.publish_counts(&state);
        } else {
            self.publish_usage(&state);
        }
        drop(state);
        Some(self.handle(header_offset, capacity))
    }

    /// A block that will live as long as a socket (a descriptor ring), from the free ranges
    /// (not the recycling cache); reclaimed like any other once unreferenced.
    pub fn allocate_long_lived(&self, size: usize) -> Option<ShmBuffer> {
        let capacity = align_up(size);
        let total = capacity + BLOCK_ALIGN;
        let mut state = self.state.lock();
        let header_offset = self.reclaim_and_allocate(&mut state, total)?;
        self.publish_block(header_offset, capacity);
        state.long_lived.push((header_offset, total));
        self.publish_usage(&state);
        drop(state);
        Some(self.handle(header_offset, capacity))
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

    /// Makes the block at `header_offset` live with one reference.
    fn publish_block(&self, header_offset: usize, capacity: usize) {
        block_at(&self.segment, header_offset)
            .expect("allocated blocks lie inside the segment")
            .publish(capacity as u64);
    }

    /// The handle of the block just published at `header_offset`.
    fn handle(&self, header_offset: usize, capacity: usize) -> ShmBuffer {
        ShmBuffer::new_block(
            Arc::clone(&self.segment),
            header_offset + BLOCK_ALIGN,
            capacity,
        )
    }

    /// Frees blocks nobody references: the oldest ones in order, or all of them when `everything`.
    fn reclaim(&self, state: &mut OwnerState, everything: bool) {
        let released = |segment: &Segment, header_offset: usize| {
            block_at(segment, header_offset).is_some_and(|block| block.is_released())
        };
        let mut n_freed = 0;
        if everything {
            let mut kept = VecDeque::with_capacity(state.outstanding.len());
            while let Some((offset, total)) = state.outstanding.pop_front() {
                if released(&self.segment, offset) {
                    self.release(&mut state.allocator, offset, total);
                    n_freed += 1;
                } else {
                    kept.push_back((offset, total));
                }
            }
            state.outstanding = kept;
        } else {
            while let Some(&(offset, total)) = state.outstanding.front() {
                if !released(&self.segment, offset) {
                    break;
                }
                state.outstanding.pop_front();
                self.release(&mut state.allocator, offset, total);
                n_freed += 1;
            }
        }
        let mut long_lived = std::mem::take(&mut state.long_lived);
        long_lived.retain(|&(offset, total)| {
            let free = released(&self.segment, offset);
            if free {
                self.release(&mut state.allocator, offset, total);
                n_freed += 1;
            }
            !free
        });
        state.long_lived = long_lived;
        if n_freed > 0 {
            self.publish_usage(state);
        }
    }

    fn release(&self, allocator: &mut Allocator, header_offset: usize, total: usize) {
        if let Some(block) = block_at(&self.segment, header_offset) {
            block.retire();
        }
        allocator.free(header_offset, total);
    }

    /// Publishes the bytes in use and the live blocks in the segment's header (what `ferromq shm
    /// list`, `top` and the metrics read).
    fn publish_counts(&self, state: &OwnerState) {
        let header = self.segment.header();
        let data_size = self.segment.len() - HEADER_SIZE;
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
        self.segment.len() - HEADER_SIZE
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

/// The header of the block at `header_offset`, `None` outside the segment.
fn block_at(segment: &Segment, header_offset: usize) -> Option<BlockHeader<'_>> {
    Some(BlockCells {
        refcount: segment.atomic_u32(header_offset)?,
        magic: segment.atomic_u32(header_offset + 4)?,
        capacity: segment.atomic_u64(header_offset + 8)?,
    })
}

/// What a [`ShmBuffer`] releases when it drops.
enum Release {
    /// One reference of a managed block.
    Block,
    /// A region buffer: the creator is told through its acknowledgement queue.
    Region(Arc<dyn Fn(u64, u64, u64) + Send + Sync>, u64),
    /// Nothing (the handle was sent on).
    Nothing,
}

/// A message buffer in shared memory: a managed block or a range of an unmanaged region.
pub struct ShmBuffer {
    /// `None` only in a recycled buffer waiting in a spare list, which nobody else sees.
    segment: Option<Arc<Segment>>,
    data_offset: usize,
    capacity: usize,
    release: Release,
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
        match std::mem::replace(&mut self.release, Release::Nothing) {
            Release::Block => {
                if let Some(segment) = &self.segment
                    && let Some(block) = block_at(segment, self.data_offset - BLOCK_ALIGN)
                {
                    block.release(1);
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

    fn new_block(segment: Arc<Segment>, data_offset: usize, capacity: usize) -> ShmBuffer {
        ShmBuffer {
            segment: Some(segment),
            data_offset,
            capacity,
            release: Release::Block,
        }
    }

    /// A region range whose release calls `acknowledge(offset, size, hint)`.
    pub(crate) fn new_region(
        segment: Arc<Segment>,
        data_offset: usize,
        size: usize,
        acknowledge: Arc<dyn Fn(u64, u64, u64) + Send + Sync>,
        hint: u64,
    ) -> ShmBuffer {
        ShmBuffer {
            segment: Some(segment),
            data_offset,
            capacity: size,
            release: Release::Region(acknowledge, hint),
        }
    }

    /// Takes over one reference of the block `range` names in `segment` (its data offset and
    /// the bytes used), as a descriptor from the wire says, after checking that it is a live
    /// block holding that many bytes; returns it with the bytes used.
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] for anything that is not a live block of that size.
    pub(crate) fn adopt_block(
        segment: Arc<Segment>,
        range: WireRange,
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
        if !data_offset.is_multiple_of(BLOCK_ALIGN) || data_offset < HEADER_SIZE + BLOCK_ALIGN {
            return Err(bad(format!("offset {data_offset} is not a block offset")));
        }
        let block = block_at(&segment, data_offset - BLOCK_ALIGN).ok_or_else(|| {
            bad(format!(
                "offset {data_offset} is outside the segment of {} bytes",
                segment.len()
            ))
        })?;
        let touch = if size >= FIRST_TOUCH_BY_WRITE_FROM {
            FirstTouch::Write
        } else {
            FirstTouch::Read
        };
        let capacity = match block.live_capacity(touch) {
            Ok(capacity) => capacity as usize,
            Err(NotLive::NoBlock) => {
                return Err(bad(format!("no live block at offset {data_offset}")));
            }
            Err(NotLive::Released) => {
                return Err(bad(format!(
                    "the block at offset {data_offset} was already released"
                )));
            }
        };
        if size > capacity || segment.bytes(data_offset, capacity).is_none() {
            return Err(bad(format!(
                "{size} bytes at offset {data_offset} exceed the block's {capacity}"
            )));
        }
        Ok((ShmBuffer::new_block(segment, data_offset, capacity), size))
    }

    /// The segment holding the bytes.
    pub fn segment(&self) -> &Arc<Segment> {
        self.segment_ref()
    }

    /// Offset of the first data byte in the segment.
    pub fn data_offset(&self) -> usize {
        self.data_offset
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
        self.block().map(|block| block.references())
    }

    fn block(&self) -> Option<BlockHeader<'_>> {
        match self.release {
            Release::Block => block_at(self.segment_ref(), self.data_offset - BLOCK_ALIGN),
            _ => None,
        }
    }

    /// Adds `n` references for `n` more receivers of the same block (pub/sub fan-out).
    pub(crate) fn add_references(&self, n: u32) {
        if let Some(block) = self.block() {
            block.add(n);
        }
    }

    /// Takes back `n` references added with [`ShmBuffer::add_references`] for receivers that did
    /// not get the block after all.
    pub(crate) fn release_references(&self, n: u32) {
        if let Some(block) = self.block() {
            block.release(n);
        }
    }

    /// Gives up this handle without releasing its reference: the receiver now holds it.
    pub(crate) fn disarm(mut self) {
        self.release = Release::Nothing;
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
        let block = self.block()?;
        if !block.is_sole_reference() {
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

    const PAGE: usize = 4096;
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

    /// A receiver adopting a large block in memory it has not looked at maps the header's page
    /// only, none of the others of its fault-around window (the block's data, which it may
    /// never read, and the tail of the block before): its first touch of the header is a
    /// write. Read first, the kernel's fault-around maps every page of the window the owner
    /// wrote (issue 14's `call_buffer` of 64 MiB in memory new to the destination paid
    /// ~1.7 µs more for it). The window is where the kernel puts it: 64 KiB-aligned in the
    /// receiver's addresses. Not where `/dev/shm` may use huge pages: any fault there maps
    /// a huge page.
    #[test]
    fn a_large_block_new_to_its_receiver_maps_only_its_header_page() {
        if dev_shm_may_use_huge_pages() {
            eprintln!("skipped: /dev/shm may be backed by huge pages here");
            return;
        }
        let object = crate::segment::TestObject::segment("first-touch");
        let name = object.0.clone();
        let owned = OwnedSegment::new(Segment::create(name.clone(), 8 << 20).unwrap());
        // A block first, so that the large one's window holds nothing the receiver maps on
        // opening the segment (its header page); written, so that the window has no hole.
        let mut first = owned.allocate(1 << 20).unwrap();
        first.as_bytes_mut().unwrap().fill(7);
        let mut large = owned.allocate(FIRST_TOUCH_BY_WRITE_FROM).unwrap();
        large.as_bytes_mut().unwrap().fill(7);
        let header = large.data_offset() - BLOCK_ALIGN;

        // The receiver's own mapping of the segment, as another process has, and the window
        // around the header in it, as segment offsets.
        let receiver = Arc::new(Segment::open(name.clone()).unwrap());
        let base = receiver.mapping_range().0 as usize;
        let window_start = (base + header) / FAULT_AROUND * FAULT_AROUND - base;
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
        let (adopted, used) = ShmBuffer::adopt_block(Arc::clone(&receiver), range).unwrap();
        assert_eq!(used, FIRST_TOUCH_BY_WRITE_FROM);

        let header_page = header / PAGE * PAGE;
        let mapped: Vec<usize> = window
            .step_by(PAGE)
            .filter(|&page| is_mapped(&mut pagemap, base + page))
            .collect();
        assert_eq!(mapped, vec![header_page], "pages the receiver mapped");
        drop(adopted);
    }
}
