//! Rate limiting for senders: message `i` leaves no earlier than `start + i / rate`.
//!
//! A pacer that sleeps per message would cap rates at the timer's resolution; this one computes
//! each message's due time and sleeps only when ahead of it, so `--rate 1000000` works.

use std::time::Duration;

use tokio::time::Instant;

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
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
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
}
