//! Rate logging: every `rateLogging` seconds, one line per channel with messages/s and MB/s in
//! and out (1 MB = 10^6 bytes). The counters themselves live in each `Channel`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferromq_core::{ChannelCounters, CounterSnapshot};
use tokio_util::sync::CancellationToken;

/// Rates between two snapshots taken `seconds` apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Messages/s received.
    pub msgs_in: f64,
    /// MB/s received.
    pub mb_in: f64,
    /// Messages/s sent.
    pub msgs_out: f64,
    /// MB/s sent.
    pub mb_out: f64,
}

impl Rates {
    /// Rates from two snapshots taken `seconds` apart.
    pub fn between(earlier: CounterSnapshot, later: CounterSnapshot, seconds: f64) -> Rates {
        let per_second =
            |earlier: u64, later: u64| later.saturating_sub(earlier) as f64 / seconds.max(1e-9);
        Rates {
            msgs_in: per_second(earlier.messages_in, later.messages_in),
            mb_in: per_second(earlier.bytes_in, later.bytes_in) / 1e6,
            msgs_out: per_second(earlier.messages_out, later.messages_out),
            mb_out: per_second(earlier.bytes_out, later.bytes_out) / 1e6,
        }
    }
}

/// Starts logging every channel whose interval is not 0; cancel the token to stop. `None` when
/// no channel logs.
pub(crate) fn spawn_rate_logger(
    device: String,
    channels: Vec<(String, u64, Arc<ChannelCounters>)>,
) -> Option<CancellationToken> {
    let logged: Vec<_> = channels
        .into_iter()
        .filter(|(_, interval, _)| *interval > 0)
        .collect();
    if logged.is_empty() {
        return None;
    }
    let token = CancellationToken::new();
    let stop = token.clone();
    tokio::spawn(async move {
        let mut last: Vec<(Instant, CounterSnapshot)> = logged
            .iter()
            .map(|(_, _, counters)| (Instant::now(), counters.snapshot()))
            .collect();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            for ((name, interval, counters), (then, earlier)) in logged.iter().zip(last.iter_mut())
            {
                let elapsed = then.elapsed();
                if elapsed < Duration::from_secs(*interval) {
                    continue;
                }
                let now = counters.snapshot();
                let rates = Rates::between(*earlier, now, elapsed.as_secs_f64());
                tracing::info!(
                    device = %device,
                    "{name}: in: {:.0} msg/s ({:.3} MB/s) out: {:.0} msg/s ({:.3} MB/s)",
                    rates.msgs_in, rates.mb_in, rates.msgs_out, rates.mb_out
                );
                *then = Instant::now();
                *earlier = now;
            }
        }
    });
    Some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_per_second() {
        let earlier = CounterSnapshot {
            messages_in: 10,
            bytes_in: 1_000,
            messages_out: 0,
            bytes_out: 0,
            ..CounterSnapshot::default()
        };
        let later = CounterSnapshot {
            messages_in: 210,
            bytes_in: 2_001_000,
            messages_out: 4,
            bytes_out: 4_000_000,
            ..CounterSnapshot::default()
        };
        let rates = Rates::between(earlier, later, 2.0);
        assert_eq!(
            rates,
            Rates {
                msgs_in: 100.0,
                mb_in: 1.0,
                msgs_out: 2.0,
                mb_out: 2.0
            }
        );
    }
}
