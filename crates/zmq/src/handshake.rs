//! Telling transports and sessions apart at connect time, by rules the transport passes in.
//!
//! Every ferromq socket announces an identity in its ZMTP handshake,
//! `fmq:<transport>:<scope>:<pid>:<n>` (`scope` is `-` for none; unique per socket, since zmq.rs
//! keys its peers by identity), made from its [`PeerRules`]: the zeromq transport's own
//! ([`PeerRules::ZEROMQ`]), or those a transport that carries its frames over zeromq passes in
//! (shmem: its name, its session as the scope, no plain ZeroMQ peers). Each side reads the
//! identities of the peers that connect and checks them against its rules. A peer of another
//! transport, or of another scope, makes a socket that needs every peer (push, req, rep, pair,
//! pub) fail its sends and receives with an error that says what was detected, before any
//! payload is misread; a fan-in socket (pull, sub) instead refuses that one peer (a warning
//! naming it, once), drops its frames and keeps serving the others. Peers that announce nothing
//! of ours (libzmq, FairMQ) are served where the rules say so, and named as plain ZeroMQ where not.

use std::sync::atomic::{AtomicU64, Ordering};

use ferromq_core::{ChannelLabel, Error};

static NEXT_SOCKET: AtomicU64 = AtomicU64::new(0);

/// The rules a socket follows in its ZMTP handshake: whom it says it is, and which peers it
/// serves. zmq knows no other transport: one that carries its own frames over zeromq passes its
/// rules to [`crate::ZmqTransport::with_peer_rules`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerRules {
    /// The transport the socket speaks for, as announced to peers and named in their errors.
    pub transport: &'static str,
    /// A scope every peer must share (shmem: its session's hash); `None` for none.
    pub scope: Option<u64>,
    /// Whether peers that announce no ferromq identity (libzmq, FairMQ) are served.
    pub serves_plain_zeromq: bool,
}

impl PeerRules {
    /// The zeromq transport's rules: any zeromq peer, ferromq's or not.
    pub const ZEROMQ: PeerRules = PeerRules {
        transport: crate::ZmqTransport::NAME,
        scope: None,
        serves_plain_zeromq: true,
    };
}

impl PeerRules {
    /// Whether the socket carries the zeromq transport's own messages, not another
    /// transport's frames (shmem's descriptors, which that transport accounts for).
    pub(crate) fn carries_zeromq_messages(self) -> bool {
        self.transport == crate::ZmqTransport::NAME
    }
}

impl Default for PeerRules {
    fn default() -> PeerRules {
        PeerRules::ZEROMQ
    }
}

/// The identity a socket following `rules` announces.
pub(crate) fn identity(rules: PeerRules) -> String {
    let socket_idx = NEXT_SOCKET.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let scope = rules
        .scope
        .map_or_else(|| "-".to_owned(), |scope| format!("{scope:016x}"));
    format!("fmq:{}:{scope}:{pid}:{socket_idx}", rules.transport)
}

/// What a ferromq peer's identity announces.
struct Announced<'a> {
    transport: &'a str,
    scope: &'a str,
    pid: Option<u32>,
}

fn announced(peer_identity: &[u8]) -> Option<Announced<'_>> {
    let mut fields = std::str::from_utf8(peer_identity)
        .ok()?
        .strip_prefix("fmq:")?
        .split(':');
    Some(Announced {
        transport: fields.next()?,
        scope: fields.next()?,
        pid: fields.next().and_then(|pid| pid.parse().ok()),
    })
}

/// Whether the peer announced a ferromq identity (it reads a closing receiver's end of writing
/// over tcp as a request to stop writing); false for libzmq and FairMQ.
pub(crate) fn is_ferromq(peer_identity: &[u8]) -> bool {
    announced(peer_identity).is_some()
}

/// The process a ferromq peer announced in its identity; `None` for a foreign peer.
pub(crate) fn peer_pid(peer_identity: &[u8]) -> Option<u32> {
    announced(peer_identity)?.pid
}

/// Whether process `pid` of this host lives: it exists and has not exited (a zombie has; a
/// stopped process lives).
pub(crate) fn process_lives(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// What a peer's identity says about it, as seen from a socket following its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// The peer uses another transport.
    Transport(&'static str),
    /// The peer is of the same transport, of another scope (shmem: another session).
    Session,
}

/// What a socket calls a peer that announced no ferromq identity where it serves none.
const FOREIGN_PEER: &str = "plain ZeroMQ (libzmq or FairMQ: it announced no ferromq identity; \
FairMQ's shmem transport cannot exchange messages with ferromq's)";

/// A transport's name as an error names it (the wire's text is not `'static`).
fn known_transport(name: &str) -> &'static str {
    match name {
        "zeromq" => "zeromq",
        "shmem" => "shmem",
        "ofi" => "ofi",
        _ => "another ferromq transport",
    }
}

/// `None` when the peer fits a socket following `rules`.
pub(crate) fn check(rules: PeerRules, peer_identity: &[u8]) -> Option<Mismatch> {
    let Some(peer) = announced(peer_identity) else {
        return (!rules.serves_plain_zeromq).then_some(Mismatch::Transport(FOREIGN_PEER));
    };
    if peer.transport != rules.transport {
        return Some(Mismatch::Transport(known_transport(peer.transport)));
    }
    let ours = rules
        .scope
        .map_or_else(|| "-".to_owned(), |scope| format!("{scope:016x}"));
    (peer.scope != ours).then_some(Mismatch::Session)
}

/// Reads one connection event: the peer and what is wrong with it, when it does not fit `rules`.
pub(crate) fn misfit(rules: PeerRules, event: &zeromq::SocketEvent) -> Option<(Mismatch, String)> {
    if let zeromq::SocketEvent::Accepted(endpoint, peer)
    | zeromq::SocketEvent::Connected(endpoint, peer) = event
    {
        let found = check(rules, peer)?;
        let identity = String::from_utf8_lossy(peer);
        let name = if identity.is_empty() {
            format!("{endpoint:?} (no identity)")
        } else {
            format!("{identity} at {endpoint:?}")
        };
        return Some((found, name));
    }
    None
}

impl Mismatch {
    pub(crate) fn error(self, channel: &ChannelLabel) -> Error {
        match self {
            Mismatch::Transport(peer_transport) => Error::TransportMismatch {
                channel: channel.clone(),
                peer_transport,
            },
            Mismatch::Session => Error::SessionMismatch {
                channel: channel.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHM: PeerRules = PeerRules {
        transport: "shmem",
        scope: Some(0xabc),
        serves_plain_zeromq: false,
    };

    #[test]
    fn a_ferromq_peer_names_its_process() {
        assert_eq!(peer_pid(identity(SHM).as_bytes()), Some(std::process::id()));
        assert_eq!(
            peer_pid(identity(PeerRules::ZEROMQ).as_bytes()),
            Some(std::process::id())
        );
        assert_eq!(peer_pid(b""), None);
        assert_eq!(peer_pid(b"fmq:shmem"), None);
        assert!(process_lives(std::process::id()));
        assert!(!process_lives(u32::MAX));
    }

    #[test]
    fn peers_are_classified() {
        let same_session = identity(SHM);
        let other_session = identity(PeerRules {
            scope: Some(0xdef),
            ..SHM
        });
        let zeromq = identity(PeerRules::ZEROMQ);
        assert_ne!(
            identity(PeerRules::ZEROMQ),
            zeromq,
            "identities are unique per socket"
        );
        assert_eq!(check(SHM, same_session.as_bytes()), None);
        assert_eq!(
            check(SHM, other_session.as_bytes()),
            Some(Mismatch::Session)
        );
        assert_eq!(
            check(SHM, zeromq.as_bytes()),
            Some(Mismatch::Transport("zeromq"))
        );
        assert_eq!(check(SHM, b""), Some(Mismatch::Transport(FOREIGN_PEER)));
        assert_eq!(
            check(PeerRules::ZEROMQ, same_session.as_bytes()),
            Some(Mismatch::Transport("shmem"))
        );
        assert_eq!(check(PeerRules::ZEROMQ, zeromq.as_bytes()), None);
        // A libzmq peer announces nothing of ours.
        assert_eq!(check(PeerRules::ZEROMQ, b""), None);
        assert_eq!(
            check(PeerRules::ZEROMQ, b"fmq:carrier-pigeon:-:1:0"),
            Some(Mismatch::Transport("another ferromq transport"))
        );
    }
}
