//! Best-fit allocation of offsets, with coalescing: pure bookkeeping, no memory touched.
//!
//! Only a segment's owner process allocates from it, so this state lives in the owner's own
//! memory, behind a process-local mutex: no cross-process lock exists that a crashed process
//! could leave held, and no allocator state in shared memory can be left half-updated.
//! Receivers release blocks by decrementing the block's atomic reference count; the owner
//! reclaims blocks whose count reached zero (see `managed.rs`).
//!
//! # The recycling cache
//! A pipeline sends messages of a few sizes over and over. Splitting and coalescing ranges in
//! the two trees for every message was the sender's largest cost (a third of its CPU at 64 B),
//! so a freed range of a size seen recently is kept aside, uncoalesced, and the next request of
//! exactly that size takes it back without touching the trees. The cache holds at most
//! `MAX_CACHED_SIZES` sizes and a sixteenth of the space (64 MiB at most); when a request finds
//! no room, every cached range goes back to the trees, coalesced, before the allocator gives up,
//! so caching never makes an allocation fail that would have succeeded without it.

use std::collections::{BTreeMap, BTreeSet};

/// Distinct sizes the recycling cache keeps ranges of.
const MAX_CACHED_SIZES: usize = 8;
/// The cache's bound: this share of the space, and at most `MAX_CACHED_BYTES`.
const CACHED_SHARE: usize = 16;
const MAX_CACHED_BYTES: usize = 64 << 20;

/// Free space of one segment, as offset ranges.
#[derive(Debug, Clone)]
pub struct Allocator {
    by_offset: BTreeMap<usize, usize>,
    by_size: BTreeSet<(usize, usize)>,
    /// Free bytes, in the trees and in the cache.
    free_bytes: usize,
    /// Freed ranges kept whole for requests of the same size: (size, offsets), most recent last.
    cached: Vec<(usize, Vec<usize>)>,
    cached_bytes: usize,
    cache_limit: usize,
}

impl Allocator {
    /// All of `start..end` free.
    pub fn new(start: usize, end: usize) -> Allocator {
        let space = end.saturating_sub(start);
        let mut allocator = Allocator {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
            cached: Vec::new(),
            cached_bytes: 0,
            cache_limit: (space / CACHED_SHARE).min(MAX_CACHED_BYTES),
        };
        if end > start {
            allocator.insert(start, end - start);
        }
        allocator
    }

    fn insert(&mut self, offset: usize, size: usize) {
        self.by_offset.insert(offset, size);
        self.by_size.insert((size, offset));
        self.free_bytes += size;
    }

    fn take(&mut self, offset: usize, size: usize) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(size, offset));
        self.free_bytes -= size;
    }

    /// A free range of exactly `size` bytes: a cached one of that size, else the smallest free
    /// range of at least `size` bytes, split; its offset, or `None` when nothing fits even with
    /// every cached range coalesced.
    pub fn allocate(&mut self, size: usize) -> Option<usize> {
        if size == 0 {
            return None;
        }
        if let Some(offset) = self.take_cached(size) {
            return Some(offset);
        }
        if let Some(offset) = self.allocate_from_trees(size) {
            return Some(offset);
        }
        if self.cached_bytes == 0 {
            return None;
        }
        self.flush();
        self.allocate_from_trees(size)
    }

    /// A cached range of exactly `size` bytes, if the cache has one.
    pub fn take_cached(&mut self, size: usize) -> Option<usize> {
        let class = self.cached.iter_mut().find(|(cached, _)| *cached == size)?;
        let offset = class.1.pop()?;
        self.cached_bytes -= size;
        self.free_bytes -= size;
        Some(offset)
    }

    /// Whether the cache holds a range of exactly `size` bytes.
    pub fn has_cached(&self, size: usize) -> bool {
        self.cached
            .iter()
            .any(|(cached, offsets)| *cached == size && !offsets.is_empty())
    }

    fn allocate_from_trees(&mut self, size: usize) -> Option<usize> {
        let &(found_size, offset) = self.by_size.range((size, 0)..).next()?;
        self.take(offset, found_size);
        if found_size > size {
            self.insert(offset + size, found_size - size);
        }
        Some(offset)
    }

    /// Returns `offset..offset + size`: into the cache when its size is cached (or can be) and
    /// the cache has room, otherwise merged with its free neighbours.
    pub fn free(&mut self, offset: usize, size: usize) {
        if self.cached_bytes + size <= self.cache_limit {
            let class = match self.cached.iter().position(|(cached, _)| *cached == size) {
                Some(class) => Some(class),
                None if self.cached.len() < MAX_CACHED_SIZES => {
                    self.cached.push((size, Vec::new()));
                    Some(self.cached.len() - 1)
                }
                None => None,
            };
            if let Some(class) = class {
                self.cached[class].1.push(offset);
                self.cached_bytes += size;
                self.free_bytes += size;
                return;
            }
        }
        self.coalesce(offset, size);
    }

    /// Returns every cached range to the trees, coalesced with its neighbours.
    pub fn flush(&mut self) {
        for (size, offsets) in std::mem::take(&mut self.cached) {
            for offset in offsets {
                self.free_bytes -= size;
                self.coalesce(offset, size);
            }
        }
        self.cached_bytes = 0;
    }

    fn coalesce(&mut self, offset: usize, size: usize) {
        let (mut start, mut len) = (offset, size);
        if let Some((&before, &before_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(
                before + before_len <= offset,
                "double free or overlap at {offset}"
            );
            if before + before_len == offset {
                self.take(before, before_len);
                start = before;
                len += before_len;
            }
        }
        if let Some(&after_len) = self.by_offset.get(&(offset + size)) {
            self.take(offset + size, after_len);
            len += after_len;
        }
        self.insert(start, len);
    }

    /// Free bytes in total.
    pub fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// The largest free range (a cached one counts: it serves requests of its size).
    pub fn largest_free(&self) -> usize {
        let cached = self
            .cached
            .iter()
            .filter(|(_, offsets)| !offsets.is_empty())
            .map(|&(size, _)| size);
        self.by_size
            .last()
            .map(|&(size, _)| size)
            .into_iter()
            .chain(cached)
            .max()
            .unwrap_or(0)
    }

    /// Number of separate free ranges, cached ones included (1 when nothing is allocated and the
    /// cache was flushed).
    pub fn n_free_ranges(&self) -> usize {
        self.by_offset.len()
            + self
                .cached
                .iter()
                .map(|(_, offsets)| offsets.len())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_splits_and_coalesces() {
        let mut allocator = Allocator::new(0, 1000);
        let a = allocator.allocate(100).unwrap();
        let b = allocator.allocate(200).unwrap();
        let c = allocator.allocate(100).unwrap();
        assert_eq!((a, b, c), (0, 100, 300));
        allocator.free(b, 200);
        // Best fit: a 150-byte request takes the 200-byte hole, not the 600-byte tail.
        assert_eq!(allocator.allocate(150), Some(100));
        allocator.free(100, 150);
        allocator.free(a, 100);
        allocator.free(c, 100);
        assert_eq!(allocator.n_free_ranges(), 1);
        assert_eq!(allocator.free_bytes(), 1000);
        assert_eq!(allocator.largest_free(), 1000);
        assert_eq!(allocator.allocate(1001), None);
    }

    #[test]
    fn random_churn_returns_to_one_free_range() {
        // A small deterministic generator keeps the test reproducible.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut allocator = Allocator::new(4096, 4096 + (1 << 20));
        let mut live: Vec<(usize, usize)> = Vec::new();
        for _ in 0..20_000 {
            if live.is_empty() || next() % 3 != 0 {
                let size = 64 * (1 + (next() % 64) as usize);
                if let Some(offset) = allocator.allocate(size) {
                    assert!(
                        live.iter()
                            .all(|&(o, s)| offset + size <= o || o + s <= offset),
                        "overlap"
                    );
                    live.push((offset, size));
                }
            } else {
                let idx = (next() as usize) % live.len();
                let (offset, size) = live.swap_remove(idx);
                allocator.free(offset, size);
            }
        }
        for (offset, size) in live.drain(..) {
            allocator.free(offset, size);
        }
        assert_eq!(allocator.free_bytes(), 1 << 20);
        allocator.flush();
        assert_eq!(allocator.free_bytes(), 1 << 20);
        assert_eq!(allocator.n_free_ranges(), 1);
    }

    #[test]
    fn a_freed_range_serves_the_next_request_of_its_size() {
        let mut allocator = Allocator::new(0, 1 << 20);
        let a = allocator.allocate(128).unwrap();
        let b = allocator.allocate(128).unwrap();
        allocator.free(a, 128);
        // Cached, not coalesced with the free tail: the same range comes back.
        assert_eq!(allocator.n_free_ranges(), 2);
        assert_eq!(allocator.allocate(128), Some(a));
        allocator.free(b, 128);
        allocator.free(a, 128);
        assert_eq!(allocator.free_bytes(), 1 << 20);
        // The most recently freed first: its memory is the warmest.
        assert_eq!(allocator.allocate(128), Some(a));
    }

    #[test]
    fn the_cache_never_makes_an_allocation_fail() {
        // Fill the space with small blocks, free them all (into the cache as far as it goes),
        // then ask for the whole space: the cache is coalesced back and the request succeeds.
        let mut allocator = Allocator::new(0, 64 << 10);
        let blocks: Vec<usize> = (0..1024).map(|_| allocator.allocate(64).unwrap()).collect();
        assert_eq!(allocator.allocate(64), None);
        for offset in blocks {
            allocator.free(offset, 64);
        }
        assert!(allocator.n_free_ranges() > 1, "some ranges were cached");
        assert_eq!(allocator.allocate(64 << 10), Some(0));
        assert_eq!(allocator.free_bytes(), 0);
    }

    #[test]
    fn the_cache_keeps_few_sizes_and_a_bounded_share() {
        let mut allocator = Allocator::new(0, 1 << 20);
        // Sizes 64, 128, ... 64 * 12: only MAX_CACHED_SIZES of them are cached.
        let blocks: Vec<(usize, usize)> = (1..=12)
            .map(|n| (allocator.allocate(64 * n).unwrap(), 64 * n))
            .collect();
        for &(offset, size) in &blocks {
            allocator.free(offset, size);
        }
        assert_eq!(allocator.cached.len(), MAX_CACHED_SIZES);
        assert!(allocator.cached_bytes <= allocator.cache_limit);
        allocator.flush();
        assert_eq!(allocator.n_free_ranges(), 1);
        assert_eq!(allocator.free_bytes(), 1 << 20);
    }
}
