//! The lock around state that the sending path takes once or twice per message (the owner's
//! allocator, a push socket's outbox of rings, a publisher's subscribers, the ring of a pair's,
//! req's or rep's connection): a spin lock whose release is a plain store.
//!
//! Why not `std::sync::Mutex`: its release is an atomic swap, a locked instruction, and a locked
//! instruction waits until every store before it has left the core. Inside these sections the
//! sender writes shared memory that the receiver's core reads (a ring entry, a block's header),
//! so each release waited for those cache lines to be taken back from the other core: the two
//! swaps per message were ~15 % of a 64 B sender. A release by plain store lets the stores
//! drain while the sender goes on. Taking the lock is still one compare-and-swap.
//!
//! Contention is rare (the sender against its socket's task, a `collect`, or an allocation that
//! found the segment full and asks the sockets to let their ended connections' rings go) and
//! the sections are short and never await; a waiter yields its thread between looks (`spin`'s
//! `Yield` strategy), so a holder that was preempted is not starved by a spinning waiter. There
//! is no poisoning: a panic inside a section (none of them panics on any input) releases the
//! lock.

/// A short-held lock (see the module docs).
pub(crate) struct ShortLock<T>(spin::mutex::SpinMutex<T, spin::relax::Yield>);

impl<T> ShortLock<T> {
    pub(crate) const fn new(value: T) -> ShortLock<T> {
        ShortLock(spin::mutex::SpinMutex::new(value))
    }

    /// Waits for the lock (yielding the thread between looks) and takes it.
    pub(crate) fn lock(&self) -> spin::mutex::SpinMutexGuard<'_, T, spin::relax::Yield> {
        self.0.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::ShortLock;

    #[test]
    fn threads_that_share_a_short_lock_lose_no_update() {
        let lock = ShortLock::new(0u64);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..20_000 {
                        // A read and a write apart: without exclusion, updates would be lost.
                        let mut value = lock.lock();
                        let seen = *value;
                        *value = std::hint::black_box(seen) + 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), 80_000);
    }
}
