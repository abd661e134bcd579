//! The remote-invocation and MCTS sections of `cargo xtask bench`'s report: `ferromq bench rpc`
//! (calls/s per mode and size, round trips) beside Seriema's figures and ferromq's targets,
//! `ovfl` against `send` at light load (each at its own 1 % and both at one rate), and
//! the `mcts-hex` example's rollouts/s for 1, 2 and 4 workers per aggregation mode (16 playouts
//! per rollout, and `ovfl` with 1), beside the single-process UCT and crates.io's `mcts` on the
//! same Hex, with issue 15's targets.

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
    /// A call's latency from the call to its handler's start at light load, p50 (0 from an
    /// older `ferromq`; until 2026-12-07 to a `Consumed` ticket's return).
    #[serde(default)]
    pub light_load_p50_us: f64,
    /// The rate of that light load (0 from an older `ferromq`).
    #[serde(default)]
    pub light_load_calls_per_s: f64,
}

/// Issue 14's bound on `ovfl`'s light-load latency, as a multiple of unaggregated `send`'s.
const LIGHT_LOAD_TARGET: f64 = 1.2;

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
        "\n## Remote invocation (`ferromq bench rpc`)\n\nOne caller thread streaming through a `CallWriter` (its own frame, as each of Seriema's threads has; `--shared-frame` for `Rpc::call`, which differs in `trad` only), empty handlers in a second process; calls/s counted when the handlers ran, medians of the rounds (min-max). MB/s is argument bytes. Seriema's MB/s (FDR InfiniBand, two hosts, its paper) beside ours.\n\n| transport | mode | size | calls/s (min-max) | MB/s | Seriema MB/s | target | call_return p50 / p99 | returns/s, 64 in flight |\n|---|---|---|---|---|---|---|---|---|"
    );
    let find = |transport: &str, mode: &str, size: usize| find_line(lines, transport, mode, size);
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

/// The line of `transport`, `mode` and `size` in `lines`.
fn find_line<'a>(
    lines: &'a [RpcLine],
    transport: &str,
    mode: &str,
    size: usize,
) -> Option<&'a RpcLine> {
    lines
        .iter()
        .find(|line| line.transport == transport && line.mode == mode && line.call_size == size)
}

/// The light-load comparison: `ovfl` against unaggregated `send`, p50 from the call to its
/// handler's start (one way, on the host's clock), from `lines` (each mode at 1 % of its own
/// streaming rate, `ovfl`'s several times `send`'s calls a second) and from `at_one_rate`
/// (`--light-load-rate`: both at one rate, which the target is judged on).
pub fn render_light_load(lines: &[RpcLine], at_one_rate: &[RpcLine]) -> String {
    let mut text = String::new();
    let mut rows = Vec::new();
    // Each at its own rate is shown, not judged: the target compares the two at one load.
    for (runs, how, judge) in [(lines, "own 1 %", false), (at_one_rate, "one rate", true)] {
        for ovfl in runs.iter().filter(|line| line.mode == "ovfl") {
            let Some(send) = find_line(runs, &ovfl.transport, "send", ovfl.call_size) else {
                continue;
            };
            if send.light_load_p50_us <= 0.0 || ovfl.light_load_p50_us <= 0.0 {
                continue;
            }
            let ratio = ovfl.light_load_p50_us / send.light_load_p50_us;
            let judged = match (judge, ratio <= LIGHT_LOAD_TARGET) {
                (false, _) => "",
                (true, true) => " (met)",
                (true, false) => " (not met)",
            };
            rows.push(format!(
                "| {} | {} B | {how} | {:.1} µs at {:.0} k/s | {:.1} µs at {:.0} k/s | {ratio:.2}x{judged} |",
                ovfl.transport,
                ovfl.call_size,
                send.light_load_p50_us,
                send.light_load_calls_per_s / 1e3,
                ovfl.light_load_p50_us,
                ovfl.light_load_calls_per_s / 1e3,
            ));
        }
    }
    if rows.is_empty() {
        return text;
    }
    let _ = writeln!(
        text,
        "\nLight load, p50 from the call to its handler's start (one way, on the host's CLOCK_MONOTONIC; calls made as the round streamed them): each mode at 1 % of its own streaming rate, and both at one rate (`--light-load-rate`, 1 % of unaggregated `send`'s rate at 8 B over shmem). Target: `ovfl` ≤ {LIGHT_LOAD_TARGET}x `send` at one rate.\n\n| transport | size | rate | send | ovfl | ovfl ÷ send |\n|---|---|---|---|---|---|"
    );
    for row in rows {
        let _ = writeln!(text, "{row}");
    }
    text
}

/// Runs `ferromq bench rpc --json` with `args`; its lines, or `None` when it failed.
fn bench_rpc(ferromq: &Path, workspace: &Path, args: &[&str]) -> Option<Vec<RpcLine>> {
    let args: Vec<String> = ["bench", "rpc", "--json"]
        .iter()
        .chain(args)
        .map(|arg| (*arg).to_owned())
        .collect();
    Some(
        stdout_of(ferromq, &args, workspace)?
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect(),
    )
}

/// What `program` with `args` printed; `None` (and why, on stderr) when it failed.
fn stdout_of(program: &Path, args: &[String], workspace: &Path) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .current_dir(workspace)
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "xtask: {} {} failed: {}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// What the `--json` line of `mcts-hex` and of `mcts-crate-hex` says that the report reads.
#[derive(Debug, Clone, Deserialize)]
struct Rate {
    rollouts_per_s: f64,
}

/// One run of the MCTS section: what ran, and its rate.
#[derive(Debug, Clone, PartialEq)]
pub struct MctsLine {
    /// The aggregation mode (`none`, `trad`, `ovfl`), [`SINGLE_PROCESS`] or [`MCTS_CRATE`].
    pub what: String,
    /// Worker processes (threads for the `mcts` crate; 1 for the single-process UCT).
    pub workers: usize,
    /// Random playouts per rollout.
    pub playouts: u32,
    pub rollouts_per_s: f64,
}

/// The single-process UCT of `ferromq-mcts` (`mcts-hex --plain`), the yardstick.
const SINGLE_PROCESS: &str = "single-process UCT";
/// crates.io's `mcts` on the same Hex (`mcts-crate-hex`).
const MCTS_CRATE: &str = "`mcts` crate 0.3";

/// Issue 15's rate target: rollouts/s with one worker and one playout per rollout.
const ONE_WORKER_TARGET: f64 = 300e3;
/// Issue 15's scaling target: efficiency at 2 workers.
const EFFICIENCY_TARGET: f64 = 0.7;
/// Issue 15's scaling target on a 16-core host: efficiency at 8 workers.
const EFFICIENCY_AT_8_TARGET: f64 = 0.6;
/// Cores from which the section runs 8 workers (and the `mcts` crate on 8 threads): 8 workers
/// and the driver each with a core of their own, as on the 16-core host.
const CORES_FOR_8_WORKERS: usize = 16;

/// The MCTS section: rollouts/s per mode, worker count and playouts, with the single-process
/// UCT and the `mcts` crate beside them, and the targets.
pub fn render_mcts(lines: &[MctsLine]) -> String {
    let mut text = String::new();
    if lines.is_empty() {
        return text;
    }
    // Ordered by playouts (16 first), then what ran, then workers.
    let mut cells: BTreeMap<(std::cmp::Reverse<u32>, String, usize), Vec<f64>> = BTreeMap::new();
    for line in lines {
        cells
            .entry((
                std::cmp::Reverse(line.playouts),
                line.what.clone(),
                line.workers,
            ))
            .or_default()
            .push(line.rollouts_per_s);
    }
    let median = |playouts: u32, what: &str, workers: usize| {
        cells
            .get(&(std::cmp::Reverse(playouts), what.to_owned(), workers))
            .map(|rates| Spread::of(rates).median)
    };
    let _ = writeln!(
        text,
        "\n## Distributed MCTS (`mcts-hex` example, 11x11 Hex)\n\n| playouts per rollout | what | workers (threads) | rollouts/s (min-max) | efficiency vs 1 |\n|---|---|---|---|---|"
    );
    for ((std::cmp::Reverse(playouts), what, workers), rates) in &cells {
        let spread = Spread::of(rates);
        let single = median(*playouts, what, 1).unwrap_or(spread.median);
        let _ = writeln!(
            text,
            "| {playouts} | {what} | {workers} | {:.1} k ({:.1}-{:.1}) | {:.2} |",
            spread.median / 1e3,
            spread.min / 1e3,
            spread.max / 1e3,
            spread.median / (single * *workers as f64)
        );
    }
    let verdict = |met: bool| if met { "met" } else { "not met" };
    let mut targets = Vec::new();
    if let Some(rate) = median(1, "ovfl", 1) {
        targets.push(format!(
            "≥ {:.0} k rollouts/s with one worker and 1 playout: {:.1} k ({})",
            ONE_WORKER_TARGET / 1e3,
            rate / 1e3,
            verdict(rate >= ONE_WORKER_TARGET)
        ));
    }
    if let (Some(one), Some(two)) = (median(16, "ovfl", 1), median(16, "ovfl", 2)) {
        let efficiency = two / (2.0 * one);
        targets.push(format!(
            "scaling efficiency ≥ {EFFICIENCY_TARGET} at 2 workers (ovfl, 16 playouts, on 2 cores shared with the driver here): {efficiency:.2} ({})",
            verdict(efficiency >= EFFICIENCY_TARGET)
        ));
    }
    if let (Some(one), Some(eight)) = (median(16, "ovfl", 1), median(16, "ovfl", 8)) {
        let efficiency = eight / (8.0 * one);
        targets.push(format!(
            "scaling efficiency ≥ {EFFICIENCY_AT_8_TARGET} at 8 workers (ovfl, 16 playouts, a core each): {efficiency:.2} ({})",
            verdict(efficiency >= EFFICIENCY_AT_8_TARGET)
        ));
    }
    if !targets.is_empty() {
        let _ = writeln!(text, "\nTargets: {}.", targets.join("; "));
    }
    text
}

/// Runs `program` with `args` and reads the rate from its `--json` line; `None` (and why, on
/// stderr) when it fails.
pub(crate) fn rate_of(program: &Path, args: &[String], workspace: &Path) -> Option<f64> {
    let rate = stdout_of(program, args, workspace)?
        .lines()
        .find_map(|line| serde_json::from_str::<Rate>(line).ok());
    if rate.is_none() {
        eprintln!(
            "xtask: {} {} printed no rollouts_per_s",
            program.display(),
            args.join(" ")
        );
    }
    Some(rate?.rollouts_per_s)
}

/// Runs `ferromq bench rpc` (3 rounds; again with `--light-load-rate` for `send` and `ovfl`),
/// then the `mcts-hex` example (1, 2, 4 workers per mode, each search measured after a 1 s
/// warm-up search, as BENCHMARKS.md asks; `--plain`) and `mcts-crate-hex` (1, 2 threads), 3
/// rounds interleaved; their report sections, or `None` when a run failed.
pub fn run(cargo: &str, workspace: &Path, ferromq: &Path) -> Option<String> {
    eprintln!("xtask: ferromq bench rpc");
    let rpc = bench_rpc(
        ferromq,
        workspace,
        &["--rounds", "3", "--transport", "shmem,zeromq-ipc"],
    )?;
    // Light load with both modes at one rate: 1 % of what unaggregated `send` streamed at 8 B
    // over shmem (the README's 27 000 calls/s), light for both modes. 1 % of `ovfl`'s rate is
    // `trad`'s 1 %: a fifth to a quarter of what `send` carries, no light load for it.
    let one_rate = find_line(&rpc, "shmem", "send", 8)
        .map(|line| format!("{:.0}", (line.calls_per_s / 100.0).max(1.0)));
    let at_one_rate = match &one_rate {
        Some(rate) => {
            eprintln!("xtask: ferromq bench rpc --light-load-rate {rate}");
            bench_rpc(
                ferromq,
                workspace,
                &[
                    "--rounds",
                    "3",
                    "--transport",
                    "shmem,zeromq-ipc",
                    "--mode",
                    "send,ovfl",
                    "--call-size",
                    "8,64",
                    "--duration",
                    "0.5",
                    "--light-load-rate",
                    rate,
                ],
            )?
        }
        None => Vec::new(),
    };
    let built = [
        vec!["build", "--release", "--example", "mcts-hex"],
        vec![
            "build",
            "--release",
            "-p",
            "ferromq-mcts",
            "--example",
            "mcts-crate-hex",
        ],
    ]
    .iter()
    .all(|args| {
        Command::new(cargo)
            .args(args)
            .current_dir(workspace)
            .status()
            .is_ok_and(|status| status.success())
    });
    if !built {
        eprintln!("xtask: building the mcts-hex and mcts-crate-hex examples failed");
        return None;
    }
    let example = workspace.join("target/release/examples/mcts-hex");
    let crate_example = workspace.join("target/release/examples/mcts-crate-hex");
    // (what, workers or threads, playouts): 40 000 rollouts with 16 playouts, 100 000 with 1.
    let mut runs: Vec<(&str, usize, u32)> = vec![(SINGLE_PROCESS, 1, 16), (SINGLE_PROCESS, 1, 1)];
    for mode in ["none", "trad", "ovfl"] {
        runs.extend([1, 2, 4].map(|workers| (mode, workers, 16)));
    }
    runs.extend([1, 2, 4].map(|workers| ("ovfl", workers, 1)));
    runs.extend([
        (MCTS_CRATE, 1, 16),
        (MCTS_CRATE, 2, 16),
        (MCTS_CRATE, 1, 1),
        (MCTS_CRATE, 2, 1),
    ]);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores >= CORES_FOR_8_WORKERS {
        runs.extend([("ovfl", 8, 16), (MCTS_CRATE, 8, 16)]);
    }
    let mut mcts = Vec::new();
    // Three rounds, all the runs of one round, then the next.
    for _ in 0..3 {
        for &(what, workers, playouts) in &runs {
            let rollouts = if playouts == 1 { "100000" } else { "40000" };
            let mut args: Vec<String> = ["--board", "11", "--rollouts", rollouts, "--playouts"]
                .map(str::to_owned)
                .to_vec();
            args.push(playouts.to_string());
            let program = match what {
                SINGLE_PROCESS => {
                    args.extend(["--plain", "--json"].map(str::to_owned));
                    &example
                }
                MCTS_CRATE => {
                    args.extend(["--threads".to_owned(), workers.to_string()]);
                    &crate_example
                }
                mode => {
                    // BENCHMARKS.md's warm-up. The JSON line is read once the run has ended, so
                    // nothing starts beside the search (README, "Distributed MCTS").
                    args.extend(
                        ["--aggregate", mode, "--warm-up", "1", "--json", "--workers"]
                            .map(str::to_owned),
                    );
                    args.push(workers.to_string());
                    &example
                }
            };
            mcts.push(MctsLine {
                what: what.to_owned(),
                workers,
                playouts,
                rollouts_per_s: rate_of(program, &args, workspace)?,
            });
        }
    }
    Some(render_rpc(&rpc) + &render_light_load(&rpc, &at_one_rate) + &render_mcts(&mcts))
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
            light_load_p50_us: 0.0,
            light_load_calls_per_s: 0.0,
        }
    }

    /// A line of `mode` at 64 B with a light-load p50 at a rate.
    fn light(transport: &str, mode: &str, p50_us: f64, rate: f64) -> RpcLine {
        RpcLine {
            transport: transport.to_owned(),
            light_load_p50_us: p50_us,
            light_load_calls_per_s: rate,
            ..line(mode, 64, rate * 100.0)
        }
    }

    #[test]
    fn the_light_load_section_judges_ovfl_against_send_at_one_rate() {
        let own = [
            light("zeromq-ipc", "send", 35.0, 27e3),
            light("zeromq-ipc", "ovfl", 47.0, 135e3),
        ];
        let one = [
            light("zeromq-ipc", "send", 49.6, 135e3),
            light("zeromq-ipc", "ovfl", 47.6, 135e3),
            light("shmem", "send", 10.0, 135e3),
            light("shmem", "ovfl", 13.0, 135e3),
        ];
        let text = render_light_load(&own, &one);
        for row in [
            // Each at its own rate: shown, not judged.
            "| zeromq-ipc | 64 B | own 1 % | 35.0 µs at 27 k/s | 47.0 µs at 135 k/s | 1.34x |",
            "| zeromq-ipc | 64 B | one rate | 49.6 µs at 135 k/s | 47.6 µs at 135 k/s | 0.96x (met) |",
            "| shmem | 64 B | one rate | 10.0 µs at 135 k/s | 13.0 µs at 135 k/s | 1.30x (not met) |",
        ] {
            assert!(text.contains(row), "{row}\n{text}");
        }
        // Nothing to compare (an older `ferromq`, or no ovfl run): no section.
        assert!(render_light_load(&[line("send", 8, 1e6)], &[]).is_empty());
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
    fn the_mcts_section_gives_efficiency_against_one_worker_and_the_targets() {
        let line = |what: &str, workers, playouts, rollouts_per_s| MctsLine {
            what: what.to_owned(),
            workers,
            playouts,
            rollouts_per_s,
        };
        let lines = [
            line("ovfl", 1, 16, 20e3),
            line("ovfl", 2, 16, 30e3),
            line(SINGLE_PROCESS, 1, 16, 25e3),
            line("ovfl", 1, 1, 250e3),
            line("ovfl", 1, 1, 260e3),
            line("ovfl", 1, 1, 310e3),
            line(MCTS_CRATE, 2, 1, 150e3),
        ];
        let text = render_mcts(&lines);
        assert!(
            text.contains("| 16 | ovfl | 2 | 30.0 k (30.0-30.0) | 0.75 |"),
            "{text}"
        );
        assert!(
            text.contains("| 16 | single-process UCT | 1 | 25.0 k"),
            "{text}"
        );
        assert!(
            text.contains("| 1 | ovfl | 1 | 260.0 k (250.0-310.0) | 1.00 |"),
            "{text}"
        );
        // No one-thread run of the crate: its efficiency is against itself.
        assert!(
            text.contains("| 1 | `mcts` crate 0.3 | 2 | 150.0 k"),
            "{text}"
        );
        assert!(
            text.find("| 16 | ovfl") < text.find("| 1 | ovfl"),
            "16 playouts first: {text}"
        );
        assert!(
            text.contains("with one worker and 1 playout: 260.0 k (not met)"),
            "{text}"
        );
        assert!(text.contains("at 2 workers"), "{text}");
        assert!(text.contains(": 0.75 (met)"), "{text}");
        assert!(!text.contains("at 8 workers"), "no 8-worker run: {text}");
        let mut with_eight = lines.to_vec();
        with_eight.push(line("ovfl", 8, 16, 100e3));
        let text = render_mcts(&with_eight);
        assert!(
            text.contains("| 16 | ovfl | 8 | 100.0 k (100.0-100.0) | 0.62 |"),
            "{text}"
        );
        assert!(
            text.contains("≥ 0.6 at 8 workers (ovfl, 16 playouts, a core each): 0.62 (met)"),
            "{text}"
        );
        assert!(render_mcts(&[]).is_empty());
    }
}
