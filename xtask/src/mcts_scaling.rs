//! `cargo xtask mcts-scaling`: issue 15's scaling efficiency, measured so that it can be quoted.
//!
//! Builds the release `mcts-hex` example, then runs rounds of one search with one worker and
//! one with N workers (interleaved, so that a slow minute of the host slows both), each run's
//! JSON read from its own output once the run has ended: nothing else starts on the host while a
//! search runs. A parser started beside the search (`mcts-hex ... | python3 -c ...`) took a
//! quarter off a first search of two workers on a 2-core machine (the start of CPython, ~0.14 s
//! of a core, during a 0.2-s search; docs/performance-log.md, 2026-12-04).
//!
//! Prints each round's rates and efficiency (N workers' rate over N times one worker's), then
//! the medians (min-max) and how many rounds reached the bound. A run that fails stops the task
//! with the command that failed; nothing is left behind (the example cleans its own session).

use std::path::Path;

use crate::bench::Spread;

/// What one invocation measures.
#[derive(Debug, Clone)]
pub struct Options {
    /// Rounds, each one search with one worker and one with `workers`.
    pub rounds: usize,
    /// Workers of the search compared with one worker's.
    pub workers: usize,
    /// The example's options besides `--workers` and `--json` (board, budget, warm-up, mode).
    pub search_args: Vec<String>,
    /// The efficiency a round must reach to count (issue 15: 0.7 at 2 workers).
    pub bound: f64,
}

/// One round's rates, rollouts a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Round {
    /// The search with one worker.
    pub one_worker: f64,
    /// The search with [`Options::workers`].
    pub n_workers: f64,
}

/// The rounds' summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// One worker's rates.
    pub one_worker: Spread,
    /// N workers' rates.
    pub n_workers: Spread,
    /// The rounds' efficiencies.
    pub efficiency: Spread,
    /// Rounds whose efficiency reached the bound.
    pub n_at_bound: usize,
}

/// N workers' rate over N times one worker's.
pub fn efficiency(round: &Round, workers: usize) -> f64 {
    round.n_workers / (workers as f64 * round.one_worker)
}

/// The summary of `rounds` (at least one) of `workers` against one worker.
pub fn summarise(rounds: &[Round], workers: usize, bound: f64) -> Summary {
    let efficiencies: Vec<f64> = rounds
        .iter()
        .map(|round| efficiency(round, workers))
        .collect();
    let one: Vec<f64> = rounds.iter().map(|round| round.one_worker).collect();
    let many: Vec<f64> = rounds.iter().map(|round| round.n_workers).collect();
    Summary {
        one_worker: Spread::of(&one),
        n_workers: Spread::of(&many),
        efficiency: Spread::of(&efficiencies),
        n_at_bound: efficiencies.iter().filter(|&&value| value >= bound).count(),
    }
}

/// Builds the example and runs the rounds; false (with the reason on stderr) when the build or
/// a run failed.
pub fn run(cargo: &str, workspace: &Path, options: &Options) -> bool {
    if !crate::run_cargo(cargo, &["build", "--release", "--example", "mcts-hex"], &[]) {
        eprintln!("xtask: building the mcts-hex example failed");
        return false;
    }
    let example = workspace.join("target/release/examples/mcts-hex");
    let rate = |workers: usize| {
        let mut args = options.search_args.clone();
        args.extend([
            "--json".to_owned(),
            "--workers".to_owned(),
            workers.to_string(),
        ]);
        crate::bench_rpc::rate_of(&example, &args, workspace)
    };
    println!(
        "mcts-hex {} --json, 1 against {} workers, {} rounds interleaved",
        options.search_args.join(" "),
        options.workers,
        options.rounds
    );
    let mut rounds = Vec::with_capacity(options.rounds);
    for round_idx in 1..=options.rounds {
        let Some(one_worker) = rate(1) else {
            return false;
        };
        let Some(n_workers) = rate(options.workers) else {
            return false;
        };
        let round = Round {
            one_worker,
            n_workers,
        };
        println!(
            "round {round_idx}: 1 worker {:.1} k, {} workers {:.1} k rollouts/s, efficiency {:.2}",
            one_worker / 1e3,
            options.workers,
            n_workers / 1e3,
            efficiency(&round, options.workers)
        );
        rounds.push(round);
    }
    let summary = summarise(&rounds, options.workers, options.bound);
    let kilo = |spread: Spread| {
        format!(
            "{:.1} k ({:.1}-{:.1})",
            spread.median / 1e3,
            spread.min / 1e3,
            spread.max / 1e3
        )
    };
    let Spread { median, min, max } = summary.efficiency;
    println!(
        "1 worker {}, {} workers {}, efficiency {median:.2} ({min:.2}-{max:.2}), {} rounds of {} at or over {}",
        kilo(summary.one_worker),
        options.workers,
        kilo(summary.n_workers),
        summary.n_at_bound,
        rounds.len(),
        options.bound
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_has_the_medians_the_ranges_and_the_rounds_at_the_bound() {
        let rounds = [
            Round {
                one_worker: 100.0,
                n_workers: 160.0,
            },
            Round {
                one_worker: 120.0,
                n_workers: 156.0,
            },
            Round {
                one_worker: 110.0,
                n_workers: 198.0,
            },
        ];
        assert!((efficiency(&rounds[1], 2) - 0.65).abs() < 1e-12);
        let summary = summarise(&rounds, 2, 0.7);
        let spread = |median, min, max| Spread { median, min, max };
        assert_eq!(summary.one_worker, spread(110.0, 100.0, 120.0));
        assert_eq!(summary.n_workers, spread(160.0, 156.0, 198.0));
        let Spread { median, min, max } = summary.efficiency;
        assert!((median - 0.8).abs() < 1e-12, "{median}");
        assert!((min - 0.65).abs() < 1e-12, "{min}");
        assert!((max - 0.9).abs() < 1e-12, "{max}");
        // 0.8 and 0.9 reach 0.7; 0.65 does not.
        assert_eq!(summary.n_at_bound, 2);
    }
}
