//! [`ZmqSocket`]: one channel end, inproc or over zmq.rs depending on its first address.

use std::time::Duration;

use async_trait::async_trait;
use ferromq_core::{
    Address, ChannelConfig, ChannelLabel, Error, Parts, Result, SendError, Socket, SocketType,
};

use crate::inproc::InprocChannel;
use crate::net::NetChannel;
use crate::zmtp_channel::{Pattern, ZmtpChannel};

enum Backend {
    Unattached,
    Net(Box<NetChannel>),
    /// ferromq's own push, pull, pair and pub over tcp and ipc (see `zmtp_channel.rs`).
    Zmtp(Box<ZmtpChannel>),
    Inproc(InprocChannel),
}

/// A socket of the zeromq transport. Transports that carry their own frames over zeromq (shmem's
/// descriptors) hold it by type, for what [`Socket`] does not say: [`ZmqSocket::establish`] and
/// [`ZmqSocket::peers_hold_what_was_written`].
pub struct ZmqSocket {
    label: ChannelLabel,
    socket_type: SocketType,
    snd_buf_size: usize,
    rcv_buf_size: usize,
    /// `sndKernelSize` and `rcvKernelSize`: the kernel's buffers of each connection (0: the
    /// system's default), as FairMQ sets them.
    kernel_sizes: crate::zmtp_channel::KernelSizes,
    backend: Backend,
    /// Topic prefixes asked for so far (sub only); applied when the backend is created.
    subscriptions: Vec<Vec<u8>>,
    /// True while the socket is subscribed to everything only because nobody asked otherwise.
    subscribed_to_all_by_default: bool,
    /// What this socket announces to its peers.
    rules: crate::PeerRules,
    /// Its sending figures (tcp and ipc: the send queue and waits), from creation on.
    figures: std::sync::Arc<ferromq_core::SendFigures>,
    /// Push, pull, pair and pub over tcp and ipc are ferromq's own ([`ZmtpChannel`]).
    own_zmtp: bool,
    /// Its connections are handed out by [`ZmqSocket::next_peer`] (own push only).
    report_peers: bool,
}

impl ZmqSocket {
    pub(crate) fn new(
        config: &ChannelConfig,
        socket_name: &str,
        rules: crate::PeerRules,
        own_zmtp: bool,
    ) -> ZmqSocket {
        let mut label = ChannelLabel::new(socket_name, config.socket_type);
        label.address = config.address.clone();
        ZmqSocket {
            label,
            socket_type: config.socket_type,
            snd_buf_size: config.snd_buf_size,
            rcv_buf_size: config.rcv_buf_size,
            kernel_sizes: crate::zmtp_channel::KernelSizes {
                send: config.snd_kernel_size,
                receive: config.rcv_kernel_size,
            },
            backend: Backend::Unattached,
            subscriptions: Vec::new(),
            subscribed_to_all_by_default: false,
            rules,
            figures: std::sync::Arc::default(),
            own_zmtp,
            report_peers: false,
        }
    }

    /// Asks for this socket's connections to be handed out by [`ZmqSocket::next_peer`], each
    /// with a [`crate::PeerLink`] that writes frames to that peer alone. Call before the first
    /// bind or connect. Only ferromq's own push, pair, req and rep over tcp and ipc report
    /// connections ([`ZmqSocket::reports_peers`] says whether this one does, once bound or
    /// connected); a req or rep that does is a carrier of ferromq peers only, whose received
    /// messages come behind their peer's identity and which sends through its links alone.
    pub fn report_new_peers(&mut self) {
        self.report_peers = true;
    }

    /// Whether [`ZmqSocket::next_peer`] hands out this socket's connections.
    pub fn reports_peers(&self) -> bool {
        matches!(&self.backend, Backend::Zmtp(_)) && self.report_peers
    }

    /// The next peer through its handshake: its identity and its link; the error once a peer
    /// of another transport or session connected (the socket then sends nothing). Waits
    /// forever on a socket that does not report peers ([`ZmqSocket::reports_peers`]).
    /// Cancel-safe.
    ///
    /// # Errors
    /// [`ferromq_core::Error::TransportMismatch`] or [`ferromq_core::Error::SessionMismatch`].
    pub async fn next_peer(&self) -> Result<(bytes::Bytes, std::sync::Arc<crate::PeerLink>)> {
        match &self.backend {
            Backend::Zmtp(zmtp) if self.report_peers => zmtp.next_peer().await,
            _ => std::future::pending().await,
        }
    }

    /// [`ZmqSocket::next_peer`] without waiting: `None` when no connection is new (always, on
    /// a socket that does not report peers). An atomic load while nothing is new, the lock
    /// only when something is, and no wake-up registration: for a sender that looks for new
    /// connections on every send.
    ///
    /// # Errors
    /// As [`ZmqSocket::next_peer`].
    pub fn try_next_peer(&self) -> Option<Result<(bytes::Bytes, std::sync::Arc<crate::PeerLink>)>> {
        match &self.backend {
            Backend::Zmtp(zmtp) if self.report_peers => zmtp.try_next_peer(),
            _ => None,
        }
    }

    /// The backend for `address`, created on first use; one socket cannot mix inproc with tcp/ipc.
    fn backend_for(&mut self, address: &Address) -> Result<&mut Backend> {
        let wants_inproc = matches!(address, Address::Inproc { .. });
        match (&self.backend, wants_inproc) {
            (Backend::Unattached, true) => {
                self.backend =
                    Backend::Inproc(InprocChannel::new(self.socket_type, self.rcv_buf_size));
            }
            // A req or rep that reports its peers is shmem's carrier: frames in behind their
            // peer's identity, out through links only (`Pattern::Req`).
            (Backend::Unattached, false)
                if self.own_zmtp
                    && (matches!(
                        self.socket_type,
                        SocketType::Push | SocketType::Pair | SocketType::Pull | SocketType::Pub
                    ) || (self.report_peers
                        && matches!(self.socket_type, SocketType::Req | SocketType::Rep))) =>
            {
                let pattern = match self.socket_type {
                    SocketType::Push => Pattern::Push,
                    SocketType::Pair => Pattern::Pair,
                    SocketType::Req => Pattern::Req,
                    SocketType::Rep => Pattern::Rep,
                    SocketType::Pub => Pattern::Pub,
                    _ => Pattern::Pull,
                };
                self.backend = Backend::Zmtp(Box::new(ZmtpChannel::new(
                    pattern,
                    &self.label,
                    (self.snd_buf_size, self.rcv_buf_size),
                    self.kernel_sizes,
                    self.rules,
                    std::sync::Arc::clone(&self.figures),
                    self.report_peers
                        && matches!(
                            self.socket_type,
                            SocketType::Push | SocketType::Pair | SocketType::Req | SocketType::Rep
                        ),
                )));
            }
            (Backend::Unattached, false) => {
                if self.kernel_sizes != crate::zmtp_channel::KernelSizes::default() {
                    // zmq.rs makes these sockets' connections and does not hand them out.
                    tracing::warn!(channel = %self.label, "sndKernelSize and rcvKernelSize apply to push, pull, pair and pub over tcp and ipc; this socket's connections keep the system's default buffers");
                }
                self.backend = Backend::Net(Box::new(NetChannel::new(
                    self.socket_type,
                    self.snd_buf_size,
                    self.rules,
                    std::sync::Arc::clone(&self.figures),
                )));
            }
            (Backend::Inproc(_), false) | (Backend::Net(_) | Backend::Zmtp(_), true) => {
                return Err(Error::UnsupportedAddress {
                    channel: self.label.clone(),
                    address: address.to_string(),
                    reason: "one socket cannot mix inproc:// with tcp:// or ipc://",
                });
            }
            _ => {}
        }
        Ok(&mut self.backend)
    }

    /// [`Socket::send_parts`] without the box the trait's future needs: for a caller that holds
    /// a `ZmqSocket` itself (shmem's descriptor carrier sends one frame after another through
    /// it, and a box per frame was half of its allocations).
    ///
    /// # Errors
    /// As [`Socket::send_parts`].
    pub async fn send_unboxed(
        &mut self,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        if let Err(error) = self.check(self.socket_type.can_send(), "send") {
            return Err(SendError::new(error, parts));
        }
        match &mut self.backend {
            Backend::Net(net) => net.send(&self.label, parts, timeout).await,
            Backend::Zmtp(zmtp) => zmtp.send(&self.label, parts, timeout).await,
            Backend::Inproc(inproc) => inproc.send(&self.label, parts, timeout).await,
            Backend::Unattached => Err(SendError::new(self.not_attached("send"), parts)),
        }
    }

    /// [`Socket::receive_parts`] without the box (see [`ZmqSocket::send_unboxed`]).
    ///
    /// # Errors
    /// As [`Socket::receive_parts`].
    pub async fn receive_unboxed(&mut self) -> Result<Parts> {
        self.check(self.socket_type.can_receive(), "receive")?;
        match &mut self.backend {
            Backend::Net(net) => net.receive(&self.label).await,
            Backend::Zmtp(zmtp) => zmtp.receive(&self.label).await,
            Backend::Inproc(inproc) => inproc.receive().await,
            Backend::Unattached => Err(self.not_attached("receive")),
        }
    }

    fn not_attached(&self, operation: &'static str) -> Error {
        Error::PeerGone {
            channel: self.label.clone(),
            reason: format!("cannot {operation}: the socket is neither bound nor connected"),
        }
    }

    fn check(&self, allowed: bool, operation: &'static str) -> Result<()> {
        if allowed {
            return Ok(());
        }
        Err(Error::WrongSocketType {
            channel: self.label.clone(),
            operation,
        })
    }
}

#[async_trait]
impl Socket for ZmqSocket {
    fn label(&self) -> &ChannelLabel {
        &self.label
    }

    fn send_figures(&self) -> Option<std::sync::Arc<ferromq_core::SendFigures>> {
        Some(std::sync::Arc::clone(&self.figures))
    }

    async fn bind(&mut self, address: &Address) -> Result<Address> {
        let label = self.label.clone();
        self.attach_subscriptions(address).await?;
        let bound = match self.backend_for(address)? {
            Backend::Net(net) => net.bind(&label, address).await?,
            Backend::Zmtp(zmtp) => zmtp.bind(&label, address).await?,
            Backend::Inproc(inproc) => {
                let Address::Inproc { name } = address else {
                    unreachable!("backend_for gives inproc only for inproc addresses")
                };
                inproc.bind(&label, name)?;
                address.clone()
            }
            Backend::Unattached => unreachable!("backend_for attaches a backend"),
        };
        self.label.address = Some(bound.to_string());
        tracing::debug!(channel = %self.label.name, address = %bound, "bound");
        Ok(bound)
    }

    async fn connect(&mut self, address: &Address) -> Result<()> {
        let label = self.label.clone();
        self.attach_subscriptions(address).await?;
        match self.backend_for(address)? {
            Backend::Net(net) => net.connect(&label, address).await?,
            Backend::Zmtp(zmtp) => zmtp.connect(&label, address)?,
            Backend::Inproc(inproc) => {
                let Address::Inproc { name } = address else {
                    unreachable!("backend_for gives inproc only for inproc addresses")
                };
                inproc.connect(name);
            }
            Backend::Unattached => unreachable!("backend_for attaches a backend"),
        }
        self.label.address = Some(address.to_string());
        tracing::debug!(channel = %self.label.name, %address, "connected");
        Ok(())
    }

    async fn send_parts(
        &mut self,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        self.send_unboxed(parts, timeout).await
    }

    fn try_send_parts(&mut self, parts: Parts) -> std::result::Result<(), Parts> {
        match &mut self.backend {
            Backend::Zmtp(zmtp) if self.socket_type.can_send() => zmtp.try_send(parts),
            _ => Err(parts),
        }
    }

    async fn reserve_send(&mut self) -> Result<bool> {
        self.check(self.socket_type.can_send(), "send")?;
        if !matches!(self.socket_type, SocketType::Push | SocketType::Pair) {
            return Ok(false);
        }
        match &mut self.backend {
            Backend::Zmtp(zmtp) => zmtp.reserve(&self.label).await.map(|()| true),
            Backend::Inproc(inproc) => {
                inproc.reserve().await;
                Ok(true)
            }
            Backend::Net(_) => Ok(false),
            Backend::Unattached => Err(self.not_attached("send")),
        }
    }

    fn send_reserved(&mut self, parts: Parts) -> std::result::Result<(), SendError<Parts>> {
        match &mut self.backend {
            Backend::Zmtp(zmtp) => zmtp.send_reserved(&self.label, parts),
            Backend::Inproc(inproc) => inproc.send_reserved(&self.label, parts),
            Backend::Net(_) | Backend::Unattached => Err(SendError::new(
                Error::Unsupported {
                    channel: self.label.clone(),
                    operation: "send through a reservation",
                    reason: "no room was reserved on this channel (Channel::reserve first)",
                },
                parts,
            )),
        }
    }

    fn try_receive_parts(&mut self) -> Option<Parts> {
        match &mut self.backend {
            Backend::Zmtp(zmtp) if self.socket_type.can_receive() => zmtp.try_receive(),
            Backend::Inproc(inproc) if self.socket_type.can_receive() => inproc.try_receive(),
            _ => None,
        }
    }

    async fn receive_parts(&mut self) -> Result<Parts> {
        self.receive_unboxed().await
    }

    async fn subscribe(&mut self, topic: &[u8]) -> Result<()> {
        self.set_subscription(topic, true).await
    }

    async fn unsubscribe(&mut self, topic: &[u8]) -> Result<()> {
        self.set_subscription(topic, false).await
    }

    async fn close(&mut self, linger: Duration) -> Result<()> {
        let result = match &mut self.backend {
            Backend::Net(net) => net.close(&self.label, linger).await,
            Backend::Zmtp(zmtp) => zmtp.close(&self.label, linger).await,
            Backend::Inproc(inproc) => {
                let n_unread = if self.rules.carries_zeromq_messages() {
                    inproc.take_unread()
                } else {
                    0
                };
                inproc.close();
                ferromq_core::with_unread_at_close(
                    Ok(()),
                    &self.label,
                    n_unread as u64,
                    crate::zmtp_channel::UNREAD,
                )
            }
            Backend::Unattached => Ok(()),
        };
        self.backend = Backend::Unattached;
        result
    }
}

impl Drop for ZmqSocket {
    fn drop(&mut self) {
        // A closed socket is unattached. An inproc receiver dropped without a close says what
        // reached it and was not taken, as a tcp or ipc one does (`ZmtpChannel`'s drop): its
        // senders handed those messages over, so nobody else counts them.
        if let Backend::Inproc(inproc) = &mut self.backend
            && self.rules.carries_zeromq_messages()
        {
            let n_unread = inproc.take_unread();
            if n_unread > 0 {
                crate::zmtp_channel::log_unread_at_drop(&self.label, n_unread);
            }
        }
    }
}

impl ZmqSocket {
    /// Makes the connections [`Socket::connect`] accepted, waiting for each peer as long as it
    /// takes (a send or receive would make them on the way). Cancel-safe: a connection not made
    /// yet stays pending. A task that owns the socket calls this to connect in the background,
    /// as ZeroMQ does, so that a peer is connected before the first message.
    ///
    /// # Errors
    /// [`Error::Connect`] naming the address zmq.rs could not connect to.
    pub async fn establish(&mut self) -> Result<()> {
        match &mut self.backend {
            Backend::Net(net) => net.finish_connects(None).await.map(|_| ()),
            Backend::Zmtp(_) | Backend::Inproc(_) | Backend::Unattached => Ok(()),
        }
    }

    /// Whether connections wait to be made by [`ZmqSocket::establish`] (or the next send).
    pub fn is_connecting(&self) -> bool {
        matches!(&self.backend, Backend::Net(net) if net.is_connecting())
    }

    /// True when this socket had peers and each still holds what was written to it: none went
    /// away and the process of every ferromq peer lives (a stopped one does). What a sender
    /// wrote then waits in its receivers' sockets, whatever becomes of the sender. Always true
    /// inproc (sender and receivers share one process).
    pub fn peers_hold_what_was_written(&mut self) -> bool {
        match &mut self.backend {
            Backend::Net(net) => net.peers_hold_what_was_written(&self.label),
            Backend::Zmtp(zmtp) => zmtp.peers_hold_what_was_written(),
            Backend::Inproc(_) => true,
            Backend::Unattached => false,
        }
    }

    /// On a sub socket's first bind or connect, creates the backend and applies the topic
    /// filters asked for so far, or subscribes to everything when none were (FairMQ's default).
    async fn attach_subscriptions(&mut self, address: &Address) -> Result<()> {
        if self.socket_type != SocketType::Sub || !matches!(self.backend, Backend::Unattached) {
            return Ok(());
        }
        self.backend_for(address)?;
        let topics = if self.subscriptions.is_empty() {
            self.subscribed_to_all_by_default = true;
            vec![Vec::new()]
        } else {
            self.subscriptions.clone()
        };
        for topic in topics {
            self.apply_subscription(&topic, true).await?;
        }
        Ok(())
    }

    async fn set_subscription(&mut self, topic: &[u8], subscribe: bool) -> Result<()> {
        let operation = if subscribe {
            "subscribe"
        } else {
            "unsubscribe"
        };
        self.check(self.socket_type == SocketType::Sub, operation)?;
        if subscribe {
            self.subscriptions.push(topic.to_vec());
        } else {
            self.subscriptions.retain(|kept| kept != topic);
        }
        if matches!(self.backend, Backend::Unattached) {
            return Ok(());
        }
        if std::mem::take(&mut self.subscribed_to_all_by_default) {
            // An explicit filter replaces the default subscribe-to-everything.
            self.apply_subscription(b"", false).await?;
        }
        self.apply_subscription(topic, subscribe).await
    }

    async fn apply_subscription(&mut self, topic: &[u8], subscribe: bool) -> Result<()> {
        let operation = if subscribe {
            "subscribe"
        } else {
            "unsubscribe"
        };
        match &mut self.backend {
            Backend::Net(net) => net.subscribe(&self.label, topic, subscribe).await,
            Backend::Zmtp(_) => unreachable!("only a sub subscribes: checked above"),
            Backend::Inproc(inproc) => {
                inproc.subscribe(topic, subscribe);
                Ok(())
            }
            Backend::Unattached => Err(self.not_attached(operation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// An ipc endpoint's file under the temporary directory, removed when dropped: also when
    /// the test fails.
    struct IpcFile(std::path::PathBuf);

    impl IpcFile {
        fn new(tag: &str) -> IpcFile {
            IpcFile(
                std::env::temp_dir()
                    .join(format!("ferromq-socket-{tag}-{}.ipc", std::process::id())),
            )
        }

        fn address(&self) -> String {
            format!("ipc://{}", self.0.display())
        }
    }

    impl Drop for IpcFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A channel's `sndKernelSize` / `rcvKernelSize` are what its own push or pull sets on each
    /// connection (the connections themselves: `zmtp_channel`'s tests).
    #[tokio::test]
    async fn a_push_over_ipc_carries_the_channels_kernel_sizes_to_its_connections() {
        let file = IpcFile::new("kernel-sizes");
        let address = file.address();
        let mut config = ChannelConfig::new("data", SocketType::Push, ferromq_core::Method::Bind)
            .with_address(address.as_str());
        config.snd_kernel_size = 96 << 10;
        config.rcv_kernel_size = 80 << 10;
        let mut socket = ZmqSocket::new(&config, "data", crate::PeerRules::ZEROMQ, true);
        socket
            .bind(&Address::parse(&address).unwrap())
            .await
            .unwrap();
        match &socket.backend {
            Backend::Zmtp(zmtp) => assert_eq!(
                zmtp.kernel_sizes(),
                crate::zmtp_channel::KernelSizes {
                    send: 96 << 10,
                    receive: 80 << 10
                }
            ),
            _ => panic!("a push over ipc is ferromq's own"),
        }
        socket.close(Duration::ZERO).await.unwrap();
    }

    /// Waits (yielding, so the connections' tasks run) until `try_next_peer` hands out a
    /// connection; `None` after 10 s.
    async fn next_peer_by_looking(socket: &ZmqSocket) -> Option<bytes::Bytes> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Some(peer) = socket.try_next_peer() {
                return Some(peer.expect("a peer of this transport").0);
            }
            tokio::task::yield_now().await;
        }
        None
    }

    /// `try_next_peer` hands out each new connection once, as `next_peer` does, and nothing
    /// when none is new; a socket that does not report its peers hands out nothing.
    #[tokio::test]
    async fn looking_for_new_peers_without_waiting_finds_each_connection_once() {
        let file = IpcFile::new("try-next-peer");
        let address = file.address();
        let parsed = Address::parse(&address).unwrap();
        let config = |socket_type, method| {
            ChannelConfig::new("data", socket_type, method).with_address(address.as_str())
        };
        let mut push = ZmqSocket::new(
            &config(SocketType::Push, ferromq_core::Method::Bind),
            "data",
            crate::PeerRules::ZEROMQ,
            true,
        );
        push.report_new_peers();
        push.bind(&parsed).await.unwrap();
        assert!(push.try_next_peer().is_none(), "nobody connected yet");
        let mut pulls = Vec::new();
        let mut seen = Vec::new();
        for _ in 0..2 {
            let mut pull = ZmqSocket::new(
                &config(SocketType::Pull, ferromq_core::Method::Connect),
                "data",
                crate::PeerRules::ZEROMQ,
                true,
            );
            pull.connect(&parsed).await.unwrap();
            pulls.push(pull);
            let peer = next_peer_by_looking(&push)
                .await
                .expect("the new connection is handed out");
            assert!(!seen.contains(&peer), "each connection once");
            seen.push(peer);
            assert!(push.try_next_peer().is_none(), "nothing new after it");
        }
        // A pull does not report its peers: nothing, however many connect.
        assert!(pulls[0].try_next_peer().is_none());
        for mut pull in pulls {
            pull.close(Duration::ZERO).await.unwrap();
        }
        push.close(Duration::ZERO).await.unwrap();
    }

    /// A sender and a receiver of `kinds` (push and pull, or two pairs) over `address`, the
    /// receiver bound with an inbox of `rcv_buf_size` messages.
    async fn sender_and_receiver(
        address: &str,
        kinds: (SocketType, SocketType),
        rcv_buf_size: usize,
    ) -> (ZmqSocket, ZmqSocket) {
        let parsed = Address::parse(address).unwrap();
        let mut receiving =
            ChannelConfig::new("data", kinds.1, ferromq_core::Method::Bind).with_address(address);
        receiving.rcv_buf_size = rcv_buf_size;
        let mut receiver = ZmqSocket::new(&receiving, "data", crate::PeerRules::ZEROMQ, true);
        receiver.bind(&parsed).await.unwrap();
        let sending = ChannelConfig::new("data", kinds.0, ferromq_core::Method::Connect)
            .with_address(address);
        let mut sender = ZmqSocket::new(&sending, "data", crate::PeerRules::ZEROMQ, true);
        sender.connect(&parsed).await.unwrap();
        (sender, receiver)
    }

    /// A tcp address on loopback whose port was free a moment ago.
    fn free_tcp_address() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        format!("tcp://127.0.0.1:{port}")
    }

    fn one_part(byte: u8, size: usize) -> Parts {
        Parts::from(ferromq_core::Message::from(vec![byte; size]))
    }

    /// A pair of the zeromq transport on `address` whose inbox holds 10 messages: its peer's
    /// writes soon wait for it.
    fn pair_with_a_small_inbox(address: &str, method: ferromq_core::Method) -> ZmqSocket {
        let mut config = ChannelConfig::new("data", SocketType::Pair, method).with_address(address);
        config.rcv_buf_size = 10;
        ZmqSocket::new(&config, "data", crate::PeerRules::ZEROMQ, true)
    }

    /// How many messages a close reported lost (0 for `Ok`).
    fn n_undelivered(closed: Result<()>) -> u64 {
        match closed {
            Ok(()) => 0,
            Err(ferromq_core::Error::Undelivered { n_messages, .. }) => n_messages,
            Err(other) => panic!("not an Undelivered: {other}"),
        }
    }

    /// A pull or pair of the zeromq transport that closes with messages its sender wrote to
    /// it and it did not take reports them (`Undelivered`, naming the count), over ipc, tcp and
    /// inproc: the sender, which had written them all, closed `Ok`. Before, the receiver
    /// closed `Ok` and they were lost without a word.
    #[tokio::test]
    async fn a_receiver_closing_with_messages_it_did_not_take_reports_them() {
        let file = IpcFile::new("unread");
        let addresses = [
            file.address(),
            free_tcp_address(),
            format!("inproc://unread-{}", std::process::id()),
        ];
        for address in &addresses {
            for kinds in [
                (SocketType::Push, SocketType::Pull),
                (SocketType::Pair, SocketType::Pair),
            ] {
                let (mut sender, mut receiver) = sender_and_receiver(address, kinds, 1000).await;
                for i in 0..20 {
                    sender.send_unboxed(one_part(i, 64), None).await.unwrap();
                }
                for i in 0..5 {
                    let parts = receiver.receive_unboxed().await.unwrap();
                    assert_eq!(parts.get(0).unwrap().data()[0], i, "{address}: in order");
                }
                sender.close(Duration::from_secs(5)).await.unwrap();
                match receiver.close(Duration::from_secs(5)).await {
                    Err(ferromq_core::Error::Undelivered {
                        n_messages, reason, ..
                    }) => {
                        assert_eq!(n_messages, 15, "{address} {kinds:?}: {reason}");
                        assert!(reason.contains("closed before taking them"), "{reason}");
                    }
                    other => panic!("{address} {kinds:?}: 15 not taken, and {other:?}"),
                }
            }
        }
    }

    /// Two pairs that each sent the other more than its connection and inbox hold, each taking
    /// a few, close one after the other: every message, both ways, is taken or counted once,
    /// by its sender (not written) or by its receiver (written, not taken). The first close
    /// stops the second pair's writes; its reader still takes in what came before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_pairs_closing_in_turn_leave_every_message_both_ways_counted_once() {
        let file = IpcFile::new("unread-pairs");
        two_pairs_closing_in_turn(&file.address()).await;
    }

    /// As over ipc, over tcp (where `SHUT_RD` tells the peer nothing). The second pair's reader
    /// waits for room in its inbox, so it does not see the first's end of writing; its writer,
    /// with room again once the first drains, writes what it held, and the first reads that
    /// until half a second passes without bytes, then shuts its reading.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_pairs_closing_in_turn_over_tcp_leave_every_message_both_ways_counted_once() {
        two_pairs_closing_in_turn(&free_tcp_address()).await;
    }

    /// A pair that sends while it does not receive holds back its peer's sends once its inbox
    /// (`rcvBufSize`) and the connection's kernel buffers are full, over tcp and ipc. Before,
    /// its writer's look whether the peer had closed (one read ahead per batch, kept for the
    /// reader) took in the peer's stream while the reader waited for room: the peer's sends
    /// never waited, and the pair's memory grew with everything the peer sent (1.4 M messages
    /// of 1 KiB in 7 s here). Then both close within their lingers, whatever each still holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pair_sending_without_receiving_holds_back_its_peer() {
        let file = IpcFile::new("pair-holds-back");
        for address in [free_tcp_address(), file.address()] {
            let (first, second) =
                sender_and_receiver(&address, (SocketType::Pair, SocketType::Pair), 10).await;
            // The second never receives; it sends until the first is done.
            let done = Arc::new(AtomicBool::new(false));
            let streaming = send_until(second, Arc::clone(&done));
            // 200 MB: far more than the kernel's buffers, the queue and an inbox of 10 hold.
            const MOST: u64 = 200_000;
            let (mut first, n_sent) = fill_at_most(first, MOST).await;
            done.store(true, Ordering::SeqCst);
            let mut second = streaming.await.unwrap();
            assert!(
                n_sent < MOST,
                "{address}: a pair that does not receive took {n_sent} messages without holding back"
            );
            let closing = async {
                let _ = first.close(Duration::from_millis(200)).await;
                let _ = second.close(Duration::ZERO).await;
            };
            tokio::time::timeout(Duration::from_secs(20), closing)
                .await
                .unwrap_or_else(|_| panic!("{address}: the pairs' closes did not end"));
        }
    }

    /// A pair closing over tcp while its peer pair goes on sending and does not receive: the
    /// peer cannot be told to stop (its window closed, the first's end of writing waits behind
    /// what the first wrote), so the first, once more has come than a peer that stopped could
    /// have had under way (64 MiB beyond four times the kernel buffers), shuts its reading and
    /// ends, instead of reading the peer's stream into its inbox for a second linger (3 s here;
    /// 830 MB in 2 s once). What was in flight is lost uncounted: TCP can tell nothing to a peer
    /// that reads nothing (the module's docs).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tcp_pair_closing_under_a_peer_that_sends_and_reads_nothing_ends_before_its_linger() {
        let (first, second) = sender_and_receiver(
            &free_tcp_address(),
            (SocketType::Pair, SocketType::Pair),
            10,
        )
        .await;
        let done = Arc::new(AtomicBool::new(false));
        let streaming = send_until(second, Arc::clone(&done));
        let (mut first, _) = fill(first).await;
        let started = tokio::time::Instant::now();
        let closed =
            tokio::time::timeout(Duration::from_secs(60), first.close(Duration::from_secs(3)))
                .await;
        let took = started.elapsed();
        done.store(true, Ordering::SeqCst);
        let mut second = streaming.await.unwrap();
        let _ = second.close(Duration::ZERO).await;
        // The first phase of the close waits its linger for what the first could not write
        // (the peer takes nothing); the drain after it must not take a second linger.
        assert!(
            took < Duration::from_secs(5),
            "the close took {took:?}: {closed:?}"
        );
    }

    /// Two pairs on `address` each send the other until a send waits, take 5 and close, one
    /// after the other: each accepted message, both ways, is taken or counted once.
    async fn two_pairs_closing_in_turn(address: &str) {
        const N_TAKEN: u64 = 5;
        let (first, second) =
            sender_and_receiver(address, (SocketType::Pair, SocketType::Pair), 10).await;
        let (filled_first, filled_second) =
            tokio::join!(tokio::spawn(fill(first)), tokio::spawn(fill(second)));
        let ((mut first, first_sent), (mut second, second_sent)) =
            (filled_first.unwrap(), filled_second.unwrap());
        for pair in [&mut first, &mut second] {
            for _ in 0..N_TAKEN {
                pair.receive_unboxed().await.unwrap();
            }
        }
        let first_lost = n_undelivered(first.close(Duration::ZERO).await);
        let second_lost = n_undelivered(second.close(Duration::from_millis(200)).await);
        assert_eq!(
            2 * N_TAKEN + first_lost + second_lost,
            first_sent + second_sent,
            "{address}: sent {first_sent} and {second_sent}, lost by the first {first_lost}, \
             by the second {second_lost}"
        );
    }

    /// A task sending messages of 1 KiB on `socket` (each send waiting at most 20 ms) until
    /// `done`; it hands the socket back.
    fn send_until(
        mut socket: ZmqSocket,
        done: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<ZmqSocket> {
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let _ = socket
                    .send_unboxed(one_part(2, 1024), Some(Duration::from_millis(20)))
                    .await;
            }
            socket
        })
    }

    /// Sends messages of 1 KiB until a send waits 50 ms (its queue, the kernel's buffers and
    /// the peer's inbox full): the socket, and how many it accepted.
    async fn fill(socket: ZmqSocket) -> (ZmqSocket, u64) {
        fill_at_most(socket, u64::MAX).await
    }

    /// As [`fill`], stopping at `most` messages.
    async fn fill_at_most(mut socket: ZmqSocket, most: u64) -> (ZmqSocket, u64) {
        let mut n_accepted = 0u64;
        while n_accepted < most
            && socket
                .send_unboxed(
                    one_part(n_accepted as u8, 1024),
                    Some(Duration::from_millis(50)),
                )
                .await
                .is_ok()
        {
            n_accepted += 1;
        }
        (socket, n_accepted)
    }

    /// A pair whose peer left while its inbox was full (its reader waiting for the owner to
    /// take something) stops counting that connection as its peer once a write to it fails,
    /// so the next peer is served and gets what the owner sends: bound, it accepts the next
    /// peer; connecting, it connects again. Before, the connection waited for its reader for
    /// ever, and every new peer was refused ("one peer at a time"), or never connected to.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pair_whose_peer_left_while_its_inbox_was_full_serves_the_next_peer() {
        for pair_binds in [true, false] {
            let file = IpcFile::new(&format!("pair-next-peer-{pair_binds}"));
            let address = file.address();
            let parsed = Address::parse(&address).unwrap();
            let (pair_method, peer_method) = if pair_binds {
                (ferromq_core::Method::Bind, ferromq_core::Method::Connect)
            } else {
                (ferromq_core::Method::Connect, ferromq_core::Method::Bind)
            };
            let open = |method| pair_with_a_small_inbox(&address, method);
            async fn attach(socket: &mut ZmqSocket, method: ferromq_core::Method, at: &Address) {
                match method {
                    ferromq_core::Method::Bind => drop(socket.bind(at).await.unwrap()),
                    ferromq_core::Method::Connect => socket.connect(at).await.unwrap(),
                }
            }
            let (mut pair, mut first_peer) = (open(pair_method), open(peer_method));
            for (socket, method) in [(&mut pair, pair_method), (&mut first_peer, peer_method)] {
                attach(socket, method, &parsed).await;
            }
            // More than the pair's inbox and the connection hold: the peer's close gives up on
            // the rest after its linger and leaves.
            for i in 0..900u32 {
                first_peer
                    .send_unboxed(one_part(i as u8, 4096), None)
                    .await
                    .unwrap();
            }
            assert!(n_undelivered(first_peer.close(Duration::from_millis(200)).await) > 0);
            // Its write to the peer that left fails; the connection stops being its peer.
            pair.send_unboxed(one_part(1, 64), None).await.unwrap();
            let mut next_peer = open(peer_method);
            attach(&mut next_peer, peer_method, &parsed).await;
            let received =
                tokio::time::timeout(Duration::from_secs(20), next_peer.receive_unboxed())
                    .await
                    .unwrap_or_else(|_| {
                        panic!("the next peer was never served (the pair binds: {pair_binds})")
                    })
                    .unwrap();
            assert_eq!(received.get(0).unwrap().data(), &[1; 64][..]);
            next_peer.close(Duration::ZERO).await.unwrap();
            // What the first peer wrote before it left is still the pair's to take or report.
            assert!(n_undelivered(pair.close(Duration::ZERO).await) > 0);
        }
    }

    /// A connection ends as soon as a write to it fails, its reader possibly still taking in
    /// what the peer sent before its end (here held back by a full inbox): the link says when
    /// the reader is done, and from then on every message the peer wrote is taken without
    /// waiting. (A shmem req whose replier left looks for the reply that way.)
    #[tokio::test]
    async fn a_link_says_when_everything_its_peer_sent_is_in_the_inbox() {
        use futures::FutureExt;
        const N_SENT: u64 = 900;
        let file = IpcFile::new("link-read-everything");
        let address = file.address();
        let parsed = Address::parse(&address).unwrap();
        let open = |method| pair_with_a_small_inbox(&address, method);
        let mut pair = open(ferromq_core::Method::Bind);
        pair.report_new_peers();
        drop(pair.bind(&parsed).await.unwrap());
        let mut peer = open(ferromq_core::Method::Connect);
        peer.connect(&parsed).await.unwrap();
        let (_, link) = tokio::time::timeout(Duration::from_secs(10), pair.next_peer())
            .await
            .expect("the peer connects")
            .unwrap();
        // More than the pair's inbox and the connection hold: the peer gives up on the rest.
        for i in 0..N_SENT {
            peer.send_unboxed(one_part(i as u8, 4096), None)
                .await
                .unwrap();
        }
        let n_unwritten = n_undelivered(peer.close(Duration::from_millis(200)).await);
        // The write to the peer that left fails, and the connection ends.
        link.send_frame(b"to nobody");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !link.is_gone() {
            assert!(
                std::time::Instant::now() < deadline,
                "the failed write ends the connection"
            );
            tokio::task::yield_now().await;
        }
        assert!(
            !link.has_read_everything(),
            "the reader waits for room in the full inbox"
        );
        let mut n_taken = 0;
        let taking = async {
            loop {
                tokio::select! {
                    received = pair.receive_unboxed() => {
                        received.unwrap();
                        n_taken += 1;
                    }
                    () = link.everything_read() => break,
                }
            }
        };
        // The connection's task ends once its reader is done (it hung when the failed write
        // was of frames alone).
        tokio::time::timeout(Duration::from_secs(10), taking)
            .await
            .expect("the reader is done once the peer's end is read");
        while let Some(received) = pair.receive_unboxed().now_or_never() {
            received.unwrap();
            n_taken += 1;
        }
        assert_eq!(n_taken, N_SENT - n_unwritten);
        pair.close(Duration::ZERO).await.unwrap();
    }

    /// A socket dropped without a close says what it lost, as a close would count it: a sender
    /// what it had accepted and not written, a receiver what reached it and it did not take.
    #[tokio::test]
    async fn a_socket_dropped_without_a_close_says_what_it_lost() {
        let logs = ferromq_log_capture::CapturedLogs::start();
        let file = IpcFile::new("dropped-without-close");
        let address = file.address();
        let parsed = Address::parse(&address).unwrap();
        let open = |method| pair_with_a_small_inbox(&address, method);
        let mut receiver = open(ferromq_core::Method::Bind);
        drop(receiver.bind(&parsed).await.unwrap());
        let mut sender = open(ferromq_core::Method::Connect);
        sender.connect(&parsed).await.unwrap();
        // More than the receiver's inbox and the connection hold.
        for i in 0..900u32 {
            sender
                .send_unboxed(one_part(i as u8, 4096), None)
                .await
                .unwrap();
        }
        // Until the receiver's inbox holds messages (the connection's tasks run as this
        // yields), both ends having something to lose.
        let lost_at_drop = |socket: &ZmqSocket| match &socket.backend {
            Backend::Zmtp(zmtp) => zmtp.lost_at_drop(),
            _ => panic!("a pair over ipc is ferromq's own"),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while lost_at_drop(&receiver).1 == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the receiver's inbox fills up"
            );
            tokio::task::yield_now().await;
        }
        assert!(lost_at_drop(&sender).0 > 0);
        drop(sender);
        drop(receiver);
        let text = logs.text();
        for said in [
            "a socket dropped without a close lost at most n_messages that send had accepted and not written yet",
            "a receiver dropped without a close lost messages that reached it",
        ] {
            assert_eq!(text.matches(said).count(), 1, "{said:?} once in\n{text}");
        }
        // Inproc too: a sender hands its messages to the receiver's inbox, so a receiver
        // dropped with them there is the one that can say so (it said nothing before).
        logs.clear();
        let address = format!("inproc://dropped-without-close-{}", std::process::id());
        let parsed = Address::parse(&address).unwrap();
        let mut receiver = pair_with_a_small_inbox(&address, ferromq_core::Method::Bind);
        drop(receiver.bind(&parsed).await.unwrap());
        let mut sender = pair_with_a_small_inbox(&address, ferromq_core::Method::Connect);
        sender.connect(&parsed).await.unwrap();
        for i in 0..3u8 {
            sender.send_unboxed(one_part(i, 64), None).await.unwrap();
        }
        drop(receiver);
        sender.close(Duration::ZERO).await.unwrap();
        let text = logs.text();
        let said = "a receiver dropped without a close lost messages that reached it";
        assert_eq!(text.matches(said).count(), 1, "{said:?} once in\n{text}");
        assert!(text.contains("n_messages=3"), "{text}");
    }

    /// A receiver that closes while its sender still writes: what it read is its count, what
    /// the sender could not write any more is the sender's (its writes to the closed
    /// connection fail and go back to its queue), so every message is taken or counted by one
    /// of them, once (ipc: a unix stream's writer is told at once that its reader is gone).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_receiver_closing_under_a_live_sender_leaves_every_message_counted_once() {
        let file = IpcFile::new("unread-live");
        closing_under_a_live_sender(&file.address()).await;
    }

    /// As over ipc, over tcp, where the sender is not told of the receiver's `SHUT_RD`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_receiver_closing_under_a_live_sender_over_tcp_leaves_every_message_counted_once() {
        closing_under_a_live_sender(&free_tcp_address()).await;
    }

    /// A push on `address` sending messages of 1 KiB for as long as it can to a pull that
    /// takes 5 and closes once the push had to wait (the connection's kernel buffers, the
    /// push's queue and the pull's inbox full): each accepted message is taken or counted once.
    async fn closing_under_a_live_sender(address: &str) {
        const N_TAKEN: u64 = 5;
        let (mut sender, mut receiver) =
            sender_and_receiver(address, (SocketType::Push, SocketType::Pull), 10).await;
        let (waited_tx, mut waited_rx) = tokio::sync::watch::channel(false);
        let closed = Arc::new(AtomicBool::new(false));
        let sending = tokio::spawn({
            let closed = Arc::clone(&closed);
            async move {
                let mut n_accepted = 0u64;
                loop {
                    let parts = one_part(n_accepted as u8, 1024);
                    match sender
                        .send_unboxed(parts, Some(Duration::from_millis(50)))
                        .await
                    {
                        Ok(()) => n_accepted += 1,
                        // Its peer gone, the push waits: nothing more will be accepted.
                        Err(_) if closed.load(Ordering::SeqCst) => return (sender, n_accepted),
                        Err(_) => {
                            waited_tx.send_replace(true);
                        }
                    }
                }
            }
        });
        waited_rx.wait_for(|&waited| waited).await.unwrap();
        for _ in 0..N_TAKEN {
            receiver.receive_unboxed().await.unwrap();
        }
        // No linger: reading what this host's buffers hold needs no wait for the peer.
        let unread = n_undelivered(receiver.close(Duration::ZERO).await);
        closed.store(true, Ordering::SeqCst);
        let (mut sender, n_accepted) = sending.await.unwrap();
        let unsent = n_undelivered(sender.close(Duration::from_millis(200)).await);
        assert!(unread > 0, "the receiver held some in its inbox");
        assert_eq!(
            N_TAKEN + unread + unsent,
            n_accepted,
            "{address}: taken {N_TAKEN}, unread {unread}, unsent {unsent} of {n_accepted} accepted"
        );
    }
}
