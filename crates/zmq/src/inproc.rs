//! `inproc://` channels: devices in one process, messages moved through tokio channels.
//!
//! zmq.rs has no inproc transport, so ferromq has its own. Each socket is a [`Node`] with an
//! inbox (a bounded tokio channel of `rcvBufSize` messages); linking two nodes gives each a
//! weak handle to the other. A [`Parts`] moves from sender to receiver without a copy.
//!
//! - push / req / pair send to their peers round robin and wait (backpressure) when the chosen
//!   peer's inbox is full or no peer is linked yet;
//! - pub offers to every subscriber whose prefix matches and drops for a full inbox; the
//!   subscribers share one immutable buffer per part (copy-on-write);
//! - rep answers the node its last request came from;
//! - only compatible patterns are linked (push with pull, req with rep, ...): two pushes on one
//!   name stay apart and their sends wait, as over tcp, where the handshake refuses them;
//! - connecting before the binder exists is allowed: the connector waits in the registry and is
//!   linked when the bind happens; so is a binder's restart: its connectors stay in the
//!   registry and are linked to the next socket that binds the name, as tcp and ipc reconnect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use ferromq_core::{ChannelLabel, Error, Parts, SendError, SocketType};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

struct Envelope {
    from: u64,
    parts: Parts,
}

struct Node {
    id: u64,
    socket_type: SocketType,
    inbox: mpsc::Sender<Envelope>,
    /// Set by the close that counts the inbox, before it looks at `n_sending`.
    closing: AtomicBool,
    /// Peers sending into the inbox: from their announcement, made before they look at
    /// `closing`, to the end of their write (see [`InprocChannel::take_unread`]).
    n_sending: AtomicUsize,
    peers: Mutex<Vec<Weak<Node>>>,
    peers_changed: Notify,
    subscriptions: Mutex<Vec<Vec<u8>>>,
}

impl Node {
    fn live_peers(&self) -> Vec<Arc<Node>> {
        let mut peers = self.peers.lock().expect("inproc peer list poisoned");
        peers.retain(|peer| peer.strong_count() > 0);
        peers.iter().filter_map(Weak::upgrade).collect()
    }

    fn matches_subscription(&self, first_frame: &[u8]) -> bool {
        let subscriptions = self
            .subscriptions
            .lock()
            .expect("inproc subscriptions poisoned");
        subscriptions
            .iter()
            .any(|prefix| first_frame.starts_with(prefix))
    }
}

/// Links two nodes of compatible patterns; a pair that cannot talk (push to push) stays
/// unlinked, as a ZeroMQ handshake between them would fail: their sends wait for a peer.
fn link(first: &Arc<Node>, second: &Arc<Node>, name: &str) {
    if !first.socket_type.is_compatible_with(second.socket_type) {
        tracing::error!(
            address = %format!("inproc://{name}"),
            binder = first.socket_type.as_str(),
            connector = second.socket_type.as_str(),
            "inproc peers of incompatible patterns are not linked"
        );
        return;
    }
    for (node, peer) in [(first, second), (second, first)] {
        node.peers
            .lock()
            .expect("inproc peer list poisoned")
            .push(Arc::downgrade(peer));
        node.peers_changed.notify_waiters();
    }
}

#[derive(Default)]
struct Slot {
    binder: Weak<Node>,
    /// Every node connected to the name, linked to the binder or waiting for one: a binder
    /// that closes leaves them here, and the next one to bind the name links them (ZeroMQ's
    /// connections outlive their peer's restart; tcp and ipc reconnect).
    connectors: Vec<Weak<Node>>,
}

static REGISTRY: LazyLock<Mutex<HashMap<String, Slot>>> = LazyLock::new(Mutex::default);
static NEXT_NODE_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct InprocChannel {
    node: Arc<Node>,
    inbox: mpsc::Receiver<Envelope>,
    socket_type: SocketType,
    next_peer_idx: usize,
    reply_to: Option<u64>,
    bound_names: Vec<String>,
    /// Room set aside in a peer's inbox by [`InprocChannel::reserve`] (push and pair), with
    /// the peer, for the next [`InprocChannel::send_reserved`].
    reserved: Option<(Arc<Node>, mpsc::OwnedPermit<Envelope>)>,
}

impl InprocChannel {
    pub(crate) fn new(socket_type: SocketType, rcv_buf_size: usize) -> InprocChannel {
        let (sender, inbox) = mpsc::channel(rcv_buf_size.max(1));
        InprocChannel {
            node: Arc::new(Node {
                id: NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed),
                socket_type,
                inbox: sender,
                closing: AtomicBool::new(false),
                n_sending: AtomicUsize::new(0),
                peers: Mutex::default(),
                peers_changed: Notify::new(),
                subscriptions: Mutex::default(),
            }),
            inbox,
            socket_type,
            next_peer_idx: 0,
            reply_to: None,
            bound_names: Vec::new(),
            reserved: None,
        }
    }

    pub(crate) fn bind(&mut self, label: &ChannelLabel, name: &str) -> Result<(), Error> {
        let mut registry = REGISTRY.lock().expect("inproc registry poisoned");
        let slot = registry.entry(name.to_owned()).or_default();
        if slot.binder.strong_count() > 0 {
            return Err(Error::AddressInUse {
                channel: label.clone().with_address(format!("inproc://{name}")),
            });
        }
        slot.binder = Arc::downgrade(&self.node);
        slot.connectors.retain(|weak| weak.strong_count() > 0);
        for connector in slot.connectors.iter().filter_map(Weak::upgrade) {
            link(&self.node, &connector, name);
        }
        self.bound_names.push(name.to_owned());
        Ok(())
    }

    pub(crate) fn connect(&mut self, name: &str) {
        let mut registry = REGISTRY.lock().expect("inproc registry poisoned");
        let slot = registry.entry(name.to_owned()).or_default();
        slot.connectors.retain(|weak| weak.strong_count() > 0);
        slot.connectors.push(Arc::downgrade(&self.node));
        if let Some(binder) = slot.binder.upgrade() {
            link(&binder, &self.node, name);
        }
    }

    pub(crate) fn subscribe(&mut self, topic: &[u8], subscribe: bool) {
        let mut subscriptions = self
            .node
            .subscriptions
            .lock()
            .expect("inproc subscriptions poisoned");
        if subscribe {
            subscriptions.push(topic.to_vec());
        } else if let Some(idx) = subscriptions.iter().position(|prefix| prefix == topic) {
            subscriptions.remove(idx);
        }
    }

    pub(crate) async fn send(
        &mut self,
        label: &ChannelLabel,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        match self.socket_type {
            SocketType::Pub => {
                self.publish(parts);
                return Ok(());
            }
            SocketType::Rep => return self.reply(label, parts, timeout).await,
            _ => {}
        }
        // Push, pair, req: room in the next peer's inbox (a reservation), then the message.
        let mut parts = parts;
        loop {
            let room = match deadline {
                None => {
                    self.reserve().await;
                    true
                }
                Some(deadline) => tokio::time::timeout_at(deadline, self.reserve())
                    .await
                    .is_ok(),
            };
            if !room {
                return Err(timed_out(label, timeout, parts));
            }
            match self.send_reserved(label, parts) {
                // That peer closed meanwhile; pick another.
                Err(failed) if matches!(failed.error, Error::PeerGone { .. }) => {
                    parts = failed.message;
                }
                sent => return sent,
            }
        }
    }

    /// A rep's reply, to the node its last request came from.
    async fn reply(
        &mut self,
        label: &ChannelLabel,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        let reply_to = self.reply_to.take();
        let peer = self
            .node
            .live_peers()
            .into_iter()
            .find(|peer| Some(peer.id) == reply_to);
        let Some(peer) = peer else {
            let error = match reply_to {
                Some(_) => Error::PeerGone {
                    channel: label.clone(),
                    reason: "the requester left before the reply".to_owned(),
                },
                None => Error::WrongSocketType {
                    channel: label.clone(),
                    operation: "send a reply before receiving a request",
                },
            };
            return Err(SendError::new(error, parts));
        };
        let reserved = match timeout {
            Some(after) => match tokio::time::timeout(after, peer.inbox.reserve()).await {
                Ok(reserved) => reserved,
                Err(_) => return Err(timed_out(label, timeout, parts)),
            },
            None => peer.inbox.reserve().await,
        };
        match reserved {
            Ok(permit) => {
                permit.send(Envelope {
                    from: self.node.id,
                    parts,
                });
                Ok(())
            }
            // The requester closed while the reply waited for room (the request was taken,
            // so there is no turn to reply in any more).
            Err(_) => Err(SendError::new(
                Error::WrongSocketType {
                    channel: label.clone(),
                    operation: "send a reply before receiving a request",
                },
                parts,
            )),
        }
    }

    /// Waits for room in the inbox of the next peer (round robin) and keeps it for
    /// [`InprocChannel::send_reserved`]; at once when room is kept already. Cancel-safe: a
    /// dropped wait keeps nothing. Push, pair and req (a rep answers its requester).
    pub(crate) async fn reserve(&mut self) {
        if self
            .reserved
            .as_ref()
            .is_some_and(|(peer, _)| !peer.inbox.is_closed())
        {
            return;
        }
        self.reserved = None;
        loop {
            let changed = self.node.peers_changed.notified();
            let mut peers = self.node.live_peers();
            // A peer whose inbox is closed is closing: not one to send to (its room is refused
            // at once, and a loop over it alone would never yield).
            peers.retain(|peer| !peer.inbox.is_closed());
            if peers.is_empty() {
                changed.await;
                continue;
            }
            self.next_peer_idx = (self.next_peer_idx + 1) % peers.len();
            let peer = Arc::clone(&peers[self.next_peer_idx]);
            if let Ok(permit) = peer.inbox.clone().reserve_owned().await {
                self.reserved = Some((peer, permit));
                return;
            }
            // That peer closed meanwhile: pick another, giving the runtime a turn first.
            tokio::task::consume_budget().await;
        }
    }

    /// Sends into the room [`InprocChannel::reserve`] kept, without waiting; hands the parts
    /// back when none is kept or that peer has gone since.
    // The error hands the message back, as every send does.
    #[allow(clippy::result_large_err)]
    pub(crate) fn send_reserved(
        &mut self,
        label: &ChannelLabel,
        parts: Parts,
    ) -> Result<(), SendError<Parts>> {
        let Some((peer, permit)) = self.reserved.take() else {
            return Err(SendError::new(
                Error::Unsupported {
                    channel: label.clone(),
                    operation: "send through a reservation",
                    reason: "no room was reserved on this channel (Channel::reserve first)",
                },
                parts,
            ));
        };
        // Announced before the look at `closing`, ended after the write: a close that counts
        // the inbox sees either this send's message there or `closing` here (`take_unread`).
        // A peer dropped, or closed without a count (rep, a shmem carrier), has no `closing`
        // but a closed inbox.
        peer.n_sending.fetch_add(1, Ordering::SeqCst);
        if peer.closing.load(Ordering::SeqCst) || peer.inbox.is_closed() {
            peer.n_sending.fetch_sub(1, Ordering::Release);
            return Err(SendError::new(
                Error::PeerGone {
                    channel: label.clone(),
                    reason: "the peer whose room was reserved closed before the send".to_owned(),
                },
                parts,
            ));
        }
        permit.send(Envelope {
            from: self.node.id,
            parts,
        });
        peer.n_sending.fetch_sub(1, Ordering::Release);
        Ok(())
    }

    fn publish(&mut self, parts: Parts) {
        let first_frame = parts
            .get(0)
            .map(|message| message.data().to_vec())
            .unwrap_or_default();
        let subscribers: Vec<Arc<Node>> = self
            .node
            .live_peers()
            .into_iter()
            .filter(|peer| peer.matches_subscription(&first_frame))
            .collect();
        if subscribers.is_empty() {
            return;
        }
        // Subscribers share one immutable buffer per part; one that writes gets its own copy
        // (copy-on-write in `Message::data_mut`).
        let frames: Vec<bytes::Bytes> = parts
            .into_iter()
            .map(ferromq_core::Message::into_bytes)
            .collect();
        for subscriber in subscribers {
            let shared: Parts = frames
                .iter()
                .cloned()
                .map(ferromq_core::Message::from)
                .collect();
            let _ = subscriber.inbox.try_send(Envelope {
                from: self.node.id,
                parts: shared,
            });
        }
    }

    /// The next message. Cancel-safe: the inbox keeps what a dropped receive did not take.
    pub(crate) async fn receive(&mut self) -> Result<Parts, Error> {
        let received = self.inbox.recv().await;
        // The node holds a sender to its own inbox, so it never reports closed.
        let envelope = received.expect("an inproc inbox outlives its node");
        Ok(self.opened(envelope))
    }

    /// A message that is in the inbox already, without waiting: `None` when it is empty. A
    /// reader that looks here before it waits (the rpc dispatcher after a frame of its own
    /// loopback) sees the peers' messages as it would over tcp, ipc or shmem, instead of only
    /// when nothing else is ready.
    pub(crate) fn try_receive(&mut self) -> Option<Parts> {
        let envelope = self.inbox.try_recv().ok()?;
        Some(self.opened(envelope))
    }

    /// The parts of a received envelope; a rep socket keeps whom to answer.
    fn opened(&mut self, envelope: Envelope) -> Parts {
        if self.socket_type == SocketType::Rep {
            self.reply_to = Some(envelope.from);
        }
        envelope.parts
    }

    /// Closes the inbox of a pull or pair (its peers' sends go to other peers, or wait) and
    /// counts what is in it: messages sent to this socket that it did not take. 0 for the other
    /// patterns (a sub's unread messages are not counted, as with ZeroMQ's PUB).
    ///
    /// A peer may be writing into room it reserved before the close, on another thread: its
    /// send was accepted, so the count waits for that write (a few instructions, no await)
    /// instead of leaving the message in an inbox nobody reads. A peer that looks after
    /// `closing` is set gets its message back; room reserved and not being written into is
    /// not waited for.
    pub(crate) fn take_unread(&mut self) -> usize {
        if !self.socket_type.counts_unread_at_close() {
            return 0;
        }
        self.node.closing.store(true, Ordering::SeqCst);
        self.inbox.close();
        let mut n_spins = 0_u32;
        while self.node.n_sending.load(Ordering::SeqCst) > 0 {
            // Only a peer on another thread can be inside its write (it has no await), and
            // only for a few instructions unless that thread was preempted there.
            n_spins += 1;
            if n_spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let mut n_unread = 0;
        while self.inbox.try_recv().is_ok() {
            n_unread += 1;
        }
        n_unread
    }

    /// Inproc sends hand messages straight to the receiver's inbox, so there is nothing of ours
    /// left to flush: unbinds.
    pub(crate) fn close(&mut self) {
        let mut registry = REGISTRY.lock().expect("inproc registry poisoned");
        for name in self.bound_names.drain(..) {
            if let Some(slot) = registry.get_mut(&name) {
                if slot.binder.as_ptr() == Arc::as_ptr(&self.node) {
                    slot.binder = Weak::new();
                }
                slot.connectors.retain(|weak| weak.strong_count() > 0);
                if slot.binder.strong_count() == 0 && slot.connectors.is_empty() {
                    registry.remove(&name);
                }
            }
        }
    }
}

impl Drop for InprocChannel {
    fn drop(&mut self) {
        self.close();
    }
}

fn timed_out<T>(label: &ChannelLabel, timeout: Option<Duration>, value: T) -> SendError<T> {
    SendError::new(
        Error::Timeout {
            channel: label.clone(),
            after: timeout.unwrap_or_default(),
        },
        value,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label() -> ChannelLabel {
        ChannelLabel::new("data", SocketType::Pull)
    }

    /// A socket of `bound` bound at `name` and one of `connecting` connected to it.
    fn linked(
        bound: SocketType,
        connecting: SocketType,
        name: &str,
    ) -> (InprocChannel, InprocChannel) {
        let mut binder = InprocChannel::new(bound, 8);
        binder.bind(&label(), name).expect("bind");
        let mut connector = InprocChannel::new(connecting, 8);
        connector.connect(name);
        (binder, connector)
    }

    /// A pull bound at `name` and a push connected to it, the push holding room in the pull's
    /// inbox taken out of its reservation: as a send past its check that the inbox is open.
    async fn push_past_its_check(
        name: &str,
    ) -> (InprocChannel, InprocChannel, mpsc::OwnedPermit<Envelope>) {
        let (pull, mut push) = linked(SocketType::Pull, SocketType::Push, name);
        push.reserve().await;
        let (_, permit) = push.reserved.take().expect("room reserved");
        (pull, push, permit)
    }

    /// Sends one message through `sender`'s reserved room and checks that it came back,
    /// refused with `PeerGone`.
    fn assert_comes_back(sender: &mut InprocChannel) {
        let sent = sender.send_reserved(&label(), Parts::from(ferromq_core::Message::from("m")));
        let failed = sent.expect_err("the receiver is closed or gone");
        assert!(
            matches!(failed.error, Error::PeerGone { .. }),
            "{:?}",
            failed.error
        );
        assert_eq!(failed.message.len(), 1, "the message comes back");
    }

    #[test]
    fn a_close_counts_a_send_it_met_halfway() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let name = format!("unread-halfway-{}", std::process::id());
        let (mut pull, push, permit) = runtime.block_on(push_past_its_check(&name));
        // The push is between its look at `closing` and its write, as on another thread.
        let node = Arc::clone(&pull.node);
        node.n_sending.fetch_add(1, Ordering::SeqCst);
        assert!(!node.closing.load(Ordering::SeqCst));
        let close = std::thread::spawn(move || pull.take_unread());
        // The close has begun (it closed the inbox) and waits for the write.
        while !node.closing.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(
            !close.is_finished(),
            "the count waits for the write under way"
        );
        permit.send(Envelope {
            from: push.node.id,
            parts: Parts::from(ferromq_core::Message::from("late")),
        });
        node.n_sending.fetch_sub(1, Ordering::Release);
        assert_eq!(close.join().expect("close"), 1, "the message is counted");
    }

    #[tokio::test]
    async fn a_send_into_room_reserved_before_the_close_comes_back() {
        let name = format!("unread-returned-{}", std::process::id());
        let (mut pull, mut push) = linked(SocketType::Pull, SocketType::Push, &name);
        push.reserve().await;
        // Room reserved and idle is not waited for.
        assert_eq!(pull.take_unread(), 0);
        assert_comes_back(&mut push);
    }

    #[tokio::test]
    async fn a_send_into_room_of_a_peer_dropped_since_comes_back() {
        // A rep counts nothing at its end: only its inbox's end says it is gone.
        let name = format!("unread-dropped-{}", std::process::id());
        let (rep, mut req) = linked(SocketType::Rep, SocketType::Req, &name);
        req.reserve().await;
        drop(rep);
        assert_comes_back(&mut req);
    }

    /// A push whose only peer closed its inbox (and lives on) waits for another peer; it used
    /// to retry the closed one without end, never yielding, which hung a current-thread
    /// runtime.
    #[test]
    fn a_push_whose_only_peer_closed_waits_instead_of_spinning() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime");
            let outcome = runtime.block_on(async {
                let name = format!("unread-spin-{}", std::process::id());
                let (mut pull, mut push) = linked(SocketType::Pull, SocketType::Push, &name);
                pull.take_unread();
                let message = Parts::from(ferromq_core::Message::from("m"));
                let sent = push
                    .send(&label(), message, Some(Duration::from_millis(50)))
                    .await;
                drop(pull);
                sent.map_err(|failed| failed.error)
            });
            let _ = done.send(outcome);
        });
        let outcome = finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the send came back (it spun before)");
        assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    }
}
