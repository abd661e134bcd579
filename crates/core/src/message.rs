//! Messages: one owner, bytes that move without copying.
//!
//! # Ownership
//! A [`Message`] owns its bytes. Sending moves it into the transport; receiving hands a new owner
//! the bytes. No two owners ever write the same bytes: a message built from shared memory
//! (a [`Bytes`] whose buffer has other handles, or a transport buffer that is read-only) is
//! copied the first time its owner asks for write access (copy-on-write).
//!
//! # Copies and allocation
//! - [`Message::new`] allocates a zeroed heap buffer (`calloc`: large buffers are lazily zeroed pages).
//! - `From<Vec<u8>>`, `From<Bytes>` and [`Message::from_buffer`] take the memory as it is.
//! - [`Message::into_bytes`] gives a [`Bytes`] over the same memory, transport buffers included
//!   (`Bytes::from_owner`); that is how a message reaches a byte-oriented transport without a copy.
//! - The only copies are the copy-on-write above and [`Message::copy`]; both add to
//!   [`copied_bytes`], which tests use to prove a path is zero-copy.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

static COPIED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes copied by messages in this process so far (copy-on-write and explicit copies).
pub fn copied_bytes() -> u64 {
    COPIED_BYTES.load(Ordering::Relaxed)
}

/// Adds to [`copied_bytes`]; transports call it where they copy a payload.
pub fn record_copy(n_bytes: usize) {
    COPIED_BYTES.fetch_add(n_bytes as u64, Ordering::Relaxed);
}

/// The one mapping that holds a buffer, for a network card to register once, whole, instead of
/// each buffer for each transfer: where it starts, how many bytes it has, and the object that
/// keeps it mapped (held with the registration).
///
/// A description, not a promise: a transport that hands the range to a card must trust the
/// owner's type to keep the mapping where it is (the ofi transport trusts the shmem transport's
/// segments, and checks the owner's own range and that every message lies inside it); memory it
/// does not trust it treats as heap memory, registered per transfer where the provider needs it.
#[derive(Clone)]
pub struct RegistrableMemory {
    /// Address of the mapping's first byte (an address only).
    pub base: usize,
    /// Bytes in the mapping.
    pub len: usize,
    /// What keeps the mapping alive, for the registering transport to recognise and hold.
    pub owner: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for RegistrableMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrableMemory")
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Memory owned by a transport (a shared-memory block, a registered region) that a
/// [`Message`] wraps without copying.
///
/// The transport that made the buffer can recognise it again through [`MessageBuffer::as_any`]
/// and send only a descriptor of it instead of its bytes.
pub trait MessageBuffer: Send + Sync + 'static {
    /// The whole buffer.
    fn as_bytes(&self) -> &[u8];
    /// The whole buffer for writing, or `None` when other owners may read it (a broadcast
    /// buffer); the message then copies on write.
    fn as_bytes_mut(&mut self) -> Option<&mut [u8]>;
    /// For downcasting by the transport that made the buffer.
    fn as_any(&self) -> &dyn Any;
    /// For taking the buffer back by the transport that made it.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
    /// The transport the buffer belongs to (`"shmem"`, ...), for logs and errors.
    fn transport_name(&self) -> &'static str;
    /// The mapping that holds the buffer, for a network card to register (see
    /// [`RegistrableMemory`]); `None`, the default, for memory that is not one such mapping.
    fn registrable_memory(&self) -> Option<RegistrableMemory> {
        None
    }
    /// Called instead of dropping the box when a message is done with the buffer: the
    /// transport releases the memory and may keep the allocation for its next buffer, so a
    /// message's life costs no heap allocation in steady state. The default drops the box.
    fn recycle(self: Box<Self>) {}
}

/// A transport buffer held by a message. On drop it goes back through
/// [`MessageBuffer::recycle`] rather than being freed.
struct HeldBuffer(Box<dyn MessageBuffer>);

impl HeldBuffer {
    /// The buffer, for the caller to keep; what is left behind is an empty placeholder.
    fn take(mut self) -> Box<dyn MessageBuffer> {
        std::mem::replace(&mut self.0, Box::new(NoBuffer))
    }
}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        // A box of a zero-sized type does not allocate: the placeholder is free.
        std::mem::replace(&mut self.0, Box::new(NoBuffer)).recycle();
    }
}

/// The zero-sized stand-in left in a [`HeldBuffer`] whose buffer was taken or recycled.
struct NoBuffer;

impl MessageBuffer for NoBuffer {
    fn as_bytes(&self) -> &[u8] {
        &[]
    }
    fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(&mut [])
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
    fn transport_name(&self) -> &'static str {
        "heap"
    }
}

enum Storage {
    Heap(Vec<u8>),
    Unique(BytesMut),
    Shared(Bytes),
    Buffer(HeldBuffer),
}

/// A message: an owned, sized byte buffer, possibly backed by transport memory.
///
/// # Examples
/// ```
/// use ferromq_core::Message;
/// let mut message = Message::new(8);
/// message.data_mut()[..5].copy_from_slice(b"hello");
/// message.set_used_size(5).unwrap();
/// assert_eq!(message.data(), b"hello");
/// ```
pub struct Message {
    storage: Storage,
    size: usize,
}

/// [`Message::set_used_size`] asked to grow a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot set the used size of a {size}-byte message to {requested} bytes: it can only shrink"
)]
pub struct UsedSizeError {
    /// Current size.
    pub size: usize,
    /// Size asked for.
    pub requested: usize,
}

impl Message {
    /// A zeroed heap message of `size` bytes.
    pub fn new(size: usize) -> Message {
        Message {
            storage: Storage::Heap(vec![0; size]),
            size,
        }
    }

    /// [`Message::new`], fallibly: a size no memory can hold is an error, not an abort (what a
    /// transport's `new_message` does with a size a user typed).
    ///
    /// # Errors
    /// The allocator's refusal.
    pub fn try_new(size: usize) -> Result<Message, std::collections::TryReserveError> {
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(size)?;
        bytes.resize(size, 0);
        Ok(Message::from(bytes))
    }

    /// An empty message (FairMQ's `NewMessage()`), used as a marker or for pure signalling.
    pub fn empty() -> Message {
        Message::from(Vec::new())
    }

    /// A message over transport memory, sized to the whole buffer.
    pub fn from_buffer(buffer: Box<dyn MessageBuffer>) -> Message {
        let size = buffer.as_bytes().len();
        Message {
            storage: Storage::Buffer(HeldBuffer(buffer)),
            size,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.size
    }

    /// True for a zero-byte message.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The bytes, for reading.
    pub fn data(&self) -> &[u8] {
        let whole: &[u8] = match &self.storage {
            Storage::Heap(vec) => vec,
            Storage::Unique(bytes) => bytes,
            Storage::Shared(bytes) => bytes,
            Storage::Buffer(buffer) => buffer.0.as_bytes(),
        };
        &whole[..self.size]
    }

    /// The bytes, for writing; copies first when the memory is shared (copy-on-write).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let size = self.size;
        self.make_unique();
        match &mut self.storage {
            Storage::Heap(vec) => &mut vec[..size],
            Storage::Unique(bytes) => &mut bytes[..size],
            Storage::Buffer(buffer) => &mut buffer
                .0
                .as_bytes_mut()
                .expect("make_unique left a writable buffer")[..size],
            Storage::Shared(_) => unreachable!("make_unique replaces shared storage"),
        }
    }

    /// [`Message::data_mut`] lent to `write`: the same bytes, with one look at whether lent
    /// memory is writable where `data_mut` takes two (a shared-memory block answers it from
    /// its reference count, behind a dynamic call: for a caller that writes many small records
    /// into one message, the two looks were a sixth of its time; perf, `ferromq bench rpc`).
    pub fn with_data_mut<R>(&mut self, write: impl FnOnce(&mut [u8]) -> R) -> R {
        let size = self.size;
        if let Storage::Buffer(buffer) = &mut self.storage
            && let Some(bytes) = buffer.0.as_bytes_mut()
        {
            return write(&mut bytes[..size]);
        }
        write(self.data_mut())
    }

    fn make_unique(&mut self) {
        let copy = match &mut self.storage {
            Storage::Heap(_) | Storage::Unique(_) => return,
            Storage::Buffer(buffer) => {
                if buffer.0.as_bytes_mut().is_some() {
                    return;
                }
                buffer.0.as_bytes()[..self.size].to_vec()
            }
            Storage::Shared(bytes) => {
                let taken = std::mem::take(bytes);
                match taken.try_into_mut() {
                    Ok(unique) => {
                        self.storage = Storage::Unique(unique);
                        return;
                    }
                    Err(shared) => shared[..self.size].to_vec(),
                }
            }
        };
        record_copy(copy.len());
        self.storage = Storage::Heap(copy);
    }

    /// Shrinks the message after filling it (FairMQ's `SetUsedSize`).
    ///
    /// # Errors
    /// [`UsedSizeError`] when `size` is larger than the current size.
    pub fn set_used_size(&mut self, size: usize) -> Result<(), UsedSizeError> {
        if size > self.size {
            return Err(UsedSizeError {
                size: self.size,
                requested: size,
            });
        }
        self.size = size;
        Ok(())
    }

    /// The mapping that holds this message's bytes, for a network card to register: its
    /// transport buffer's [`MessageBuffer::registrable_memory`]; `None` for heap memory.
    pub fn registrable_memory(&self) -> Option<RegistrableMemory> {
        self.buffer()?.registrable_memory()
    }

    /// The transport buffer behind this message, if it has one.
    pub fn buffer(&self) -> Option<&dyn MessageBuffer> {
        match &self.storage {
            Storage::Buffer(buffer) => Some(buffer.0.as_ref()),
            _ => None,
        }
    }

    /// Takes the transport buffer and the used size out of the message, or gives the message
    /// back when it has none.
    ///
    /// # Errors
    /// The message itself, unchanged, when it is not backed by a transport buffer.
    pub fn into_buffer(self) -> Result<(Box<dyn MessageBuffer>, usize), Message> {
        match self.storage {
            Storage::Buffer(buffer) => Ok((buffer.take(), self.size)),
            storage => Err(Message {
                storage,
                size: self.size,
            }),
        }
    }

    /// The bytes as [`Bytes`] without copying (transport buffers stay alive inside it).
    pub fn into_bytes(self) -> Bytes {
        match self.storage {
            Storage::Heap(mut vec) => {
                vec.truncate(self.size);
                Bytes::from(vec)
            }
            Storage::Unique(mut bytes) => {
                bytes.truncate(self.size);
                bytes.freeze()
            }
            Storage::Shared(mut bytes) => {
                bytes.truncate(self.size);
                bytes
            }
            Storage::Buffer(buffer) => Bytes::from_owner(BufferOwner {
                buffer,
                size: self.size,
            }),
        }
    }

    /// A heap copy of the bytes (FairMQ's `Copy`); counted in [`copied_bytes`].
    pub fn copy(&self) -> Message {
        record_copy(self.size);
        Message::from(self.data().to_vec())
    }

    /// The transport that owns the memory: the buffer's, or `"heap"`.
    pub fn memory_kind(&self) -> &'static str {
        match &self.storage {
            Storage::Buffer(buffer) => buffer.0.transport_name(),
            _ => "heap",
        }
    }
}

struct BufferOwner {
    buffer: HeldBuffer,
    size: usize,
}

impl AsRef<[u8]> for BufferOwner {
    fn as_ref(&self) -> &[u8] {
        &self.buffer.0.as_bytes()[..self.size]
    }
}

impl From<Vec<u8>> for Message {
    fn from(vec: Vec<u8>) -> Message {
        let size = vec.len();
        Message {
            storage: Storage::Heap(vec),
            size,
        }
    }
}

impl From<Bytes> for Message {
    fn from(bytes: Bytes) -> Message {
        let size = bytes.len();
        Message {
            storage: Storage::Shared(bytes),
            size,
        }
    }
}

impl From<BytesMut> for Message {
    fn from(bytes: BytesMut) -> Message {
        let size = bytes.len();
        Message {
            storage: Storage::Unique(bytes),
            size,
        }
    }
}

impl From<&'static [u8]> for Message {
    fn from(bytes: &'static [u8]) -> Message {
        Message::from(Bytes::from_static(bytes))
    }
}

impl From<String> for Message {
    fn from(text: String) -> Message {
        Message::from(text.into_bytes())
    }
}

impl From<&str> for Message {
    fn from(text: &str) -> Message {
        Message::from(text.as_bytes().to_vec())
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("size", &self.size)
            .field("memory", &self.memory_kind())
            .finish()
    }
}

/// A multipart message: several [`Message`]s that travel and arrive together.
///
/// # Examples
/// ```
/// use ferromq_core::{Message, Parts};
/// let parts: Parts = vec![Message::from("header"), Message::new(1024)].into();
/// assert_eq!(parts.len(), 2);
/// assert_eq!(parts.total_size(), 6 + 1024);
/// ```
#[derive(Debug, Default)]
pub struct Parts {
    /// One part lives inline: a single-part message costs no heap allocation of its own.
    messages: SmallVec<[Message; 1]>,
}

impl Parts {
    /// No parts yet.
    pub fn new() -> Parts {
        Parts::default()
    }

    /// No parts yet, with room for `n_parts` (one allocation for a message of known shape).
    pub fn with_capacity(n_parts: usize) -> Parts {
        Parts {
            messages: SmallVec::with_capacity(n_parts),
        }
    }

    /// Appends a part.
    pub fn push(&mut self, message: Message) {
        self.messages.push(message);
    }

    /// Number of parts.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// True when there are no parts.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Sum of the parts' sizes.
    pub fn total_size(&self) -> usize {
        self.messages.iter().map(Message::len).sum()
    }

    /// The parts, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Message> {
        self.messages.iter()
    }

    /// The parts, in order, for writing.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Message> {
        self.messages.iter_mut()
    }

    /// Part `idx`.
    pub fn get(&self, idx: usize) -> Option<&Message> {
        self.messages.get(idx)
    }

    /// The parts as a vector (allocates for a single part kept inline).
    pub fn into_vec(self) -> Vec<Message> {
        self.messages.into_vec()
    }
}

impl From<Message> for Parts {
    fn from(message: Message) -> Parts {
        Parts {
            messages: SmallVec::from_buf([message]),
        }
    }
}

impl From<Vec<Message>> for Parts {
    fn from(messages: Vec<Message>) -> Parts {
        Parts {
            messages: SmallVec::from_vec(messages),
        }
    }
}

impl FromIterator<Message> for Parts {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Parts {
        Parts {
            messages: iter.into_iter().collect(),
        }
    }
}

impl IntoIterator for Parts {
    type Item = Message;
    type IntoIter = PartsIntoIter;

    fn into_iter(self) -> Self::IntoIter {
        PartsIntoIter(self.messages.into_iter())
    }
}

/// The parts of a [`Parts`], by value, in order.
pub struct PartsIntoIter(smallvec::IntoIter<[Message; 1]>);

impl Iterator for PartsIntoIter {
    type Item = Message;

    fn next(&mut self) -> Option<Message> {
        self.0.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for PartsIntoIter {
    fn next_back(&mut self) -> Option<Message> {
        self.0.next_back()
    }
}

impl ExactSizeIterator for PartsIntoIter {}

impl std::fmt::Debug for PartsIntoIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartsIntoIter")
            .field("remaining", &self.0.len())
            .finish()
    }
}

impl<'a> IntoIterator for &'a Parts {
    type Item = &'a Message;
    type IntoIter = std::slice::Iter<'a, Message>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    /// A transport buffer, read-only unless made `writable` (as its one holder may write a
    /// block), that counts the boxes handed back through `recycle`.
    struct TestBuffer {
        bytes: Vec<u8>,
        writable: bool,
        recycled: Arc<AtomicUsize>,
    }

    impl TestBuffer {
        fn boxed(bytes: Vec<u8>) -> Box<TestBuffer> {
            TestBuffer::counted(bytes, &Arc::default())
        }

        fn counted(bytes: Vec<u8>, recycled: &Arc<AtomicUsize>) -> Box<TestBuffer> {
            Box::new(TestBuffer {
                bytes,
                writable: false,
                recycled: Arc::clone(recycled),
            })
        }

        fn writable(bytes: Vec<u8>) -> Box<TestBuffer> {
            Box::new(TestBuffer {
                writable: true,
                ..*TestBuffer::boxed(bytes)
            })
        }
    }

    impl MessageBuffer for TestBuffer {
        fn as_bytes(&self) -> &[u8] {
            &self.bytes
        }
        fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
            self.writable.then_some(&mut self.bytes[..])
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
            self
        }
        fn transport_name(&self) -> &'static str {
            "test"
        }
        fn recycle(self: Box<Self>) {
            self.recycled.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_finished_buffer_goes_back_through_recycle_unless_taken_out() {
        let count = Arc::new(AtomicUsize::new(0));
        let recycled = || count.load(Ordering::Relaxed);
        drop(Message::from_buffer(TestBuffer::counted(
            b"abc".to_vec(),
            &count,
        )));
        assert_eq!(recycled(), 1);
        let bytes = Message::from_buffer(TestBuffer::counted(b"abc".to_vec(), &count)).into_bytes();
        assert_eq!((&bytes[..], recycled()), (&b"abc"[..], 1));
        drop(bytes);
        assert_eq!(recycled(), 2);
        let (taken, _) = Message::from_buffer(TestBuffer::counted(b"abc".to_vec(), &count))
            .into_buffer()
            .unwrap_or_else(|_| panic!("a buffer message has a buffer"));
        assert_eq!(recycled(), 2, "a buffer taken out is the taker's");
        taken.recycle();
        assert_eq!(recycled(), 3);
    }

    #[test]
    fn with_data_mut_writes_where_data_mut_would() {
        // A writable buffer: in place.
        let mut lent = Message::from_buffer(TestBuffer::writable(vec![0; 8]));
        let at = lent.data().as_ptr();
        let seen = lent.with_data_mut(|bytes| {
            bytes[0] = 1;
            (bytes.as_ptr(), bytes.len())
        });
        assert_eq!(seen, (at, 8));
        assert_eq!(lent.data()[0], 1);
        // A read-only buffer: copied first, as `data_mut` does; the write lands in the copy.
        let mut read_only = Message::from_buffer(TestBuffer::boxed(b"abc".to_vec()));
        let at = read_only.data().as_ptr();
        let seen = read_only.with_data_mut(|bytes| {
            bytes[0] = b'x';
            bytes.as_ptr()
        });
        assert_ne!(seen, at);
        assert_eq!(read_only.data(), b"xbc");
        // The heap: in place, only the message's bytes.
        let mut heap = Message::from(vec![0u8; 16]);
        heap.set_used_size(4).expect("4 of 16 bytes");
        assert_eq!(heap.with_data_mut(|bytes| bytes.len()), 4);
    }

    #[test]
    fn vec_and_bytes_are_taken_without_copying() {
        let vec = vec![7u8; 4096];
        let pointer = vec.as_ptr();
        let message = Message::from(vec);
        assert_eq!(message.data().as_ptr(), pointer);
        let bytes = message.into_bytes();
        assert_eq!(bytes.as_ptr(), pointer);
        let message = Message::from(bytes.clone());
        assert_eq!(message.data().as_ptr(), pointer);
    }

    #[test]
    fn shared_bytes_copy_on_write() {
        let shared = Bytes::from(vec![1u8; 64]);
        let keep = shared.clone();
        let mut message = Message::from(shared);
        message.data_mut()[0] = 9;
        assert_eq!(keep[0], 1, "the other owner's bytes are untouched");
        assert_eq!(message.data()[0], 9);
        // A unique Bytes becomes writable in place.
        let unique = Bytes::from(vec![1u8; 64]);
        let pointer = unique.as_ptr();
        let mut message = Message::from(unique);
        message.data_mut()[0] = 2;
        assert_eq!(message.data().as_ptr(), pointer);
    }

    #[test]
    fn read_only_buffer_copies_on_write_and_round_trips_to_bytes() {
        let mut message = Message::from_buffer(TestBuffer::boxed(vec![5u8; 10]));
        assert_eq!(message.memory_kind(), "test");
        let pointer = message.data().as_ptr();
        let bytes = Message::from_buffer(TestBuffer::boxed(vec![5u8; 10])).into_bytes();
        assert_eq!(bytes.len(), 10);
        message.set_used_size(4).unwrap();
        assert_eq!(message.data().as_ptr(), pointer);
        message.data_mut()[0] = 1;
        assert_ne!(message.data().as_ptr(), pointer);
        assert_eq!(message.data(), &[1, 5, 5, 5]);
        assert_eq!(message.memory_kind(), "heap");
    }

    #[test]
    fn used_size_only_shrinks() {
        let mut message = Message::new(10);
        assert_eq!(
            message.set_used_size(11),
            Err(UsedSizeError {
                size: 10,
                requested: 11
            })
        );
        message.set_used_size(3).unwrap();
        assert_eq!(message.len(), 3);
        assert_eq!(message.into_bytes().len(), 3);
    }

    #[test]
    fn into_buffer_gives_back_non_buffer_messages() {
        let message = Message::from("abc");
        let Err(message) = message.into_buffer() else {
            panic!("a heap message has no buffer")
        };
        assert_eq!(message.data(), b"abc");
        let (buffer, size) = Message::from_buffer(TestBuffer::boxed(vec![0; 3]))
            .into_buffer()
            .unwrap();
        assert_eq!((buffer.as_bytes().len(), size), (3, 3));
    }
}
