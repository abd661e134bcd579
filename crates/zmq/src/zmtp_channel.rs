//! PUSH and PAIR over tcp and ipc, written by ferromq rather than zmq.rs, so that a message
//! accepted by `send` is never lost with a peer that dies. (Also PULL, PUB, and the REQ and
//! REP of shmem's descriptor carrier, which only take frames in and write through each
//! connection's [`PeerLink`]: see [`Pattern`].)
//!
//! zmq.rs gives every peer a queue of its own and drops that queue when the peer's connection
//! ends: a receiver SIGKILLed with messages queued for it took them along, and the sender,
//! which cannot tell "written" from "dropped", exited 0 (127 of 1 501 in a restart test). Here
//! there is one queue per socket (bounded by `sndBufSize`) and one writer per connected peer
//! that takes a batch from its front, writes it and only then lets it go:
//! - a writer whose peer went away puts back, at the front and in order, every message of its
//!   batch not yet written whole to the kernel, and the next peer (or the same one reconnected)
//!   gets them. Before writing a batch, a writer looks (a `poll` that reads nothing) whether
//!   its peer closed or shut its writing meanwhile, so a peer that died while the sender was
//!   stopped gets nothing written;
//! - what was written to the kernel is handed over (ARCHITECTURE.md's hand-over rule, as for any
//!   transport): a receiver SIGKILLed later loses what sat in its socket buffer;
//! - `send` waits while there is no peer or the queue plus what the batches in writers' hands
//!   have not written whole reach `sndBufSize` (a writer whose vectored write finishes some
//!   of its batch's messages counts them out at once, so that what a process that exits then
//!   loses is exact, and wakes a waiting `send`); a cancelled send leaves nothing behind (the
//!   message is queued only by the call that returns `Ok`);
//! - `close` waits, `linger` being a bound on silence, until nothing is queued or held, and
//!   reports what is left as [`Error::Undelivered`]; the kernel delivers what was written
//!   after the process exits.
//!
//! What was written is then the receiver's to report. A pull's or pair's `close` (the zeromq
//! transport's, not a carrier's: see [`crate::PeerRules`]) stops its peers' writes, makes and
//! serves no more connections, reads each one to its end into an inbox without a bound
//! (`linger`, at least [`DRAIN_AT_LEAST`], bounding the wait), and reports what the inbox and
//! the receiver's batch hold as [`Error::Undelivered`], with what a pair had not written once
//! its connections ended. How the peer's writes stop:
//! - over a unix stream, `shutdown(SHUT_RD)`: the writer gets `EPIPE` at once and puts its
//!   batch back;
//! - over tcp, where `SHUT_RD` tells the peer nothing, a ferromq peer is told by this side's
//!   end of writing (`shutdown(SHUT_WR)`, a FIN): its writer sees it (`POLLRDHUP`) before its
//!   next batch, puts that batch back and shuts its own writing, so the end is read after
//!   everything it wrote. This side writes nothing more (a pair's batch under way stops, what
//!   it had not written whole is counted; a partial message at the end is dropped by the
//!   peer's reader). A peer that neither sends nor ends for [`ANSWER_WITHIN`] (a stopped
//!   process) gets `SHUT_RD` as below. Nor is a pair told whose own inbox is full while it
//!   goes on sending: its window closed, this side's end of writing waits behind what this
//!   side wrote. This side reads what comes until more came than a peer that stopped can have
//!   had under way ([`MOST_AFTER_TELLING`]), or the drain's bound, then shuts its reading; the
//!   socket's end (a reset, unread bytes still arriving) loses what either side had in flight,
//!   uncounted (TCP can tell nothing to a peer that reads nothing);
//! - a libzmq or FairMQ peer over tcp gets `SHUT_RD` and is not told: what it writes after the
//!   last read goes with the connection.
//!
//! A connection whose write failed (or whose peer closed) stops being a peer at once (sends go
//! elsewhere, a pair serves a new peer) while its reader still takes in what the peer sent
//! before its end, so between ferromq peers (within the drain's bound, and except for a pair
//! over tcp that reads nothing, above) a pair drops nothing its peer counted as written.
//!
//! Cancellation: a cancelled `close` leaves a receiver draining (no connections, an unbounded
//! inbox); a second `close` drains and counts again. In ferromq only an abort of a device's
//! RESETTING DEVICE cancels a close, and the runner then closes that channel again at END.
//!
//! A pub is the exception to the one queue: it never waits and gives each subscriber a queue of
//! its own, bounded by `sndBufSize` (counting what its writer's batch has not written whole).
//! `send` puts a copy of the message's handles (the bytes are shared) in the queue of every
//! subscriber whose topics match; a subscriber whose queue is full misses the message, counted
//! in the socket's `SendFigures::dropped_for_slow_subscribers` (libzmq's PUB drops at a
//! subscriber's high-water mark the same way), so one stalled subscriber holds back neither the publisher nor the other
//! subscribers (zmq.rs's PUB queued 100 000 messages per subscriber and said nothing of what it
//! dropped; the `sndBufSize` wait put in front of it stopped everything instead). With no
//! subscriber a message goes nowhere. What is queued for a subscriber goes with it when it
//! leaves; `close` waits for the queues as for a push's.
//!
//! Each connection also has a reader, beside its writer in one task: it answers PINGs and, for
//! a pair, puts whole messages in the socket's inbox (bounded by `rcvBufSize`: a full inbox
//! stops reading, so the peer's sends wait), which `receive` takes from, whichever connection
//! they came by. A pair serves one peer at a time and refuses others, as libzmq's PAIR does;
//! it speaks libzmq's PAIR, so FairMQ's pair channels are its peers.
//!
//! The wire protocol is ZMTP 3 with the NULL mechanism ([`crate::zmtp`]), as zmq.rs and libzmq
//! speak it; a peer's identity is checked against the socket's [`crate::PeerRules`] as for
//! every other pattern, before its socket type. Idle push peers take turns; a busy one is
//! skipped and takes more when it is done (libzmq's round robin over peers with room).
//!
//! Cancellation and drop: the listeners, connectors and connections are tasks that end when
//! the socket closes or is dropped; a write in progress then is abandoned, and what its batch
//! had not written whole is counted as undelivered by `close`. One of the zeromq transport
//! (tcp, ipc) dropped without a close logs, as an error, what it loses: what `send` accepted
//! and was not written (at most: a writer may still write between the count and its stop), and
//! a pull's or pair's inbox and batch.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferromq_core::{Address, ChannelLabel, Error, Message, Parts, SendError, TcpHost};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::handshake::Mismatch;
use crate::zmtp;

/// The least a closing receiver gives its connections to be read to their end, whatever its
/// `linger`: reading what is in this host's buffers takes no peer's help, only the tasks' turns.
const DRAIN_AT_LEAST: Duration = Duration::from_secs(1);
/// Why a receiver's close reports the messages it was sent and did not take.
pub(crate) const UNREAD: &str =
    "their senders wrote them to this receiver, and it closed before taking them";
/// The most messages, and about the most bytes, a writer takes at a time.
const BATCH_MESSAGES: usize = 128;
const BATCH_BYTES: usize = 1 << 20;
/// The most whole messages a connection's reader decodes before it puts them in the inbox.
const INBOX_BATCH: usize = 256;
/// A frame body at least this long is written from its own buffer instead of being copied.
const COPY_LIMIT: usize = 16 * 1024;
/// A queued message's frames: a single-part message keeps its one frame inline, so queueing it
/// costs no heap allocation (a `Vec` per message was a tenth of a 64-byte sender's time).
type Frames = smallvec::SmallVec<[Bytes; 1]>;
/// The most slices one vectored write gets (Linux's IOV_MAX is 1024).
const MAX_SLICES: usize = 512;
/// How long a closing receiver waits for the end of a ferromq peer over tcp that it told to
/// stop writing (its own end of writing), counted from the telling and again from each read
/// that brought bytes, before it shuts its reading instead: a live peer's writer stops before
/// its next batch; a stopped process never answers.
const ANSWER_WITHIN: Duration = Duration::from_millis(500);
/// Beyond four times the connection's kernel buffers, the bytes a closing receiver reads from
/// a ferromq peer over tcp after telling it to stop before it shuts its reading instead
/// (looked at between large bodies only). A peer that stopped sends at most what the kernel
/// buffers held and the batch it was writing; one that goes on past the bound never saw the
/// telling (a pair whose own inbox is full), and reading on would only grow the inbox until
/// the drain's bound.
const MOST_AFTER_TELLING: usize = 64 << 20;
/// How long a peer has to complete its handshake (libzmq's default handshake interval).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Reconnection back-off of a connecting socket.
const RECONNECT_MIN: Duration = Duration::from_millis(10);
const RECONNECT_MAX: Duration = Duration::from_millis(200);

/// A connected stream, tcp or ipc.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Stream::Tcp(stream) => stream.as_fd(),
            Stream::Unix(stream) => stream.as_fd(),
        }
    }
}

impl Stream {
    async fn writable(&self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.writable().await,
            Stream::Unix(stream) => stream.writable().await,
        }
    }

    fn try_write_vectored(&self, slices: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.try_write_vectored(slices),
            Stream::Unix(stream) => stream.try_write_vectored(slices),
        }
    }

    /// Writes some of `slices`: how many bytes.
    async fn write_vectored(&self, slices: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        loop {
            self.writable().await?;
            match self.try_write_vectored(slices) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                written => return written,
            }
        }
    }

    async fn write_all(&self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = self.write_vectored(&[std::io::IoSlice::new(bytes)]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            bytes = &bytes[n..];
        }
        Ok(())
    }

    fn is_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_))
    }

    /// This side's kernel buffers, send and receive, in bytes (0 where they cannot be read).
    fn kernel_buffer_bytes(&self) -> usize {
        use nix::sys::socket::{getsockopt, sockopt};
        let send = getsockopt(self, sockopt::SndBuf).unwrap_or(0);
        let receive = getsockopt(self, sockopt::RcvBuf).unwrap_or(0);
        send.saturating_add(receive)
    }

    /// Whether the peer shut its writing or closed (`POLLRDHUP`, `POLLHUP`, `POLLERR`), with
    /// what it sent before still unread, and nothing read here. Never waits.
    fn peer_hung_up(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let rdhup = PollFlags::from_bits_retain(nix::libc::POLLRDHUP);
        let mut fds = [PollFd::new(self.as_fd(), rdhup)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(n_ready) if n_ready > 0 => fds[0].revents().is_some_and(|revents| {
                revents.intersects(rdhup | PollFlags::POLLHUP | PollFlags::POLLERR)
            }),
            _ => false,
        }
    }

    /// Stops the peer's writes to this connection (a unix stream's peer then gets `EPIPE`
    /// and keeps what it had not written; over tcp the peer is not told) while what came
    /// before stays readable, the end then reading as `Ok(0)`.
    fn shutdown_read(&self) {
        self.shutdown(nix::sys::socket::Shutdown::Read);
    }

    /// Ends this side's writing: the peer reads its end.
    fn shutdown_write(&self) {
        self.shutdown(nix::sys::socket::Shutdown::Write);
    }

    fn shutdown(&self, how: nix::sys::socket::Shutdown) {
        use std::os::fd::{AsFd, AsRawFd};
        // A connection that ended already has nothing more to stop.
        let _ = nix::sys::socket::shutdown(self.as_fd().as_raw_fd(), how);
    }

    async fn readable(&self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.readable().await,
            Stream::Unix(stream) => stream.readable().await,
        }
    }

    /// Reads what is there without waiting: `Ok(0)` at the peer's end, `WouldBlock` for nothing.
    fn try_read_buf(&self, buffer: &mut bytes::BytesMut) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.try_read_buf(buffer),
            Stream::Unix(stream) => stream.try_read_buf(buffer),
        }
    }

    /// Reads what is there into the plain buffer `bytes` without waiting.
    fn try_read(&self, bytes: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.try_read(bytes),
            Stream::Unix(stream) => stream.try_read(bytes),
        }
    }

    /// Reads what is there into `decoder` without waiting, where it wants it (see
    /// `zmtp::ReadTarget`): `Ok(0)` at the peer's end, `WouldBlock` for nothing.
    fn try_read_decoder(&self, decoder: &mut zmtp::Decoder) -> std::io::Result<usize> {
        match decoder.read_target() {
            zmtp::ReadTarget::Buffer(buffer) => self.try_read_buf(buffer),
            zmtp::ReadTarget::Body(body) => {
                let n = self.try_read(body)?;
                decoder.body_filled(n);
                Ok(n)
            }
            zmtp::ReadTarget::Header => {
                let mut header = [0u8; zmtp::LONG_HEADER];
                let n = self.try_read(&mut header)?;
                decoder.accept(&header[..n]);
                Ok(n)
            }
        }
    }

    /// Reads into `decoder` whatever is there, waiting for something first: an error at the
    /// peer's end.
    async fn read_into(&self, decoder: &mut zmtp::Decoder) -> std::io::Result<()> {
        loop {
            self.readable().await?;
            match self.try_read_decoder(decoder) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => return Ok(()),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
    }
}

/// Completes at `at`; never when `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The pattern a [`ZmtpChannel`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// Sends to any number of pull peers, each message to one.
    Push,
    /// Sends to and receives from one pair peer at a time.
    Pair,
    /// Receives from any number of push peers, fairly (each connection's reader waits its turn
    /// for room in the inbox).
    Pull,
    /// shmem's carrier of a req socket (ferromq peers only): frames in from any number of rep
    /// peers, each message behind the identity of the peer it came from (as a ROUTER's
    /// envelope), frames out only through each connection's [`PeerLink`].
    Req,
    /// shmem's carrier of a rep socket: as [`Pattern::Req`], with req peers; a peer of another
    /// transport or session is refused alone, as a pull refuses one.
    Rep,
    /// Sends each message to every sub peer whose topics match, through a queue per peer
    /// (bounded by `sndBufSize`): a full queue misses the message, as libzmq's PUB drops at a
    /// subscriber's high-water mark, and the other peers are not held back.
    Pub,
}

impl Pattern {
    /// What this side announces, and what its peer must announce.
    fn socket_types(self) -> (&'static str, &'static [u8]) {
        match self {
            Pattern::Push => ("PUSH", b"PULL"),
            Pattern::Pair => ("PAIR", b"PAIR"),
            Pattern::Pull => ("PULL", b"PUSH"),
            Pattern::Req => ("REQ", b"REP"),
            Pattern::Rep => ("REP", b"REQ"),
            Pattern::Pub => ("PUB", b"SUB"),
        }
    }

    /// Whether a peer announcing `socket_type` is one this side serves (RFC 23's table: a PUB
    /// serves SUB and XSUB).
    fn serves(self, socket_type: &[u8]) -> bool {
        let (_, theirs) = self.socket_types();
        socket_type.eq_ignore_ascii_case(theirs)
            || (self == Pattern::Pub && socket_type.eq_ignore_ascii_case(b"XSUB"))
    }

    /// Whether it serves many peers and refuses a wrong one alone.
    fn fans_in(self) -> bool {
        matches!(self, Pattern::Pull | Pattern::Rep)
    }

    /// Whether each message it receives comes behind its peer's identity.
    fn envelopes(self) -> bool {
        matches!(self, Pattern::Req | Pattern::Rep)
    }
}

/// What the socket's tasks share.
struct Shared {
    label: ChannelLabel,
    pattern: Pattern,
    /// Whole messages received (pair), for `receive`; bounded by `rcvBufSize`, so a full one
    /// stops reading the connection and the peer's sends wait.
    inbox: Inbox,
    rules: crate::PeerRules,
    identity: String,
    state: Mutex<State>,
    /// Messages were written or put back, or peers came or went (senders and close wait on it).
    progress: Notify,
    figures: Arc<ferromq_core::SendFigures>,
    stop: watch::Sender<bool>,
    /// A receiving socket's close began counting what it was sent and did not take: readers
    /// stop their peers' writes and take in, without a bound, what came before; no connection
    /// is made or served any more.
    draining: watch::Sender<bool>,
    /// Whether connections are handed to the owner ([`ZmtpChannel::next_peer`]).
    report_peers: bool,
    /// Whether `next_peer` has something to hand out: a new peer or the mismatch. Set and
    /// cleared under the state's lock, read without it by `try_next_peer`, which a req or
    /// rep asks on every send (a lock there cost ~0.1 µs of a busy-polled round trip).
    peer_news: AtomicBool,
    /// The kernel's buffer sizes for each connection.
    kernel_sizes: KernelSizes,
}

/// The kernel's send and receive buffer sizes of a connection (`SO_SNDBUF`, `SO_RCVBUF`), from
/// FairMQ's `sndKernelSize` and `rcvKernelSize`: 0 leaves the system's default, as FairMQ does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KernelSizes {
    pub(crate) send: usize,
    pub(crate) receive: usize,
}

impl KernelSizes {
    /// Sets the sizes asked for on `stream`; a size the kernel refuses is said, not fatal (the
    /// connection works with the default; Linux caps what it grants at `wmem_max` / `rmem_max`
    /// without an error).
    fn apply(self, label: &ChannelLabel, stream: &impl std::os::fd::AsFd) {
        use nix::sys::socket::{setsockopt, sockopt};
        let clamp = |size: usize| size.min(i32::MAX as usize);
        if self.send > 0
            && let Err(error) = setsockopt(stream, sockopt::SndBuf, &clamp(self.send))
        {
            tracing::warn!(channel = %label, size = self.send, %error, "sndKernelSize not applied");
        }
        if self.receive > 0
            && let Err(error) = setsockopt(stream, sockopt::RcvBuf, &clamp(self.receive))
        {
            tracing::warn!(channel = %label, size = self.receive, %error, "rcvKernelSize not applied");
        }
    }
}

#[derive(Default)]
struct State {
    /// Connections not yet handed to the owner (only when it asked for them).
    new_peers: VecDeque<(Bytes, Arc<PeerLink>)>,
    /// Every connection's link, while it lasts (only when the owner asked for them): `close`
    /// lets their frames out first.
    links: Vec<Arc<PeerLink>>,
    queue: VecDeque<Frames>,
    /// Messages in writers' hands, not yet written whole.
    held: usize,
    /// Peers connected and through their handshake.
    peers: usize,
    /// Connections in their handshake (a closing receiver waits for them too).
    handshaking: usize,
    /// Connections no longer peers (their writes failed, or their peer closed) whose readers
    /// still take in what came before the end (a closing receiver waits for them too).
    ending: usize,
    peers_gone: u64,
    peer_pids: Vec<u32>,
    /// A pub's peers, each with its topics and its own queue (`queue` stays empty).
    subscribers: Vec<Subscriber>,
    /// A peer of another transport or session (a push or pair needs every peer to fit).
    mismatch: Option<Mismatch>,
    /// Peers a pull refused (it serves the others), by identity: each is said once, however
    /// often it reconnects.
    refused: Vec<Bytes>,
    /// The writers waiting for work, in the order they are woken: each queued message wakes
    /// the first and moves it to the back, so idle peers take turns (round robin, as libzmq's
    /// push) and a busy one is skipped (it takes more when it is done). A writer leaves the list
    /// when it takes a batch, and takes only its share while others wait: a sender that queues
    /// two messages at a time would otherwise feed one peer only, the first woken taking both.
    /// A writer woken and not yet back is not woken again (a wake-up per message, when the
    /// writers were all woken already, was a twentieth of a 64-byte sender's time).
    idle: VecDeque<IdleWriter>,
}

/// A pub's peer: what it subscribed to and the copies queued for it alone.
struct Subscriber {
    /// Its connection's writer, which also names it.
    writer: Arc<Notify>,
    /// Topic prefixes, one entry per subscription (a cancel removes one).
    topics: Vec<Bytes>,
    queue: VecDeque<Frames>,
    /// Its messages in its writer's hands, not yet written whole.
    held: usize,
}

impl Subscriber {
    /// Whether a message whose first frame is `first` is for this peer (a prefix match, as
    /// libzmq's; the empty topic matches everything).
    fn wants(&self, first: &[u8]) -> bool {
        self.topics.iter().any(|topic| first.starts_with(topic))
    }

    /// Takes in a subscription message (0x01 and the topic) or a cancel (0x00 and the topic);
    /// anything else a sub sends is read past.
    fn note(&mut self, body: &[u8]) {
        match body.split_first() {
            Some((1, topic)) => self.topics.push(Bytes::copy_from_slice(topic)),
            Some((0, topic)) => {
                if let Some(position) = self.topics.iter().position(|known| known == topic) {
                    self.topics.swap_remove(position);
                }
            }
            _ => {}
        }
    }
}

/// A writer waiting for work.
struct IdleWriter {
    writer: Arc<Notify>,
    /// Woken since it last found the queue empty.
    woken: bool,
}

impl State {
    fn unwritten(&self) -> usize {
        let for_subscribers: usize = self
            .subscribers
            .iter()
            .map(|subscriber| subscriber.queue.len())
            .sum();
        self.queue.len() + for_subscribers + self.held
    }

    fn subscriber(&mut self, writer: &Arc<Notify>) -> Option<&mut Subscriber> {
        self.subscribers
            .iter_mut()
            .find(|subscriber| Arc::ptr_eq(&subscriber.writer, writer))
    }

    /// Wakes the next idle writer not woken yet, if any.
    fn wake_a_writer(&mut self) {
        let Some(position) = self.idle.iter().position(|idle| !idle.woken) else {
            return;
        };
        if let Some(mut idle) = self.idle.remove(position) {
            idle.writer.notify_one();
            idle.woken = true;
            self.idle.push_back(idle);
        }
    }

    /// `writer` found nothing queued and waits: the next message may wake it.
    fn wait_for_work(&mut self, writer: &Arc<Notify>) {
        match self
            .idle
            .iter_mut()
            .find(|idle| Arc::ptr_eq(&idle.writer, writer))
        {
            Some(idle) => idle.woken = false,
            None => self.idle.push_back(IdleWriter {
                writer: Arc::clone(writer),
                woken: false,
            }),
        }
    }

    fn forget_writer(&mut self, writer: &Arc<Notify>) {
        self.idle.retain(|idle| !Arc::ptr_eq(&idle.writer, writer));
    }
}

/// Whole messages on their way from the connections' readers to `receive`, handed over in
/// batches: a reader puts what it decoded from one read in under one lock, and `receive` takes
/// everything there under one lock when its own batch is used up. (A channel operation per
/// message, tokio's bounded `mpsc`, was a quarter of a 64-byte receiver's time.)
///
/// `rcvBufSize` bounds the messages between the readers and the device: those in the inbox
/// plus those of the receiver's batch, which count until it comes back for more. Room is a
/// semaphore's permits, one a message: a reader acquires them for what it puts in, the
/// receiver gives back its batch's when it takes the next. The semaphore queues readers that
/// wait for room first come, first served, so connections with more to put in take turns
/// (fan-in stays fair).
struct Inbox {
    state: Mutex<InboxState>,
    capacity: usize,
    room: tokio::sync::Semaphore,
    /// Messages were put in (one permit: the receiver is the only one to wait on it).
    arrived: Notify,
}

#[derive(Default)]
struct InboxState {
    queue: VecDeque<Parts>,
    /// The messages of the receiver's batch, whose room it gives back when it takes the next.
    taken: usize,
}

impl Inbox {
    fn new(capacity: usize) -> Inbox {
        let capacity = capacity.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Inbox {
            state: Mutex::new(InboxState::default()),
            capacity,
            room: tokio::sync::Semaphore::new(capacity),
            arrived: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, InboxState> {
        // Nothing panics while holding the lock; a poisoned lock's data is still whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next message of the receiver's `batch`, taking the next batch when it is used up.
    fn next(&self, batch: &mut VecDeque<Parts>) -> Option<Parts> {
        if batch.is_empty() {
            let used_up = {
                let mut state = self.state();
                std::mem::swap(&mut state.queue, batch);
                std::mem::replace(&mut state.taken, batch.len())
            };
            if used_up > 0 {
                self.room.add_permits(used_up);
            }
        }
        batch.pop_front()
    }

    /// Puts `ready` into the inbox, in order, waiting for room as often as it takes (the
    /// peer's sends wait meanwhile). Cancel-safe: what is not in the inbox stays in `ready`.
    async fn put(&self, ready: &mut Vec<Parts>) {
        while !ready.is_empty() {
            let wanted = ready.len().min(self.capacity);
            let n_permits = u32::try_from(wanted).unwrap_or(u32::MAX);
            let permits = match self.room.try_acquire_many(n_permits) {
                Ok(permits) => permits,
                Err(tokio::sync::TryAcquireError::Closed) => break,
                Err(tokio::sync::TryAcquireError::NoPermits) => {
                    match self.room.acquire_many(n_permits).await {
                        Ok(permits) => permits,
                        Err(_closed) => break,
                    }
                }
            };
            // Each permit now stands for a message in the inbox, until the receiver is done
            // with it.
            permits.forget();
            self.state().queue.extend(ready.drain(..n_permits as usize));
            self.arrived.notify_one();
        }
        // The room is closed: the socket is closing and counts what it was not given.
        if !ready.is_empty() {
            self.state().queue.extend(ready.drain(..));
        }
    }

    /// Lets every reader put in all it has, without waiting: the socket is closing.
    fn open_without_bound(&self) {
        self.room.close();
    }

    /// Messages in the inbox, not yet taken by the receiver.
    fn len(&self) -> usize {
        self.state().queue.len()
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A writer never panics while holding the lock; a poisoned lock's data is still whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish(&self, state: &State) {
        self.figures.queued.store(
            state.unwritten() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Queues an accepted message behind the others and wakes a writer for it; a pub's goes
    /// to the queue of every subscriber it is for (see [`Shared::fan_out`]).
    fn enqueue(&self, state: &mut State, parts: Parts, snd_buf_size: usize) {
        let frames: Frames = parts.into_iter().map(Message::into_bytes).collect();
        if self.pattern == Pattern::Pub {
            self.fan_out(state, &frames, snd_buf_size);
        } else {
            state.queue.push_back(frames);
            state.wake_a_writer();
        }
        self.publish(state);
    }

    /// A pub's message, to every subscriber whose topics match: a copy of the frames' handles
    /// (the bytes are shared) into its queue, or, when that queue and what its writer's batch
    /// has not written whole hold `snd_buf_size` already, nothing: the subscriber misses it,
    /// counted as a drop for a slow subscriber. With no subscriber the message goes nowhere,
    /// as libzmq's PUB.
    fn fan_out(&self, state: &mut State, frames: &Frames, snd_buf_size: usize) {
        let first = frames.first().map_or(&[][..], |frame| &frame[..]);
        let mut n_dropped = 0;
        for subscriber in &mut state.subscribers {
            if !subscriber.wants(first) {
                continue;
            }
            if subscriber.queue.len() + subscriber.held >= snd_buf_size {
                n_dropped += 1;
                continue;
            }
            subscriber.queue.push_back(frames.clone());
            subscriber.writer.notify_one();
        }
        if n_dropped > 0 {
            self.figures
                .dropped_for_slow_subscribers
                .fetch_add(n_dropped, Ordering::Relaxed);
        }
    }

    /// Whether a connection's link still holds frames to write.
    fn links_have_frames(&self) -> bool {
        self.state().links.iter().any(|link| {
            !link.is_gone()
                && !link
                    .replies
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .is_empty()
        })
    }

    async fn stopped(&self) {
        let mut stop = self.stop.subscribe();
        let _ = stop.wait_for(|stopped| *stopped).await;
    }

    fn is_stopped(&self) -> bool {
        *self.stop.borrow()
    }

    async fn draining_began(&self) {
        let mut draining = self.draining.subscribe();
        let _ = draining.wait_for(|draining| *draining).await;
    }

    fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// The next batch from the front of the queue, now held by `writer`; `None` when nothing
    /// is queued, and `writer` is then among the idle ones.
    fn take_batch(&self, writer: &Arc<Notify>) -> Option<Vec<Frames>> {
        let mut state = self.state();
        if self.pattern == Pattern::Pub {
            return take_subscriber_batch(&mut state, writer);
        }
        if state.queue.is_empty() {
            state.wait_for_work(writer);
            return None;
        }
        state.forget_writer(writer);
        let share = state.queue.len().div_ceil(1 + state.idle.len());
        let mut batch = Vec::new();
        let mut bytes = 0;
        while batch.len() < BATCH_MESSAGES.min(share) && bytes < BATCH_BYTES {
            let Some(message) = state.queue.pop_front() else {
                break;
            };
            bytes += message.iter().map(Bytes::len).sum::<usize>();
            batch.push(message);
        }
        state.held += batch.len();
        Some(batch)
    }

    /// `n_more` more messages of the batch `writer` holds were written whole while the rest
    /// of it is still being written: they stop counting as held now, so that what a process
    /// that exits at this moment loses (`State::unwritten`) is exact, not the whole batch.
    /// A sender waiting for room is woken, as by a batch's end: the queue it waits on is what
    /// `ferromq top` shows, and a sender that waited with fewer than `sndBufSize` messages
    /// unwritten would contradict it (a stalled receiver's sender showed 47 of 50 and waited).
    fn wrote_part_of_batch(&self, writer: &Arc<Notify>, n_more: usize) {
        {
            let mut state = self.state();
            state.held -= n_more;
            if self.pattern == Pattern::Pub
                && let Some(subscriber) = state.subscriber(writer)
            {
                subscriber.held -= n_more;
            }
            self.publish(&state);
        }
        self.progress.notify_waiters();
    }

    /// The first `n_written` messages of a batch `writer` held were written, `n_counted` of
    /// them counted already ([`Shared::wrote_part_of_batch`]); the rest go back to the front
    /// of the queue (a pub's: of the writer's subscriber), in order.
    fn settle(
        &self,
        writer: &Arc<Notify>,
        mut batch: Vec<Frames>,
        n_written: usize,
        n_counted: usize,
    ) {
        let n_held = batch.len() - n_counted;
        let unwritten = batch.split_off(n_written.min(batch.len()));
        let put_back = !unwritten.is_empty();
        {
            let mut state = self.state();
            state.held -= n_held;
            if self.pattern == Pattern::Pub {
                if let Some(subscriber) = state.subscriber(writer) {
                    subscriber.held -= n_held;
                    for message in unwritten.into_iter().rev() {
                        subscriber.queue.push_front(message);
                    }
                }
            } else {
                for message in unwritten.into_iter().rev() {
                    state.queue.push_front(message);
                }
                if put_back {
                    state.wake_a_writer();
                }
            }
            self.publish(&state);
        }
        self.progress.notify_waiters();
    }
}

/// The next batch from the front of the queue of `writer`'s subscriber (a pub's); `None` when
/// nothing is queued for it (its next message wakes it).
fn take_subscriber_batch(state: &mut State, writer: &Arc<Notify>) -> Option<Vec<Frames>> {
    let subscriber = state.subscriber(writer)?;
    let mut batch = Vec::new();
    let mut bytes = 0;
    while batch.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
        let Some(message) = subscriber.queue.pop_front() else {
            break;
        };
        bytes += message.iter().map(Bytes::len).sum::<usize>();
        batch.push(message);
    }
    if batch.is_empty() {
        return None;
    }
    subscriber.held += batch.len();
    state.held += batch.len();
    Some(batch)
}

/// A push or pair socket over tcp and ipc (see the module docs).
pub(crate) struct ZmtpChannel {
    shared: Arc<Shared>,
    /// Messages taken from the inbox, handed out by `receive` one at a time.
    batch: VecDeque<Parts>,
    snd_buf_size: usize,
    bound_ipc_paths: Vec<PathBuf>,
    /// The accepting tasks: `close` waits for them to end, so that their addresses are free
    /// when it returns.
    listeners: Vec<tokio::task::JoinHandle<()>>,
    /// A pull or pair of the zeromq transport (not a carrier of another transport's frames):
    /// its close counts what its peers wrote to it and it did not take.
    counts_unread: bool,
}

impl ZmtpChannel {
    pub(crate) fn new(
        pattern: Pattern,
        label: &ChannelLabel,
        (snd_buf_size, rcv_buf_size): (usize, usize),
        kernel_sizes: KernelSizes,
        rules: crate::PeerRules,
        figures: Arc<ferromq_core::SendFigures>,
        report_peers: bool,
    ) -> ZmtpChannel {
        ZmtpChannel {
            batch: VecDeque::new(),
            shared: Arc::new(Shared {
                label: label.clone(),
                pattern,
                inbox: Inbox::new(rcv_buf_size),
                rules,
                identity: crate::handshake::identity(rules),
                state: Mutex::new(State::default()),
                progress: Notify::new(),
                figures,
                stop: watch::Sender::new(false),
                draining: watch::Sender::new(false),
                report_peers,
                kernel_sizes,
                peer_news: AtomicBool::new(false),
            }),
            snd_buf_size: snd_buf_size.max(1),
            bound_ipc_paths: Vec::new(),
            listeners: Vec::new(),
            counts_unread: matches!(pattern, Pattern::Pull | Pattern::Pair)
                && rules.carries_zeromq_messages(),
        }
    }

    /// The kernel buffer sizes its connections get.
    #[cfg(test)]
    pub(crate) fn kernel_sizes(&self) -> KernelSizes {
        self.shared.kernel_sizes
    }

    pub(crate) async fn bind(
        &mut self,
        label: &ChannelLabel,
        address: &Address,
    ) -> Result<Address, Error> {
        let label = label.clone().with_address(address.to_string());
        let in_runtime = |source: std::io::Error| Error::Bind {
            channel: label.clone(),
            source: Box::new(source),
        };
        let (listener, bound) = match address {
            Address::Tcp { host, port } => {
                let (listener, bound) = crate::net::bind_tcp_std(&label, host, *port)?;
                let listener = tokio::net::TcpListener::from_std(listener).map_err(in_runtime)?;
                (Listener::Tcp(listener), bound)
            }
            Address::Ipc { path } => {
                let listener = crate::net::bind_ipc_std(&label, path)?;
                self.bound_ipc_paths.push(path.clone());
                let listener = tokio::net::UnixListener::from_std(listener).map_err(in_runtime)?;
                (Listener::Unix(listener), address.clone())
            }
            other => {
                return Err(Error::UnsupportedAddress {
                    channel: label,
                    address: other.to_string(),
                    reason: "the zeromq transport binds tcp://, ipc:// and inproc:// addresses",
                });
            }
        };
        let shared = Arc::clone(&self.shared);
        let accepting_task = tokio::spawn(async move {
            let accepting = async {
                loop {
                    match listener.accept(shared.kernel_sizes, &shared.label).await {
                        Ok(stream) => {
                            tokio::spawn(serve(Arc::clone(&shared), stream, None));
                        }
                        Err(error) => accept_failed(&shared, &error).await,
                    }
                }
            };
            // A closing receiver accepts no more (see `Shared::draining`): its peers keep
            // their messages and find the address refused.
            tokio::select! {
                () = accepting => {}
                () = shared.stopped() => {}
                () = shared.draining_began() => {}
            }
        });
        self.listeners.push(accepting_task);
        Ok(bound)
    }

    /// Connects in the background, as ZeroMQ does, and again whenever the connection ends.
    pub(crate) fn connect(&mut self, label: &ChannelLabel, address: &Address) -> Result<(), Error> {
        let label = label.clone().with_address(address.to_string());
        crate::net::check_connectable(&label, address)?;
        let target = match address {
            Address::Tcp {
                host: TcpHost::Name(host),
                port,
            } => Target::Tcp(format!("{host}:{port}")),
            Address::Ipc { path } => Target::Ipc(path.clone()),
            _ => unreachable!("check_connectable lets only tcp://host:port and ipc:// through"),
        };
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            let connecting = async {
                let mut backoff = RECONNECT_MIN;
                // A closing receiver connects no more (see `Shared::draining`).
                while !shared.is_draining() {
                    match target.connect(shared.kernel_sizes, &shared.label).await {
                        Ok(stream) => {
                            // Connects again once this connection is no peer any more,
                            // though its reader may still be taking in what came before
                            // its end (for an owner that is not receiving: a while).
                            let (no_peer, no_longer) = tokio::sync::oneshot::channel();
                            tokio::spawn(serve(Arc::clone(&shared), stream, Some(no_peer)));
                            let _ = no_longer.await;
                            backoff = RECONNECT_MIN;
                        }
                        Err(error) => {
                            tracing::trace!(channel = %shared.label, %error, "not connected yet");
                            backoff = (backoff * 2).min(RECONNECT_MAX);
                        }
                    }
                    tokio::time::sleep(backoff).await;
                }
            };
            tokio::select! {
                () = connecting => {}
                () = shared.stopped() => {}
            }
        });
        Ok(())
    }

    /// The next connection made through its handshake, with the peer's identity; waits for
    /// one. The error, at once and from then on, once a peer of another transport or session
    /// connected (a push then sends nothing). Only for a socket made with `report_peers`.
    /// Cancel-safe.
    pub(crate) async fn next_peer(&self) -> Result<(Bytes, Arc<PeerLink>), Error> {
        loop {
            let mut woken = pin!(self.shared.progress.notified());
            woken.as_mut().enable();
            if let Some(peer) = self.try_next_peer() {
                return peer;
            }
            woken.await;
        }
    }

    /// [`ZmtpChannel::next_peer`] without waiting: `None` when no connection is new. The
    /// state's lock only when `peer_news` says there is something, and no wake-up
    /// registration: for a sender that looks on every send.
    pub(crate) fn try_next_peer(&self) -> Option<Result<(Bytes, Arc<PeerLink>), Error>> {
        // Acquire: pairs with the Release under the lock where news was queued; without
        // news the lock is not taken (a peer queued meanwhile is found at the next look).
        if !self.shared.peer_news.load(Ordering::Acquire) {
            return None;
        }
        let mut state = self.shared.state();
        if let Some(mismatch) = state.mismatch {
            return Some(Err(mismatch.error(&self.shared.label)));
        }
        let peer = state.new_peers.pop_front();
        if state.new_peers.is_empty() {
            self.shared.peer_news.store(false, Ordering::Release);
        }
        peer.map(Ok)
    }

    /// True when this socket had peers and every one still holds what was written to it.
    pub(crate) fn peers_hold_what_was_written(&self) -> bool {
        let state = self.shared.state();
        state.peers_gone == 0
            && !state.peer_pids.is_empty()
            && state
                .peer_pids
                .iter()
                .all(|&pid| crate::handshake::process_lives(pid))
    }

    /// Queues `parts` if that needs no wait (a peer, room under `sndBufSize`, no refused
    /// peer); hands them back untouched otherwise, for [`ZmtpChannel::send`] to wait or report.
    /// No deadline, wake-up registration or clock read: the channel's fast path.
    pub(crate) fn try_send(&mut self, parts: Parts) -> Result<(), Parts> {
        if parts.is_empty() {
            return Ok(());
        }
        if self.shared.pattern.envelopes() {
            return Err(parts);
        }
        let mut state = self.shared.state();
        // A pub never waits: it drops for a subscriber that has no room (see `fan_out`).
        let must_wait = self.shared.pattern != Pattern::Pub
            && (state.peers == 0 || state.unwritten() >= self.snd_buf_size);
        if state.mismatch.is_some() || must_wait {
            return Err(parts);
        }
        self.shared.enqueue(&mut state, parts, self.snd_buf_size);
        Ok(())
    }

    /// Waits until a send would be queued at once (a peer, room under `sndBufSize`), for a
    /// reservation. Cancel-safe; nothing is set aside: the caller holds the channel `&mut`
    /// until it sends, and writers only ever make room.
    pub(crate) async fn reserve(&mut self, label: &ChannelLabel) -> Result<(), Error> {
        let mut waiting = None;
        loop {
            let mut progressed = pin!(self.shared.progress.notified());
            progressed.as_mut().enable();
            {
                let state = self.shared.state();
                if let Some(mismatch) = state.mismatch {
                    return Err(mismatch.error(label));
                }
                if self.shared.pattern == Pattern::Pub
                    || (state.peers > 0 && state.unwritten() < self.snd_buf_size)
                {
                    return Ok(());
                }
            }
            waiting.get_or_insert_with(|| self.shared.figures.waiting());
            progressed.await;
        }
    }

    /// Queues `parts` into the room [`ZmtpChannel::reserve`] found, whatever happened to the
    /// peer since (a peer that went leaves the message queued for the next one, or for
    /// `close` to report).
    // The error hands the message back, as every send does.
    #[allow(clippy::result_large_err)]
    pub(crate) fn send_reserved(
        &mut self,
        label: &ChannelLabel,
        parts: Parts,
    ) -> Result<(), SendError<Parts>> {
        if parts.is_empty() {
            return Ok(());
        }
        let mut state = self.shared.state();
        if let Some(mismatch) = state.mismatch {
            return Err(SendError::new(mismatch.error(label), parts));
        }
        self.shared.enqueue(&mut state, parts, self.snd_buf_size);
        Ok(())
    }

    /// The next message if one is in the inbox already, without waiting.
    pub(crate) fn try_receive(&mut self) -> Option<Parts> {
        self.shared.inbox.next(&mut self.batch)
    }

    /// Waits (at most `timeout`) for a peer and room, then queues `parts`: a reservation and a
    /// send through it.
    pub(crate) async fn send(
        &mut self,
        label: &ChannelLabel,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        if parts.is_empty() {
            return Ok(());
        }
        if self.shared.pattern.envelopes() {
            let error = Error::Unsupported {
                channel: label.clone(),
                operation: "send",
                reason: "a req/rep carrier writes to its connections' links only",
            };
            return Err(SendError::new(error, parts));
        }
        let room = match timeout {
            None => self.reserve(label).await,
            Some(after) => match tokio::time::timeout(after, self.reserve(label)).await {
                Ok(room) => room,
                Err(_) => Err(Error::Timeout {
                    channel: label.clone(),
                    after,
                }),
            },
        };
        match room {
            Ok(()) => self.send_reserved(label, parts),
            Err(error) => Err(SendError::new(error, parts)),
        }
    }

    /// The next message from the peer (pair). Cancel-safe: a message is taken from the inbox
    /// only by the call that returns it.
    pub(crate) async fn receive(&mut self, label: &ChannelLabel) -> Result<Parts, Error> {
        loop {
            let mut progressed = pin!(self.shared.progress.notified());
            progressed.as_mut().enable();
            if let Some(mismatch) = self.shared.state().mismatch {
                return Err(mismatch.error(label));
            }
            if let Some(parts) = self.shared.inbox.next(&mut self.batch) {
                return Ok(parts);
            }
            // A reader that put messages in since left a permit: no wake-up is missed.
            tokio::select! {
                () = self.shared.inbox.arrived.notified() => {}
                () = progressed => {}
            }
        }
    }

    /// Stops its peers' writes and takes in what they wrote before (`linger`, at least
    /// [`DRAIN_AT_LEAST`], bounding the wait for its connections to end): how many messages it
    /// was sent and did not take.
    async fn count_unread(&mut self, linger: Duration) -> usize {
        self.shared.inbox.open_without_bound();
        {
            // Under the lock: a connection is either counted as handshaking already, or sees
            // the drain and is not served (`Handshaking::began`).
            let _state = self.shared.state();
            self.shared.draining.send_replace(true);
        }
        let linger = linger.max(DRAIN_AT_LEAST);
        let deadline = Instant::now() + linger;
        loop {
            let mut progressed = pin!(self.shared.progress.notified());
            progressed.as_mut().enable();
            let connected = {
                let state = self.shared.state();
                state.peers + state.handshaking + state.ending
            };
            if connected == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, progressed).await.is_err() {
                tracing::warn!(channel = %self.shared.label, n_connections = connected, "connections still being read after linger = {linger:?}: what they hold is not counted");
                break;
            }
        }
        self.n_unread_held()
    }

    /// Messages that reached this socket and were not taken: its inbox and its own batch.
    fn n_unread_held(&self) -> usize {
        self.batch.len() + self.shared.inbox.len()
    }

    /// What a drop now would lose: messages accepted and not written whole (queued, or in a
    /// batch a writer holds, less what it wrote of it so far), and (a
    /// pull or pair that counts them) messages that reached it and were not taken. Those still
    /// in the kernel's buffers of its connections are not known here.
    pub(crate) fn lost_at_drop(&self) -> (usize, usize) {
        let n_unwritten = self.shared.state().unwritten();
        let n_unread = if self.counts_unread {
            self.n_unread_held()
        } else {
            0
        };
        (n_unwritten, n_unread)
    }

    /// Waits up to `linger` of silence for every accepted message to be written, then stops
    /// the socket's tasks; what was not written is reported, and (a pull or pair of the
    /// zeromq transport) what its peers wrote to it and it did not take.
    pub(crate) async fn close(
        &mut self,
        label: &ChannelLabel,
        linger: Duration,
    ) -> Result<(), Error> {
        let mut lowest = usize::MAX;
        let mut deadline = Instant::now() + linger;
        let left = loop {
            let mut progressed = pin!(self.shared.progress.notified());
            progressed.as_mut().enable();
            let unwritten = self.shared.state().unwritten();
            if unwritten == 0 {
                break 0;
            }
            if unwritten < lowest {
                lowest = unwritten;
                deadline = Instant::now() + linger;
            }
            if tokio::time::timeout_at(deadline, progressed).await.is_err() {
                let unwritten = self.shared.state().unwritten();
                if unwritten >= lowest {
                    break unwritten;
                }
            }
        };
        // The owner's frames to single peers (a shmem ring's doorbell) go out too: a peer that
        // waits for one would otherwise never look again. They are small and the kernel takes
        // them even from a stopped peer's socket; `linger` (at most a second) bounds the wait.
        let flush_until = Instant::now() + linger.min(Duration::from_secs(1));
        while Instant::now() < flush_until && self.shared.links_have_frames() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // A pair's writer may still write while its connection is read to the end: what it
        // had not written is counted after that, once.
        let (left, unread) = if self.counts_unread {
            let unread = self.count_unread(linger).await;
            (self.shared.state().unwritten(), unread)
        } else {
            (left, 0)
        };
        self.shared.stop.send_replace(true);
        for listener in self.listeners.drain(..) {
            // It ends at once on the stop signal, dropping its listener.
            let _ = listener.await;
        }
        crate::net::remove_socket_files(&mut self.bound_ipc_paths);
        let sent = match left {
            0 => Ok(()),
            left => Err(Error::Undelivered {
                channel: label.clone(),
                n_messages: left as u64,
                reason: format!("the peer took none for linger = {linger:?}"),
            }),
        };
        ferromq_core::with_unread_at_close(sent, label, unread as u64, UNREAD)
    }
}

impl Drop for ZmtpChannel {
    fn drop(&mut self) {
        // A socket that closes counts what it lost; one dropped without a close (its stop not
        // sent yet) can only say so here. A carrier's frames are its transport's to count.
        if !*self.shared.stop.borrow() && self.shared.rules.carries_zeromq_messages() {
            let (n_unwritten, n_unread) = self.lost_at_drop();
            if n_unwritten > 0 {
                tracing::error!(channel = %self.shared.label, n_messages = n_unwritten, "a socket dropped without a close lost at most n_messages that send had accepted and not written yet");
            }
            if n_unread > 0 {
                log_unread_at_drop(&self.shared.label, n_unread);
            }
        }
        self.shared.stop.send_replace(true);
        for listener in &self.listeners {
            listener.abort();
        }
        crate::net::remove_socket_files(&mut self.bound_ipc_paths);
    }
}

/// Says what a receiver dropped without a close lost: messages that reached it and it did not
/// take (tcp, ipc and inproc alike; nobody else can count them).
pub(crate) fn log_unread_at_drop(label: &ChannelLabel, n_unread: usize) {
    tracing::error!(channel = %label, n_messages = n_unread, "a receiver dropped without a close lost messages that reached it");
}

/// A listener's accept failed (out of file descriptors, say): said once, retried shortly.
async fn accept_failed(shared: &Shared, error: &std::io::Error) {
    tracing::warn!(channel = %shared.label, %error, "accepting a peer failed; retrying");
    tokio::time::sleep(RECONNECT_MAX).await;
}

/// A bound socket's listener, tcp or ipc.
enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// The next connection, its kernel buffers set (before the handshake's first byte).
    async fn accept(&self, sizes: KernelSizes, label: &ChannelLabel) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                sizes.apply(label, &stream);
                Ok(Stream::Tcp(stream))
            }
            Listener::Unix(listener) => {
                let (stream, _) = listener.accept().await?;
                sizes.apply(label, &stream);
                Ok(Stream::Unix(stream))
            }
        }
    }
}

/// Where a connecting socket connects.
enum Target {
    Tcp(String),
    Ipc(PathBuf),
}

impl Target {
    /// A connection, its kernel buffers set (before the handshake's first byte; on tcp the
    /// window scale was agreed when the connection was made, from the system's defaults, and
    /// the sizes still bound what the kernel holds).
    async fn connect(&self, sizes: KernelSizes, label: &ChannelLabel) -> std::io::Result<Stream> {
        match self {
            Target::Tcp(address) => {
                let stream = tokio::net::TcpStream::connect(address.as_str()).await?;
                let _ = stream.set_nodelay(true);
                sizes.apply(label, &stream);
                Ok(Stream::Tcp(stream))
            }
            Target::Ipc(path) => {
                let stream = tokio::net::UnixStream::connect(path).await?;
                sizes.apply(label, &stream);
                Ok(Stream::Unix(stream))
            }
        }
    }
}

/// Serves one connected peer until it goes away or the socket stops.
/// `no_peer`, if given, is told (or dropped) once the connection is no peer of the socket.
async fn serve(
    shared: Arc<Shared>,
    stream: Stream,
    no_peer: Option<tokio::sync::oneshot::Sender<()>>,
) {
    // A closing receiver takes no new connection: the peer keeps its messages.
    let Some(handshaking) = Handshaking::began(&shared) else {
        return;
    };
    let handshaken = tokio::select! {
        handshaken = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&shared, &stream)) => handshaken,
        () = shared.stopped() => return,
    };
    let (peer, decoder) = match handshaken {
        Ok(Ok(handshaken)) => handshaken,
        Ok(Err(problem)) => {
            tracing::warn!(channel = %shared.label, %problem, "refused a peer");
            return;
        }
        Err(_) => {
            tracing::warn!(channel = %shared.label, "a peer did not complete its handshake within {HANDSHAKE_TIMEOUT:?}; dropped it");
            return;
        }
    };
    let name = String::from_utf8_lossy(&peer.identity).into_owned();
    // Who the peer is comes first: a shmem or other-session peer is named as such.
    if let Some(mismatch) = crate::handshake::check(shared.rules, &peer.identity) {
        let mut state = shared.state();
        if shared.pattern.fans_in() {
            // A fan-in socket refuses that one peer and keeps serving the others.
            if !state.refused.contains(&peer.identity) {
                state.refused.push(peer.identity.clone());
                drop(state);
                tracing::warn!(channel = %shared.label, peer = %name, problem = %mismatch.error(&shared.label), "refused a peer; serving the others");
            }
            return;
        }
        state.mismatch.get_or_insert(mismatch);
        shared.peer_news.store(true, Ordering::Release);
        drop(state);
        tracing::warn!(channel = %shared.label, peer = %name, problem = %mismatch.error(&shared.label), "refused a peer");
        shared.progress.notify_waiters();
        return;
    }
    let (ours, theirs) = shared.pattern.socket_types();
    if !shared.pattern.serves(&peer.socket_type) {
        tracing::warn!(channel = %shared.label, peer = %name, "refused a peer: a {ours} serves {} peers, this one is {:?}", String::from_utf8_lossy(theirs), String::from_utf8_lossy(&peer.socket_type));
        return;
    }
    let peer_pid = crate::handshake::peer_pid(&peer.identity);
    let writer = Arc::new(Notify::new());
    {
        let mut state = shared.state();
        if shared.pattern == Pattern::Pair && state.peers > 0 {
            drop(state);
            tracing::warn!(channel = %shared.label, peer = %name, "refused a peer: a pair has one peer at a time");
            return;
        }
        state.peers += 1;
        // Under the same lock: a closing receiver sees the connection as one or the other.
        handshaking.ended(&mut state);
        if shared.pattern == Pattern::Pub {
            state.subscribers.push(Subscriber {
                writer: Arc::clone(&writer),
                topics: Vec::new(),
                queue: VecDeque::new(),
                held: 0,
            });
        }
        if let Some(pid) = peer_pid
            && !state.peer_pids.contains(&pid)
        {
            state.peer_pids.push(pid);
        }
    }
    shared.progress.notify_waiters();
    let connection = Connection::new(
        writer,
        peer_pid,
        crate::handshake::is_ferromq(&peer.identity),
        no_peer,
    );
    if shared.report_peers {
        let mut state = shared.state();
        state
            .new_peers
            .push_back((peer.identity.clone(), Arc::clone(&connection.link)));
        shared.peer_news.store(true, Ordering::Release);
        state.links.push(Arc::clone(&connection.link));
        drop(state);
        shared.progress.notify_waiters();
    }
    let ended = tokio::select! {
        ended = write_until_gone(&shared, &connection, &stream) => ended,
        never = read_until_gone(&shared, &connection, &stream, (decoder, &peer.identity)) => match never {},
        () = shared.stopped() => "the socket closed".to_owned(),
    };
    tracing::debug!(channel = %shared.label, peer = %name, %ended, "peer gone");
    // The reader is done (it finished, or it stopped with the socket): nothing more comes in.
    connection.link.finish_reading();
    if connection.ending.load(Ordering::Acquire) {
        shared.state().ending -= 1;
        shared.progress.notify_waiters();
    } else {
        no_longer_a_peer(&shared, &connection);
    }
}

/// The socket forgets `connection` as a peer: its sends, a pair's room for a new peer and
/// `peers_hold_what_was_written` no longer count it.
fn no_longer_a_peer(shared: &Shared, connection: &Connection) {
    {
        let mut state = shared.state();
        state.peers -= 1;
        // Under the same lock: a closing receiver sees the connection as a peer or as ending,
        // never as neither while its reader still works.
        if connection.ending.load(Ordering::Acquire) {
            state.ending += 1;
        }
        state.peers_gone += 1;
        // After the count, under the lock: whoever lets a connection go because its link says
        // gone (a shmem sender dropping its ring) then finds `peers_hold_what_was_written`
        // false, and counts what was left in it rather than hand it over.
        connection
            .link
            .gone
            .store(true, std::sync::atomic::Ordering::Release);
        state.forget_writer(&connection.link.writer);
        // What was queued for a subscriber goes with it, as with libzmq's PUB.
        state
            .subscribers
            .retain(|subscriber| !Arc::ptr_eq(&subscriber.writer, &connection.link.writer));
        shared.publish(&state);
        state
            .links
            .retain(|link| !Arc::ptr_eq(link, &connection.link));
        // It may have been woken for work it will not do now.
        if !state.queue.is_empty() {
            state.wake_a_writer();
        }
    }
    shared.progress.notify_waiters();
    if let Some(no_peer) = connection
        .no_peer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
    {
        let _ = no_peer.send(());
    }
}

/// One connection of a push socket as its owner sees it (see [`crate::ZmqSocket::next_peer`]):
/// frames for this peer alone, written ahead of the socket's shared queue. The shmem transport
/// announces a connection's descriptor ring and rings its doorbell through it.
///
/// Dropping it changes nothing; once the connection ends, what is given to it is dropped.
pub struct PeerLink {
    /// Wakes the writer: work was queued, the reader has replies, or the peer ended.
    writer: Arc<Notify>,
    /// Bytes to write before the next batch: PONGs the reader wants written and the owner's
    /// frames, whole ZMTP frames each.
    replies: Mutex<Vec<u8>>,
    /// The connection ended.
    gone: std::sync::atomic::AtomicBool,
    /// The connection's reader is done: what the peer sent is in the socket's inbox.
    read_everything: std::sync::atomic::AtomicBool,
    /// Told when `read_everything` is set.
    reader_done: Notify,
    /// The process the peer named in its handshake identity.
    peer_pid: Option<u32>,
}

impl PeerLink {
    /// Queues `body` as one single-part message for this peer only, ahead of anything in the
    /// socket's queue; the connection's writer writes it at its next turn. Never waits.
    pub fn send_frame(&self, body: &[u8]) {
        {
            let mut replies = self
                .replies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            zmtp::push_message_header(&mut replies, 0, 1, body.len());
            replies.extend_from_slice(body);
        }
        self.writer.notify_one();
    }

    /// Whether the connection has ended (what was given to it since is lost). Its reader may
    /// still be taking in what the peer sent before its end: a connection ends as soon as a
    /// write to it fails; see [`PeerLink::has_read_everything`].
    pub fn is_gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the connection's reader is done: everything the peer sent before the end is in
    /// the socket's inbox (or the socket closed), so one look there finds it.
    pub fn has_read_everything(&self) -> bool {
        self.read_everything
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until [`PeerLink::has_read_everything`]. Cancel-safe.
    pub async fn everything_read(&self) {
        loop {
            let mut done = pin!(self.reader_done.notified());
            done.as_mut().enable();
            if self.has_read_everything() {
                return;
            }
            done.await;
        }
    }

    fn finish_reading(&self) {
        self.read_everything
            .store(true, std::sync::atomic::Ordering::Release);
        self.reader_done.notify_waiters();
    }

    /// The process the peer named in its handshake identity (a ferromq peer of this host's
    /// shmem transport); `None` for a peer that named none (libzmq, FairMQ).
    pub fn peer_pid(&self) -> Option<u32> {
        self.peer_pid
    }

    /// True while the peer still holds what was written to it: the connection has not ended
    /// and the process it named lives (a stopped one does). False for a peer that named no
    /// process. [`ZmqSocket::peers_hold_what_was_written`](crate::ZmqSocket) asks it of every
    /// peer a socket ever had; this, of one connection.
    pub fn holds_what_was_written(&self) -> bool {
        !self.is_gone() && self.peer_pid.is_some_and(crate::handshake::process_lives)
    }
}

/// A connection counted in [`State::handshaking`] until it is a peer or gone.
struct Handshaking<'a> {
    shared: &'a Shared,
    counted: bool,
}

impl<'a> Handshaking<'a> {
    /// `None` once a receiver's close began to drain ([`Shared::draining`], set under the
    /// same lock).
    fn began(shared: &'a Shared) -> Option<Handshaking<'a>> {
        let mut state = shared.state();
        if shared.is_draining() {
            return None;
        }
        state.handshaking += 1;
        Some(Handshaking {
            shared,
            counted: true,
        })
    }

    /// The connection is a peer now (`state` is the socket's, locked).
    fn ended(mut self, state: &mut State) {
        state.handshaking -= 1;
        self.counted = false;
    }
}

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.shared.state().handshaking -= 1;
            self.shared.progress.notify_waiters();
        }
    }
}

/// What the reader and the writer of one connection share.
struct Connection {
    /// The writer's wake-up and the bytes written ahead of batches (shared with the owner).
    link: Arc<PeerLink>,
    /// Why the peer's end is gone, once the reader saw it (after everything the peer sent).
    ended: Mutex<Option<String>>,
    /// No longer a peer of the socket, its reader finishing ([`State::ending`]).
    ending: AtomicBool,
    /// The peer announced a ferromq identity: over tcp, this side's end of writing tells it to
    /// stop writing ([`Connection::read_more`]).
    peer_is_ferromq: bool,
    /// Told once the connection is no peer any more: a connecting socket then connects again.
    no_peer: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

/// How a closing receiver's reader stops its peer's writes ([`Connection::read_more`]).
#[derive(Default)]
struct Stopping {
    /// The peer's writes were stopped: the socket is closing ([`Shared::draining`]).
    peer_stopped: bool,
    /// Since when the reader waits for the end of a ferromq peer over tcp that it told to stop
    /// (by shutting its own writing): the telling, then each read that brought bytes.
    waiting_since: Option<Instant>,
    /// Bytes read since that telling, and how many may come (`MOST_AFTER_TELLING` and the
    /// kernel buffers).
    read_since_telling: usize,
    most_after_telling: usize,
    /// This side's reading was shut (`SHUT_RD`).
    read_shut: bool,
}

impl Connection {
    /// A connection through its handshake, not ended: its writer's wake-up, the process and
    /// whether ferromq is its peer (from the handshake), and what to tell once it is no peer.
    fn new(
        writer: Arc<Notify>,
        peer_pid: Option<u32>,
        peer_is_ferromq: bool,
        no_peer: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Connection {
        Connection {
            link: Arc::new(PeerLink {
                writer,
                replies: Mutex::new(Vec::new()),
                gone: false.into(),
                read_everything: false.into(),
                reader_done: Notify::new(),
                peer_pid,
            }),
            ended: Mutex::new(None),
            ending: AtomicBool::new(false),
            peer_is_ferromq,
            no_peer: Mutex::new(no_peer),
        }
    }

    /// Looks, reading nothing, whether the peer closed its end or shut its writing: a write to
    /// a connection whose peer is gone succeeds and is lost, and a ferromq peer over tcp that
    /// shut its writing is closing and wants nothing more ([`Connection::read_more`]). The
    /// reader ends the connection after taking in what came before the end. (It used to read
    /// ahead here and keep the bytes for the reader: a pair that sent while it did not
    /// receive, its reader waiting for room in the inbox, so took in its peer's whole stream,
    /// without a bound, and the peer's sends never waited.)
    fn peer_closed(&self, stream: &Stream) -> bool {
        self.ended().is_some() || stream.peer_hung_up()
    }

    /// Reads more of what the peer sent into `decoder`, waiting for it. An error at the
    /// peer's end.
    /// A closing receiver's connection ([`Shared::draining`]) first stops the peer's writes,
    /// then reads up to the end what came before (see the module's docs): over a unix stream
    /// by `SHUT_RD`; over tcp, a ferromq peer by `SHUT_WR`, then `SHUT_RD` once nothing came
    /// for [`ANSWER_WITHIN`] without its end, or more came than a peer that stopped can have had
    /// under way ([`MOST_AFTER_TELLING`]); another tcp peer by `SHUT_RD` at once.
    async fn read_more(
        &self,
        shared: &Shared,
        stream: &Stream,
        decoder: &mut zmtp::Decoder,
        stopping: &mut Stopping,
    ) -> Result<(), String> {
        loop {
            let draining = shared.is_draining();
            if draining && !stopping.peer_stopped {
                if stream.is_tcp() && self.peer_is_ferromq {
                    stream.shutdown_write();
                    stopping.waiting_since = Some(Instant::now());
                    stopping.most_after_telling =
                        MOST_AFTER_TELLING.saturating_add(4 * stream.kernel_buffer_bytes());
                } else {
                    stream.shutdown_read();
                    stopping.read_shut = true;
                }
                stopping.peer_stopped = true;
            }
            let mut answer_by = stopping
                .waiting_since
                .filter(|_| !stopping.read_shut)
                .map(|since| since + ANSWER_WITHIN);
            if answer_by.is_some_and(|by| by <= Instant::now()) {
                // The peer neither ended nor sent anything (a stopped process): what it
                // writes after the last read goes with the connection.
                stream.shutdown_read();
                stopping.read_shut = true;
                answer_by = None;
            }
            // A reader that always finds bytes never waits (nor does its inbox while the
            // socket drains): the task's budget makes it yield now and then, so the writer
            // beside it in the same task, and the socket's stop, get their turns.
            tokio::task::consume_budget().await;
            match stream.try_read_decoder(decoder) {
                Ok(0) if draining => return Err("the socket closed".to_owned()),
                Ok(0) => return Err("the peer closed its end".to_owned()),
                Ok(n_read) => {
                    if answer_by.is_some() {
                        // The peer's end comes after what it wrote: still coming, unless more
                        // comes than a peer that stopped can have had under way.
                        stopping.waiting_since = Some(Instant::now());
                        stopping.read_since_telling += n_read;
                        if stopping.read_since_telling > stopping.most_after_telling
                            && !decoder.in_large_body()
                        {
                            stream.shutdown_read();
                            stopping.read_shut = true;
                        }
                    }
                    return Ok(());
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error.to_string()),
            }
            tokio::select! {
                readable = stream.readable() => readable.map_err(|error| error.to_string())?,
                () = shared.draining_began(), if !draining => {}
                () = sleep_until_some(answer_by) => {}
            }
        }
    }

    fn ended(&self) -> Option<String> {
        self.ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The connection can carry nothing more out (a write failed: a closing receiver stopped
    /// our writes, or the peer is gone; or the peer closed): it stops being a peer at once, so
    /// a pair serves a new one and sends go elsewhere, while its reader still takes in, for
    /// this side's owner to take or count, what the peer sent before its end. Our end is shut
    /// for writing, so a peer still there ends too. Why it ended, once the reader is done.
    async fn stop_being_a_peer(&self, shared: &Shared, stream: &Stream) -> String {
        stream.shutdown_write();
        // Nothing awaits from here to the count: a stop cannot come between the flag and it.
        self.ending.store(true, Ordering::Release);
        no_longer_a_peer(shared, self);
        self.reader_ended().await
    }

    /// Waits for the reader to have taken in everything the peer sent before its end; why it
    /// ended. (The writer's wake-up: the reader wakes it when it ends.)
    async fn reader_ended(&self) -> String {
        loop {
            let mut woken = pin!(self.link.writer.notified());
            woken.as_mut().enable();
            if let Some(ended) = self.ended() {
                return ended;
            }
            woken.await;
        }
    }

    fn take_replies(&self) -> Vec<u8> {
        std::mem::take(
            &mut *self
                .link
                .replies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

struct Peer {
    identity: Bytes,
    socket_type: Bytes,
}

/// Greetings and READY both ways: the peer as it announced itself, and the decoder holding
/// whatever it sent after its READY.
async fn handshake(
    shared: &Shared,
    stream: &Stream,
) -> Result<(Peer, zmtp::Decoder), zmtp::HandshakeError> {
    let io = |error: std::io::Error| zmtp::HandshakeError(format!("during the handshake: {error}"));
    let mut hello = zmtp::greeting().to_vec();
    hello.extend_from_slice(&zmtp::ready(
        shared.pattern.socket_types().0,
        shared.identity.as_bytes(),
    ));
    stream.write_all(&hello).await.map_err(io)?;
    let mut decoder = zmtp::Decoder::new(max_frame(shared.pattern));
    let greeting = loop {
        if let Some(greeting) = decoder.take_greeting() {
            break greeting;
        }
        stream.read_into(&mut decoder).await.map_err(io)?;
    };
    zmtp::check_greeting(&greeting)?;
    let properties = loop {
        match decoder.next_frame()? {
            Some(zmtp::Inbound::Command(zmtp::Command::Ready(properties))) => break properties,
            Some(zmtp::Inbound::Command(zmtp::Command::Error(reason))) => {
                return Err(zmtp::HandshakeError(format!(
                    "the peer refused the connection: {reason}"
                )));
            }
            Some(_) => {
                return Err(zmtp::HandshakeError(
                    "the peer sent something else before READY".to_owned(),
                ));
            }
            None => stream.read_into(&mut decoder).await.map_err(io)?,
        }
    };
    let property = |name| {
        zmtp::Command::property(&properties, name)
            .cloned()
            .unwrap_or_default()
    };
    Ok((
        Peer {
            identity: property("Identity"),
            socket_type: property("Socket-Type"),
        },
        decoder,
    ))
}

/// The largest frame a peer may send: a pull peer sends only small commands; a pair peer's
/// messages are as large as they are (memory grows only with what actually arrives).
fn max_frame(pattern: Pattern) -> usize {
    match pattern {
        // Req and rep carriers get a ring's announcements and doorbells only.
        // A pub's peers send subscriptions only.
        Pattern::Push | Pattern::Req | Pattern::Rep | Pattern::Pub => 64 * 1024,
        Pattern::Pair | Pattern::Pull => usize::MAX,
    }
}

/// Reads what the peer sends: pair messages into the inbox, PINGs answered through the writer.
/// At the peer's end (or a protocol error) it tells the writer, which ends the connection; it
/// never returns.
async fn read_until_gone(
    shared: &Shared,
    connection: &Connection,
    stream: &Stream,
    (mut decoder, peer_identity): (zmtp::Decoder, &Bytes),
) -> std::convert::Infallible {
    let mut parts = Parts::new();
    // Whole messages decoded, not yet in the inbox: put in together, at most `INBOX_BATCH` at
    // a time and before the next read.
    let mut ready: Vec<Parts> = Vec::new();
    let mut stopping = Stopping::default();
    let why = 'reading: loop {
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(problem) => break 'reading problem.0,
            };
            match frame {
                zmtp::Inbound::Command(zmtp::Command::Ping(context)) => {
                    connection
                        .link
                        .replies
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend_from_slice(&zmtp::pong(&context));
                    connection.link.writer.notify_one();
                }
                zmtp::Inbound::Command(zmtp::Command::Error(reason)) => {
                    break 'reading format!("the peer ended the connection: {reason}");
                }
                zmtp::Inbound::Command(_) => {}
                zmtp::Inbound::Message { body, more } => {
                    if shared.pattern == Pattern::Push {
                        continue;
                    }
                    if shared.pattern == Pattern::Pub {
                        // A sub sends its subscriptions as single-frame messages (ZMTP 3.0:
                        // this side announces 3.0, so a 3.1 peer does not send commands).
                        if let Some(subscriber) = shared.state().subscriber(&connection.link.writer)
                        {
                            subscriber.note(body.data());
                        }
                        continue;
                    }
                    if parts.is_empty() && shared.pattern.envelopes() {
                        parts.push(Message::from(peer_identity.clone()));
                    }
                    parts.push(body);
                    if !more {
                        ready.push(std::mem::take(&mut parts));
                        if ready.len() >= INBOX_BATCH {
                            // Waits while the inbox is full: the peer's sends then wait too.
                            shared.inbox.put(&mut ready).await;
                        }
                    }
                }
            }
        }
        shared.inbox.put(&mut ready).await;
        if let Err(end) = connection
            .read_more(shared, stream, &mut decoder, &mut stopping)
            .await
        {
            break end;
        }
    };
    // What came whole before a protocol error is the peer's, as what came before its end.
    shared.inbox.put(&mut ready).await;
    *connection
        .ended
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
    connection.link.writer.notify_one();
    std::future::pending().await
}

/// Takes batches and writes them until the peer goes away; why it ended.
async fn write_until_gone(shared: &Shared, connection: &Connection, stream: &Stream) -> String {
    let writer = &connection.link.writer;
    loop {
        let batch = loop {
            let mut woken = pin!(writer.notified());
            woken.as_mut().enable();
            if shared.is_stopped() {
                return "the socket closed".to_owned();
            }
            if let Some(ended) = connection.ended() {
                return ended;
            }
            let replies = connection.take_replies();
            if !replies.is_empty() && stream.write_all(&replies).await.is_err() {
                // Out of this loop first: its enabled `woken` would stay first in line for the
                // reader's wake-up that `stop_being_a_peer` waits for, and take it, never
                // polled (the connection then never ended).
                break None;
            }
            if let Some(batch) = shared.take_batch(writer) {
                break Some(batch);
            }
            woken.await;
        };
        let Some(batch) = batch else {
            return connection.stop_being_a_peer(shared, stream).await;
        };
        // A peer that closed since the last look gets nothing more: the batch goes back, and
        // the connection ends once the reader took in what the peer sent before its end.
        if connection.peer_closed(stream) {
            shared.settle(writer, batch, 0, 0);
            return connection.stop_being_a_peer(shared, stream).await;
        }
        let mut replies = connection.take_replies();
        let mut n_counted = 0;
        let (n_written, failed) =
            write_batch(connection, stream, &batch, &mut replies, |n_whole| {
                shared.wrote_part_of_batch(writer, n_whole - n_counted);
                n_counted = n_whole;
            })
            .await;
        tracing::trace!(channel = %shared.label, n_written, "wrote a batch");
        shared.settle(writer, batch, n_written, n_counted);
        if failed.is_some() {
            return connection.stop_being_a_peer(shared, stream).await;
        }
    }
}

/// Writes `batch` (after any pending `replies`) with vectored writes: frame headers and small
/// bodies are gathered in one buffer, larger bodies go out from their own `Bytes`. How many
/// messages were written whole, and the error that stopped it. A write that leaves the batch
/// unfinished with more messages whole than before tells `wrote_whole` how many are whole now
/// (a writer that waits for room with part of its batch in the kernel).
async fn write_batch(
    connection: &Connection,
    stream: &Stream,
    batch: &[Frames],
    replies: &mut Vec<u8>,
    mut wrote_whole: impl FnMut(usize),
) -> (usize, Option<std::io::Error>) {
    /// A stretch of the gathered buffer, or frame `.1` of message `.0` as it is.
    enum Piece {
        Gathered(std::ops::Range<usize>),
        Body(usize, usize),
    }
    let mut gathered = std::mem::take(replies);
    let mut pieces = Vec::new();
    let mut stretch_start = 0;
    let mut n_bodies_bytes = 0;
    // Where each message's last byte ends, counted from the first byte written.
    let mut ends = Vec::with_capacity(batch.len());
    for (message_idx, message) in batch.iter().enumerate() {
        for (frame_idx, frame) in message.iter().enumerate() {
            zmtp::push_message_header(&mut gathered, frame_idx, message.len(), frame.len());
            if frame.len() < COPY_LIMIT {
                gathered.extend_from_slice(frame);
            } else {
                pieces.push(Piece::Gathered(stretch_start..gathered.len()));
                stretch_start = gathered.len();
                pieces.push(Piece::Body(message_idx, frame_idx));
                n_bodies_bytes += frame.len();
            }
        }
        ends.push(gathered.len() + n_bodies_bytes);
    }
    pieces.push(Piece::Gathered(stretch_start..gathered.len()));
    let mut slices: Vec<std::io::IoSlice<'_>> = pieces
        .iter()
        .filter_map(|piece| match piece {
            Piece::Gathered(range) if range.is_empty() => None,
            Piece::Gathered(range) => Some(std::io::IoSlice::new(&gathered[range.clone()])),
            Piece::Body(message_idx, frame_idx) => {
                Some(std::io::IoSlice::new(&batch[*message_idx][*frame_idx]))
            }
        })
        .collect();
    let mut rest = &mut slices[..];
    let mut n_bytes_written = 0;
    // Messages `wrote_whole` was told of.
    let mut n_told = 0;
    while !rest.is_empty() {
        // Linux refuses more than IOV_MAX (1024) slices in one call.
        let n_slices = rest.len().min(MAX_SLICES);
        // A connection whose reader ended (the peer's end, or this side's close read it to
        // the end) is not waited on for room: a stalled peer would hold it for ever.
        let written = tokio::select! {
            written = stream.write_vectored(&rest[..n_slices]) => written,
            ended = connection.reader_ended() => Err(std::io::Error::other(ended)),
        };
        match written {
            Ok(0) => {
                let n_whole = ends.partition_point(|&end| end <= n_bytes_written);
                return (n_whole, Some(std::io::ErrorKind::WriteZero.into()));
            }
            Ok(n) => {
                n_bytes_written += n;
                std::io::IoSlice::advance_slices(&mut rest, n);
                if !rest.is_empty() {
                    let n_whole = ends.partition_point(|&end| end <= n_bytes_written);
                    if n_whole > n_told {
                        wrote_whole(n_whole);
                        n_told = n_whole;
                    }
                }
            }
            Err(error) => {
                let n_whole = ends.partition_point(|&end| end <= n_bytes_written);
                return (n_whole, Some(error));
            }
        }
    }
    (batch.len(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch the kernel takes a little at a time: each write that finishes messages of it
    /// (and not the batch) tells how many are whole, counted from the first byte written, the
    /// replies before the batch included, so that a writer's held count is exact.
    #[tokio::test(flavor = "current_thread")]
    async fn a_partial_write_tells_how_many_messages_of_its_batch_are_whole() {
        use nix::sys::socket::{setsockopt, sockopt};
        let (ours, theirs) = tokio::net::UnixStream::pair().expect("a socket pair");
        setsockopt(&ours, sockopt::SndBuf, &4096).expect("SO_SNDBUF");
        setsockopt(&theirs, sockopt::RcvBuf, &4096).expect("SO_RCVBUF");
        let stream = Stream::Unix(ours);
        let theirs = Arc::new(theirs);
        let connection = Connection::new(Arc::new(Notify::new()), None, false, None);
        // Small messages gathered with their headers, and two-part ones with a large body
        // written from its own buffer.
        let batch: Vec<Frames> = (0..64)
            .map(|msg_idx| {
                if msg_idx % 2 == 0 {
                    Frames::from_iter([Bytes::from(vec![1; 300])])
                } else {
                    Frames::from_iter([Bytes::from(vec![2; 10]), Bytes::from(vec![3; 20_000])])
                }
            })
            .collect();
        let mut replies = vec![0_u8; 700];
        // Where each message ends in the bytes written, the replies first.
        let mut ends = Vec::new();
        let mut at = replies.len();
        for message in &batch {
            for (frame_idx, frame) in message.iter().enumerate() {
                let mut header = Vec::new();
                zmtp::push_message_header(&mut header, frame_idx, message.len(), frame.len());
                at += header.len() + frame.len();
            }
            ends.push(at);
        }
        let n_read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // A read of the socket itself: tokio's `try_read` reads nothing before its reactor
        // has seen the socket readable.
        let read_what_is_there = |theirs: &tokio::net::UnixStream| {
            use std::os::fd::AsRawFd;
            let mut buffer = [0_u8; 1500];
            let mut n_bytes = 0;
            while let Ok(n) = nix::sys::socket::recv(
                theirs.as_raw_fd(),
                &mut buffer,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            ) {
                if n == 0 {
                    break;
                }
                n_bytes += n;
            }
            n_bytes
        };
        // A slow reader: a little at each turn.
        let reader = {
            let (theirs, n_read) = (Arc::clone(&theirs), Arc::clone(&n_read));
            let n_bytes = *ends.last().expect("messages");
            tokio::spawn(async move {
                let mut buffer = [0_u8; 1500];
                while n_read.load(Ordering::Relaxed) < n_bytes {
                    let _ = theirs.readable().await;
                    if let Ok(n) = theirs.try_read(&mut buffer) {
                        n_read.fetch_add(n, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            })
        };
        let mut told = Vec::new();
        let (n_written, failed) =
            write_batch(&connection, &stream, &batch, &mut replies, |n_whole| {
                // The writer is between two writes: everything it wrote is read or in the
                // kernel's buffers, which this reads out.
                let drained = read_what_is_there(&theirs);
                told.push((
                    n_whole,
                    n_read.fetch_add(drained, Ordering::Relaxed) + drained,
                ));
            })
            .await;
        assert_eq!((n_written, failed.map(|error| error.kind())), (64, None));
        reader.await.expect("the reader");
        assert!(told.len() >= 5, "{told:?}");
        for (n_whole, n_bytes) in &told {
            assert_eq!(
                *n_whole,
                ends.partition_point(|&end| end <= *n_bytes),
                "{told:?}"
            );
            assert!(*n_whole < batch.len(), "{told:?}");
        }
        assert!(
            told.windows(2).all(|pair| pair[0].0 < pair[1].0),
            "{told:?}"
        );
    }

    /// A connection's (send, receive) kernel buffer sizes.
    fn kernel_buffers(stream: &Stream) -> (usize, usize) {
        use nix::sys::socket::{getsockopt, sockopt};
        let read = |fd: &dyn std::os::fd::AsFd| {
            let fd = fd.as_fd();
            (
                getsockopt(&fd, sockopt::SndBuf).expect("SO_SNDBUF"),
                getsockopt(&fd, sockopt::RcvBuf).expect("SO_RCVBUF"),
            )
        };
        match stream {
            Stream::Tcp(tcp) => read(tcp),
            Stream::Unix(unix) => read(unix),
        }
    }

    /// FairMQ's `sndKernelSize` / `rcvKernelSize` reach the kernel on both ends of a connection,
    /// tcp and ipc: each connection a listener accepts and each one a connecting socket makes
    /// gets the buffers asked for (Linux reports twice the size set, its bookkeeping included).
    #[tokio::test]
    async fn accepted_and_made_connections_get_the_kernel_buffers_asked_for() {
        let label = ChannelLabel::new("data", ferromq_core::SocketType::Push);
        let ipc =
            std::env::temp_dir().join(format!("ferromq-kernel-sizes-{}.ipc", std::process::id()));
        let _ = std::fs::remove_file(&ipc);
        // Removed however the test ends (a failed assertion too).
        struct RemovedOnDrop<'a>(&'a std::path::Path);
        impl Drop for RemovedOnDrop<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(self.0);
            }
        }
        let _removed = RemovedOnDrop(&ipc);
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp_target = Target::Tcp(tcp.local_addr().unwrap().to_string());
        let cases = [
            (Listener::Tcp(tcp), tcp_target),
            (
                Listener::Unix(tokio::net::UnixListener::bind(&ipc).unwrap()),
                Target::Ipc(ipc.clone()),
            ),
        ];
        // Sizes no system default has, under Linux's default caps (212992).
        let accepting = KernelSizes {
            send: 96 << 10,
            receive: 80 << 10,
        };
        let connecting = KernelSizes {
            send: 88 << 10,
            receive: 72 << 10,
        };
        for (listener, target) in cases {
            let (accepted, made) = tokio::join!(
                listener.accept(accepting, &label),
                target.connect(connecting, &label)
            );
            assert_eq!(
                kernel_buffers(&accepted.unwrap()),
                (2 * (96 << 10), 2 * (80 << 10))
            );
            assert_eq!(
                kernel_buffers(&made.unwrap()),
                (2 * (88 << 10), 2 * (72 << 10))
            );
        }
    }

    fn numbered(idx: u8) -> Parts {
        let mut parts = Parts::new();
        parts.push(Message::from(vec![idx]));
        parts
    }

    fn number(parts: &Parts) -> u8 {
        parts.iter().next().expect("one part").data()[0]
    }

    /// The inbox hands messages over in order and holds no more than its capacity, counting
    /// the receiver's batch until the receiver comes back for more; a reader waits for room
    /// and goes on when the receiver takes from the full inbox.
    #[tokio::test]
    async fn the_inbox_bounds_what_the_receiver_has_not_used_up() {
        let inbox = Inbox::new(3);
        let mut ready: Vec<Parts> = (0..5).map(numbered).collect();
        // Three fit; the reader waits with two.
        let put = tokio::time::timeout(Duration::from_millis(50), inbox.put(&mut ready)).await;
        assert!(put.is_err(), "a full inbox makes the reader wait");
        assert_eq!(ready.len(), 2);
        let mut batch = VecDeque::new();
        assert_eq!(inbox.next(&mut batch).as_ref().map(number), Some(0));
        // The batch's other two still count: no room yet.
        let put = tokio::time::timeout(Duration::from_millis(50), inbox.put(&mut ready)).await;
        assert!(
            put.is_err(),
            "the receiver's batch counts against the capacity"
        );
        assert_eq!(inbox.next(&mut batch).as_ref().map(number), Some(1));
        assert_eq!(inbox.next(&mut batch).as_ref().map(number), Some(2));
        // A waiting reader goes on once the receiver comes back to the full inbox.
        let waiting = async {
            inbox.put(&mut ready).await;
            assert!(ready.is_empty());
        };
        let taking = async {
            tokio::task::yield_now().await;
            assert!(inbox.next(&mut batch).is_none(), "nothing was put in yet");
            // The reader, woken, puts the rest in (an earlier put left a permit: look again).
            let third = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    if let Some(parts) = inbox.next(&mut batch) {
                        return parts;
                    }
                    inbox.arrived.notified().await;
                }
            })
            .await
            .expect("the reader puts the rest in");
            assert_eq!(number(&third), 3);
            assert_eq!(inbox.next(&mut batch).as_ref().map(number), Some(4));
            assert!(inbox.next(&mut batch).is_none());
        };
        tokio::join!(waiting, taking);
    }

    /// Two connections with more to put in than the inbox holds take turns: neither waits
    /// until the other has put everything in.
    #[tokio::test]
    async fn readers_of_a_full_inbox_take_turns() {
        let inbox = Arc::new(Inbox::new(4));
        // Each connection's reader is a task of its own.
        let readers: Vec<_> = [0u8, 100]
            .into_iter()
            .map(|from| {
                let inbox = Arc::clone(&inbox);
                tokio::spawn(async move {
                    let mut ready: Vec<Parts> = (from..from + 40).map(numbered).collect();
                    inbox.put(&mut ready).await;
                })
            })
            .collect();
        let mut order = Vec::new();
        let mut batch = VecDeque::new();
        tokio::time::timeout(Duration::from_secs(10), async {
            while order.len() < 80 {
                match inbox.next(&mut batch) {
                    Some(parts) => order.push(number(&parts)),
                    None => inbox.arrived.notified().await,
                }
            }
        })
        .await
        .expect("every message arrives");
        for reader in readers {
            reader.await.expect("a reader");
        }
        // Each connection's messages in its order.
        for from in [0u8, 100] {
            let own: Vec<u8> = order
                .iter()
                .copied()
                .filter(|idx| idx / 100 == from / 100)
                .collect();
            assert_eq!(own, (from..from + 40).collect::<Vec<u8>>());
        }
        // Turns of one full inbox each once both wait for room (the first may put more in
        // before the second is there), until one connection has put everything in.
        let runs: Vec<usize> = order
            .chunk_by(|a, b| a / 100 == b / 100)
            .map(<[u8]>::len)
            .collect();
        let turns = &runs[1..runs.len() - 1];
        assert!(
            turns.len() >= 8 && turns.iter().all(|&run| run <= 4),
            "connections did not take turns: {order:?}"
        );
    }

    /// Whether `writer` holds a wake-up (taking it).
    fn was_woken(writer: &Notify) -> bool {
        use futures::FutureExt;
        writer.notified().now_or_never().is_some()
    }

    /// Queued messages wake the idle writers in turn (round robin), each once until it comes
    /// back for work and finds none; then the next message wakes it again.
    #[test]
    fn idle_writers_are_woken_in_turn_and_once() {
        let (first, second) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let mut state = State::default();
        state.wait_for_work(&first);
        state.wait_for_work(&second);
        state.wake_a_writer();
        assert!(was_woken(&first) && !was_woken(&second));
        state.wake_a_writer();
        assert!(was_woken(&second));
        // Both woken, neither back yet: no more wake-ups.
        state.wake_a_writer();
        assert!(!was_woken(&first) && !was_woken(&second));
        // The first comes back to an empty queue and waits again.
        state.wait_for_work(&first);
        state.wake_a_writer();
        assert!(was_woken(&first) && !was_woken(&second));
        // A writer that takes a batch leaves the list.
        state.forget_writer(&second);
        assert_eq!(state.idle.len(), 1);
    }

    /// A pub's message goes to every subscriber whose topics match and has room; one whose
    /// queue (with what its writer holds) is at `sndBufSize` misses it, counted as a drop for a
    /// slow subscriber, and holds back no one. A cancel removes one subscription.
    #[test]
    fn a_pub_fans_out_by_topic_and_drops_for_a_full_subscriber() {
        let figures = Arc::new(ferromq_core::SendFigures::default());
        let channel = ZmtpChannel::new(
            Pattern::Pub,
            &ChannelLabel::new("data", ferromq_core::SocketType::Pub),
            (2, 2),
            KernelSizes::default(),
            crate::PeerRules::ZEROMQ,
            Arc::clone(&figures),
            false,
        );
        let shared = &channel.shared;
        let (stalled, healthy) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        {
            let mut state = shared.state();
            for writer in [&stalled, &healthy] {
                state.subscribers.push(Subscriber {
                    writer: Arc::clone(writer),
                    topics: Vec::new(),
                    queue: VecDeque::new(),
                    held: 0,
                });
            }
            let subscribe = |state: &mut State, writer, body: &[u8]| {
                state.subscriber(writer).unwrap().note(body);
            };
            subscribe(&mut state, &stalled, b"\x01");
            subscribe(&mut state, &healthy, b"\x01a");
            subscribe(&mut state, &healthy, b"\x01b");
            subscribe(&mut state, &healthy, b"\x00b");
        }
        let send = |topic: &'static [u8]| {
            let mut state = shared.state();
            shared.enqueue(&mut state, Parts::from(Message::from(topic)), 2);
        };
        send(b"a1");
        send(b"b1");
        // The healthy subscriber's writer takes its batch: it has room again.
        let batch = shared.take_batch(&healthy).expect("a1 is queued for it");
        assert_eq!(batch.len(), 1);
        shared.settle(&healthy, batch, 1, 0);
        send(b"a2");
        let queued = |writer| {
            let mut state = shared.state();
            let subscriber = state.subscriber(writer).unwrap();
            subscriber
                .queue
                .iter()
                .map(|frames| frames[0].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(queued(&stalled), [&b"a1"[..], b"b1"]);
        assert_eq!(queued(&healthy), [&b"a2"[..]]);
        assert_eq!(
            figures.dropped_for_slow_subscribers.load(Ordering::Relaxed),
            1
        );
        assert_eq!(figures.queued.load(Ordering::Relaxed), 3);
    }
}
