//! When a receive spins before it sleeps: [`SpinPolicy`].
//!
//! A receive that finds nothing sleeps until the transport wakes it, and a wake-up costs tens of
//! microseconds here (about 30 µs each way on the project's machines), more than the rest of a
//! round trip between two processes on one host. `busyPoll = true` never sleeps and costs a
//! core. Without it, a [`Channel`](crate::Channel) spins briefly (the channel key `spinUs`,
//! [`DEFAULT_SPIN_US`] by default; 0 never spins) before sleeping,
//! but only where spinning has a chance: when the last wait was short (a message came within
//! [`SHORT_WAIT`], as in a request/reply exchange or a stream the receiver keeps up with).
//! After a wait that was long (an idle channel, a paced stream, the gap between two bursts) it
//! sleeps at once, so an idle or slow channel costs no CPU. A spin that caught nothing counts as
//! a miss: after `n` misses in a row the next `2^n - 1` waits sleep at once (up to
//! [`MAX_BACKOFF_EXPONENT`]), so a stream whose messages come just too late to be caught wastes
//! at most one spin in 64 waits; a spin that caught a message resets that.
//!
//! The policy is per channel and only decides durations; the channel does the spinning
//! (yielding to the runtime between polls, so the transport's own tasks keep running) and the
//! sleeping. A transport that waits in a way of its own inside a receive (shmem's descriptor
//! rings, which spin on the ring before asking the producer for a doorbell) keeps a policy of
//! its own for that wait, so that its spins back off alike. Cancelling a receive mid-spin
//! loses nothing (receives are cancel-safe); the policy then learns nothing from that wait.

use std::time::Duration;

/// How long (µs) a receive spins before it sleeps, when it spins at all, unless the channel's
/// `spinUs` says otherwise. Long enough to outlast the other side's turnaround in an rpc round
/// trip (several task hops at each end), so that both sides settle into catching each other
/// spinning: at 25 µs they never did here.
pub const DEFAULT_SPIN_US: u32 = 60;

/// A wait at most this long counts as short: the next one spins.
pub(crate) const SHORT_WAIT: Duration = Duration::from_micros(200);

/// Misses in a row beyond which the sleeps between spins stop growing (`2^6 - 1` = 63).
pub(crate) const MAX_BACKOFF_EXPONENT: u32 = 6;

/// What one receive that had to wait found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The message came while spinning.
    CaughtSpinning,
    /// The receive slept (it spun first, or not), then got a message or gave up, after
    /// waiting this long in all.
    Slept {
        /// Whether it spun before sleeping.
        spun: bool,
        /// From the start of the wait to its end.
        waited: Duration,
    },
}

/// Decides how long the next wait of one channel spins (see the module docs).
#[derive(Debug, Clone)]
pub struct SpinPolicy {
    /// How long a spin lasts; zero: never spin.
    spin: Duration,
    /// The last wait was short enough for a spin to have a chance.
    last_wait_short: bool,
    /// Spins in a row that caught nothing.
    misses: u32,
    /// Waits still to sleep through at once after the last miss.
    skip: u32,
}

impl SpinPolicy {
    /// A policy whose spins last `spin` (zero: it never spins).
    pub fn new(spin: Duration) -> SpinPolicy {
        SpinPolicy {
            spin,
            last_wait_short: false,
            misses: 0,
            skip: 0,
        }
    }

    /// The policy a channel's `spinUs` (microseconds) asks for: the channel's own, and that of
    /// a transport's wait inside a receive.
    pub fn of_spin_us(spin_us: u32) -> SpinPolicy {
        SpinPolicy::new(Duration::from_micros(u64::from(spin_us)))
    }

    /// How long the wait that starts now spins before sleeping; zero: sleep at once.
    pub fn spin_for(&mut self) -> Duration {
        if self.spin.is_zero() || !self.last_wait_short {
            return Duration::ZERO;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return Duration::ZERO;
        }
        self.spin
    }

    /// Whether the last wait counted as short (the next one may spin).
    pub fn last_wait_short(&self) -> bool {
        self.last_wait_short
    }

    /// Learns from a wait that ended (with a message or not). A receive that found its
    /// message without waiting tells nothing and is not recorded.
    pub fn record(&mut self, outcome: WaitOutcome) {
        match outcome {
            WaitOutcome::CaughtSpinning => {
                self.last_wait_short = true;
                self.misses = 0;
                self.skip = 0;
            }
            WaitOutcome::Slept { spun, waited } => {
                self.last_wait_short = waited <= SHORT_WAIT;
                if spun {
                    self.misses = (self.misses + 1).min(MAX_BACKOFF_EXPONENT);
                    self.skip = (1 << self.misses) - 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_micros(DEFAULT_SPIN_US as u64);

    fn policy() -> SpinPolicy {
        SpinPolicy::new(SPIN)
    }

    fn slept(spun: bool, micros: u64) -> WaitOutcome {
        WaitOutcome::Slept {
            spun,
            waited: Duration::from_micros(micros),
        }
    }

    #[test]
    fn a_fresh_or_idle_channel_sleeps_at_once() {
        let mut policy = policy();
        assert_eq!(policy.spin_for(), Duration::ZERO);
        // A paced stream: 400 µs between messages.
        for _ in 0..100 {
            policy.record(slept(false, 400));
            assert_eq!(policy.spin_for(), Duration::ZERO);
        }
    }

    #[test]
    fn a_short_wait_makes_the_next_one_spin_and_a_catch_keeps_it_spinning() {
        let mut policy = policy();
        // A request/reply exchange whose first round trip slept (wake-ups included).
        policy.record(slept(false, 70));
        assert_eq!(policy.spin_for(), SPIN);
        for _ in 0..100 {
            policy.record(WaitOutcome::CaughtSpinning);
            assert_eq!(policy.spin_for(), SPIN);
        }
        // The peer went quiet: the spin missed and the wait was long, so no more spinning.
        policy.record(slept(true, 10_000));
        assert_eq!(policy.spin_for(), Duration::ZERO);
    }

    #[test]
    fn a_channel_configured_with_spin_us_0_never_spins() {
        let mut policy = SpinPolicy::new(Duration::ZERO);
        policy.record(slept(false, 10));
        assert_eq!(policy.spin_for(), Duration::ZERO);
        policy.record(WaitOutcome::CaughtSpinning);
        assert_eq!(policy.spin_for(), Duration::ZERO);
    }

    #[test]
    fn misses_in_a_row_back_off_to_one_spin_in_sixty_four_waits() {
        let mut policy = policy();
        policy.record(slept(false, 100));
        let mut n_spins = 0;
        let n_waits = 64 * 20;
        for _ in 0..n_waits {
            // Messages every 100 µs: short waits that a spin never catches (say the sender is slow).
            let spun = policy.spin_for() == SPIN;
            n_spins += u32::from(spun);
            policy.record(slept(spun, 100));
        }
        // Backing off 1, 3, 7, ... 63: once saturated, one spin per 64 waits.
        assert!(
            n_spins <= 6 + n_waits / 64,
            "{n_spins} spins in {n_waits} waits"
        );
        assert!(
            n_spins >= n_waits / 64,
            "{n_spins} spins in {n_waits} waits"
        );
        // One catch ends the back-off.
        while policy.spin_for() == Duration::ZERO {}
        policy.record(WaitOutcome::CaughtSpinning);
        assert_eq!(policy.spin_for(), SPIN);
    }
}
