//! Recycled buffers for the zeromq transport's large messages.
//!
//! A sender that makes a new 1 MiB message for every send spent 14 % of its time zeroing it
//! (and more in page faults when the allocator handed fresh pages back and forth); FairMQ's
//! messages are not initialised at all. A message of [`MIN_POOLED`] bytes or more made by
//! `ZmqTransport::new_message` holds a [`PooledBuffer`]: when the message is done with it (its
//! bytes written to the socket, or the message dropped), the buffer goes back to a pool of
//! the thread that let it go, and the next message of exactly that size made on that thread
//! takes it as it is: no allocation, no zeroing. Its bytes are then those of an earlier message
//! of this process (initialised memory, never another process's), as with shmem's recycled
//! blocks: a sender writes what it sends.
//!
//! A new buffer of [`MIN_MAPPED`] bytes or more is an anonymous mapping of its own (what
//! glibc's `malloc` gives such sizes until its first `free` of one, after which it serves them
//! from its heap and `calloc` writes their zeroes): zero from the kernel without a write, its
//! pages touched only once the message is written or sent, and given back to the kernel when
//! dropped. Writing zeroes into 1 GiB of new memory (a sender filling its 1000-message queue of
//! 1 MiB before its peer takes any) made the kernel clear every page first: 22 % of a
//! 10 000-message run's sampler.
//!
//! Per thread, so that taking and returning need no lock; bounded ([`MAX_KEPT`] buffers,
//! [`MAX_KEPT_BYTES`] bytes), so that a thread that only frees (a receiver) keeps little. A
//! buffer freed while its thread exits is simply freed.

use std::any::Any;
use std::cell::RefCell;
use std::collections::TryReserveError;

use ferromq_core::{Message, MessageBuffer};
use memmap2::MmapMut;

/// Messages smaller than this come from the allocator as usual: its own caches serve small
/// sizes as fast, and zeroing them is cheap.
pub(crate) const MIN_POOLED: usize = 64 << 10;
/// Buffers a thread keeps at most: more than a writer lets go at once (a batch of up to 1 MiB,
/// 16 messages of 64 KiB), or a sender's next batch maps half its buffers anew (8 kept: 64 KiB
/// messages 14 % slower).
const MAX_KEPT: usize = 64;
/// Bytes a thread keeps at most.
const MAX_KEPT_BYTES: usize = 64 << 20;

/// Buffers from this size on are anonymous mappings of their own (see the module's docs); below
/// it, heap memory zeroed by writing, which the allocator recycles warm (64 KiB messages ran
/// 6 % slower as mappings, interleaved device pairs).
const MIN_MAPPED: usize = 256 << 10;

thread_local! {
    static POOL: RefCell<Vec<Memory>> = const { RefCell::new(Vec::new()) };
}

/// A message of `size` bytes: a recycled buffer of that size when this thread has one, else a
/// new zeroed one; an error, not an abort, when the memory cannot be had.
pub(crate) fn message(size: usize) -> std::io::Result<Message> {
    let out_of_memory =
        |error: TryReserveError| std::io::Error::new(std::io::ErrorKind::OutOfMemory, error);
    if size < MIN_POOLED {
        return Message::try_new(size).map_err(out_of_memory);
    }
    let recycled = POOL
        .try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let found = pool.iter().rposition(|memory| memory.len() == size)?;
            Some(pool.swap_remove(found))
        })
        .ok()
        .flatten();
    let memory = match recycled {
        Some(memory) => memory,
        None if size >= MIN_MAPPED => Memory::Mapped(MmapMut::map_anon(size)?),
        None => {
            let mut bytes = Vec::new();
            bytes.try_reserve_exact(size).map_err(out_of_memory)?;
            bytes.resize(size, 0);
            Memory::Heap(bytes)
        }
    };
    Ok(Message::from_buffer(Box::new(PooledBuffer(memory))))
}

/// The memory of a [`PooledBuffer`].
enum Memory {
    Heap(Vec<u8>),
    Mapped(MmapMut),
}

impl Memory {
    fn len(&self) -> usize {
        self.bytes().len()
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Memory::Heap(bytes) => bytes,
            Memory::Mapped(mapping) => mapping,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Memory::Heap(bytes) => bytes,
            Memory::Mapped(mapping) => mapping,
        }
    }
}

/// A zeromq message's buffer that goes back to its thread's pool when the message is done.
pub(crate) struct PooledBuffer(Memory);

impl MessageBuffer for PooledBuffer {
    fn as_bytes(&self) -> &[u8] {
        self.0.bytes()
    }

    fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(self.0.bytes_mut())
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
        let memory = self.0;
        // During the thread's exit the pool may be gone: the buffer is freed instead.
        let _ = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let kept: usize = pool.iter().map(Memory::len).sum();
            if pool.len() < MAX_KEPT && kept + memory.len() <= MAX_KEPT_BYTES {
                pool.push(memory);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_buffer_comes_back_to_the_next_message_of_its_size_as_it_was() {
        // Heap memory, then a mapping of its own.
        for size in [MIN_POOLED, MIN_MAPPED] {
            let mut first = message(size).unwrap();
            assert_eq!(first.memory_kind(), "zeromq");
            let mapped = first
                .buffer()
                .and_then(|buffer| buffer.as_any().downcast_ref::<PooledBuffer>())
                .map(|pooled| matches!(pooled.0, Memory::Mapped(_)));
            assert_eq!(mapped, Some(size >= MIN_MAPPED), "{size} bytes");
            assert!(
                first.data().iter().all(|&byte| byte == 0),
                "a new buffer of {size} bytes is zeroed"
            );
            first.data_mut()[size - 1] = 42;
            let address = first.data().as_ptr();
            drop(first);
            let second = message(size).unwrap();
            assert_eq!(second.data().as_ptr(), address, "{size}: not reused");
            assert_eq!(
                second.data()[size - 1],
                42,
                "a recycled buffer keeps its bytes"
            );
            // Written to a socket: the bytes handed over give the buffer back once dropped.
            let written = second.into_bytes();
            drop(written);
            assert_eq!(message(size).unwrap().data().as_ptr(), address);
        }
    }

    #[test]
    fn small_messages_are_plain_heap_and_impossible_sizes_are_errors() {
        assert_eq!(message(64).unwrap().memory_kind(), "heap");
        // More than the kernel maps: an error, not an abort.
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
