//! Small messages: payloads that travel inside their descriptor instead of in a block.
//!
//! A block costs its sender an allocation and a reclaim in its segment, and its receiver a look
//! at the block's header and payload: lines the other process wrote, each a cache miss on the
//! critical path, for 64 bytes that fit in the descriptor itself. So a message of at most
//! [`SMALL_MESSAGE_MAX`] bytes (and at most `shm-inline-max`) that the transport makes lives in
//! process memory, and its bytes are copied into the ring entry or frame that describes it
//! (wire part kind 0, "inline", which already carried small heap messages); the receiver copies
//! them out into a message of its own. As with a network card's inline sends, copying a few
//! bytes is cheaper than describing them.
//!
//! Neither copy allocates in steady state: the buffers come from a per-thread list of spare
//! ones that finished messages return to (as [`crate::managed`] keeps spare boxes), up to
//! [`MAX_SPARE_SMALL`] of them, each at most [`SMALL_MESSAGE_MAX`] bytes of capacity: larger
//! inline payloads (a raised `shm-inline-max`) are allocated and freed as before.
//!
//! A message of at most `shm-inline-max` bytes that lies in a block travels inline too
//! (`socket.rs`, `travels_inline`): its sender releases the block itself.
//!
//! Nothing here is shared between processes: a crash or a dropped peer concerns no such buffer.

use std::any::Any;
use std::cell::RefCell;

use ferromq_core::{Message, MessageBuffer};

/// The largest message the transport makes in process memory to travel inline (at most
/// `shm-inline-max` too); larger ones are blocks of the segment.
pub const SMALL_MESSAGE_MAX: usize = 256;

/// Spare buffers kept per thread.
pub const MAX_SPARE_SMALL: usize = 1024;

thread_local! {
    /// Buffers of messages finished on this thread, empty, for its next small payloads.
    #[allow(clippy::vec_box, reason = "the boxes themselves are what is kept for reuse")]
    static SPARE_SMALL: RefCell<Vec<Box<SmallBuffer>>> = const { RefCell::new(Vec::new()) };
}

/// A small payload in process memory: the buffer of a message made by the transport, or of one
/// received inline.
#[derive(Debug)]
pub struct SmallBuffer {
    bytes: Vec<u8>,
}

impl SmallBuffer {
    /// A buffer holding a copy of `bytes`, from the spare list when it has one.
    fn boxed_copy_of(bytes: &[u8]) -> Box<SmallBuffer> {
        // `try_with` fails only while the thread is being torn down: then allocate.
        let spare = SPARE_SMALL
            .try_with(|spare| spare.borrow_mut().pop())
            .ok()
            .flatten();
        match spare {
            Some(mut buffer) => {
                buffer.bytes.clear();
                buffer.bytes.extend_from_slice(bytes);
                buffer
            }
            None => {
                let mut buffer = Vec::with_capacity(bytes.len().max(SMALL_MESSAGE_MAX));
                buffer.extend_from_slice(bytes);
                Box::new(SmallBuffer { bytes: buffer })
            }
        }
    }

    /// Back to this thread's spare list, when it has room and the buffer is not oversized.
    fn keep(mut self: Box<Self>) {
        if self.bytes.capacity() > SMALL_MESSAGE_MAX {
            return;
        }
        self.bytes.clear();
        let _ = SPARE_SMALL.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < MAX_SPARE_SMALL {
                spare.push(self);
            }
        });
    }
}

impl MessageBuffer for SmallBuffer {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.bytes)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
    fn transport_name(&self) -> &'static str {
        crate::ShmTransport::NAME
    }
    fn recycle(self: Box<Self>) {
        self.keep();
    }
}

/// A message of `size` zeroed bytes in process memory (`size` at most [`SMALL_MESSAGE_MAX`]
/// for it to come from the spare list).
pub(crate) fn small_message(size: usize) -> Message {
    let mut buffer = SmallBuffer::boxed_copy_of(&[]);
    buffer.bytes.resize(size, 0);
    Message::from_buffer(buffer)
}

/// The bytes of an inline part of a descriptor record, in a buffer from the spare list: they
/// become a message without a copy or an allocation, and return to the list when dropped.
pub struct InlineBytes(Option<Box<SmallBuffer>>);

impl InlineBytes {
    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> InlineBytes {
        InlineBytes(Some(SmallBuffer::boxed_copy_of(bytes)))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |buffer| &buffer.bytes)
    }

    /// The message holding these bytes.
    pub fn into_message(mut self) -> Message {
        match self.0.take() {
            Some(buffer) => Message::from_buffer(buffer),
            None => Message::empty(),
        }
    }
}

impl Drop for InlineBytes {
    fn drop(&mut self) {
        if let Some(buffer) = self.0.take() {
            buffer.keep();
        }
    }
}

impl Clone for InlineBytes {
    fn clone(&self) -> InlineBytes {
        InlineBytes::copy_of(self.as_slice())
    }
}

impl PartialEq for InlineBytes {
    fn eq(&self, other: &InlineBytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for InlineBytes {}

impl std::fmt::Debug for InlineBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InlineBytes({} bytes)", self.as_slice().len())
    }
}

impl From<&[u8]> for InlineBytes {
    fn from(bytes: &[u8]) -> InlineBytes {
        InlineBytes::copy_of(bytes)
    }
}

impl From<Vec<u8>> for InlineBytes {
    /// Takes the vector as the buffer (kept for reuse when dropped only if its capacity is at
    /// most [`SMALL_MESSAGE_MAX`]).
    fn from(bytes: Vec<u8>) -> InlineBytes {
        InlineBytes(Some(Box::new(SmallBuffer { bytes })))
    }
}

impl<const N: usize> From<&[u8; N]> for InlineBytes {
    fn from(bytes: &[u8; N]) -> InlineBytes {
        InlineBytes::copy_of(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_small_message_lends_its_buffer_to_the_next_one() {
        let first = small_message(64);
        let address = first.data().as_ptr();
        assert_eq!(first.data(), &[0; 64][..]);
        drop(first);
        let inline = InlineBytes::copy_of(b"next");
        assert_eq!(inline.as_slice().as_ptr(), address);
        let message = inline.into_message();
        assert_eq!(message.data(), b"next");
        assert_eq!(message.data().as_ptr(), address);
    }

    fn n_spare() -> usize {
        SPARE_SMALL.with(|spare| spare.borrow().len())
    }

    #[test]
    fn an_oversized_inline_payload_is_not_kept() {
        // Each test runs on a thread of its own: its spare list starts empty.
        assert_eq!(n_spare(), 0);
        drop(InlineBytes::copy_of(&[1; SMALL_MESSAGE_MAX + 1]));
        assert_eq!(n_spare(), 0);
        drop(InlineBytes::copy_of(&[1; 8]));
        assert_eq!(n_spare(), 1);
    }
}
