//! [`Outlet`]: the calls on their way to one destination, packed into frames and sent by a task.
//!
//! A call is serialised straight into the open frame under a short lock: into memory lent by
//! the transport when it has its own (a shared-memory block on shmem, so nothing is copied
//! between serialisation and delivery), into a heap vector otherwise. A `none` or `ovfl` frame
//! starts small ([`SMALL_FRAME`]; on shmem a spare buffer that travels inside its ring entry)
//! while the frames before it left that small, and grows into a full one, copying what it
//! held, when a record finds no room. What makes a frame leave is the aggregation mode
//! ([`Aggregation`]):
//! - `none`: every call is a frame of its own;
//! - `trad`: a frame leaves when it holds `aggregate-bytes`, `aggregate-us` after its first
//!   call, or on [`Outlet::flush`];
//! - `ovfl`: the task takes whatever the open frame holds whenever it is free to send, so calls
//!   leave one by one while the destination keeps up and are packed only while it lags.
//!
//! The task sends one frame (the records, then the calls' buffers as further parts) at a time,
//! so the transport's back-pressure holds it, calls pile up in the outlet, and callers see the
//! destination as full at `max-queued-calls`. The dispatcher's answers (results,
//! acknowledgements) are *held*: they wake no task, and every 16 calls it serves, at the end of
//! a frame and before it waits for anything, the dispatcher sends them itself if the task is
//! idle and the channel takes them at once ([`Outlet::release`]); a `call_return` that is the
//! only call waiting for an answer does the same with its call. That saves a task switch on
//! each side of a round trip. A frame the channel does not take at once goes to the task, first
//! in line, so records to one destination keep their order.
//!
//! Cancellation and drop: a caller that stops waiting for room has queued nothing. Closing seals
//! the open frame and lets the task send every frame before it closes the channel (with the
//! channel's linger). A close with a deadline (a member's `shutdown_within`) ends by it: the
//! send under way then is cancelled, the frames after it are given up, the channel closes with
//! what is left of the time as its linger, and the task reports them as undelivered; it is
//! never aborted with the channel in its hands. A channel that fails makes the outlet refuse
//! every later call with the cause, and its queued calls are given up as a bounded close's
//! are: their callers' results and acknowledgements fail with the cause, the node keeps one
//! [`crate::CallError::Lost`] with their number for `take_failures`, the channel is closed at
//! once (what it took and the peer did not read is its close's count), and the task reports
//! both as undelivered, so the member's shutdown fails naming the destination (see
//! `node.rs`).

use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ferromq_core::{Channel, Message, Parts, Transport};
use serde::Serialize;
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use crate::wire::{self, RecordHead};

/// The resolution of tokio's timers.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// The size a frame of `none` and `ovfl` starts at: one call of up to ~200 bytes of arguments,
/// the most that travels inside a shared-memory ring entry by default (`shm-inline-max`, 256).
/// Such a frame comes from the transport's spare small buffers, not from a 4 KiB block of the
/// segment that the ring entry would copy it out of anyway (an allocation and a reclaim, ~0.15
/// us, on each side of a round trip).
const SMALL_FRAME: usize = 256;

/// Why a shut-down outlet refuses or gave up a record ([`Rejection::Failed`]); the node reads it
/// back as [`crate::CallError::Stopped`].
pub(crate) const SHUT_DOWN: &str = "the rpc node is shut down";

/// How calls to one destination are packed into frames (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// One call per frame.
    None,
    /// Frames of `aggregate-bytes`, flushed after `aggregate-us` or on demand.
    Trad,
    /// One call per frame while the destination keeps up, packed while it lags.
    #[default]
    Ovfl,
}

impl FromStr for Aggregation {
    type Err = String;

    fn from_str(text: &str) -> Result<Aggregation, String> {
        match text {
            "none" => Ok(Aggregation::None),
            "trad" => Ok(Aggregation::Trad),
            "ovfl" => Ok(Aggregation::Ovfl),
            other => Err(format!(
                "aggregate = {other:?} is not an aggregation mode (none, trad, ovfl)"
            )),
        }
    }
}

impl std::fmt::Display for Aggregation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Aggregation::None => "none",
            Aggregation::Trad => "trad",
            Aggregation::Ovfl => "ovfl",
        })
    }
}

/// Counts shared by a node's outlets.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub frames: AtomicU64,
    pub records: AtomicU64,
    /// Records that left in a frame with others.
    pub aggregated: AtomicU64,
}

/// Where an outlet's frames go: a channel to another member, or this member's own dispatcher.
pub(crate) enum Sink {
    Channel(Box<Channel>),
    Loopback(tokio::sync::mpsc::UnboundedSender<Parts>),
}

/// The memory a frame is written into.
enum FrameBuf {
    Heap(Vec<u8>),
    /// A message of the transport's (shared memory); `used` bytes are written.
    Lent {
        message: Message,
        used: usize,
    },
}

impl FrameBuf {
    fn len(&self) -> usize {
        match self {
            FrameBuf::Heap(bytes) => bytes.len(),
            FrameBuf::Lent { used, .. } => *used,
        }
    }

    /// Appends `bytes`; false (and nothing written) when lent memory has no room.
    fn write(&mut self, bytes: &[u8]) -> bool {
        match self {
            FrameBuf::Heap(vec) => {
                vec.extend_from_slice(bytes);
                true
            }
            FrameBuf::Lent { message, used } => {
                let data = message.data_mut();
                let Some(target) = data.get_mut(*used..*used + bytes.len()) else {
                    return false;
                };
                target.copy_from_slice(bytes);
                *used += bytes.len();
                true
            }
        }
    }

    /// Appends a record: `head`, then the payload, with the payload's length set in the head.
    /// `repeat`: `head` is a plain call to the handler of the frame's last call record, written
    /// in the short form ([`wire::KIND_CALL_REPEAT`]) when the payload's length fits 16 bits;
    /// a longer one is moved on to make room for the whole head. `Ok(false)` when lent memory
    /// has no room; on `Ok(false)` and on an error nothing is written. Lent memory is borrowed
    /// once per record (each borrow of a shared-memory message checks that it is still the
    /// block's only holder).
    fn append_record<T: Serialize + ?Sized>(
        &mut self,
        head: &RecordHead,
        payload: &Payload<'_, T>,
        repeat: bool,
    ) -> Result<bool, String> {
        let long_head;
        let head_bytes: &[u8] = if repeat {
            &[wire::KIND_CALL_REPEAT, 0, 0]
        } else {
            long_head = head.encode();
            &long_head
        };
        let head_at = self.len();
        let payload_at = head_at + head_bytes.len();
        let end = match self {
            FrameBuf::Heap(vec) => {
                vec.extend_from_slice(head_bytes);
                let encoded = match payload {
                    Payload::Raw(bytes) => {
                        vec.extend_from_slice(bytes);
                        Ok(())
                    }
                    // Into the vector in place: a failed encoding leaves the records before
                    // it as they were.
                    Payload::Encode(value) => postcard::to_io(*value, &mut *vec)
                        .map(drop)
                        .map_err(|error| error.to_string()),
                };
                if let Err(error) = encoded {
                    vec.truncate(head_at);
                    return Err(error);
                }
                let end = vec.len();
                if repeat && let Ok(short_len) = u16::try_from(end - payload_at) {
                    vec[head_at + 1..payload_at].copy_from_slice(&short_len.to_le_bytes());
                    return Ok(true);
                }
                end
            }
            FrameBuf::Lent { message, used } => {
                let data = message.data_mut();
                let Some(head_room) = data.get_mut(head_at..payload_at) else {
                    return Ok(false);
                };
                head_room.copy_from_slice(head_bytes);
                let payload_len = match payload {
                    Payload::Raw(bytes) => {
                        let Some(room) = data.get_mut(payload_at..payload_at + bytes.len()) else {
                            return Ok(false);
                        };
                        room.copy_from_slice(bytes);
                        bytes.len()
                    }
                    Payload::Encode(value) => {
                        match postcard::to_slice(*value, &mut data[payload_at..]) {
                            Ok(written) => written.len(),
                            Err(postcard::Error::SerializeBufferFull) => return Ok(false),
                            Err(error) => return Err(error.to_string()),
                        }
                    }
                };
                *used = payload_at + payload_len;
                if repeat && let Ok(short_len) = u16::try_from(payload_len) {
                    data[head_at + 1..payload_at].copy_from_slice(&short_len.to_le_bytes());
                    return Ok(true);
                }
                *used
            }
        };
        let payload_len = end - payload_at;
        // A short record whose payload did not fit its length field becomes a whole one.
        if repeat {
            if !self.widen(
                payload_at,
                end,
                wire::RECORD_HEAD_LEN - wire::REPEAT_HEAD_LEN,
            ) {
                self.truncate(head_at);
                return Ok(false);
            }
            self.bytes_mut()[head_at..head_at + wire::RECORD_HEAD_LEN]
                .copy_from_slice(&head.encode());
        }
        let Ok(payload_len) = u32::try_from(payload_len) else {
            self.truncate(head_at);
            return Err(format!("{payload_len} bytes of arguments (4 GiB at most)"));
        };
        wire::set_payload_len(self.bytes_mut(), head_at, payload_len);
        Ok(true)
    }

    /// Moves the last bytes, `from..end` (`end` the frame's length), `by` bytes on; false
    /// when lent memory has no room for them there.
    fn widen(&mut self, from: usize, end: usize, by: usize) -> bool {
        match self {
            FrameBuf::Heap(vec) => {
                vec.resize(end + by, 0);
                vec.copy_within(from..end, from + by);
                true
            }
            FrameBuf::Lent { message, used } => {
                let data = message.data_mut();
                if data.len() < end + by {
                    return false;
                }
                data.copy_within(from..end, from + by);
                *used = end + by;
                true
            }
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            FrameBuf::Heap(vec) => vec.truncate(len),
            FrameBuf::Lent { used, .. } => *used = len,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            FrameBuf::Heap(vec) => vec,
            FrameBuf::Lent { message, used } => &mut message.data_mut()[..*used],
        }
    }

    fn into_message(self) -> Message {
        match self {
            FrameBuf::Heap(vec) => Message::from(vec),
            FrameBuf::Lent { mut message, used } => {
                message
                    .set_used_size(used)
                    .expect("used never passes the message's size");
                message
            }
        }
    }
}

/// A frame being filled or waiting to be sent.
struct Frame {
    buf: FrameBuf,
    /// What a short call record written next would stand for.
    last_call: wire::LastCall,
    /// Made at [`SMALL_FRAME`] bytes: grows into a full frame when a record finds no room.
    small: bool,
    n_records: u32,
    buffers: Vec<Message>,
    /// Callers told when the frame has left (handed to the transport).
    on_left: Vec<oneshot::Sender<()>>,
}

impl Frame {
    fn into_parts(mut self) -> (Parts, Vec<oneshot::Sender<()>>, u32) {
        wire::set_record_count(self.buf.bytes_mut(), self.n_records);
        let mut parts = Parts::with_capacity(1 + self.buffers.len());
        parts.push(self.buf.into_message());
        self.buffers
            .into_iter()
            .for_each(|buffer| parts.push(buffer));
        (parts, self.on_left, self.n_records)
    }
}

/// A frame that one [`crate::CallWriter`] fills alone, without the outlet's lock, and hands
/// to the outlet whole ([`Outlet::hand_over`]). Made as a `trad` frame is (lent memory on
/// shmem, so a call is serialised where the destination reads it).
pub(crate) struct OwnFrame {
    frame: Frame,
    /// When its first record was written: `aggregate-us` counts from it.
    since: Option<Instant>,
    /// `aggregate-bytes`: a frame holding as much takes no more records. Lent memory ends
    /// there anyway; a heap frame (an outlet without lent memory: a member's own, ofi's)
    /// would grow for as long as the outlet had no room to take it.
    frame_bytes: usize,
}

impl OwnFrame {
    pub(crate) fn n_records(&self) -> u32 {
        self.frame.n_records
    }

    /// When its first record was written.
    pub(crate) fn since(&self) -> Option<Instant> {
        self.since
    }

    /// Holds `aggregate-bytes` or more: it leaves as it is.
    pub(crate) fn is_full(&self) -> bool {
        self.frame.buf.len() >= self.frame_bytes
    }

    /// Appends a plain call with `args` (the short form after a call to the same handler).
    /// `Ok(false)`: the frame is full ([`OwnFrame::is_full`]) or its lent memory has no room,
    /// nothing written; an error: the arguments did not serialise, nothing written. A call
    /// larger than an empty lent frame is written into the heap instead, as
    /// [`Outlet::try_push`] does. The error is boxed so that
    /// the outcome comes back in registers, not through the caller's stack (a wide read of
    /// narrow stores, which waits for them; perf, `ferromq bench rpc --mode trad`).
    #[inline]
    pub(crate) fn append_call<T: Serialize + ?Sized>(
        &mut self,
        handler: u64,
        args: &T,
        me: u32,
    ) -> Result<bool, Box<str>> {
        if self.is_full() && self.frame.n_records > 0 {
            return Ok(false);
        }
        // A call after one to the same handler, into lent memory: the stream's common case,
        // written in place with one look at the memory's writability.
        if self.frame.last_call.repeated_by_plain_call_to(handler)
            && let FrameBuf::Lent { message, used } = &mut self.frame.buf
        {
            let at = *used;
            if let Some(len) = message.with_data_mut(|data| write_short_call(data, at, args))? {
                *used = at + len;
                self.frame.n_records += 1;
                return Ok(true);
            }
        }
        self.append_call_slowly(handler, &Payload::Encode(args), me)
    }

    /// [`OwnFrame::append_call`] for every case.
    fn append_call_slowly<T: Serialize + ?Sized>(
        &mut self,
        handler: u64,
        payload: &Payload<'_, T>,
        me: u32,
    ) -> Result<bool, Box<str>> {
        let head = RecordHead::call(handler, 0, 0);
        let frame = &mut self.frame;
        loop {
            let head_at = frame.buf.len();
            let repeat = frame.last_call.repeated_by(&head);
            if frame.buf.append_record(&head, payload, repeat)? {
                frame.last_call.saw(&head);
                frame.n_records += 1;
                if self.since.is_none() {
                    self.since = Some(Instant::now());
                }
                return Ok(true);
            }
            frame.buf.truncate(head_at);
            if frame.n_records > 0 {
                return Ok(false);
            }
            // A heap frame always has room, so the next pass writes the record.
            frame.buf = FrameBuf::Heap(wire::frame_header(me).to_vec());
        }
    }
}

/// Writes a short call record ([`wire::KIND_CALL_REPEAT`]) with `args` at `at`: its length, or
/// `None` (nothing written that counts) when it does not fit, or its payload's length does not
/// fit the short form.
///
/// A record of up to [`LARGE_STAGE`] bytes is put together on the stack and stored into the
/// frame in one copy. postcard writes a byte at a time (an `[u8; 8]` is eight one-byte
/// stores), and a frame's memory is a block the destination has just read: each of its cache
/// lines must be taken back from the other core before a store to it completes, and eleven
/// stores a call filled the core's store buffer before the next line arrived (perf, `ferromq
/// bench rpc --mode trad --call-size 8` through a writer: three fifths of the write's samples
/// on the store after the first byte of a line).
fn write_short_call<T: Serialize + ?Sized>(
    data: &mut [u8],
    at: usize,
    args: &T,
) -> Result<Option<usize>, Box<str>> {
    let Some(room) = data.get_mut(at..) else {
        return Ok(None);
    };
    // The stage's size from the arguments' (known when the call is compiled, for sized ones):
    // a large stage zeroed for every 8-byte call cost those up to a fifth of their rate, a
    // small one left 64-byte calls to be written in place, a byte at a time (9 M against 12 M
    // calls/s; `ferromq bench rpc --mode trad`).
    if std::mem::size_of_val(args) <= SMALL_STAGE - STAGE_SLACK {
        write_staged::<SMALL_STAGE, T>(room, args)
    } else {
        write_staged::<LARGE_STAGE, T>(room, args)
    }
}

/// [`write_short_call`] through a stage of `N` bytes.
#[inline]
fn write_staged<const N: usize, T: Serialize + ?Sized>(
    room: &mut [u8],
    args: &T,
) -> Result<Option<usize>, Box<str>> {
    let mut staged = [0u8; N];
    let Some(len) = write_short_call_in_place(&mut staged, args)? else {
        // Larger than the stage: written in place.
        return write_short_call_in_place(room, args);
    };
    // Stored as 16 bytes where the frame has room for them (the bytes past the record are the
    // next record's, or never read): a copy whose length is known only at run time was a call
    // to `memmove`, a quarter of the caller's time (perf, `ferromq bench rpc --mode trad
    // --call-size 8`).
    if len <= SHORT_STORE
        && let (Some(target), Some(short)) = (
            room.first_chunk_mut::<SHORT_STORE>(),
            staged.first_chunk::<SHORT_STORE>(),
        )
    {
        *target = *short;
        return Ok(Some(len));
    }
    Ok(room.get_mut(..len).map(|target| {
        target.copy_from_slice(&staged[..len]);
        len
    }))
}

/// The stages a short call record is put together in before it is stored
/// ([`write_short_call`]): for arguments of up to 48 bytes, and for larger ones (a record of
/// 256-byte arguments fits).
const SMALL_STAGE: usize = 64;
const LARGE_STAGE: usize = 320;

/// What a record may take beyond its arguments' size in memory: the short head and postcard's
/// length prefixes. The size is the type's in memory, so a `Vec` or `String` (24 bytes) takes
/// the small stage whatever it holds, and a record that does not fit it is written in place.
const STAGE_SLACK: usize = 16;

/// A short call record of up to this many bytes is stored as this many ([`write_staged`]).
const SHORT_STORE: usize = 16;

/// [`write_short_call`] serialising straight into `room`: its length, or `None` when it does not
/// fit or its payload's length does not fit the short form.
fn write_short_call_in_place<T: Serialize + ?Sized>(
    room: &mut [u8],
    args: &T,
) -> Result<Option<usize>, Box<str>> {
    let Some((head, rest)) = room.split_first_chunk_mut::<{ wire::REPEAT_HEAD_LEN }>() else {
        return Ok(None);
    };
    let payload_len = match postcard::to_slice(args, rest) {
        Ok(written) => written.len(),
        Err(postcard::Error::SerializeBufferFull) => return Ok(None),
        Err(error) => return Err(error.to_string().into()),
    };
    let Ok(short_len) = u16::try_from(payload_len) else {
        return Ok(None);
    };
    let [len_0, len_1] = short_len.to_le_bytes();
    *head = [wire::KIND_CALL_REPEAT, len_0, len_1];
    Ok(Some(wire::REPEAT_HEAD_LEN + payload_len))
}

/// The tunables of an outlet (from `RpcOptions`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutletConfig {
    pub aggregation: Aggregation,
    pub frame_bytes: usize,
    pub max_delay: Duration,
    pub max_queued: usize,
}

struct State {
    /// The channel, here while the task is not sending (the task takes it for its sends;
    /// [`Outlet::release`] sends through it in place). `None` before the task starts.
    sink: Option<Sink>,
    /// A frame [`Outlet::release`] took and the channel did not take at once: the next to send.
    unsent: Option<Outgoing>,
    sealed: VecDeque<Frame>,
    open: Option<Frame>,
    /// When the open frame got its first record.
    open_since: Option<Instant>,
    /// Records accepted and not yet sent (sealed, open, and the frame the task is sending).
    n_queued: usize,
    /// The channel failed: why. Nothing is accepted any more.
    failure: Option<String>,
    closing: bool,
    /// A bounded close, or the channel's failure, gave up records it had accepted
    /// ([`Outlet::run`]).
    given_up: bool,
    /// The last frame that left fitted a small frame: the next starts small. One that did not
    /// (larger calls, or calls packed while the destination lags) makes frames start full
    /// until one leaves small again.
    small_fits: bool,
}

impl State {
    /// Why the outlet refuses records, if it does: its channel failed, or it closes.
    fn refusal(&self) -> Option<Rejection> {
        if let Some(failure) = &self.failure {
            return Some(Rejection::Failed(failure.clone()));
        }
        self.closing
            .then(|| Rejection::Failed(SHUT_DOWN.to_owned()))
    }

    /// Why records accepted here were not all sent: the channel failed, or a bounded close
    /// gave some up. `None` while everything accepted was sent or is still on its way.
    fn not_sent(&self) -> Option<String> {
        self.failure
            .clone()
            .or_else(|| self.given_up.then(|| SHUT_DOWN.to_owned()))
    }

    /// `frame` made into parts to send; how large it left says how the next frame starts.
    fn leaving(&mut self, frame: Frame) -> Outgoing {
        self.small_fits = frame.buf.len() <= SMALL_FRAME;
        frame.into_parts()
    }
}

/// A frame made into parts: the parts, who waits for them to leave, how many records.
type Outgoing = (Parts, Vec<oneshot::Sender<()>>, u32);

/// Why a record was not accepted. What was handed in comes back.
pub(crate) enum Rejection {
    /// `max-queued-calls` records are queued.
    NoRoom {
        buffer: Option<Message>,
        on_left: Option<oneshot::Sender<()>>,
        queued: usize,
    },
    /// The channel failed (or the outlet was closed).
    Failed(String),
    /// The payload could not be serialised.
    Encode(String, Option<Message>),
}

/// What to write as a record's payload.
pub(crate) enum Payload<'a, T: ?Sized> {
    Encode(&'a T),
    Raw(&'a [u8]),
}

pub(crate) struct Outlet {
    pub dest: usize,
    me: u32,
    config: OutletConfig,
    /// Lends the memory of frames (shared memory on shmem); `None`: heap frames.
    transport: Option<Arc<dyn Transport>>,
    state: Mutex<State>,
    /// Records were pushed held ([`Outlet::try_push_held`]) and not yet released.
    held: AtomicBool,
    /// The outlet refuses records (failed or closing): what a [`crate::CallWriter`] looks
    /// at per call instead of taking the lock.
    refusing: AtomicBool,
    /// Records are queued or not yet handed to the transport (`n_queued > 0`), stored under
    /// the lock wherever that count changes: what an `ovfl` [`crate::CallWriter`] looks at per
    /// call to know whether the destination lags (it then holds its calls, as `ovfl` packs
    /// them).
    busy: AtomicBool,
    /// How many calls each live [`crate::CallWriter`] to this destination holds, a slot per
    /// writer that it alone stores to: what `Rpc::stats` and a shutdown count as not yet
    /// handed over.
    writers: Mutex<Vec<Weak<AtomicU32>>>,
    /// Records came in, or a frame was sealed: the task looks.
    ready: Notify,
    /// The task sent a frame: callers waiting for room look again.
    room: Notify,
    /// Nothing is queued any more (for `flush`).
    drained: Notify,
    /// The deadline of a bounded close ([`Outlet::close`]): a send still waiting then is given
    /// up, and the channel's linger is cut to what is left of it.
    close_by: watch::Sender<Option<Instant>>,
    counts: Arc<Counts>,
}

impl Outlet {
    pub(crate) fn new(
        dest: usize,
        me: u32,
        config: OutletConfig,
        transport: Option<Arc<dyn Transport>>,
        counts: Arc<Counts>,
    ) -> Outlet {
        Outlet {
            dest,
            me,
            config,
            transport,
            state: Mutex::new(State {
                sink: None,
                unsent: None,
                sealed: VecDeque::new(),
                open: None,
                open_since: None,
                n_queued: 0,
                failure: None,
                closing: false,
                given_up: false,
                small_fits: true,
            }),
            held: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            writers: Mutex::default(),
            ready: Notify::new(),
            room: Notify::new(),
            drained: Notify::new(),
            close_by: watch::Sender::new(None),
            counts,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A frame for the next record. `trad` frames are made at their full size; the others,
    /// which mostly leave with one call, start at [`SMALL_FRAME`] bytes while calls fit there
    /// (`small_fits`) and grow when a record finds no room ([`Outlet::grown`]).
    fn new_frame(&self, small_fits: bool) -> Frame {
        let small = small_fits
            && self.config.aggregation != Aggregation::Trad
            && self.config.frame_bytes > SMALL_FRAME;
        let size = if small {
            SMALL_FRAME
        } else {
            self.config.frame_bytes
        }
        .max(wire::HEADER_LEN + wire::RECORD_HEAD_LEN);
        let mut buf = self.frame_buf(size);
        let written = buf.write(&wire::frame_header(self.me));
        debug_assert!(written, "a frame has room for its header");
        Frame {
            buf,
            last_call: wire::LastCall::default(),
            small,
            n_records: 0,
            buffers: Vec::new(),
            on_left: Vec::new(),
        }
    }

    /// `size` bytes to write a frame into: lent by the transport when it has memory of its own
    /// (on shmem a small message from a per-thread spare list up to `shm-inline-max`, a block
    /// of the segment above), from the heap otherwise.
    fn frame_buf(&self, size: usize) -> FrameBuf {
        let lent = self
            .transport
            .as_ref()
            .and_then(|transport| transport.try_new_message(size));
        match lent {
            Some(message) => FrameBuf::Lent { message, used: 0 },
            None => FrameBuf::Heap(Vec::with_capacity(size)),
        }
    }

    /// `frame` at its full size, holding what it held: a copy of at most [`SMALL_FRAME`]
    /// bytes; the records that follow are written into the full frame in place.
    fn grown(&self, frame: &mut Frame) {
        let mut buf = self.frame_buf(self.config.frame_bytes);
        let fits = buf.write(frame.buf.bytes_mut());
        debug_assert!(fits, "a full frame holds a small one");
        frame.buf = buf;
        frame.small = false;
    }

    /// The tunables this outlet was made with.
    #[inline]
    pub(crate) fn config(&self) -> OutletConfig {
        self.config
    }

    /// This member's index, as a frame's header names it.
    #[inline]
    pub(crate) fn me(&self) -> u32 {
        self.me
    }

    /// The outlet refuses records (failed or closing); [`Outlet::hand_over`] says why.
    #[inline]
    pub(crate) fn refusing(&self) -> bool {
        self.refusing.load(Ordering::Relaxed)
    }

    /// Records are queued or not yet handed to the transport (a lagging destination, whose
    /// transport takes no more, keeps them here). Read without the lock, so it may be a
    /// moment late either way.
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// `n` more records queued (under the lock), published for [`Outlet::busy`].
    fn queue_more(&self, state: &mut State, n: usize) {
        state.n_queued += n;
        self.busy.store(true, Ordering::Relaxed);
    }

    /// `n` records fewer queued (sent or given up; under the lock), published for
    /// [`Outlet::busy`].
    fn queue_less(&self, state: &mut State, n: usize) {
        state.n_queued -= n;
        self.busy.store(state.n_queued > 0, Ordering::Relaxed);
    }

    /// Why the outlet refuses records, if it does (as [`Outlet::try_push`] would say).
    pub(crate) fn refusal(&self) -> Option<Rejection> {
        self.lock().refusal()
    }

    fn writers(&self) -> std::sync::MutexGuard<'_, Vec<Weak<AtomicU32>>> {
        self.writers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new writer's slot: it stores there how many calls it holds (see `writers`).
    pub(crate) fn writer_slot(&self) -> Arc<AtomicU32> {
        let slot = Arc::new(AtomicU32::new(0));
        let mut writers = self.writers();
        writers.retain(|writer| writer.strong_count() > 0);
        writers.push(Arc::downgrade(&slot));
        slot
    }

    /// Calls the live writers to this destination hold, not yet handed over.
    pub(crate) fn held_by_writers(&self) -> usize {
        self.writers()
            .iter()
            .filter_map(Weak::upgrade)
            .map(|slot| slot.load(Ordering::Relaxed) as usize)
            .sum()
    }

    /// A frame for a [`crate::CallWriter`] to fill.
    pub(crate) fn own_frame(&self) -> OwnFrame {
        OwnFrame {
            frame: self.new_frame(false),
            since: None,
            frame_bytes: self.config.frame_bytes,
        }
    }

    /// Queues the records of `frame` behind everything queued here (the shared open frame is
    /// sealed first: its calls were made before), unless the outlet failed or closes, or,
    /// `bounded`, holds `max-queued-calls` already. Refused, the frame comes back with why
    /// (its `NoRoom` hands nothing else back; boxed, as refusals are rare and the frame is
    /// large). An empty frame is dropped.
    pub(crate) fn hand_over(
        &self,
        frame: OwnFrame,
        bounded: bool,
    ) -> Result<(), Box<(Rejection, OwnFrame)>> {
        if frame.frame.n_records == 0 {
            return Ok(());
        }
        let mut state = self.lock();
        if let Some(refusal) = state.refusal() {
            return Err(Box::new((refusal, frame)));
        }
        if bounded && state.n_queued >= self.config.max_queued {
            let queued = state.n_queued;
            let no_room = Rejection::NoRoom {
                buffer: None,
                on_left: None,
                queued,
            };
            return Err(Box::new((no_room, frame)));
        }
        self.seal(&mut state);
        self.queue_more(&mut state, frame.frame.n_records as usize);
        state.sealed.push_back(frame.frame);
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Appends one record, never bounded, without waking the task: the caller (the
    /// dispatcher) calls [`Outlet::release`] before it waits for anything.
    pub(crate) fn try_push_held<T: Serialize + ?Sized>(
        &self,
        head: RecordHead,
        payload: &Payload<'_, T>,
        buffer: Option<Message>,
    ) -> Result<(), Rejection> {
        self.try_push(head, payload, buffer, None, false, true)
    }

    /// Appends one record unless the outlet is full (`bounded`) or failed. `hold`: the task is
    /// not woken; the caller calls [`Outlet::release`] before it waits for anything.
    pub(crate) fn try_push<T: Serialize + ?Sized>(
        &self,
        head: RecordHead,
        payload: &Payload<'_, T>,
        buffer: Option<Message>,
        on_left: Option<oneshot::Sender<()>>,
        bounded: bool,
        hold: bool,
    ) -> Result<(), Rejection> {
        let mut state = self.lock();
        if let Some(refusal) = state.refusal() {
            return Err(refusal);
        }
        if bounded && state.n_queued >= self.config.max_queued {
            return Err(Rejection::NoRoom {
                buffer,
                on_left,
                queued: state.n_queued,
            });
        }
        let was_idle = state.open.is_none() && state.sealed.is_empty();
        loop {
            let small_fits = state.small_fits;
            let frame = state.open.get_or_insert_with(|| self.new_frame(small_fits));
            let head_at = frame.buf.len();
            let repeat = frame.last_call.repeated_by(&head);
            match frame.buf.append_record(&head, payload, repeat) {
                Ok(true) => {
                    frame.last_call.saw(&head);
                    frame.n_records += 1;
                    frame.buffers.extend(buffer);
                    frame.on_left.extend(on_left);
                    break;
                }
                Ok(false) => {}
                Err(error) => {
                    if frame.n_records == 0 {
                        state.open = None;
                    }
                    return Err(Rejection::Encode(error, buffer));
                }
            }
            // No room in lent memory: grow a small frame, seal a full one with what it holds,
            // or, for a record larger than a fresh frame, write it to the heap.
            frame.buf.truncate(head_at);
            if frame.small {
                self.grown(frame);
                continue;
            }
            let open = state.open.take().expect("just filled");
            if open.n_records > 0 {
                state.sealed.push_back(open);
            } else {
                // A heap frame always has room, so the next pass writes the record.
                let mut heap = open;
                heap.buf = FrameBuf::Heap(wire::frame_header(self.me).to_vec());
                state.open = Some(heap);
            }
        }
        self.queue_more(&mut state, 1);
        // Only `trad` holds a frame for a while: the others need no clock read per call.
        if self.config.aggregation == Aggregation::Trad && state.open_since.is_none() {
            state.open_since = Some(Instant::now());
        }
        let full = state
            .open
            .as_ref()
            .is_some_and(|open| open.buf.len() >= self.config.frame_bytes);
        let sealed_now = if self.config.aggregation == Aggregation::None || full {
            self.seal(&mut state);
            true
        } else {
            false
        };
        drop(state);
        if hold {
            // Release: whoever swaps it back (below) finds the record pushed.
            self.held.store(true, Ordering::Release);
        } else if was_idle || sealed_now {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Sends what was pushed held: from the calling task, when the outlet's task is not
    /// sending and the channel takes each frame at once (`ovfl`, `none`); otherwise, and for
    /// whatever the channel did not take, the task is woken. `trad` frames wait for the task
    /// (their delay or size decides when they leave).
    pub(crate) fn release(&self) {
        if !self.held.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut state = self.lock();
        // The channel is in the state only while the task is not sending.
        let idle_sink = (self.config.aggregation != Aggregation::Trad
            && state.unsent.is_none()
            && state.failure.is_none())
        .then(|| state.sink.take())
        .flatten();
        if let Some(mut sink) = idle_sink {
            while let Some(frame) = state.sealed.pop_front().or_else(|| {
                state.open_since = None;
                state.open.take()
            }) {
                let (parts, on_left, n_records) = state.leaving(frame);
                let sent = match &mut sink {
                    Sink::Channel(channel) => channel.try_send_parts(parts),
                    Sink::Loopback(queue) => queue.send(parts).map_err(|unsent| unsent.0),
                };
                match sent {
                    Ok(()) => self.sent(&mut state, on_left, n_records),
                    Err(parts) => {
                        state.unsent = Some((parts, on_left, n_records));
                        break;
                    }
                }
            }
            state.sink = Some(sink);
        }
        let for_task = state.unsent.is_some() || !state.sealed.is_empty() || state.open.is_some();
        drop(state);
        if for_task {
            self.ready.notify_one();
        }
    }

    /// Accounts for a frame handed to the channel (the state's lock is held) and tells whom it
    /// concerns: its callers that wait for it to leave, and the waits for room and for drain.
    fn sent(
        &self,
        state: &mut std::sync::MutexGuard<'_, State>,
        on_left: Vec<oneshot::Sender<()>>,
        n_records: u32,
    ) {
        self.counts.frames.fetch_add(1, Ordering::Relaxed);
        self.counts
            .records
            .fetch_add(u64::from(n_records), Ordering::Relaxed);
        if n_records > 1 {
            self.counts
                .aggregated
                .fetch_add(u64::from(n_records), Ordering::Relaxed);
        }
        self.queue_less(state, n_records as usize);
        on_left.into_iter().for_each(|left| {
            let _ = left.send(());
        });
        self.room.notify_waiters();
        if state.n_queued == 0 {
            self.drained.notify_waiters();
        }
    }

    fn seal(&self, state: &mut State) {
        if let Some(open) = state.open.take() {
            state.sealed.push_back(open);
        }
        state.open_since = None;
    }

    /// Waits until a bounded push might find room; false at `deadline`.
    pub(crate) async fn wait_for_room(&self, deadline: Instant) -> bool {
        let room = self.room.notified();
        tokio::pin!(room);
        room.as_mut().enable();
        {
            let state = self.lock();
            if state.n_queued < self.config.max_queued || state.failure.is_some() {
                return true;
            }
        }
        tokio::time::timeout_at(deadline, room).await.is_ok()
    }

    /// Sends the open frame now and waits until everything queued was handed to the
    /// transport, at most until `deadline`; says how it ended.
    pub(crate) async fn flush(&self, deadline: Instant) -> Flushed {
        let drained = self.drained.notified();
        tokio::pin!(drained);
        drained.as_mut().enable();
        {
            let mut state = self.lock();
            if let Some(flushed) = Flushed::already(&state) {
                return flushed;
            }
            self.seal(&mut state);
        }
        self.ready.notify_one();
        loop {
            if tokio::time::timeout_at(deadline, drained.as_mut())
                .await
                .is_err()
            {
                return Flushed::TimedOut;
            }
            drained.set(self.drained.notified());
            drained.as_mut().enable();
            if let Some(flushed) = Flushed::already(&self.lock()) {
                return flushed;
            }
        }
    }

    /// Why records accepted here were not all sent (see [`Flushed::NotSent`]); `None` while
    /// everything was sent or is on its way. A caller whose wait for its record to leave ended
    /// without word asks this.
    pub(crate) fn not_sent(&self) -> Option<String> {
        self.lock().not_sent()
    }

    /// Records queued and not yet sent.
    pub(crate) fn queued(&self) -> usize {
        self.lock().n_queued
    }

    /// Asks the task to send everything and close the channel, by `deadline` where one is
    /// given: a frame the channel has not taken by then is given up with every frame after it,
    /// and the channel closes with what is left of the time as its linger (see
    /// [`Outlet::run`]). Without one, the task sends everything and the channel keeps its own
    /// linger.
    pub(crate) fn close(&self, deadline: Option<Instant>) {
        let mut state = self.lock();
        state.closing = true;
        self.refusing.store(true, Ordering::Relaxed);
        self.seal(&mut state);
        // Published only once the outlet refuses calls (under the lock): a call accepted
        // after the task gave up would be neither sent nor counted. A later close keeps the
        // earlier deadline.
        if let Some(deadline) = deadline {
            self.close_by.send_if_modified(|by| match by {
                Some(earlier) if *earlier <= deadline => false,
                _ => {
                    *by = Some(deadline);
                    true
                }
            });
        }
        drop(state);
        self.ready.notify_one();
    }

    /// The next frame to send with the channel to send it on (taken from the state until the
    /// send is done), or when to look again (`trad`'s delay).
    fn next_frame(&self) -> (Option<(Outgoing, Sink)>, Option<Instant>, bool) {
        let mut state = self.lock();
        let outgoing = if let Some(unsent) = state.unsent.take() {
            unsent
        } else if let Some(frame) = state.sealed.pop_front() {
            state.leaving(frame)
        } else if state.open.is_some() {
            let since = state.open_since.unwrap_or_else(Instant::now);
            let due = since + self.config.max_delay;
            let take = match self.config.aggregation {
                Aggregation::None | Aggregation::Ovfl => true,
                Aggregation::Trad => state.closing || Instant::now() >= due,
            };
            if !take {
                return (None, Some(due), false);
            }
            state.open_since = None;
            let frame = state.open.take().expect("just looked");
            state.leaving(frame)
        } else {
            return (None, None, state.closing);
        };
        // The task puts the channel back after every send that did not fail, and stops at one
        // that did; `release` only borrows it under this lock.
        let sink = state
            .sink
            .take()
            .expect("the channel is back between the task's sends");
        (Some((outgoing, sink)), None, false)
    }

    /// The task: sends frames until closed, then closes the channel. A channel that fails
    /// ends it too: `on_failure` hears why, and how many records the outlet held then (the
    /// frame the channel refused and the ones queued after it), once, and the channel is closed
    /// at once (no linger: it takes nothing more). The member's own loopback queue fails only
    /// once the node is shut down, and then reports nothing.
    ///
    /// A close with a deadline ends by it: a send the channel has not taken by then is given
    /// up (cancelled: the channel took nothing of it), with every frame queued after it, and
    /// the channel closes with its linger cut to what is left (none). What was given up and
    /// what the channel's close found not taken come back as one
    /// [`ferromq_core::Error::Undelivered`] in frames (the calls in its reason), as do what a
    /// failed channel left. So the task never needs aborting, which would drop the channel
    /// without a close.
    pub(crate) async fn run(
        self: Arc<Self>,
        sink: Sink,
        on_failure: impl Fn(String, u64) + Send + 'static,
    ) -> ferromq_core::Result<()> {
        self.lock().sink = Some(sink);
        let (given_up, failure) = loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            let (next, due, closing) = self.next_frame();
            let Some(((parts, on_left, n_records), mut sink)) = next else {
                if closing {
                    break (GivenUp::default(), None);
                }
                match due {
                    // tokio's timers tick in milliseconds: a `trad` delay shorter than that
                    // is kept by yielding until it is due (other tasks run meanwhile), so
                    // `aggregate-us` means microseconds.
                    Some(due) if due.saturating_duration_since(Instant::now()) < TIMER_TICK => {
                        tokio::task::yield_now().await;
                    }
                    Some(due) => {
                        tokio::select! {
                            () = ready => {}
                            () = tokio::time::sleep_until(due - TIMER_TICK) => {}
                        }
                    }
                    None => ready.await,
                }
                continue;
            };
            let send = async {
                match &mut sink {
                    Sink::Channel(channel) => channel
                        .send_parts(parts)
                        .await
                        .map_err(|failed| failed.error.to_string()),
                    Sink::Loopback(queue) => queue.send(parts).map_err(|_| SHUT_DOWN.to_owned()),
                }
            };
            let sent = tokio::select! {
                biased;
                sent = send => sent,
                // Polled only when the send waits (`biased`): nothing to pay on the way of a
                // send the channel takes at once.
                () = close_deadline(&self.close_by) => {
                    let mut state = self.lock();
                    state.sink = Some(sink);
                    let given_up = self.give_up(&mut state, n_records);
                    drop(state);
                    // After the state says so: a caller woken by this asks why.
                    drop(on_left);
                    break (given_up, None);
                }
            };
            let mut state = self.lock();
            if let Err(cause) = sent {
                // What the outlet held will never leave: the frame the channel refused and
                // every frame queued after it. Counted as a bounded close's are, and the
                // channel is closed as at the end (its close counts what it took and the peer
                // did not), never dropped.
                let given_up = self.give_up(&mut state, n_records);
                state.failure = Some(cause.clone());
                state.sink = Some(sink);
                self.refusing.store(true, Ordering::Relaxed);
                drop(state);
                tracing::error!(destination = self.dest, %cause, lost_calls = given_up.records, "rpc channel failed");
                on_failure(cause.clone(), given_up.records);
                break (given_up, Some(cause));
            }
            state.sink = Some(sink);
            self.sent(&mut state, on_left, n_records);
        };
        let sink = self.lock().sink.take();
        let Some(Sink::Channel(mut channel)) = sink else {
            return Ok(());
        };
        // A failed channel takes nothing more: closed at once, so that its count is there
        // without a linger's wait (a shutdown's limit, if one comes later, could not cut a
        // close already under way).
        let limit = if failure.is_some() {
            Duration::ZERO
        } else {
            (*self.close_by.borrow()).map_or(Duration::MAX, |by| {
                by.saturating_duration_since(Instant::now())
            })
        };
        let closed = channel.close_within(limit).await;
        if given_up.frames == 0 {
            return closed;
        }
        channel.counters().count_undelivered(given_up.frames);
        let not_taken = match closed {
            Ok(()) => 0,
            Err(ferromq_core::Error::Undelivered { n_messages, .. }) => n_messages,
            Err(other) => {
                tracing::warn!(error = %other, "an rpc channel's close failed");
                0
            }
        };
        let why = match failure {
            None => "the member's close reached its deadline".to_owned(),
            Some(cause) => format!("the channel failed ({cause})"),
        };
        Err(ferromq_core::Error::Undelivered {
            channel: channel.label().clone(),
            n_messages: given_up.frames + not_taken,
            reason: format!(
                "{why}: {} call(s) in {} frame(s) not sent, {not_taken} frame(s) sent and not \
                 taken",
                given_up.records, given_up.frames
            ),
        })
    }

    /// The close's deadline passed, or the channel failed, while the channel had not taken a
    /// frame of `n_records` records: it and every frame after it are given up (their callers'
    /// waits end).
    fn give_up(&self, state: &mut State, n_records: u32) -> GivenUp {
        let mut given_up = GivenUp {
            frames: 1,
            records: u64::from(n_records),
        };
        for frame in state.sealed.drain(..).chain(state.open.take()) {
            given_up.frames += 1;
            given_up.records += u64::from(frame.n_records);
        }
        // `release` keeps a refused frame only while it holds the channel, which is the
        // task's during a send: none is waiting here.
        debug_assert!(
            state.unsent.is_none(),
            "a frame kept by `release` during a send"
        );
        state.open_since = None;
        let n_queued = state.n_queued;
        self.queue_less(state, n_queued);
        state.given_up = true;
        self.room.notify_waiters();
        self.drained.notify_waiters();
        given_up
    }
}

/// How [`Outlet::flush`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// Everything accepted was handed to the channel.
    Drained,
    /// Records were still queued at the deadline.
    TimedOut,
    /// Records will never leave: the channel failed, or a bounded close gave them up (the
    /// cause, as a [`Rejection::Failed`] says it).
    NotSent(String),
}

impl Flushed {
    /// The end of a flush already, or `None` while records are queued.
    fn already(state: &State) -> Option<Flushed> {
        match state.not_sent() {
            Some(cause) => Some(Flushed::NotSent(cause)),
            None if state.n_queued == 0 => Some(Flushed::Drained),
            None => None,
        }
    }
}

/// What a bounded close, or the channel's failure, gave up ([`Outlet::run`]).
#[derive(Debug, Default)]
struct GivenUp {
    frames: u64,
    records: u64,
}

/// Completes at the deadline of a bounded close, once one is asked for; never before.
async fn close_deadline(close_by: &watch::Sender<Option<Instant>>) {
    let mut close_by = close_by.subscribe();
    let by = match close_by.wait_for(Option::is_some).await {
        Ok(by) => *by,
        Err(_) => None,
    };
    match by {
        Some(by) => tokio::time::sleep_until(by).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Status;

    /// Arguments whose encoding fails (postcard needs a sequence's length up front).
    struct Unencodable;

    impl Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeSeq;
            let mut seq = serializer.serialize_seq(None)?;
            seq.serialize_element(&1u8)?;
            seq.end()
        }
    }

    /// An outlet of heap frames to member 1 with `aggregation`.
    fn heap_outlet_with(aggregation: Aggregation) -> Outlet {
        let config = OutletConfig {
            aggregation,
            frame_bytes: 4096,
            max_delay: Duration::from_secs(1),
            max_queued: 100,
        };
        Outlet::new(1, 0, config, None, Arc::new(Counts::default()))
    }

    fn heap_outlet() -> Outlet {
        heap_outlet_with(Aggregation::Trad)
    }

    /// An own frame holding `n` calls of handler 1.
    fn own_frame_of(outlet: &Outlet, n: u64) -> OwnFrame {
        let mut frame = outlet.own_frame();
        for value in 0..n {
            let written = frame.append_call(1, &value, outlet.me());
            assert_eq!(written, Ok(true));
        }
        frame
    }

    #[test]
    fn a_writers_heap_frame_takes_no_more_calls_once_it_holds_a_frames_bytes() {
        // No lent memory (a member's own outlet, ofi's): the heap would always have room.
        let outlet = heap_outlet();
        let mut frame = outlet.own_frame();
        let mut n_calls = 0;
        while frame.append_call(1, &[7u8; 8], outlet.me()) == Ok(true) {
            n_calls += 1;
            assert!(n_calls < 10_000, "a heap frame took calls without end");
        }
        assert!(frame.is_full());
        assert_eq!(frame.n_records(), n_calls);
        assert!(frame.frame.buf.len() < 4096 + wire::REPEAT_HEAD_LEN + 8);
        // A call larger than a whole frame still goes into an empty one.
        let mut frame = outlet.own_frame();
        assert_eq!(
            frame.append_call(1, &vec![1u8; 10_000], outlet.me()),
            Ok(true)
        );
        assert!(frame.is_full());
    }

    #[test]
    fn a_writers_frame_is_queued_whole_behind_the_shared_one_or_handed_back_with_why() {
        let outlet = heap_outlet();
        // An empty frame is nothing to queue.
        assert!(outlet.hand_over(outlet.own_frame(), true).is_ok());
        assert_eq!(outlet.queued(), 0);
        assert!(!outlet.busy());
        push_raw(&outlet, 2, b"shared");
        assert!(outlet.hand_over(own_frame_of(&outlet, 150), true).is_ok());
        assert_eq!(outlet.queued(), 151);
        assert!(outlet.busy());
        assert!(
            outlet.lock().open.is_none(),
            "the shared frame was sealed first"
        );
        let sealed: Vec<Vec<u64>> = std::mem::take(&mut outlet.lock().sealed)
            .into_iter()
            .map(|frame| {
                let (parts, _, _) = frame.into_parts();
                let bytes = parts.get(0).expect("the frame").data().to_vec();
                let mut reader = wire::FrameReader::new(&bytes).expect("a whole frame");
                std::iter::from_fn(|| reader.next_record())
                    .map(|record| record.expect("a whole record").head.handler)
                    .collect()
            })
            .collect();
        assert_eq!(sealed, vec![vec![2], vec![1; 150]]);
        // Full (bounded): handed back, with how many are queued; unbounded it goes in.
        match outlet
            .hand_over(own_frame_of(&outlet, 3), true)
            .map_err(|refused| *refused)
        {
            Err((Rejection::NoRoom { queued: 151, .. }, frame)) => {
                assert_eq!(frame.n_records(), 3);
                assert!(outlet.hand_over(frame, false).is_ok());
            }
            other => panic!("a full outlet took a frame: {:?}", other.is_ok()),
        }
        assert_eq!(outlet.queued(), 154);
        // Refusing (closed, failed): handed back with the cause, and said without the lock.
        assert!(!outlet.refusing());
        outlet.close(None);
        assert!(outlet.refusing());
        match outlet
            .hand_over(own_frame_of(&outlet, 1), false)
            .map_err(|refused| *refused)
        {
            Err((Rejection::Failed(cause), _)) => assert_eq!(cause, SHUT_DOWN),
            other => panic!("a closed outlet took a frame: {:?}", other.is_ok()),
        }
        assert!(matches!(outlet.refusal(), Some(Rejection::Failed(cause)) if cause == SHUT_DOWN));
        let failed = heap_outlet();
        failed.lock().failure = Some("connection reset".to_owned());
        match failed
            .hand_over(own_frame_of(&failed, 1), false)
            .map_err(|refused| *refused)
        {
            Err((Rejection::Failed(cause), _)) => assert_eq!(cause, "connection reset"),
            other => panic!("a failed outlet took a frame: {:?}", other.is_ok()),
        }
    }

    #[test]
    fn a_writers_calls_read_back_as_written_whether_staged_in_place_or_whole() {
        let lending = Arc::new(Lending::default());
        let outlet = lending_outlet(Aggregation::Trad, &lending);
        let me = outlet.me();
        let mut frame = outlet.own_frame();
        let small = [7u8; 8];
        // Larger than the stage: a short record serialised in place.
        let large = vec![3u8; 100];
        let mut expected = vec![(1, small.to_vec()), (1, small.to_vec())];
        let mut large_encoded = vec![100u8];
        large_encoded.extend(&large);
        expected.push((1, large_encoded));
        assert_eq!(frame.append_call(1, &small, me), Ok(true));
        assert_eq!(frame.append_call(1, &small, me), Ok(true));
        assert_eq!(frame.append_call(1, &large, me), Ok(true));
        // Another handler: whole, then short again, until the lent frame has no room.
        while frame.append_call(2, &small, me) == Ok(true) {
            expected.push((2, small.to_vec()));
        }
        let n_short = expected.len() - 4;
        let whole = wire::RECORD_HEAD_LEN + 8;
        let short = wire::REPEAT_HEAD_LEN + 8;
        let written = wire::HEADER_LEN + whole + short + wire::REPEAT_HEAD_LEN + 101 + whole;
        assert_eq!(frame.frame.buf.len(), written + short * n_short);
        assert!(
            frame.frame.buf.len() + short > 4096,
            "it stopped only when full"
        );
        assert_eq!(frame.n_records() as usize, expected.len());
        let (_, records) = handed_over_records(&outlet, frame);
        assert_eq!(records, expected);
    }

    #[test]
    fn short_calls_of_every_length_read_back_as_written_up_to_a_full_frame() {
        // Stored 16 bytes at a time where they fit (`write_short_call`): what the wider store
        // wrote past a record is the next record's, or past the frame's end.
        let lending = Arc::new(Lending::default());
        let outlet = lending_outlet(Aggregation::Trad, &lending);
        let me = outlet.me();
        let mut frame = outlet.own_frame();
        let mut expected = Vec::new();
        let mut len = 0;
        loop {
            let args = vec![len as u8; len];
            if frame.append_call(1, &args, me) != Ok(true) {
                break;
            }
            // postcard: the length (one byte here), then the bytes.
            let mut encoded = vec![len as u8];
            encoded.extend(&args);
            expected.push(encoded);
            len = (len + 1) % 20;
        }
        assert!(expected.len() > 250, "only {} calls fitted", expected.len());
        let used = frame.frame.buf.len();
        let (len, records) = handed_over_records(&outlet, frame);
        assert_eq!(len, used);
        assert_eq!(payloads(records), expected);
    }

    /// Hands `frame` over and reads back what the outlet sealed: its length and its records'
    /// handlers and payloads.
    fn handed_over_records(outlet: &Outlet, frame: OwnFrame) -> (usize, Vec<(u64, Vec<u8>)>) {
        assert!(outlet.hand_over(frame, false).is_ok());
        let sealed = outlet.lock().sealed.pop_front().expect("the frame");
        let (parts, _, _) = sealed.into_parts();
        let bytes = parts.get(0).expect("the frame").data().to_vec();
        let mut reader = wire::FrameReader::new(&bytes).expect("a whole frame");
        let records = std::iter::from_fn(|| reader.next_record())
            .map(|record| {
                let record = record.expect("a whole record");
                (record.head.handler, record.payload.to_vec())
            })
            .collect();
        (bytes.len(), records)
    }

    fn payloads(records: Vec<(u64, Vec<u8>)>) -> Vec<Vec<u8>> {
        records.into_iter().map(|(_, payload)| payload).collect()
    }

    #[test]
    fn calls_larger_than_the_small_stage_read_back_as_written() {
        // 64 and 256 bytes go through the large stage, 416 are written in place.
        let lending = Arc::new(Lending::default());
        let outlet = lending_outlet(Aggregation::Trad, &lending);
        let me = outlet.me();
        let mut frame = outlet.own_frame();
        let (small, large, larger) = ([[1u8; 32]; 2], [[2u8; 32]; 8], [[3u8; 32]; 13]);
        for _ in 0..2 {
            assert_eq!(frame.append_call(1, &small, me), Ok(true));
            assert_eq!(frame.append_call(1, &large, me), Ok(true));
            assert_eq!(frame.append_call(1, &larger, me), Ok(true));
        }
        let (_, records) = handed_over_records(&outlet, frame);
        let expected = [vec![1u8; 64], vec![2; 256], vec![3; 416]];
        assert_eq!(payloads(records), [expected.clone(), expected].concat());
    }

    #[tokio::test]
    async fn a_flush_says_why_queued_records_will_not_leave() {
        let outlet = heap_outlet();
        let pushed = outlet.try_push(
            RecordHead::call(1, 0, 0),
            &Payload::Encode(&7u32),
            None,
            None,
            true,
            false,
        );
        assert!(pushed.is_ok());
        let soon = Instant::now() + Duration::from_millis(50);
        // No task sends: the record stays queued.
        assert_eq!(outlet.flush(soon).await, Flushed::TimedOut);
        assert_eq!(
            heap_outlet().flush(soon).await,
            Flushed::Drained,
            "nothing queued"
        );
        outlet.lock().failure = Some("connection reset".to_owned());
        let flushed = outlet.flush(Instant::now() + Duration::from_secs(30)).await;
        assert_eq!(flushed, Flushed::NotSent("connection reset".to_owned()));
        assert_eq!(outlet.not_sent().as_deref(), Some("connection reset"));
    }

    /// A channel that takes `takes` frames, then refuses every other one as a peer gone;
    /// `closed` is set when it is closed.
    #[derive(Debug)]
    struct Refusing {
        takes: usize,
        closed: Arc<AtomicBool>,
    }

    struct RefusingSocket {
        label: ferromq_core::ChannelLabel,
        takes: usize,
        closed: Arc<AtomicBool>,
    }

    #[async_trait::async_trait]
    impl ferromq_core::Socket for RefusingSocket {
        fn label(&self) -> &ferromq_core::ChannelLabel {
            &self.label
        }
        async fn bind(
            &mut self,
            address: &ferromq_core::Address,
        ) -> ferromq_core::Result<ferromq_core::Address> {
            Ok(address.clone())
        }
        async fn connect(&mut self, _address: &ferromq_core::Address) -> ferromq_core::Result<()> {
            Ok(())
        }
        async fn send_parts(
            &mut self,
            parts: Parts,
            _timeout: Option<Duration>,
        ) -> Result<(), ferromq_core::SendError<Parts>> {
            if self.takes == 0 {
                let error = ferromq_core::Error::PeerGone {
                    channel: self.label.clone(),
                    reason: "refused by the test".to_owned(),
                };
                return Err(ferromq_core::SendError::new(error, parts));
            }
            self.takes -= 1;
            Ok(())
        }
        async fn receive_parts(&mut self) -> ferromq_core::Result<Parts> {
            std::future::pending().await
        }
        async fn close(&mut self, _linger: Duration) -> ferromq_core::Result<()> {
            self.closed.store(true, Ordering::Relaxed);
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl Transport for Refusing {
        fn name(&self) -> &'static str {
            "refusing"
        }

        async fn create_socket(
            &self,
            config: &ferromq_core::ChannelConfig,
            socket_name: &str,
        ) -> ferromq_core::Result<Box<dyn ferromq_core::Socket>> {
            Ok(Box::new(RefusingSocket {
                label: ferromq_core::ChannelLabel::new(socket_name, config.socket_type),
                takes: self.takes,
                closed: Arc::clone(&self.closed),
            }))
        }
    }

    /// A channel that fails with records queued: the frame it refused and every frame after
    /// it are counted, told to the node (`on_failure`, which keeps them for `take_failures`)
    /// and returned as the task's `Undelivered`, which the member's shutdown reports, and the
    /// channel is closed. Before, they were dropped with no number anywhere, the task ended
    /// `Ok`, and the channel was dropped unclosed.
    #[tokio::test]
    async fn a_failed_channel_counts_the_records_it_held() {
        let outlet = Arc::new(heap_outlet_with(Aggregation::None));
        for value in 0..5u32 {
            let pushed = outlet.try_push(
                RecordHead::call(1, 0, 0),
                &Payload::Encode(&value),
                None,
                None,
                true,
                false,
            );
            assert!(pushed.is_ok());
        }
        assert_eq!(outlet.queued(), 5);
        let config = ferromq_core::ChannelConfig::new(
            "rpc->member-1",
            ferromq_core::SocketType::Push,
            ferromq_core::Method::Connect,
        )
        .with_address("tcp://127.0.0.1:1");
        let closed = Arc::new(AtomicBool::new(false));
        let refusing = Refusing {
            takes: 2,
            closed: Arc::clone(&closed),
        };
        let channel = Channel::open(&refusing, config, "rpc->member-1")
            .await
            .expect("the test's channel opens");
        let told = Arc::new(Mutex::new(Vec::new()));
        let on_failure = {
            let told = Arc::clone(&told);
            move |cause: String, lost: u64| told.lock().unwrap().push((cause, lost))
        };
        let ended = Arc::clone(&outlet)
            .run(Sink::Channel(Box::new(channel)), on_failure)
            .await;
        match ended {
            Err(ferromq_core::Error::Undelivered {
                channel,
                n_messages: 3,
                reason,
            }) => {
                assert_eq!(channel.name, "rpc->member-1");
                assert!(reason.contains("refused by the test"), "{reason}");
            }
            other => panic!("the task of a failed channel ended with {other:?}"),
        }
        let told = std::mem::take(&mut *told.lock().unwrap());
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].1, 3);
        assert!(told[0].0.contains("refused by the test"), "{}", told[0].0);
        assert_eq!(outlet.queued(), 0);
        assert!(outlet.refusing());
        assert!(
            closed.load(Ordering::Relaxed),
            "the failed channel was not closed"
        );
        // Flushes and later calls are told the channel's cause, not a shutdown's.
        let cause = outlet.not_sent().expect("records were not sent");
        assert!(cause.contains("refused by the test"), "{cause}");
        let flushed = outlet.flush(Instant::now() + Duration::from_secs(30)).await;
        assert_eq!(flushed, Flushed::NotSent(cause));
    }

    #[test]
    fn a_call_that_fails_to_encode_leaves_the_calls_before_it_in_the_frame() {
        let outlet = heap_outlet();
        let head = |handler: u64| RecordHead::call(handler, 0, 0);
        let pushed = outlet.try_push(head(1), &Payload::Encode(&7u32), None, None, true, false);
        assert!(pushed.is_ok());
        let refused = outlet.try_push(
            head(2),
            &Payload::Encode(&Unencodable),
            None,
            None,
            true,
            false,
        );
        assert!(matches!(refused, Err(Rejection::Encode(..))));
        let pushed = outlet.try_push(head(3), &Payload::Encode(&9u32), None, None, true, false);
        assert!(pushed.is_ok());

        let frame = outlet.lock().open.take().expect("an open frame");
        let (parts, _, n_records) = frame.into_parts();
        assert_eq!(n_records, 2);
        let bytes = parts.get(0).expect("the frame").data().to_vec();
        let mut reader = wire::FrameReader::new(&bytes).expect("a whole frame");
        let mut handlers = Vec::new();
        while let Some(record) = reader.next_record() {
            let record = record.expect("a whole record");
            handlers.push((record.head.handler, record.payload.to_vec()));
        }
        assert_eq!(handlers, vec![(1, vec![7]), (3, vec![9])]);
    }

    fn ovfl_outlet() -> Outlet {
        heap_outlet_with(Aggregation::Ovfl)
    }

    fn handlers_in(parts: &Parts) -> Vec<u64> {
        let bytes = parts.get(0).expect("the frame").data().to_vec();
        let mut reader = wire::FrameReader::new(&bytes).expect("a whole frame");
        let mut handlers = Vec::new();
        while let Some(record) = reader.next_record() {
            handlers.push(record.expect("a whole record").head.handler);
        }
        handlers
    }

    #[test]
    fn held_answers_leave_in_one_frame_from_the_releasing_caller_when_the_task_is_idle() {
        let outlet = ovfl_outlet();
        let (sink, mut frames) = tokio::sync::mpsc::unbounded_channel();
        outlet.lock().sink = Some(Sink::Loopback(sink));
        let answer = |handler: u64| RecordHead::answer(wire::KIND_REPLY, handler, 0, Status::Ok);
        assert!(!outlet.busy());
        for handler in [1, 2, 3] {
            assert!(
                outlet
                    .try_push_held::<[u8]>(answer(handler), &Payload::Raw(&[9]), None)
                    .is_ok()
            );
        }
        assert!(
            frames.try_recv().is_err(),
            "a held answer left before its release"
        );
        // What an `ovfl` writer looks at: records queued, then all of them sent.
        assert!(outlet.busy());
        outlet.release();
        assert!(!outlet.busy());
        let frame = frames
            .try_recv()
            .expect("the answers left at their release");
        assert_eq!(handlers_in(&frame), vec![1, 2, 3]);
        assert!(frames.try_recv().is_err());
        assert_eq!(outlet.queued(), 0);
        assert_eq!(outlet.counts.records.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn held_answers_wait_for_the_task_while_it_sends_and_a_refused_frame_goes_first() {
        let outlet = ovfl_outlet();
        let answer = |handler: u64| RecordHead::answer(wire::KIND_REPLY, handler, 0, Status::Ok);
        // No channel in the state: the task is sending; the answer stays for it.
        assert!(
            outlet
                .try_push_held::<[u8]>(answer(1), &Payload::Raw(&[]), None)
                .is_ok()
        );
        outlet.release();
        assert_eq!(outlet.queued(), 1);
        assert!(outlet.lock().open.is_some());

        // A channel that does not take the frame: it is kept, first in line, for the task.
        let (sink, frames) = tokio::sync::mpsc::unbounded_channel();
        drop(frames);
        outlet.lock().sink = Some(Sink::Loopback(sink));
        assert!(
            outlet
                .try_push_held::<[u8]>(answer(2), &Payload::Raw(&[]), None)
                .is_ok()
        );
        outlet.release();
        let mut state = outlet.lock();
        assert_eq!(state.n_queued, 2);
        let (parts, _, n_records) = state.unsent.take().expect("the refused frame, kept");
        assert_eq!((handlers_in(&parts), n_records), (vec![1, 2], 2));
    }

    /// Lends every frame's memory (as shmem does) and notes the sizes it was asked for.
    #[derive(Debug, Default)]
    struct Lending {
        sizes: Mutex<Vec<usize>>,
    }

    #[async_trait::async_trait]
    impl Transport for Lending {
        fn name(&self) -> &'static str {
            "lending"
        }

        fn try_new_message(&self, size: usize) -> Option<Message> {
            self.sizes.lock().unwrap().push(size);
            Some(Message::new(size))
        }

        async fn create_socket(
            &self,
            config: &ferromq_core::ChannelConfig,
            _socket_name: &str,
        ) -> ferromq_core::Result<Box<dyn ferromq_core::Socket>> {
            Err(ferromq_core::Error::UnknownTransport {
                name: config.name.clone(),
                available: String::new(),
            })
        }
    }

    fn lending_outlet(aggregation: Aggregation, lending: &Arc<Lending>) -> Outlet {
        let config = OutletConfig {
            aggregation,
            frame_bytes: 4096,
            max_delay: Duration::from_secs(1),
            max_queued: 100,
        };
        let transport: Arc<dyn Transport> = Arc::clone(lending) as Arc<dyn Transport>;
        Outlet::new(1, 0, config, Some(transport), Arc::new(Counts::default()))
    }

    /// Pushes a held call of `args` to `handler`, which the outlet must take.
    fn push_raw(outlet: &Outlet, handler: u64, args: &[u8]) {
        let raw: Payload<'_, ()> = Payload::Raw(args);
        let call = RecordHead::call(handler, 0, 0);
        assert!(outlet.try_push(call, &raw, None, None, true, true).is_ok());
    }

    #[test]
    fn a_frame_that_mostly_leaves_with_one_call_starts_small_and_grows_keeping_every_call() {
        let lending = Arc::new(Lending::default());
        let outlet = lending_outlet(Aggregation::Ovfl, &lending);
        // 20 calls of 64 bytes: more than a small frame holds, less than a full one.
        for handler in 0..20 {
            push_raw(&outlet, handler, &[handler as u8; 64]);
        }
        assert_eq!(*lending.sizes.lock().unwrap(), vec![SMALL_FRAME, 4096]);
        let frame = outlet.lock().open.take().expect("one open frame");
        assert!(
            outlet.lock().sealed.is_empty(),
            "the small frame grew, not sealed"
        );
        let (parts, _, n_records) = frame.into_parts();
        assert_eq!(n_records, 20);
        let bytes = parts.get(0).expect("the frame").data().to_vec();
        let mut reader = wire::FrameReader::new(&bytes).expect("a whole frame");
        for handler in 0..20u64 {
            let record = reader.next_record().expect("a record").expect("whole");
            assert_eq!(record.head.handler, handler);
            assert_eq!(record.payload, &[handler as u8; 64]);
        }
        assert!(reader.next_record().is_none());

        // Calls packed while the destination lagged left in a frame larger than a small one:
        // the next frame starts full.
        let (sink, mut frames) = tokio::sync::mpsc::unbounded_channel();
        outlet.lock().sink = Some(Sink::Loopback(sink));
        for handler in 0..20 {
            push_raw(&outlet, handler, &[2; 64]);
        }
        outlet.release();
        assert_eq!(handlers_in(&frames.try_recv().unwrap()).len(), 20);
        lending.sizes.lock().unwrap().clear();
        push_raw(&outlet, 1, &[1; 64]);
        assert_eq!(*lending.sizes.lock().unwrap(), vec![4096]);

        // A lone call larger than a small frame grows one; the frames after it start full
        // until one leaves small again.
        let lending = Arc::new(Lending::default());
        let outlet = lending_outlet(Aggregation::None, &lending);
        let (sink, mut frames) = tokio::sync::mpsc::unbounded_channel();
        outlet.lock().sink = Some(Sink::Loopback(sink));
        for size in [300, 300, 64, 64] {
            push_raw(&outlet, size as u64, &vec![7u8; size]);
            outlet.release();
            assert_eq!(handlers_in(&frames.try_recv().unwrap()), vec![size as u64]);
        }
        assert_eq!(
            *lending.sizes.lock().unwrap(),
            vec![SMALL_FRAME, 4096, 4096, 4096, SMALL_FRAME]
        );

        // `trad` frames are made full at once: they are meant to fill.
        let lending = Arc::new(Lending::default());
        let outlet = lending_outlet(Aggregation::Trad, &lending);
        push_raw(&outlet, 1, &[1; 64]);
        assert_eq!(*lending.sizes.lock().unwrap(), vec![4096]);
    }

    /// The records of an outlet's open frame as (handler, flags, payload), and the frame's length.
    fn open_records(outlet: &Outlet) -> (Vec<(u64, u8, Vec<u8>)>, usize) {
        let frame = outlet.lock().open.take().expect("an open frame");
        let (parts, _, n_records) = frame.into_parts();
        let bytes = parts.get(0).expect("the frame").data().to_vec();
        let mut reader = wire::FrameReader::new(&bytes).expect("a whole frame");
        let records: Vec<_> = std::iter::from_fn(|| reader.next_record())
            .map(|record| {
                let record = record.expect("a whole record");
                (
                    record.head.handler,
                    record.head.flags,
                    record.payload.to_vec(),
                )
            })
            .collect();
        assert_eq!(records.len(), n_records as usize);
        (records, bytes.len())
    }

    #[test]
    fn plain_calls_to_the_handler_of_the_call_before_them_take_the_short_form() {
        for lending in [None, Some(Arc::new(Lending::default()))] {
            let outlet = match &lending {
                None => heap_outlet(),
                Some(lending) => lending_outlet(Aggregation::Trad, lending),
            };
            push_raw(&outlet, 1, &[1; 8]);
            push_raw(&outlet, 1, &[2; 8]);
            push_raw(&outlet, 1, &[3; 8]);
            // Another handler, and a call that waits for its result, are whole records; a
            // plain call after them repeats the handler of the one just before.
            push_raw(&outlet, 2, &[4; 8]);
            let wants_result = RecordHead::call(2, 9, wire::WANTS_RESULT);
            let raw: Payload<'_, ()> = Payload::Raw(&[5; 8]);
            assert!(
                outlet
                    .try_push(wants_result, &raw, None, None, true, true)
                    .is_ok()
            );
            push_raw(&outlet, 2, &[6; 8]);
            let (records, len) = open_records(&outlet);
            let expected: Vec<(u64, u8, Vec<u8>)> = vec![
                (1, 0, vec![1; 8]),
                (1, 0, vec![2; 8]),
                (1, 0, vec![3; 8]),
                (2, 0, vec![4; 8]),
                (2, wire::WANTS_RESULT, vec![5; 8]),
                (2, 0, vec![6; 8]),
            ];
            assert_eq!(records, expected);
            let long = wire::RECORD_HEAD_LEN + 8;
            let short = wire::REPEAT_HEAD_LEN + 8;
            assert_eq!(len, wire::HEADER_LEN + 3 * long + 3 * short);
        }
    }

    #[test]
    fn a_repeated_call_too_large_for_the_short_form_is_written_whole() {
        let large = vec![7u8; usize::from(u16::MAX) + 1];
        // In lent memory with room for the whole head, and in a heap frame.
        let lending = Arc::new(Lending::default());
        let config = OutletConfig {
            aggregation: Aggregation::Trad,
            frame_bytes: 4 * large.len(),
            max_delay: Duration::from_secs(1),
            max_queued: 100,
        };
        let transport: Arc<dyn Transport> = Arc::clone(&lending) as Arc<dyn Transport>;
        let lent = Outlet::new(1, 0, config, Some(transport), Arc::new(Counts::default()));
        let heap = Outlet::new(1, 0, config, None, Arc::new(Counts::default()));
        for outlet in [lent, heap] {
            push_raw(&outlet, 3, &[1]);
            push_raw(&outlet, 3, &large);
            push_raw(&outlet, 3, &[2]);
            let (records, len) = open_records(&outlet);
            // Compared as a whole: a failure would print 64 KiB.
            assert!(records == vec![(3, 0, vec![1]), (3, 0, large.clone()), (3, 0, vec![2])]);
            let whole = 2 * wire::RECORD_HEAD_LEN + 1 + large.len();
            assert_eq!(len, wire::HEADER_LEN + whole + wire::REPEAT_HEAD_LEN + 1);
        }

        // Lent memory without room to widen it: the call goes into the next frame.
        let lending = Arc::new(Lending::default());
        let config = OutletConfig {
            aggregation: Aggregation::Trad,
            frame_bytes: wire::HEADER_LEN + wire::RECORD_HEAD_LEN + 1 + large.len() + 10,
            max_delay: Duration::from_secs(1),
            max_queued: 100,
        };
        let transport: Arc<dyn Transport> = Arc::clone(&lending) as Arc<dyn Transport>;
        let outlet = Outlet::new(1, 0, config, Some(transport), Arc::new(Counts::default()));
        push_raw(&outlet, 3, &[1]);
        push_raw(&outlet, 3, &large);
        let sealed = outlet
            .lock()
            .sealed
            .pop_front()
            .expect("the first frame, sealed");
        let (parts, _, n_records) = sealed.into_parts();
        assert_eq!((handlers_in(&parts), n_records), (vec![3], 1));
        let (records, _) = open_records(&outlet);
        assert!(records == vec![(3, 0, large)]);
    }

    #[test]
    fn a_call_of_raw_bytes_sets_its_payload_length() {
        let outlet = heap_outlet();
        let raw: Payload<'_, ()> = Payload::Raw(&[5, 6, 7]);
        assert!(
            outlet
                .try_push(RecordHead::call(4, 0, 0), &raw, None, None, true, false)
                .is_ok()
        );
        let frame = outlet.lock().open.take().expect("an open frame");
        let (parts, _, _) = frame.into_parts();
        let bytes = parts.get(0).expect("the frame").data().to_vec();
        let mut reader = wire::FrameReader::new(&bytes).expect("a whole frame");
        let record = reader.next_record().expect("a record").expect("whole");
        assert_eq!(record.payload, &[5, 6, 7]);
        assert!(reader.next_record().is_none());
    }
}
