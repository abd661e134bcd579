//! The seam between devices and transports: [`Transport`], [`Socket`] and [`Channel`].
//!
//! A transport implements two small traits: [`Transport`] makes messages and sockets, [`Socket`]
//! binds, connects, sends and receives [`Parts`]. Everything that is the same for every transport
//! (rate counters, frame-at-a-time receive, typed payloads, address parsing) lives once in
//! [`Channel`], which wraps a socket and is what device code holds.
//!
//! # Backpressure
//! A send waits while the channel's send queue holds `sndBufSize` messages. With no peer
//! connected (push, req, pair) a transport either waits at once (zeromq) or queues up to
//! `sndBufSize` messages for the peer to come (shmem, ofi, like libzmq), then waits; a message
//! accepted and never delivered is reported by [`Channel::close`]. It never drops a message,
//! except on pub, which drops for slow subscribers as ZeroMQ documents. The conformance suite
//! (`crates/conformance`) holds every transport to this.
//!
//! # Cancel safety
//! Receives are cancel-safe: a receive future dropped before it completed loses no message, so
//! a receive can sit in `tokio::select!` (that is how the device poller works). A send future
//! owns its message: dropping it drops the message, as with tokio's `mpsc::Sender::send`. Use
//! the timeout forms to get the message back in the [`SendError`] instead, or the two-phase
//! send: [`Channel::reserve`] waits for room (cancel-safe, the message stays the caller's) and
//! its [`SendPermit`] sends without waiting, as with `mpsc::Sender::reserve`.
//!
//! # Fairness
//! A send or receive that completes without waiting (a pub send with no subscriber, a receive
//! from a full queue) never returns `Pending`, so a loop of them would never give the runtime
//! back: on a device's current-thread runtime, accepting peers, signals and control requests
//! would starve. Every [`Channel`] send and receive therefore first spends one unit of tokio's
//! cooperative budget (`tokio::task::consume_budget`): a task that used up its budget yields
//! once, then goes on. It is spent *before* the operation, so a future cancelled at that point
//! has neither sent nor received anything. Outside a tokio runtime the budget is unlimited.
//!
//! # Fast paths
//! [`Socket::send_parts`] and [`Socket::receive_parts`] are boxed futures (the traits are object
//! safe), one allocation per call. A socket that can often complete at once also implements
//! [`Socket::try_send_parts`] / [`Socket::try_receive_parts`] (and a transport
//! [`Transport::try_new_message`]): [`Channel`] calls those first and awaits the boxed form only
//! when they hand the message back or have nothing. They never block and never fail: a message
//! handed back is untouched, so the waiting form decides about timeouts and errors as before.
//!
//! # Request and reply
//! A req channel sends a request, then receives its reply, then sends the next; a rep channel
//! receives a request, then replies. [`Channel`] enforces the alternation for every transport:
//! an operation out of turn fails at once with [`Error::WrongSocketType`] and changes nothing
//! (a send hands its message back). A send or receive that fails (a timeout) leaves the turn
//! where it was, so a req whose reply is late can wait for it again.
//!
//! # Shutdown
//! [`Channel::close`] waits up to `linger` for queued messages to leave the process, then closes.
//! Dropping a channel without closing it gives no such guarantee.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::address::Address;
use crate::config::{ChannelConfig, Method, SocketType};
use crate::error::{ChannelLabel, Error, Result, SendError};
use crate::message::{Message, Parts};
use crate::tap::{Direction, TapSlot};
use crate::typed::{Decode, Encode, Receiver, Sender};

/// A transport: makes messages in its own memory and sockets that move them.
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug {
    /// The configuration name (`zeromq`, `shmem`, `ofi`).
    fn name(&self) -> &'static str;

    /// A message of `size` bytes in this transport's memory (the heap unless the transport has
    /// its own, like shared memory). Its bytes are zero unless the transport recycles memory
    /// (shmem's blocks, zeromq's buffers from 64 KiB on), in which case they are what an earlier
    /// message of this process left there: write what you send, as with FairMQ's messages. The
    /// default allocates zeroed heap memory, fallibly.
    ///
    /// # Errors
    /// The transport's allocation error (a full segment, a size no memory can hold).
    async fn new_message(&self, size: usize) -> Result<Message> {
        Message::try_new(size).map_err(|error| Error::Allocation {
            transport: self.name(),
            source: format!("{size} bytes: {error}").into(),
        })
    }

    /// A message of `size` bytes if the transport can make one at once, without waiting and
    /// without failing; `None` sends the caller to [`Transport::new_message`], which waits or
    /// reports the error. The hot path of a sender: no boxed future when there is room.
    fn try_new_message(&self, size: usize) -> Option<Message> {
        let _ = size;
        None
    }

    /// A socket for one channel (or one sub-channel, named `socket_name`), not yet bound or
    /// connected.
    ///
    /// # Errors
    /// [`Error::Config`] for a configuration this transport cannot serve.
    async fn create_socket(
        &self,
        config: &ChannelConfig,
        socket_name: &str,
    ) -> Result<Box<dyn Socket>>;

    /// How this process's memory of the transport is used now (shmem: its own segment), for
    /// metrics and `ferromq top`; `None` for a transport without memory of its own. Cheap: a
    /// few atomic loads, callable from any thread.
    fn memory_figures(&self) -> Option<MemoryFigures> {
        None
    }
}

/// The use of a transport's memory in this process (see [`Transport::memory_figures`]); its
/// JSON form (field names as here, absent fields 0) is what a device's `overview` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct MemoryFigures {
    /// Bytes messages can take in all.
    pub size: u64,
    /// Bytes taken by blocks still referenced.
    pub used: u64,
    /// The largest free block: the biggest message that fits now.
    pub largest_free: u64,
    /// Blocks still referenced (here or in any receiver).
    pub live_blocks: u64,
    /// Unmanaged regions this process created and still holds.
    pub regions: u64,
    /// Buffers of those regions lent to messages and not released yet.
    pub region_buffers_lent: u64,
}

/// One end of a channel, as a transport implements it.
///
/// Device code does not call this directly; it holds a [`Channel`].
#[async_trait]
pub trait Socket: Send {
    /// Name, type and address, for errors and logs.
    fn label(&self) -> &ChannelLabel;

    /// Binds `address` and returns the address actually bound (the real port for port 0).
    ///
    /// # Errors
    /// [`Error::AddressInUse`], [`Error::UnsupportedAddress`], [`Error::Bind`].
    async fn bind(&mut self, address: &Address) -> Result<Address>;

    /// Connects to `address`. Does not wait for the peer to exist: sends wait for a peer instead.
    ///
    /// # Errors
    /// [`Error::UnsupportedAddress`], [`Error::Connect`].
    async fn connect(&mut self, address: &Address) -> Result<()>;

    /// Sends every part as one multipart message, waiting at most `timeout` (forever if `None`)
    /// for queue space and a peer.
    ///
    /// # Errors
    /// [`SendError`] with the parts when the timeout ran out, the socket is closed, or the
    /// transport failed.
    ///
    /// # Cancel safety
    /// Dropping the future drops the parts.
    async fn send_parts(
        &mut self,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>>;

    /// Sends `parts` at once if the socket can take them without waiting, and hands them back
    /// untouched (`Err`) if it cannot: room, a peer, memory or anything else missing. The caller
    /// then awaits [`Socket::send_parts`], which waits, times out or reports the error. Never
    /// blocks; the default hands everything back.
    ///
    /// # Errors
    /// The parts, not sent.
    fn try_send_parts(&mut self, parts: Parts) -> std::result::Result<(), Parts> {
        Err(parts)
    }

    /// Waits until this socket can take one message without waiting (room under `sndBufSize`
    /// and whatever else its pattern needs before it accepts a send), for [`Channel::reserve`];
    /// it may set that room aside for the next [`Socket::send_reserved`]. `Ok(false)` (the
    /// default): this socket cannot promise room ahead of a send.
    ///
    /// # Errors
    /// What makes every later send fail (a refused peer, a closed socket).
    ///
    /// # Cancel safety
    /// Must be cancel-safe: a dropped wait sends nothing and loses nothing.
    async fn reserve_send(&mut self) -> Result<bool> {
        Ok(false)
    }

    /// Sends `parts` into the room [`Socket::reserve_send`] found, without waiting and without
    /// failing for lack of room. It may still fail for another reason (a peer refused, a
    /// message that must be copied into memory that is full), handing the parts back.
    ///
    /// # Errors
    /// [`SendError`] with the parts; [`Error::Unsupported`] from a socket whose
    /// `reserve_send` says `false`.
    // The error hands the message back, as every send does (the async forms return the same).
    #[allow(clippy::result_large_err)]
    fn send_reserved(&mut self, parts: Parts) -> Result<(), SendError<Parts>> {
        Err(SendError::new(
            Error::Unsupported {
                channel: self.label().clone(),
                operation: "send through a reservation",
                reason: RESERVE_UNSUPPORTED,
            },
            parts,
        ))
    }

    /// A whole multipart message that is already here, without waiting; `None` when the caller
    /// must await [`Socket::receive_parts`] (which also reports errors). Never blocks.
    fn try_receive_parts(&mut self) -> Option<Parts> {
        None
    }

    /// The figures of this socket's sending side, which the transport keeps up to date and
    /// anyone may read (the channel's counters include them); `None` when it keeps none.
    fn send_figures(&self) -> Option<Arc<SendFigures>> {
        None
    }

    /// Receives one whole multipart message, waiting as long as it takes. Deadlines are the
    /// caller's: [`Channel`] bounds the wait by dropping this future, once, for every
    /// transport.
    ///
    /// # Errors
    /// [`Error::Interrupted`], [`Error::WrongSocketType`], [`Error::PeerGone`], transport
    /// errors.
    ///
    /// # Cancel safety
    /// Must be cancel-safe: a dropped future loses no message (the conformance suite checks it).
    async fn receive_parts(&mut self) -> Result<Parts>;

    /// Adds a topic prefix filter (sub only; the empty prefix subscribes to everything).
    ///
    /// # Errors
    /// [`Error::WrongSocketType`] on anything but sub.
    async fn subscribe(&mut self, topic: &[u8]) -> Result<()> {
        let _ = topic;
        Err(Error::WrongSocketType {
            channel: self.label().clone(),
            operation: "subscribe",
        })
    }

    /// Removes a topic prefix filter (sub only).
    ///
    /// # Errors
    /// [`Error::WrongSocketType`] on anything but sub.
    async fn unsubscribe(&mut self, topic: &[u8]) -> Result<()> {
        let _ = topic;
        Err(Error::WrongSocketType {
            channel: self.label().clone(),
            operation: "unsubscribe",
        })
    }

    /// Waits up to `linger` for queued messages to leave, then releases the socket.
    ///
    /// # Errors
    /// [`Error::Timeout`] when messages were still queued after `linger` (they are lost, and the
    /// error says how many).
    async fn close(&mut self, linger: Duration) -> Result<()>;
}

/// What a socket's sending side says about itself: how much waits in it, and how long sends
/// waited. Kept by the transport (see [`Socket::send_figures`]), read from any thread.
#[derive(Debug, Default)]
pub struct SendFigures {
    /// Messages accepted by `send` and not handed on yet: zeromq, not yet written to the kernel
    /// (push) or encoded for the wire (other patterns); shmem, not yet taken by a receiver, less
    /// what the rings of receivers that are gone held (as of recently).
    pub queued: AtomicU64,
    /// Nanoseconds sends spent waiting for room (`sndBufSize`, a full segment) or for a peer,
    /// in finished waits.
    waited_ns: AtomicU64,
    /// When the wait going on now began ([`figures_clock`] nanoseconds, +1), or 0.
    waiting_since: AtomicU64,
    /// Messages dropped for a subscriber whose queue was full (pub, as ZeroMQ's PUB drops).
    pub dropped_for_slow_subscribers: AtomicU64,
}

/// Nanoseconds since the first call in this process: a clock every thread reads alike.
fn figures_clock() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl SendFigures {
    /// A send begins to wait (back-pressure); the wait counts until the guard is dropped
    /// (the wait ended or was cancelled), and a reader sees it grow meanwhile.
    pub fn waiting(&self) -> SendWait<'_> {
        self.waiting_since
            .store(figures_clock() + 1, Ordering::Relaxed);
        SendWait { figures: self }
    }

    /// Nanoseconds sends waited in all, the wait going on now included.
    pub fn waited_ns(&self) -> u64 {
        let finished = self.waited_ns.load(Ordering::Relaxed);
        match self.waiting_since.load(Ordering::Relaxed) {
            0 => finished,
            since => finished + figures_clock().saturating_sub(since - 1),
        }
    }
}

/// A wait of a send, counted by [`SendFigures`] until dropped.
#[derive(Debug)]
pub struct SendWait<'a> {
    figures: &'a SendFigures,
}

impl Drop for SendWait<'_> {
    fn drop(&mut self) {
        let since = self.figures.waiting_since.swap(0, Ordering::Relaxed);
        if since > 0 {
            let waited = figures_clock().saturating_sub(since - 1);
            self.figures.waited_ns.fetch_add(waited, Ordering::Relaxed);
        }
    }
}

/// Messages and bytes through one channel, readable from any thread.
///
/// Written by its [`Channel`] alone, through `&mut self`: one writer, so a count goes up by a
/// load and a store instead of a locked add (the locked adds were 3 % of a sender at 64 B,
/// each waiting for the stores into the shared ring before it to leave the core).
#[derive(Debug, Default)]
pub struct ChannelCounters {
    messages_in: AtomicU64,
    bytes_in: AtomicU64,
    messages_out: AtomicU64,
    bytes_out: AtomicU64,
    /// The socket's sending figures, when its transport keeps them.
    send: Option<Arc<SendFigures>>,
    /// Messages accepted by send that the close reported undelivered.
    undelivered: AtomicU64,
}

/// A snapshot of [`ChannelCounters`]; its JSON form (field names as here but `send_wait_ns`,
/// absent fields 0) is what a device's `counters` and `overview` answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CounterSnapshot {
    /// Messages received (a multipart message counts once).
    pub messages_in: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Messages sent.
    pub messages_out: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Messages waiting in the socket's send queue (see [`SendFigures::queued`]).
    pub queued: u64,
    /// Nanoseconds sends waited for room or a peer, in all.
    #[serde(rename = "send_wait_ns")]
    pub send_waited_ns: u64,
    /// Messages lost because the close could not deliver them (the sender failed for it).
    pub lost_undelivered: u64,
    /// Messages a publisher dropped for subscribers whose queue was full.
    pub lost_slow_subscriber: u64,
}

/// Adds `n` to a counter that only the caller writes (readers see every value it passes
/// through, never a torn one; two writers would lose counts).
fn add_as_only_writer(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

impl ChannelCounters {
    /// Counts messages its owner had accepted for the channel and gave up before the channel
    /// took them (an rpc outlet whose close reached its deadline), beside those a close reports
    /// undelivered, so that the counters and `ferromq top` show every loss of the channel.
    pub fn count_undelivered(&self, n_messages: u64) {
        self.undelivered.fetch_add(n_messages, Ordering::Relaxed);
    }

    /// Only the owning [`Channel`] calls this (its `&mut self` makes it the one writer).
    fn record_in(&self, n_bytes: usize) {
        add_as_only_writer(&self.messages_in, 1);
        add_as_only_writer(&self.bytes_in, n_bytes as u64);
    }

    /// Only the owning [`Channel`] calls this (its `&mut self` makes it the one writer).
    fn record_out(&self, n_bytes: usize) {
        add_as_only_writer(&self.messages_out, 1);
        add_as_only_writer(&self.bytes_out, n_bytes as u64);
    }

    /// The current values.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            messages_in: self.messages_in.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            messages_out: self.messages_out.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            queued: self
                .send
                .as_ref()
                .map_or(0, |send| send.queued.load(Ordering::Relaxed)),
            send_waited_ns: self.send.as_ref().map_or(0, |send| send.waited_ns()),
            lost_undelivered: self.undelivered.load(Ordering::Relaxed),
            lost_slow_subscriber: self.send.as_ref().map_or(0, |send| {
                send.dropped_for_slow_subscribers.load(Ordering::Relaxed)
            }),
        }
    }
}

/// A configured channel: a socket plus what every transport shares.
///
/// # Examples
/// ```no_run
/// # async fn demo(transport: &dyn ferromq_core::Transport) -> ferromq_core::Result<()> {
/// use ferromq_core::{Channel, ChannelConfig, Message, Method, SocketType};
/// let config = ChannelConfig::new("data", SocketType::Push, Method::Bind).with_address("tcp://127.0.0.1:0");
/// let mut channel = Channel::open(transport, config, "data").await?;
/// channel.bind_configured().await?;
/// channel.send(Message::from("hello")).await.map_err(|failed| failed.error)?;
/// # Ok(()) }
/// ```
pub struct Channel {
    socket: Box<dyn Socket>,
    config: ChannelConfig,
    transport_name: &'static str,
    bound_address: Option<Address>,
    counters: Arc<ChannelCounters>,
    /// Where a recorder taps this channel (see `tap.rs`).
    tap: Arc<TapSlot>,
    pending_frames: VecDeque<Message>,
    /// req and rep only: whose turn it is (see "Request and reply").
    turn: Option<Turn>,
    /// Whether the next receive that finds nothing spins before it sleeps (see `spin.rs`).
    spin: crate::spin::SpinPolicy,
}

/// What a req or rep channel may do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Send,
    Receive,
}

impl Channel {
    /// Creates the socket of `socket_name` (the channel's name, or `name[i]` for a sub-channel).
    ///
    /// # Errors
    /// [`Error::Config`] when the configuration is invalid, or the transport's error.
    pub async fn open(
        transport: &dyn Transport,
        config: ChannelConfig,
        socket_name: &str,
    ) -> Result<Channel> {
        config.validate()?;
        let socket = transport.create_socket(&config, socket_name).await?;
        let send = socket.send_figures();
        let spin = crate::spin::SpinPolicy::of_spin_us(config.spin_us);
        let turn = match config.socket_type {
            SocketType::Req => Some(Turn::Send),
            SocketType::Rep => Some(Turn::Receive),
            _ => None,
        };
        Ok(Channel {
            socket,
            config,
            transport_name: transport.name(),
            bound_address: None,
            counters: Arc::new(ChannelCounters {
                send,
                ..ChannelCounters::default()
            }),
            tap: Arc::default(),
            pending_frames: VecDeque::new(),
            turn,
            spin,
        })
    }

    /// Name, type and address, for errors and logs.
    pub fn label(&self) -> &ChannelLabel {
        self.socket.label()
    }

    /// The socket's name (`data`, `data[1]`).
    pub fn name(&self) -> &str {
        &self.socket.label().name
    }

    /// The configuration it was made from.
    pub fn config(&self) -> &ChannelConfig {
        &self.config
    }

    /// The transport's name.
    pub fn transport_name(&self) -> &'static str {
        self.transport_name
    }

    /// The address bound, after a successful bind.
    pub fn bound_address(&self) -> Option<&Address> {
        self.bound_address.as_ref()
    }

    /// The counters, shareable with a rate logger.
    pub fn counters(&self) -> Arc<ChannelCounters> {
        Arc::clone(&self.counters)
    }

    /// Where a recorder taps this channel, shareable with whoever opens the tap.
    pub fn tap_slot(&self) -> Arc<TapSlot> {
        Arc::clone(&self.tap)
    }

    /// Binds `address`; returns the address actually bound.
    ///
    /// # Errors
    /// As [`Socket::bind`].
    pub async fn bind(&mut self, address: &Address) -> Result<Address> {
        let bound = self.socket.bind(address).await?;
        self.bound_address = Some(bound.clone());
        Ok(bound)
    }

    /// Connects to `address`.
    ///
    /// # Errors
    /// As [`Socket::connect`].
    pub async fn connect(&mut self, address: &Address) -> Result<()> {
        self.socket.connect(address).await
    }

    /// Binds every endpoint of the configured address that binds (method `bind`, or FairMQ's
    /// `@` prefix); returns the first address bound.
    ///
    /// # Errors
    /// [`Error::Config`] without an address to bind, or as [`Socket::bind`].
    pub async fn bind_configured(&mut self) -> Result<Address> {
        let mut first_bound = None;
        for address in self.configured_addresses(Method::Bind)? {
            let bound = self.bind(&address).await?;
            first_bound.get_or_insert(bound);
        }
        if let Some(first) = &first_bound {
            self.bound_address = Some(first.clone());
        }
        first_bound.ok_or_else(|| self.missing_address())
    }

    /// Connects to every endpoint of the configured address that connects (method `connect`,
    /// or FairMQ's `+` prefix).
    ///
    /// # Errors
    /// [`Error::Config`] without an address to connect to, or as [`Socket::connect`].
    pub async fn connect_configured(&mut self) -> Result<()> {
        let addresses = self.configured_addresses(Method::Connect)?;
        if addresses.is_empty() {
            return Err(self.missing_address());
        }
        for address in addresses {
            self.connect(&address).await?;
        }
        Ok(())
    }

    /// The configured endpoints with `method`.
    fn configured_addresses(&self, method: Method) -> Result<Vec<Address>> {
        Ok(self
            .config
            .endpoints()?
            .into_iter()
            .filter(|endpoint| endpoint.method == method)
            .map(|endpoint| endpoint.address)
            .collect())
    }

    fn missing_address(&self) -> Error {
        Error::Config(crate::config::ConfigError::MissingKey {
            channel: self.name().to_owned(),
            key: "address",
        })
    }

    /// Binds or connects as the configuration's `method` says; returns the bound address.
    ///
    /// # Errors
    /// As [`Channel::bind_configured`] or [`Channel::connect_configured`].
    pub async fn attach_configured(&mut self) -> Result<Option<Address>> {
        match self.config.method {
            Method::Bind => self.bind_configured().await.map(Some),
            Method::Connect => self.connect_configured().await.map(|()| None),
        }
    }

    /// Sends one message, waiting for queue space and a peer as long as it takes.
    ///
    /// # Errors
    /// [`SendError`] with the message when the channel is closed or the transport failed.
    ///
    /// # Cancel safety
    /// Dropping the future drops the message; use [`Channel::send_timeout`] to get it back.
    pub async fn send(&mut self, message: Message) -> Result<(), SendError<Message>> {
        self.send_inner(Parts::from(message), None)
            .await
            .map_err(single)
    }

    /// Sends one message, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`SendError`] with the message; [`Error::Timeout`] when the time ran out.
    pub async fn send_timeout(
        &mut self,
        message: Message,
        timeout: Duration,
    ) -> Result<(), SendError<Message>> {
        self.send_inner(Parts::from(message), Some(timeout))
            .await
            .map_err(single)
    }

    /// Sends a multipart message.
    ///
    /// # Errors
    /// [`SendError`] with the parts.
    pub async fn send_parts(&mut self, parts: Parts) -> Result<(), SendError<Parts>> {
        self.send_inner(parts, None).await
    }

    /// Sends a multipart message, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`SendError`] with the parts.
    pub async fn send_parts_timeout(
        &mut self,
        parts: Parts,
        timeout: Duration,
    ) -> Result<(), SendError<Parts>> {
        self.send_inner(parts, Some(timeout)).await
    }

    /// Sends a multipart message if the socket takes it at once, without waiting and outside
    /// any runtime: for a sender that must not wait (rpc's dispatcher sending its answers). The
    /// parts come back untouched (`Err`) when the socket cannot take them now (no room, no
    /// peer, out of turn, or a socket that only sends by waiting); the caller then awaits
    /// [`Channel::send_parts`], which waits, times out or reports the error.
    ///
    /// # Errors
    /// The parts, not sent.
    pub fn try_send_parts(&mut self, parts: Parts) -> std::result::Result<(), Parts> {
        if self.turn.is_some_and(|turn| turn != Turn::Send) || parts.is_empty() {
            return Err(parts);
        }
        let n_bytes = parts.total_size();
        let tapped = self.tap.prepare(&parts);
        self.socket.try_send_parts(parts)?;
        self.count_sent(n_bytes, tapped);
        Ok(())
    }

    /// Waits for room for one message and returns a permit that sends it without waiting: the
    /// two-phase send. The wait is cancel-safe and the message stays the caller's until
    /// [`SendPermit::send`], so a send that must give way to STOP (or anything else in a
    /// `tokio::select!`) loses nothing:
    ///
    /// ```no_run
    /// # async fn demo(channel: &mut ferromq_core::Channel, stop: tokio::sync::oneshot::Receiver<()>)
    /// # -> ferromq_core::Result<()> {
    /// let message = ferromq_core::Message::from("kept if STOP comes first");
    /// tokio::select! {
    ///     permit = channel.reserve() => permit?.send(message).map_err(|failed| failed.error)?,
    ///     _ = stop => { /* `message` is still here */ }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// Push and pair over zeromq (tcp, ipc, inproc), shmem push, and ofi support it; on other
    /// sockets it fails with [`Error::Unsupported`].
    ///
    /// # Errors
    /// [`Error::Unsupported`]; [`Error::WrongSocketType`] out of req/rep turn; what would make
    /// a send fail (a refused peer, a closed channel).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn reserve(&mut self) -> Result<SendPermit<'_>> {
        self.reserve_inner(None).await
    }

    /// [`Channel::reserve`], waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`Channel::reserve`]; [`Error::Timeout`] when no room came in time.
    pub async fn reserve_timeout(&mut self, timeout: Duration) -> Result<SendPermit<'_>> {
        self.reserve_inner(Some(timeout)).await
    }

    async fn reserve_inner(&mut self, timeout: Option<Duration>) -> Result<SendPermit<'_>> {
        self.check_turn(Turn::Send)?;
        // Before the wait, as for a send (see "Fairness").
        tokio::task::consume_budget().await;
        let wait = self.socket.reserve_send();
        let ready = match timeout {
            None => wait.await?,
            Some(after) => {
                tokio::time::timeout(after, wait)
                    .await
                    .map_err(|_| Error::Timeout {
                        channel: self.label().clone(),
                        after,
                    })??
            }
        };
        if !ready {
            return Err(Error::Unsupported {
                channel: self.label().clone(),
                operation: "reserve room for a send",
                reason: RESERVE_UNSUPPORTED,
            });
        }
        Ok(SendPermit { channel: self })
    }

    async fn send_inner(
        &mut self,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        if let Err(error) = self.check_turn(Turn::Send) {
            return Err(SendError::new(error, parts));
        }
        if parts.is_empty() {
            return Err(SendError::new(self.empty_message(), parts));
        }
        let n_bytes = parts.total_size();
        // Before the send, so a cancelled yield loses nothing (see "Fairness").
        tokio::task::consume_budget().await;
        // Copied before the parts move into the socket, kept only if the send succeeds.
        let tapped = self.tap.prepare(&parts);
        // Without a boxed future when the socket can take the message at once.
        if let Err(parts) = self.socket.try_send_parts(parts) {
            self.socket.send_parts(parts, timeout).await?;
        }
        self.count_sent(n_bytes, tapped);
        Ok(())
    }

    /// Why a message of no parts is not sent: it would deliver nothing (zeromq writes no
    /// frame for it), yet count as sent and be tapped.
    fn empty_message(&self) -> Error {
        Error::EmptyMessage {
            channel: self.label().clone(),
        }
    }

    /// What every send does once the socket took the message: counts it, hands the tap its
    /// copy, and passes a req or rep channel's turn.
    fn count_sent(&mut self, n_bytes: usize, tapped: Option<crate::tap::PreparedCopy>) {
        self.counters.record_out(n_bytes);
        if let Some(tapped) = tapped {
            tapped.commit(Direction::Out);
        }
        self.pass_turn(Turn::Receive);
    }

    /// Receives one frame. A multipart message arrives one part per call, in order, like
    /// libzmq's frame-at-a-time `recv`; use [`Channel::receive_parts`] to get all parts at once.
    ///
    /// # Errors
    /// As [`Socket::receive_parts`].
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn receive(&mut self) -> Result<Message> {
        self.receive_frame(None).await
    }

    /// Receives one frame, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when nothing arrived in time.
    pub async fn receive_timeout(&mut self, timeout: Duration) -> Result<Message> {
        self.receive_frame(Some(timeout)).await
    }

    async fn receive_frame(&mut self, timeout: Option<Duration>) -> Result<Message> {
        if let Some(frame) = self.pending_frames.pop_front() {
            return Ok(frame);
        }
        let parts = self.receive_whole(timeout).await?;
        self.pending_frames.extend(parts);
        Ok(self
            .pending_frames
            .pop_front()
            .unwrap_or_else(Message::empty))
    }

    /// Receives a whole multipart message (the rest of one, if [`Channel::receive`] already
    /// took its first frames).
    ///
    /// # Errors
    /// As [`Socket::receive_parts`].
    pub async fn receive_parts(&mut self) -> Result<Parts> {
        self.receive_parts_inner(None).await
    }

    /// Receives a whole multipart message, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when nothing arrived in time.
    pub async fn receive_parts_timeout(&mut self, timeout: Duration) -> Result<Parts> {
        self.receive_parts_inner(Some(timeout)).await
    }

    /// Receives a whole multipart message if one is there now, without waiting and outside any
    /// runtime: the receiving twin of [`Channel::try_send_parts`]. `None` when nothing is there,
    /// out of turn, or on a socket that only receives by waiting; the caller then awaits
    /// [`Channel::receive_parts`], which waits, times out or reports the error.
    pub fn try_receive_parts(&mut self) -> Option<Parts> {
        if !self.pending_frames.is_empty() || self.turn.is_some_and(|turn| turn != Turn::Receive) {
            return None;
        }
        let parts = self.socket.try_receive_parts()?;
        self.count_received(&parts);
        Some(parts)
    }

    async fn receive_parts_inner(&mut self, timeout: Option<Duration>) -> Result<Parts> {
        if !self.pending_frames.is_empty() {
            return Ok(self.pending_frames.drain(..).collect());
        }
        self.receive_whole(timeout).await
    }

    async fn receive_whole(&mut self, timeout: Option<Duration>) -> Result<Parts> {
        self.check_turn(Turn::Receive)?;
        // Before the receive, so a cancelled yield loses nothing (see "Fairness").
        tokio::task::consume_budget().await;
        let parts = if let Some(parts) = self.socket.try_receive_parts() {
            parts
        } else if self.config.busy_poll {
            self.receive_busy(timeout).await?
        } else {
            self.receive_waiting(timeout).await?
        };
        self.count_received(&parts);
        Ok(parts)
    }

    /// What every receive does with the parts it got: counts them, offers the tap a copy,
    /// and passes a req or rep channel's turn (the twin of `count_sent`).
    fn count_received(&mut self, parts: &Parts) {
        self.counters.record_in(parts.total_size());
        self.tap.offer(Direction::In, parts);
        self.pass_turn(Turn::Send);
    }

    /// Waits for the socket's next message, at most `timeout`: first spinning for as long as
    /// the channel's [`SpinPolicy`](crate::spin::SpinPolicy) says (polling the one receive
    /// future, yielding to the runtime between polls), then sleeping until the transport wakes
    /// it. The one place a receive deadline is kept: the socket's receive is cancel-safe, so
    /// dropping it at the deadline, or mid-spin, loses nothing.
    async fn receive_waiting(&mut self, timeout: Option<Duration>) -> Result<Parts> {
        use crate::spin::WaitOutcome;
        let started = std::time::Instant::now();
        let spin = self.spin.spin_for();
        let deadline = timeout.map(|after| started + after);
        let mut receive = self.socket.receive_parts();
        if !spin.is_zero() {
            let spin_end = started + spin.min(timeout.unwrap_or(spin));
            loop {
                let polled = std::future::poll_fn(|context| {
                    std::task::Poll::Ready(receive.as_mut().poll(context))
                })
                .await;
                if let std::task::Poll::Ready(received) = polled {
                    self.spin.record(WaitOutcome::CaughtSpinning);
                    return received;
                }
                if std::time::Instant::now() >= spin_end {
                    break;
                }
                YieldNow { yielded: false }.await;
            }
        }
        let received = match deadline {
            None => Some(receive.await),
            Some(deadline) => tokio::time::timeout_at(deadline.into(), receive).await.ok(),
        };
        self.spin.record(WaitOutcome::Slept {
            spun: !spin.is_zero(),
            waited: started.elapsed(),
        });
        received.unwrap_or_else(|| {
            Err(Error::Timeout {
                channel: self.label().clone(),
                after: timeout.unwrap_or_default(),
            })
        })
    }

    /// req/rep alternation: `wanted` must be this channel's turn.
    fn check_turn(&self, wanted: Turn) -> Result<()> {
        let Some(turn) = self.turn else {
            return Ok(());
        };
        if turn == wanted {
            return Ok(());
        }
        let operation = match (self.config.socket_type, wanted) {
            (SocketType::Req, Turn::Send) => "send a request before receiving the last reply",
            (SocketType::Req, Turn::Receive) => "receive before sending a request",
            (_, Turn::Send) => "send a reply before receiving a request",
            (_, Turn::Receive) => "receive a request before replying to the last one",
        };
        Err(Error::WrongSocketType {
            channel: self.label().clone(),
            operation,
        })
    }

    fn pass_turn(&mut self, next: Turn) {
        if self.turn.is_some() {
            self.turn = Some(next);
        }
    }

    /// `busyPoll`: polls one receive of the socket, and while nothing is there yields to the
    /// runtime instead of sleeping, so the process never parks in the kernel waiting for data.
    /// The same receive is polled again, with the task's waker: a receive that waits for work
    /// of its own (shmem maps a peer's memory on the blocking pool) finishes it, where a fresh
    /// receive per spin started that work over each time (an rpc member with `busy-poll` then
    /// stopped answering, in one run of two). It yields with tokio's `yield_now`, which puts
    /// the task back only after the runtime has polled its I/O driver (without blocking) and,
    /// on a current-thread runtime, the `block_on` future when it was woken: a task that woke
    /// itself at once stayed on the run queue, and the `block_on` future (a `main` making rpc
    /// calls) waited 61 of its polls for a turn. The transport's own tasks keep running.
    /// Costs a core; saves the wake-up on every message.
    async fn receive_busy(&mut self, timeout: Option<Duration>) -> Result<Parts> {
        let deadline = timeout.map(|timeout| std::time::Instant::now() + timeout);
        let mut receive = self.socket.receive_parts();
        loop {
            // One receive future, polled with this task's waker: a transport that hands data
            // over through its own tasks wakes the one it saw polling.
            let polled = std::future::poll_fn(|context| {
                std::task::Poll::Ready(receive.as_mut().poll(context))
            })
            .await;
            if let std::task::Poll::Ready(result) = polled {
                return result;
            }
            if deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline) {
                drop(receive);
                return Err(Error::Timeout {
                    channel: self.label().clone(),
                    after: timeout.unwrap_or_default(),
                });
            }
            tokio::task::yield_now().await;
        }
    }

    /// Adds a topic prefix filter (sub only).
    ///
    /// # Errors
    /// [`Error::WrongSocketType`] on anything but sub.
    pub async fn subscribe(&mut self, topic: impl AsRef<[u8]>) -> Result<()> {
        self.socket.subscribe(topic.as_ref()).await
    }

    /// Removes a topic prefix filter (sub only).
    ///
    /// # Errors
    /// [`Error::WrongSocketType`] on anything but sub.
    pub async fn unsubscribe(&mut self, topic: impl AsRef<[u8]>) -> Result<()> {
        self.socket.unsubscribe(topic.as_ref()).await
    }

    /// Waits up to the configured `linger` for queued messages to leave, then closes.
    ///
    /// # Errors
    /// As [`Socket::close`].
    pub async fn close(&mut self) -> Result<()> {
        self.close_within(Duration::MAX).await
    }

    /// [`Channel::close`] with its linger cut to `limit` where that is shorter: for an owner
    /// that must be done by a deadline of its own (an rpc member's shutdown). What is still
    /// queued then is counted and reported as by a linger that ran out.
    ///
    /// # Errors
    /// As [`Socket::close`].
    pub async fn close_within(&mut self, limit: Duration) -> Result<()> {
        let linger = self.config.linger_duration().min(limit);
        let closed = self.socket.close(linger).await;
        if let Err(Error::Undelivered { n_messages, .. }) = &closed {
            self.counters.count_undelivered(*n_messages);
        }
        closed
    }

    /// This channel as a typed sender of `T`.
    pub fn into_sender<T: Encode>(self) -> Sender<T> {
        Sender::new(self)
    }

    /// This channel as a typed receiver of `T`.
    pub fn into_receiver<T: Decode>(self) -> Receiver<T> {
        Receiver::new(self)
    }
}

/// Lets the tasks on the runtime's run queue run before the caller goes on: the task is put
/// back on the queue at once, behind those woken before it. Unlike tokio's `yield_now` it does
/// not wait for the runtime's turn of its drivers (an `epoll_wait`), so the tasks that yielded
/// with `yield_now` and those woken by I/O do not run in between. Runtime-independent.
pub fn yield_once() -> impl Future<Output = ()> {
    YieldNow { yielded: false }
}

/// Gives the other tasks of the runtime one turn (a runtime-independent `yield_now`).
struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.yielded {
            return std::task::Poll::Ready(());
        }
        self.yielded = true;
        context.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// Why a socket cannot reserve room, for [`Error::Unsupported`].
const RESERVE_UNSUPPORTED: &str = "this transport cannot promise room before a send on this \
    socket type (reservations: zeromq push and pair, shmem push, ofi); use send_timeout, which \
    hands the message back when it runs out";

/// Room for one message on a channel, from [`Channel::reserve`]: sending through it never
/// waits for room. Dropped unused, it sends nothing (the transport may keep the room for the
/// channel's next reservation).
#[must_use = "a permit sends nothing until `send` is called"]
pub struct SendPermit<'a> {
    channel: &'a mut Channel,
}

impl SendPermit<'_> {
    /// Sends one message into the reserved room, without waiting.
    ///
    /// # Errors
    /// [`SendError`] with the message, for a reason other than room: a refused peer, a closed
    /// channel, or (shmem) a heap message that must be copied into a segment that is full.
    // The error hands the message back, as every send does (the async forms return the same).
    #[allow(clippy::result_large_err)]
    pub fn send(self, message: Message) -> Result<(), SendError<Message>> {
        self.send_parts(Parts::from(message)).map_err(single)
    }

    /// Sends a multipart message into the reserved room, without waiting.
    ///
    /// # Errors
    /// As [`SendPermit::send`], with the parts.
    // The error hands the message back, as every send does (the async forms return the same).
    #[allow(clippy::result_large_err)]
    pub fn send_parts(self, parts: Parts) -> Result<(), SendError<Parts>> {
        let channel = self.channel;
        if parts.is_empty() {
            return Err(SendError::new(channel.empty_message(), parts));
        }
        let n_bytes = parts.total_size();
        let tapped = channel.tap.prepare(&parts);
        channel.socket.send_reserved(parts)?;
        channel.count_sent(n_bytes, tapped);
        Ok(())
    }
}

impl fmt::Debug for SendPermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendPermit")
            .field("channel", self.channel.label())
            .finish()
    }
}

fn single(failed: SendError<Parts>) -> SendError<Message> {
    failed.map(|parts| parts.into_iter().next().unwrap_or_else(Message::empty))
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("label", self.label())
            .field("transport", &self.transport_name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a test socket's receive and close do.
    #[derive(Debug, Clone, Copy)]
    enum Double {
        /// Receives nothing; its close loses three messages.
        Losing,
        /// Receives once work on the blocking pool is done, as shmem's receive does when a
        /// frame names memory it has not mapped yet; closes cleanly.
        OffThread,
        /// Receives nothing and counts every poll of its receive in `receives`; closes
        /// cleanly.
        CountingPolls,
    }

    /// A transport whose sockets accept every send and behave as `double` says; `receives`
    /// counts the receives its sockets started.
    #[derive(Debug)]
    struct TestTransport {
        double: Double,
        receives: Arc<AtomicU64>,
    }

    impl TestTransport {
        fn new(double: Double) -> TestTransport {
            TestTransport {
                double,
                receives: Arc::default(),
            }
        }
    }

    struct TestSocket {
        label: ChannelLabel,
        double: Double,
        receives: Arc<AtomicU64>,
    }

    #[async_trait]
    impl Socket for TestSocket {
        fn label(&self) -> &ChannelLabel {
            &self.label
        }
        async fn bind(&mut self, address: &Address) -> Result<Address> {
            Ok(address.clone())
        }
        async fn connect(&mut self, _address: &Address) -> Result<()> {
            Ok(())
        }
        async fn send_parts(
            &mut self,
            _parts: Parts,
            _timeout: Option<Duration>,
        ) -> Result<(), SendError<Parts>> {
            Ok(())
        }
        async fn receive_parts(&mut self) -> Result<Parts> {
            if let Double::CountingPolls = self.double {
                let polls = Arc::clone(&self.receives);
                return std::future::poll_fn(|_| {
                    polls.fetch_add(1, Ordering::Relaxed);
                    std::task::Poll::Pending
                })
                .await;
            }
            self.receives.fetch_add(1, Ordering::Relaxed);
            match self.double {
                Double::Losing => std::future::pending().await,
                Double::CountingPolls => unreachable!("returned above"),
                Double::OffThread => {
                    let mapped = tokio::task::spawn_blocking(|| Message::from("mapped")).await;
                    Ok(Parts::from(mapped.expect("the blocking task ran")))
                }
            }
        }
        async fn close(&mut self, _linger: Duration) -> Result<()> {
            match self.double {
                Double::Losing => Err(Error::Undelivered {
                    channel: self.label.clone(),
                    n_messages: 3,
                    reason: "test".to_owned(),
                }),
                Double::OffThread | Double::CountingPolls => Ok(()),
            }
        }
    }

    #[async_trait]
    impl Transport for TestTransport {
        fn name(&self) -> &'static str {
            "test"
        }
        async fn create_socket(
            &self,
            config: &ChannelConfig,
            socket_name: &str,
        ) -> Result<Box<dyn Socket>> {
            Ok(Box::new(TestSocket {
                label: ChannelLabel::new(socket_name, config.socket_type),
                double: self.double,
                receives: Arc::clone(&self.receives),
            }))
        }
    }

    /// A message of no parts is refused and handed back, as FairMQ refuses an empty vector:
    /// it was taken, counted and tapped, and no transport delivered anything for it.
    #[tokio::test]
    async fn a_message_of_no_parts_is_refused_not_counted() {
        let config = ChannelConfig::new("data", SocketType::Push, Method::Bind)
            .with_address("tcp://127.0.0.1:1");
        let transport = TestTransport::new(Double::OffThread);
        let mut channel = Channel::open(&transport, config, "data").await.unwrap();
        assert!(channel.try_send_parts(Parts::new()).is_err());
        let refused = channel.send_parts(Parts::new()).await.unwrap_err();
        assert!(refused.message.is_empty());
        assert_eq!(
            refused.error.to_string(),
            format!(
                "{}: cannot send a message of no parts (a message has at least one)",
                channel.label()
            )
        );
        assert_eq!(channel.counters().snapshot().messages_out, 0);
        channel.send(Message::from("one")).await.unwrap();
        assert_eq!(channel.counters().snapshot().messages_out, 1);
    }

    /// `busyPoll` keeps polling one receive: a fresh attempt per spin (what it did) dropped the
    /// blocking work each time and never received.
    #[tokio::test]
    async fn a_busy_polled_receive_completes_what_it_waits_for_off_the_async_threads() {
        let mut config = ChannelConfig::new("data", SocketType::Pull, Method::Bind)
            .with_address("tcp://127.0.0.1:1");
        config.busy_poll = true;
        let transport = TestTransport::new(Double::OffThread);
        let mut channel = Channel::open(&transport, config, "data").await.unwrap();
        let received = channel
            .receive_timeout(Duration::from_secs(5))
            .await
            .expect("received within 5 s");
        assert_eq!(received.data(), b"mapped");
        assert_eq!(
            transport.receives.load(Ordering::Relaxed),
            1,
            "the transport's receive was started again while it waited"
        );
    }

    /// A busy-polled receive yields through the runtime's scheduler: on a current-thread
    /// runtime the `block_on` future (a device's or a user's `main`) is polled only when the
    /// run queue is empty or after 61 task polls, and a spin that put itself back on the queue
    /// at once kept it waiting those 61 polls each time it was woken (rpc round trips from
    /// `main`: 10.1 instead of 6.9 µs).
    #[test]
    fn a_busy_polled_receive_lets_the_block_on_future_run_between_its_polls() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut config = ChannelConfig::new("data", SocketType::Pull, Method::Bind)
                .with_address("tcp://127.0.0.1:1");
            config.busy_poll = true;
            let transport = TestTransport::new(Double::CountingPolls);
            let polls = Arc::clone(&transport.receives);
            let mut channel = Channel::open(&transport, config, "data").await.unwrap();
            let spinning = tokio::spawn(async move { channel.receive().await.map(drop) });
            while polls.load(Ordering::Relaxed) == 0 {
                tokio::task::yield_now().await;
            }
            let mut most_between = 0;
            for _ in 0..100 {
                let before = polls.load(Ordering::Relaxed);
                tokio::task::yield_now().await;
                most_between = most_between.max(polls.load(Ordering::Relaxed) - before);
            }
            spinning.abort();
            assert!(
                most_between <= 2,
                "the spinning receive was polled {most_between} times while main waited for one turn"
            );
        });
    }

    /// A push channel on a `Double::Losing` socket.
    async fn losing_push() -> Channel {
        let config = ChannelConfig::new("data", SocketType::Push, Method::Bind)
            .with_address("tcp://127.0.0.1:1");
        Channel::open(&TestTransport::new(Double::Losing), config, "data")
            .await
            .unwrap()
    }

    /// A socket that only sends by waiting hands the parts back untouched, and nothing is
    /// counted as sent.
    #[tokio::test]
    async fn a_send_the_socket_cannot_take_at_once_hands_the_parts_back() {
        let mut channel = losing_push().await;
        let back = channel
            .try_send_parts(Parts::from(Message::from("kept")))
            .expect_err("the test socket takes nothing at once");
        assert_eq!(back.get(0).map(Message::data), Some(&b"kept"[..]));
        assert_eq!(channel.counters().snapshot().messages_out, 0);
    }

    #[tokio::test]
    async fn what_a_close_could_not_deliver_is_counted_as_lost() {
        let mut channel = losing_push().await;
        channel.send(Message::from("x")).await.unwrap();
        assert!(channel.close().await.is_err());
        let counted = channel.counters().snapshot();
        assert_eq!((counted.messages_out, counted.lost_undelivered), (1, 3));
    }
}
