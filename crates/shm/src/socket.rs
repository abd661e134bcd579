//! [`ShmSocket`]: a channel end of the shmem transport.
//!
//! Payloads stay in shared memory; their descriptors travel through a descriptor ring per
//! connection and direction (`ring.rs`) for every pattern over tcp and ipc, or as descriptor
//! frames (see `wire.rs`) over zeromq (inproc).
//! Push/pull, req/rep and pair use the zeromq transport's socket of the same pattern (ferromq's
//! own ZMTP, whose push, pair, req and rep hand each connection to this socket so that it gets a
//! ring; records then never touch the socket, which carries the rings' announcements and their
//! doorbells; a req's or rep's frames come behind their peer's identity, which says where a
//! reply goes). Pub/sub
//! uses a zmq.rs ROUTER (publisher) and DEALERs (subscriber) instead of PUB/SUB, because the
//! publisher must know exactly which subscribers get a block to count its references (zmq's PUB
//! drops silently, which would leak the references of dropped copies); the ROUTER also names
//! each subscriber's connection, which gets its ring and doorbells. Like ZeroMQ's PUB, the
//! publisher drops a message for a subscriber whose ring (or queue) is full, and releases that
//! reference.
//!
//! # Copies and allocation
//! A message of at most `inline_max` bytes travels inside its descriptor, wherever it lies (the
//! small messages the transport makes, `small.rs`, whose buffers go back to their spare list
//! once described; a heap message; a short one in a block, which its sender then releases),
//! except a region's range. A larger message already in this session's shared memory travels
//! as a descriptor: no copy. A larger heap message is copied into this process's segment
//! (counted in `ferromq_core::copied_bytes`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ferromq_core::{
    Address, ChannelConfig, ChannelLabel, Error, Message, Parts, Result, SendError, Socket,
    SocketType, SpinPolicy, WaitOutcome, record_copy,
};
use ferromq_zmq::ZmqSocket;
use ferromq_zmq::endpoint::{bind, connect_endpoint};
use futures::FutureExt;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _, ZmqMessage};

use crate::delivery::{SentCounter, TakenCounter};
use crate::managed::ShmBuffer;
use crate::names::ObjectKind;
use crate::ring::{
    EntryKind, MAX_INLINE_ENTRY, Pushed, RING_BLOCK, RingConsumer, RingProducer, Wake,
};
use crate::session::Session;
use crate::wire::{self, DeliveryRef, ObjectRef, PartRef, WireRange};

const SUBSCRIBE_TAG: &[u8] = b"FMQSUB";

struct SubscriberPeer {
    identity: Bytes,
    /// Topic prefixes; `None` until the subscriber said (then it gets everything and filters).
    topics: Option<Vec<Vec<u8>>>,
    /// The subscriber's descriptor ring (see `ring.rs`), announced when it connected; `None`
    /// when this process's segment had no room for one: its records then travel in frames.
    ring: Option<RingProducer>,
    /// To release what a subscriber that left did not take, when it is dropped.
    session: Arc<Session>,
}

impl Drop for SubscriberPeer {
    fn drop(&mut self) {
        let Some(ring) = &mut self.ring else {
            return;
        };
        // Its doorbell, if any, has no one to wake: the subscriber is gone or leaving. (Its
        // process is not known here: a ring it never adopted stays until the session ends.)
        let _ = self.session.finish_producing(ring, None);
    }
}

struct Publisher {
    /// The subscribers, shared with the session: an allocation that finds the segment full
    /// has the publisher let the rings of subscribers that left go ([`PublisherPeers`]).
    peers: Arc<PublisherPeers>,
    out: PublisherOut,
}

/// What a publisher sends with: its socket and what it reuses from send to send.
struct PublisherOut {
    router: zeromq::RouterSocket,
    /// Frames handed to zmq.rs and not yet written out: `close` waits for them (zmq.rs has no
    /// linger), so a publisher that exits right after sending loses nothing it handed over.
    in_flight: Arc<ferromq_zmq::InFlight>,
    /// A doorbell for a subscriber's ring: a descriptor frame with no record.
    doorbell: Bytes,
    /// The entry being written into the rings (reused: no allocation per message).
    entry: Vec<u8>,
    /// Sends since subscription messages were last looked for, or since the clock was.
    n_sends_since_subscriptions: u32,
    /// When subscription messages were last looked for; `None`: at the next send.
    subscriptions_looked_at: Option<std::time::Instant>,
}

/// A publisher's subscribers and the connection events not yet looked at, behind a lock that
/// the publisher takes once per message (to prepare and publish it, [`Publisher::send`]) and an
/// allocation that finds the segment full once ([`crate::session::RingHolder`]): a subscriber
/// killed with a backlog in its ring gives that memory back though its publisher never sends
/// again.
struct PublisherPeers {
    state: crate::lock::ShortLock<PeersState>,
}

struct PeersState {
    events: futures::channel::mpsc::Receiver<zeromq::SocketEvent>,
    subscribers: Vec<SubscriberPeer>,
    /// Subscribers that connected and have no ring yet: the publisher gives them one at its
    /// next send (announcing it takes the publisher's socket, which the session cannot reach).
    joined: Vec<Bytes>,
}

impl PeersState {
    /// Takes in the connection events that arrived: a subscriber that connected waits in
    /// `joined`, one that disconnected is forgotten with its ring. `try_recv` registers no
    /// waker: this runs at every send.
    fn take_events(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            match event {
                zeromq::SocketEvent::Accepted(_, peer)
                | zeromq::SocketEvent::Connected(_, peer) => {
                    self.joined.push(Bytes::from(peer));
                }
                zeromq::SocketEvent::Disconnected(peer) => {
                    let identity = Bytes::from(peer);
                    // Its consumer is gone: the ring is closed and nobody is woken.
                    self.joined.retain(|joined| *joined != identity);
                    self.subscribers.retain(|known| known.identity != identity);
                }
                _ => {}
            }
        }
    }
}

impl crate::session::RingHolder for PublisherPeers {
    fn drop_rings_of_gone_connections(&self) {
        let mut state = self.state.lock();
        state.take_events();
        // zmq.rs reports a disconnection only once the publisher's socket is read, which
        // only its own sends do: a subscriber whose process is gone goes now.
        state
            .subscribers
            .retain(|known| known.ring.as_ref().is_none_or(|ring| !ring.consumer_died()));
    }
}

/// A publisher looks at the clock every this many sends, and for subscription messages when
/// `SUBSCRIPTIONS_PAUSE` passed since the last look (or a subscriber joined).
const SUBSCRIPTIONS_EVERY: u32 = 64;
const SUBSCRIPTIONS_PAUSE: Duration = Duration::from_millis(5);

struct SubscriberSide {
    /// One DEALER per attach, so that each publisher hears this subscriber's topics.
    dealers: Vec<zeromq::DealerSocket>,
    topics: Vec<Vec<u8>>,
    next_dealer: usize,
}

enum Inner {
    Plain(ZmqSocket),
    Pair(PairSide),
    ReqRep(ReqRepSide),
    Batched(BatchedPush),
    Publisher(Publisher),
    Subscriber(SubscriberSide),
}

impl Inner {
    /// Messages this socket sent that no receiver will ever take: what the rings of its
    /// receivers that died or finished first held (see `SentCounter::known_lost`), after
    /// dropping the rings of connections that ended. 0 for sockets that count no deliveries.
    fn lost_in_gone_rings(&self) -> u64 {
        match self {
            Inner::Batched(push) => push.state.lost_in_gone_rings(),
            Inner::Pair(pair) => pair.ring.lost_in_gone_rings(),
            _ => 0,
        }
    }
}

/// A pair socket. Over tcp and ipc its carrier (ferromq's own ZMTP pair) reports its
/// connection, which gets a descriptor ring at the first send (see `ring.rs`): every record
/// then goes into the ring, the socket carrying the ring's announcement and doorbells (both
/// ways: the peer's ring comes in as this socket's frames). Over inproc, or when this process's
/// segment had no room for a ring at the first connection, records travel in frames.
struct PairSide {
    socket: ZmqSocket,
    /// How records travel: decided at the first bind or connect (frames when the socket does
    /// not report connections) and at the first connection (rings, unless no room).
    carriage: Carriage,
    /// The ring of the current connection, shared with the session ([`RingSlot`]).
    ring: Arc<RingSlot>,
    /// The doorbell of this socket's rings: a descriptor frame with no record.
    doorbell: Arc<[u8]>,
    /// The entry being written into the ring (reused: no allocation per message).
    entry: Vec<u8>,
    /// A connection [`RingSender::wait_for_peer`] saw come.
    next_link: Option<Arc<ferromq_zmq::PeerLink>>,
}

/// The ring of one connection of a socket that writes into it itself (a pair's current
/// connection, each of a req's or rep's), behind a lock that the socket takes once per send and
/// an allocation that finds the segment full once ([`crate::session::RingHolder`]): a peer
/// killed with a backlog in its ring (a pair's messages, the one request or reply of a req or
/// rep) gives that memory back though the socket never sends again (its next send would let the
/// ring go too: [`PairSide::connection`], [`ReqRepSide::refresh`]).
/// A ring leaves the lock before it is dropped: its drop releases what a dead consumer left
/// (see `ring.rs`), too long to hold up an allocation waiting for the lock.
struct RingSlot {
    slot: crate::lock::ShortLock<Option<ConnectionRing>>,
    /// Messages that the rings of ended connections held and their receivers will never take
    /// ([`ConnectionRing::finish_gone`]): outside a pair's window.
    n_lost_in_gone_rings: AtomicU64,
}

impl RingSlot {
    fn new() -> RingSlot {
        RingSlot {
            slot: crate::lock::ShortLock::new(None),
            n_lost_in_gone_rings: AtomicU64::new(0),
        }
    }

    /// Finishes the ring if its connection ended, counting what its receiver will never take.
    fn finish_if_gone(&self) {
        if let Some(connection) = self.take_if_gone() {
            self.n_lost_in_gone_rings
                .fetch_add(connection.finish_gone(), Ordering::Relaxed);
        }
    }

    /// Messages that the rings of this slot's ended connections held and their receivers will
    /// never take, after finishing the ring of a connection that ended.
    fn lost_in_gone_rings(&self) -> u64 {
        self.finish_if_gone();
        self.n_lost_in_gone_rings.load(Ordering::Relaxed)
    }

    /// The ring, out of the lock, if its connection ended (for the caller to drop).
    fn take_if_gone(&self) -> Option<ConnectionRing> {
        let mut ring = self.slot.lock();
        if ring
            .as_ref()
            .is_some_and(|connection| connection.link.is_gone())
        {
            ring.take()
        } else {
            None
        }
    }

    /// The ring, out of the lock (for the caller to drop).
    fn take(&self) -> Option<ConnectionRing> {
        self.slot.lock().take()
    }

    /// Puts in the ring of a new connection, where there is none: a pair lets the old one's go
    /// (by [`RingSlot::take_if_gone`]) before it looks for a new connection; a req's or rep's
    /// slot belongs to one connection, which gets one ring.
    fn set(&self, connection: ConnectionRing) {
        let previous = self.slot.lock().replace(connection);
        debug_assert!(previous.is_none(), "a connection's ring replaced another");
        drop(previous);
    }

    /// Writes `record` into the ring if there is one and its connection lives.
    fn write_if_live(
        &self,
        session: &Session,
        record: &[PartRef],
        entry: &mut Vec<u8>,
    ) -> Option<RingOffer> {
        let mut ring = self.slot.lock();
        let connection = ring.as_mut()?;
        if connection.link.is_gone() {
            return None;
        }
        Some(connection.write_published(session, record, entry))
    }
}

impl crate::session::RingHolder for RingSlot {
    fn drop_rings_of_gone_connections(&self) {
        self.finish_if_gone();
    }
}

/// What [`PairSide::offer`] did with a record.
enum RingOffer {
    /// Into the ring.
    Written,
    /// The ring is full.
    Full,
    /// No connection (or only a gone one): wait for the next.
    NoPeer,
    /// Records travel in frames (see [`PairSide`]).
    Frames,
    /// The connection has no ring yet and this process's segment has no room for one now:
    /// wait for room, as a message's allocation does.
    NoRoomForRing,
}

/// What [`PairSide::connection`] found.
enum PairLink {
    /// A connection with its ring (or records travel in frames).
    Ready,
    /// No connection now.
    NoPeer,
    /// A connection whose ring found no room in the segment: it is kept, to try again.
    NoRoomForRing,
}

impl PairSide {
    /// Settles the carriage once the socket is bound or connected.
    fn attached(&mut self) {
        if self.carriage == Carriage::Undecided && !self.socket.reports_peers() {
            self.carriage = Carriage::Frames;
        }
    }

    /// The ring of the newest connection, made and announced if that connection has none yet;
    /// called when the pair has no ring of a live connection.
    ///
    /// # Errors
    /// The peer was refused (another transport or session): nothing can be sent.
    fn connection(&mut self, session: &Arc<Session>, delivery: DeliveryRef) -> Result<PairLink> {
        // Its peer gone, the ring goes now (what it holds is counted as not taken unless its
        // consumer still reads it, and what a dead one left is released), not when a next
        // peer comes, which may be never.
        self.ring.finish_if_gone();
        let mut newest = self.next_link.take();
        while let Some(peer) = self.socket.try_next_peer() {
            let (_, link) = peer?;
            newest = Some(link);
        }
        let newest = newest.filter(|link| !link.is_gone());
        let Some(link) = newest else {
            return Ok(PairLink::NoPeer);
        };
        match new_ring(session, delivery) {
            Ok((ring, announce)) => {
                link.send_frame(&announce);
                self.ring.set(ConnectionRing {
                    ring,
                    link,
                    doorbell: Arc::clone(&self.doorbell),
                    doorbell_due: false,
                    finished: false,
                    session: Arc::clone(session),
                });
                self.carriage = Carriage::Rings;
                Ok(PairLink::Ready)
            }
            Err(error) if self.carriage == Carriage::Undecided => {
                tracing::warn!(%error, "no room for a descriptor ring: descriptors travel in frames");
                self.carriage = Carriage::Frames;
                Ok(PairLink::Ready)
            }
            Err(error) => {
                tracing::debug!(%error, "no room for this connection's descriptor ring yet");
                // Kept for the next look: no other connection may come to wake the sender.
                self.next_link = Some(link);
                Ok(PairLink::NoRoomForRing)
            }
        }
    }

    /// Writes `record` into the connection's ring and publishes it (a pair has no task to
    /// publish later), ringing the peer's doorbell when it waits. One look under the lock
    /// when the connection lives (the usual case), the connection's ring made first otherwise.
    fn offer(
        &mut self,
        session: &Arc<Session>,
        delivery: DeliveryRef,
        record: &[PartRef],
    ) -> Result<RingOffer> {
        if self.carriage == Carriage::Frames {
            return Ok(RingOffer::Frames);
        }
        if let Some(written) = self.ring.write_if_live(session, record, &mut self.entry) {
            return Ok(written);
        }
        match self.connection(session, delivery)? {
            PairLink::Ready => {}
            PairLink::NoPeer => return Ok(RingOffer::NoPeer),
            PairLink::NoRoomForRing => return Ok(RingOffer::NoRoomForRing),
        }
        if self.carriage == Carriage::Frames {
            // No room for a ring at the first connection.
            return Ok(RingOffer::Frames);
        }
        // Ready: a ring was just made for a live connection (were it let go since, by an
        // allocation that found its connection ended, the next offer waits for a peer).
        Ok(self
            .ring
            .write_if_live(session, record, &mut self.entry)
            .unwrap_or(RingOffer::NoPeer))
    }
}

/// A req or rep socket. Over tcp and ipc its carrier (ferromq's own ZMTP req or rep, which
/// reports each connection and hands in each frame behind its peer's identity) carries only
/// rings' announcements and doorbells: each side makes a ring for a connection at its first
/// send on it (a req's request, a rep's reply) and announces it to that peer alone. A req sends
/// its requests to its connections in turn and takes the reply of the one it sent to; a rep
/// writes each reply into the ring of the connection its request came by. Over inproc records
/// travel in frames through the carrier's own req and rep, which keep the alternation.
struct ReqRepSide {
    socket: ZmqSocket,
    /// Frames when the socket does not report connections (inproc), rings otherwise.
    carriage: Carriage,
    connections: Vec<ReqRepConnection>,
    /// A req's next connection to send to.
    next_connection: usize,
    /// A req's: the peer whose reply is awaited; a rep's: the peer of the request being
    /// answered.
    peer: Option<Bytes>,
    /// The doorbell of this socket's rings: a descriptor frame with no record.
    doorbell: Arc<[u8]>,
    /// The entry being written into a ring (reused: no allocation per message).
    entry: Vec<u8>,
}

/// One connection of a [`ReqRepSide`].
struct ReqRepConnection {
    /// The peer's identity, which its frames (and the ring it announced) come behind.
    identity: Bytes,
    link: Arc<ferromq_zmq::PeerLink>,
    /// This side's ring for the connection, made at the first send on it, shared with the
    /// session from then on ([`RingSlot`]).
    ring: Arc<RingSlot>,
}

impl ReqRepSide {
    fn is_req(&self) -> bool {
        self.socket.label().socket_type == SocketType::Req
    }

    /// Settles the carriage once the socket is bound or connected.
    fn attached(&mut self) {
        if self.carriage == Carriage::Undecided {
            self.carriage = if self.socket.reports_peers() {
                Carriage::Rings
            } else {
                Carriage::Frames
            };
        }
    }

    /// Takes in the connections made since the last look and forgets those that ended.
    ///
    /// # Errors
    /// A req's peer was refused (another transport or session): nothing can be sent.
    fn refresh(&mut self) -> Result<()> {
        while let Some(peer) = self.socket.try_next_peer() {
            let (identity, link) = peer?;
            self.add_connection(identity, link);
        }
        // A gone connection's ring is closed; what it holds is counted as not taken unless
        // its consumer still reads it.
        self.connections
            .retain(|connection| !connection.link.is_gone());
        Ok(())
    }

    fn add_connection(&mut self, identity: Bytes, link: Arc<ferromq_zmq::PeerLink>) {
        // A peer that reconnected gets a new ring: its old connection is gone.
        self.connections
            .retain(|connection| connection.identity != identity);
        self.connections.push(ReqRepConnection {
            identity,
            link,
            ring: Arc::new(RingSlot::new()),
        });
    }

    /// The connection a send goes to: a req's next in turn, a rep's requester; `None` when a
    /// req has no connection.
    ///
    /// # Errors
    /// A rep's requester is gone ([`Error::PeerGone`]; the rep then answers nobody); a req's
    /// peer was refused.
    fn target(&mut self, label: &ChannelLabel) -> Result<Option<usize>> {
        self.refresh()?;
        if !self.is_req() {
            let requester = self.peer.as_ref().and_then(|peer| {
                self.connections
                    .iter()
                    .position(|connection| connection.identity == *peer)
            });
            let Some(connection_idx) = requester else {
                // Nobody is left to answer.
                self.peer = None;
                return Err(Error::PeerGone {
                    channel: label.clone(),
                    reason: "the requester left before its reply was sent".to_owned(),
                });
            };
            return Ok(Some(connection_idx));
        }
        if self.connections.is_empty() {
            return Ok(None);
        }
        let connection_idx = self.next_connection % self.connections.len();
        self.next_connection = connection_idx + 1;
        Ok(Some(connection_idx))
    }

    /// Writes `record` into the ring of the connection [`ReqRepSide::target`] picks; a req
    /// then awaits that peer's reply, a rep has answered.
    fn offer(
        &mut self,
        session: &Arc<Session>,
        record: &[PartRef],
        label: &ChannelLabel,
    ) -> Result<RingOffer> {
        // A connection that ended after `target` looked takes nothing: `target` looks again,
        // without it (a rep's requester gone is an error, a req goes on to its next
        // connection).
        let (connection_idx, offer) = loop {
            let Some(connection_idx) = self.target(label)? else {
                return Ok(RingOffer::NoPeer);
            };
            if let Some(offer) = self.write_to(session, connection_idx, record)? {
                break (connection_idx, offer);
            }
        };
        if matches!(offer, RingOffer::Written) {
            let identity = &self.connections[connection_idx].identity;
            self.peer = self.is_req().then(|| identity.clone());
        }
        Ok(offer)
    }

    /// Writes `record` into the ring of connection `connection_idx`, making and announcing
    /// the ring first if it has none; `None` when the connection has ended. One look under the
    /// ring's lock when the connection has its ring (every send after its first).
    fn write_to(
        &mut self,
        session: &Arc<Session>,
        connection_idx: usize,
        record: &[PartRef],
    ) -> Result<Option<RingOffer>> {
        let connection = &self.connections[connection_idx];
        if let Some(offer) = connection
            .ring
            .write_if_live(session, record, &mut self.entry)
        {
            return Ok(Some(offer));
        }
        // No ring yet, or the connection ended (then none is made).
        if connection.link.is_gone() {
            return Ok(None);
        }
        let (ring, announce) = match new_ring(session, DeliveryRef::NONE) {
            Ok(made) => made,
            Err(crate::error::ShmError::SegmentFull { .. }) => {
                return Ok(Some(RingOffer::NoRoomForRing));
            }
            Err(error) => return Err(transport_error(self.socket.label(), error)),
        };
        connection.link.send_frame(&announce);
        connection.ring.set(ConnectionRing {
            ring,
            link: Arc::clone(&connection.link),
            doorbell: Arc::clone(&self.doorbell),
            doorbell_due: false,
            finished: false,
            session: Arc::clone(session),
        });
        session.watch_producer(&connection.ring);
        Ok(connection
            .ring
            .write_if_live(session, record, &mut self.entry))
    }

    /// A req's, awaiting its reply over rings: the connection its request went by.
    fn awaited_link(&self) -> Option<Arc<ferromq_zmq::PeerLink>> {
        if !self.is_req() || self.carriage != Carriage::Rings {
            return None;
        }
        let peer = self.peer.as_ref()?;
        self.connections
            .iter()
            .find(|connection| connection.identity == *peer)
            .map(|connection| Arc::clone(&connection.link))
    }

    /// What a send now would do out of turn, `None` in turn: a req with a reply pending, a rep
    /// with no request to answer.
    fn out_of_turn(&self) -> Option<&'static str> {
        match (self.is_req(), &self.peer) {
            (true, Some(_)) => Some("send a request before the last one's reply came"),
            (false, None) => Some("send a reply before receiving a request"),
            _ => None,
        }
    }

    /// A message was handed out that came from `peer`: a req's reply (the next request may
    /// go), a rep's request (its reply goes to `peer`).
    fn received(&mut self, peer: Option<Bytes>) {
        if self.carriage != Carriage::Rings {
            return;
        }
        self.peer = if self.is_req() { None } else { peer };
    }
}

/// A req's reply will not come: the connection `link` its request went by ended.
fn replier_gone(link: &ferromq_zmq::PeerLink, label: &ChannelLabel) -> Error {
    let replier = match link.peer_pid() {
        Some(pid) => format!("the replier (process {pid})"),
        None => "the replier".to_owned(),
    };
    Error::PeerGone {
        channel: label.clone(),
        reason: format!("{replier} left before its reply came"),
    }
}

/// A socket side whose sending call writes each record into the ring of one of its
/// connections itself (pair, req, rep; a push has its outbox and task, a publisher never
/// waits).
enum RingSender<'a> {
    Pair(&'a mut PairSide),
    ReqRep(&'a mut ReqRepSide),
}

impl RingSender<'_> {
    fn offer(
        &mut self,
        session: &Arc<Session>,
        delivery: DeliveryRef,
        record: &[PartRef],
        label: &ChannelLabel,
    ) -> Result<RingOffer> {
        match self {
            RingSender::Pair(pair) => pair.offer(session, delivery, record),
            RingSender::ReqRep(req_rep) => req_rep.offer(session, record, label),
        }
    }

    /// Waits until the next connection is made, or `deadline`; false at the deadline.
    /// Cancel-safe.
    ///
    /// # Errors
    /// The peer was refused (another transport or session).
    async fn wait_for_peer(&mut self, deadline: Option<tokio::time::Instant>) -> Result<bool> {
        let socket = match self {
            RingSender::Pair(pair) => &pair.socket,
            RingSender::ReqRep(req_rep) => &req_rep.socket,
        };
        let peer = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, socket.next_peer()).await {
                Ok(peer) => peer,
                Err(_) => return Ok(false),
            },
            None => socket.next_peer().await,
        };
        let (identity, link) = peer?;
        match self {
            // Kept for [`PairSide::connection`].
            RingSender::Pair(pair) => pair.next_link = Some(link),
            RingSender::ReqRep(req_rep) => req_rep.add_connection(identity, link),
        }
        Ok(true)
    }

    /// Offers `record` until it is in a ring, waiting for a connection or for room (at most
    /// `timeout`; room for a connection's new ring at most the allocation timeout): true once
    /// written, false when this side's records travel in frames.
    ///
    /// # Errors
    /// [`Error::Timeout`], a refused peer, a rep's requester gone, no room for a ring within
    /// the allocation timeout (the segment-full error).
    async fn send(
        &mut self,
        (session, delivery): (&Arc<Session>, DeliveryRef),
        record: &[PartRef],
        (label, figures): (&ChannelLabel, &ferromq_core::SendFigures),
        timeout: Option<Duration>,
    ) -> Result<bool> {
        let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        let timed_out = || Error::Timeout {
            channel: label.clone(),
            after: timeout.unwrap_or_default(),
        };
        let looks = RingLooks::default();
        let mut segment_full = None;
        // Back-pressure, counted from the first wait until the record is in or the send gave
        // up (a push counts its waits in its window; these sides wait here).
        let mut waiting = None;
        loop {
            let offer = self.offer(session, delivery, record, label)?;
            if !matches!(offer, RingOffer::Written | RingOffer::Frames) {
                waiting.get_or_insert_with(|| figures.waiting());
            }
            match offer {
                RingOffer::Written => return Ok(true),
                RingOffer::Frames => return Ok(false),
                RingOffer::NoPeer => {
                    if !self.wait_for_peer(deadline).await? {
                        return Err(timed_out());
                    }
                }
                RingOffer::Full => {
                    if !wait_for_ring_room(&looks, deadline).await {
                        return Err(timed_out());
                    }
                }
                RingOffer::NoRoomForRing => {
                    let wait = segment_full.get_or_insert_with(|| session.room_wait());
                    match wait.pause(RING_BLOCK, deadline).await {
                        Ok(true) => {}
                        Ok(false) => return Err(timed_out()),
                        Err(full) => return Err(transport_error(label, full)),
                    }
                }
            }
        }
    }
}

/// A new ring in this process's segment and its announcement (with the consumer's reference
/// to the ring and the sender's `delivery` counter), for the caller to send to one peer.
fn new_ring(
    session: &Session,
    delivery: DeliveryRef,
) -> std::result::Result<(RingProducer, Vec<u8>), crate::error::ShmError> {
    let block = session.allocate_long_lived(RING_BLOCK)?;
    let ring = RingProducer::new(block);
    // The consumer's reference travels with the announcement.
    ring.block().add_references(1);
    let announce = wire::encode_ring_announce(
        session.hash,
        wire::RingAnnounce {
            segment: ObjectRef::of(ring.block().segment().name()),
            range: WireRange {
                offset: ring.block().data_offset() as u64,
                size: RING_BLOCK as u64,
            },
            delivery,
        },
    );
    Ok((ring, announce))
}

/// What the batching task of a push socket is asked to do, besides sending records.
enum PushCommand {
    Bind(Address, tokio::sync::oneshot::Sender<Result<Address>>),
    Connect(Address, tokio::sync::oneshot::Sender<Result<()>>),
    /// With what was sent and not taken, when something was, replies whether it was handed
    /// over: to peers that hold every frame written to them (see
    /// [`ZmqSocket::peers_hold_what_was_written`]), or, with a peer gone, ring by ring to the
    /// consumers still there ([`finish_rings_one_by_one`]), the rest counted in
    /// [`PushState::n_lost_at_hand_over`].
    Close(
        Duration,
        Option<crate::delivery::InFlightView>,
        tokio::sync::oneshot::Sender<Result<bool>>,
    ),
}

/// A push socket whose records are encoded by `send` straight into descriptor frames in an
/// [`Outbox`], which a task that owns the zeromq socket empties. Under load a frame carries many
/// descriptors; when idle each message leaves at once. A send costs a lock (uncontended but for
/// the moment the task takes a frame) and a wake-up only when the outbox was empty: no channel,
/// no allocation per message.
struct BatchedPush {
    commands: tokio::sync::mpsc::Sender<PushCommand>,
    /// Shared with the task: the outbox, wake-ups, failures and counts.
    state: Arc<PushState>,
    task: tokio::task::JoinHandle<()>,
    /// Records the outbox holds at most (`sndBufSize`, at least 1).
    capacity: usize,
}

/// Descriptor frames waiting for the task.
struct Outbox {
    /// Full frames (`MAX_RECORDS_PER_FRAME` records or `MAX_FRAME_BYTES`), oldest first.
    sealed: VecDeque<(Vec<u8>, usize)>,
    /// The frame being filled and its number of records.
    open: Vec<u8>,
    n_open: usize,
    /// Records in all of them.
    n_records: usize,
    /// How records travel: decided at the first connection.
    carriage: Carriage,
    /// One descriptor ring per connection (carriage by rings), taken in turn.
    rings: Vec<ConnectionRing>,
    next_ring: usize,
    /// The entry being written into a ring (reused: no allocation per record).
    entry: Vec<u8>,
    /// Connections that came when this process's segment had no room for their ring, oldest
    /// first: the sender tries again (see [`PushState::ring_the_ringless`]).
    ringless: VecDeque<Arc<ferromq_zmq::PeerLink>>,
    /// Not before this instant.
    ringless_retry_at: tokio::time::Instant,
    /// Messages the rings of gone connections held when they were dropped, which their
    /// receivers, dead or finished with them, will never take (see `SentCounter::known_lost`).
    n_lost_in_gone_rings: u64,
}

/// How often a push with ringless connections tries to make their rings, at most: an attempt
/// in a full segment reclaims every block it can, not something to do per message.
const RINGLESS_RETRY: Duration = Duration::from_millis(1);

/// How a push's records travel (see `ring.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carriage {
    /// No connection yet: nothing is accepted.
    Undecided,
    /// Through a descriptor ring per connection (ferromq's own ZMTP push over tcp or ipc).
    Rings,
    /// In descriptor frames over zeromq (inproc, or no room for a ring at the first connection).
    Frames,
}

/// A connection's ring and the link that announces it and rings its doorbell.
struct ConnectionRing {
    ring: RingProducer,
    link: Arc<ferromq_zmq::PeerLink>,
    /// The socket's doorbell: a descriptor frame with no record.
    doorbell: Arc<[u8]>,
    /// The consumer waits for a doorbell that the batching task rings
    /// ([`Outbox::publish_rings`]).
    doorbell_due: bool,
    /// To release what a consumer that left did not take, when the ring is dropped.
    session: Arc<Session>,
    /// Set by [`ConnectionRing::finish_at_close`]: the drop has nothing left to do.
    finished: bool,
}

impl ConnectionRing {
    /// Finishes the ring at its socket's close (see `ring.rs`, "Peer death and drop"), first
    /// [handing](RingProducer::hand_over) what its consumer has not taken over to it when
    /// `hand_over`: the close then reports it delivered. Returns how many messages are lost
    /// though handed over: those of a consumer that had finished before the word reached it,
    /// released here (it never reads the word, so nobody else counts them). 0 when not handed
    /// over: the close counts everything not taken.
    fn finish_at_close(mut self, hand_over: bool) -> u64 {
        if hand_over {
            self.ring.hand_over();
        }
        let n_released = self.finish();
        if hand_over { n_released } else { 0 }
    }

    /// Whether the ring's consumer still holds what was written to it: its connection has not
    /// ended and its process lives (a stopped one does).
    fn consumer_holds_what_was_written(&self) -> bool {
        self.link.holds_what_was_written() && !self.ring.consumer_died()
    }

    /// Finishes the ring, ringing the doorbell of a consumer that waits: how many messages a
    /// consumer that finished first left, released here.
    fn finish(&mut self) -> u64 {
        self.finished = true;
        // A peer in this process lives as long as the ring's orphan would be looked at.
        let announced_to = self
            .link
            .peer_pid()
            .filter(|&pid| pid != std::process::id());
        let (wake, n_released) = self.session.finish_producing(&mut self.ring, announced_to);
        self.ring_doorbell(wake);
        n_released
    }

    /// Finishes the ring of a connection that ended: how many of its messages its receiver
    /// will never take.
    /// - A receiver that finished with the ring first (its close finishes its rings before its
    ///   connection ends) left what the ring still holds and what it had taken and not handed
    ///   out: the finish here releases both and says how many. The second figure is the
    ///   receiver's word, so no more than a run of entries ([`RING_RUN`]) is believed.
    /// - A receiver that died without finishing left what its ring holds from its head (what
    ///   it took and did not hand out included); a watch on its ring releases it.
    /// - A receiver that lives and has not finished may still take what is there (it counts
    ///   what it takes): none. Its connection ended otherwise than by its close (rare on one
    ///   host); what it leaves stays in the sender's window.
    fn finish_gone(mut self) -> u64 {
        // A receiver killed before it adopted the ring is known by the pid of its handshake.
        let never_adopted_and_gone = || {
            self.ring.consumer_pid() == 0
                && self.link.peer_pid().is_some_and(|pid| {
                    pid != std::process::id()
                        && !crate::segment::ProcessId { pid, start_time: 0 }.is_alive()
                })
        };
        let died = self.ring.consumer_died() || never_adopted_and_gone();
        let n_left = self.ring.n_not_taken();
        let n_released = self.finish().min(n_left + RING_RUN as u64);
        if died {
            n_released.max(n_left)
        } else {
            n_released
        }
    }

    fn ring_doorbell(&self, wake: Wake) {
        if self.ring.ring_bell_or_need_frame(wake) {
            self.link.send_frame(&self.doorbell);
        }
    }

    /// Writes `record` into the ring (made in `entry`) and publishes it at once (for a socket
    /// with no task to publish later), ringing the doorbell when the consumer waits:
    /// [`RingOffer::Written`] or [`RingOffer::Full`].
    fn write_published(
        &mut self,
        session: &Session,
        record: &[PartRef],
        entry: &mut Vec<u8>,
    ) -> RingOffer {
        let Ok((kind, indirect)) = ring_entry(session, record, entry) else {
            // A record of thousands of parts and a full segment: like a full ring.
            return RingOffer::Full;
        };
        let wake = match self.ring.push(kind, entry) {
            Pushed::Full => return RingOffer::Full,
            Pushed::Published(wake) => wake,
            Pushed::Unpublished { .. } => self.ring.publish(),
        };
        self.ring_doorbell(wake);
        if let Some(block) = indirect {
            // Its reference now belongs to the consumer.
            block.disarm();
        }
        RingOffer::Written
    }
}

/// Finishes `rings` at a close that hands them over one by one: a receiver of the socket is
/// gone (what it left is lost), so its peers do not all hold what was written to them, and its
/// records go by rings. A ring is handed over if its consumer still holds what was written to
/// it ([`ConnectionRing::consumer_holds_what_was_written`]). Returns how many of the messages
/// `in_flight` says were not taken are lost: those in no ring handed over, which includes
/// what a consumer that finished before the hand-over left (its ring's finish releases it,
/// and it counts through `in_flight` alone).
///
/// What the rings hold is counted between two reads of `in_flight` that agree: a receiver
/// that hands a message out moves its ring's head past it, then counts it taken, so a message
/// handed out between the reads is seen by both or, in the instant between its two steps, by
/// neither (one loss too many per receiver at most); one handed out after the count is both
/// held and taken, which is right.
fn finish_rings_one_by_one(rings: Vec<ConnectionRing>, in_flight: impl Fn() -> u64) -> u64 {
    /// Counts tried before the last one is taken as it is (a loss too many per message
    /// handed out meanwhile): receivers that keep taking at a close are rare, since the
    /// close waited `linger` without progress.
    const COUNTS: usize = 100;
    let holds: Vec<bool> = rings
        .iter()
        .map(ConnectionRing::consumer_holds_what_was_written)
        .collect();
    let count = || -> Vec<u64> {
        rings
            .iter()
            .zip(&holds)
            .map(|(connection, &holds)| {
                if holds {
                    connection.ring.n_not_taken()
                } else {
                    0
                }
            })
            .collect()
    };
    let mut n_untaken = in_flight();
    let mut n_held = count();
    for _ in 1..COUNTS {
        let again = in_flight();
        if again == n_untaken {
            break;
        }
        n_untaken = again;
        n_held = count();
    }
    let n_held: u64 = rings
        .into_iter()
        .zip(holds)
        .zip(n_held)
        .map(|((connection, hand_over), n_held)| {
            // A consumer that had finished first held nothing: what it left is released now.
            if connection.finish_at_close(hand_over) > 0 {
                0
            } else {
                n_held
            }
        })
        .sum();
    n_untaken.saturating_sub(n_held)
}

/// Waits for the next look at a full ring (see [`RingLooks`]), at most until `deadline`;
/// false once the deadline has passed. Its consumer frees room without telling.
async fn wait_for_ring_room(looks: &RingLooks, deadline: Option<tokio::time::Instant>) -> bool {
    let now = tokio::time::Instant::now();
    if deadline.is_some_and(|deadline| now >= deadline) {
        return false;
    }
    let next_look = looks.next();
    let wake_at = deadline.map_or(next_look, |deadline| next_look.min(deadline));
    if wake_at <= now {
        crate::delivery::give_way(looks.waited());
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep_until(wake_at).await;
    }
    true
}

impl Drop for ConnectionRing {
    fn drop(&mut self) {
        if !self.finished {
            self.finish();
        }
    }
}

impl Outbox {
    /// Finishes and drops the rings of connections that ended, counting in
    /// `n_lost_in_gone_rings` what their receivers will never take. What a ring holds stays
    /// counted as not taken (`delivery.rs`) unless its consumer still reads it.
    fn drop_gone_rings(&mut self) {
        if !self
            .rings
            .iter()
            .any(|connection| connection.link.is_gone())
        {
            return;
        }
        let (gone, live): (Vec<ConnectionRing>, Vec<ConnectionRing>) =
            std::mem::take(&mut self.rings)
                .into_iter()
                .partition(|connection| connection.link.is_gone());
        self.rings = live;
        for connection in gone {
            self.n_lost_in_gone_rings += connection.finish_gone();
        }
    }

    /// Writes `entry` into the next connection's ring with room, ringing its doorbell when its
    /// consumer waits; false when every ring is full (or no connection is left). Sets
    /// `publish_soon` when the entry is the first of a burst left unpublished.
    fn push_to_a_ring(&mut self, kind: EntryKind, publish_soon: &mut bool) -> bool {
        // A connection that ended takes nothing more.
        self.drop_gone_rings();
        let n_rings = self.rings.len();
        for step in 0..n_rings {
            let ring_idx = (self.next_ring + step) % n_rings;
            let connection = &mut self.rings[ring_idx];
            match connection.ring.push(kind, &self.entry) {
                Pushed::Full => continue,
                // The batching task rings once the sender yields, as the connection's task
                // wrote the doorbell frame: rung at once (a syscall on the sending thread), a
                // consumer woke at a burst's first entry, took it alone and slept again, and
                // an unpaced 64 B pair fell from 3 M to 0.4-1.3 M msg/s in some runs.
                Pushed::Published(wake) => {
                    connection.doorbell_due |= wake.0;
                    *publish_soon |= wake.0;
                }
                // The batching task publishes what a burst leaves unpublished once the sender
                // yields.
                Pushed::Unpublished { first } => *publish_soon |= first,
            }
            self.next_ring = ring_idx + 1;
            return true;
        }
        false
    }

    /// Publishes every ring's unpublished entries (the batching task, when the sender
    /// yielded), ringing the doorbells of consumers that wait.
    fn publish_rings(&mut self) {
        for connection in &mut self.rings {
            let wake = connection.ring.publish();
            let due = std::mem::take(&mut connection.doorbell_due);
            connection.ring_doorbell(Wake(wake.0 || due));
        }
    }
}

/// Shared between a [`BatchedPush`] and its task.
struct PushState {
    delivery: DeliveryRef,
    /// For the blocks of ring entries too large for a ring.
    session: Arc<Session>,
    /// A doorbell: a descriptor frame with no record (one, shared by every connection's ring).
    doorbell: Arc<[u8]>,
    outbox: crate::lock::ShortLock<Outbox>,
    /// Records were put into an empty outbox.
    ready: tokio::sync::Notify,
    /// The task took records out: senders waiting for room look again.
    room: tokio::sync::Notify,
    /// Set by the task when the zeromq socket failed; later sends report it.
    failure: std::sync::Mutex<Option<String>>,
    /// Whether `failure` is set: what every send looks at, without the lock (a lock per send
    /// was 4 % of the sender at 64 B).
    failed: std::sync::atomic::AtomicBool,
    /// Records accepted by `send` that the task has not yet handed to the zeromq socket.
    n_queued: std::sync::atomic::AtomicU64,
    /// Records the zeromq socket refused (peer of another transport or session, ...).
    n_refused: std::sync::atomic::AtomicU64,
    /// Set by the task at the close once what the receivers had not taken is handed over to
    /// them ([`RingProducer::hand_over`]): from then on it is theirs to report, not the close's.
    handed_over: std::sync::atomic::AtomicBool,
    /// Set with `handed_over`: messages lost though handed over, released by the task because
    /// their receiver had finished before the word reached it
    /// ([`ConnectionRing::finish_at_close`]), and, when a receiver was gone and the rings were
    /// handed over one by one, those not taken that no ring of a receiver still there held.
    n_lost_at_hand_over: std::sync::atomic::AtomicU64,
    /// False while a connection the socket was asked to make is not made yet: the outbox takes
    /// nothing then, so a sender's first messages wait (as `send` waits for a peer on the zeromq
    /// transport) and its task gets the runtime to connect, even when the sender would never
    /// yield otherwise. A message accepted is thus one a connected receiver can be handed.
    connected: std::sync::atomic::AtomicBool,
}

impl crate::session::RingHolder for PushState {
    fn drop_rings_of_gone_connections(&self) {
        self.outbox.lock().drop_gone_rings();
    }
}

impl PushState {
    /// Messages sent that no receiver will ever take, after dropping the rings of the
    /// connections that ended (see `SentCounter::known_lost`).
    fn lost_in_gone_rings(&self) -> u64 {
        let mut outbox = self.outbox.lock();
        outbox.drop_gone_rings();
        outbox.n_lost_in_gone_rings
    }
}

const MAX_RECORDS_PER_FRAME: usize = 64;
const MAX_FRAME_BYTES: usize = 64 << 10;

/// A descriptor frame with no record yet, with room for a full frame's records.
fn empty_frame(session_hash: u64, delivery: DeliveryRef) -> Vec<u8> {
    wire::frame_header(session_hash, delivery, MAX_RECORDS_PER_FRAME * 32)
}

impl PushState {
    fn empty_frame(&self) -> Vec<u8> {
        empty_frame(self.session.hash, self.delivery)
    }

    /// Why the zeromq socket failed, if it did.
    fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().expect("failure flag poisoned").clone()
    }

    /// Records why the zeromq socket failed; sends from now on report it.
    fn fail(&self, reason: String) {
        *self.failure.lock().expect("failure flag poisoned") = Some(reason);
        self.failed.store(true, Ordering::Release);
    }

    /// Appends `record` unless the outbox holds `capacity` records or a connection is still
    /// being made; true when it was appended.
    fn offer(&self, record: &[PartRef], capacity: usize) -> bool {
        if !self.connected.load(Ordering::Acquire) {
            return false;
        }
        let mut outbox = self.outbox.lock();
        match outbox.carriage {
            Carriage::Rings => return self.offer_to_a_ring(&mut outbox, record),
            // No connection yet (or only a refused one): nothing is accepted.
            Carriage::Undecided => return false,
            Carriage::Frames => {}
        }
        if outbox.n_records >= capacity {
            return false;
        }
        let was_empty = outbox.n_records == 0;
        wire::append_record(&mut outbox.open, record);
        outbox.n_open += 1;
        outbox.n_records += 1;
        if outbox.n_open >= MAX_RECORDS_PER_FRAME || outbox.open.len() >= MAX_FRAME_BYTES {
            let full = std::mem::replace(&mut outbox.open, self.empty_frame());
            let n_full = std::mem::take(&mut outbox.n_open);
            outbox.sealed.push_back((full, n_full));
        }
        self.n_queued.fetch_add(1, Ordering::AcqRel);
        drop(outbox);
        if was_empty {
            self.ready.notify_one();
        }
        true
    }

    /// One record as a ring entry, into the next ring with room: the record itself, or, when
    /// it is larger than a ring entry may be, a block holding it.
    fn offer_to_a_ring(&self, outbox: &mut Outbox, record: &[PartRef]) -> bool {
        if !outbox.ringless.is_empty() {
            self.ring_the_ringless(outbox);
        }
        let mut entry = std::mem::take(&mut outbox.entry);
        let made = ring_entry(&self.session, record, &mut entry);
        outbox.entry = entry;
        let Ok((kind, indirect)) = made else {
            return false;
        };
        let mut publish_soon = false;
        let written = outbox.push_to_a_ring(kind, &mut publish_soon);
        if written && let Some(block) = indirect {
            // Its reference now belongs to the consumer.
            block.disarm();
        }
        if publish_soon {
            self.ready.notify_one();
        }
        written
    }

    /// Makes the rings of connections that found no room for one when they came, oldest first,
    /// while the segment has room (at most every [`RINGLESS_RETRY`]). A sender waiting for
    /// room offers again at each look, so a push whose other connections are gone does not
    /// wait for ever while one is left without a ring.
    fn ring_the_ringless(&self, outbox: &mut Outbox) {
        let now = tokio::time::Instant::now();
        if now < outbox.ringless_retry_at {
            return;
        }
        outbox.ringless_retry_at = now + RINGLESS_RETRY;
        outbox.ringless.retain(|link| !link.is_gone());
        while let Some(link) = outbox.ringless.front() {
            let Ok((ring, announce)) = new_ring(&self.session, self.delivery) else {
                return;
            };
            link.send_frame(&announce);
            let link = outbox.ringless.pop_front().expect("looked at above");
            outbox.rings.push(ConnectionRing {
                ring,
                link,
                doorbell: Arc::clone(&self.doorbell),
                doorbell_due: false,
                finished: false,
                session: Arc::clone(&self.session),
            });
        }
    }

    /// Publishes what the rings hold unpublished (the batching task, once the sender yields).
    fn publish_rings(&self) {
        self.outbox.lock().publish_rings();
    }

    /// Whether [`PushState::offer`] would append a record now (for a ring: of any size).
    fn has_room(&self, capacity: usize) -> bool {
        if !self.connected.load(Ordering::Acquire) {
            return false;
        }
        let mut outbox = self.outbox.lock();
        if !outbox.ringless.is_empty() {
            self.ring_the_ringless(&mut outbox);
        }
        match outbox.carriage {
            Carriage::Rings => outbox
                .rings
                .iter()
                .any(|connection| connection.ring.has_room(MAX_INLINE_ENTRY)),
            Carriage::Undecided => false,
            Carriage::Frames => outbox.n_records < capacity,
        }
    }

    /// Whether records go into rings, which free room without a wake-up.
    fn carries_by_rings(&self) -> bool {
        self.outbox.lock().carriage == Carriage::Rings
    }

    /// Settles how records travel once the socket is bound or connected: a socket that
    /// reports its connections waits for the first one (which gets a ring); any other sends
    /// frames, accepting records once its connection is made.
    fn attached(&self, socket: &ZmqSocket, establishing: bool) {
        let mut outbox = self.outbox.lock();
        if outbox.carriage == Carriage::Undecided {
            if socket.reports_peers() {
                return;
            }
            outbox.carriage = Carriage::Frames;
        }
        if outbox.carriage == Carriage::Frames {
            let waiting = socket.is_connecting() && establishing;
            self.connected.store(!waiting, Ordering::Release);
        }
        drop(outbox);
        self.room.notify_waiters();
    }

    /// A new connection: it gets a ring of its own, announced to it alone, when records travel
    /// by rings (the first connection decides: rings unless this process's segment has no
    /// room for one).
    fn connection_made(&self, link: Arc<ferromq_zmq::PeerLink>) {
        let mut outbox = self.outbox.lock();
        if outbox.carriage != Carriage::Frames {
            match new_ring(&self.session, self.delivery) {
                Ok((ring, announce)) => {
                    link.send_frame(&announce);
                    outbox.rings.push(ConnectionRing {
                        ring,
                        link,
                        doorbell: Arc::clone(&self.doorbell),
                        doorbell_due: false,
                        finished: false,
                        session: Arc::clone(&self.session),
                    });
                    outbox.carriage = Carriage::Rings;
                }
                Err(error) if outbox.carriage == Carriage::Undecided => {
                    tracing::warn!(%error, "no room for a descriptor ring: descriptors travel in frames");
                    outbox.carriage = Carriage::Frames;
                }
                Err(error) => {
                    tracing::debug!(%error, "no room for this connection's descriptor ring yet");
                    outbox.ringless.push_back(link);
                }
            }
        }
        drop(outbox);
        self.connected.store(true, Ordering::Release);
        self.room.notify_waiters();
    }

    /// The oldest frame and its number of records, `None` when the outbox is empty.
    fn take_frame(&self) -> Option<(Vec<u8>, usize)> {
        let mut outbox = self.outbox.lock();
        let (mut frame, n_records) = match outbox.sealed.pop_front() {
            Some(sealed) => sealed,
            None if outbox.n_open > 0 => {
                let open = std::mem::replace(&mut outbox.open, self.empty_frame());
                (open, std::mem::take(&mut outbox.n_open))
            }
            None => return None,
        };
        outbox.n_records -= n_records;
        drop(outbox);
        self.room.notify_waiters();
        wire::set_record_count(&mut frame, n_records);
        Some((frame, n_records))
    }
}

/// `record` as a ring entry in `entry` (replacing its contents) and the entry's kind: the record
/// itself, or, when it is larger than a ring entry may be (a message of thousands of parts),
/// a reference to a new block of this process's segment holding it, returned with one
/// reference, which the caller hands to each consumer that gets the entry.
///
/// # Errors
/// When such a record finds no room in the segment now.
fn ring_entry(
    session: &Session,
    record: &[PartRef],
    entry: &mut Vec<u8>,
) -> std::result::Result<(EntryKind, Option<ShmBuffer>), crate::error::ShmError> {
    entry.clear();
    wire::append_record(entry, record);
    if entry.len() <= MAX_INLINE_ENTRY {
        return Ok((EntryKind::Record, None));
    }
    let mut block = session.allocate_referenced_now(entry.len())?;
    ferromq_core::MessageBuffer::as_bytes_mut(&mut block).expect("a new block has one owner")
        [..entry.len()]
        .copy_from_slice(entry);
    let reference = wire::encode_block_ref(
        ObjectRef::of(block.segment().name()),
        WireRange {
            offset: block.data_offset() as u64,
            size: entry.len() as u64,
        },
    );
    entry.clear();
    entry.extend_from_slice(&reference);
    Ok((EntryKind::Indirect, Some(block)))
}

impl BatchedPush {
    fn start(
        mut socket: ZmqSocket,
        session: Arc<Session>,
        delivery: DeliveryRef,
        capacity: usize,
    ) -> BatchedPush {
        let session_hash = session.hash;
        let (commands, mut queue) = tokio::sync::mpsc::channel::<PushCommand>(4);
        let state = Arc::new(PushState {
            delivery,
            session,
            doorbell: Arc::from(wire::frame_header(session_hash, delivery, 0)),
            outbox: crate::lock::ShortLock::new(Outbox {
                sealed: VecDeque::new(),
                open: empty_frame(session_hash, delivery),
                n_open: 0,
                n_records: 0,
                carriage: Carriage::Undecided,
                rings: Vec::new(),
                next_ring: 0,
                entry: Vec::new(),
                ringless: VecDeque::new(),
                ringless_retry_at: tokio::time::Instant::now(),
                n_lost_in_gone_rings: 0,
            }),
            ready: tokio::sync::Notify::new(),
            room: tokio::sync::Notify::new(),
            failure: std::sync::Mutex::default(),
            failed: false.into(),
            n_queued: 0.into(),
            n_refused: 0.into(),
            handed_over: false.into(),
            n_lost_at_hand_over: 0.into(),
            connected: false.into(),
        });
        state.session.watch_producer(&state);
        let task_state = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let state = task_state;
            // Connections are made in the background as soon as they are asked for, as
            // ZeroMQ does: a receiver that stalls or is slow to start receiving later is
            // connected already, and what is sent meanwhile waits in its socket.
            let mut establishing = true;
            // Until a peer of another transport or session connects (then nothing is sent).
            let mut watching_peers = true;
            loop {
                // Commands first: a connect must not wait behind frames that need its peer.
                let command = tokio::select! {
                    biased;
                    command = queue.recv() => match command {
                        Some(command) => Some(command),
                        None => return,
                    },
                    () = state.ready.notified() => None,
                    event = carrier_event(&mut socket, establishing, watching_peers) => {
                        match event {
                            CarrierEvent::Established(Ok(())) => {
                                state.connected.store(true, Ordering::Release);
                                state.room.notify_waiters();
                            }
                            CarrierEvent::Established(Err(error)) => {
                                tracing::error!(%error, "connecting failed");
                                state.fail(error.to_string());
                                establishing = false;
                                state.connected.store(true, Ordering::Release);
                                state.room.notify_waiters();
                            }
                            CarrierEvent::Peer(Ok((_, link))) => state.connection_made(link),
                            CarrierEvent::Peer(Err(error)) => {
                                state.fail(error.to_string());
                                watching_peers = false;
                                state.connected.store(true, Ordering::Release);
                                state.room.notify_waiters();
                            }
                        }
                        continue;
                    }
                };
                match command {
                    None => {}
                    Some(PushCommand::Bind(address, reply)) => {
                        let bound = socket.bind(&address).await;
                        state.attached(&socket, establishing);
                        let _ = reply.send(bound);
                        continue;
                    }
                    Some(PushCommand::Connect(address, reply)) => {
                        let connected = socket.connect(&address).await;
                        state.attached(&socket, establishing);
                        let _ = reply.send(connected);
                        continue;
                    }
                    Some(PushCommand::Close(linger, untaken, reply)) => {
                        // Everything accepted before the close goes first.
                        while let Some((frame, n_records)) = state.take_frame() {
                            send_frame(&mut socket, &state, frame, n_records).await;
                        }
                        // The rings are published and closed (their doorbells written by the
                        // socket's close); their consumers still take what they hold, and
                        // report what they leave if it was handed over to them (`ring.rs`).
                        let held = untaken.is_some() && socket.peers_hold_what_was_written();
                        let (rings, by_rings) = {
                            let mut outbox = state.outbox.lock();
                            let by_rings = outbox.carriage == Carriage::Rings;
                            (std::mem::take(&mut outbox.rings), by_rings)
                        };
                        // Records go into rings alone once the first connection got one (a
                        // connection still waiting for its ring is sent nothing), so with a
                        // receiver gone (it took what it took; what it left is lost) the
                        // others' rings are still handed over, one by one: what was not taken
                        // and is in none of them is what is lost.
                        let (n_lost, ring_by_ring) = match untaken {
                            Some(untaken) if !held && by_rings => {
                                (finish_rings_one_by_one(rings, || untaken.get()), true)
                            }
                            _ => {
                                let n_lost = rings
                                    .into_iter()
                                    .map(|connection| connection.finish_at_close(held))
                                    .sum();
                                (n_lost, false)
                            }
                        };
                        // Descriptors in frames are handed over only once the carrier has
                        // written them (its close, below, may time out first): what the close
                        // counts then is left to it.
                        let handed_over = held || ring_by_ring;
                        if handed_over && by_rings {
                            state.n_lost_at_hand_over.store(n_lost, Ordering::Release);
                            state.handed_over.store(true, Ordering::Release);
                        }
                        let closed = socket.close(linger).await.map(|()| handed_over);
                        let _ = reply.send(closed);
                        return;
                    }
                }
                state.publish_rings();
                while let Some((frame, n_records)) = state.take_frame() {
                    send_frame(&mut socket, &state, frame, n_records).await;
                }
            }
        });
        BatchedPush {
            commands,
            state,
            task,
            capacity: capacity.max(1),
        }
    }

    /// Waits until the outbox has room for a record (and its connection is made), taking
    /// nothing: nobody else puts records into it while its socket is borrowed for a
    /// reservation. Cancel-safe.
    async fn wait_for_room(&self) {
        let mut looks = RingLooks::default();
        loop {
            let room = self.state.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            // A failed socket takes nothing: the send through the reservation says why.
            if self.state.has_room(self.capacity) || self.state.failed.load(Ordering::Acquire) {
                return;
            }
            self.wait(room, None, &mut looks).await;
        }
    }

    /// Waits for `room` to be notified (a frame taken, a connection made), or, with records
    /// carried by rings, whose consumers free room without telling, for the next look;
    /// false at `deadline`.
    async fn wait(
        &self,
        room: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        deadline: Option<tokio::time::Instant>,
        looks: &mut RingLooks,
    ) -> bool {
        let next_look = self.state.carries_by_rings().then(|| looks.next());
        let wake_at = match (next_look, deadline) {
            (Some(look), Some(deadline)) => Some(look.min(deadline)),
            (look, deadline) => look.or(deadline),
        };
        match wake_at {
            Some(wake_at) if wake_at <= tokio::time::Instant::now() => {
                // A look due now is one turn of the runtime: tokio's timers round a deadline up
                // to the next millisecond, so `timeout_at(now)` slept up to a millisecond per
                // look while the consumer had long freed room (a sender of 1 KiB inline
                // messages, whose ring fills before its window, made 0.22 M msg/s instead of
                // 2.9 M; `tests/ring_room.rs`).
                crate::delivery::give_way(looks.waited());
                tokio::task::yield_now().await;
                deadline.is_none_or(|deadline| tokio::time::Instant::now() < deadline)
            }
            Some(wake_at) => {
                let _ = tokio::time::timeout_at(wake_at, room).await;
                deadline.is_none_or(|deadline| tokio::time::Instant::now() < deadline)
            }
            None => {
                room.await;
                true
            }
        }
    }

    /// Puts `record` into the outbox, waiting while it is full; false at the deadline, or as
    /// soon as the socket failed (a refused peer: [`PushState::failure`] says so).
    async fn put(&self, record: &[PartRef], deadline: Option<tokio::time::Instant>) -> bool {
        // The usual case: room at once, no waiter registered.
        if self.state.offer(record, self.capacity) {
            return true;
        }
        let mut looks = RingLooks::default();
        loop {
            let room = self.state.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if self.state.offer(record, self.capacity) {
                return true;
            }
            if self.state.failed.load(Ordering::Acquire) {
                return false;
            }
            if !self.wait(room, deadline, &mut looks).await {
                return false;
            }
        }
    }

    async fn call<T>(
        &self,
        label: &ChannelLabel,
        make: impl FnOnce(tokio::sync::oneshot::Sender<Result<T>>) -> PushCommand,
    ) -> Result<T> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let closed = || Error::Interrupted {
            channel: label.clone(),
        };
        self.commands
            .send(make(reply))
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// What the carrier socket of a push has to say besides taking frames.
enum CarrierEvent {
    /// A background connection was made (zmq.rs).
    Established(Result<()>),
    /// A connection through its handshake (ferromq's own ZMTP), or a refused peer.
    Peer(Result<(Bytes, Arc<ferromq_zmq::PeerLink>)>),
}

/// The next [`CarrierEvent`]: a connection being made (while `establishing`) or a new peer
/// (while `watching_peers`); pending when neither can come. Cancel-safe.
async fn carrier_event(
    socket: &mut ZmqSocket,
    establishing: bool,
    watching_peers: bool,
) -> CarrierEvent {
    if watching_peers && socket.reports_peers() {
        CarrierEvent::Peer(socket.next_peer().await)
    } else if establishing && socket.is_connecting() {
        CarrierEvent::Established(socket.establish().await)
    } else {
        std::future::pending().await
    }
}

/// When a sender whose rings are full looks again: at once for the first 200 µs (a consumer
/// that keeps up frees room within microseconds), then every millisecond, so a stalled
/// consumer costs no CPU: the same rule as a full delivery window's (`delivery.rs`).
struct RingLooks {
    since: tokio::time::Instant,
}

impl Default for RingLooks {
    fn default() -> RingLooks {
        RingLooks {
            since: tokio::time::Instant::now(),
        }
    }
}

impl RingLooks {
    /// How long the sender has waited for room.
    fn waited(&self) -> Duration {
        self.since.elapsed()
    }

    fn next(&self) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        if now - self.since < crate::delivery::SPIN_FOR {
            now
        } else {
            now + crate::delivery::POLL_PAUSE
        }
    }
}

/// Hands one frame to the zeromq socket, recording a refusal.
async fn send_frame(socket: &mut ZmqSocket, state: &PushState, frame: Vec<u8>, n_records: usize) {
    let sent = socket
        .send_unboxed(Parts::from(Message::from(frame)), None)
        .await;
    state.n_queued.fetch_sub(n_records as u64, Ordering::AcqRel);
    if let Err(failed) = sent {
        tracing::error!(channel = %socket.label(), error = %failed.error, n_records, "shmem descriptors refused");
        state
            .n_refused
            .fetch_add(n_records as u64, Ordering::AcqRel);
        state.fail(failed.error.to_string());
    }
}

pub(crate) struct ShmSocket {
    label: ChannelLabel,
    session: Arc<Session>,
    inner: Inner,
    /// What push and pair sockets sent and their receivers took (see `delivery.rs`).
    sent: Option<SentCounter>,
    /// Messages in flight at most (`sndBufSize`; 0: no bound).
    window: usize,
    /// Received and not yet handed out.
    pending: VecDeque<Received>,
    /// Descriptor frames received and not yet decoded into `pending`, each with the identity of
    /// the peer it came from where the carrier says (req/rep).
    frames: VecDeque<(Option<Bytes>, Bytes)>,
    /// Segments and regions of peers already mapped for this socket.
    seen_memory: Vec<(ObjectKind, ObjectRef)>,
    /// Reused for the part descriptors of one message (try_send_parts).
    scratch: Vec<PartRef>,
    /// Reused for decoding descriptor frames (receive_parts): no allocation per frame.
    decoded: wire::Frame,
    /// The segment the last block received lay in.
    last_segment: Option<(ObjectRef, Arc<crate::segment::Segment>)>,
    /// The counter of the sender of the last counted frame.
    last_taken: Option<(DeliveryRef, Arc<TakenCounter>)>,
    /// Frames dropped because they were no descriptor frames of this session.
    n_foreign_frames: u64,
    /// What a look at a ring could not receive, kept with the ring's [`AdoptedRing::id`]: the
    /// next [`Socket::receive_parts`] that finds nothing queued returns it and drops the ring
    /// then, not before, since what the look queued from that ring is released into it as it is
    /// handed out (dropping it earlier counted those as not taken at the ring's finish).
    ring_error: Option<(u64, Error)>,
    /// The send queue (sent and not taken, as of recently) and back-pressure waits.
    figures: Arc<ferromq_core::SendFigures>,
    /// Descriptor rings this pull adopted, one per connected push (see `ring.rs`), taken in
    /// turn.
    rings: Vec<AdoptedRing>,
    next_ring: usize,
    /// The [`AdoptedRing::id`] of the last ring adopted.
    next_ring_id: u64,
    /// One ring entry, copied out of its ring (reused: no allocation per message).
    entry: Vec<u8>,
    /// Receives spin (`busyPoll`): they never wait on the socket, so they ask for no doorbell.
    busy_poll: bool,
    /// Whether the next wait for ring entries looks again for a while before it asks for a
    /// doorbell: after a short wait, unless such spins have been missing.
    ring_spin: SpinPolicy,
    /// What the producers of its rings ring instead of sending doorbell frames (`bell.rs`):
    /// bound at the first ring adopted; `None` before, when busy-polled, or where none can be.
    bell: Option<crate::bell::Bell>,
}

impl Drop for ShmSocket {
    fn drop(&mut self) {
        // The rings first: the entries taken into `pending` leave them, so the messages
        // `pending` releases when it is dropped next are released once (see `TakenEntry`).
        self.rings.clear();
    }
}

/// What [`ShmSocket::take_from_rings`] did.
enum FromRings {
    /// One message went to `pending`.
    Queued,
    /// No ring holds an entry.
    Empty,
    /// The next entry names memory this process has not mapped yet; it stays in its ring.
    NeedsMapping(Vec<(ObjectKind, ObjectRef)>),
}

/// A message received and not yet handed out.
struct Received {
    parts: Parts,
    /// The counter of its sender, advanced when it is handed out; `None` for one from a ring
    /// (its ring counts it, [`AdoptedRing::release`]) and for a sender that counts nothing.
    taken: Option<Arc<TakenCounter>>,
    /// The peer it came from, where the carrier says (req/rep: a rep's reply goes there).
    peer: Option<Bytes>,
    /// The ring entry it came in, which stays in its ring until it is handed out.
    entry: Option<TakenEntry>,
    /// A record a subscriber's topics do not match: released when its turn comes, never
    /// handed out.
    filtered: bool,
}

/// A ring entry taken into `pending` and not yet handed out. It stays in the ring (the head
/// does not pass it) so that a receiver killed with a run of entries taken loses its sender
/// nothing: the sender releases whatever its dead receiver's ring still holds (`ring.rs`).
struct TakenEntry {
    /// [`AdoptedRing::id`] of its ring.
    ring_id: u64,
    /// Where it ends in the ring ([`RingConsumer::release_to`]).
    end: u64,
    /// The block holding a record too large for the ring, with the entry's reference to it:
    /// given back after the entry left the ring.
    indirect: Option<(Arc<crate::segment::Segment>, WireRange)>,
}

/// A ring a receiver adopted, and the peer that announced it where the carrier says
/// (req/rep).
struct AdoptedRing {
    ring: RingConsumer,
    peer: Option<Bytes>,
    /// To release what this receiver did not take when the producer finished first.
    session: Arc<Session>,
    /// Names the ring for the entries taken from it into `pending` ([`TakenEntry`]).
    id: u64,
    /// Entries taken from it into `pending` and not yet handed out: a finished ring stays
    /// while it has some.
    n_taken: usize,
    /// The counter of the ring's sender (`RingConsumer::delivery`), which every message taken
    /// from the ring counts at when it is handed out ([`ShmSocket::give_up`]): looked up at the
    /// first entry taken (`None` before; `Some(None)` when the sender counts nothing). Held
    /// here, not by each message, so that a message costs no reference count of its own.
    taken_counter: Option<Option<TakenCounter>>,
    /// Whether this receiver finished with it ([`AdoptedRing::finish`]).
    finished: bool,
}

impl AdoptedRing {
    fn new(ring: RingConsumer, peer: Option<Bytes>, session: Arc<Session>, id: u64) -> AdoptedRing {
        AdoptedRing {
            ring,
            peer,
            session,
            id,
            n_taken: 0,
            taken_counter: None,
            finished: false,
        }
    }

    /// Gives up a taken entry once its message is handed out (`handed_out`: counted at its
    /// sender's counter) or released: it leaves the ring. The head moves first, then the count,
    /// as for a message that came in a frame: a receiver killed in between leaves its sender
    /// one message too many in flight, never one counted twice.
    fn release(&mut self, end: u64, handed_out: bool) {
        self.ring.release_to(end);
        self.n_taken -= 1;
        if handed_out && let Some(Some(counter)) = &self.taken_counter {
            counter.count_taken();
        }
    }

    /// Finishes with the ring (see `ring.rs`, "Peer death and drop"): entries taken and not
    /// handed out leave it, for this process to release with `pending`. `Some` when its
    /// producer, finished first, had handed what was left over to this receiver: how many
    /// messages are lost, those the ring still held (released here) and the taken ones. A
    /// producer that finishes after it counts them all.
    fn finish(&mut self) -> Option<u64> {
        if std::mem::replace(&mut self.finished, true) {
            return None;
        }
        self.session
            .finish_consuming(&mut self.ring, self.n_taken as u64)
    }
}

impl Drop for AdoptedRing {
    fn drop(&mut self) {
        // A socket that closes finishes its rings first and reports what they lost; one
        // dropped without a close can only say so here.
        if let Some(n_messages) = self.finish().filter(|&n_messages| n_messages > 0) {
            tracing::error!(
                n_messages,
                "a receiver dropped without a close lost messages handed over to it"
            );
        }
    }
}

/// How a receive waits for its rings' entries and its socket's frames together.
struct RingWait<'a> {
    rings: &'a mut Vec<AdoptedRing>,
    busy_poll: bool,
    /// Whether this wait spins on the rings before it asks for a doorbell, and for how long
    /// (the channel's `spinUs`); learns from this wait.
    spin: &'a mut SpinPolicy,
    /// Rung by the rings' producers (where they can reach it) instead of a doorbell frame.
    bell: Option<&'a crate::bell::Bell>,
    /// A req's connection whose reply it awaits: the wait ends (`None`) once that ended, for
    /// the caller to say so.
    awaited: Option<&'a ferromq_zmq::PeerLink>,
}

impl RingWait<'_> {
    /// Waits until a ring has an entry (`None`, also when the safety net expires) or
    /// `receive` brings frames. Rings finished by their producers go; the others are watched
    /// while the socket is: entries are looked for at every poll (a spinning receive finds them
    /// without a wake-up), and the bell or a doorbell frame wakes a sleeping one. Cancel-safe
    /// where `receive` is.
    async fn or_socket(
        self,
        receive: impl std::future::Future<Output = Result<Vec<(Option<Bytes>, Bytes)>>>,
    ) -> Option<Result<Vec<(Option<Bytes>, Bytes)>>> {
        let RingWait {
            rings,
            busy_poll,
            spin,
            bell,
            awaited,
        } = self;
        rings.retain_mut(|adopted| adopted.n_taken > 0 || !adopted.ring.is_finished());
        let watch_rings = !rings.is_empty();
        // Under load a consumer finds its rings empty between the producer's runs of entries:
        // it looks again for a while (yielding) before it asks for a doorbell, which costs both
        // sides a syscall. Only when its last wait was short, and not while its spins keep
        // missing (the policy's back-off, as a channel's own spin does): a paced or idle
        // consumer asks at once and spins not at all, and one whose entries come just too late
        // (a worker of a distributed search waiting for its peers, with fewer cores than
        // processes) stops taking a core from the processes it waits for.
        let spin_for = if watch_rings && !busy_poll {
            spin.spin_for()
        } else {
            Duration::ZERO
        };
        let spinning = !spin_for.is_zero();
        let started = tokio::time::Instant::now();
        // When this wait asked for a doorbell: into the wait, and on the host's clock (read
        // only then, on the way to sleep; see the end of the wait). A busy-polled receive never
        // asks: it counts as having asked, for a doorbell that never comes.
        let mut asked_at: Option<(Duration, u64)> = None;
        if !spinning && !busy_poll {
            if !rings
                .iter_mut()
                .all(|adopted| adopted.ring.wait_for_doorbell())
            {
                return None;
            }
            asked_at = Some((Duration::ZERO, crate::ring::monotonic_ns()));
        }
        tokio::pin!(receive);
        let safety_net = tokio::time::sleep(DOORBELL_SAFETY_NET);
        tokio::pin!(safety_net);
        let mut n_polls = 0u32;
        let mut last_look = None;
        // The wait was ended by the bell (not by entries found).
        let mut rung = false;
        let received = std::future::poll_fn(|cx| {
            if watch_rings && rings.iter_mut().any(|adopted| adopted.ring.has_entries()) {
                return std::task::Poll::Ready(None);
            }
            n_polls = n_polls.wrapping_add(1);
            if busy_poll && watch_rings && !n_polls.is_multiple_of(BUSY_POLLS_PER_SOCKET_POLL) {
                // A busy-polled receive spins on its rings; its socket (new rings, frames of
                // other peers) is looked at now and then: polling it costs a waker's
                // registration, a fifth of a round trip when done every time.
                // Between two looks through the runtime (a task switch and the poll of every
                // future the receive is selected with, ~0.3 us here) an entry waits unseen:
                // when no other task ran since the last look, the receive spins within this
                // poll instead, at most `BUSY_SPIN`.
                let alone =
                    last_look.is_some_and(|at: std::time::Instant| at.elapsed() < BUSY_ALONE);
                if alone && spin_on_rings(rings) {
                    return std::task::Poll::Ready(None);
                }
                let first_look = last_look.is_none();
                last_look = Some(std::time::Instant::now());
                if first_look {
                    // The wait's first look goes to the back of the run queue, not through a
                    // turn of the drivers: the tasks this one woke before it waited (a caller
                    // given its result) run first, and polled again within `BUSY_ALONE` it
                    // spins. A turn (an `epoll_wait` and the timers, often more than
                    // `BUSY_ALONE` on this project's VM) lay on the way of every reply the
                    // rpc dispatcher waited for: busy-polled `call_return` p50 at 64 B, `ferromq
                    // bench rpc --busy-poll --mode send,ovfl`, 2026-12-03, four runs of each build
                    // interleaved: 1.80-2.36 -> 1.52-1.82 us, streaming and 64 in flight unchanged.
                    // (The future a current-thread runtime blocks on gets a turn either way.)
                    cx.waker().wake_by_ref();
                    return std::task::Poll::Pending;
                }
                // Later looks are polled again after the runtime's next turn of its drivers
                // (tokio's `yield_now`), not at once: the tasks that yielded that way (a sender
                // waiting for ring room) run between two looks. Woken at once, this task never
                // left the run queue and they ran only at its looks at its socket, one in 16,
                // 2 us each with the spin: a busy-polled rpc caller streamed 25 % fewer calls.
                let _ = std::pin::pin!(tokio::task::yield_now()).poll(cx);
                return std::task::Poll::Pending;
            }
            if !busy_poll && asked_at.is_none() {
                // Spinning looks at the rings only: a frame (a new ring) can wait that long,
                // and a spin that entries end costs the socket nothing.
                if started.elapsed() < spin_for {
                    cx.waker().wake_by_ref();
                    return std::task::Poll::Pending;
                }
                asked_at = Some((started.elapsed(), crate::ring::monotonic_ns()));
                if !rings
                    .iter_mut()
                    .all(|adopted| adopted.ring.wait_for_doorbell())
                {
                    return std::task::Poll::Ready(None);
                }
            }
            if let std::task::Poll::Ready(received) = receive.as_mut().poll(cx) {
                return std::task::Poll::Ready(Some(received));
            }
            // The carrier wakes its receive when a connection ends; the safety net covers a
            // wake-up that does not come.
            if awaited.is_some_and(ferromq_zmq::PeerLink::is_gone) {
                return std::task::Poll::Ready(None);
            }
            if watch_rings && bell.is_some_and(|bell| bell.poll_rung(cx).is_ready()) {
                rung = true;
                return std::task::Poll::Ready(None);
            }
            if (watch_rings || awaited.is_some()) && safety_net.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(None);
            }
            std::task::Poll::Pending
        })
        .await;
        // How far apart entries come, unless the wait ended at once on a frame (a doorbell
        // still queued from the last wait): that tells nothing. A wait that slept counts from
        // its start to the doorbell its producer rang, not to this process's wake-up: a
        // sleeping wake-up takes longer than "short" on a busy host, and counted in, a
        // request/response pair that once went quiet would never spin again (every round
        // trip two sleeping wake-ups, ~230 us here, instead of ~12).
        // The same holds for the bell: a byte left from a wait whose entries were found first
        // ends the next wait at once, and no producer rang since this one asked.
        let waited = started.elapsed();
        let until_rung = asked_at.and_then(|(spun, asked_ns)| {
            let rung_at = rings
                .iter()
                .map(|adopted| adopted.ring.rung_at())
                .filter(|&rung_at| rung_at >= asked_ns)
                .max()?;
            Some(spun + Duration::from_nanos(rung_at - asked_ns))
        });
        let stale = if rung {
            until_rung.is_none()
        } else {
            received.is_some() && waited < RING_STALE_FRAME
        };
        if !stale {
            // Found while spinning: the spin caught it. Otherwise the wait slept (after a spin
            // that missed, or none), as long as it took the entries to come.
            let outcome = if spinning && asked_at.is_none() {
                WaitOutcome::CaughtSpinning
            } else {
                WaitOutcome::Slept {
                    spun: spinning,
                    waited: until_rung.map_or(waited, |until_rung| until_rung.min(waited)),
                }
            };
            spin.record(outcome);
        }
        received
    }
}

/// How long a consumer waiting for a doorbell sleeps at most before it looks at its rings
/// again: a safety net for a doorbell lost with its connection (a producer killed between
/// publishing an entry and writing the doorbell), never the way entries are noticed.
const DOORBELL_SAFETY_NET: Duration = Duration::from_millis(100);

/// A busy-polled receive with rings polls its socket once in this many looks at its rings.
const BUSY_POLLS_PER_SOCKET_POLL: u32 = 16;

/// How long a busy-polled receive looks at its rings within one poll before it lets the
/// runtime's other tasks run (see `RingWait::or_socket`): within a poll a look is a load of a
/// ring's tail. Busy-polled req/rep round trips, `ferromq bench --latency --busy-poll
/// --transport shmem --msg-size 64,1048576`, 2026-11-28 on this project's 2-core machine, three
/// runs of each build interleaved: 1.94-2.00 -> 1.67-1.75 us p50 at 64 B, 2.09-2.10 ->
/// 1.70-1.78 us at 1 MiB.
const BUSY_SPIN: Duration = Duration::from_micros(2);

/// A busy-polled receive polled again within this long of its last look finds that no other
/// task ran meanwhile (the runtime's own turn takes ~0.3-0.5 us here), and only then spins.
const BUSY_ALONE: Duration = Duration::from_micros(1);

/// Spins on `rings` for at most [`BUSY_SPIN`]; true when one has an entry.
fn spin_on_rings(rings: &mut [AdoptedRing]) -> bool {
    let started = std::time::Instant::now();
    loop {
        for _ in 0..32 {
            if rings.iter_mut().any(|adopted| adopted.ring.has_entries()) {
                return true;
            }
        }
        if started.elapsed() >= BUSY_SPIN {
            return false;
        }
    }
}

/// The most messages taken from one ring at a time.
const RING_RUN: usize = 32;

/// The most frames a closing receiver reads from its carrier looking for ring announcements it
/// has not read ([`ShmSocket::adopt_unread_rings`]): far more than a receiver's rings announce
/// (one frame each) and their doorbells leave queued.
const UNREAD_AT_CLOSE: usize = 4096;

/// The frames of one message from a ring carrier `socket` of type `socket_type`, each with the
/// peer it came from where the carrier says: a req's or rep's messages come behind their peer's
/// identity.
fn carried_frames(
    socket: &ZmqSocket,
    socket_type: SocketType,
    received: Parts,
) -> impl Iterator<Item = (Option<Bytes>, Bytes)> + use<> {
    let envelopes =
        socket.reports_peers() && matches!(socket_type, SocketType::Req | SocketType::Rep);
    let mut frames = received.into_iter().map(Message::into_bytes);
    let peer = if envelopes { frames.next() } else { None };
    frames.map(move |frame| (peer.clone(), frame))
}

/// A wait that a frame ends within this was ended by a frame already queued.
const RING_STALE_FRAME: Duration = Duration::from_micros(5);

fn transport_error(
    label: &ChannelLabel,
    error: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::Transport {
        channel: label.clone(),
        source: Box::new(error),
    }
}

impl ShmSocket {
    pub(crate) async fn new(
        session: Arc<Session>,
        config: &ChannelConfig,
        socket_name: &str,
    ) -> Result<ShmSocket> {
        let mut label = ChannelLabel::new(socket_name, config.socket_type);
        label.address = config.address.clone();
        // Every process with a shmem socket holds its own segment from the start, receivers
        // included: that makes it a live member of the session, so a sender that exits before
        // this process mapped the sender's memory leaves that memory in place instead of
        // removing the session's objects (see `cleanup.rs`).
        session
            .own_segment()
            .await
            .map_err(|error| transport_error(&label, error))?;
        let sent = match config.socket_type {
            SocketType::Push | SocketType::Pair => session
                .sent_counter()
                .await
                .map_err(|error| transport_error(&label, error))?,
            _ => None,
        };
        let delivery = sent
            .as_ref()
            .map_or(DeliveryRef::NONE, SentCounter::reference);
        let inner = match config.socket_type {
            SocketType::Pub => {
                let mut router = zeromq::RouterSocket::new();
                let peers = Arc::new(PublisherPeers {
                    state: crate::lock::ShortLock::new(PeersState {
                        events: router.monitor(),
                        subscribers: Vec::new(),
                        joined: Vec::new(),
                    }),
                });
                session.watch_producer(&peers);
                Inner::Publisher(Publisher {
                    peers,
                    out: PublisherOut {
                        router,
                        in_flight: Arc::default(),
                        doorbell: Bytes::from(wire::frame_header(
                            session.hash,
                            DeliveryRef::NONE,
                            0,
                        )),
                        entry: Vec::new(),
                        // The first send looks.
                        n_sends_since_subscriptions: SUBSCRIPTIONS_EVERY,
                        subscriptions_looked_at: None,
                    },
                })
            }
            SocketType::Sub => Inner::Subscriber(SubscriberSide {
                dealers: Vec::new(),
                topics: Vec::new(),
                next_dealer: 0,
            }),
            SocketType::Push => Inner::Batched(BatchedPush::start(
                ring_carrier(&session, config, socket_name)?,
                Arc::clone(&session),
                delivery,
                config.snd_buf_size,
            )),
            SocketType::Pair => Inner::Pair(PairSide {
                socket: ring_carrier(&session, config, socket_name)?,
                carriage: Carriage::Undecided,
                ring: {
                    let ring = Arc::new(RingSlot::new());
                    session.watch_producer(&ring);
                    ring
                },
                doorbell: Arc::from(wire::frame_header(session.hash, delivery, 0)),
                entry: Vec::new(),
                next_link: None,
            }),
            SocketType::Req | SocketType::Rep => Inner::ReqRep(ReqRepSide {
                socket: ring_carrier(&session, config, socket_name)?,
                carriage: Carriage::Undecided,
                connections: Vec::new(),
                next_connection: 0,
                peer: None,
                doorbell: Arc::from(wire::frame_header(session.hash, delivery, 0)),
                entry: Vec::new(),
            }),
            _ => Inner::Plain(descriptor_carrier(&session).create_zmq_socket(config, socket_name)?),
        };
        Ok(ShmSocket {
            label,
            session,
            inner,
            sent,
            window: config.snd_buf_size,
            pending: VecDeque::new(),
            frames: VecDeque::new(),
            seen_memory: Vec::new(),
            scratch: Vec::new(),
            decoded: wire::decode_scratch(),
            last_segment: None,
            last_taken: None,
            n_foreign_frames: 0,
            ring_error: None,
            figures: Arc::default(),
            rings: Vec::new(),
            next_ring: 0,
            next_ring_id: 0,
            entry: Vec::new(),
            busy_poll: config.busy_poll,
            ring_spin: SpinPolicy::of_spin_us(config.spin_us),
            bell: None,
        })
    }
}

/// The carrier socket of a push, pair, req or rep: it reports its connections, each of which
/// gets a descriptor ring (see `ring.rs`).
fn ring_carrier(session: &Session, config: &ChannelConfig, socket_name: &str) -> Result<ZmqSocket> {
    let mut socket = descriptor_carrier(session).create_zmq_socket(config, socket_name)?;
    socket.report_new_peers();
    Ok(socket)
}

/// The zeromq transport as the carrier of this session's descriptor frames: its sockets announce
/// shmem and the session, and serve only shmem peers of the same session.
fn descriptor_carrier(session: &Session) -> ferromq_zmq::ZmqTransport {
    ferromq_zmq::ZmqTransport::own_zmtp_with_peer_rules(ferromq_zmq::PeerRules {
        transport: crate::ShmTransport::NAME,
        scope: Some(session.hash),
        serves_plain_zeromq: false,
    })
}

/// The descriptor of a part that needs no block made for it: one small enough to travel
/// inline (at most `inline_max` bytes, wherever it lies, but a region's range: its creator's
/// callback says when the receiver is done with it), or one in this session's shared memory.
/// `None` for a part that must be copied into a block.
fn describe_as_is(session: &Session, message: &Message) -> Option<PartRef> {
    describe_part(session, message, shm_buffer_of(message))
}

/// [`describe_as_is`] for a message whose shared-memory handle (`shm`, from [`shm_buffer_of`])
/// the caller has already looked for.
fn describe_part(session: &Session, message: &Message, shm: Option<&ShmBuffer>) -> Option<PartRef> {
    if fits_inline(session, message, shm) {
        return Some(PartRef::Inline(crate::small::InlineBytes::copy_of(
            message.data(),
        )));
    }
    session.describe_buffer(shm?, message.len())
}

/// The shared-memory handle a message holds, if any.
fn shm_buffer_of(message: &Message) -> Option<&ShmBuffer> {
    message.buffer()?.as_any().downcast_ref::<ShmBuffer>()
}

/// Whether [`describe_as_is`] copies `message` into its descriptor. A short message in a block
/// travels so too (an rpc frame holding one call: 1.29 -> 1.64 M calls/s unaggregated): its
/// block is released by the sender, in its own process, instead of adopted by the receiver.
fn travels_inline(session: &Session, message: &Message) -> bool {
    fits_inline(session, message, shm_buffer_of(message))
}

/// [`travels_inline`] for a message whose shared-memory handle the caller has already looked
/// for: short enough, and no region's range (whose creator must see the receiver's release).
fn fits_inline(session: &Session, message: &Message, shm: Option<&ShmBuffer>) -> bool {
    message.len() <= session.options.inline_max && !shm.is_some_and(ShmBuffer::is_region)
}

/// Whether a sent `message` travelled as a reference to its memory, which then belongs to the
/// receiver: [`describe_as_is`] described it as this session's block or region.
fn travels_by_reference(session: &Session, message: &Message) -> bool {
    !travels_inline(session, message) && session.describe(message).is_some()
}

/// Whether `message` must be copied into a block of its own to travel ([`describe_as_is`] has
/// no descriptor for it).
fn needs_block(session: &Session, message: &Message) -> bool {
    !travels_inline(session, message) && session.describe(message).is_none()
}

/// One descriptor record for `parts`, copying each part that needs a block into the next of
/// `blocks` (one per such part, in order, as [`needs_block`] picks them); the blocks come back
/// with the record.
fn describe_into(
    session: &Session,
    parts: &Parts,
    blocks: Vec<ShmBuffer>,
) -> (Vec<PartRef>, Vec<ShmBuffer>) {
    let mut record = Vec::with_capacity(parts.len());
    let mut blocks = blocks.into_iter();
    let mut fresh = Vec::new();
    for message in parts {
        if let Some(part) = describe_as_is(session, message) {
            record.push(part);
            continue;
        }
        let mut buffer = blocks
            .next()
            .expect("describe_as_is and needs_block agree on which parts need a block");
        record.push(copy_into(&mut buffer, message));
        fresh.push(buffer);
    }
    (record, fresh)
}

/// One descriptor record for `parts`, plus the blocks made for heap parts, waiting for room in
/// the segment as allocation does. (A free function: the future must not hold the socket, whose
/// inner zeromq socket is not `Sync`.)
async fn describe(
    session: &Session,
    label: &ChannelLabel,
    parts: &Parts,
) -> Result<(Vec<PartRef>, Vec<ShmBuffer>)> {
    let mut blocks = Vec::new();
    for message in parts.iter().filter(|message| needs_block(session, message)) {
        let block = session
            .allocate(message.len())
            .await
            .map_err(|error| transport_error(label, error))?;
        blocks.push(block);
    }
    Ok(describe_into(session, parts, blocks))
}

/// [`describe`] without waiting: a heap part is copied into a block only if this process's
/// segment has room now (a send through a reservation must not wait).
fn describe_now(
    session: &Session,
    label: &ChannelLabel,
    parts: &Parts,
) -> Result<(Vec<PartRef>, Vec<ShmBuffer>)> {
    let blocks = parts
        .iter()
        .filter(|message| needs_block(session, message))
        .map(|message| session.allocate_now(message.len()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|error| transport_error(label, error))?;
    Ok(describe_into(session, parts, blocks))
}

/// Copies `message` into the new block `buffer` and describes it.
fn copy_into(buffer: &mut ShmBuffer, message: &Message) -> PartRef {
    let target =
        ferromq_core::MessageBuffer::as_bytes_mut(buffer).expect("a new block has one owner");
    target[..message.len()].copy_from_slice(message.data());
    record_copy(message.len());
    PartRef::Block {
        segment: ObjectRef::of(buffer.segment().name()),
        range: WireRange {
            offset: buffer.data_offset() as u64,
            size: message.len() as u64,
        },
        header: buffer.header_at(),
    }
}

impl ShmSocket {
    /// Waits (at most `timeout`) until fewer than `sndBufSize` of this socket's messages are in
    /// flight. A push whose zeromq socket failed (a refused peer) says so at once, also while
    /// it waits: its receivers will take nothing, so the wait would only time out. Cancel-safe.
    async fn wait_for_window(&mut self, timeout: Option<Duration>) -> Result<()> {
        let push_state = match &self.inner {
            Inner::Batched(push) => Some(Arc::clone(&push.state)),
            _ => None,
        };
        let failure = || push_state.as_ref()?.failure();
        let peer_gone = |reason: String| Error::PeerGone {
            channel: self.label.clone(),
            reason,
        };
        if let Some(reason) = failure() {
            return Err(peer_gone(reason));
        }
        if let Some(sent) = &mut self.sent
            && !sent.has_room(self.window)
        {
            let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
            let waiting = self.figures.waiting();
            let room = sent
                .wait_for_room(
                    self.window,
                    deadline,
                    || failure().is_some(),
                    || self.inner.lost_in_gone_rings(),
                )
                .await;
            drop(waiting);
            if !room {
                return Err(match failure() {
                    Some(reason) => peer_gone(reason),
                    None => Error::Timeout {
                        channel: self.label.clone(),
                        after: timeout.unwrap_or_default(),
                    },
                });
            }
        }
        Ok(())
    }

    /// The counter this socket's receivers count its messages at (none for a socket that
    /// counts no deliveries).
    fn delivery(&self) -> DeliveryRef {
        self.sent
            .as_ref()
            .map_or(DeliveryRef::NONE, SentCounter::reference)
    }

    /// A message accepted for sending (queued or handed to zeromq): its references now belong
    /// to the receiver, and the delivery counter counts it as sent.
    fn hand_over(&mut self, parts: Parts, fresh: Vec<ShmBuffer>) {
        disarm(&self.session, parts, fresh);
        self.count_sent();
    }

    /// Counts a message handed over, for the delivery window and the figures.
    fn count_sent(&mut self) {
        if let Some(sent) = &mut self.sent {
            sent.note_sent(&self.figures);
        }
    }
}

/// Hands the references of the parts sent by reference (and of `fresh`, the blocks made for
/// copied parts) to the receiver: their handles must not release. Every other part was copied
/// (into its descriptor or a block of `fresh`) and is done here: dropped, its memory released
/// (a small message's buffer back to its spare list, `small.rs`; another session's block to
/// that session).
fn disarm(session: &Session, parts: Parts, fresh: Vec<ShmBuffer>) {
    parts
        .into_iter()
        .filter(|message| travels_by_reference(session, message))
        .for_each(disarm_message);
    fresh.into_iter().for_each(ShmBuffer::disarm);
}

/// Hands the reference of one part sent by reference to the receiver (its handle must not
/// release it).
fn disarm_message(message: Message) {
    if let Ok((buffer, _)) = message.into_buffer()
        && let Ok(buffer) = buffer.into_any().downcast::<ShmBuffer>()
    {
        buffer.disarm_boxed();
    }
}

/// The blocks and regions of `parts` sent by reference.
fn shm_buffers<'a>(session: &'a Session, parts: &'a Parts) -> impl Iterator<Item = &'a ShmBuffer> {
    parts
        .iter()
        .filter(|message| travels_by_reference(session, message))
        .filter_map(|message| message.buffer()?.as_any().downcast_ref::<ShmBuffer>())
}

fn topic_matches(topics: &[Vec<u8>], first_part: &[u8]) -> bool {
    topics.is_empty() || topics.iter().any(|topic| first_part.starts_with(topic))
}

/// What became of one frame a publisher handed to zmq.rs for one subscriber.
enum FrameSent {
    Queued,
    /// The subscriber's queue is full.
    Full,
    /// The subscriber is gone.
    Gone,
}

/// What a publisher's subscribers get of one message.
struct PreparedMessage {
    /// A descriptor frame, for subscribers without a ring (empty when all have one).
    frame: Bytes,
    /// The ring entry (with the block holding a record too large for an entry), when a
    /// subscriber has a ring.
    ring_entry: Option<(EntryKind, Option<ShmBuffer>)>,
}

impl PublisherOut {
    /// Takes in connection events and subscription messages that arrived since the last send.
    /// A new subscriber gets a descriptor ring in this process's segment, announced to it
    /// alone; a subscriber that disconnected is forgotten with its ring.
    fn refresh(&mut self, session: &Arc<Session>, peers: &mut PeersState) {
        peers.take_events();
        for identity in std::mem::take(&mut peers.joined) {
            self.add_subscriber(session, peers, identity);
        }
        // Subscriptions are looked for now and then only (zmq.rs allocates for each
        // receive): a subscriber filters what it gets anyway, so a late one costs only
        // bandwidth. A new subscriber's first subscription is looked for at once.
        self.n_sends_since_subscriptions += 1;
        if self.n_sends_since_subscriptions < SUBSCRIPTIONS_EVERY {
            return;
        }
        self.n_sends_since_subscriptions = 0;
        let now = std::time::Instant::now();
        if self
            .subscriptions_looked_at
            .is_some_and(|looked_at| now < looked_at + SUBSCRIPTIONS_PAUSE)
        {
            return;
        }
        self.subscriptions_looked_at = Some(now);
        while let Some(Ok(message)) = self.router.recv().now_or_never() {
            let mut frames = message.into_vec().into_iter();
            let (Some(identity), Some(tag)) = (frames.next(), frames.next()) else {
                continue;
            };
            if tag != SUBSCRIBE_TAG {
                continue;
            }
            // Only a connected subscriber's: one whose connection event has not come yet gets
            // everything and filters it, and one that left already (its hello read after its
            // disconnection) must not come back as a ring nobody reads, whose entries would
            // hold their blocks for ever.
            if let Some(known) = peers
                .subscribers
                .iter_mut()
                .find(|known| known.identity == identity)
            {
                known.topics = Some(frames.map(|topic| topic.to_vec()).collect());
            }
        }
    }

    /// Adds the subscriber `identity`, which connected, with its ring, unless it is known.
    fn add_subscriber(&mut self, session: &Arc<Session>, peers: &mut PeersState, identity: Bytes) {
        if peers
            .subscribers
            .iter()
            .any(|known| known.identity == identity)
        {
            return;
        }
        let ring = match new_ring(session, DeliveryRef::NONE) {
            Ok((ring, announce)) => {
                match self.send_frame(&identity, Bytes::from(announce)) {
                    FrameSent::Queued => Some(ring),
                    // Never adopted: the consumer's reference goes back with the ring.
                    FrameSent::Full | FrameSent::Gone => {
                        ring.block().release_references(1);
                        None
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "no room for a subscriber's descriptor ring: its descriptors travel in frames");
                None
            }
        };
        peers.subscribers.push(SubscriberPeer {
            identity,
            topics: None,
            ring,
            session: Arc::clone(session),
        });
        // Its first subscription follows soon: the next send looks for it.
        self.n_sends_since_subscriptions = SUBSCRIPTIONS_EVERY;
        self.subscriptions_looked_at = None;
    }

    /// Hands `frame` to zmq.rs for the subscriber `identity`, without waiting.
    fn send_frame(&mut self, identity: &Bytes, frame: Bytes) -> FrameSent {
        let tracked = self.in_flight.track(frame.clone(), frame.len());
        let message = ZmqMessage::try_from(vec![identity.clone(), tracked]).expect("two frames");
        match self.router.send(message).now_or_never() {
            Some(Ok(())) => FrameSent::Queued,
            Some(Err(_)) => FrameSent::Gone,
            None => FrameSent::Full,
        }
    }

    /// Writes `entry` into the ring of subscriber `subscriber_idx` and publishes it, ringing
    /// its doorbell when it waits; false when the ring is full.
    fn push_to_ring(&mut self, subscriber: &mut SubscriberPeer, kind: EntryKind) -> bool {
        let ring = subscriber.ring.as_mut().expect("a subscriber with a ring");
        let wake = match ring.push(kind, &self.entry) {
            Pushed::Full => return false,
            Pushed::Published(wake) => wake,
            // No task publishes later for a publisher: every entry is published at once.
            Pushed::Unpublished { .. } => ring.publish(),
        };
        if ring.ring_bell_or_need_frame(wake) {
            let identity = subscriber.identity.clone();
            // A doorbell that finds the queue full is not needed: the subscriber has frames
            // to read, and looks at its rings after them.
            let _ = self.send_frame(&identity, self.doorbell.clone());
        }
        true
    }

    /// Closes every subscriber's ring (they still take what it holds), ringing the doorbells
    /// of those that wait.
    fn close_rings(&mut self, peers: &mut PeersState) {
        for subscriber in &mut peers.subscribers {
            let Some(mut ring) = subscriber.ring.take() else {
                continue;
            };
            let (wake, _) = subscriber.session.finish_producing(&mut ring, None);
            if ring.ring_bell_or_need_frame(wake) {
                let identity = subscriber.identity.clone();
                let _ = self.send_frame(&identity, self.doorbell.clone());
            }
        }
    }
}

impl PublisherOut {
    /// Takes in what happened since the last send (see [`Publisher::refresh`]) and makes what
    /// the subscribers get of the message `record` describes: its ring entry, and a frame only
    /// when a subscriber has no ring.
    ///
    /// # Errors
    /// A record too large for a ring entry found no room for its block.
    fn prepare(
        &mut self,
        session: &Arc<Session>,
        peers: &mut PeersState,
        record: &[PartRef],
    ) -> std::result::Result<PreparedMessage, crate::error::ShmError> {
        self.refresh(session, peers);
        let frame = if peers.subscribers.iter().all(|known| known.ring.is_some()) {
            Bytes::new()
        } else {
            let mut frame = wire::frame_header(session.hash, DeliveryRef::NONE, 32);
            wire::append_record(&mut frame, record);
            wire::set_record_count(&mut frame, 1);
            Bytes::from(frame)
        };
        let mut ring_entry_kind = None;
        if peers.subscribers.iter().any(|known| known.ring.is_some()) {
            let mut entry = std::mem::take(&mut self.entry);
            let made = ring_entry(session, record, &mut entry);
            self.entry = entry;
            ring_entry_kind = Some(made?);
        }
        Ok(PreparedMessage {
            frame,
            ring_entry: ring_entry_kind,
        })
    }

    /// Sends a publisher's message (prepared by [`Publisher::prepare`], with the blocks made
    /// for it in `fresh`) to every subscriber whose topics it matches, without waiting: into each
    /// subscriber's ring, or a frame for one without a ring. A subscriber whose ring or queue
    /// is full misses it, as with ZeroMQ's PUB.
    fn publish(
        &mut self,
        session: &Session,
        peers: &mut PeersState,
        figures: &ferromq_core::SendFigures,
        parts: Parts,
        fresh: Vec<ShmBuffer>,
        prepared: PreparedMessage,
    ) {
        let PreparedMessage {
            frame,
            ring_entry: ring_entry_kind,
        } = prepared;
        // Topics are matched against the first part where it lies: no copy.
        let first_part = parts.get(0).map(Message::data).unwrap_or_default();
        let mut gone = Vec::new();
        // The first subscriber that takes the message gets the publisher's own references;
        // each further one a reference added for it.
        let mut n_delivered = 0usize;
        for subscriber_idx in 0..peers.subscribers.len() {
            let subscriber = &mut peers.subscribers[subscriber_idx];
            if !subscriber
                .topics
                .as_deref()
                .is_none_or(|topics| topic_matches(topics, first_part))
            {
                continue;
            }
            let indirect = ring_entry_kind
                .as_ref()
                .and_then(|(_, indirect)| indirect.as_ref());
            let buffers = || {
                shm_buffers(session, &parts)
                    .chain(fresh.iter())
                    .chain(indirect)
            };
            let adds_references = n_delivered > 0;
            if adds_references {
                buffers().for_each(|buffer| buffer.add_references(1));
            }
            let delivered = match (&ring_entry_kind, subscriber.ring.is_some()) {
                (Some((kind, _)), true) => self.push_to_ring(subscriber, *kind),
                _ => {
                    let identity = subscriber.identity.clone();
                    match self.send_frame(&identity, frame.clone()) {
                        FrameSent::Queued => true,
                        FrameSent::Gone => {
                            gone.push(subscriber_idx);
                            false
                        }
                        FrameSent::Full => false,
                    }
                }
            };
            if delivered {
                n_delivered += 1;
                continue;
            }
            if gone.last() != Some(&subscriber_idx) {
                // Queue or ring full: a slow subscriber misses this message, as with
                // ZeroMQ's PUB.
                figures
                    .dropped_for_slow_subscribers
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if adds_references {
                buffers().for_each(|buffer| buffer.release_references(1));
            }
        }
        for subscriber_idx in gone.into_iter().rev() {
            peers.subscribers.remove(subscriber_idx);
        }
        let indirect = ring_entry_kind.and_then(|(_, indirect)| indirect);
        if n_delivered > 0 {
            // The publisher's own references went to the first subscriber.
            disarm(session, parts, fresh.into_iter().chain(indirect).collect());
        }
        // Otherwise nobody took the message: its references go with `parts`, `fresh` and the
        // entry's block here.
    }
}

impl Publisher {
    /// Sends the message `record` describes ([`PublisherOut::prepare`], then
    /// [`PublisherOut::publish`]) under one hold of the subscribers' lock; `parts` come back
    /// with the error when a record too large for a ring entry found no room for its block.
    fn send(
        &mut self,
        session: &Arc<Session>,
        figures: &ferromq_core::SendFigures,
        record: &[PartRef],
        (parts, fresh): (Parts, Vec<ShmBuffer>),
    ) -> std::result::Result<(), Box<(crate::error::ShmError, Parts)>> {
        let mut peers = self.peers.state.lock();
        match self.out.prepare(session, &mut peers, record) {
            Ok(prepared) => {
                self.out
                    .publish(session, &mut peers, figures, parts, fresh, prepared);
                Ok(())
            }
            Err(error) => Err(Box::new((error, parts))),
        }
    }

    /// [`PublisherOut::close_rings`].
    fn close_rings(&mut self) {
        self.out.close_rings(&mut self.peers.state.lock());
    }
}

impl SubscriberSide {
    fn hello(&self) -> ZmqMessage {
        let mut frames = vec![Bytes::from_static(SUBSCRIBE_TAG)];
        frames.extend(self.topics.iter().map(|topic| Bytes::from(topic.clone())));
        ZmqMessage::try_from(frames).expect("the tag frame is always there")
    }

    async fn announce(&mut self) {
        let hello = self.hello();
        for dealer in &mut self.dealers {
            // Best effort: a publisher that misses it sends everything, and we filter.
            let _ = dealer.send(hello.clone()).now_or_never();
        }
    }
}

#[async_trait]
impl Socket for ShmSocket {
    fn label(&self) -> &ChannelLabel {
        &self.label
    }

    async fn bind(&mut self, address: &Address) -> Result<Address> {
        let bound = match &mut self.inner {
            Inner::Plain(socket) => socket.bind(address).await?,
            Inner::Pair(pair) => {
                let bound = pair.socket.bind(address).await?;
                pair.attached();
                bound
            }
            Inner::ReqRep(req_rep) => {
                let bound = req_rep.socket.bind(address).await?;
                req_rep.attached();
                bound
            }
            Inner::Batched(push) => {
                push.call(&self.label, |reply| {
                    PushCommand::Bind(address.clone(), reply)
                })
                .await?
            }
            Inner::Publisher(publisher) => {
                bind(&mut publisher.out.router, &self.label, address)
                    .await?
                    .0
            }
            Inner::Subscriber(subscriber) => {
                let mut dealer = zeromq::DealerSocket::new();
                let (bound, _) = bind(&mut dealer, &self.label, address).await?;
                subscriber.dealers.push(dealer);
                bound
            }
        };
        self.label.address = Some(bound.to_string());
        Ok(bound)
    }

    async fn connect(&mut self, address: &Address) -> Result<()> {
        let connect_error = |label: &ChannelLabel, error: zeromq::ZmqError| Error::Connect {
            channel: label.clone().with_address(address.to_string()),
            source: Box::new(error),
        };
        match &mut self.inner {
            Inner::Plain(socket) => socket.connect(address).await?,
            Inner::Pair(pair) => {
                pair.socket.connect(address).await?;
                pair.attached();
            }
            Inner::ReqRep(req_rep) => {
                req_rep.socket.connect(address).await?;
                req_rep.attached();
            }
            Inner::Batched(push) => {
                push.call(&self.label, |reply| {
                    PushCommand::Connect(address.clone(), reply)
                })
                .await?
            }
            Inner::Publisher(publisher) => {
                let endpoint = connect_endpoint(&self.label, address)?;
                publisher
                    .out
                    .router
                    .connect(&endpoint)
                    .await
                    .map_err(|error| connect_error(&self.label, error))?;
            }
            Inner::Subscriber(subscriber) => {
                let endpoint = connect_endpoint(&self.label, address)?;
                let mut dealer = zeromq::DealerSocket::new();
                dealer
                    .connect(&endpoint)
                    .await
                    .map_err(|error| connect_error(&self.label, error))?;
                subscriber.dealers.push(dealer);
                subscriber.announce().await;
            }
        }
        self.label.address = Some(address.to_string());
        Ok(())
    }

    fn try_send_parts(&mut self, parts: Parts) -> std::result::Result<(), Parts> {
        // Only a push socket's outbox, a pair's, req's or rep's ring and a publisher take a
        // message without waiting, and only one whose parts all lie in this session's memory
        // or travel inline: nothing to allocate.
        let counts_deliveries = matches!(self.inner, Inner::Batched(_) | Inner::Pair(_));
        let req_rep_rings = matches!(
            &self.inner,
            Inner::ReqRep(req_rep) if req_rep.carriage == Carriage::Rings
        );
        if !counts_deliveries && !req_rep_rings && !matches!(self.inner, Inner::Publisher(_)) {
            return Err(parts);
        }
        if let Some(sent) = &mut self.sent
            && !sent.has_room_now(self.window, || self.inner.lost_in_gone_rings())
        {
            return Err(parts);
        }
        let delivery = self.delivery();
        let record = &mut self.scratch;
        record.clear();
        // Each part's handle is looked for once; those sent by reference are handed on below.
        let mut by_reference = smallvec::SmallVec::<[&ShmBuffer; 2]>::new();
        let described = parts.iter().all(|message| {
            let shm = shm_buffer_of(message);
            describe_part(&self.session, message, shm)
                .map(|part| {
                    if !matches!(part, PartRef::Inline(_))
                        && let Some(shm) = shm
                    {
                        by_reference.push(shm);
                    }
                    record.push(part);
                })
                .is_some()
        });
        // Anything else (a part to copy, no room, no peer, ...) goes the waiting way, which
        // waits or says why.
        let taken = described
            && match &mut self.inner {
                Inner::Batched(push) => {
                    !push.state.failed.load(Ordering::Acquire)
                        && push.state.offer(record, push.capacity)
                }
                Inner::Pair(pair) => matches!(
                    pair.offer(&self.session, delivery, record),
                    Ok(RingOffer::Written)
                ),
                // In turn only: the waiting way names the mistake.
                Inner::ReqRep(req_rep) => {
                    req_rep.out_of_turn().is_none()
                        && matches!(
                            req_rep.offer(&self.session, record, &self.label),
                            Ok(RingOffer::Written)
                        )
                }
                Inner::Publisher(publisher) => {
                    drop(by_reference);
                    return publisher
                        .send(&self.session, &self.figures, record, (parts, Vec::new()))
                        .map_err(|refused| refused.1);
                }
                _ => false,
            };
        if !taken {
            drop(by_reference);
            return Err(parts);
        }
        // The receiver holds these references now. Marked in place, without moving the
        // parts: right after the descriptor's stores to lines the receiver reads, a move's
        // load waited for those stores to leave the core (a fifth of a busy 64 KiB sender's
        // time, perf).
        for shm in by_reference {
            shm.hand_on();
        }
        drop(parts);
        self.count_sent();
        Ok(())
    }

    async fn reserve_send(&mut self) -> Result<bool> {
        // Push only: its outbox and delivery window are the room; the other patterns hand
        // their frames to a zeromq socket that cannot promise room ahead.
        if !matches!(self.inner, Inner::Batched(_)) {
            return Ok(false);
        }
        self.wait_for_window(None).await?;
        if let Inner::Batched(push) = &self.inner {
            push.wait_for_room().await;
        }
        Ok(true)
    }

    fn send_reserved(&mut self, parts: Parts) -> std::result::Result<(), SendError<Parts>> {
        let Inner::Batched(push) = &self.inner else {
            return Err(SendError::new(
                Error::Unsupported {
                    channel: self.label.clone(),
                    operation: "send through a reservation",
                    reason: "only a shmem push reserves room ahead of a send",
                },
                parts,
            ));
        };
        if let Some(reason) = push.state.failure() {
            let error = Error::PeerGone {
                channel: self.label.clone(),
                reason,
            };
            return Err(SendError::new(error, parts));
        }
        let (record, fresh) = match describe_now(&self.session, &self.label, &parts) {
            Ok(described) => described,
            Err(error) => return Err(SendError::new(error, parts)),
        };
        // The room was reserved and nothing else puts records into this outbox meanwhile.
        let accepted = push.state.offer(&record, push.capacity);
        debug_assert!(accepted, "a reserved outbox has room");
        if !accepted {
            let error = Error::Unsupported {
                channel: self.label.clone(),
                operation: "send through a reservation",
                reason: "no room was reserved on this channel (Channel::reserve first)",
            };
            return Err(SendError::new(error, parts));
        }
        self.hand_over(parts, fresh);
        Ok(())
    }

    fn send_figures(&self) -> Option<Arc<ferromq_core::SendFigures>> {
        let sends = self.sent.is_some() || matches!(self.inner, Inner::Publisher(_));
        sends.then(|| Arc::clone(&self.figures))
    }

    fn try_receive_parts(&mut self) -> Option<Parts> {
        if self.pending.is_empty() && !self.rings.is_empty() && self.ring_error.is_none() {
            // Memory to map is the waiting receive's to handle, and so are errors: kept for it,
            // since an entry that failed after it was taken (a message that could not be
            // made of it) is not there for it to find again.
            if let Err((ring_idx, error)) = self.take_from_rings() {
                self.ring_error = Some((self.rings[ring_idx].id, error));
            }
        }
        let Received {
            parts, taken, peer, ..
        } = loop {
            let mut received = self.pending.pop_front()?;
            if let Some(entry) = received.entry.take() {
                self.give_up(entry, !received.filtered);
            }
            if !received.filtered {
                break received;
            }
            // A filtered record's messages are released here, out of the ring.
        };
        if let Some(taken) = taken {
            taken.count_taken();
        }
        if let Inner::ReqRep(req_rep) = &mut self.inner {
            req_rep.received(peer);
        }
        Some(parts)
    }

    async fn send_parts(
        &mut self,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        // Back-pressure first, before any block is made: waiting here is cancel-safe.
        if let Err(error) = self.wait_for_window(timeout).await {
            return Err(SendError::new(error, parts));
        }
        let (record, fresh) = match describe(&self.session, &self.label, &parts).await {
            Ok(described) => described,
            Err(error) => return Err(SendError::new(error, parts)),
        };
        let delivery = self.delivery();
        // A pair writes into its connection's ring when it has one (frames below otherwise).
        if let Inner::Pair(pair) = &mut self.inner {
            let sent = RingSender::Pair(pair)
                .send(
                    (&self.session, delivery),
                    &record,
                    (&self.label, &self.figures),
                    timeout,
                )
                .await;
            match sent {
                Ok(true) => {
                    self.hand_over(parts, fresh);
                    return Ok(());
                }
                Ok(false) => {}
                Err(error) => return Err(SendError::new(error, parts)),
            }
        }
        match &mut self.inner {
            Inner::Batched(push) => {
                let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
                if !push.put(&record, deadline).await {
                    let error = match push.state.failure() {
                        Some(reason) => Error::PeerGone {
                            channel: self.label.clone(),
                            reason,
                        },
                        None => Error::Timeout {
                            channel: self.label.clone(),
                            after: timeout.unwrap_or_default(),
                        },
                    };
                    return Err(SendError::new(error, parts));
                }
                self.hand_over(parts, fresh);
                Ok(())
            }
            Inner::ReqRep(req_rep) if req_rep.carriage == Carriage::Rings => {
                if let Some(operation) = req_rep.out_of_turn() {
                    let error = Error::WrongSocketType {
                        channel: self.label.clone(),
                        operation,
                    };
                    return Err(SendError::new(error, parts));
                }
                let sent = RingSender::ReqRep(req_rep)
                    .send(
                        (&self.session, delivery),
                        &record,
                        (&self.label, &self.figures),
                        timeout,
                    )
                    .await;
                match sent {
                    Ok(_) => {
                        self.hand_over(parts, fresh);
                        Ok(())
                    }
                    Err(error) => Err(SendError::new(error, parts)),
                }
            }
            // Descriptors in frames: inproc, or no room for a ring at the first connection.
            Inner::Plain(socket)
            | Inner::Pair(PairSide { socket, .. })
            | Inner::ReqRep(ReqRepSide { socket, .. }) => {
                let frame =
                    wire::encode(self.session.hash, delivery, std::slice::from_ref(&record));
                match socket
                    .send_parts(Parts::from(Message::from(frame)), timeout)
                    .await
                {
                    Ok(()) => {
                        self.hand_over(parts, fresh);
                        Ok(())
                    }
                    Err(failed) => Err(SendError::new(failed.error, parts)),
                }
            }
            Inner::Publisher(publisher) => publisher
                .send(&self.session, &self.figures, &record, (parts, fresh))
                .map_err(|refused| {
                    let (error, parts) = *refused;
                    SendError::new(transport_error(&self.label, error), parts)
                }),
            Inner::Subscriber(_) => Err(SendError::new(
                Error::WrongSocketType {
                    channel: self.label.clone(),
                    operation: "send",
                },
                parts,
            )),
        }
    }

    async fn receive_parts(&mut self) -> Result<Parts> {
        if let Inner::ReqRep(req_rep) = &self.inner
            && req_rep.carriage == Carriage::Rings
            && req_rep.is_req()
            && req_rep.peer.is_none()
            && self.pending.is_empty()
        {
            return Err(Error::WrongSocketType {
                channel: self.label.clone(),
                operation: "receive a reply before sending a request",
            });
        }
        loop {
            if let Some(parts) = self.try_receive_parts() {
                return Ok(parts);
            }
            if let Some((ring_id, error)) = self.ring_error.take() {
                // A ring that cannot be read is dropped (its producer is broken); nothing of
                // it is queued any more.
                self.rings.retain(|adopted| adopted.id != ring_id);
                return Err(error);
            }
            if !self.rings.is_empty() {
                match self.take_from_rings() {
                    Ok(FromRings::Queued) => continue,
                    Ok(FromRings::NeedsMapping(unseen)) => {
                        self.map_unseen(unseen).await?;
                        continue;
                    }
                    Ok(FromRings::Empty) => {}
                    Err((ring_idx, error)) => {
                        // A ring that cannot be read is dropped (its producer is broken);
                        // nothing is queued (`take_from_rings` keeps an error that comes after
                        // what it queued).
                        self.rings.remove(ring_idx);
                        return Err(error);
                    }
                }
            }
            if let Some(adopted) = self.adopt_queued_announcement(true).await {
                adopted?;
                continue;
            }
            if let Some((peer, frame)) = self.frames.front() {
                let (peer, frame) = (peer.clone(), frame.clone());
                let unseen = match decode_frame(
                    &frame,
                    self.session.hash,
                    &mut self.decoded,
                    &self.seen_memory,
                ) {
                    Ok(unseen) => unseen,
                    // Not a descriptor frame of this session: it comes from a peer that was
                    // refused when it connected (a plain ZeroMQ program, another session). A
                    // fan-in socket drops it and keeps serving its other peers.
                    Err(error)
                        if matches!(self.label.socket_type, SocketType::Pull | SocketType::Sub) =>
                    {
                        self.frames.pop_front();
                        self.n_foreign_frames += 1;
                        if self.n_foreign_frames.is_power_of_two() {
                            tracing::warn!(channel = %self.label, %error, n_frames = self.n_foreign_frames, "dropped frames that are not this session's descriptors");
                        }
                        continue;
                    }
                    Err(error) => {
                        self.frames.pop_front();
                        return Err(transport_error(&self.label, error));
                    }
                };
                // Peers' segments are opened off the async threads, the frame still queued.
                let mapped = self.map_unseen(unseen).await;
                self.frames.pop_front();
                mapped?;
                self.queue_decoded(peer.as_ref(), false)?;
                continue;
            }
            // A req's reply comes from the connection its request went by, or not at all once
            // that ended (its replier died): what the replier sent before was looked at above
            // (rings, frames), and its frames still queued in the socket are looked at once
            // more below.
            let awaited = match &self.inner {
                Inner::ReqRep(req_rep) => req_rep.awaited_link(),
                _ => None,
            };
            let gone_replier = awaited.clone().filter(|link| link.is_gone());
            let label = &self.label;
            let receive = match &mut self.inner {
                Inner::Plain(socket)
                | Inner::Pair(PairSide { socket, .. })
                | Inner::ReqRep(ReqRepSide { socket, .. }) => async move {
                    let received = socket.receive_unboxed().await?;
                    Ok(carried_frames(socket, label.socket_type, received).collect())
                }
                .left_future(),
                Inner::Subscriber(subscriber) if !subscriber.dealers.is_empty() => {
                    // Made when first polled: zmq.rs allocates for each receive, and a wait
                    // that its rings end first never gets that far.
                    async move {
                        let n_dealers = subscriber.dealers.len();
                        subscriber.next_dealer = (subscriber.next_dealer + 1) % n_dealers;
                        let start = subscriber.next_dealer;
                        let receives: Vec<_> = subscriber
                            .dealers
                            .iter_mut()
                            .enumerate()
                            .map(|(idx, dealer)| ((idx + n_dealers - start) % n_dealers, dealer))
                            .collect::<std::collections::BTreeMap<_, _>>()
                            .into_values()
                            .map(|dealer| dealer.recv().boxed())
                            .collect();
                        let (received, _, _) = futures::future::select_all(receives).await;
                        Ok(received
                            .map_err(|error| transport_error(label, error))?
                            .into_vec()
                            .into_iter()
                            .map(|frame| (None, frame))
                            .collect())
                    }
                    .right_future()
                }
                Inner::Subscriber(_) => {
                    return Err(Error::PeerGone {
                        channel: self.label.clone(),
                        reason: "the subscriber is neither bound nor connected".to_owned(),
                    });
                }
                Inner::Publisher(_) | Inner::Batched(_) => {
                    return Err(Error::WrongSocketType {
                        channel: self.label.clone(),
                        operation: "receive",
                    });
                }
            };
            if let Some(link) = gone_replier {
                // What the replier sent before the end is in the socket's inbox once the
                // connection's reader is done. A connection ends as soon as a write to it fails
                // (a link frame to a replier that closed), its reader possibly still at work:
                // a reply it still takes in ends the wait as well.
                let received = {
                    let mut receive = std::pin::pin!(receive);
                    if link.has_read_everything() {
                        receive.as_mut().now_or_never()
                    } else {
                        tokio::select! {
                            received = &mut receive => Some(received),
                            // One more pass looks at the rings (a reply rung by the bell) and
                            // the frames, then ends here.
                            () = link.everything_read() => continue,
                        }
                    }
                };
                if let Some(received) = received {
                    self.frames.extend(received?);
                    continue;
                }
                // The req may send its next request (to another replier, or to this one once
                // it is back).
                if let Inner::ReqRep(req_rep) = &mut self.inner {
                    req_rep.peer = None;
                }
                return Err(replier_gone(&link, &self.label));
            }
            let waited = RingWait {
                rings: &mut self.rings,
                busy_poll: self.busy_poll,
                spin: &mut self.ring_spin,
                bell: self.bell.as_ref(),
                awaited: awaited.as_deref(),
            }
            .or_socket(receive)
            .await;
            let frames: Vec<(Option<Bytes>, Bytes)> = match waited {
                Some(received) => received?,
                None => continue,
            };
            // Kept until processed: a receive cancelled while their memory is being mapped
            // loses nothing.
            self.frames.extend(frames);
        }
    }

    async fn subscribe(&mut self, topic: &[u8]) -> Result<()> {
        self.set_topic(topic, true).await
    }

    async fn unsubscribe(&mut self, topic: &[u8]) -> Result<()> {
        self.set_topic(topic, false).await
    }

    async fn close(&mut self, linger: Duration) -> Result<()> {
        if let Some((_, error)) = self.ring_error.take() {
            tracing::error!(
                channel = %self.label,
                %error,
                "a message of a ring could not be received before the close: its sender counts \
                 it as not taken"
            );
        }
        // A counting sender first waits until its receivers took everything it accepted;
        // `linger` bounds the silence, not the whole drain. Not for what the rings of dead or
        // finished receivers held: no receiver will take that (it is counted all the same).
        // `n_left_by_gone`: of those, what the rings of receivers that died or finished first
        // held, which was not waited for.
        let (n_untaken, n_left_by_gone) = match &self.sent {
            Some(sent) => {
                sent.wait_until_taken(linger, || self.inner.lost_in_gone_rings())
                    .await
            }
            None => (0, 0),
        };
        // Then, as late as the carrier is still open: what was handed over to this socket in
        // rings it has not adopted yet is counted with the rest (`finish_rings`, below),
        // including a ring that a pair's peer announced during that wait.
        self.adopt_unread_rings().await;
        // This socket's receiving side is done: it finishes with its rings before its carrier
        // closes, so that a sender that sees the connection end finds the ring finished and
        // counts what was left in it lost (`ConnectionRing::finish_gone`), not in flight for
        // good. The rings before what was taken from them (see `Drop for ShmSocket`).
        let n_lost = self.finish_rings();
        self.rings.clear();
        self.pending.clear();
        self.frames.clear();
        // What a receiver has not taken after that is handed over when its descriptor was
        // written to a receiver that is still there (stalled, or not receiving yet): the
        // descriptor waits in its socket and the session's memory outlives this process (see
        // `cleanup.rs`), so it will be taken. Only what no live receiver holds is lost. With a
        // receiver gone, the rings of those still there are handed over one by one
        // (`finish_rings_one_by_one`). `n_lost_at_hand_over`: what was handed over to receivers
        // that had already finished with their rings (`ConnectionRing::finish_at_close`), and,
        // ring by ring, what no ring held.
        let handed_over_or_lost = |label: &ChannelLabel, held: bool, n_lost_at_hand_over: u64| {
            if n_untaken == 0 {
                return Ok(());
            }
            if held && n_lost_at_hand_over > 0 {
                return Err(lost_at_hand_over(label, n_lost_at_hand_over));
            }
            if held {
                tracing::info!(channel = %label, n_messages = n_untaken, "handed over to receivers that have not taken them yet");
                return Ok(());
            }
            let reason = if n_left_by_gone == n_untaken {
                "their receivers left before taking them".to_owned()
            } else if n_left_by_gone > 0 {
                format!(
                    "{n_left_by_gone} of them were in the rings of receivers that left; the \
                     receivers took none of the others for linger = {linger:?}, and one of them \
                     is gone"
                )
            } else {
                format!(
                    "the receivers took none of them for linger = {linger:?} and one of them is gone"
                )
            };
            Err(Error::Undelivered {
                channel: label.clone(),
                n_messages: n_untaken,
                reason,
            })
        };
        // Whether the receivers hold what they did not take is asked before the rings are
        // finished: a ring handed over says so, and its consumer reports what it leaves
        // untaken (`ring.rs`).
        let mut held = n_untaken > 0
            && match &mut self.inner {
                Inner::Plain(socket)
                | Inner::Pair(PairSide { socket, .. })
                | Inner::ReqRep(ReqRepSide { socket, .. }) => socket.peers_hold_what_was_written(),
                _ => false,
            };
        // Rings are published and closed (their doorbells written by the socket's close); the
        // peers still take what they hold.
        let n_lost_at_hand_over: u64 = match &mut self.inner {
            // A pair whose earlier peer left (what it left is lost) hands what its current peer
            // has not taken over to it, if that one still holds it: only the rest is lost.
            Inner::Pair(pair) if n_untaken > 0 && !held => match pair.ring.take() {
                Some(connection) => {
                    held = true;
                    let sent = self.sent.as_ref();
                    finish_rings_one_by_one(vec![connection], || {
                        sent.map_or(0, SentCounter::in_flight)
                    })
                }
                None => 0,
            },
            Inner::Pair(pair) => pair
                .ring
                .take()
                .map_or(0, |connection| connection.finish_at_close(held)),
            Inner::ReqRep(req_rep) => req_rep
                .connections
                .drain(..)
                .filter_map(|connection| connection.ring.take())
                .map(|connection| connection.finish_at_close(held))
                .sum(),
            _ => 0,
        };
        let result = match &mut self.inner {
            Inner::Plain(socket)
            | Inner::Pair(PairSide { socket, .. })
            | Inner::ReqRep(ReqRepSide { socket, .. }) => match socket.close(linger).await {
                Ok(()) => handed_over_or_lost(&self.label, held, n_lost_at_hand_over),
                Err(error) => {
                    log_lost_at_hand_over(&self.label, n_lost_at_hand_over);
                    Err(error)
                }
            },
            // The task sends everything queued before the close, then closes with linger.
            Inner::Batched(push) => {
                // Queued descriptors wait for a peer; `linger` bounds how long. Past it the
                // batching task is stopped and the loss reported, so closing never hangs on a
                // receiver that is gone.
                let untaken = match &self.sent {
                    Some(sent) if n_untaken > 0 => Some(sent.in_flight_view()),
                    _ => None,
                };
                let close = push.call(&self.label, |reply| {
                    PushCommand::Close(linger, untaken, reply)
                });
                let closed = tokio::time::timeout(linger + Duration::from_millis(100), close).await;
                if closed.is_err() {
                    // Stopped, not just asked to stop: the task may be between its hand-over
                    // and its word on it (on another worker), which the counts below read.
                    push.task.abort();
                    let _ = (&mut push.task).await;
                }
                let n_queued = push.state.n_queued.load(Ordering::Acquire);
                let n_refused = push.state.n_refused.load(Ordering::Acquire);
                // Once the task handed over what the receivers had not taken, that is theirs to
                // report (`ring.rs`), even if the close timed out after it (the carrier's close
                // flushes doorbells) or a peer refused: this close counts only what it kept.
                let handed_over = push.state.handed_over.load(Ordering::Acquire);
                let n_lost_at_hand_over = push.state.n_lost_at_hand_over.load(Ordering::Acquire);
                let n_kept = |n_not_handed: u64| {
                    if handed_over {
                        n_not_handed + n_lost_at_hand_over
                    } else {
                        n_not_handed.max(n_untaken)
                    }
                };
                match closed {
                    _ if n_refused > 0 => Err(Error::Undelivered {
                        channel: self.label.clone(),
                        n_messages: n_kept(n_refused + n_queued),
                        reason: "the peer refused their descriptors".to_owned(),
                    }),
                    // Handed over before the carrier's close timed out: as if it had not.
                    Err(_) if handed_over && n_queued == 0 => {
                        handed_over_or_lost(&self.label, true, n_lost_at_hand_over)
                    }
                    // Counted, and every message taken: nothing is lost though the carrier's
                    // close timed out.
                    Err(_) if self.sent.is_some() && n_untaken == 0 && n_queued == 0 => Ok(()),
                    Err(_) => Err(Error::Undelivered {
                        channel: self.label.clone(),
                        n_messages: n_kept(n_queued),
                        reason: format!("no peer took them within linger = {linger:?}"),
                    }),
                    Ok(Err(error)) => {
                        log_lost_at_hand_over(&self.label, n_lost_at_hand_over);
                        Err(error)
                    }
                    Ok(Ok(held)) => handed_over_or_lost(&self.label, held, n_lost_at_hand_over),
                }
            }
            // What was handed to zmq.rs goes out first (linger bounding the silence), then the
            // listeners stop (zmq.rs removes their socket files as they stop).
            Inner::Publisher(publisher) => {
                publisher.close_rings();
                let drained = publisher.out.in_flight.drain_then_flush(linger).await;
                publisher.out.router.unbind_all().await;
                match drained {
                    Ok(()) => Ok(()),
                    Err(n_messages) => Err(Error::Undelivered {
                        channel: self.label.clone(),
                        n_messages: n_messages as u64,
                        reason: format!(
                            "their subscribers took none of them for linger = {linger:?}"
                        ),
                    }),
                }
            }
            Inner::Subscriber(subscriber) => {
                for dealer in &mut subscriber.dealers {
                    dealer.unbind_all().await;
                }
                Ok(())
            }
        };
        const LOST_HERE: &str = "their senders handed them over to this receiver and left, and it closed before \
             taking them";
        match result {
            Err(error) if n_lost > 0 && !matches!(error, Error::Undelivered { .. }) => {
                let lost = Error::Undelivered {
                    channel: self.label.clone(),
                    n_messages: n_lost,
                    reason: LOST_HERE.to_owned(),
                };
                tracing::error!(error = %lost, "closing the channel failed");
                Err(error)
            }
            result => ferromq_core::with_unread_at_close(result, &self.label, n_lost, LOST_HERE),
        }
    }
}

/// The loss of messages handed over to a receiver that had finished with its ring before the
/// word reached it ([`ConnectionRing::finish_at_close`]), or, with the rings handed over one
/// by one, of those no ring of a receiver still there held (a receiver that left had them:
/// [`finish_rings_one_by_one`]).
fn lost_at_hand_over(label: &ChannelLabel, n_messages: u64) -> Error {
    Error::Undelivered {
        channel: label.clone(),
        n_messages,
        reason: "their receivers left before taking them".to_owned(),
    }
}

/// Logs [`lost_at_hand_over`]'s loss when a close reports another error instead.
fn log_lost_at_hand_over(label: &ChannelLabel, n_messages: u64) {
    if n_messages > 0 {
        tracing::error!(error = %lost_at_hand_over(label, n_messages), "closing the channel failed");
    }
}

/// Decodes `frame` into `decoded` (for `session_hash`) and lists the objects it names that are
/// not among `seen` (an empty list allocates nothing).
fn decode_frame(
    frame: &[u8],
    session_hash: u64,
    decoded: &mut wire::Frame,
    seen: &[(ObjectKind, ObjectRef)],
) -> std::result::Result<Vec<(ObjectKind, ObjectRef)>, crate::error::ShmError> {
    wire::decode_into(frame, session_hash, decoded)?;
    Ok(unseen_objects(decoded, seen))
}

/// The objects `decoded` names that are not among `seen`, each once (an empty list allocates
/// nothing).
fn unseen_objects(
    decoded: &wire::Frame,
    seen: &[(ObjectKind, ObjectRef)],
) -> Vec<(ObjectKind, ObjectRef)> {
    let mut unseen = Vec::new();
    for object in decoded.objects() {
        if !seen.contains(&object) && !unseen.contains(&object) {
            unseen.push(object);
        }
    }
    unseen
}

impl ShmSocket {
    /// Maps, off the async threads, the peers' objects in `unseen` and remembers them, so the
    /// usual frame or entry takes no lock.
    async fn map_unseen(&mut self, unseen: Vec<(ObjectKind, ObjectRef)>) -> Result<()> {
        if unseen.is_empty() {
            return Ok(());
        }
        self.session
            .map_objects(&unseen)
            .await
            .map_err(|error| transport_error(&self.label, error))?;
        for object in unseen {
            if !self.seen_memory.contains(&object) {
                self.seen_memory.push(object);
            }
        }
        Ok(())
    }

    /// Adds an adopted `ring`, announced by `peer`, to those this socket takes from.
    fn take_from_ring(&mut self, ring: RingConsumer, peer: Option<Bytes>) {
        self.next_ring_id += 1;
        self.rings.push(AdoptedRing::new(
            ring,
            peer,
            Arc::clone(&self.session),
            self.next_ring_id,
        ));
    }

    /// Maps the ring a peer announced, and the counter it names, and adopts it.
    async fn adopt_announced_ring(
        &mut self,
        announced: wire::RingAnnounce,
    ) -> Result<RingConsumer> {
        // A publisher counts no deliveries: its rings name no counter.
        let counter = announced
            .delivery
            .is_some()
            .then_some((ObjectKind::Segment, announced.delivery.segment));
        let objects = std::iter::once((ObjectKind::Segment, announced.segment)).chain(counter);
        let unseen = objects
            .filter(|object| !self.seen_memory.contains(object))
            .collect();
        self.map_unseen(unseen).await?;
        let adopted = self.session.segment(announced.segment).and_then(|mapped| {
            let (block, _) = ShmBuffer::adopt_referenced_block(mapped, announced.range)?;
            RingConsumer::adopt_announced(block, announced.delivery, self.busy_poll)
        });
        adopted.map_err(|error| transport_error(&self.label, error))
    }

    /// Adopts an announced ring to take from ([`ShmSocket::adopt_announced_ring`]), with this
    /// socket's bell to ring when the receiver sleeps.
    async fn adopt_ring(&mut self, announced: wire::RingAnnounce) -> Result<RingConsumer> {
        let mut ring = self.adopt_announced_ring(announced).await?;
        // A busy-polled receive never waits for a doorbell.
        if self.bell.is_none() && !self.busy_poll {
            self.bell = crate::bell::Bell::bind();
        }
        if let Some(bell) = &self.bell {
            ring.set_bell(bell.id());
        }
        Ok(ring)
    }

    /// Hands the records of `self.decoded` to `pending`, each with its sender's counter (one
    /// from a ring counts at its ring's, [`AdoptedRing::release`]) and the `peer` it came from
    /// (where known). A record a subscriber's topics do not match is released at once, or, from
    /// a ring (`from_ring`), queued as filtered: its messages are released after its entry
    /// leaves the ring.
    fn queue_decoded(&mut self, peer: Option<&Bytes>, from_ring: bool) -> Result<()> {
        let delivery = self.decoded.delivery;
        // One sender's counter serves frame after frame: looked up when it changes.
        let taken = match &self.last_taken {
            // Counted by its ring instead.
            _ if from_ring => None,
            Some((known, taken)) if *known == delivery => Some(Arc::clone(taken)),
            _ => {
                let taken = self
                    .session
                    .taken_counter(delivery)
                    .map_err(|error| transport_error(&self.label, error))?
                    .map(Arc::new);
                if let Some(taken) = &taken {
                    self.last_taken = Some((delivery, Arc::clone(taken)));
                }
                taken
            }
        };
        let mut parts_of_frame = self.decoded.parts.drain(..);
        for &n_parts in &self.decoded.record_lens {
            let mut parts = Parts::with_capacity(n_parts as usize);
            for part in parts_of_frame.by_ref().take(n_parts as usize) {
                let message = self
                    .session
                    .materialise(part, &mut self.last_segment)
                    .map_err(|error| transport_error(&self.label, error))?;
                parts.push(message);
            }
            let filtered = match &self.inner {
                Inner::Subscriber(subscriber) => {
                    let first = parts.get(0).map(Message::data).unwrap_or_default();
                    !topic_matches(&subscriber.topics, first)
                }
                _ => false,
            };
            if filtered && !from_ring {
                continue;
            }
            self.pending.push_back(Received {
                parts,
                taken: taken.clone(),
                peer: peer.cloned(),
                entry: None,
                filtered,
            });
        }
        Ok(())
    }

    /// Takes the next entry of the next ring that has one into `pending`. An error that comes
    /// before anything was queued comes with the ring's index (the ring is left as it is: the
    /// caller drops it); one after entries of a run were queued is kept in `ring_error`, for
    /// the receive that finds them handed out.
    fn take_from_rings(&mut self) -> std::result::Result<FromRings, (usize, Error)> {
        let n_rings = self.rings.len();
        for step in 0..n_rings {
            let ring_idx = (self.next_ring + step) % n_rings;
            // What one ring holds is taken in a run (up to `RING_RUN` messages): the producer's
            // lines are read while they are still where the last look found them.
            let mut n_taken = 0;
            while n_taken < RING_RUN {
                let taken = match self.take_one(ring_idx) {
                    Ok(taken) => taken,
                    Err((_, error)) if n_taken > 0 => {
                        // What this run queued is handed out first, the error after it.
                        self.ring_error = Some((self.rings[ring_idx].id, error));
                        break;
                    }
                    Err(error) => return Err(error),
                };
                match taken {
                    FromRings::Queued => n_taken += 1,
                    FromRings::Empty => break,
                    needs_mapping @ FromRings::NeedsMapping(_) if n_taken == 0 => {
                        return Ok(needs_mapping);
                    }
                    FromRings::NeedsMapping(_) => break,
                }
            }
            if n_taken > 0 {
                self.next_ring = ring_idx + 1;
                return Ok(FromRings::Queued);
            }
        }
        Ok(FromRings::Empty)
    }

    /// Takes the next entry of ring `ring_idx` into `pending` (see `take_from_rings`).
    fn take_one(&mut self, ring_idx: usize) -> std::result::Result<FromRings, (usize, Error)> {
        let failed =
            |error: crate::error::ShmError| (ring_idx, transport_error(&self.label, error));
        let ring = &mut self.rings[ring_idx].ring;
        let kind = match ring.peek(&mut self.entry) {
            Ok(Some(kind)) => kind,
            Ok(None) => return Ok(FromRings::Empty),
            Err(error) => return Err(failed(error)),
        };
        let delivery = ring.delivery();
        // A record too large for the ring lies in a block of the ring's segment, whose
        // reference the entry holds: read in place (the reference keeps it), released once
        // the record's messages are queued.
        let indirect = match kind {
            EntryKind::Record => None,
            EntryKind::Indirect => Some(
                self.session
                    .read_indirect_entry(&mut self.entry)
                    .map_err(failed)?,
            ),
        };
        wire::decode_record_into(&self.entry, delivery, &mut self.decoded).map_err(failed)?;
        let unseen = unseen_objects(&self.decoded, &self.seen_memory);
        if !unseen.is_empty() {
            return Ok(FromRings::NeedsMapping(unseen));
        }
        // The sender's counter, looked up once per ring, once its segment is mapped.
        if self.rings[ring_idx].taken_counter.is_none() {
            let counter = self.session.taken_counter(delivery).map_err(failed)?;
            self.rings[ring_idx].taken_counter = Some(counter);
        }
        // The peer's identity is an `Arc`'s clone: no allocation per message.
        let peer = self.rings[ring_idx].peer.clone();
        let n_pending = self.pending.len();
        let queued = self.queue_decoded(peer.as_ref(), true);
        let adopted = &mut self.rings[ring_idx];
        let end = adopted
            .ring
            .take_peeked()
            .expect("the entry decoded above was peeked");
        adopted.n_taken += 1;
        let entry = TakenEntry {
            ring_id: adopted.id,
            end,
            indirect,
        };
        // A ring entry holds one record: queued, it keeps its entry in the ring until it is
        // handed out (see `TakenEntry`).
        let grew = queued.is_ok() && self.pending.len() > n_pending;
        match self.pending.back_mut() {
            Some(received) if grew => received.entry = Some(entry),
            _ => self.give_up(entry, false),
        }
        queued.map_err(|error| (ring_idx, error))?;
        Ok(FromRings::Queued)
    }

    /// Adopts the rings whose announcements this receiver has not read yet: those among its
    /// queued frames and those already in its carrier (no frame is waited for; at most
    /// [`UNREAD_AT_CLOSE`] are read, so a peer still sending frames cannot keep the close going).
    /// A receiver that closes before it read anything (stopped while still in INIT TASK, or
    /// stalled until then) never adopted them, and [`ShmSocket::finish_rings`] could not count
    /// what their senders handed over to it. A ring that cannot be adopted is reported and left
    /// out. Cancel-safe as a receive is: an announcement leaves the queue once adopted.
    async fn adopt_unread_rings(&mut self) {
        if let Inner::Plain(socket)
        | Inner::Pair(PairSide { socket, .. })
        | Inner::ReqRep(ReqRepSide { socket, .. }) = &mut self.inner
        {
            for _ in 0..UNREAD_AT_CLOSE {
                // Synchronous: what the carrier's connections have queued, whatever error a
                // receive would report first (a peer refused earlier).
                let Some(received) = socket.try_receive_parts() else {
                    break;
                };
                self.frames
                    .extend(carried_frames(socket, self.label.socket_type, received));
            }
        }
        while !self.frames.is_empty() {
            match self.adopt_queued_announcement(false).await {
                // Descriptors in frames carry no hand-over mark: dropped at the close, as before.
                None => drop(self.frames.pop_front()),
                Some(Ok(())) => {}
                Some(Err(error)) => tracing::error!(
                    channel = %self.label,
                    %error,
                    "a descriptor ring announced to this receiver could not be read at its close: \
                     what its sender handed over to it, if it did, is lost uncounted"
                ),
            }
        }
    }

    /// Adopts the ring announced by the frame at the front of `frames`, if it is an
    /// announcement (`None` otherwise), and adds it to this socket's rings; `with_bell`: a
    /// receive that may sleep on it also gets the socket's bell rung ([`ShmSocket::adopt_ring`]).
    /// The announcement stays queued while its memory is mapped, so a caller cancelled
    /// meanwhile loses nothing; it leaves the queue, adopted or refused, once that is done.
    async fn adopt_queued_announcement(&mut self, with_bell: bool) -> Option<Result<()>> {
        let (peer, frame) = self.frames.front()?;
        let announced = wire::decode_ring_announce(frame, self.session.hash)?;
        let peer = peer.clone();
        let adopted = match announced {
            Ok(announced) if with_bell => self.adopt_ring(announced).await,
            Ok(announced) => self.adopt_announced_ring(announced).await,
            Err(error) => Err(transport_error(&self.label, error)),
        };
        self.frames.pop_front();
        Some(adopted.map(|ring| self.take_from_ring(ring, peer)))
    }

    /// Finishes with the adopted rings (see `ring.rs`, "Peer death and drop") and counts the
    /// messages lost with them: those a producer that finished first handed over to this
    /// receiver (its close reported them delivered, `delivery.rs`) and that were not handed
    /// out, in the ring or taken into `pending`. A producer that finishes after this receiver
    /// counts what is left itself.
    fn finish_rings(&mut self) -> u64 {
        let mut n_lost = 0;
        for adopted in &mut self.rings {
            if let Some(n_left) = adopted.finish() {
                n_lost += n_left;
            }
        }
        n_lost
    }

    /// Lets a taken entry leave its ring (when its message is handed out or released), then
    /// gives back the entry's reference to the block holding its record, if any: a receiver
    /// killed in between leaks that block rather than have its sender, which releases what a
    /// dead receiver's ring holds, release it again. The ring may be gone: its entries left it
    /// when it was dropped. Not when the entry's message is handed out: a ring stays while
    /// entries taken from it wait in `pending`, and only a close or a drop, which hand nothing
    /// out, drops it earlier; its count is the ring's ([`AdoptedRing::release`]).
    fn give_up(&mut self, entry: TakenEntry, handed_out: bool) {
        let ring = self
            .rings
            .iter_mut()
            .find(|adopted| adopted.id == entry.ring_id);
        debug_assert!(
            ring.is_some() || !handed_out,
            "a message handed out after its ring was dropped goes uncounted"
        );
        if let Some(adopted) = ring {
            adopted.release(entry.end, handed_out);
        }
        if let Some((mapped, range)) = entry.indirect {
            drop(ShmBuffer::adopt_referenced_block(mapped, range));
        }
    }
}

impl ShmSocket {
    async fn set_topic(&mut self, topic: &[u8], subscribe: bool) -> Result<()> {
        let Inner::Subscriber(subscriber) = &mut self.inner else {
            let operation = if subscribe {
                "subscribe"
            } else {
                "unsubscribe"
            };
            return Err(Error::WrongSocketType {
                channel: self.label.clone(),
                operation,
            });
        };
        if subscribe {
            if !topic.is_empty() {
                subscriber.topics.push(topic.to_vec());
            }
        } else {
            subscriber.topics.retain(|kept| kept != topic);
        }
        subscriber.announce().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferromq_core::{Channel, Method};

    /// Removes the test's session memory and ipc file, passed or failed.
    struct Cleanup {
        session: String,
        ipc_path: std::path::PathBuf,
    }

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let uid = crate::names::current_uid();
            let _ = crate::cleanup::clean_session(uid, &self.session, true);
            let _ = std::fs::remove_file(&self.ipc_path);
        }
    }

    /// A shmem push bound in a session of its own (named after `tag`) and a pull socket
    /// connected to it with `spin_us`, which has taken one message (and so adopted the push's
    /// ring).
    async fn push_and_pull(
        tag: &str,
        spin_us: u32,
    ) -> (Cleanup, crate::ShmTransport, Channel, ShmSocket) {
        let (cleanup, transport, address) = own_session(tag);
        let config =
            ChannelConfig::new("data", SocketType::Push, Method::Bind).with_address(&address);
        let mut push = Channel::open(&transport, config, "data").await.unwrap();
        push.bind_configured().await.unwrap();
        let mut config =
            ChannelConfig::new("data", SocketType::Pull, Method::Connect).with_address(&address);
        config.spin_us = spin_us;
        let endpoint = config.endpoints().unwrap().remove(0).address;
        let mut pull = ShmSocket::new(Arc::clone(&transport.session), &config, "data")
            .await
            .unwrap();
        pull.connect(&endpoint).await.unwrap();
        push.send(Message::from("first")).await.unwrap();
        assert_eq!(pull.receive_parts().await.unwrap().len(), 1);
        (cleanup, transport, push, pull)
    }

    /// A session of the test's own (named after `tag`; removed with the cleanup) and an ipc
    /// address in it.
    fn own_session(tag: &str) -> (Cleanup, crate::ShmTransport, String) {
        let session = format!("{tag}-{}", std::process::id());
        let ipc_path = std::env::temp_dir().join(format!("ferromq-{session}.ipc"));
        let cleanup = Cleanup {
            session: session.clone(),
            ipc_path: ipc_path.clone(),
        };
        let transport = crate::ShmTransport::new(crate::ShmOptions {
            session,
            segment_size: 8 << 20,
            ..crate::ShmOptions::default()
        });
        (cleanup, transport, format!("ipc://{}", ipc_path.display()))
    }

    /// A socket of `transport` for `address`, neither bound nor connected yet, and the
    /// address's endpoint.
    async fn shm_socket(
        transport: &crate::ShmTransport,
        address: &str,
        socket_type: SocketType,
        method: Method,
    ) -> (ShmSocket, Address) {
        let config = ChannelConfig::new("data", socket_type, method).with_address(address);
        let endpoint = config.endpoints().unwrap().remove(0).address;
        let socket = ShmSocket::new(Arc::clone(&transport.session), &config, "data")
            .await
            .unwrap();
        (socket, endpoint)
    }

    /// Looks every millisecond until `done` says so; fails, saying `what`, after 10 s.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let started = std::time::Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(10), "never: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Message `msg_idx` of a numbered run: 64 bytes of its number.
    fn numbered(msg_idx: u8) -> Parts {
        Parts::from(Message::from(vec![msg_idx; 64]))
    }

    /// The next message `socket` receives, within 10 s.
    async fn received(socket: &mut ShmSocket) -> Parts {
        tokio::time::timeout(Duration::from_secs(10), socket.receive_parts())
            .await
            .expect("a message within 10 s")
            .unwrap()
    }

    /// Receives messages 0 to `n_msgs - 1` of a numbered run ([`numbered`]), in order.
    async fn receive_numbered(socket: &mut ShmSocket, n_msgs: u8) {
        for msg_idx in 0..n_msgs {
            let parts = received(socket).await;
            assert_eq!(parts.get(0).map(Message::data), Some(&[msg_idx; 64][..]));
        }
    }

    /// Fails unless `closed` reports exactly `n_messages` undelivered.
    fn assert_undelivered(closed: &Result<()>, n_messages: u64) {
        assert!(
            matches!(closed, Err(Error::Undelivered { n_messages: n, .. }) if *n == n_messages),
            "{n_messages} undelivered expected: {closed:?}"
        );
    }

    /// Polls one receive of `pull` once, which finds nothing (nothing was sent), and drops it.
    fn look_once(pull: &mut ShmSocket) {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let receive = pull.receive_parts();
        tokio::pin!(receive);
        assert!(
            receive.as_mut().poll(&mut cx).is_pending(),
            "nothing was sent"
        );
    }

    /// A push that had two receivers, one of which left, closes with messages the other (not
    /// receiving: stalled) has not taken. Those wait in that receiver's ring: they are handed
    /// over to it, which takes them all afterwards, and the close reports only what the one
    /// that left did not take: nothing, or 2 of the 3 it was sent. Before, one receiver gone
    /// made the close report every message not taken as undelivered, whoever held it. Once
    /// more with the other receiver finished with its ring before the close (15 of its 20 not
    /// handed out): those are lost too, counted once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_push_whose_receiver_left_hands_the_others_rings_over() {
        a_push_whose_receiver_left_with(0, false).await;
        a_push_whose_receiver_left_with(2, false).await;
        a_push_whose_receiver_left_with(2, true).await;
    }

    async fn a_push_whose_receiver_left_with(n_left: usize, b_finishes_first: bool) {
        let tag = format!("handover-left-{n_left}-{b_finishes_first}");
        let (_cleanup, transport, address) = own_session(&tag);
        let socket = |socket_type, method| shm_socket(&transport, &address, socket_type, method);
        let (mut push, endpoint) = socket(SocketType::Push, Method::Bind).await;
        push.bind(&endpoint).await.unwrap();
        let n_rings = |push: &ShmSocket| match &push.inner {
            Inner::Batched(batched) => {
                let outbox = batched.state.outbox.lock();
                let n_left = outbox
                    .rings
                    .iter()
                    .filter(|connection| connection.link.is_gone())
                    .count();
                (outbox.rings.len(), n_left)
            }
            _ => unreachable!("a push batches"),
        };

        // Receiver A takes the first message and leaves `n_left`; receiver B connects and takes
        // nothing.
        let (mut pull_a, _) = socket(SocketType::Pull, Method::Connect).await;
        pull_a.connect(&endpoint).await.unwrap();
        for _ in 0..=n_left {
            let to_a = Parts::from(Message::from("to a"));
            push.send_parts(to_a, None).await.unwrap();
        }
        received(&mut pull_a).await;
        let (mut pull_b, _) = socket(SocketType::Pull, Method::Connect).await;
        pull_b.connect(&endpoint).await.unwrap();
        until("B's ring is made", || n_rings(&push).0 == 2).await;
        // A leaves.
        pull_a.close(Duration::from_millis(100)).await.unwrap();
        drop(pull_a);
        until("the push sees A gone", || n_rings(&push).1 == 1).await;
        for msg_idx in 0..20 {
            push.send_parts(numbered(msg_idx), None).await.unwrap();
        }
        if b_finishes_first {
            // B hands 5 out, and finishes with its ring while its connection stays (as a
            // socket dropped does: it finishes first), 15 not handed out.
            for _ in 0..5 {
                received(&mut pull_b).await;
            }
            pull_b.finish_rings();
            let closed = push.close(Duration::from_millis(200)).await;
            assert_undelivered(&closed, n_left as u64 + 15);
            return;
        }
        let closed = push.close(Duration::from_millis(200)).await;
        if n_left == 0 {
            closed.expect("what B did not take was handed over to it: nothing is lost");
        } else {
            // Only what A left is lost.
            assert_undelivered(&closed, n_left as u64);
        }
        // B gets what was handed over to it.
        receive_numbered(&mut pull_b, 20).await;
        pull_b.close(Duration::from_millis(100)).await.unwrap();
    }

    /// A pair whose first peer left after taking what it was sent closes with messages its
    /// second peer (not receiving: stalled) has not taken: they are handed over to it, which
    /// takes them all afterwards, and nothing is lost. Before, the first peer gone made the
    /// close report them undelivered.
    #[tokio::test(flavor = "current_thread")]
    async fn a_pair_whose_first_peer_left_hands_its_ring_over_to_the_second() {
        let (_cleanup, transport, address) = own_session("pair-left");
        let socket = |method| shm_socket(&transport, &address, SocketType::Pair, method);
        let (mut pair, endpoint) = socket(Method::Bind).await;
        pair.bind(&endpoint).await.unwrap();
        let (mut first, _) = socket(Method::Connect).await;
        first.connect(&endpoint).await.unwrap();
        let to_first = Parts::from(Message::from("to the first"));
        pair.send_parts(to_first, None).await.unwrap();
        received(&mut first).await;
        first.close(Duration::from_millis(100)).await.unwrap();
        drop(first);
        let first_gone = |pair: &ShmSocket| match &pair.inner {
            Inner::Pair(side) => side
                .ring
                .slot
                .lock()
                .as_ref()
                .is_none_or(|connection| connection.link.is_gone()),
            _ => unreachable!("a pair"),
        };
        until("the pair sees its first peer gone", || first_gone(&pair)).await;
        let (mut second, _) = socket(Method::Connect).await;
        second.connect(&endpoint).await.unwrap();
        for msg_idx in 0..20 {
            tokio::time::timeout(
                Duration::from_secs(10),
                pair.send_parts(numbered(msg_idx), None),
            )
            .await
            .expect("the pair finds its second peer")
            .unwrap();
        }
        pair.close(Duration::from_millis(200))
            .await
            .expect("what the second peer did not take was handed over to it: nothing is lost");
        // The second peer gets what was handed over to it.
        receive_numbered(&mut second, 20).await;
        second.close(Duration::from_millis(100)).await.unwrap();
    }

    /// A look at the rings that does not wait (`try_receive_parts`, the device's first look)
    /// and finds an entry no message can be made of (its block is gone: a broken peer) leaves
    /// the error to the next receive, which returns it after what came before the entry, and
    /// drops the ring only then. The look used to drop the entry and its error: the message
    /// vanished without a word.
    #[tokio::test(flavor = "current_thread")]
    async fn an_entry_no_message_can_be_made_of_fails_the_next_receive() {
        let (_cleanup, transport, mut push, mut pull) =
            push_and_pull("unreadable-entry", ferromq_core::DEFAULT_SPIN_US).await;
        let before = Message::from("before");
        push.send(before).await.unwrap();
        let broken = ferromq_core::Transport::new_message(&transport, 4096)
            .await
            .unwrap();
        let (segment, data_offset) = {
            let buffer = broken
                .buffer()
                .and_then(|buffer| buffer.as_any().downcast_ref::<ShmBuffer>())
                .expect("a block of the session");
            (Arc::clone(buffer.segment()), buffer.data_offset())
        };
        push.send(broken).await.unwrap();
        // The block's header says "no block" (its magic is the header's second word).
        let magic = segment
            .atomic_u32(data_offset - crate::managed::BLOCK_ALIGN + 4)
            .unwrap();
        let live = magic.swap(0, Ordering::AcqRel);

        // The push's task writes into the ring once this one yields.
        let started = std::time::Instant::now();
        let first = loop {
            if let Some(parts) = pull.try_receive_parts() {
                break parts;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "nothing came");
            tokio::task::yield_now().await;
        };
        assert_eq!(first.get(0).map(Message::data), Some(&b"before"[..]));
        assert!(
            pull.try_receive_parts().is_none(),
            "no message is made of the broken entry"
        );
        let error = tokio::time::timeout(Duration::from_secs(5), pull.receive_parts())
            .await
            .expect("the receive reports the broken entry at once")
            .expect_err("the broken entry is an error");
        magic.store(live, Ordering::Release);
        let mut text = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            text = format!("{text}: {cause}");
            source = cause.source();
        }
        assert!(text.contains("no live block"), "{text}");
        // "before" was delivered, and the broken entry's loss was the receiver's error: the
        // sender has nothing to report. A ring dropped while "before" was still queued
        // finished as if "before" had not been handed out, and the sender counted it lost.
        push.close()
            .await
            .expect("nothing delivered is counted lost");
        pull.close(Duration::from_millis(100)).await.unwrap();
    }

    /// A pull asleep on its ring is woken by its bell when a burst comes, and finds the
    /// burst's entries before it looks at the bell: the bell's byte is left for its next wait,
    /// which it ends at once. That wait was no short one (no producer rang since it asked):
    /// counted as one, a paced pull spun 50 µs after every burst (twice the CPU of a paced
    /// sink at 1 MiB x 2500 msg/s).
    #[tokio::test(flavor = "current_thread")]
    async fn a_bell_left_from_the_last_wait_does_not_make_the_next_one_short() {
        let (_cleanup, _transport, mut push, mut pull) =
            push_and_pull("bell-stale", ferromq_core::DEFAULT_SPIN_US).await;
        assert!(pull.bell.is_some(), "the pull has a bell");

        // A paced pull: it asks for a doorbell as soon as its ring is empty.
        pull.ring_spin = SpinPolicy::new(Duration::from_micros(60));
        const BURST: usize = 8;
        let receiving = tokio::spawn(async move {
            for _ in 0..BURST {
                pull.receive_parts().await.unwrap();
            }
            pull
        });
        // On this one thread the pull runs until it waits, asleep on its ring; the push's task
        // rings its bell once this task yields.
        tokio::task::yield_now().await;
        assert!(!receiving.is_finished());
        for _ in 0..BURST {
            push.send(Message::from("burst")).await.unwrap();
        }
        let mut pull = tokio::time::timeout(Duration::from_secs(20), receiving)
            .await
            .expect("the bell woke the pull")
            .unwrap();

        // As after a burst that came long after the pull asked.
        pull.ring_spin = SpinPolicy::new(Duration::from_micros(60));
        // The left byte ends a wait; the next one sleeps.
        look_once(&mut pull);
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(
            !pull.ring_spin.last_wait_short(),
            "the bell's left byte counted as a short wait"
        );
        let bell = pull.bell.as_ref().unwrap();
        assert!(
            bell.poll_rung(&mut cx).is_pending(),
            "the left byte was taken"
        );
    }

    /// A pull's spin on its rings follows its channel's `spinUs`: with the default, a receive
    /// after a short wait looks at its empty ring for a while before it asks the producer for
    /// a doorbell; with `spinUs = 0` it asks at once (a member of an rpc group with more
    /// processes than cores spins not at all).
    #[tokio::test(flavor = "current_thread")]
    async fn a_pull_spins_on_its_rings_only_as_its_channel_s_spin_us_says() {
        for (spin_us, spins) in [(ferromq_core::DEFAULT_SPIN_US, true), (0, false)] {
            let (_cleanup, _transport, _push, mut pull) =
                push_and_pull(&format!("ring-spin-{spin_us}"), spin_us).await;
            assert_eq!(pull.rings.len(), 1, "the pull adopted the push's ring");
            // As after a wait that a spin ended: the next wait may spin.
            pull.ring_spin.record(WaitOutcome::CaughtSpinning);
            look_once(&mut pull);
            assert_eq!(
                pull.rings[0].ring.wants_doorbell(),
                !spins,
                "spinUs {spin_us}: asked for a doorbell at its first look"
            );
        }
    }
}
