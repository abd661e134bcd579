//! Rate limiting for senders: message `i` leaves no earlier than `start + i / rate`.
//!
//! A pacer that sleeps per message would cap rates at the timer's resolution; this one computes
//! each message's due time and sleeps only when ahead of it, so `--rate 1000000` works.
//!
//! Nor does it wake up for every message: once it has slept until a message was due, the
//! messages due within the next burst ([`BURST`] unless the sender says otherwise: property
//! `rate-burst-ms`) leave at once, so a paced sender wakes at most once per burst (a wake-up
//! costs more than a small message) and its receiver gets them in one go. No message leaves
//! more than a burst before it is due, and the rate over any longer stretch is the rate asked
//! for. FairMQ's rate limiter works in slices of [`BURST`]'s length. A longer burst trades
//! evenness for wake-ups: at 20 ms a paced sender and its receiver wake a quarter as often,
//! which is most of what a slow paced stream costs (docs/performance-log.md); 0 wakes for
//! every message.
//!
//! A sender held up for longer than [`MAX_DEBT`] (a receiver that connected late, a stalled
//! peer) does not burst to catch up: the schedule restarts at the message that was late, so the
//! rate stays the rate the user asked for.

use std::time::Duration;

use tokio::time::Instant;

/// How far behind its schedule a pacer may fall and still catch up.
pub const MAX_DEBT: Duration = Duration::from_millis(100);

/// `rate-burst-ms` when not given: FairMQ's slice.
pub const DEFAULT_RATE_BURST_MS: u64 = 5;

/// The longest burst a sender may ask for (`rate-burst-ms`).
pub const MAX_RATE_BURST_MS: u64 = 1000;

/// How long ahead of their due time messages may leave together after a wake-up, by default.
pub const BURST: Duration = Duration::from_millis(DEFAULT_RATE_BURST_MS);

/// The longest burst ([`MAX_RATE_BURST_MS`]).
pub const MAX_BURST: Duration = Duration::from_millis(MAX_RATE_BURST_MS);

/// Paces a sender to `rate` messages per second (0 = unlimited).
#[derive(Debug)]
pub struct Pacer {
    interval: Option<Duration>,
    /// How long ahead of their due time messages leave together after a wake-up.
    burst: Duration,
    start: Instant,
    n_sent: u32,
    /// Messages due before this leave without waiting (the burst opened by the last wake-up).
    burst_end: Option<Instant>,
}

impl Pacer {
    /// A pacer for `rate` messages per second; 0 (or anything not positive) does not pace. A
    /// rate too low for its interval to be represented ([`crate::check_rate`] refuses it) waits
    /// for ever between messages.
    pub fn new(rate: f64) -> Pacer {
        Pacer::with_burst(rate, BURST)
    }

    /// A pacer for `rate` messages per second whose messages leave together within `burst`
    /// after a wake-up (at most [`MAX_BURST`]; longer is taken as [`MAX_BURST`]).
    pub fn with_burst(rate: f64, burst: Duration) -> Pacer {
        let interval =
            (rate > 0.0).then(|| Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX));
        Pacer {
            interval,
            burst: burst.min(MAX_BURST),
            start: Instant::now(),
            n_sent: 0,
            burst_end: None,
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
        if self.burst_end.is_some_and(|burst_end| due <= burst_end) {
            return;
        }
        let now = Instant::now();
        if due > now {
            tokio::time::sleep_until(due).await;
        } else if now - due > MAX_DEBT {
            // Leaves now; the next one is due one interval later.
            self.start = now;
            self.n_sent = 1;
        }
        self.burst_end = Instant::now().checked_add(self.burst);
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

    /// Paces one second of 2500 messages/s (one every 400 µs) with `pacer` and checks that no
    /// message leaves more than `burst` early or more than a timer tick late; returns how
    /// often the sender woke.
    async fn wake_ups_pacing_2500_a_second(mut pacer: Pacer, burst: Duration) -> u32 {
        let start = Instant::now();
        let mut n_wake_ups = 0;
        let mut last = start;
        for msg_idx in 0..2501u32 {
            pacer.wait().await;
            let now = Instant::now();
            if now != last {
                n_wake_ups += 1;
                last = now;
            }
            let due = start + Duration::from_micros(400) * msg_idx;
            assert!(
                now + burst >= due,
                "message {msg_idx} left more than a burst ({burst:?}) early"
            );
            // tokio's timers fire on millisecond ticks; lateness never adds up.
            assert!(
                now <= due + Duration::from_millis(1),
                "message {msg_idx} left late"
            );
        }
        assert!(Instant::now() - start >= Duration::from_secs(1) - burst);
        n_wake_ups
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_rate_wakes_once_per_burst_and_sends_nothing_too_early() {
        // FairMQ's 5 ms: 12 or 13 messages per wake-up, about 200 rather than 2500.
        let n_wake_ups = wake_ups_pacing_2500_a_second(Pacer::new(2500.0), BURST).await;
        assert!(n_wake_ups <= 201, "{n_wake_ups} wake-ups");
        // A 20 ms burst (`rate-burst-ms 20`): a quarter as many.
        let burst = Duration::from_millis(20);
        let pacer = Pacer::with_burst(2500.0, burst);
        let n_wake_ups = wake_ups_pacing_2500_a_second(pacer, burst).await;
        assert!(n_wake_ups <= 51, "{n_wake_ups} wake-ups");
        // No burst: nothing leaves before it is due (a timer tick may hold several).
        let pacer = Pacer::with_burst(2500.0, Duration::ZERO);
        let n_wake_ups = wake_ups_pacing_2500_a_second(pacer, Duration::ZERO).await;
        assert!(n_wake_ups > 201, "{n_wake_ups} wake-ups");
        // Longer than MAX_BURST is MAX_BURST.
        let pacer = Pacer::with_burst(2500.0, Duration::from_secs(3600));
        assert_eq!(pacer.burst, MAX_BURST);
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
