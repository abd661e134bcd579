//! [`Rpc`]: one member of a group: its outlets to every member, its dispatcher, the calls it
//! waits on.
//!
//! # The path of one call
//! `call_return::<P>(dest, &args)` registers a pending entry under a new sequence number,
//! serialises `args` into the open frame of `dest`'s outlet (`outlet.rs`) and waits. The
//! outlet's task sends the frame over the push channel to `dest`'s inbound pull channel (or,
//! for `dest` = this member, hands it to its own dispatcher). `dest`'s dispatcher reads the
//! frame's records in order, runs the handler of each (one at a time: calls from one sender run
//! in the order they were made) and queues the result as a reply record in its outlet back to
//! the caller, where the dispatcher completes the pending entry. A frame whose handlers run
//! long, or frames that keep coming, are served in slices ([`YIELD_AFTER`]): between them the
//! outlets, tasks of the same runtime, send what the handlers queued so far.
//!
//! # Peer death, timeouts and drop
//! Nothing waits forever: a result, an acknowledgement, room in a full destination's queue and a
//! flush each wait at most `RpcOptions::timeout`, then fail with an error naming the destination
//! and the handler (a destination that died is found this way; zeromq and shmem give no
//! earlier sign). Results are timed by one sweeper task per member (`sweep`), not a timer per
//! call, so a `call_return` fails no earlier than 15/16 of the timeout. A channel that fails
//! fails the pending calls to its destination at once. A result that arrives after its caller
//! gave up is dropped. Dropping every [`Rpc`] handle stops the dispatcher and lets the outlets
//! send what they hold before closing; [`Rpc::shutdown`] does the same and waits for it, within
//! its limit: every channel is closed by then (its linger cut to what is left), never dropped
//! unclosed, and what a destination did not take is reported.

use rustc_hash::FxHashMap;
use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ferromq_core::{
    Address, Channel, ChannelConfig, Message, Method, Parts, SocketType, Transport,
};
use serde::Serialize;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{CallError, Refused, RemoteFailure};
use crate::handlers::{Handlers, Invocation, Procedure, Resolved, Started};
use crate::outlet::{
    Aggregation, Counts, Flushed, Outlet, OutletConfig, Payload, Rejection, SHUT_DOWN, Sink,
};
use crate::wire::{self, FrameReader, RecordHead, Status};
use crate::writer::CallWriter;

/// How long [`Rpc::shutdown_within`] waits past its limit for the channels' closes (the
/// inbound's comes once the outlets ended) before it drops a channel unclosed.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How a member packs, bounds and times its calls.
#[derive(Debug, Clone)]
pub struct RpcOptions {
    /// How calls to one destination are packed (`aggregate` in a topology).
    pub aggregation: Aggregation,
    /// The size of an aggregated frame (`aggregate-bytes`, default 4 KiB).
    pub aggregate_bytes: usize,
    /// How long `trad` holds a frame that is not full (`aggregate-us`, default 100 µs).
    pub aggregate_delay: Duration,
    /// Calls queued per destination before it counts as full (default 4096).
    pub max_queued_calls: usize,
    /// The longest wait for a result, an acknowledgement, room or a flush (default 10 s). A
    /// `call_return` fails no earlier than 15/16 of it: one sweeper per member looks for
    /// results that waited too long every sixteenth of the timeout, instead of a timer per call.
    pub timeout: Duration,
    /// The fan-out of a broadcast's tree (default 2: binary).
    pub tree_arity: u8,
    /// The inbound channel spins instead of sleeping until a frame arrives (channel option
    /// `busyPoll`): the lowest latency, at the cost of a busy core. Applies where the inbound is
    /// bound ([`Inbound::bind_with`]; a topology's group sets it with `busy-poll = true`).
    pub busy_poll: bool,
    /// How long the inbound channel spins, once a frame came soon after the last, before it
    /// sleeps (channel option `spinUs`, default [`ferromq_core::DEFAULT_SPIN_US`]; 0 never
    /// spins). A spin takes a core: where the group has more processes than the host has
    /// cores, the processes it waits for may need that core more. Applies where the inbound is
    /// bound, as `busy_poll` does (a topology's group sets it with `spin-us`).
    pub spin_us: u32,
}

/// The values [`RpcOptions::aggregate_bytes`] takes from a user (a topology's group, an
/// example's option), inclusive.
pub const AGGREGATE_BYTES_BOUNDS: (u64, u64) = (64, 64 << 20);
/// The values [`RpcOptions::aggregate_delay`] takes from a user, in microseconds, inclusive.
pub const AGGREGATE_US_BOUNDS: (u64, u64) = (0, 10_000_000);

impl Default for RpcOptions {
    fn default() -> RpcOptions {
        RpcOptions {
            aggregation: Aggregation::default(),
            aggregate_bytes: 4096,
            aggregate_delay: Duration::from_micros(100),
            max_queued_calls: 4096,
            timeout: Duration::from_secs(10),
            tree_arity: 2,
            busy_poll: false,
            spin_us: ferromq_core::DEFAULT_SPIN_US,
        }
    }
}

/// What a call does when its destination's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait for room, at most the timeout (Seriema's Retry).
    Wait,
    /// Queue it locally, keeping the order of this member's calls (Seriema's RetryAsync).
    Queue,
    /// Fail at once, handing the call back (only [`CallBuilder::try_call`] and
    /// [`CallBuilder::try_call_buffer`], which can hand the arguments back).
    Fail,
}

/// When a call's [`Ticket`] is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    /// When the call was accepted (queued for sending).
    Accepted,
    /// When the call has left this member (handed to the transport): its buffer is no longer
    /// needed here.
    Left,
    /// When the destination ran the handler (Seriema's Synchronizer); a failure there comes
    /// back as the ticket's error.
    Consumed,
}

/// One member of the group: its name and the address its inbound channel binds.
#[derive(Debug, Clone)]
pub struct Member {
    /// How errors and logs name it.
    pub name: String,
    /// Where its inbound channel binds (the others connect there).
    pub address: Address,
}

/// Why a member could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// `me` is no index into the members.
    #[error("member index {me} is not in a group of {n_members}")]
    NotAMember {
        /// The index given.
        me: usize,
        /// The group's size.
        n_members: usize,
    },
    /// The inbound is not where the member list says member `me` is: the index is wrong.
    #[error("member {me} is listed at {listed}, but its inbound is bound at {bound}")]
    WrongInbound {
        /// The index given.
        me: usize,
        /// Where the inbound is bound.
        bound: String,
        /// Where the member list puts member `me`.
        listed: String,
    },
    /// Two handlers with one id.
    #[error("handlers: {0}")]
    Handlers(String),
    /// `tree_arity` 0.
    #[error("broadcast tree arity 0: it must be at least 1")]
    Arity,
    /// A channel could not be opened, bound or connected.
    #[error(transparent)]
    Channel(#[from] ferromq_core::Error),
}

/// Counts of what a member sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcStats {
    /// Frames handed to the transport (or to this member's own dispatcher).
    pub frames: u64,
    /// Records (calls, results, acknowledgements) in them.
    pub records: u64,
    /// Records that shared their frame with others.
    pub aggregated_records: u64,
    /// Records queued now and not yet sent, over every destination, with the calls that
    /// [`CallWriter`]s hold and have not handed over yet.
    pub queued_records: usize,
}

/// The inbound channel of a member, bound before the group starts (so that a port 0 can be
/// told to the others).
pub struct Inbound {
    channel: Channel,
    address: Address,
}

impl Inbound {
    /// Binds a pull channel named `rpc` at `address`.
    ///
    /// # Errors
    /// The transport's bind error (address in use, unsupported address, ...).
    pub async fn bind(transport: &dyn Transport, address: &Address) -> Result<Inbound, StartError> {
        Inbound::bind_with(transport, address, &RpcOptions::default()).await
    }

    /// [`Inbound::bind`] with the inbound's settings from `options` (`busy_poll`, `spin_us`).
    ///
    /// # Errors
    /// As [`Inbound::bind`].
    pub async fn bind_with(
        transport: &dyn Transport,
        address: &Address,
        options: &RpcOptions,
    ) -> Result<Inbound, StartError> {
        let mut config = ChannelConfig::new("rpc", SocketType::Pull, Method::Bind)
            .with_address(address.to_string());
        config.busy_poll = options.busy_poll;
        config.spin_us = options.spin_us;
        let mut channel = Channel::open(transport, config, "rpc").await?;
        let address = channel.bind(address).await?;
        Ok(Inbound { channel, address })
    }

    /// The address actually bound (the real port for port 0).
    pub fn address(&self) -> &Address {
        &self.address
    }
}

/// A result's encoded bytes on their way from the dispatcher to its caller: up to a cache line
/// of them without an allocation of their own (a copy into a `Vec` was one of the few
/// allocations left per `call_return`; most results are small: the MCTS search's are 3 bytes).
type ResultBytes = smallvec::SmallVec<[u8; 64]>;

enum Pending {
    Result {
        dest: usize,
        handler: &'static str,
        /// When the call fails with [`CallError::Timeout`] unless its result came: the
        /// sweeper's to keep (`sweep`), not a timer per call.
        deadline: Instant,
        reply: oneshot::Sender<Result<ResultBytes, CallError>>,
    },
    Acks {
        dest: usize,
        handler: &'static str,
        remaining: usize,
        reply: oneshot::Sender<Result<(), CallError>>,
    },
}

impl Pending {
    /// The call's destination.
    fn dest(&self) -> usize {
        match self {
            Pending::Result { dest, .. } | Pending::Acks { dest, .. } => *dest,
        }
    }

    /// The handler the call is for.
    fn handler(&self) -> &'static str {
        match self {
            Pending::Result { handler, .. } | Pending::Acks { handler, .. } => handler,
        }
    }

    /// Ends the wait of whoever waits for this call with `error`.
    fn fail(self, error: CallError) {
        match self {
            Pending::Result { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Pending::Acks { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// Where a pull call waiting for its buffer is told: the buffer, or why there is none.
type FetchedBuffer = oneshot::Sender<Result<Message, String>>;

/// Failures of fire-and-forget calls kept for [`Rpc::take_failures`], at most this many.
const MAX_KEPT_FAILURES: usize = 1024;

struct Node {
    me: usize,
    names: Vec<String>,
    outlets: Vec<Arc<Outlet>>,
    pending: Mutex<FxHashMap<u64, Pending>>,
    next_seq: AtomicU64,
    handlers: Handlers,
    options: RpcOptions,
    counts: Arc<Counts>,
    failures: Mutex<VecDeque<CallError>>,
    /// Buffers of pull calls, by the call's sequence number, until their destination fetches.
    lent: Mutex<HashMap<u64, Message>>,
    /// Pull calls being served here, waiting for their buffer: by (caller, sequence number).
    fetches: Mutex<HashMap<(usize, u64), FetchedBuffer>>,
    tasks: Mutex<Vec<JoinHandle<ferromq_core::Result<()>>>>,
    stop: watch::Sender<bool>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.outlets.iter().for_each(|outlet| outlet.close(None));
    }
}

/// What [`Rpc::call_at_once`] did with a call. Small (the error boxed), so that it comes back
/// in registers: a `Result<(), CallError>` came back through the caller's stack, and reading it
/// there waited on the narrow stores that wrote it (perf, `ferromq bench rpc --shared-frame`).
pub(crate) enum AtOnce {
    /// The outlet took it.
    Taken,
    /// The outlet is full, or the destination is unknown: the builder waits (or queues) as
    /// the node's policy says, or names the unknown destination.
    Wait,
    /// Refused for good (the channel failed, the node shut down, the arguments did not
    /// serialise).
    Refused(Box<CallError>),
}

/// A member of an rpc group; cheap to clone (all clones are the same member).
#[derive(Clone)]
pub struct Rpc {
    node: Arc<Node>,
    when_full: WhenFull,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Rpc {
    /// Starts member `me` of `members`: connects a push channel to every other member's
    /// address, starts the outlets and the dispatcher on `inbound`. Must run inside a tokio
    /// runtime.
    ///
    /// # Errors
    /// [`StartError`] naming the member index, a handler conflict or the channel that failed.
    pub async fn start(
        transport: Arc<dyn Transport>,
        me: usize,
        members: &[Member],
        inbound: Inbound,
        handlers: Handlers,
        options: RpcOptions,
    ) -> Result<Rpc, StartError> {
        if me >= members.len() {
            return Err(StartError::NotAMember {
                me,
                n_members: members.len(),
            });
        }
        if !same_endpoint(&inbound.address, &members[me].address) {
            return Err(StartError::WrongInbound {
                me,
                bound: inbound.address.to_string(),
                listed: members[me].address.to_string(),
            });
        }
        let mut outbound = Vec::with_capacity(members.len());
        for (idx, member) in members.iter().enumerate() {
            if idx == me {
                outbound.push(None);
                continue;
            }
            let name = format!("rpc->{}", member.name);
            let config = ChannelConfig::new(name.clone(), SocketType::Push, Method::Connect)
                .with_address(member.address.to_string());
            let mut channel = Channel::open(transport.as_ref(), config, &name).await?;
            channel.connect(&member.address).await?;
            outbound.push(Some(channel));
        }
        let names = members.iter().map(|member| member.name.clone()).collect();
        Rpc::from_channels(
            Some(transport),
            me,
            names,
            inbound.channel,
            outbound,
            handlers,
            options,
        )
    }

    /// Starts member `me` of the group `names` on channels made elsewhere (a topology's, see
    /// [`crate::join`]): `inbound` receives every member's calls, `outbound[i]` pushes to
    /// member `i` (this member's own entry is not used: calls to itself stay in the process).
    /// `lender` makes the frames in its memory (shared memory on shmem); `None`: heap frames.
    ///
    /// # Errors
    /// [`StartError`] naming the member index or a handler conflict.
    pub fn from_channels(
        lender: Option<Arc<dyn Transport>>,
        me: usize,
        names: Vec<String>,
        inbound: Channel,
        outbound: Vec<Option<Channel>>,
        handlers: Handlers,
        options: RpcOptions,
    ) -> Result<Rpc, StartError> {
        if me >= names.len() || outbound.len() != names.len() {
            return Err(StartError::NotAMember {
                me,
                n_members: names.len(),
            });
        }
        if let Some(conflict) = handlers.conflicts.first() {
            return Err(StartError::Handlers(conflict.clone()));
        }
        if options.tree_arity == 0 {
            return Err(StartError::Arity);
        }
        let counts = Arc::new(Counts::default());
        let config = OutletConfig {
            aggregation: options.aggregation,
            frame_bytes: options
                .aggregate_bytes
                .max(wire::HEADER_LEN + wire::RECORD_HEAD_LEN),
            max_delay: options.aggregate_delay,
            max_queued: options.max_queued_calls.max(1),
        };
        let me_u32 = u32::try_from(me).map_err(|_| StartError::NotAMember {
            me,
            n_members: names.len(),
        })?;
        let (loopback, loopback_queue) = mpsc::unbounded_channel();
        let sinks: Vec<Sink> = outbound
            .into_iter()
            .enumerate()
            .map(|(idx, channel)| match channel {
                Some(channel) if idx != me => Sink::Channel(Box::new(channel)),
                _ => Sink::Loopback(loopback.clone()),
            })
            .collect();
        drop(loopback);
        let outlets: Vec<Arc<Outlet>> = (0..names.len())
            .map(|idx| {
                let lends = if idx == me { None } else { lender.clone() };
                Arc::new(Outlet::new(idx, me_u32, config, lends, Arc::clone(&counts)))
            })
            .collect();
        let (stop, stopped) = watch::channel(false);
        let node = Arc::new(Node {
            me,
            names,
            outlets,
            pending: Mutex::default(),
            next_seq: AtomicU64::new(1),
            handlers,
            options,
            counts,
            failures: Mutex::default(),
            lent: Mutex::default(),
            fetches: Mutex::default(),
            tasks: Mutex::default(),
            stop,
        });
        let mut tasks = Vec::with_capacity(node.names.len() + 1);
        for (outlet, sink) in node.outlets.iter().zip(sinks) {
            let weak = Arc::downgrade(&node);
            let dest = outlet.dest;
            let on_failure = move |cause: String, n_lost: u64| {
                if let Some(node) = weak.upgrade() {
                    node.fail_pending_to(dest, &cause);
                    node.keep_lost(dest, n_lost, cause);
                }
            };
            tasks.push(tokio::spawn(Arc::clone(outlet).run(sink, on_failure)));
        }
        let intake = Intake {
            inbound,
            loopback: loopback_queue,
            inbound_first: false,
            stopped,
            backlog: VecDeque::new(),
            n_errors: 0,
            serving_since: std::time::Instant::now(),
            looked_at: std::time::Instant::now(),
            look_every: LOOK_EVERY_MIN,
            until_look: LOOK_EVERY_MIN,
            delivered: false,
            output: Vec::new(),
        };
        tasks.push(tokio::spawn(dispatch(Arc::downgrade(&node), intake)));
        *lock(&node.tasks) = tasks;
        // Not among `tasks` (whose order `shutdown_within` relies on): it ends with the stop.
        tokio::spawn(sweep(
            Arc::downgrade(&node),
            node.stop.subscribe(),
            sweep_period(node.options.timeout),
        ));
        Ok(Rpc {
            node,
            when_full: WhenFull::Wait,
        })
    }

    /// This member's index in the group.
    pub fn me(&self) -> usize {
        self.node.me
    }

    /// The members' names, by index.
    pub fn members(&self) -> &[String] {
        &self.node.names
    }

    /// The index of the member called `name`: its instance id (`driver`, `worker-1`), or a
    /// replica as `id[replica]` (`worker[1]`, the topology's `worker-1`).
    pub fn member(&self, name: &str) -> Option<usize> {
        let position = |wanted: &str| self.node.names.iter().position(|known| known == wanted);
        position(name).or_else(|| {
            let (id, replica) = name.strip_suffix(']')?.split_once('[')?;
            let replica: usize = replica.parse().ok()?;
            position(&format!("{id}-{replica}"))
        })
    }

    /// The policy of calls made through this handle when a destination is full (calls made
    /// by handlers queue; see [`Invocation`]).
    #[must_use]
    pub fn with_when_full(mut self, when_full: WhenFull) -> Rpc {
        if when_full != WhenFull::Fail {
            self.when_full = when_full;
        }
        self
    }

    /// A call to `dest` with this handle's policy, confirmed when accepted.
    pub fn to(&self, dest: usize) -> CallBuilder<'_> {
        CallBuilder {
            rpc: self,
            dest,
            when_full: self.when_full,
            confirm: Confirm::Accepted,
        }
    }

    /// Runs `P` at `dest`; fire and forget (returns once the call is queued). A failure at
    /// the destination comes back later, in [`Rpc::take_failures`] and the log.
    ///
    /// # Errors
    /// [`CallError`] when `dest` is unknown or unreachable, or full for the whole timeout.
    pub async fn call<P: Procedure>(&self, dest: usize, args: &P::Args) -> Result<(), CallError> {
        match self.call_at_once::<P>(dest, args) {
            AtOnce::Taken => Ok(()),
            AtOnce::Refused(error) => Err(*error),
            AtOnce::Wait => self.to(dest).call::<P>(args).await.map(drop),
        }
    }

    /// The part of [`Rpc::call`] that does not wait. A call the outlet takes at once needs no
    /// ticket and no waiting: written here, without the builder's future (a third of a
    /// streaming caller's time). Shared with [`CallWriter::call`] as a function, not by calling
    /// `Rpc::call`: a second caller of `Rpc::call::<P>` made the compiler stop inlining its
    /// future into a streaming caller's loop, which then lost a fifth of its calls per second
    /// (`ferromq bench rpc --mode trad --shared-frame`).
    #[inline(always)]
    pub(crate) fn call_at_once<P: Procedure>(&self, dest: usize, args: &P::Args) -> AtOnce {
        let bounded = self.when_full != WhenFull::Queue;
        match self.push_call(dest, P::id().0, &Payload::Encode(args), None, bounded) {
            Some(Ok(())) => AtOnce::Taken,
            Some(Err(Rejection::NoRoom { .. })) | None => AtOnce::Wait,
            Some(Err(rejection)) => AtOnce::Refused(Box::new(
                self.node.rejection_error(dest, P::NAME, rejection).0,
            )),
        }
    }

    /// A writer of calls to `dest` that holds them in a frame of its own, written without the
    /// lock [`Rpc::call`] takes per call: for one caller streaming calls to one destination
    /// that aggregates `trad` or `ovfl` (see [`CallWriter`] for when its calls leave, and their
    /// order: held calls leave on a full frame, `aggregate-us`, `flush` or drop; flush it when
    /// its calls pause).
    ///
    /// # Errors
    /// [`CallError::UnknownDestination`] when `dest` is not a member.
    pub fn writer(&self, dest: usize) -> Result<CallWriter<'_>, CallError> {
        let outlet = self
            .node
            .outlets
            .get(dest)
            .ok_or_else(|| self.unknown(dest))?;
        Ok(CallWriter::new(self, dest, outlet))
    }

    /// The policy of this handle's calls when a destination is full.
    pub(crate) fn when_full(&self) -> WhenFull {
        self.when_full
    }

    /// How long a call waits for room or an answer.
    pub(crate) fn timeout(&self) -> Duration {
        self.node.options.timeout
    }

    /// The error of a call of `handler` to `dest` that waited for room for the whole timeout.
    pub(crate) fn no_room(&self, dest: usize, handler: &str, queued: usize) -> CallError {
        self.node.no_room(dest, handler, queued)
    }

    /// The error a call of `handler` to `dest` refused with `rejection` fails with.
    pub(crate) fn refused(&self, dest: usize, handler: &str, rejection: Rejection) -> CallError {
        self.node.rejection_error(dest, handler, rejection).0
    }

    /// Keeps `n_calls` calls to `dest` that will never leave, and why, for
    /// [`Rpc::take_failures`] (as one [`CallError::Lost`]).
    pub(crate) fn keep_lost(&self, dest: usize, n_calls: u64, cause: String) {
        self.node.keep_lost(dest, n_calls, cause);
    }

    /// [`Rpc::flush`] for one destination.
    pub(crate) async fn flush_one(&self, dest: usize) -> Result<(), CallError> {
        let deadline = Instant::now() + self.node.options.timeout;
        let outcome = self.node.outlets[dest].flush(deadline).await;
        self.node.flush_failure(dest, outcome).map_or(Ok(()), Err)
    }

    /// Queues a call of `P` to `dest` without waiting (unbounded, in order: [`WhenFull::Queue`]),
    /// fire and forget: what a synchronous handler ([`Handlers::on_sync`]) calls with.
    ///
    /// # Errors
    /// [`CallError`] when `dest` is unknown or unreachable, or the arguments do not serialise.
    pub fn queue_call<P: Procedure>(&self, dest: usize, args: &P::Args) -> Result<(), CallError> {
        self.queue(dest, P::id().0, P::NAME, &Payload::Encode(args), None)
    }

    /// [`Rpc::queue_call`] with a buffer.
    ///
    /// # Errors
    /// As [`Rpc::queue_call`].
    pub fn queue_call_buffer<P: Procedure>(
        &self,
        dest: usize,
        args: &P::Args,
        buffer: Message,
    ) -> Result<(), CallError> {
        self.queue(
            dest,
            P::id().0,
            P::NAME,
            &Payload::Encode(args),
            Some(buffer),
        )
    }

    fn queue<T: Serialize + ?Sized>(
        &self,
        dest: usize,
        handler_id: u64,
        handler: &'static str,
        payload: &Payload<'_, T>,
        buffer: Option<Message>,
    ) -> Result<(), CallError> {
        self.push_call(dest, handler_id, payload, buffer, false)
            .ok_or_else(|| self.unknown(dest))?
            .map_err(|rejection| self.node.rejection_error(dest, handler, rejection).0)
    }

    /// Writes a fire-and-forget call into `dest`'s outlet without waiting (`bounded`: refused
    /// when the outlet is full); `None` when `dest` is not a member.
    fn push_call<T: Serialize + ?Sized>(
        &self,
        dest: usize,
        handler_id: u64,
        payload: &Payload<'_, T>,
        buffer: Option<Message>,
        bounded: bool,
    ) -> Option<Result<(), Rejection>> {
        let outlet = self.node.outlets.get(dest)?;
        let flags = if buffer.is_some() { wire::BUFFER } else { 0 };
        let head = RecordHead::call(handler_id, 0, flags);
        Some(outlet.try_push(head, payload, buffer, None, bounded, false))
    }

    /// Runs `P(args, buffer)` at `dest` once `buffer` is there in full. On shmem a buffer in
    /// the session's shared memory moves as a descriptor (no copy).
    ///
    /// # Errors
    /// As [`Rpc::call`].
    pub async fn call_buffer<P: Procedure>(
        &self,
        dest: usize,
        args: &P::Args,
        buffer: Message,
    ) -> Result<(), CallError> {
        self.to(dest).call_buffer::<P>(args, buffer).await.map(drop)
    }

    /// Runs `P` at `dest` and returns its result.
    ///
    /// # Errors
    /// [`CallError::Remote`] for a failure at the destination, [`CallError::Timeout`] when no
    /// result came within the timeout (a destination that died), and as [`Rpc::call`].
    pub async fn call_return<P: Procedure>(
        &self,
        dest: usize,
        args: &P::Args,
    ) -> Result<P::Output, CallError> {
        self.to(dest).call_return::<P>(args).await
    }

    /// Every member, this one included, runs `P(args)`, reached over a tree of
    /// `tree_arity` children per member rooted here. The ticket is done when every member ran
    /// it (or one failed).
    ///
    /// # Errors
    /// As [`Rpc::call`].
    pub async fn broadcast<P: Procedure>(&self, args: &P::Args) -> Result<Ticket, CallError> {
        self.start_broadcast::<P>(args, None).await
    }

    /// As [`Rpc::broadcast`], with a buffer every member gets (each forwarding member copies
    /// it once per child).
    ///
    /// # Errors
    /// As [`Rpc::call`].
    pub async fn broadcast_buffer<P: Procedure>(
        &self,
        args: &P::Args,
        buffer: Message,
    ) -> Result<Ticket, CallError> {
        self.start_broadcast::<P>(args, Some(buffer)).await
    }

    /// Sends every frame now (`trad` holds frames otherwise) and waits until every call made
    /// so far was handed to the transport: every destination at once, all within one timeout,
    /// so one that takes nothing holds back neither the others' frames nor their time; the
    /// first failure in member order is the answer. Calls a [`CallWriter`] still holds are
    /// its own to hand over ([`CallWriter::flush`], or dropping it) and are not waited for.
    ///
    /// # Errors
    /// [`CallError::Timeout`] naming a destination that took nothing for the timeout;
    /// [`CallError::Unreachable`] naming one whose channel failed (its calls were dropped), and
    /// [`CallError::Stopped`] once a shutdown gave calls up.
    pub async fn flush(&self) -> Result<(), CallError> {
        let deadline = Instant::now() + self.node.options.timeout;
        // Side by side (a flush waiting on one before sealing the next left the next's frames
        // held for as long as the first took): the first failure in member order is the answer.
        let outcomes = self.node.flush_outlets(deadline).await;
        let mut first_failure = None;
        for (outlet, outcome) in self.node.outlets.iter().zip(outcomes) {
            if let Some(failure) = self.node.flush_failure(outlet.dest, outcome) {
                first_failure.get_or_insert(failure);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// What this member sent so far.
    pub fn stats(&self) -> RpcStats {
        let counts = &self.node.counts;
        RpcStats {
            frames: counts.frames.load(Ordering::Relaxed),
            records: counts.records.load(Ordering::Relaxed),
            aggregated_records: counts.aggregated.load(Ordering::Relaxed),
            queued_records: self
                .node
                .outlets
                .iter()
                .map(|outlet| outlet.queued() + outlet.held_by_writers())
                .sum(),
        }
    }

    /// Failures no caller waits for, since the last take (the latest 1024): fire-and-forget
    /// calls their destinations reported failed, one per call, and [`CallError::Lost`] for
    /// accepted calls that will never leave, one per loss with their number (a destination's
    /// channel failed with calls queued for it; a [`CallWriter`] dropped with calls it could
    /// not hand over).
    pub fn take_failures(&self) -> Vec<CallError> {
        lock(&self.node.failures).drain(..).collect()
    }

    /// Sends what is queued, closes the channels (each with its linger) and stops the
    /// dispatcher, all within the timeout. Calls still pending fail with [`CallError::Stopped`].
    ///
    /// # Errors
    /// As [`Rpc::shutdown_within`].
    pub async fn shutdown(&self) -> ferromq_core::Result<()> {
        self.shutdown_within(self.node.options.timeout).await
    }

    /// [`Rpc::shutdown`] within `limit`: what a destination has not taken by then (it stopped,
    /// or the whole group is going down) is dropped and reported. Each channel is closed, its
    /// linger cut to what is left of `limit`; the inbound channel's close comes after, within
    /// [`CLOSE_GRACE`].
    ///
    /// Calls that a live [`CallWriter`] still holds once the channels close will not leave
    /// (flush or drop writers first): they make the shutdown fail, as calls it dropped do.
    ///
    /// # Errors
    /// [`ferromq_core::Error::Undelivered`] naming the first destination whose calls were
    /// dropped, or were still held by a writer, and how many; or a channel's close error.
    pub async fn shutdown_within(&self, limit: Duration) -> ferromq_core::Result<()> {
        let deadline = Instant::now() + limit;
        self.node.flush_outlets(deadline).await;
        self.node
            .outlets
            .iter()
            .for_each(|outlet| outlet.close(Some(deadline)));
        // Closed, an outlet refuses a writer's frame: what writers hold now is lost.
        let held = self.node.outlets.iter().find_map(|outlet| {
            let held = outlet.held_by_writers();
            (held > 0).then(|| ferromq_core::Error::Undelivered {
                channel: self.node.outlet_label(outlet.dest),
                n_messages: held as u64,
                reason: "a CallWriter still held them when the node shut down (flush or drop \
                         writers before the shutdown)"
                    .to_owned(),
            })
        });
        // The outlets end by the deadline themselves, each closing its channel (see
        // `Outlet::run`), and the dispatcher closes the inbound once stopped: a task is
        // aborted, its channel dropped without a close, only if that takes longer still.
        let cut_off = deadline + CLOSE_GRACE;
        let tasks = std::mem::take(&mut *lock(&self.node.tasks));
        let n_tasks = tasks.len();
        let mut result = held.map_or(Ok(()), Err);
        for (idx, mut task) in tasks.into_iter().enumerate() {
            let is_dispatcher = idx + 1 == n_tasks;
            if is_dispatcher {
                // The dispatcher, last: it served the peers until the outlets were empty.
                let _ = self.node.stop.send(true);
            }
            let outcome = match tokio::time::timeout_at(cut_off, &mut task).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_)) => Ok(()),
                Err(_) => {
                    task.abort();
                    // The outlet gave up at the limit; its channel's close, whose linger
                    // bounds silence, not the whole close, is still under way: a destination
                    // taking frames slowly. Its drop logs what it still held.
                    match self.node.outlets.get(idx).filter(|_| !is_dispatcher) {
                        Some(outlet) => Err(ferromq_core::Error::Undelivered {
                            channel: self.node.outlet_label(outlet.dest),
                            n_messages: outlet.queued() as u64,
                            reason: format!(
                                "the channel's close was still under way {CLOSE_GRACE:?} past \
                                 the shutdown's limit of {limit:?} and was cut short; its log \
                                 says what it still held"
                            ),
                        }),
                        None => Ok(()),
                    }
                }
            };
            if result.is_ok() {
                result = outcome;
            }
        }
        lock(&self.node.lent).clear();
        for (_, pending) in lock(&self.node.pending).drain() {
            pending.fail(CallError::Stopped);
        }
        result
    }

    fn unknown(&self, dest: usize) -> CallError {
        CallError::UnknownDestination {
            destination: dest.to_string(),
            members: self.node.names.join(", "),
        }
    }

    async fn start_broadcast<P: Procedure>(
        &self,
        args: &P::Args,
        buffer: Option<Message>,
    ) -> Result<Ticket, CallError> {
        let node = &self.node;
        let seq = node.next_seq.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        lock(&node.pending).insert(
            seq,
            Pending::Acks {
                dest: node.me,
                handler: P::NAME,
                remaining: node.names.len(),
                reply,
            },
        );
        let mut flags = wire::WANTS_ACK;
        if buffer.is_some() {
            flags |= wire::BUFFER;
        }
        let head = RecordHead {
            kind: wire::KIND_BROADCAST,
            flags,
            status: Status::Ok,
            arity: node.options.tree_arity,
            root: node.me as u32,
            handler: P::id().0,
            seq,
        };
        // The root is a member like the others: its own dispatcher runs the handler and
        // passes the broadcast on to its children.
        let submitted = node
            .submit(
                node.me,
                head,
                &Payload::Encode(args),
                buffer,
                None,
                WhenFull::Queue,
                P::NAME,
                false,
            )
            .await;
        if let Err((error, _)) = submitted {
            lock(&node.pending).remove(&seq);
            return Err(error);
        }
        Ok(Ticket(TicketState::Consumed {
            answer,
            node: Arc::downgrade(node),
            seq,
            destination: "every member".to_owned(),
            handler: P::NAME,
            timeout: node.options.timeout,
        }))
    }
}

/// A call being made: destination, policy when full, and what its ticket waits for.
pub struct CallBuilder<'a> {
    rpc: &'a Rpc,
    dest: usize,
    when_full: WhenFull,
    confirm: Confirm,
}

impl CallBuilder<'_> {
    /// What to do when the destination is full (`Fail` needs [`CallBuilder::try_call`]).
    #[must_use]
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// When the ticket is done.
    #[must_use]
    pub fn confirm(mut self, confirm: Confirm) -> Self {
        self.confirm = confirm;
        self
    }

    /// Runs `P(args)` at the destination.
    ///
    /// # Errors
    /// As [`Rpc::call`].
    pub async fn call<P: Procedure>(self, args: &P::Args) -> Result<Ticket, CallError> {
        self.send::<P>(args, None, false)
            .await
            .map_err(|(error, _)| error)
    }

    /// Runs `P(args, buffer)` at the destination once the buffer is there in full.
    ///
    /// # Errors
    /// As [`Rpc::call`].
    pub async fn call_buffer<P: Procedure>(
        self,
        args: &P::Args,
        buffer: Message,
    ) -> Result<Ticket, CallError> {
        self.send::<P>(args, Some(buffer), false)
            .await
            .map_err(|(error, _)| error)
    }

    /// Runs `P(args, buffer)` at the destination, which fetches the buffer from this member
    /// before running the handler (the pull form: the buffer stays here until the destination
    /// is ready for it; on shmem it still moves as a descriptor). The handler is registered as
    /// for [`CallBuilder::call_buffer`].
    ///
    /// # Errors
    /// As [`Rpc::call`].
    pub async fn call_buffer_pull<P: Procedure>(
        self,
        args: &P::Args,
        buffer: Message,
    ) -> Result<Ticket, CallError> {
        self.send::<P>(args, Some(buffer), true)
            .await
            .map_err(|(error, _)| error)
    }

    /// Runs `P(args)` at the destination; fails at once, handing the call back, when the
    /// destination's queue is full.
    ///
    /// # Errors
    /// [`Refused`] with the arguments and the reason.
    pub fn try_call<P: Procedure>(self, args: P::Args) -> Result<Ticket, Refused<P::Args>> {
        self.try_send::<P>(args, None)
    }

    /// As [`CallBuilder::try_call`], with a buffer (handed back too).
    ///
    /// # Errors
    /// [`Refused`] with the arguments, the buffer and the reason.
    pub fn try_call_buffer<P: Procedure>(
        self,
        args: P::Args,
        buffer: Message,
    ) -> Result<Ticket, Refused<P::Args>> {
        self.try_send::<P>(args, Some(buffer))
    }

    /// Runs `P(args)` at the destination and returns its result.
    ///
    /// # Errors
    /// As [`Rpc::call_return`].
    pub async fn call_return<P: Procedure>(self, args: &P::Args) -> Result<P::Output, CallError> {
        let node = &self.rpc.node;
        if self.dest >= node.names.len() {
            return Err(self.rpc.unknown(self.dest));
        }
        let seq = node.next_seq.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        // The only call waiting for an answer sends itself from this task when the outlet is
        // idle: a task switch less each way of a lone round trip (6.6 -> 5.9 us busy-polled).
        // With others in flight the outlet's task packs them: sending each from its caller
        // halved the returns per second with 64 in flight.
        let alone = {
            let mut pending = lock(&node.pending);
            pending.insert(
                seq,
                Pending::Result {
                    dest: self.dest,
                    handler: P::NAME,
                    deadline: Instant::now() + node.options.timeout,
                    reply,
                },
            );
            pending.len() == 1
        };
        let head = RecordHead::call(P::id().0, seq, wire::WANTS_RESULT);
        let when_full = match self.when_full {
            WhenFull::Fail => WhenFull::Wait,
            other => other,
        };
        if let Err((error, _)) = node
            .submit(
                self.dest,
                head,
                &Payload::Encode(args),
                None,
                None,
                when_full,
                P::NAME,
                alone,
            )
            .await
        {
            lock(&node.pending).remove(&seq);
            return Err(error);
        }
        // No timer of its own: the sweeper fails the call at its deadline (a timer registered
        // and removed per call cost 8 % of the returns per second with 64 in flight).
        let bytes = match answer.await {
            Ok(result) => result?,
            Err(_) => return Err(CallError::Stopped),
        };
        postcard::from_bytes::<P::Output>(&bytes).map_err(|error| CallError::Codec {
            handler: P::NAME.to_owned(),
            cause: format!(
                "the result from {} is no {}: {error}",
                node.names[self.dest],
                std::any::type_name::<P::Output>()
            ),
        })
    }

    fn head<P: Procedure>(
        &self,
        has_buffer: bool,
    ) -> (
        RecordHead,
        Option<oneshot::Receiver<Result<(), CallError>>>,
        u64,
    ) {
        let node = &self.rpc.node;
        let mut flags = 0;
        if has_buffer {
            flags |= wire::BUFFER;
        }
        let mut seq = 0;
        let mut consumed = None;
        if self.confirm == Confirm::Consumed {
            flags |= wire::WANTS_ACK;
            seq = node.next_seq.fetch_add(1, Ordering::Relaxed);
            let (reply, answer) = oneshot::channel();
            lock(&node.pending).insert(
                seq,
                Pending::Acks {
                    dest: self.dest,
                    handler: P::NAME,
                    remaining: 1,
                    reply,
                },
            );
            consumed = Some(answer);
        }
        (RecordHead::call(P::id().0, seq, flags), consumed, seq)
    }

    fn ticket<P: Procedure>(
        &self,
        consumed: Option<oneshot::Receiver<Result<(), CallError>>>,
        left: Option<oneshot::Receiver<()>>,
        seq: u64,
    ) -> Ticket {
        let node = &self.rpc.node;
        // Named only in a ticket that waits: a fire-and-forget call allocates nothing here.
        let destination = || node.names[self.dest].clone();
        let timeout = node.options.timeout;
        match (consumed, left) {
            (Some(answer), _) => Ticket(TicketState::Consumed {
                answer,
                node: Arc::downgrade(node),
                seq,
                destination: destination(),
                handler: P::NAME,
                timeout,
            }),
            (None, Some(left)) => Ticket(TicketState::Left {
                left,
                node: Arc::downgrade(node),
                dest: self.dest,
                destination: destination(),
                handler: P::NAME,
                timeout,
            }),
            (None, None) => Ticket(TicketState::Done),
        }
    }

    /// Queues the call with the builder's policy; `pull`: the buffer stays here (lent, by the
    /// call's sequence number) until the destination fetches it.
    async fn send<P: Procedure>(
        self,
        args: &P::Args,
        mut buffer: Option<Message>,
        pull: bool,
    ) -> Result<Ticket, (CallError, Option<Message>)> {
        if self.dest >= self.rpc.node.names.len() {
            return Err((self.rpc.unknown(self.dest), buffer));
        }
        let node = &self.rpc.node;
        let (mut head, consumed, mut seq) = self.head::<P>(buffer.is_some() && !pull);
        if let Some(lent) = buffer.take_if(|_| pull) {
            if seq == 0 {
                seq = node.next_seq.fetch_add(1, Ordering::Relaxed);
            }
            head.seq = seq;
            head.flags |= wire::PULL;
            lock(&node.lent).insert(seq, lent);
        }
        let (on_left, left) = self.left_channel();
        let when_full = match self.when_full {
            WhenFull::Fail => WhenFull::Wait,
            other => other,
        };
        match node
            .submit(
                self.dest,
                head,
                &Payload::Encode(args),
                buffer,
                on_left,
                when_full,
                P::NAME,
                false,
            )
            .await
        {
            Ok(()) => Ok(self.ticket::<P>(consumed, left, seq)),
            Err((error, buffer)) => {
                let lent = pull.then(|| lock(&node.lent).remove(&seq)).flatten();
                if seq != 0 {
                    lock(&node.pending).remove(&seq);
                }
                Err((error, buffer.or(lent)))
            }
        }
    }

    fn try_send<P: Procedure>(
        self,
        args: P::Args,
        buffer: Option<Message>,
    ) -> Result<Ticket, Refused<P::Args>> {
        if self.dest >= self.rpc.node.names.len() {
            let error = self.rpc.unknown(self.dest);
            return Err(Refused {
                args,
                buffer,
                error: Box::new(error),
            });
        }
        let (head, consumed, seq) = self.head::<P>(buffer.is_some());
        let (on_left, left) = self.left_channel();
        let node = &self.rpc.node;
        let outlet = &node.outlets[self.dest];
        match outlet.try_push(head, &Payload::Encode(&args), buffer, on_left, true, false) {
            Ok(()) => Ok(self.ticket::<P>(consumed, left, seq)),
            Err(rejection) => {
                if seq != 0 {
                    lock(&node.pending).remove(&seq);
                }
                let (error, buffer) = node.rejection_error(self.dest, P::NAME, rejection);
                Err(Refused {
                    args,
                    buffer,
                    error: Box::new(error),
                })
            }
        }
    }

    fn left_channel(&self) -> (Option<oneshot::Sender<()>>, Option<oneshot::Receiver<()>>) {
        if self.confirm == Confirm::Left {
            let (on_left, left) = oneshot::channel();
            (Some(on_left), Some(left))
        } else {
            (None, None)
        }
    }
}

enum TicketState {
    Done,
    Left {
        left: oneshot::Receiver<()>,
        node: Weak<Node>,
        dest: usize,
        destination: String,
        handler: &'static str,
        timeout: Duration,
    },
    Consumed {
        answer: oneshot::Receiver<Result<(), CallError>>,
        node: Weak<Node>,
        seq: u64,
        destination: String,
        handler: &'static str,
        timeout: Duration,
    },
}

/// What a call's [`Confirm`] waits for; [`Ticket::confirmed`] waits, at most the timeout.
/// Dropping a ticket waits for nothing (the call goes on).
pub struct Ticket(TicketState);

impl Ticket {
    /// Waits until the call was accepted, has left, or was consumed (as asked).
    ///
    /// # Errors
    /// [`CallError::Remote`] for a failure at the destination (`Consumed`), a timeout naming
    /// the destination, [`CallError::Unreachable`] when its channel failed first, or
    /// [`CallError::Stopped`] when the node was shut down before the call left or came back.
    pub async fn confirmed(self) -> Result<(), CallError> {
        match self.0 {
            TicketState::Done => Ok(()),
            TicketState::Left {
                left,
                node,
                dest,
                destination,
                handler,
                timeout,
            } => match tokio::time::timeout(timeout, left).await {
                Ok(Ok(())) => Ok(()),
                // Dropped unsent: the outlet says why (its channel failed, or the shutdown gave
                // the call up); a node that is gone was shut down.
                Ok(Err(_)) => Err(match node.upgrade() {
                    None => CallError::Stopped,
                    Some(node) => match node.outlets[dest].not_sent() {
                        Some(cause) => node.not_sent_error(dest, handler, cause),
                        None => CallError::Unreachable {
                            destination,
                            cause: format!("{handler} was dropped with its channel"),
                        },
                    },
                }),
                Err(_) => Err(CallError::Timeout {
                    destination,
                    handler: handler.to_owned(),
                    after: timeout,
                }),
            },
            TicketState::Consumed {
                answer,
                node,
                seq,
                destination,
                handler,
                timeout,
            } => match tokio::time::timeout(timeout, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(CallError::Stopped),
                Err(_) => {
                    if let Some(node) = node.upgrade() {
                        lock(&node.pending).remove(&seq);
                    }
                    Err(CallError::Timeout {
                        destination,
                        handler: handler.to_owned(),
                        after: timeout,
                    })
                }
            },
        }
    }
}

impl Node {
    /// Queues one record for `dest` with the policy; what was handed in comes back on failure.
    /// `hold`: the record is pushed held and released at once, so that an idle outlet sends it
    /// from this task (see `outlet.rs`).
    #[allow(clippy::too_many_arguments)]
    async fn submit<T: Serialize + ?Sized>(
        &self,
        dest: usize,
        head: RecordHead,
        payload: &Payload<'_, T>,
        mut buffer: Option<Message>,
        mut on_left: Option<oneshot::Sender<()>>,
        when_full: WhenFull,
        handler: &'static str,
        hold: bool,
    ) -> Result<(), (CallError, Option<Message>)> {
        let outlet = &self.outlets[dest];
        let bounded = when_full != WhenFull::Queue;
        // Read the clock only once the outlet is full: a call that is queued at once (the
        // streaming case) costs no clock read.
        let mut deadline = None;
        loop {
            match outlet.try_push(head, payload, buffer, on_left.take(), bounded, hold) {
                Ok(()) => {
                    if hold {
                        outlet.release();
                    }
                    return Ok(());
                }
                Err(Rejection::NoRoom {
                    buffer: back,
                    on_left: notice,
                    queued,
                }) if when_full == WhenFull::Wait => {
                    buffer = back;
                    on_left = notice;
                    let deadline =
                        *deadline.get_or_insert_with(|| Instant::now() + self.options.timeout);
                    if !outlet.wait_for_room(deadline).await {
                        return Err((self.no_room(dest, handler, queued), buffer));
                    }
                }
                Err(rejection) => return Err(self.rejection_error(dest, handler, rejection)),
            }
        }
    }

    /// The error of a call of `handler` to `dest` that waited for room for the whole timeout,
    /// `queued` calls queued.
    fn no_room(&self, dest: usize, handler: &str, queued: usize) -> CallError {
        CallError::Timeout {
            destination: self.names[dest].clone(),
            handler: format!("{handler} (waiting for room: {queued} calls queued)"),
            after: self.options.timeout,
        }
    }

    /// How a flush of `dest`'s outlet ended, as the error a flush fails with; `None` when it
    /// drained.
    fn flush_failure(&self, dest: usize, outcome: Flushed) -> Option<CallError> {
        match outcome {
            Flushed::Drained => None,
            Flushed::TimedOut => Some(CallError::Timeout {
                destination: self.names[dest].clone(),
                handler: "flush".to_owned(),
                after: self.options.timeout,
            }),
            Flushed::NotSent(cause) => Some(self.not_sent_error(dest, "flush", cause)),
        }
    }

    /// The label of the push channel to `dest`, as a loss report names it.
    fn outlet_label(&self, dest: usize) -> ferromq_core::ChannelLabel {
        ferromq_core::ChannelLabel::new(format!("rpc->{}", self.names[dest]), SocketType::Push)
    }

    fn rejection_error(
        &self,
        dest: usize,
        handler: &str,
        rejection: Rejection,
    ) -> (CallError, Option<Message>) {
        let destination = self.names[dest].clone();
        match rejection {
            Rejection::NoRoom { buffer, queued, .. } => (
                CallError::Full {
                    destination,
                    handler: handler.to_owned(),
                    queued,
                },
                buffer,
            ),
            Rejection::Failed(cause) if cause == SHUT_DOWN => (CallError::Stopped, None),
            Rejection::Failed(cause) => (CallError::Unreachable { destination, cause }, None),
            Rejection::Encode(cause, buffer) => (
                CallError::Codec {
                    handler: handler.to_owned(),
                    cause: format!("the arguments could not be serialised: {cause}"),
                },
                buffer,
            ),
        }
    }

    /// Flushes every outlet side by side, each until `deadline`: one that takes nothing holds
    /// back neither another's frames nor its time. How each ended, in member order.
    async fn flush_outlets(&self, deadline: Instant) -> Vec<Flushed> {
        futures::future::join_all(self.outlets.iter().map(|outlet| outlet.flush(deadline))).await
    }

    /// What a call of `handler` to `dest` that will not leave fails with, for `cause` as an
    /// outlet says it: [`CallError::Stopped`] after a shutdown, [`CallError::Unreachable`]
    /// otherwise (as a refused call).
    fn not_sent_error(&self, dest: usize, handler: &str, cause: String) -> CallError {
        self.rejection_error(dest, handler, Rejection::Failed(cause))
            .0
    }

    /// The channel to `dest` failed (or, the loopback's, was shut down): every call waiting
    /// on it fails with `cause`, as a refused call would.
    fn fail_pending_to(&self, dest: usize, cause: &str) {
        self.fail_pending_where(
            |entry| entry.dest() == dest,
            |entry| self.not_sent_error(dest, entry.handler(), cause.to_owned()),
        );
    }

    /// Fails every `call_return` whose deadline is at most `limit` with
    /// [`CallError::Timeout`] (the sweeper's work, see `sweep`).
    fn expire_results(&self, limit: Instant) {
        self.fail_pending_where(
            |entry| matches!(entry, Pending::Result { deadline, .. } if *deadline <= limit),
            |entry| CallError::Timeout {
                destination: self.names[entry.dest()].clone(),
                handler: entry.handler().to_owned(),
                after: self.options.timeout,
            },
        );
    }

    /// Takes the pending calls `picked` and fails each with its `error`.
    fn fail_pending_where(
        &self,
        mut picked: impl FnMut(&Pending) -> bool,
        error: impl Fn(&Pending) -> CallError,
    ) {
        let mut pending = lock(&self.pending);
        for (_, entry) in pending.extract_if(|_, entry| picked(entry)) {
            let error = error(&entry);
            entry.fail(error);
        }
    }

    fn remote_error(
        &self,
        from: usize,
        handler: &str,
        status: Status,
        payload: &[u8],
    ) -> CallError {
        let (name, cause) = postcard::from_bytes::<(String, String)>(payload)
            .unwrap_or_else(|_| (String::new(), String::from_utf8_lossy(payload).into_owned()));
        CallError::Remote {
            destination: self.names[from].clone(),
            handler: if handler.is_empty() {
                name
            } else {
                handler.to_owned()
            },
            kind: RemoteFailure::of(status).unwrap_or(RemoteFailure::BadFrame),
            cause,
        }
    }

    /// A record queued for `dest` that must not wait (results, acknowledgements, broadcasts
    /// passed on: the dispatcher never blocks on a full peer). Held: it leaves at the
    /// dispatcher's next [`Node::release_answers`], which comes before the dispatcher waits for
    /// anything.
    fn answer(&self, dest: usize, head: RecordHead, payload: &[u8], buffer: Option<Message>) {
        let outlet = &self.outlets[dest];
        if let Err(rejection) = outlet.try_push_held::<[u8]>(head, &Payload::Raw(payload), buffer) {
            let (error, _) = self.rejection_error(dest, "an answer", rejection);
            tracing::warn!(%error, "an rpc answer could not be queued");
        }
    }

    /// Sends the answers held since the last release, from the dispatcher itself where the
    /// outlet is idle (see `outlet.rs`).
    fn release_answers(&self) {
        self.outlets.iter().for_each(|outlet| outlet.release());
    }

    /// Runs the broadcast or pull call in `head` from `from` and answers it (a plain call is
    /// started by `handle_frame` itself and ended by [`Node::finish`]). While the handler runs,
    /// frames that arrive have their results and acknowledgements delivered at once (a handler
    /// may wait for a call of its own) and wait in the backlog for their calls. `Break` when the
    /// node stops meanwhile (the handler is dropped).
    async fn serve(
        self: &Arc<Self>,
        from: usize,
        head: RecordHead,
        payload: &[u8],
        buffer: Option<Message>,
        invocation: &mut Invocation,
        intake: &mut Intake,
    ) -> ControlFlow<()> {
        let broadcast = head.kind == wire::KIND_BROADCAST;
        let answer_to = if broadcast { head.root as usize } else { from };
        if answer_to >= self.names.len() {
            tracing::warn!(
                root = answer_to,
                "dropped a broadcast from a root outside the group"
            );
            return ControlFlow::Continue(());
        }
        if broadcast && from != tree_parent(self.me, answer_to, self.names.len(), head.arity) {
            // Only the parent in the root's tree passes a broadcast on to a member: anything
            // else (a group whose members disagree on their indices) would start a storm.
            tracing::warn!(from = %self.names[from], root = %self.names[answer_to], "dropped a broadcast that did not come from this member's parent in the tree");
            return ControlFlow::Continue(());
        }
        if broadcast {
            // Passed on before running the handler: the tree's lower levels start sooner.
            for child in tree_children(self.me, answer_to, self.names.len(), head.arity) {
                let copy = buffer.as_ref().map(Message::copy);
                self.answer(child, head, payload, copy);
            }
            self.release_answers();
        }
        let buffer = if head.flags & wire::PULL == 0 {
            Ok(buffer)
        } else {
            // The pull form: the buffer is fetched from the caller first.
            let (sender, fetched) = oneshot::channel();
            lock(&self.fetches).insert((from, head.seq), sender);
            let fetch = RecordHead::answer(wire::KIND_FETCH, head.handler, head.seq, Status::Ok);
            self.answer(from, fetch, &[], None);
            let mut fetched = Box::pin(tokio::time::timeout(self.options.timeout, fetched));
            match self.while_serving(&mut fetched, intake).await {
                None => return ControlFlow::Break(()),
                Some(Ok(Ok(Ok(message)))) => Ok(Some(message)),
                Some(Ok(Ok(Err(cause)))) => Err((Status::BadFrame, cause)),
                Some(Ok(Err(_))) => Err((Status::BadFrame, "the fetch was dropped".to_owned())),
                Some(Err(_)) => {
                    lock(&self.fetches).remove(&(from, head.seq));
                    Err((
                        Status::BadFrame,
                        format!(
                            "the caller sent no buffer within {:?}",
                            self.options.timeout
                        ),
                    ))
                }
            }
        };
        invocation.caller = answer_to;
        let started = buffer
            .and_then(|mut buffer| self.start(head, payload, &mut buffer, invocation, intake));
        self.finish(from, answer_to, head, started, intake).await
    }

    /// Starts the handler of the call `head` names. A result nobody waits for is not encoded
    /// (a fire-and-forget call, or one that waits only for its acknowledgement).
    fn start(
        &self,
        head: RecordHead,
        payload: &[u8],
        buffer: &mut Option<Message>,
        invocation: &Invocation,
        intake: &mut Intake,
    ) -> Result<Started, (Status, String)> {
        let wants_result = head.flags & wire::WANTS_RESULT != 0;
        self.handlers.start(
            head.handler,
            invocation,
            payload,
            buffer,
            wants_result.then_some(&mut intake.output),
        )
    }

    /// Ends a started call: a running handler is awaited (the dispatcher delivering answers
    /// meanwhile), and the result or failure goes where the call's flags say. `Break` when the
    /// node stops while a handler runs.
    async fn finish(
        &self,
        from: usize,
        answer_to: usize,
        head: RecordHead,
        started: Result<Started, (Status, String)>,
        intake: &mut Intake,
    ) -> ControlFlow<()> {
        match started {
            // Without `WANTS_RESULT` the buffer is not written, and not read either.
            Ok(Started::Done) => self.answer_done(from, answer_to, head, intake),
            Ok(Started::Running(mut running)) => {
                match self.while_serving(&mut running, intake).await {
                    Some(Ok(output)) => self.conclude(from, answer_to, head, Ok(&output)),
                    Some(Err(failure)) => self.conclude(from, answer_to, head, Err(failure)),
                    None => return ControlFlow::Break(()),
                }
            }
            Err(failure) => self.conclude(from, answer_to, head, Err(failure)),
        }
        ControlFlow::Continue(())
    }

    /// [`Node::conclude`] for a handler that ran at once: its result is in `intake.output`.
    fn answer_done(&self, from: usize, answer_to: usize, head: RecordHead, intake: &mut Intake) {
        self.conclude(from, answer_to, head, Ok(&intake.output));
        if intake.output.capacity() > OUTPUT_KEPT {
            intake.output = Vec::new();
        }
    }

    /// Sends what the call `head` asked for: its result (to `from`), its acknowledgement (to
    /// `answer_to`, the root of a broadcast), or its failure, named and logged.
    fn conclude(
        &self,
        from: usize,
        answer_to: usize,
        head: RecordHead,
        outcome: Result<&[u8], (Status, String)>,
    ) {
        match outcome {
            Ok(result) => {
                if head.flags & wire::WANTS_RESULT != 0 {
                    let reply =
                        RecordHead::answer(wire::KIND_REPLY, head.handler, head.seq, Status::Ok);
                    self.answer(from, reply, result, None);
                }
                if head.flags & wire::WANTS_ACK != 0 {
                    let ack =
                        RecordHead::answer(wire::KIND_ACK, head.handler, head.seq, Status::Ok);
                    self.answer(answer_to, ack, &[], None);
                }
            }
            Err((status, cause)) => {
                let name = self.handlers.name(head.handler).unwrap_or_default();
                tracing::warn!(handler = name, id = %crate::HandlerId(head.handler), caller = %self.names[answer_to], %cause, "an rpc call failed");
                let kind = if head.flags & wire::WANTS_RESULT != 0 {
                    wire::KIND_REPLY
                } else {
                    wire::KIND_ACK
                };
                let to = if kind == wire::KIND_REPLY {
                    from
                } else {
                    answer_to
                };
                let payload = postcard::to_allocvec(&(name, cause.as_str())).unwrap_or_default();
                self.answer(
                    to,
                    RecordHead::answer(kind, head.handler, head.seq, status),
                    &payload,
                    None,
                );
            }
        }
    }

    /// Runs `future` to its end while the dispatcher keeps reading: results, acknowledgements
    /// and fetches are delivered at once, calls wait in the backlog. `None` when the node stops.
    async fn while_serving<F: Future + Unpin>(
        &self,
        future: &mut F,
        intake: &mut Intake,
    ) -> Option<F::Output> {
        loop {
            self.release_answers();
            tokio::select! {
                biased;
                output = &mut *future => return Some(output),
                next = intake.next() => match next {
                    Some(mut parts) => {
                        self.complete_answers(&mut parts);
                        intake.backlog.push_back(parts);
                    }
                    None => return None,
                },
            }
        }
    }

    /// Delivers the results, acknowledgements and fetches a frame carries (its calls wait). A
    /// fetched buffer is taken out of the frame, an empty part left in its place.
    fn complete_answers(&self, parts: &mut Parts) {
        let Some(first) = parts.get(0) else { return };
        let Ok(mut reader) = FrameReader::new(first.data()) else {
            return;
        };
        let from = reader.from as usize;
        if from >= self.names.len() {
            return;
        }
        let mut fetched = Vec::new();
        let mut part_idx = 0;
        while let Some(Ok(record)) = reader.next_record() {
            if record.head.flags & wire::BUFFER != 0 {
                part_idx += 1;
            }
            match record.head.kind {
                wire::KIND_REPLY => {
                    self.complete_result(from, record.head, record.payload);
                }
                wire::KIND_ACK => {
                    self.complete_ack(from, record.head, record.payload);
                }
                wire::KIND_FETCH => self.lend(from, record.head),
                wire::KIND_FETCHED => {
                    fetched.push((record.head, part_idx, record.payload.to_vec()))
                }
                _ => {}
            }
        }
        for (head, part_idx, payload) in fetched {
            let buffer = (head.flags & wire::BUFFER != 0)
                .then(|| {
                    parts
                        .iter_mut()
                        .nth(part_idx)
                        .map(|part| std::mem::replace(part, Message::empty()))
                })
                .flatten();
            self.deliver_fetched(from, head, buffer, &payload);
        }
    }

    /// Answers a fetch of the buffer of pull call `head.seq` to `to`.
    fn lend(&self, to: usize, head: RecordHead) {
        match lock(&self.lent).remove(&head.seq) {
            Some(buffer) => {
                let mut fetched =
                    RecordHead::answer(wire::KIND_FETCHED, head.handler, head.seq, Status::Ok);
                fetched.flags = wire::BUFFER;
                self.answer(to, fetched, &[], Some(buffer));
            }
            None => {
                let cause = format!(
                    "the caller {} holds no buffer for call {}",
                    self.names[self.me], head.seq
                );
                let fetched = RecordHead::answer(
                    wire::KIND_FETCHED,
                    head.handler,
                    head.seq,
                    Status::BadFrame,
                );
                self.answer(to, fetched, cause.as_bytes(), None);
            }
        }
    }

    /// A fetched buffer (or the caller's refusal) reaches the pull call waiting for it.
    fn deliver_fetched(
        &self,
        from: usize,
        head: RecordHead,
        buffer: Option<Message>,
        payload: &[u8],
    ) {
        let Some(waiting) = lock(&self.fetches).remove(&(from, head.seq)) else {
            tracing::debug!(from = %self.names[from], seq = head.seq, "dropped a buffer nobody waits for");
            return;
        };
        let delivered = match (head.status, buffer) {
            (Status::Ok, Some(buffer)) => Ok(buffer),
            (Status::Ok, None) => Err("the fetched buffer was missing from the frame".to_owned()),
            _ => Err(String::from_utf8_lossy(payload).into_owned()),
        };
        let _ = waiting.send(delivered);
    }

    /// Hands a result to its caller; true when that was the last call waiting for anything (a
    /// lone round trip, whose caller the dispatcher then lets run at once).
    fn complete_result(&self, from: usize, head: RecordHead, payload: &[u8]) -> bool {
        let (entry, last) = {
            let mut pending = lock(&self.pending);
            let entry = pending.remove(&head.seq);
            (entry, pending.is_empty())
        };
        match entry {
            Some(Pending::Result {
                dest,
                handler,
                reply,
                ..
            }) => {
                let result = match head.status {
                    Status::Ok => Ok(ResultBytes::from_slice(payload)),
                    status => Err(self.remote_error(dest, handler, status, payload)),
                };
                let _ = reply.send(result);
                last
            }
            Some(other) => {
                lock(&self.pending).insert(head.seq, other);
                tracing::warn!(from = %self.names[from], seq = head.seq, "dropped a result for a call that waits for an acknowledgement");
                false
            }
            None => {
                tracing::debug!(from = %self.names[from], seq = head.seq, "dropped a result whose caller gave up");
                false
            }
        }
    }

    /// Keeps a fire-and-forget call's failure for [`Rpc::take_failures`] (the latest
    /// [`MAX_KEPT_FAILURES`]).
    fn keep_failure(&self, error: CallError) {
        let mut failures = lock(&self.failures);
        if failures.len() == MAX_KEPT_FAILURES {
            failures.pop_front();
        }
        failures.push_back(error);
    }

    /// [`Rpc::keep_lost`]; nothing for no calls.
    fn keep_lost(&self, dest: usize, n_calls: u64, cause: String) {
        if n_calls > 0 {
            self.keep_failure(CallError::Lost {
                destination: self.names[dest].clone(),
                n_calls,
                cause,
            });
        }
    }

    /// Counts an acknowledgement; true when it completed the last call waiting for anything
    /// (see `complete_result`).
    fn complete_ack(&self, from: usize, head: RecordHead, payload: &[u8]) -> bool {
        if head.seq == 0 {
            // A fire-and-forget call failed (a success is never acknowledged).
            if head.status != Status::Ok {
                let error = self.remote_error(from, "", head.status, payload);
                tracing::warn!(%error, "an rpc call failed at its destination");
                self.keep_failure(error);
            }
            return false;
        }
        let mut pending = lock(&self.pending);
        let Some(Pending::Acks { remaining, .. }) = pending.get_mut(&head.seq) else {
            return false;
        };
        *remaining = remaining.saturating_sub(1);
        let done = *remaining == 0 || head.status != Status::Ok;
        if !done {
            return false;
        }
        let Some(Pending::Acks { handler, reply, .. }) = pending.remove(&head.seq) else {
            return false;
        };
        let last = pending.is_empty();
        drop(pending);
        let result = match head.status {
            Status::Ok => Ok(()),
            status => Err(self.remote_error(from, handler, status, payload)),
        };
        let _ = reply.send(result);
        last
    }

    /// Serves the records of one frame in order; `answered`: its results and acknowledgements
    /// were delivered already (a frame from the backlog).
    async fn handle_frame(
        self: &Arc<Self>,
        parts: Parts,
        answered: bool,
        intake: &mut Intake,
    ) -> ControlFlow<()> {
        let mut parts = parts.into_iter();
        let Some(first) = parts.next() else {
            return ControlFlow::Continue(());
        };
        let mut reader = match FrameReader::new(first.data()) {
            Ok(reader) => reader,
            Err(error) => {
                tracing::warn!(%error, "dropped a message that is not an rpc frame");
                return ControlFlow::Continue(());
            }
        };
        let from = reader.from as usize;
        if from >= self.names.len() {
            tracing::warn!(
                from,
                n_members = self.names.len(),
                "dropped an rpc frame from outside the group"
            );
            return ControlFlow::Continue(());
        }
        let mut served = 0u32;
        // Made at the frame's first call and lent to each call's handler: made per call, the
        // node's reference count went up and down per call, two locked instructions that were
        // a fifth of the dispatcher's work for 8-byte calls (perf, `ferromq bench rpc --mode trad`).
        let mut invocation: Option<Invocation> = None;
        // The handler of the frame's last plain call, for the calls after it.
        let mut resolved: Option<Resolved<'_>> = None;
        loop {
            // The short calls after a plain call to a synchronous handler run in the handler's
            // own loop (see `handlers::ShortCalls`), up to the next eighth call of the frame, so
            // that answers leave and the outlets get their turn as they would call by call.
            if let (Some(handler), Some(invocation)) = (resolved, invocation.as_mut())
                && reader.at_short_call_to(handler.id())
            {
                invocation.caller = from;
                if let Some((taken, failure)) = handler.run_short_calls(
                    invocation,
                    &mut reader,
                    CALLS_PER_LOOK - served % CALLS_PER_LOOK,
                ) && taken > 0
                {
                    if let Some(failure) = failure {
                        let head = RecordHead::call(handler.id(), 0, 0);
                        self.conclude(from, from, head, Err(failure));
                    }
                    served += taken;
                    if self.served(served, intake) {
                        tokio::task::yield_now().await;
                        intake.turned(std::time::Instant::now());
                    }
                    continue;
                }
            }
            let Some(record) = reader.next_record() else {
                break;
            };
            let record = match record {
                Ok(record) => record,
                Err(error) => {
                    tracing::warn!(from = %self.names[from], %error, "dropped the rest of a malformed rpc frame");
                    break;
                }
            };
            let head = record.head;
            match head.kind {
                wire::KIND_CALL | wire::KIND_BROADCAST => {
                    let mut buffer = if head.flags & wire::BUFFER != 0 {
                        match parts.next() {
                            Some(buffer) => Some(buffer),
                            None => {
                                let cause = "the call announced a buffer the message does not have";
                                let payload =
                                    postcard::to_allocvec(&("", cause)).unwrap_or_default();
                                let kind = if head.flags & wire::WANTS_RESULT != 0 {
                                    wire::KIND_REPLY
                                } else {
                                    wire::KIND_ACK
                                };
                                self.answer(
                                    from,
                                    RecordHead::answer(
                                        kind,
                                        head.handler,
                                        head.seq,
                                        Status::BadFrame,
                                    ),
                                    &payload,
                                    None,
                                );
                                continue;
                            }
                        }
                    } else {
                        None
                    };
                    let invocation = invocation.get_or_insert_with(|| Invocation {
                        caller: from,
                        rpc: Rpc {
                            node: Arc::clone(self),
                            when_full: WhenFull::Queue,
                        },
                    });
                    if head.kind == wire::KIND_CALL && head.flags & wire::PULL == 0 {
                        // A plain call starts here, not in `serve`'s future: the head and
                        // payload stay where they are instead of being moved into the future's
                        // state and read back (a tenth of the dispatcher's time, 8-byte calls).
                        invocation.caller = from;
                        let handler = match resolved {
                            Some(handler) if handler.id() == head.handler => Ok(handler),
                            _ => self.handlers.resolve(head.handler),
                        };
                        let wants_result = head.flags & wire::WANTS_RESULT != 0;
                        let started = handler.and_then(|handler| {
                            resolved = Some(handler);
                            // The buffer is lent where it lies, not moved (see
                            // `handlers::Erased`).
                            handler.start(
                                invocation,
                                record.payload,
                                &mut buffer,
                                wants_result.then_some(&mut intake.output),
                            )
                        });
                        match started {
                            Ok(Started::Done) => self.answer_done(from, from, head, intake),
                            started => self.finish(from, from, head, started, intake).await?,
                        }
                    } else {
                        self.serve(from, head, record.payload, buffer, invocation, intake)
                            .await?;
                    }
                    served += 1;
                    if self.served(served, intake) {
                        tokio::task::yield_now().await;
                        intake.turned(std::time::Instant::now());
                    }
                }
                // A fetched buffer takes its part even when it was delivered already.
                wire::KIND_FETCHED => {
                    let buffer = if head.flags & wire::BUFFER != 0 {
                        parts.next()
                    } else {
                        None
                    };
                    if !answered {
                        self.deliver_fetched(from, head, buffer, record.payload);
                    }
                }
                _ if answered => {}
                wire::KIND_REPLY => {
                    intake.delivered |= self.complete_result(from, head, record.payload);
                }
                wire::KIND_FETCH => self.lend(from, head),
                _ => intake.delivered |= self.complete_ack(from, head, record.payload),
            }
        }
        ControlFlow::Continue(())
    }

    /// After the `served`th call of a frame. Answers leave every [`RELEASE_EVERY`] calls, not
    /// only at the frame's end: a caller with many calls in flight refills while the rest is
    /// served instead of waiting for the whole wave. Handlers that take long would hold the
    /// calls they made until the intake is empty, and the members they call would idle
    /// meanwhile: after [`YIELD_AFTER`] of serving (counted across frames, looked at every
    /// eighth call of a frame, as [`Intake::served_eight`] paces the looks), the outlets get a
    /// turn to send. True: the dispatcher yields now (the answers were released).
    #[inline]
    fn served(&self, served: u32, intake: &mut Intake) -> bool {
        if served.is_multiple_of(RELEASE_EVERY) {
            self.release_answers();
        }
        if served.is_multiple_of(CALLS_PER_LOOK) && intake.served_eight() {
            self.release_answers();
            return true;
        }
        false
    }
}

/// Calls served between two releases of their answers within one frame. `ferromq bench rpc
/// --mode ovfl --call-size 64` (64 `call_return`s in flight, shmem): answers released only at a
/// frame's end 0.88 M returns/s, every 8 calls 0.82-0.92 M, every 16 1.02-1.11 M, every 32
/// 1.07-1.12 M; 16 keeps the gain for fewer calls in flight.
const RELEASE_EVERY: u32 = 16;
/// Calls of a frame between two looks at whether the dispatcher should yield
/// ([`Intake::served_eight`]); a run of short calls ends at the next multiple
/// (`Node::handle_frame`), so it never passes a look or a release.
pub(crate) const CALLS_PER_LOOK: u32 = 8;
const _: () = assert!(RELEASE_EVERY.is_multiple_of(CALLS_PER_LOOK));

/// How long the dispatcher serves calls before it lets the outlets send. 20 µs and 500 µs both
/// served the MCTS search's two workers worse than 200 (50 µs: ~10 % fewer rollouts/s): a turn
/// costs a pass over the runtime's tasks and the sends it makes.
///
/// Counted from the dispatcher's last turn, across frames, not from each frame's start: a frame
/// taken from a full intake comes at once, without a turn, so a member fed frame after frame
/// used to send nothing until its intake ran dry, and the members waiting for its calls idled.
/// With the time counted across frames (2026-11-27, MCTS with 1 playout a rollout, whose
/// frames take tens of µs): 2 workers on this project's machine 1.20-1.44x (three runs of 6-10
/// rounds), 8 workers on 16 cores 1.19x (8 rounds); with 16 playouts, whose frames took longer
/// already, 0.97-0.99x and 1.02x (0.84-1.26); `ferromq bench rpc` unchanged. Calls are
/// counted in eights within a frame, so a run of frames of fewer calls (`none`: one each; the
/// MCTS search's `ovfl` frames) never yields mid-run: counting the calls across frames cost
/// `none` 7 % here, and the MCTS search's 2 workers ~5 % by the median of 11 noisy rounds
/// (2026-12-03). Within a
/// frame the clock is read at the calls' pace ([`Intake::served_eight`]).
const YIELD_AFTER: std::time::Duration = std::time::Duration::from_micros(200);

/// Whether `listed` is where an inbound bound at `bound` is reached: the same address, or for
/// tcp the same port (a wildcard bind is reached at the host's address).
fn same_endpoint(bound: &Address, listed: &Address) -> bool {
    let (bound, listed) = (bound.to_string(), listed.to_string());
    let port = |address: &str| address.rsplit_once(':').map(|(_, port)| port.to_owned());
    bound == listed
        || (bound.starts_with("tcp://")
            && listed.starts_with("tcp://")
            && port(&bound) == port(&listed))
}

/// The parent of member `me` in the `arity`-ary tree over `n` members rooted at `root` (the
/// root is its own parent: it sends the broadcast to itself).
pub(crate) fn tree_parent(me: usize, root: usize, n: usize, arity: u8) -> usize {
    let arity = usize::from(arity.max(1));
    let rel = (me + n - root) % n;
    if rel == 0 {
        return root;
    }
    ((rel - 1) / arity + root) % n
}

/// The children of member `me` in the `arity`-ary tree over `n` members rooted at `root`.
pub(crate) fn tree_children(
    me: usize,
    root: usize,
    n: usize,
    arity: u8,
) -> impl Iterator<Item = usize> {
    let arity = usize::from(arity.max(1));
    let rel = (me + n - root) % n;
    (1..=arity)
        .map(move |j| rel.saturating_mul(arity).saturating_add(j))
        .filter(move |&child| child < n)
        .map(move |child| (child + root) % n)
}

/// Where the dispatcher's frames come from: the inbound channel, this member's own outlet, and
/// the frames that arrived while a handler ran.
struct Intake {
    inbound: Channel,
    loopback: mpsc::UnboundedReceiver<Parts>,
    /// The last frame came from the loopback: the channel is looked at first for the next. A
    /// member whose handlers call it again (a search's root owner starting the next
    /// simulations) always has a frame there, and looked at first it kept the channel, and
    /// every other member's calls, waiting for ever. (This takes a channel that hands over
    /// what is there without waiting: shmem's, and zeromq's pull over tcp, ipc and inproc.)
    inbound_first: bool,
    stopped: watch::Receiver<bool>,
    /// Frames whose calls wait for the handler running now (their answers were delivered).
    backlog: VecDeque<Parts>,
    n_errors: u64,
    /// When the dispatcher last let the runtime's other tasks (the outlets) run: across
    /// frames, because a frame taken at once from a full intake lets nothing else run (see
    /// `YIELD_AFTER`).
    serving_since: std::time::Instant,
    /// When the clock was last read for `serving_since` (see [`Intake::served_eight`]).
    looked_at: std::time::Instant,
    /// Eights of calls served between two reads of the clock, as their pace says.
    look_every: u32,
    /// Eights of calls to serve before the next read.
    until_look: u32,
    /// The frame being served completed the last call this member waited for (a lone
    /// `call_return`'s result, a lone ticket's acknowledgement): its caller is let run before
    /// the intake is looked at again.
    delivered: bool,
    /// Where a synchronous handler encodes its result, lent call after call (it is copied into
    /// the answer's frame at once); given up after a result of more than `OUTPUT_KEPT` bytes.
    output: Vec<u8>,
}

/// The most memory a dispatcher keeps for encoding synchronous handlers' results between calls:
/// one large result does not hold on to its size for the member's life.
const OUTPUT_KEPT: usize = 64 << 10;

/// The fewest and most eights of calls the dispatcher serves between two looks at the clock.
const LOOK_EVERY_MIN: u32 = 1;
const LOOK_EVERY_MAX: u32 = 32;

/// How long the dispatcher aims to serve between two looks at the clock: an eighth of
/// [`YIELD_AFTER`], so a turn comes at most that late while the calls keep their pace.
const LOOK_PERIOD: std::time::Duration = YIELD_AFTER.checked_div(8).expect("a nonzero divisor");

impl Intake {
    /// Counts eight calls of a frame served; true when the dispatcher has served
    /// [`YIELD_AFTER`] since its last turn and is to let the other tasks run
    /// ([`Intake::turned`] once they have).
    ///
    /// The clock is read every `look_every` eights, a number set from the calls' pace so the
    /// reads come every [`LOOK_PERIOD`]: read at every eight, as before, it was a seventh of
    /// the dispatcher's time for 8-byte calls (`ferromq bench rpc --mode trad`, perf), while
    /// calls that take tens of µs want a read at every eight. The count at most doubles per
    /// read, so slow calls after a run of fast ones wait at most `LOOK_EVERY_MAX` eights for
    /// a read, and that read sets the count from their pace.
    fn served_eight(&mut self) -> bool {
        self.until_look -= 1;
        if self.until_look > 0 {
            return false;
        }
        let now = std::time::Instant::now();
        let per_eight = now.duration_since(self.looked_at) / self.look_every;
        let paced = LOOK_PERIOD
            .as_nanos()
            .checked_div(per_eight.as_nanos())
            .map_or(LOOK_EVERY_MAX, |n| {
                u32::try_from(n).unwrap_or(LOOK_EVERY_MAX)
            });
        self.look_every = paced.clamp(LOOK_EVERY_MIN, (self.look_every * 2).min(LOOK_EVERY_MAX));
        self.until_look = self.look_every;
        self.looked_at = now;
        now.duration_since(self.serving_since) >= YIELD_AFTER
    }

    /// The dispatcher let the other tasks run (or waited for a frame) at `now`: the time
    /// served starts again, and so does the pace (a wait is no call's time).
    fn turned(&mut self, now: std::time::Instant) {
        self.serving_since = now;
        self.looked_at = now;
        self.until_look = self.look_every;
    }

    /// The next frame from the channel or the loopback; `None` once the node stops.
    /// Cancel-safe: every branch is.
    async fn next(&mut self) -> Option<Parts> {
        // A frame that is there already comes without the select: no registration with the
        // stop's `watch` (a lock to enter its list and one to leave it), no receive future, per
        // frame of a stream. Same order as the select's: the stop, the loopback, the channel,
        // but for the channel first after a frame from the loopback (`inbound_first`).
        if !*self.stopped.borrow() {
            // The runtime's budget, as the channel's receive spends it: a dispatcher fed frame
            // after frame of one call each (which `YIELD_AFTER` never interrupts) still gives
            // the other tasks a turn every 128 frames. Before the take: a cancelled yield loses
            // nothing.
            tokio::task::consume_budget().await;
            if std::mem::take(&mut self.inbound_first)
                && let Some(parts) = self.inbound.try_receive_parts()
            {
                return Some(parts);
            }
            if let Ok(parts) = self.loopback.try_recv() {
                self.inbound_first = true;
                return Some(parts);
            }
            if let Some(parts) = self.inbound.try_receive_parts() {
                return Some(parts);
            }
        }
        loop {
            tokio::select! {
                biased;
                changed = self.stopped.changed() => {
                    if changed.is_err() || *self.stopped.borrow() {
                        return None;
                    }
                }
                parts = self.loopback.recv() => {
                    self.inbound_first = true;
                    return parts;
                }
                received = self.inbound.receive_parts() => match received {
                    Ok(parts) => return Some(parts),
                    Err(error) => {
                        self.n_errors += 1;
                        if self.n_errors.is_power_of_two() {
                            tracing::warn!(%error, n_errors = self.n_errors, "rpc inbound channel");
                        }
                        tokio::task::yield_now().await;
                    }
                },
            }
        }
    }
}

/// How often the sweeper looks for results that waited too long: a sixteenth of the timeout, at
/// least a millisecond.
fn sweep_period(timeout: Duration) -> Duration {
    (timeout / 16).max(Duration::from_millis(1))
}

/// The sweeper: every `period`, fails the `call_return`s whose deadline falls before the next
/// look, so a call waits at most its timeout and at least that less `period` (15/16 of it).
/// One timer for the member instead of one registered and removed per call. Ends when the
/// member stops (`shutdown` fails what is still pending) or is dropped (its callers' answers
/// then end as [`CallError::Stopped`]); a runtime that shuts down cancels it with the callers.
async fn sweep(node: Weak<Node>, mut stopped: watch::Receiver<bool>, period: Duration) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            changed = stopped.changed() => {
                if changed.is_err() || *stopped.borrow() {
                    return;
                }
            }
        }
        let Some(node) = node.upgrade() else { return };
        node.expire_results(Instant::now() + period);
    }
}

/// The dispatcher: serves the frames from the intake in arrival order (the backlog first),
/// until the node is dropped or shut down.
async fn dispatch(node: Weak<Node>, mut intake: Intake) -> ferromq_core::Result<()> {
    loop {
        let (parts, answered) = match intake.backlog.pop_front() {
            Some(parts) => (parts, true),
            None => {
                // Whether the intake was empty: the wait let the other tasks run.
                let mut waited = false;
                let next = {
                    let next = intake.next();
                    tokio::pin!(next);
                    std::future::poll_fn(|cx| {
                        let polled = next.as_mut().poll(cx);
                        waited |= polled.is_pending();
                        polled
                    })
                    .await
                };
                if waited {
                    intake.turned(std::time::Instant::now());
                }
                match next {
                    Some(parts) => (parts, false),
                    None => break,
                }
            }
        };
        let Some(node) = node.upgrade() else { break };
        let flow = node.handle_frame(parts, answered, &mut intake).await;
        node.release_answers();
        if flow.is_break() {
            break;
        }
        drop(node);
        if std::mem::take(&mut intake.delivered) && intake.backlog.is_empty() {
            // The caller that waited for the frame's result runs before the intake is looked at
            // again: the look (a select over the channel, the loopback and the stop, and the
            // channel's receive) lay on the way from the result to the caller, ~0.3 us of a
            // busy-polled round trip. Only for the last call waited for: with many in flight
            // a turn after every frame cut the returns per second by a third.
            ferromq_core::yield_once().await;
        }
    }
    intake.inbound.close().await
}

#[cfg(test)]
mod tests {
    use super::tree_children;

    #[test]
    fn a_binary_tree_over_15_reaches_each_member_once() {
        for root in [0, 6, 14] {
            let mut reached = vec![0; 15];
            reached[root] += 1;
            let mut level = vec![root];
            while !level.is_empty() {
                let mut next = Vec::new();
                for member in level {
                    for child in tree_children(member, root, 15, 2) {
                        reached[child] += 1;
                        next.push(child);
                    }
                }
                level = next;
            }
            assert_eq!(reached, vec![1; 15], "root {root}");
        }
    }

    #[test]
    fn every_child_names_its_parent() {
        for (n, arity, root) in [(15, 2, 0), (15, 2, 6), (9, 8, 3), (7, 3, 6)] {
            assert_eq!(super::tree_parent(root, root, n, arity), root);
            for member in 0..n {
                for child in tree_children(member, root, n, arity) {
                    assert_eq!(super::tree_parent(child, root, n, arity), member);
                }
            }
        }
    }

    #[test]
    fn a_tree_of_arity_8_over_9_is_one_level() {
        let children: Vec<_> = tree_children(3, 3, 9, 8).collect();
        assert_eq!(children, vec![4, 5, 6, 7, 8, 0, 1, 2]);
    }
}
