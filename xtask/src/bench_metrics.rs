//! The "what metrics cost" part of `cargo xtask bench`: `benches/metrics-cost.sh` (a shmem
//! device pair moving 10 000 001 messages of 64 B) in its four modes, interleaved round by
//! round, timed from outside; the report compares each mode with its twin pair by pair:
//! endpoints scraped every 100 ms against the same scraper knocking on closed ports (what
//! serving costs beyond the scraper's own CPU on 2 cores), and endpoints nobody scrapes against
//! none (what recording costs).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::bench::Spread;

/// The script's modes, in the order each round runs them.
const MODES: [&str; 4] = ["with", "scraper-only", "unscraped", "without"];

/// Runs `rounds` rounds; the wall seconds of each mode, in round order. `None` when a run
/// failed (its output is printed).
pub fn measure(
    ferromq: &Path,
    workspace: &Path,
    rounds: usize,
) -> Option<BTreeMap<String, Vec<f64>>> {
    let script = workspace.join("benches/metrics-cost.sh");
    let mut seconds: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 1..=rounds {
        for mode in MODES {
            eprintln!("xtask: benches/metrics-cost.sh {mode} (round {round} of {rounds})");
            let started = Instant::now();
            let output = Command::new("bash")
                .arg(&script)
                .arg(mode)
                .env("FERROMQ", ferromq)
                .current_dir(workspace)
                .output()
                .ok()?;
            if !output.status.success() {
                eprintln!(
                    "xtask: metrics-cost.sh {mode} failed: {}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                return None;
            }
            seconds
                .entry(mode.to_owned())
                .or_default()
                .push(started.elapsed().as_secs_f64());
        }
    }
    Some(seconds)
}

/// The report's section for `seconds` (mode -> wall seconds per round).
pub fn render(seconds: &BTreeMap<String, Vec<f64>>) -> String {
    let mut section = String::from(
        "\n## What exporting metrics costs (benches/metrics-cost.sh, interleaved)\n\n\
         A shmem device pair, 10 000 001 x 64 B, wall seconds per run.\n\n\
         | mode | wall s, median (min-max) |\n|---|---|\n",
    );
    for mode in MODES {
        if let Some(values) = seconds.get(mode) {
            let spread = Spread::of(values);
            let _ = writeln!(
                section,
                "| {mode} | {:.2} ({:.2}-{:.2}) |",
                spread.median, spread.min, spread.max
            );
        }
    }
    section.push_str("\n| comparison (pair by pair) | ratio, median (min-max) |\n|---|---|\n");
    for (mode, twin, meaning) in [
        (
            "with",
            "scraper-only",
            "scraped endpoints ÷ the same scraper, no endpoints",
        ),
        (
            "unscraped",
            "without",
            "endpoints nobody scrapes ÷ no endpoints",
        ),
    ] {
        let (Some(a), Some(b)) = (seconds.get(mode), seconds.get(twin)) else {
            continue;
        };
        let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
        let spread = Spread::of(&ratios);
        let _ = writeln!(
            section,
            "| {meaning} | {:.3} ({:.3}-{:.3}) |",
            spread.median, spread.min, spread.max
        );
    }
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_taken_pair_by_pair() {
        let seconds: BTreeMap<String, Vec<f64>> = [
            ("with", vec![4.4, 4.0]),
            ("scraper-only", vec![4.0, 4.0]),
            ("unscraped", vec![3.0, 3.3]),
            ("without", vec![3.0, 3.0]),
        ]
        .into_iter()
        .map(|(mode, values)| (mode.to_owned(), values))
        .collect();
        let section = render(&seconds);
        assert!(section.contains("| with | 4.20 (4.00-4.40) |"), "{section}");
        assert!(
            section.contains(
                "| scraped endpoints ÷ the same scraper, no endpoints | 1.050 (1.000-1.100) |"
            ),
            "{section}"
        );
        assert!(
            section.contains("| endpoints nobody scrapes ÷ no endpoints | 1.050 (1.000-1.100) |"),
            "{section}"
        );
    }
}
