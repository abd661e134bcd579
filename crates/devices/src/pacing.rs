//! Rate limiting for senders: message `i` leaves no earlier than `start + i / rate`.
//!
//! A pacer that sleeps per message would cap rates at the timer's resolution; this one computes
//! each message's due time and sleeps only when ahead of it, so `--rate 1000000` works.
//!
//! A sender held up for longer than [`MAX_DEBT`] (a receiver that connected late, a stalled
//! peer) does not burst to catch up: the schedule restarts at the message that was late, so the
//! rate stays the rate the user asked for.

use std::time::Duration;

use tokio::time::Instant;

/// How far behind its schedule a pacer may fall and still catch up.
pub const MAX_DEBT: Duration = Duration::from_millis(100);

/// Paces a sender to `rate` messages per second (0 = unlimited).
#[derive(Debug)]
pub struct Pacer {
    interval: Option<Duration>,
    start: Instant,
    n_sent: u32,
}

impl Pacer {
    /// A pacer for `rate` messages per second; 0 (or anything not positive) does not pace. A
    /// rate too low for its interval to be represented ([`crate::check_rate`] refuses it) waits
    /// for ever between messages.
    pub fn new(rate: f64) -> Pacer {
        let interval =
            (rate > 0.0).then(|| Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX));
        Pacer {
            interval,
            start: Instant::now(),
            n_sent: 0,
        }
    }

    /// Waits until the next message is due.
    pub async fn wait(&mut self) {
        let Some(interval) = self.interval else {
            return;
        };
        let Some(due) = interval
            .checked_mul(self.n_sent)
            .and_then(|offset| self.start.checked_add(offset))
        else {
            // Not before the end of time.
            return std::future::pending().await;
        };
        self.n_sent = self.n_sent.wrapping_add(1);
        if self.n_sent == u32::MAX {
            // Restart the schedule long before `interval * n_sent` could overflow.
            self.start = Instant::now();
            self.n_sent = 0;
        }
        let now = Instant::now();
        if due > now {
            tokio::time::sleep_until(due).await;
        } else if now - due > MAX_DEBT {
            // Leaves now; the next one is due one interval later.
            self.start = now;
            self.n_sent = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn paces_to_the_rate() {
        let mut pacer = Pacer::new(100.0);
        let start = Instant::now();
        for _ in 0..101 {
            pacer.wait().await;
        }
        // The 101st message is due one second after the first (virtual time).
        assert_eq!(Instant::now() - start, Duration::from_secs(1));
        // Intervals beyond any clock neither panic nor let a message out early.
        let mut glacial = Pacer::new(1e-300);
        glacial.wait().await;
        let second = tokio::time::timeout(Duration::from_secs(3600), glacial.wait()).await;
        assert!(second.is_err());
        let mut unlimited = Pacer::new(0.0);
        let start = Instant::now();
        for _ in 0..1000 {
            unlimited.wait().await;
        }
        assert_eq!(Instant::now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_held_up_does_not_burst_to_catch_up() {
        let mut pacer = Pacer::new(10.0);
        pacer.wait().await;
        // Held up for 4 s (a late receiver): the next message leaves at once, the one after a
        // full interval later, not immediately to make up for the 40 missed.
        tokio::time::advance(Duration::from_secs(4)).await;
        pacer.wait().await;
        let start = Instant::now();
        pacer.wait().await;
        assert_eq!(Instant::now() - start, Duration::from_millis(100));
        // Behind by less than MAX_DEBT: it catches up (timer jitter must not lower the rate).
        tokio::time::advance(Duration::from_millis(150)).await;
        let start = Instant::now();
        pacer.wait().await;
        assert_eq!(Instant::now(), start);
    }
}
