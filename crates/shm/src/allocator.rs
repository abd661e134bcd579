//! Best-fit allocation of offsets, with coalescing: pure bookkeeping, no memory touched.
//!
//! Only a segment's owner process allocates from it, so this state lives in the owner's own
//! memory, behind a process-local mutex: no cross-process lock exists that a crashed process
//! could leave held, and no allocator state in shared memory can be left half-updated.
//! Receivers release blocks by decrementing the block's atomic reference count; the owner
//! reclaims blocks whose count reached zero (see `managed.rs`).

use std::collections::{BTreeMap, BTreeSet};

/// Free space of one segment, as offset ranges.
#[derive(Debug, Clone)]
pub struct Allocator {
    by_offset: BTreeMap<usize, usize>,
    by_size: BTreeSet<(usize, usize)>,
    free_bytes: usize,
}

impl Allocator {
    /// All of `start..end` free.
    pub fn new(start: usize, end: usize) -> Allocator {
        let mut allocator = Allocator {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
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

    /// The smallest free range of at least `size` bytes, split; its offset, or `None`.
    pub fn allocate(&mut self, size: usize) -> Option<usize> {
        if size == 0 {
            return None;
        }
        let &(found_size, offset) = self.by_size.range((size, 0)..).next()?;
        self.take(offset, found_size);
        if found_size > size {
            self.insert(offset + size, found_size - size);
        }
        Some(offset)
    }

    /// Returns `offset..offset + size`, merging it with free neighbours.
    pub fn free(&mut self, offset: usize, size: usize) {
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

    /// The largest free range.
    pub fn largest_free(&self) -> usize {
        self.by_size.last().map_or(0, |&(size, _)| size)
    }

    /// Number of separate free ranges (1 when nothing is allocated).
    pub fn n_free_ranges(&self) -> usize {
        self.by_offset.len()
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
        assert_eq!(allocator.n_free_ranges(), 1);
    }
}
