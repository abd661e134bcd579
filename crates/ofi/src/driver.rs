//! The driver task behind an [`OfiSocket`](crate::socket::OfiSocket): one per channel end.
//!
//! The driver owns the zmq side channel (a ROUTER on the binder, a DEALER on the connector) and
//! the peer's state, and speaks the protocol in `protocol.rs`: it announces accepted messages,
//! grants the peer's announcements when receive buffers are posted, and hands finished receives
//! to the socket in order; the engine thread moves the bytes. It notices a dead peer by its
//! silence (`ofi-peer-timeout-ms`) or a broken side channel, reports it through [`Shared`], and
//! takes the next peer. On close it drains what was accepted, bounded by `linger` of silence,
//! says goodbye and stops its listener before the socket's `close` returns; dropped, the socket
//! aborts it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferromq_core::{ChannelConfig, ChannelLabel, Error, Message, Parts, SocketType, Transport};
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _, ZmqMessage};

use crate::OfiOptions;
use crate::engine::{Command, Done, EngineHandle, Finished, JobKey, Memory};
use crate::protocol::{Control, PROTOCOL_VERSION, tag_base};

/// Messages posted for receiving at most at once. With many thousands posted the provider's
/// matching dominates the receiver's CPU (rxm over tcp, 64 B messages: 110 k msg/s with 10 000
/// posted, 16 k: 120 k, 256: 250 k, 1024: 270-290 k, 4096: 140 k); `rcvBufSize` still bounds the
/// messages queued for the application.
const MAX_POSTED: usize = 1024;

/// Why a channel's peer could not be used, kept until a send or receive reports it.
#[derive(Debug, Clone)]
pub(crate) enum Problem {
    Gone(String),
    Refused(String),
    Mismatch,
}

impl Problem {
    pub(crate) fn into_error(self, label: &ChannelLabel) -> Error {
        match self {
            Problem::Gone(reason) => Error::PeerGone {
                channel: label.clone(),
                reason,
            },
            Problem::Refused(reason) => Error::Connect {
                channel: label.clone(),
                source: reason.into(),
            },
            Problem::Mismatch => Error::TransportMismatch {
                channel: label.clone(),
                peer_transport: "zeromq or shmem",
            },
        }
    }
}

/// State shared by the socket and its driver.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) send_problem: Mutex<Option<Problem>>,
    pub(crate) receive_problem: Mutex<Option<Problem>>,
    pub(crate) receive_wakeup: Notify,
    pub(crate) send_wakeup: Notify,
}

impl Shared {
    fn report(&self, problem: &Problem, sends: bool, receives: bool) {
        if sends {
            *self.send_problem.lock().expect("problem lock") = Some(problem.clone());
            self.send_wakeup.notify_one();
        }
        if receives {
            *self.receive_problem.lock().expect("problem lock") = Some(problem.clone());
            self.receive_wakeup.notify_one();
        }
    }
}

/// A message accepted by `send`, holding its credit until its bytes left.
pub(crate) struct Outgoing {
    pub(crate) parts: Vec<Message>,
    pub(crate) _credit: OwnedSemaphorePermit,
}

pub(crate) enum DriverCommand {
    Send(Outgoing),
    Close {
        linger: Duration,
        done: oneshot::Sender<usize>,
    },
}

/// The socket's handle on its driver.
pub(crate) struct Link {
    pub(crate) commands: mpsc::UnboundedSender<DriverCommand>,
    pub(crate) task: JoinHandle<()>,
}

/// The zmq end of the side channel.
pub(crate) enum Side {
    Binder(zeromq::RouterSocket),
    Connector {
        endpoint: String,
        dealer: Option<zeromq::DealerSocket>,
        retry_at: Instant,
    },
}

struct Peer {
    /// The ROUTER identity (binder only).
    identity: Option<Bytes>,
    fi_addr: u64,
    last_heard: Instant,
    address_text: String,
    /// It said goodbye; it goes once its last messages arrived.
    leaving: bool,
}

/// A receive whose buffers were allocated off the driver (shared memory was momentarily full).
struct Allocated {
    epoch: u64,
    seq: u64,
    /// The receive buffers, or why they could not be had.
    parts: Result<Vec<Message>, String>,
}

/// A message whose parts are being sent; its credit returns when the last part is out.
struct Sending {
    remaining: usize,
    _credit: OwnedSemaphorePermit,
}

/// A message whose parts are being received.
struct Receiving {
    permit: mpsc::OwnedPermit<Parts>,
    bytes: u64,
    parts: Vec<Message>,
    remaining: usize,
}

struct Driver {
    label: ChannelLabel,
    socket_type: SocketType,
    options: Arc<OfiOptions>,
    shared: Arc<Shared>,
    engine: EngineHandle,
    side: Side,
    peer: Option<Peer>,
    /// Bumped whenever a peer goes: events of older epochs are stale.
    epoch: u64,
    commands: mpsc::UnboundedReceiver<DriverCommand>,
    allocated: mpsc::UnboundedSender<Allocated>,
    allocated_receiver: mpsc::UnboundedReceiver<Allocated>,
    finished: mpsc::UnboundedSender<Finished>,
    finished_receiver: mpsc::UnboundedReceiver<Finished>,
    // Sending.
    next_seq: u64,
    unannounced: VecDeque<Outgoing>,
    awaiting_grant: BTreeMap<u64, Outgoing>,
    sending: HashMap<u64, Sending>,
    // Receiving.
    announced: VecDeque<(u64, Vec<u64>)>,
    receiving: HashMap<u64, Receiving>,
    receiving_bytes: u64,
    ready: BTreeMap<u64, (mpsc::OwnedPermit<Parts>, Vec<Message>)>,
    next_delivery: u64,
    deliver: mpsc::Sender<Parts>,
    closing: Option<Closing>,
}

/// Starts the driver of the channel end `label` configured by `config`, over `engine` and the
/// side channel `side`: the handle to command it, and the queue of messages it receives.
pub(crate) fn spawn(
    label: ChannelLabel,
    config: &ChannelConfig,
    options: Arc<OfiOptions>,
    shared: Arc<Shared>,
    engine: EngineHandle,
    side: Side,
) -> (Link, mpsc::Receiver<Parts>) {
    let (commands, command_receiver) = mpsc::unbounded_channel();
    let (deliver, received) = mpsc::channel(config.rcv_buf_size.max(1));
    let (allocated, allocated_receiver) = mpsc::unbounded_channel();
    let (finished, finished_receiver) = mpsc::unbounded_channel();
    let driver = Driver {
        label,
        socket_type: config.socket_type,
        options,
        shared,
        engine,
        side,
        peer: None,
        epoch: 0,
        commands: command_receiver,
        allocated,
        allocated_receiver,
        finished,
        finished_receiver,
        next_seq: 0,
        unannounced: VecDeque::new(),
        awaiting_grant: BTreeMap::new(),
        sending: HashMap::new(),
        announced: VecDeque::new(),
        receiving: HashMap::new(),
        receiving_bytes: 0,
        ready: BTreeMap::new(),
        next_delivery: 0,
        deliver,
        closing: None,
    };
    let task = tokio::spawn(driver.run());
    (Link { commands, task }, received)
}

/// How long one attempt to reach the binder's side channel may take; the next tick tries again.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(200);

/// A close in progress: `linger` bounds the silence, not the whole drain. Progress is a message
/// fewer outstanding, and also the steps that come before the first message can leave: the
/// peer accepting the connection and granting announced messages. A sender that accepted a
/// burst before its side channel was up (its thread busy building messages) connects only when
/// it closes; counting only finished messages gave that connection and the first 64 MiB
/// transfer together one `linger` (about one run in six failed with 500 ms). Bytes leaving
/// count too, a chunk at a time: the peer grants several large messages at once, their chunks
/// leave interleaved, and the first of four 64 MiB messages completed only once nearly all
/// 256 MiB had moved, more than 500 ms on a loaded 2-core machine (the CI failure of
/// 2026-12-01).
struct Closing {
    linger: Duration,
    /// When to give up if nothing more leaves by then.
    deadline: Instant,
    /// The fewest messages outstanding seen so far; fewer now is progress.
    n_outstanding: usize,
    /// The engine's bytes sent when last looked at; more now is progress (what it receives
    /// is not: a pair's peer that keeps sending does not take what this end accepted).
    bytes_sent: u64,
    /// The engine's bytes received when last looked at: progress while messages granted to
    /// the peer are still arriving (a closing receiver waits for them).
    bytes_received: u64,
    done: oneshot::Sender<usize>,
}

impl Closing {
    /// The peer did something towards delivery: the silence starts again.
    fn progressed(&mut self) {
        self.deadline = Instant::now() + self.linger;
    }

    /// At the deadline: true (and the silence starts again) if bytes left since the last look,
    /// or arrived while granted messages are awaited (`received`, `None` when none are), false
    /// if `linger` passed in silence.
    fn bytes_moved_since(&mut self, sent: u64, received: Option<u64>) -> bool {
        let received_more = received.is_some_and(|received| received != self.bytes_received);
        if sent == self.bytes_sent && !received_more {
            return false;
        }
        self.bytes_sent = sent;
        if let Some(received) = received {
            self.bytes_received = received;
        }
        self.progressed();
        true
    }
}

impl Driver {
    async fn run(mut self) {
        let tick_every = (self.options.peer_timeout / 8).max(Duration::from_millis(20));
        let mut tick = tokio::time::interval(tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.finish_closing().await {
                break;
            }
            // A closing receiver grants nothing more: what the peer announced and was not
            // granted stays the peer's to deliver or report.
            let may_post =
                self.closing.is_none() && !self.announced.is_empty() && self.room_to_post();
            let n_outstanding = self.n_outstanding();
            if let Some(closing) = &mut self.closing
                && n_outstanding < closing.n_outstanding
            {
                closing.n_outstanding = n_outstanding;
                closing.progressed();
            }
            let closing_deadline = self.closing.as_ref().map(|closing| closing.deadline);
            let connect_due = self.connect_due();
            tokio::select! {
                frame = receive_frame(&mut self.side) => self.on_frame(frame).await,
                command = self.commands.recv(), if self.closing.is_none() => {
                    let Some(command) = command else {
                        break;
                    };
                    // Take the whole burst, then announce it in one frame.
                    let mut next = Some(command);
                    while let Some(command) = next.take() {
                        match command {
                            DriverCommand::Send(outgoing) => self.unannounced.push_back(outgoing),
                            DriverCommand::Close { linger, done } => {
                                self.closing = Some(Closing {
                                    linger,
                                    deadline: Instant::now() + linger,
                                    n_outstanding: usize::MAX,
                                    bytes_sent: self.engine.bytes_sent(),
                                    bytes_received: self.engine.bytes_received(),
                                    done,
                                });
                                break;
                            }
                        }
                        next = self.commands.try_recv().ok();
                    }
                    self.announce_queued().await;
                }
                Some(finished) = self.finished_receiver.recv() => {
                    // Every completion that is there.
                    let mut next = Some(finished);
                    while let Some(finished) = next.take() {
                        self.on_finished(finished);
                        next = self.finished_receiver.try_recv().ok();
                    }
                }
                Some(allocated) = self.allocated_receiver.recv() => {
                    let mut grants = Vec::new();
                    let mut next = Some(allocated);
                    while let Some(Allocated { epoch, seq, parts }) = next.take() {
                        if epoch == self.epoch && self.post_allocated(seq, parts) {
                            grants.push(seq);
                        }
                        next = self.allocated_receiver.try_recv().ok();
                    }
                    self.grant(grants).await;
                }
                permit = self.deliver.clone().reserve_owned(), if may_post => {
                    if let Ok(permit) = permit {
                        let mut grants = Vec::new();
                        self.start_receive(permit, &mut grants);
                        // More announced messages with room for them: post them too.
                        while !self.announced.is_empty() && self.room_to_post() {
                            let Ok(permit) = self.deliver.clone().try_reserve_owned() else {
                                break;
                            };
                            self.start_receive(permit, &mut grants);
                        }
                        self.grant(grants).await;
                    }
                }
                _ = tick.tick() => self.on_tick().await,
                () = sleep_until_opt(connect_due) => self.try_connect().await,
                () = sleep_until_opt(closing_deadline) => {
                    let bytes_sent = self.engine.bytes_sent();
                    let bytes_received =
                        (!self.receiving.is_empty()).then(|| self.engine.bytes_received());
                    if let Some(closing) = &mut self.closing
                        && closing.bytes_moved_since(bytes_sent, bytes_received)
                    {
                        continue;
                    }
                    self.give_up_awaited_receives();
                    let lost = self.n_outstanding();
                    if let Some(closing) = self.closing.take() {
                        let _ = closing.done.send(lost);
                    }
                    break;
                }
            }
        }
        if let Some(peer) = self.peer.take() {
            self.engine
                .submit(Command::ForgetPeer { peer: peer.fi_addr });
        }
        // zmq.rs stops a listener some time after its socket drops: stopped here, so that the
        // address is free when `close` returns.
        if let Side::Binder(router) = &mut self.side {
            let _ = router.unbind_all().await;
        }
        // Stopping the engine waits for its thread: off the async workers.
        let engine = self.engine;
        let _ = tokio::task::spawn_blocking(move || drop(engine)).await;
    }

    /// A close that waited `linger` in silence for messages granted to the peer: those that
    /// arrived whole behind one that did not go to the queue `OfiSocket::close` counts (order
    /// no longer matters); those still arriving are said, since the peer may count them
    /// delivered.
    fn give_up_awaited_receives(&mut self) {
        for (_, (permit, parts)) in std::mem::take(&mut self.ready) {
            permit.send(Parts::from(parts));
        }
        if !self.receiving.is_empty() {
            tracing::warn!(
                channel = %self.label,
                n_messages = self.receiving.len(),
                "closing: messages granted to the peer had not arrived whole after linger; they are dropped uncounted here"
            );
        }
    }

    /// Messages accepted by `send` that have not fully left yet.
    fn n_outstanding(&self) -> usize {
        self.unannounced.len() + self.awaiting_grant.len() + self.sending.len()
    }

    /// When closing, every accepted message left and every message granted to the peer
    /// arrived (it left the peer, which counts it delivered: it is this side's to take or to
    /// report, `OfiSocket::close`): says goodbye, reports, and ends the loop.
    async fn finish_closing(&mut self) -> bool {
        let drained = self.n_outstanding() == 0 && self.receiving.is_empty();
        if self.closing.is_none() || !drained {
            return false;
        }
        if self.peer.is_some() {
            // The peer may already be gone (a launcher stops devices in data-flow order): a
            // goodbye nobody takes must not hold the close (the side channel's send waits for a
            // peer to reconnect).
            let _ = tokio::time::timeout(Duration::from_secs(1), self.send_control(&Control::Bye))
                .await;
            // Wait (briefly) for the answer, so that the goodbye left before the socket goes.
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                loop {
                    match receive_frame(&mut self.side).await {
                        Some((_, payload))
                            if Control::decode(&payload) == Some(Control::Farewell) =>
                        {
                            break;
                        }
                        Some(_) => {}
                        None => break,
                    }
                }
            })
            .await;
        }
        if let Some(closing) = self.closing.take() {
            let _ = closing.done.send(0);
        }
        true
    }

    async fn send_control(&mut self, control: &Control) {
        let payload = Bytes::from(control.encode());
        let failed = match (&mut self.side, &self.peer) {
            (Side::Binder(router), Some(peer)) => {
                let identity = peer.identity.clone().unwrap_or_default();
                let message = ZmqMessage::try_from(vec![identity, payload])
                    .expect("two frames make a message");
                router.send(message).await.is_err()
            }
            (
                Side::Connector {
                    dealer: Some(dealer),
                    ..
                },
                _,
            ) => dealer.send(ZmqMessage::from(payload)).await.is_err(),
            _ => false,
        };
        if failed {
            self.side_channel_broke();
        }
    }

    async fn reply_to(&mut self, identity: Option<Bytes>, control: &Control) {
        let payload = Bytes::from(control.encode());
        match (&mut self.side, identity) {
            (Side::Binder(router), Some(identity)) => {
                let message = ZmqMessage::try_from(vec![identity, payload])
                    .expect("two frames make a message");
                let _ = router.send(message).await;
            }
            (
                Side::Connector {
                    dealer: Some(dealer),
                    ..
                },
                _,
            ) => {
                let _ = dealer.send(ZmqMessage::from(payload)).await;
            }
            _ => {}
        }
    }

    fn my_type(&self) -> &'static str {
        self.socket_type.as_str()
    }

    async fn on_frame(&mut self, frame: Option<(Option<Bytes>, Bytes)>) {
        let Some((identity, payload)) = frame else {
            // The connector's dealer broke.
            if let Side::Connector {
                dealer, retry_at, ..
            } = &mut self.side
            {
                *dealer = None;
                *retry_at = Instant::now() + Duration::from_millis(100);
            }
            self.side_channel_broke();
            return;
        };
        let Some(control) = Control::decode(&payload) else {
            tracing::warn!(channel = %self.label, "a peer that is not an ofi channel spoke on the side channel");
            self.shared.report(&Problem::Mismatch, true, true);
            return;
        };
        let from_peer = match (&self.peer, &identity) {
            (Some(peer), Some(identity)) => peer.identity.as_ref() == Some(identity),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if from_peer && let Some(peer) = &mut self.peer {
            peer.last_heard = Instant::now();
        }
        tracing::trace!(channel = %self.label, ?control, from_peer, "ofi control");
        match control {
            Control::Hello {
                version,
                socket_type,
                provider,
                address,
            } => {
                self.on_hello(identity, version, &socket_type, &provider, &address)
                    .await;
            }
            Control::Welcome { address } if self.peer.is_none() => {
                let accepted = self.accept_peer(None, &address).await;
                if accepted {
                    if let Some(closing) = &mut self.closing {
                        closing.progressed();
                    }
                    self.announce_queued().await;
                }
            }
            Control::Refused { reason } => {
                tracing::error!(channel = %self.label, %reason, "ofi peer refused the connection");
                self.shared.report(&Problem::Refused(reason), true, true);
                if let Side::Connector {
                    dealer, retry_at, ..
                } = &mut self.side
                {
                    *dealer = None;
                    *retry_at = Instant::now() + Duration::from_secs(1);
                }
            }
            Control::Announce {
                first_seq,
                messages,
            } if from_peer => {
                if self.socket_type == SocketType::Push {
                    return;
                }
                let max = self.options.max_message_size;
                for (seq, sizes) in (first_seq..).zip(messages) {
                    // Sizes come from the wire: bound them before anything is allocated.
                    let total = sizes
                        .iter()
                        .try_fold(0u64, |total, &size| total.checked_add(size));
                    if total.is_none_or(|total| total > max) {
                        let reason = format!(
                            "the peer announced a message of {} bytes in {} part(s), more than \
                             ofi-max-message-size = {max}",
                            total.map_or_else(|| "over 2^64".to_owned(), |total| total.to_string()),
                            sizes.len()
                        );
                        tracing::error!(channel = %self.label, %reason, "refused an ofi peer");
                        self.reply_to(
                            identity,
                            &Control::Refused {
                                reason: reason.clone(),
                            },
                        )
                        .await;
                        self.peer_lost(reason, false);
                        return;
                    }
                    self.announced.push_back((seq, sizes));
                }
            }
            Control::Grant { seqs } if from_peer => {
                if let Some(closing) = &mut self.closing {
                    closing.progressed();
                }
                for seq in seqs {
                    if let Some(outgoing) = self.awaiting_grant.remove(&seq) {
                        self.start_send(seq, outgoing);
                    }
                }
            }
            Control::Bye if from_peer => {
                self.reply_to(identity, &Control::Farewell).await;
                // Its last messages may still be completing here: finish them first.
                if let Some(peer) = &mut self.peer {
                    peer.leaving = true;
                }
                self.forget_peer_if_left();
            }
            _ => {}
        }
    }

    async fn on_hello(
        &mut self,
        identity: Option<Bytes>,
        version: u16,
        socket_type: &str,
        provider: &str,
        address: &[u8],
    ) {
        let refusal = if version != PROTOCOL_VERSION {
            Some(format!(
                "ofi protocol version {version} cannot talk to version {PROTOCOL_VERSION}"
            ))
        } else if !socket_type
            .parse::<SocketType>()
            .is_ok_and(|theirs| self.socket_type.is_compatible_with(theirs))
        {
            Some(format!(
                "channel '{}' is a {} and cannot talk to a {socket_type}",
                self.label.name,
                self.my_type()
            ))
        } else if provider != self.engine.provider() {
            Some(format!(
                "channel '{}' uses libfabric provider {:?}, the peer {provider:?}",
                self.label.name,
                self.engine.provider()
            ))
        } else if self
            .peer
            .as_ref()
            .is_some_and(|peer| peer.identity != identity)
        {
            Some(format!(
                "channel '{}' already has a peer (ofi channels are one-to-one)",
                self.label.name
            ))
        } else {
            None
        };
        if let Some(reason) = refusal {
            tracing::error!(channel = %self.label, %reason, "refused an ofi peer");
            if self.peer.is_none() {
                self.shared
                    .report(&Problem::Refused(reason.clone()), true, true);
            }
            self.reply_to(identity, &Control::Refused { reason }).await;
            return;
        }
        if self.peer.is_some() {
            // The same peer said hello again: it restarted its side.
            self.peer_lost("the peer reconnected".to_owned(), true);
        }
        if self.accept_peer(identity.clone(), address).await {
            let welcome = Control::Welcome {
                address: self.engine.address.to_vec(),
            };
            self.reply_to(identity, &welcome).await;
            self.announce_queued().await;
        }
    }

    /// Puts the peer's endpoint in the address vector and starts a new epoch with it.
    async fn accept_peer(&mut self, identity: Option<Bytes>, address: &[u8]) -> bool {
        match self.engine.insert_peer(address) {
            Ok(fi_addr) => {
                let address_text = self.engine.address_text(address);
                tracing::debug!(channel = %self.label, peer = %address_text, "ofi peer connected");
                self.peer = Some(Peer {
                    identity,
                    fi_addr,
                    last_heard: Instant::now(),
                    address_text,
                    leaving: false,
                });
                self.next_seq = 0;
                self.next_delivery = 0;
                true
            }
            Err(error) => {
                let reason = format!("cannot add the peer's endpoint: {error}");
                self.shared
                    .report(&Problem::Refused(reason.clone()), true, true);
                self.reply_to(identity, &Control::Refused { reason }).await;
                false
            }
        }
    }

    /// Announces every queued message to the peer, if there is one.
    async fn announce_queued(&mut self) {
        /// Messages per announce frame at most.
        const BURST: usize = 256;
        while self.peer.is_some() && !self.unannounced.is_empty() {
            let first_seq = self.next_seq;
            let mut messages = Vec::new();
            while messages.len() < BURST {
                let Some(outgoing) = self.unannounced.pop_front() else {
                    break;
                };
                messages.push(
                    outgoing
                        .parts
                        .iter()
                        .map(|part| part.len() as u64)
                        .collect(),
                );
                self.awaiting_grant.insert(self.next_seq, outgoing);
                self.next_seq += 1;
            }
            self.send_control(&Control::Announce {
                first_seq,
                messages,
            })
            .await;
        }
    }

    fn start_send(&mut self, seq: u64, outgoing: Outgoing) {
        let Some(peer) = &self.peer else {
            return;
        };
        let peer = peer.fi_addr;
        let Outgoing { parts, _credit } = outgoing;
        let mut remaining = 0;
        for (part, message) in parts.into_iter().enumerate() {
            if message.is_empty() {
                continue;
            }
            remaining += 1;
            self.engine.submit(Command::Send {
                peer,
                tag_base: tag_base(seq, part),
                memory: Memory::of(&message),
                message,
                done: self.done(seq, part, true),
            });
        }
        if remaining > 0 {
            self.sending.insert(seq, Sending { remaining, _credit });
        }
    }

    /// Whether another announced message may be posted: below the byte window (one message
    /// always may) and below [`MAX_POSTED`] messages.
    fn room_to_post(&self) -> bool {
        self.receiving.is_empty()
            || (self.receiving.len() < MAX_POSTED
                && self.receiving_bytes < self.options.receive_window as u64)
    }

    fn done(&self, seq: u64, part: usize, is_send: bool) -> Done {
        Done {
            to: self.finished.clone(),
            key: JobKey {
                epoch: self.epoch,
                seq,
                part,
                is_send,
            },
        }
    }

    /// Allocates the next announced message and posts its receives (or, when shared memory
    /// makes the allocation wait, lets a task allocate and come back); granted seqs join
    /// `grants`.
    fn start_receive(&mut self, permit: mpsc::OwnedPermit<Parts>, grants: &mut Vec<u64>) {
        let (Some((seq, sizes)), Some(_)) = (self.announced.pop_front(), &self.peer) else {
            return;
        };
        let bytes: u64 = sizes.iter().sum();
        self.receiving.insert(
            seq,
            Receiving {
                permit,
                bytes,
                parts: Vec::new(),
                remaining: 0,
            },
        );
        self.receiving_bytes += bytes;
        let memory = self.options.receive_memory.clone();
        let label = self.label.clone();
        let allocation = async move {
            let mut parts = Vec::with_capacity(sizes.len());
            for &size in &sizes {
                parts.push(allocate(memory.as_deref(), size, &label).await?);
            }
            Ok(parts)
        };
        // Try once right here (heap, or a shm segment with room: ready at once); only an
        // allocation that has to wait goes to a task of its own.
        let mut allocation = Box::pin(allocation);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match allocation.as_mut().poll(&mut context) {
            std::task::Poll::Ready(parts) => {
                if self.post_allocated(seq, parts) {
                    grants.push(seq);
                }
            }
            std::task::Poll::Pending => {
                let allocated = self.allocated.clone();
                let epoch = self.epoch;
                tokio::spawn(async move {
                    let parts = allocation.await;
                    let _ = allocated.send(Allocated { epoch, seq, parts });
                });
            }
        }
    }

    /// Posts the receives of message `seq` into its buffers; false when it is no longer
    /// expected or they could not be allocated (then the peer is dropped: what it announced
    /// cannot be received here).
    fn post_allocated(&mut self, seq: u64, parts: Result<Vec<Message>, String>) -> bool {
        match parts {
            Ok(parts) => self.post_receive(seq, parts),
            Err(reason) => {
                self.peer_lost(reason, false);
                false
            }
        }
    }

    /// Posts the receives of message `seq` into `parts`; false when it is no longer expected.
    fn post_receive(&mut self, seq: u64, parts: Vec<Message>) -> bool {
        let Some(peer) = &self.peer else {
            return false;
        };
        let peer = peer.fi_addr;
        if !self.receiving.contains_key(&seq) {
            return false;
        }
        let mut slots = Vec::with_capacity(parts.len());
        let mut remaining = 0;
        for (part, message) in parts.into_iter().enumerate() {
            if message.is_empty() {
                slots.push(message);
                continue;
            }
            remaining += 1;
            slots.push(Message::empty());
            self.engine.submit(Command::Receive {
                peer,
                tag_base: tag_base(seq, part),
                memory: Memory::of(&message),
                message,
                done: self.done(seq, part, false),
            });
        }
        if let Some(receiving) = self.receiving.get_mut(&seq) {
            receiving.parts = slots;
            receiving.remaining = remaining;
        }
        if remaining == 0 {
            self.received(seq);
        }
        true
    }

    /// Answers the announcements in `grants` in one frame.
    async fn grant(&mut self, grants: Vec<u64>) {
        if !grants.is_empty() {
            self.send_control(&Control::Grant { seqs: grants }).await;
        }
    }

    /// One part of a message went out or came in.
    fn on_finished(&mut self, finished: Finished) {
        let Finished { key, result } = finished;
        if key.epoch != self.epoch {
            return;
        }
        let message = match result {
            Ok(message) => message,
            Err(error) => {
                let what = if key.is_send { "sending" } else { "receiving" };
                self.peer_lost(format!("{what} a message failed: {error}"), false);
                return;
            }
        };
        if key.is_send {
            if let Some(sending) = self.sending.get_mut(&key.seq) {
                sending.remaining -= 1;
                if sending.remaining == 0 {
                    self.sending.remove(&key.seq);
                }
            }
            return;
        }
        let Some(receiving) = self.receiving.get_mut(&key.seq) else {
            return;
        };
        if let Some(slot) = receiving.parts.get_mut(key.part) {
            *slot = message;
        }
        receiving.remaining -= 1;
        if receiving.remaining == 0 {
            self.received(key.seq);
        }
    }

    /// Message `seq` arrived whole: deliver it and everything before it, in order.
    fn received(&mut self, seq: u64) {
        let Some(receiving) = self.receiving.remove(&seq) else {
            return;
        };
        self.receiving_bytes -= receiving.bytes;
        self.ready.insert(seq, (receiving.permit, receiving.parts));
        while let Some((permit, parts)) = self.ready.remove(&self.next_delivery) {
            permit.send(Parts::from(parts));
            self.next_delivery += 1;
        }
        self.forget_peer_if_left();
    }

    async fn on_tick(&mut self) {
        if let Some(peer) = &self.peer {
            if peer.last_heard.elapsed() > self.options.peer_timeout {
                let reason = format!(
                    "no sign of life from {} for {} ms",
                    peer.address_text,
                    self.options.peer_timeout.as_millis()
                );
                self.peer_lost(reason, false);
            } else if !peer.leaving {
                self.send_control(&Control::Heartbeat).await;
            }
        }
    }

    /// When the connector should try (again) to reach the binder's side channel; `None` while
    /// connected, and for a binder.
    fn connect_due(&self) -> Option<Instant> {
        match &self.side {
            Side::Connector {
                dealer: None,
                retry_at,
                ..
            } => Some(*retry_at),
            _ => None,
        }
    }

    /// One attempt to reach the binder's side channel, saying hello when it answers. Its own
    /// wake-up, not the heartbeat tick's (5 s / 8): an attempt that timed out while a sender
    /// kept the thread busy is retried 100 ms later, so a close that starts then still
    /// connects well within `linger`.
    async fn try_connect(&mut self) {
        let Side::Connector {
            endpoint,
            dealer,
            retry_at,
        } = &mut self.side
        else {
            return;
        };
        if dealer.is_some() {
            return;
        }
        let mut fresh = zeromq::DealerSocket::new();
        // zmq.rs retries a refused connect until it succeeds: bounded, so that a binder
        // that never comes cannot hold the driver (and with it `close`) in this attempt.
        match tokio::time::timeout(CONNECT_ATTEMPT, fresh.connect(endpoint)).await {
            Err(_) => {
                tracing::trace!(endpoint = %endpoint, "ofi side channel not reachable yet");
            }
            Ok(Ok(())) => {
                let hello = Control::Hello {
                    version: PROTOCOL_VERSION,
                    socket_type: self.socket_type.as_str().to_owned(),
                    provider: self.engine.provider().to_owned(),
                    address: self.engine.address.to_vec(),
                };
                if fresh
                    .send(ZmqMessage::from(Bytes::from(hello.encode())))
                    .await
                    .is_ok()
                {
                    *dealer = Some(fresh);
                }
            }
            Ok(Err(error)) => {
                tracing::trace!(%error, "ofi side channel not reachable yet");
            }
        }
        *retry_at = Instant::now() + Duration::from_millis(100);
    }

    /// The zmq connection to the peer is gone: it died, unless it said goodbye (then its last
    /// messages may still be completing over libfabric).
    fn side_channel_broke(&mut self) {
        match &self.peer {
            Some(peer) if peer.leaving => self.forget_peer_if_left(),
            Some(_) => self.peer_lost("the side channel to the peer broke".to_owned(), false),
            None => {}
        }
    }

    /// A peer that said goodbye goes once nothing of it is still arriving.
    fn forget_peer_if_left(&mut self) {
        if self.peer.as_ref().is_some_and(|peer| peer.leaving) && self.receiving.is_empty() {
            self.peer_lost("the peer closed".to_owned(), true);
        }
    }

    /// The peer left (`orderly`: it said so) or died: forget it, requeue what it never
    /// granted, and report what was lost.
    fn peer_lost(&mut self, reason: String, orderly: bool) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        self.engine
            .submit(Command::ForgetPeer { peer: peer.fi_addr });
        self.epoch += 1;
        let in_transfer = self.sending.len() + self.receiving.len();
        self.sending.clear();
        // Never granted: nothing left this process; they go to the next peer.
        let never_granted = std::mem::take(&mut self.awaiting_grant);
        for (_, outgoing) in never_granted.into_iter().rev() {
            self.unannounced.push_front(outgoing);
        }
        self.announced.clear();
        self.receiving.clear();
        self.receiving_bytes = 0;
        self.ready.clear();
        if let Side::Connector {
            dealer, retry_at, ..
        } = &mut self.side
        {
            *dealer = None;
            *retry_at = Instant::now() + Duration::from_millis(100);
        }
        if orderly && in_transfer == 0 {
            tracing::debug!(channel = %self.label, %reason, "ofi peer left");
            return;
        }
        if orderly {
            // The peer chose to close with messages of ours in transfer (a receiver stopped
            // first): like a zeromq receiver that closes, that is its decision, not an error of
            // this channel; the channel waits for the next peer.
            tracing::warn!(
                channel = %self.label,
                %reason,
                in_transfer,
                "ofi peer closed with messages in transfer; they are lost"
            );
            return;
        }
        let reason = if in_transfer > 0 {
            format!("{reason}; {in_transfer} message(s) in transfer were lost")
        } else {
            reason
        };
        tracing::error!(channel = %self.label, %reason, "ofi peer gone");
        let problem = Problem::Gone(reason);
        let sends = self.socket_type != SocketType::Pull;
        let receives = self.socket_type != SocketType::Push;
        self.shared.report(&problem, sends, receives);
    }
}

pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The next side-channel frame: `(identity, payload)`; `None` when the connector's dealer
/// broke. Pending forever while there is nothing to read from.
async fn receive_frame(side: &mut Side) -> Option<(Option<Bytes>, Bytes)> {
    match side {
        Side::Binder(router) => loop {
            let Ok(message) = router.recv().await else {
                continue;
            };
            let mut frames = message.into_vec().into_iter();
            let (Some(identity), Some(payload)) = (frames.next(), frames.next()) else {
                continue;
            };
            return Some((Some(identity), payload));
        },
        Side::Connector {
            dealer: Some(dealer),
            ..
        } => match dealer.recv().await {
            Ok(message) => Some((None, message.into_vec().pop().unwrap_or_default())),
            Err(_) => None,
        },
        Side::Connector { dealer: None, .. } => std::future::pending().await,
    }
}

/// A receive buffer: from the receive memory (the device's shm segment) when there is one,
/// else, or when it is full, from the heap; an error naming the size when neither has room.
async fn allocate(
    memory: Option<&dyn Transport>,
    size: u64,
    label: &ChannelLabel,
) -> Result<Message, String> {
    if size == 0 {
        return Ok(Message::empty());
    }
    let too_large = || format!("cannot allocate {size} bytes announced by the peer");
    let size = usize::try_from(size).map_err(|_| too_large())?;
    if let Some(memory) = memory {
        match memory.new_message(size).await {
            Ok(message) => return Ok(message),
            Err(error) => {
                tracing::warn!(channel = %label, size, %error, "ofi: shared memory full, receiving into the heap (a shmem hop after this will copy)");
            }
        }
    }
    // Zeroed pages from the allocator (calloc: nothing is written up front, so a 64 MiB
    // receive does not stall the driver); the size is bounded by `ofi-max-message-size`.
    Ok(Message::new(size))
}
