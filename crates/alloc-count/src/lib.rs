//! A global allocator that counts, for the tests that bound how often a hot path allocates
//! (issue 13 §4: a shmem message's life allocates nothing; issue 14: a `call_return`'s few).
//!
//! A test binary makes it its allocator and reads [`allocations`] around what it measures:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: ferromq_alloc_count::Counting = ferromq_alloc_count::Counting;
//!
//! let before = ferromq_alloc_count::allocations();
//! // ... the steady state being measured ...
//! let per_message = (ferromq_alloc_count::allocations() - before) as f64 / n as f64;
//! ```
//!
//! Every thread of the process counts, so a binary measures one thing at a time. An allocation
//! and a reallocation count one each; a free counts nothing. Everything else is the system
//! allocator's, unchanged.
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]
#![warn(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static N_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting allocations and reallocations.
pub struct Counting;

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        N_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        N_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations and reallocations made through [`Counting`] so far, by every thread.
pub fn allocations() -> u64 {
    N_ALLOCATIONS.load(Ordering::Relaxed)
}
