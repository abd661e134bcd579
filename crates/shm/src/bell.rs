//! Doorbells that wake a sleeping ring consumer without waking its producer.
//!
//! A consumer that found its rings empty raises their `sleeping` word and waits (`ring.rs`); the
//! producer that next publishes takes the word down and must wake it. Sent as a frame over the
//! zeromq connection, that doorbell costs the producer a wake-up of its own when the consumer
//! reads the frame (the kernel reports the stream socket writable again, and tokio's epoll
//! watches every socket for that). A paced sender
//! that sleeps between bursts thus woke twice per burst (`perf stat`: 330 context switches a
//! second at 160 bursts a second).
//!
//! Here the consumer's socket (one per receiving socket, shared by its rings) binds a datagram
//! socket in Linux's abstract namespace, `\0ferromq-bell-<id:016x>`, and writes `id` into every
//! ring it adopts (the ring's `bell` word). A producer rings by sending one byte there from a
//! process-wide unbound datagram socket that no epoll watches and nothing reads: one `sendto`
//! (where the frame was written: a push's batching task, or the sending call of a pair, req,
//! rep or publisher), and nothing wakes the producer when the consumer reads.
//!
//! - No file: the name goes with the socket when the consumer closes it or dies, so crash
//!   cleanup has nothing more to remove.
//! - Where a bell cannot be bound (another process holds the name, no abstract namespace) the
//!   ring's word stays 0; where it cannot be reached (the consumer left, or lives in another
//!   network namespace while sharing /dev/shm) `ring` says so: either way the producer sends the
//!   doorbell frame as before. A full queue of the consumer's bell counts as rung: it has
//!   wake-ups waiting already.
//! - Trust: the word is a peer's; the producer builds the name from the number alone, so a
//!   broken peer can at most point it at another ferromq bell, which then wakes for nothing.
//! - Cancellation: a consumer's wait polls the bell's readiness after its rings and socket; a
//!   wait dropped, or ended by entries first, leaves the byte queued, which ends the next wait
//!   at once (as a queued doorbell frame does; `socket.rs` does not count such a wait as short).

use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

/// The abstract name of the bell `id`, `ferromq-bell-<id:016x>`, made on the stack: a producer
/// makes it for every doorbell.
fn address(id: u64) -> Option<SocketAddr> {
    use std::io::Write as _;
    let mut name = [0u8; "ferromq-bell-".len() + 16];
    write!(&mut name[..], "ferromq-bell-{id:016x}").ok()?;
    SocketAddr::from_abstract_name(name).ok()
}

/// How many datagrams one poll takes at most: a flood (anyone in the network namespace may
/// send) cannot keep a wait from returning.
const MAX_DRAINED: usize = 64;

/// A consumer's bell: what its producers ring.
#[derive(Debug)]
pub(crate) struct Bell {
    id: u64,
    socket: tokio::net::UnixDatagram,
}

impl Bell {
    /// A new bell of this process, bound under a name no live bell has; `None` where none can
    /// be bound or registered with the runtime (its rings then get doorbell frames).
    pub(crate) fn bind() -> Option<Bell> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        // The pid keeps processes apart; a name taken all the same (another pid namespace in
        // the same network namespace) is tried again with the next number.
        for _ in 0..4 {
            let id = (u64::from(std::process::id()) << 32)
                | u64::from(NEXT.fetch_add(1, Ordering::Relaxed));
            let name = address(id)?;
            let socket = match UnixDatagram::bind_addr(&name) {
                Ok(socket) => socket,
                Err(error) if error.kind() == ErrorKind::AddrInUse => continue,
                Err(_) => return None,
            };
            socket.set_nonblocking(true).ok()?;
            let socket = tokio::net::UnixDatagram::from_std(socket).ok()?;
            return Some(Bell { id, socket });
        }
        None
    }

    /// What a ring's `bell` word holds for this bell (never 0).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Ready once the bell was rung since the last time this was ready (taking what rang it);
    /// registers `cx` otherwise. A bell that fails is never ready: the consumer's safety net
    /// and doorbell frames still wake it.
    pub(crate) fn poll_rung(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut rung = false;
        let mut byte = [0u8; 8];
        for _ in 0..MAX_DRAINED {
            match self.socket.poll_recv_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) | Poll::Pending => break,
            }
            match self.socket.try_recv(&mut byte) {
                Ok(_) => rung = true,
                // Readiness cleared: the next `poll_recv_ready` registers `cx`.
                Err(error) if error.kind() == ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        if rung { Poll::Ready(()) } else { Poll::Pending }
    }
}

/// Rings the bell `id` (a ring's `bell` word, not 0): true when the consumer will wake (the
/// byte was queued, or its queue is full of earlier ones); false when the bell cannot be
/// reached, and the doorbell frame must go instead.
pub(crate) fn ring(id: u64) -> bool {
    // One unbound socket for the whole process, never registered with a runtime: nothing
    // wakes the producer when a consumer reads.
    static SENDER: OnceLock<Option<UnixDatagram>> = OnceLock::new();
    let sender = SENDER.get_or_init(|| {
        let socket = UnixDatagram::unbound().ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(socket)
    });
    let (Some(sender), Some(name)) = (sender, address(id)) else {
        return false;
    };
    match sender.send_to_addr(&[1], &name) {
        Ok(_) => true,
        Err(error) => error.kind() == ErrorKind::WouldBlock,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_rung_bell_wakes_its_waiter_once_and_an_unbound_one_is_refused() {
        let bell = Bell::bind().expect("an abstract name can be bound");
        assert_ne!(bell.id(), 0);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(bell.poll_rung(&mut cx).is_pending());
        // Two rings before the waiter looks: one wake-up takes both.
        assert!(ring(bell.id()));
        assert!(ring(bell.id()));
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            std::future::poll_fn(|cx| bell.poll_rung(cx)),
        )
        .await
        .expect("the ring wakes the waiter");
        assert!(bell.poll_rung(&mut cx).is_pending());
        let id = bell.id();
        drop(bell);
        assert!(!ring(id), "a closed bell's name is gone");
        assert_eq!(
            address(0x0123_4567_89ab_cdef).unwrap().as_abstract_name(),
            Some(&b"ferromq-bell-0123456789abcdef"[..])
        );
        // A second bell of the process never takes the first one's name.
        let other = Bell::bind().expect("bound");
        assert_ne!(other.id(), id);
    }
}
