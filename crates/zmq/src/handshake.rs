//! Telling transports and sessions apart at connect time.
//!
//! Every ferromq socket announces an identity in its ZMTP handshake: `fmqzmq:<pid>:<n>` for the
//! zeromq transport, `fmqshm:<session hash>:<pid>:<n>` for the shmem transport's metadata
//! channel (unique per socket, since zmq.rs keys its peers by identity). Each side reads the
//! identities of the peers that connect. A peer of the other transport, or of another shmem
//! session, makes a socket that needs every peer (push, req, rep, pair, pub) fail its sends and
//! receives with an error that says what was detected, before any payload is misread; a fan-in
//! socket (pull, sub) instead refuses that one peer (a warning naming it, once), drops its
//! frames and keeps serving the others. Peers that announce nothing of ours (libzmq, FairMQ)
//! are accepted as zeromq peers, and named as such by a shmem socket.

use std::sync::atomic::{AtomicU64, Ordering};

use ferromq_core::{ChannelLabel, Error};

use crate::Role;

static NEXT_SOCKET: AtomicU64 = AtomicU64::new(0);

/// The identity a socket of `role` announces.
pub(crate) fn identity(role: Role) -> String {
    let socket_idx = NEXT_SOCKET.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    match role {
        Role::Zeromq => format!("fmqzmq:{pid}:{socket_idx}"),
        Role::ShmemMetadata { session_hash } => {
            format!("fmqshm:{session_hash:016x}:{pid}:{socket_idx}")
        }
    }
}

/// The process a ferromq peer announced in its identity; `None` for a foreign peer.
pub(crate) fn peer_pid(peer_identity: &[u8]) -> Option<u32> {
    let peer = std::str::from_utf8(peer_identity).ok()?;
    let pid = if let Some(rest) = peer.strip_prefix("fmqshm:") {
        rest.split(':').nth(1)?
    } else {
        peer.strip_prefix("fmqzmq:")?.split(':').next()?
    };
    pid.parse().ok()
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

/// What a peer's identity says about it, as seen from a socket of `role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// The peer uses another transport.
    Transport(&'static str),
    /// The peer is shmem, of another session.
    Session,
}

/// What a shmem socket calls a peer that announced no ferromq identity.
const FOREIGN_PEER: &str = "plain ZeroMQ (libzmq or FairMQ: it announced no ferromq identity; \
FairMQ's shmem transport cannot exchange messages with ferromq's)";

/// `None` when the peer fits this socket.
pub(crate) fn check(role: Role, peer_identity: &[u8]) -> Option<Mismatch> {
    let peer = String::from_utf8_lossy(peer_identity);
    let peer_shm_session = peer
        .strip_prefix("fmqshm:")
        .and_then(|rest| rest.split(':').next());
    match (role, peer_shm_session) {
        (Role::Zeromq, Some(_)) => Some(Mismatch::Transport("shmem")),
        (Role::ShmemMetadata { .. }, None) if peer.starts_with("fmqzmq:") => {
            Some(Mismatch::Transport("zeromq"))
        }
        (Role::ShmemMetadata { .. }, None) => Some(Mismatch::Transport(FOREIGN_PEER)),
        (Role::ShmemMetadata { session_hash }, Some(peer_session)) => {
            (peer_session != format!("{session_hash:016x}")).then_some(Mismatch::Session)
        }
        (Role::Zeromq, None) => None,
    }
}

/// Reads one connection event: the peer and what is wrong with it, when it does not fit `role`.
pub(crate) fn misfit(role: Role, event: &zeromq::SocketEvent) -> Option<(Mismatch, String)> {
    if let zeromq::SocketEvent::Accepted(endpoint, peer)
    | zeromq::SocketEvent::Connected(endpoint, peer) = event
    {
        let found = check(role, peer)?;
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

    #[test]
    fn a_ferromq_peer_names_its_process() {
        let shm = identity(Role::ShmemMetadata {
            session_hash: 0xabc,
        });
        assert_eq!(peer_pid(shm.as_bytes()), Some(std::process::id()));
        assert_eq!(
            peer_pid(identity(Role::Zeromq).as_bytes()),
            Some(std::process::id())
        );
        assert_eq!(peer_pid(b""), None);
        assert_eq!(peer_pid(b"fmqshm:abc"), None);
        assert!(process_lives(std::process::id()));
        assert!(!process_lives(u32::MAX));
    }

    #[test]
    fn peers_are_classified() {
        let shm = Role::ShmemMetadata {
            session_hash: 0xabc,
        };
        let same_session = identity(shm);
        let other_session = identity(Role::ShmemMetadata {
            session_hash: 0xdef,
        });
        let zeromq = identity(Role::Zeromq);
        assert_ne!(
            identity(Role::Zeromq),
            zeromq,
            "identities are unique per socket"
        );
        assert_eq!(check(shm, same_session.as_bytes()), None);
        assert_eq!(
            check(shm, other_session.as_bytes()),
            Some(Mismatch::Session)
        );
        assert_eq!(
            check(shm, zeromq.as_bytes()),
            Some(Mismatch::Transport("zeromq"))
        );
        assert_eq!(check(shm, b""), Some(Mismatch::Transport(FOREIGN_PEER)));
        assert_eq!(
            check(Role::Zeromq, same_session.as_bytes()),
            Some(Mismatch::Transport("shmem"))
        );
        assert_eq!(check(Role::Zeromq, zeromq.as_bytes()), None);
        // A libzmq peer announces nothing of ours.
        assert_eq!(check(Role::Zeromq, b""), None);
    }
}
