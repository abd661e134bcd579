//! Send-side accounting: how many messages this socket has handed to zmq.rs that zmq.rs has not
//! yet written out.
//!
//! zmq.rs queues up to 100 000 messages per peer with no option to change it, and has no linger:
//! what is queued when a process exits is lost. ferromq tracks every outgoing message with a
//! [`InFlightGuard`] inside the frame's `Bytes` (`Bytes::from_owner`). zmq.rs's encoder drops the
//! frame once it has copied it into the connection's write buffer, which drops the guard. So the
//! count is "accepted by `send` but not yet encoded for the wire", and
//! - `send` waits while the count is at `sndBufSize` (the high-water mark, enforced here);
//! - `close` waits (up to `linger`) for the count to reach zero before the socket goes away,
//!   then for [`InFlight::flush_estimate`]: zmq.rs drops a frame when it is encoded, before its
//!   write buffer is flushed to the kernel, and says nothing when the flush is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Messages handed to zmq.rs and not yet encoded (public so that the shmem transport, which
/// drives zmq.rs sockets of its own, can flush them the same way at close).
#[derive(Debug, Default)]
pub struct InFlight {
    /// Its count is `figures.queued`: what the channel's counters show as the send queue.
    figures: Arc<ferromq_core::SendFigures>,
    changed: Notify,
    largest_message: AtomicUsize,
}

/// Decrements [`InFlight`] when the frame carrying it is dropped.
pub(crate) struct InFlightGuard {
    in_flight: Arc<InFlight>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.in_flight.figures.queued.fetch_sub(1, Ordering::AcqRel);
        self.in_flight.changed.notify_one();
    }
}

struct TrackedFrame {
    frame: Bytes,
    _guard: InFlightGuard,
}

impl AsRef<[u8]> for TrackedFrame {
    fn as_ref(&self) -> &[u8] {
        &self.frame
    }
}

impl InFlight {
    /// Messages handed over and not yet encoded.
    pub fn count(&self) -> usize {
        usize::try_from(self.figures.queued.load(Ordering::Acquire)).unwrap_or(usize::MAX)
    }

    /// Wraps `frame` so that this counter drops by one when zmq.rs is done with it.
    pub fn track(self: &Arc<Self>, frame: Bytes, message_size: usize) -> Bytes {
        self.figures.queued.fetch_add(1, Ordering::AcqRel);
        self.largest_message
            .fetch_max(message_size, Ordering::Relaxed);
        let guard = InFlightGuard {
            in_flight: Arc::clone(self),
        };
        Bytes::from_owner(TrackedFrame {
            frame,
            _guard: guard,
        })
    }

    /// How long the writer may still need, after the count reached zero, to flush its last
    /// batch: zmq.rs reports no flush completion, so this is an estimate from the largest message
    /// sent (at a conservative 100 MB/s) plus a fixed 100 ms. (20 ms lost the last frame of
    /// shmem descriptors now and then on a loaded 2-core machine: the writer task had not run.)
    pub fn flush_estimate(&self) -> std::time::Duration {
        let largest = self.largest_message.load(Ordering::Relaxed) as u64;
        std::time::Duration::from_millis(100) + std::time::Duration::from_micros(largest / 100)
    }

    /// Waits until nothing is in flight, for as long as the count keeps falling: gives up only
    /// after `silence` without progress, and then returns how many messages are still in flight.
    /// This is what `linger` means here: a bound on silence, not on the whole drain, so a peer
    /// that keeps taking messages gets all of them however long that takes.
    pub async fn drain(&self, silence: std::time::Duration) -> Result<(), usize> {
        let mut lowest = self.count();
        let mut deadline = Instant::now() + silence;
        loop {
            if lowest == 0 {
                return Ok(());
            }
            if self.wait_below(lowest, Some(deadline)).await {
                lowest = self.count();
                deadline = Instant::now() + silence;
            } else {
                return Err(self.count());
            }
        }
    }

    /// [`InFlight::drain`], then, if everything was encoded, the writer's [`flush_estimate`]
    /// (bounded by `silence`): what a sending socket's close waits for.
    ///
    /// [`flush_estimate`]: InFlight::flush_estimate
    pub async fn drain_then_flush(&self, silence: std::time::Duration) -> Result<(), usize> {
        self.drain(silence).await?;
        tokio::time::sleep(self.flush_estimate().min(silence)).await;
        Ok(())
    }

    /// A count kept in `figures` (their `queued`), the channel's to read.
    pub fn with_figures(figures: Arc<ferromq_core::SendFigures>) -> InFlight {
        InFlight {
            figures,
            ..InFlight::default()
        }
    }

    /// The figures this count is part of (see `ferromq_core::Socket::send_figures`).
    pub fn figures(&self) -> Arc<ferromq_core::SendFigures> {
        Arc::clone(&self.figures)
    }

    /// Waits until fewer than `limit` messages are in flight; false if `deadline` passed first.
    pub async fn wait_below(&self, limit: usize, deadline: Option<Instant>) -> bool {
        if self.count() < limit {
            return true;
        }
        // Back-pressure: the time is the channel's to show, while it lasts too.
        let _waiting = self.figures.waiting();
        self.wait_below_inner(limit, deadline).await
    }

    async fn wait_below_inner(&self, limit: usize, deadline: Option<Instant>) -> bool {
        loop {
            if self.count() < limit {
                return true;
            }
            let changed = self.changed.notified();
            if self.count() < limit {
                return true;
            }
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        return self.count() < limit;
                    }
                }
                None => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn count_follows_the_frames() {
        let in_flight = Arc::new(InFlight::default());
        let first = in_flight.track(Bytes::from_static(b"a"), 1);
        let second = in_flight.track(Bytes::from_static(b"bc"), 2_000_000);
        assert_eq!(in_flight.flush_estimate(), Duration::from_millis(120));
        assert_eq!(&second[..], b"bc");
        assert_eq!(in_flight.count(), 2);
        let soon = Some(Instant::now() + Duration::from_millis(20));
        assert!(
            !in_flight.wait_below(2, soon).await,
            "two in flight is not below two"
        );
        drop(first);
        assert!(in_flight.wait_below(2, None).await);
        let waiter = {
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move { in_flight.wait_below(1, None).await })
        };
        drop(second);
        assert!(waiter.await.unwrap());
        assert_eq!(in_flight.count(), 0);
    }

    #[tokio::test]
    async fn drain_waits_while_there_is_progress_and_counts_what_is_left_after_silence() {
        let in_flight = Arc::new(InFlight::default());
        let mut frames: Vec<Bytes> = (0..5)
            .map(|_| in_flight.track(Bytes::from_static(b"x"), 1))
            .collect();
        let silence = Duration::from_millis(50);
        let taker = tokio::spawn(async move {
            // Each frame leaves well inside `silence`, the whole drain takes longer than it.
            while let Some(frame) = frames.pop() {
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(frame);
            }
        });
        assert_eq!(in_flight.drain(silence).await, Ok(()));
        taker.await.unwrap();
        assert_eq!(in_flight.drain(silence).await, Ok(()), "nothing in flight");

        let stuck = [
            in_flight.track(Bytes::from_static(b"a"), 1),
            in_flight.track(Bytes::from_static(b"b"), 1),
        ];
        assert_eq!(in_flight.drain(silence).await, Err(2));
        drop(stuck);
    }
}
