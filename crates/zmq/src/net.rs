//! tcp and ipc sockets over zmq.rs.
//!
//! zmq.rs provides PUSH, PULL, PUB, SUB, REQ, REP and DEALER but no PAIR; ferromq's pair is a
//! DEALER on both ends (same frames on the wire, one peer expected). What zmq.rs lacks that
//! ferromq promises is added around it here:
//! - binding is done by ferromq (std listeners handed to zmq.rs), so "address in use", port 0
//!   and stale ipc socket files get exact answers;
//! - a send with no peer yet waits (zmq.rs fails it), retrying with a short backoff;
//! - `sndBufSize` and `linger` are enforced with [`InFlight`].

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferromq_core::{Address, ChannelLabel, Error, Message, Parts, SendError, SocketType, TcpHost};
use tokio::time::Instant;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _, ZmqError, ZmqMessage};

use crate::flow::InFlight;

/// The zmq.rs socket of each pattern.
pub(crate) enum NetSocket {
    Push(zeromq::PushSocket),
    Pull(zeromq::PullSocket),
    Pub(zeromq::PubSocket),
    Sub(zeromq::SubSocket),
    Req(zeromq::ReqSocket),
    /// zmq.rs's REP keeps a requester's broken connection in its queue, so one that died in the
    /// middle of a frame made every receive fail at once, forever (a spinning device). A ROUTER
    /// drops such a peer; the REP envelope is kept here instead (see `NetChannel::receive`).
    Rep(zeromq::RouterSocket),
    Pair(zeromq::DealerSocket),
}

/// Runs the same expression on whichever zmq.rs socket `$net` holds.
macro_rules! on_socket {
    ($net:expr, $socket:ident => $body:expr) => {
        match $net {
            NetSocket::Push($socket) => $body,
            NetSocket::Pull($socket) => $body,
            NetSocket::Pub($socket) => $body,
            NetSocket::Sub($socket) => $body,
            NetSocket::Req($socket) => $body,
            NetSocket::Rep($socket) => $body,
            NetSocket::Pair($socket) => $body,
        }
    };
}

impl NetSocket {
    fn new(socket_type: SocketType, identity: &str) -> NetSocket {
        // Connects wait for their peer as long as it takes: a device in CONNECTING waits for
        // its binder, and the device's own timeout (or a STOP) ends the wait.
        let options = || {
            let mut options = zeromq::SocketOptions::default();
            options.no_connect_timeout();
            if let Ok(identity) = zeromq::util::PeerIdentity::try_from(identity.as_bytes()) {
                options.peer_identity(identity);
            }
            options
        };
        match socket_type {
            SocketType::Push => NetSocket::Push(zeromq::PushSocket::with_options(options())),
            SocketType::Pull => NetSocket::Pull(zeromq::PullSocket::with_options(options())),
            SocketType::Pub => NetSocket::Pub(zeromq::PubSocket::with_options(options())),
            SocketType::Sub => NetSocket::Sub(zeromq::SubSocket::with_options(options())),
            SocketType::Req => NetSocket::Req(zeromq::ReqSocket::with_options(options())),
            SocketType::Rep => NetSocket::Rep(zeromq::RouterSocket::with_options(options())),
            SocketType::Pair => NetSocket::Pair(zeromq::DealerSocket::with_options(options())),
        }
    }

    async fn send(&mut self, message: ZmqMessage) -> Result<(), ZmqError> {
        match self {
            NetSocket::Push(socket) => socket.send(message).await,
            NetSocket::Pub(socket) => socket.send(message).await,
            NetSocket::Req(socket) => socket.send(message).await,
            NetSocket::Rep(socket) => socket.send(message).await,
            NetSocket::Pair(socket) => socket.send(message).await,
            NetSocket::Pull(_) | NetSocket::Sub(_) => {
                Err(ZmqError::Socket("cannot send on this socket"))
            }
        }
    }

    async fn recv(&mut self) -> Result<ZmqMessage, ZmqError> {
        match self {
            NetSocket::Pull(socket) => socket.recv().await,
            NetSocket::Sub(socket) => socket.recv().await,
            NetSocket::Req(socket) => socket.recv().await,
            NetSocket::Rep(socket) => socket.recv().await,
            NetSocket::Pair(socket) => socket.recv().await,
            NetSocket::Push(_) | NetSocket::Pub(_) => {
                Err(ZmqError::Socket("cannot receive on this socket"))
            }
        }
    }
}

/// A channel's zmq.rs socket plus the state ferromq keeps around it.
pub(crate) struct NetChannel {
    socket: NetSocket,
    socket_type: SocketType,
    snd_buf_size: usize,
    in_flight: Arc<InFlight>,
    bound_ipc_paths: Vec<PathBuf>,
    rules: crate::PeerRules,
    /// Connection events, for the identities of the peers (see `handshake.rs`).
    events: futures::channel::mpsc::Receiver<zeromq::SocketEvent>,
    mismatch: Option<crate::handshake::Mismatch>,
    /// Endpoints `connect` accepted that are not connected yet (see [`NetChannel::connect`]).
    pending_connects: Vec<(String, ChannelLabel)>,
    /// Peers that were connected and went away (closed their end, or their process died).
    n_peers_gone: u64,
    /// The processes of the ferromq peers that connected (their identity names them).
    peer_pids: Vec<u32>,
    /// Rep: the routing envelope of the request being answered (the requester's routing id,
    /// any relays' ids, the empty delimiter), put in front of the reply.
    reply_envelope: Option<Vec<Bytes>>,
}

const PEER_WAIT_MIN: Duration = Duration::from_micros(200);
const PEER_WAIT_MAX: Duration = Duration::from_millis(20);

impl NetChannel {
    pub(crate) fn new(
        socket_type: SocketType,
        snd_buf_size: usize,
        rules: crate::PeerRules,
        figures: Arc<ferromq_core::SendFigures>,
    ) -> NetChannel {
        let mut socket = NetSocket::new(socket_type, &crate::handshake::identity(rules));
        let events = on_socket!(&mut socket, socket => socket.monitor());
        NetChannel {
            socket,
            socket_type,
            snd_buf_size,
            in_flight: Arc::new(InFlight::with_figures(figures)),
            bound_ipc_paths: Vec::new(),
            rules,
            events,
            mismatch: None,
            pending_connects: Vec::new(),
            n_peers_gone: 0,
            peer_pids: Vec::new(),
            reply_envelope: None,
        }
    }

    /// Takes in one connection event. A peer of another transport or session fails a socket
    /// that needs every peer (push, req, rep, pair, pub); a fan-in socket (pull, sub) refuses
    /// that one peer, says so once, and keeps serving the others.
    fn note_peer(&mut self, label: &ChannelLabel, event: &zeromq::SocketEvent) {
        if let zeromq::SocketEvent::Disconnected(peer) = event {
            tracing::debug!(channel = %label, peer = %String::from_utf8_lossy(peer.as_ref()), "peer gone");
            self.n_peers_gone += 1;
            return;
        }
        if let zeromq::SocketEvent::Accepted(_, peer) | zeromq::SocketEvent::Connected(_, peer) =
            event
            && let Some(pid) = crate::handshake::peer_pid(peer)
            && !self.peer_pids.contains(&pid)
        {
            self.peer_pids.push(pid);
        }
        let Some((mismatch, peer)) = crate::handshake::misfit(self.rules, event) else {
            return;
        };
        if self.is_fan_in() {
            tracing::warn!(channel = %label, %peer, problem = %mismatch.error(label), "refused a peer; serving the others");
        } else {
            self.mismatch.get_or_insert(mismatch);
        }
    }

    fn is_fan_in(&self) -> bool {
        matches!(self.socket_type, SocketType::Pull | SocketType::Sub)
    }

    /// Reads the identities of newly connected peers; an error once a peer of another transport
    /// or session has connected.
    fn check_peers(&mut self, label: &ChannelLabel) -> Result<(), Error> {
        use futures::{FutureExt, StreamExt};
        while let Some(Some(event)) = self.events.next().now_or_never() {
            self.note_peer(label, &event);
        }
        match self.mismatch {
            Some(mismatch) => Err(mismatch.error(label)),
            None => Ok(()),
        }
    }

    pub(crate) async fn bind(
        &mut self,
        label: &ChannelLabel,
        address: &Address,
    ) -> Result<Address, Error> {
        let (bound, path) = on_socket!(&mut self.socket, socket => crate::endpoint::bind(socket, label, address).await)?;
        self.bound_ipc_paths.extend(path);
        Ok(bound)
    }

    pub(crate) async fn connect(
        &mut self,
        label: &ChannelLabel,
        address: &Address,
    ) -> Result<(), Error> {
        let label = label.clone().with_address(address.to_string());
        check_connectable(&label, address)?;
        let endpoint = address.to_string();
        // zmq.rs's connect waits until the peer exists. FairMQ connects in the background and
        // goes on to RUNNING, where messages wait for the peer: so the connection is made by the
        // first send or receive, which wait for a peer anyway.
        self.pending_connects.push((endpoint, label));
        Ok(())
    }

    /// True when this socket had peers and every one still holds what was written to it: none
    /// went away, and the process of each ferromq peer lives (a stopped one does). zmq.rs
    /// notices a peer's end only when writing to it, so the processes are looked at too.
    pub(crate) fn peers_hold_what_was_written(&mut self, label: &ChannelLabel) -> bool {
        let _ = self.check_peers(label);
        self.n_peers_gone == 0
            && !self.peer_pids.is_empty()
            && self
                .peer_pids
                .iter()
                .all(|&pid| crate::handshake::process_lives(pid))
    }

    /// Whether connections `connect` accepted wait to be made.
    pub(crate) fn is_connecting(&self) -> bool {
        !self.pending_connects.is_empty()
    }

    /// Makes the connections `connect` accepted; false when `deadline` passed first (the ones
    /// not made yet stay pending, so this is cancel-safe).
    pub(crate) async fn finish_connects(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<bool, Error> {
        while let Some((endpoint, label)) = self.pending_connects.first() {
            let connect =
                async { on_socket!(&mut self.socket, socket => socket.connect(endpoint).await) };
            let connected = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, connect).await {
                    Ok(connected) => connected,
                    Err(_) => return Ok(false),
                },
                None => connect.await,
            };
            if let Err(source) = connected {
                return Err(Error::Connect {
                    channel: label.clone(),
                    source: Box::new(source),
                });
            }
            self.pending_connects.remove(0);
        }
        Ok(true)
    }

    pub(crate) async fn send(
        &mut self,
        label: &ChannelLabel,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        let timed_out = |parts| {
            SendError::new(
                Error::Timeout {
                    channel: label.clone(),
                    after: timeout.unwrap_or_default(),
                },
                parts,
            )
        };
        if let Err(error) = self.check_peers(label) {
            return Err(SendError::new(error, parts));
        }
        match self.finish_connects(deadline).await {
            Ok(true) => {}
            Ok(false) => return Err(timed_out(parts)),
            Err(error) => return Err(SendError::new(error, parts)),
        }
        // A connection just made may be to a peer this socket cannot serve.
        if let Err(error) = self.check_peers(label) {
            return Err(SendError::new(error, parts));
        }
        if !self.in_flight.wait_below(self.snd_buf_size, deadline).await {
            return Err(timed_out(parts));
        }
        if self.socket_type == SocketType::Rep {
            return self.send_reply(label, parts).await;
        }
        let Some(mut frames) = self.to_frames(parts) else {
            return Ok(());
        };
        let mut peer_wait = PEER_WAIT_MIN;
        loop {
            // Bytes clones share the buffer; the copy is kept so that a peer that breaks
            // mid-send does not take the message with it.
            let kept = frames.clone();
            let message =
                ZmqMessage::try_from(frames).expect("to_frames never returns an empty message");
            match self.socket.send(message).await {
                Ok(()) => return Ok(()),
                Err(ZmqError::ReturnToSender { reason, .. }) if reason.contains("in progress") => {
                    return Err(SendError::new(
                        Error::WrongSocketType {
                            channel: label.clone(),
                            operation: "send a second request before receiving the reply",
                        },
                        frames_to_parts(kept),
                    ));
                }
                // No peer (yet), or the peer broke while we sent: wait for one, then retry.
                Err(ZmqError::ReturnToSender { .. } | ZmqError::BufferFull(_)) => {
                    frames = kept;
                    if let Err(error) = self.check_peers(label) {
                        return Err(SendError::new(error, frames_to_parts(frames)));
                    }
                    if deadline.is_some_and(|deadline| Instant::now() + peer_wait > deadline) {
                        return Err(timed_out(frames_to_parts(frames)));
                    }
                    let figures = self.in_flight.figures();
                    let _waiting = figures.waiting();
                    tokio::time::sleep(peer_wait).await;
                    peer_wait = (peer_wait * 2).min(PEER_WAIT_MAX);
                }
                Err(other) => {
                    return Err(SendError::new(
                        Error::Transport {
                            channel: label.clone(),
                            source: Box::new(other),
                        },
                        frames_to_parts(kept),
                    ));
                }
            }
        }
    }

    /// Rep: the reply goes to the requester of the last request, behind its envelope. A
    /// requester that left cannot get it (ZeroMQ drops such a reply; here the sender hears it).
    async fn send_reply(
        &mut self,
        label: &ChannelLabel,
        parts: Parts,
    ) -> Result<(), SendError<Parts>> {
        let Some(envelope) = self.reply_envelope.take() else {
            return Err(SendError::new(
                Error::WrongSocketType {
                    channel: label.clone(),
                    operation: "send a reply before receiving a request",
                },
                parts,
            ));
        };
        let Some(frames) = self.to_frames(parts) else {
            return Ok(());
        };
        let kept = frames.clone();
        let message = ZmqMessage::try_from(envelope.into_iter().chain(frames).collect::<Vec<_>>())
            .expect("an envelope has at least the routing id");
        self.socket.send(message).await.map_err(|error| {
            SendError::new(
                Error::PeerGone {
                    channel: label.clone(),
                    reason: format!("the requester left before its reply was sent ({error})"),
                },
                frames_to_parts(kept),
            )
        })
    }

    /// The parts as zmq.rs frames, the last one tracked by [`InFlight`]. `None` for no parts.
    fn to_frames(&self, parts: Parts) -> Option<Vec<Bytes>> {
        let message_size = parts.total_size();
        let mut frames: Vec<Bytes> = parts.into_iter().map(Message::into_bytes).collect();
        let last = frames.pop()?;
        frames.push(self.in_flight.track(last, message_size));
        Some(frames)
    }

    /// The next message. Cancel-safe: connections not made yet stay pending, and a message
    /// is only taken from zmq.rs by the last await before returning.
    pub(crate) async fn receive(&mut self, label: &ChannelLabel) -> Result<Parts, Error> {
        self.finish_connects(None).await?;
        loop {
            self.check_peers(label)?;
            // Wait for a message or a newly connected peer, whichever comes first: a peer of
            // another transport or session is reported without waiting for its data.
            let next = async {
                use futures::StreamExt;
                tokio::select! {
                    received = self.socket.recv() => Ok(received),
                    event = self.events.next() => Err(event),
                }
            };
            let received = match next.await {
                Ok(received) => received,
                Err(event) => {
                    if let Some(event) = event {
                        self.note_peer(label, &event);
                    }
                    continue;
                }
            };
            match received {
                Ok(message) => {
                    let message = if self.socket_type == SocketType::Rep {
                        let Some((envelope, request)) = split_envelope(message) else {
                            tracing::debug!(channel = %label, "dropped a request without an envelope or a body");
                            continue;
                        };
                        self.reply_envelope = Some(envelope);
                        request
                    } else {
                        message
                    };
                    // A shmem peer sends descriptor frames: report it rather than hand over garbage.
                    let from_shmem = self.rules.serves_plain_zeromq
                        && message.len() == 1
                        && message.get(0).is_some_and(|frame| {
                            frame.len() >= crate::SHMEM_DESCRIPTOR_MIN_LEN
                                && frame.starts_with(crate::SHMEM_DESCRIPTOR_MAGIC)
                        });
                    if from_shmem && self.is_fan_in() {
                        // Its peer was refused when it connected; its frames are not payloads.
                        continue;
                    }
                    if from_shmem {
                        return Err(Error::TransportMismatch {
                            channel: label.clone(),
                            peer_transport: "shmem",
                        });
                    }
                    return Ok(frames_to_parts(message.into_vec()));
                }
                // A fan-in socket keeps receiving from its other peers when one breaks.
                Err(error @ (ZmqError::Codec(_) | ZmqError::Network(_)))
                    if matches!(self.socket_type, SocketType::Pull | SocketType::Sub) =>
                {
                    tracing::debug!(channel = %label, %error, "peer dropped");
                }
                // A req's one peer of the moment ended its connection while the req awaited
                // its reply: killed (an I/O error on the connection), closed or restarted
                // (zmq.rs's bare `NoMessage`), or gone before the receive began (zmq.rs's
                // "Server disconnected"). A malformed frame from a live peer is not this.
                Err(ZmqError::NoMessage) if self.socket_type == SocketType::Req => {
                    return Err(replier_gone(label, "closed"));
                }
                Err(ZmqError::Codec(codec_error))
                    if self.socket_type == SocketType::Req
                        && connection_error(&codec_error).is_some() =>
                {
                    let cause = connection_error(&codec_error).map(ToString::to_string);
                    return Err(replier_gone(label, &cause.unwrap_or_default()));
                }
                Err(ZmqError::Other(reason))
                    if self.socket_type == SocketType::Req && reason.contains("disconnected") =>
                {
                    return Err(replier_gone(label, reason));
                }
                Err(ZmqError::Other(reason)) if reason.contains("disconnected") => {
                    return Err(Error::PeerGone {
                        channel: label.clone(),
                        reason: reason.to_owned(),
                    });
                }
                Err(other) => {
                    return Err(Error::Transport {
                        channel: label.clone(),
                        source: Box::new(other),
                    });
                }
            }
        }
    }

    pub(crate) async fn subscribe(
        &mut self,
        label: &ChannelLabel,
        topic: &[u8],
        subscribe: bool,
    ) -> Result<(), Error> {
        let NetSocket::Sub(socket) = &mut self.socket else {
            return Err(Error::WrongSocketType {
                channel: label.clone(),
                operation: if subscribe {
                    "subscribe"
                } else {
                    "unsubscribe"
                },
            });
        };
        let topic = std::str::from_utf8(topic).map_err(|utf8_error| Error::Transport {
            channel: label.clone(),
            source: format!("zmq.rs topics must be UTF-8: {utf8_error}").into(),
        })?;
        let result = if subscribe {
            socket.subscribe(topic).await
        } else {
            socket.unsubscribe(topic).await
        };
        result.map_err(|source| Error::Transport {
            channel: label.clone(),
            source: Box::new(source),
        })
    }

    /// Waits up to `linger` for every accepted message to be encoded for the wire.
    pub(crate) async fn close(
        &mut self,
        label: &ChannelLabel,
        linger: Duration,
    ) -> Result<(), Error> {
        // The writer flushes its last batch after encoding it; a sender gives it that time.
        let drained = if self.socket_type.can_send() {
            self.in_flight.drain_then_flush(linger).await
        } else {
            self.in_flight.drain(linger).await
        };
        // Stop the listeners now (zmq.rs removes their socket files as they stop), so that the
        // address is free when `close` returns.
        let _ = on_socket!(&mut self.socket, socket => socket.unbind_all().await);
        remove_socket_files(&mut self.bound_ipc_paths);
        match drained {
            Ok(()) => Ok(()),
            Err(n_left) => Err(Error::Undelivered {
                channel: label.clone(),
                n_messages: n_left as u64,
                reason: format!("the peer took none for linger = {linger:?}"),
            }),
        }
    }
}

/// A request as a ROUTER receives it, split into its envelope (the requester's routing id, any
/// relays' ids, the empty delimiter) and its body; `None` without a delimiter or a body.
fn split_envelope(message: ZmqMessage) -> Option<(Vec<Bytes>, ZmqMessage)> {
    let mut frames = message.into_vec();
    let delimiter_idx = frames.iter().skip(1).position(Bytes::is_empty)? + 1;
    let request = ZmqMessage::try_from(frames.split_off(delimiter_idx + 1)).ok()?;
    Some((frames, request))
}

fn frames_to_parts(frames: Vec<Bytes>) -> Parts {
    frames.into_iter().map(Message::from).collect()
}

/// Removes the ipc socket files a socket bound (and forgets them); one already gone is fine.
pub(crate) fn remove_socket_files(paths: &mut Vec<PathBuf>) {
    for path in paths.drain(..) {
        let _ = std::fs::remove_file(path);
    }
}

/// Whether a tcp or ipc socket can connect to `address`: not `tcp://*`, not port 0, not
/// inproc. (Port 0 was taken, and the socket then tried to reach a port no peer can have for
/// as long as it ran: a bad-input sweep.)
pub(crate) fn check_connectable(label: &ChannelLabel, address: &Address) -> Result<(), Error> {
    match address {
        Address::Tcp {
            host: TcpHost::Any, ..
        } => Err(Error::UnsupportedAddress {
            channel: label.clone(),
            address: address.to_string(),
            reason: "cannot connect to '*': name the host (127.0.0.1 for this machine)",
        }),
        Address::Tcp { port: 0, .. } => Err(Error::UnsupportedAddress {
            channel: label.clone(),
            address: address.to_string(),
            reason: "cannot connect to port 0, which asks a binding socket for a free port: \
                     name the peer's port",
        }),
        Address::Tcp { .. } | Address::Ipc { .. } => Ok(()),
        other => Err(Error::UnsupportedAddress {
            channel: label.clone(),
            address: other.to_string(),
            reason: "the zeromq transport connects to tcp://, ipc:// and inproc:// addresses",
        }),
    }
}

fn bind_error(label: &ChannelLabel, source: std::io::Error) -> Error {
    if source.kind() == std::io::ErrorKind::AddrInUse {
        return Error::AddressInUse {
            channel: label.clone(),
        };
    }
    Error::Bind {
        channel: label.clone(),
        source: Box::new(source),
    }
}

pub(crate) fn bind_tcp(
    label: &ChannelLabel,
    host: &TcpHost,
    port: u16,
) -> Result<(zeromq::Listener, Address), Error> {
    let (listener, bound) = bind_tcp_std(label, host, port)?;
    Ok((listener.into(), bound))
}

/// Binds a non-blocking tcp listener the way ferromq binds (exact address-in-use, port 0).
pub(crate) fn bind_tcp_std(
    label: &ChannelLabel,
    host: &TcpHost,
    port: u16,
) -> Result<(std::net::TcpListener, Address), Error> {
    let host_text = match host {
        TcpHost::Any => "0.0.0.0",
        TcpHost::Name(name) => name.as_str(),
    };
    let listener = std::net::TcpListener::bind((host_text, port))
        .map_err(|source| bind_error(label, source))?;
    listener
        .set_nonblocking(true)
        .map_err(|source| bind_error(label, source))?;
    let local = listener
        .local_addr()
        .map_err(|source| bind_error(label, source))?;
    let bound = Address::Tcp {
        host: host.clone(),
        port: local.port(),
    };
    Ok((listener, bound))
}

pub(crate) fn bind_ipc(label: &ChannelLabel, path: &Path) -> Result<zeromq::Listener, Error> {
    Ok(bind_ipc_std(label, path)?.into())
}

/// Binds a non-blocking unix listener at `path`, removing a stale socket file first.
pub(crate) fn bind_ipc_std(
    label: &ChannelLabel,
    path: &Path,
) -> Result<std::os::unix::net::UnixListener, Error> {
    if path.to_string_lossy().starts_with('@') {
        return Err(Error::UnsupportedAddress {
            channel: label.clone(),
            address: format!("ipc://{}", path.display()),
            reason: "abstract unix sockets are not supported by zmq.rs; use a file path",
        });
    }
    // A socket file left by a crashed process is stale when nobody accepts on it: remove it,
    // as libzmq does. A live one means another process binds this address.
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            // Not "address in use" (ipc:///tmp said so): what is there, and that only a stale
            // socket is ever removed.
            let what = if metadata.is_dir() {
                "a directory"
            } else {
                "a file that is not a socket"
            };
            return Err(Error::Bind {
                channel: label.clone(),
                source: format!(
                    "{} is {what} (only a socket file left by a process that ended is replaced)",
                    path.display()
                )
                .into(),
            });
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(Error::AddressInUse {
                channel: label.clone(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let listener =
        std::os::unix::net::UnixListener::bind(path).map_err(|source| bind_error(label, source))?;
    listener
        .set_nonblocking(true)
        .map_err(|source| bind_error(label, source))?;
    Ok(listener)
}

/// A req's receive that ended with its replier's connection: `cause` as observed.
fn replier_gone(label: &ChannelLabel, cause: &str) -> Error {
    Error::PeerGone {
        channel: label.clone(),
        reason: format!("the replier's connection ended before its reply came ({cause})"),
    }
}

/// The I/O error under a codec error (zmq.rs's `CodecError::Io`, which the crate does not
/// export): the connection failed, as opposed to a frame that did not decode.
fn connection_error<'a>(
    codec_error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a std::io::Error> {
    std::error::Error::source(codec_error)?.downcast_ref::<std::io::Error>()
}
