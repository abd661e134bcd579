//! The remote-invocation and MCTS sections of `cargo xtask bench`'s report: `ferromq bench rpc`
//! (calls/s per mode and size, round trips) beside Seriema's figures and ferromq's targets, and
//! the `mcts-hex` example's rollouts/s for 1, 2 and 4 workers per aggregation mode.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use crate::bench::Spread;

/// One line of `ferromq bench rpc --json` (medians of its rounds).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RpcLine {
    pub transport: String,
    pub mode: String,
    pub call_size: usize,
    pub calls_per_s: f64,
    pub calls_per_s_min: f64,
    pub calls_per_s_max: f64,
    pub mb_per_s: f64,
    pub return_p50_us: f64,
    pub return_p99_us: f64,
    pub returns_per_s_64_in_flight: f64,
}

/// Seriema's MB/s on FDR InfiniBand (its paper): (size, unaggregated, ovfl, trad).
const SERIEMA_MB_PER_S: [(usize, f64, f64, f64); 3] = [
    (8, 38.0, 37.0, 2117.0),
    (64, 301.0, 283.0, 4256.0),
    (256, 1130.0, 1061.0, 5319.0),
];

/// ferromq's targets for `trad` over shmem, calls/s by size.
const TRAD_TARGETS: [(usize, f64); 3] = [(8, 10e6), (64, 4e6), (256, 2e6)];

/// The remote-invocation section.
pub fn render_rpc(lines: &[RpcLine]) -> String {
    let mut text = String::new();
    if lines.is_empty() {
        return text;
    }
    let _ = writeln!(
        text,
        "\n## Remote invocation (`ferromq bench rpc`)\n\nOne caller thread, empty handlers in a second process; calls/s counted when the handlers ran, medians of the rounds (min-max). MB/s is argument bytes. Seriema's MB/s (FDR InfiniBand, two hosts, its paper) beside ours.\n\n| transport | mode | size | calls/s (min-max) | MB/s | Seriema MB/s | target | call_return p50 / p99 | returns/s, 64 in flight |\n|---|---|---|---|---|---|---|---|---|"
    );
    let find = |transport: &str, mode: &str, size: usize| {
        lines
            .iter()
            .find(|line| line.transport == transport && line.mode == mode && line.call_size == size)
    };
    for line in lines {
        let seriema = SERIEMA_MB_PER_S
            .iter()
            .find(|(size, ..)| *size == line.call_size)
            .map_or(String::new(), |(_, send, ovfl, trad)| {
                match line.mode.as_str() {
                    "send" => format!("{send}"),
                    "ovfl" => format!("{ovfl}"),
                    _ => format!("{trad}"),
                }
            });
        let target = match (line.transport.as_str(), line.mode.as_str()) {
            ("shmem", "trad") => TRAD_TARGETS
                .iter()
                .find(|(size, _)| *size == line.call_size)
                .map_or(String::new(), |(_, target)| {
                    let met = if line.calls_per_s >= *target {
                        "met"
                    } else {
                        "not met"
                    };
                    format!("≥ {:.0} M ({met})", target / 1e6)
                }),
            _ => String::new(),
        };
        let _ = writeln!(
            text,
            "| {} | {} | {} B | {:.2} M ({:.2}-{:.2}) | {:.1} | {seriema} | {target} | {:.0} / {:.0} µs | {:.0} k |",
            line.transport,
            line.mode,
            line.call_size,
            line.calls_per_s / 1e6,
            line.calls_per_s_min / 1e6,
            line.calls_per_s_max / 1e6,
            line.mb_per_s,
            line.return_p50_us,
            line.return_p99_us,
            line.returns_per_s_64_in_flight / 1e3,
        );
    }
    if let (Some(trad), Some(send)) = (find("shmem", "trad", 8), find("shmem", "send", 8)) {
        let ratio = trad.calls_per_s / send.calls_per_s.max(1.0);
        let met = if ratio >= 20.0 { "met" } else { "not met" };
        let _ = writeln!(
            text,
            "\ntrad ÷ unaggregated at 8 B over shmem: {ratio:.1}x (target ≥ 20x: {met}). call_return targets: p50 ≤ 50 µs, p99 ≤ 150 µs, ≥ 1 M returns/s with 64 in flight."
        );
    }
    text
}

/// One line of the `mcts-hex` example's `--json`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct MctsLine {
    #[serde(default)]
    pub plain: bool,
    #[serde(default)]
    pub workers: usize,
    #[serde(default)]
    pub aggregate: String,
    pub rollouts_per_s: f64,
}

/// The MCTS section: rollouts/s per mode and worker count, and the single-process yardstick.
pub fn render_mcts(lines: &[MctsLine]) -> String {
    let mut text = String::new();
    if lines.is_empty() {
        return text;
    }
    let mut cells: BTreeMap<(String, usize), Vec<f64>> = BTreeMap::new();
    for line in lines {
        let key = if line.plain {
            ("single-process UCT".to_owned(), 1)
        } else {
            (line.aggregate.clone(), line.workers)
        };
        cells.entry(key).or_default().push(line.rollouts_per_s);
    }
    let _ = writeln!(
        text,
        "\n## Distributed MCTS (`mcts-hex` example, 11x11 Hex, 16 playouts per rollout)\n\n| mode | workers | rollouts/s (min-max) | efficiency vs 1 worker |\n|---|---|---|---|"
    );
    for ((mode, workers), rates) in &cells {
        let spread = Spread::of(rates);
        let single = cells
            .get(&(mode.clone(), 1))
            .map(|rates| Spread::of(rates).median)
            .unwrap_or(spread.median);
        let _ = writeln!(
            text,
            "| {mode} | {workers} | {:.1} k ({:.1}-{:.1}) | {:.2} |",
            spread.median / 1e3,
            spread.min / 1e3,
            spread.max / 1e3,
            spread.median / (single * *workers as f64)
        );
    }
    let _ = writeln!(
        text,
        "\nTargets: scaling efficiency ≥ 0.7 at 2 workers (on 2 cores shared with the driver here)."
    );
    text
}

/// Runs `ferromq bench rpc` (3 rounds) and the `mcts-hex` example (1, 2, 4 workers per mode,
/// 3 runs interleaved); their report sections, or `None` when a run failed.
pub fn run(cargo: &str, workspace: &Path, ferromq: &Path) -> Option<String> {
    eprintln!("xtask: ferromq bench rpc");
    let output = Command::new(ferromq)
        .args([
            "bench",
            "rpc",
            "--json",
            "--rounds",
            "3",
            "--transport",
            "shmem,zeromq-ipc",
        ])
        .current_dir(workspace)
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "xtask: ferromq bench rpc failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    let rpc: Vec<RpcLine> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let built = Command::new(cargo)
        .args(["build", "--release", "--example", "mcts-hex"])
        .current_dir(workspace)
        .status()
        .is_ok_and(|status| status.success());
    if !built {
        eprintln!("xtask: building the mcts-hex example failed");
        return None;
    }
    let example = workspace.join("target/release/examples/mcts-hex");
    let mut mcts = Vec::new();
    for _ in 0..3 {
        let mut cells: Vec<Vec<String>> = vec![vec!["--plain".to_owned()]];
        for mode in ["none", "trad", "ovfl"] {
            for workers in ["1", "2", "4"] {
                cells.push(
                    ["--aggregate", mode, "--workers", workers]
                        .map(str::to_owned)
                        .to_vec(),
                );
            }
        }
        for cell in cells {
            let output = Command::new(&example)
                .args(["--board", "11", "--rollouts", "40000", "--json"])
                .args(&cell)
                .current_dir(workspace)
                .output()
                .ok()?;
            if !output.status.success() {
                eprintln!(
                    "xtask: mcts-hex {} failed: {}",
                    cell.join(" "),
                    String::from_utf8_lossy(&output.stderr)
                );
                return None;
            }
            mcts.extend(
                String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .filter_map(|line| serde_json::from_str::<MctsLine>(line).ok()),
            );
        }
    }
    Some(render_rpc(&rpc) + &render_mcts(&mcts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(mode: &str, size: usize, calls_per_s: f64) -> RpcLine {
        RpcLine {
            transport: "shmem".to_owned(),
            mode: mode.to_owned(),
            call_size: size,
            calls_per_s,
            calls_per_s_min: calls_per_s * 0.9,
            calls_per_s_max: calls_per_s * 1.1,
            mb_per_s: calls_per_s * size as f64 / 1e6,
            return_p50_us: 30.0,
            return_p99_us: 90.0,
            returns_per_s_64_in_flight: 400e3,
        }
    }

    #[test]
    fn the_rpc_section_has_seriema_targets_and_the_aggregation_ratio() {
        let text = render_rpc(&[line("send", 8, 1e6), line("trad", 8, 12e6)]);
        assert!(
            text.contains(
                "| shmem | trad | 8 B | 12.00 M (10.80-13.20) | 96.0 | 2117 | ≥ 10 M (met) |"
            ),
            "{text}"
        );
        assert!(text.contains("| shmem | send | 8 B | 1.00 M"), "{text}");
        assert!(text.contains("12.0x (target ≥ 20x: not met)"), "{text}");
        assert!(render_rpc(&[]).is_empty());
    }

    #[test]
    fn the_mcts_section_gives_efficiency_against_one_worker() {
        let lines = [
            MctsLine {
                plain: false,
                workers: 1,
                aggregate: "ovfl".to_owned(),
                rollouts_per_s: 20e3,
            },
            MctsLine {
                plain: false,
                workers: 2,
                aggregate: "ovfl".to_owned(),
                rollouts_per_s: 30e3,
            },
            MctsLine {
                plain: true,
                workers: 0,
                aggregate: String::new(),
                rollouts_per_s: 25e3,
            },
        ];
        let text = render_mcts(&lines);
        assert!(
            text.contains("| ovfl | 2 | 30.0 k (30.0-30.0) | 0.75 |"),
            "{text}"
        );
        assert!(text.contains("| single-process UCT | 1 | 25.0 k"), "{text}");
    }
}
