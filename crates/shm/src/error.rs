//! Errors of the shared-memory layer, each naming the object it is about.

/// What went wrong with shared memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A size below what an object needs.
    #[error("shared memory {name}: {size} bytes is too small, the minimum is {minimum}")]
    TooSmall {
        /// Object name.
        name: String,
        /// Size asked for.
        size: usize,
        /// Smallest size possible.
        minimum: usize,
    },
    /// `/dev/shm` has less room than the object needs.
    #[error(
        "shared memory {name}: {size} bytes asked for, but /dev/shm has only {free} bytes free (raise its size, e.g. docker --shm-size, or lower --shm-segment-size)"
    )]
    NoSpace {
        /// Object name.
        name: String,
        /// Size asked for.
        size: usize,
        /// Free bytes in /dev/shm.
        free: u64,
    },
    /// No object of that name.
    #[error("shared memory {name} does not exist (its session ended, or it was cleaned)")]
    NotFound {
        /// Object name.
        name: String,
    },
    /// An object without a valid ferromq header.
    #[error("shared memory {name} is not a ferromq object: {reason}")]
    Corrupt {
        /// Object name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The attach table is full.
    #[error("shared memory {name}: more than {max} processes attached")]
    TooManyProcesses {
        /// Object name.
        name: String,
        /// Table size.
        max: usize,
    },
    /// The segment stayed full for the whole allocation timeout.
    #[error(
        "shared memory segment {name} ({size} bytes, {used} in use by {live_blocks} messages, largest free block {largest_free}) has no room for {requested} bytes after waiting {waited_ms} ms"
    )]
    SegmentFull {
        /// Segment name.
        name: String,
        /// Its data size.
        size: usize,
        /// Bytes in use.
        used: u64,
        /// Messages holding them.
        live_blocks: u64,
        /// Largest free block.
        largest_free: u64,
        /// Bytes asked for.
        requested: usize,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A message larger than a whole segment.
    #[error(
        "a message of {requested} bytes cannot fit in a shared memory segment of {segment_size} bytes (raise --shm-segment-size)"
    )]
    LargerThanSegment {
        /// Bytes asked for.
        requested: usize,
        /// Segment size.
        segment_size: usize,
    },
    /// A descriptor from the wire that does not describe a live block.
    #[error("rejected descriptor: {reason}")]
    BadDescriptor {
        /// What is wrong with it.
        reason: String,
    },
    /// The operating system refused.
    #[error("shared memory {name}: {operation} failed: {reason}")]
    Os {
        /// Object name.
        name: String,
        /// What was attempted.
        operation: &'static str,
        /// The system's error.
        reason: String,
    },
}
