//! Recycled heap buffers for the zeromq transport's large messages.
//!
//! A sender that makes a new 1 MiB message for every send spent 14 % of its time zeroing it
//! (and more in page faults when the allocator handed fresh pages back and forth); FairMQ's
//! messages are not initialised at all. A message of [`MIN_POOLED`] bytes or more made by
//! `ZmqTransport::new_message` holds a [`PooledBuffer`]: when the message is done with it (its
//! bytes written to the socket, or the message dropped), the allocation goes back to a pool of
//! the thread that let it go, and the next message of exactly that size made on that thread
//! takes it as it is: no allocation, no zeroing. Its bytes are then those of an earlier message
//! of this process (initialised memory, never another process's), as with shmem's recycled
//! blocks: a sender writes what it sends.
//!
//! Per thread, so that taking and returning need no lock; bounded ([`MAX_KEPT`] buffers,
//! [`MAX_KEPT_BYTES`] bytes), so that a thread that only frees (a receiver) keeps little. A
//! buffer freed while its thread exits is simply freed.

use std::any::Any;
use std::cell::RefCell;
use std::collections::TryReserveError;
use std::sync::OnceLock;

use ferromq_core::{Message, MessageBuffer};

/// Messages smaller than this come from the allocator as usual: its own caches serve small
/// sizes as fast, and zeroing them is cheap.
pub(crate) const MIN_POOLED: usize = 64 << 10;
/// Buffers a thread keeps at most.
const MAX_KEPT: usize = 8;
/// Bytes a thread keeps at most.
const MAX_KEPT_BYTES: usize = 64 << 20;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A message of `size` bytes: a recycled buffer of that size when this thread has one, else a
/// new zeroed one; an error, not an abort, when the memory cannot be had.
pub(crate) fn message(size: usize) -> Result<Message, TryReserveError> {
    if size < MIN_POOLED {
        return Message::try_new(size);
    }
    let recycled = POOL
        .try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let found = pool.iter().rposition(|bytes| bytes.len() == size)?;
            Some(pool.swap_remove(found))
        })
        .ok()
        .flatten();
    let bytes = match recycled {
        Some(bytes) => bytes,
        None => zeroed(size)?,
    };
    Ok(Message::from_buffer(Box::new(PooledBuffer(bytes))))
}

/// `size` zero bytes from the allocator's zeroed allocation (`calloc`), not zeroes written:
/// memory fresh from the kernel is zero already and its pages are touched only when the message
/// is written or sent (FairMQ's messages are not initialised at all). A sender that runs ahead
/// of its peer by a full queue (1000 messages of 1 MiB before the peer takes any) otherwise
/// spent about a second of a 20 000-message run in the kernel clearing pages for its writes of
/// zeroes.
///
/// std has no fallible zeroed allocation, and `vec!` aborts where the allocator refuses: a
/// size over half of the machine's memory (RAM and swap), which the kernel may refuse, is asked
/// of the allocator first and then zeroed by writing (slow, and an error instead of an abort).
/// Below that the kernel's default overcommit policy gives the memory; with strict accounting
/// (`vm.overcommit_memory = 2`) on a machine out of memory a smaller one may still abort.
/// (Asking first at every size gave the memory back to the allocator's heap, whose `calloc`
/// then writes its zeroes itself.)
fn zeroed(size: usize) -> Result<Vec<u8>, TryReserveError> {
    if size <= largest_zeroed_at_once() {
        return Ok(vec![0; size]);
    }
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(size)?;
    bytes.resize(size, 0);
    Ok(bytes)
}

/// Half of the machine's RAM and swap, read once; 0 (every size asked first) when unknown.
fn largest_zeroed_at_once() -> usize {
    static LARGEST: OnceLock<usize> = OnceLock::new();
    *LARGEST.get_or_init(|| {
        nix::sys::sysinfo::sysinfo().map_or(0, |info| {
            usize::try_from(info.ram_total().saturating_add(info.swap_total()) / 2)
                .unwrap_or(usize::MAX)
        })
    })
}

/// A zeromq message's heap buffer that goes back to its thread's pool when the message is done.
pub(crate) struct PooledBuffer(Vec<u8>);

impl MessageBuffer for PooledBuffer {
    fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.0)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }

    fn transport_name(&self) -> &'static str {
        "zeromq"
    }

    fn recycle(self: Box<Self>) {
        let bytes = self.0;
        // During the thread's exit the pool may be gone: the buffer is freed instead.
        let _ = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let kept: usize = pool.iter().map(Vec::len).sum();
            if pool.len() < MAX_KEPT && kept + bytes.len() <= MAX_KEPT_BYTES {
                pool.push(bytes);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_buffer_comes_back_to_the_next_message_of_its_size_as_it_was() {
        let mut first = message(MIN_POOLED).unwrap();
        assert_eq!(first.memory_kind(), "zeromq");
        assert!(
            first.data().iter().all(|&byte| byte == 0),
            "a new buffer is zeroed"
        );
        first.data_mut()[0] = 42;
        let address = first.data().as_ptr();
        drop(first);
        let second = message(MIN_POOLED).unwrap();
        assert_eq!(second.data().as_ptr(), address, "the buffer was not reused");
        assert_eq!(second.data()[0], 42, "a recycled buffer keeps its bytes");
        // Written to a socket: the bytes handed over give the buffer back once dropped.
        let written = second.into_bytes();
        drop(written);
        assert_eq!(message(MIN_POOLED).unwrap().data().as_ptr(), address);
    }

    #[test]
    fn small_messages_are_plain_heap_and_impossible_sizes_are_errors() {
        assert_eq!(message(64).unwrap().memory_kind(), "heap");
        assert!(message(usize::MAX / 2).is_err());
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_buffers() {
        let messages: Vec<_> = (0..MAX_KEPT + 4)
            .map(|_| message(MIN_POOLED).unwrap())
            .collect();
        drop(messages);
        POOL.with(|pool| assert_eq!(pool.borrow().len(), MAX_KEPT));
    }
}
