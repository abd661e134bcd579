//! `cargo xtask bench`: runs the criterion suites, `ferromq bench`, `ferromq bench rpc` and the
//! `mcts-hex` example (see `bench_rpc.rs`), then writes
//! `target/bench-report/report.md` (medians with min/max, ratios between transports, the
//! targets next to what was measured) and SVG plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use plotters::prelude::*;
use serde::Deserialize;

/// One line of `ferromq bench --json`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BenchLine {
    pub transport: String,
    pub msg_size: usize,
    pub msgs_per_s: f64,
    pub gb_per_s: f64,
    pub sender_cpu: f64,
    pub receiver_cpu: f64,
    pub latency_us: Option<[f64; 3]>,
    #[serde(default)]
    pub msg_rate: f64,
}

/// Median, min and max of some runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Spread {
            median: median_of_sorted(&sorted),
            min: sorted.first().copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

/// The median of `values` (0 for none): the middle one, or the mean of the middle two.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    median_of_sorted(&sorted)
}

fn median_of_sorted(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A criterion benchmark's per-iteration times, from its `new/sample.json`.
#[derive(Debug, Deserialize)]
struct Sample {
    iters: Vec<f64>,
    times: Vec<f64>,
}

/// Parses a criterion `sample.json` into nanoseconds per iteration (median, min, max).
pub fn criterion_spread(sample_json: &str) -> Option<Spread> {
    let sample: Sample = serde_json::from_str(sample_json).ok()?;
    let per_iteration: Vec<f64> = sample
        .iters
        .iter()
        .zip(&sample.times)
        .map(|(iters, time)| time / iters)
        .collect();
    (!per_iteration.is_empty()).then(|| Spread::of(&per_iteration))
}

/// Every `new/sample.json` under `target/criterion`, by benchmark id (`throughput/shmem/64`).
fn criterion_results(criterion_dir: &Path) -> BTreeMap<String, Spread> {
    let mut results = BTreeMap::new();
    let mut stack = vec![criterion_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.ends_with("new/sample.json") {
                let id = path
                    .parent()
                    .and_then(Path::parent)
                    .and_then(|bench| bench.strip_prefix(criterion_dir).ok());
                if let (Some(id), Some(spread)) = (
                    id,
                    std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|json| criterion_spread(&json)),
                ) {
                    results.insert(id.display().to_string(), spread);
                }
            }
        }
    }
    results
}

/// FairMQ's figures on this kind of machine and ferromq's targets (issue: benchmarks).
const TARGETS: [(&str, usize, f64, f64); 5] = [
    // (transport, size, FairMQ msg/s, ferromq target msg/s)
    ("shmem", 64, 1.44e6, 3.0e6),
    ("shmem", 1024, 1.56e6, 3.0e6),
    ("shmem", 65536, 1.45e6, 3.0e6),
    ("shmem", 1048576, 1.33e6, 3.0e6),
    ("shmem", 8388608, 0.94e6, 1.9e6),
];
const ZEROMQ_FAIRMQ: [(usize, f64); 5] = [
    (64, 3.05e6),
    (1024, 714e3),
    (65536, 19.4e3),
    (1048576, 3.5e3),
    (8388608, 296.0),
];

fn size_label(size: usize) -> String {
    match size {
        size if size >= 1 << 20 => format!("{} MiB", size >> 20),
        size if size >= 1 << 10 => format!("{} KiB", size >> 10),
        size => format!("{size} B"),
    }
}

/// Renders the report from the two-process runs and the criterion results; `floor` is the
/// machine's wake-up floor measured before the paced runs (sender, receiver; % of a core).
pub fn render_report(
    runs: &[BenchLine],
    criterion: &BTreeMap<String, Spread>,
    profile: Option<&str>,
    machine: &str,
    date: &str,
    floor: Option<(f64, f64)>,
) -> String {
    let mut grouped: BTreeMap<(String, usize), Vec<&BenchLine>> = BTreeMap::new();
    for run in runs
        .iter()
        .filter(|run| run.latency_us.is_none() && run.msg_rate == 0.0)
    {
        grouped
            .entry((run.transport.clone(), run.msg_size))
            .or_default()
            .push(run);
    }
    let rate = |transport: &str, size: usize| {
        grouped
            .get(&(transport.to_owned(), size))
            .map(|runs| Spread::of(&runs.iter().map(|run| run.msgs_per_s).collect::<Vec<_>>()))
    };
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# ferromq benchmark report\n\nTaken {date} on {machine}. Medians of the runs, with min-max.\n"
    );
    let _ = writeln!(report, "## Two processes (`ferromq bench`)\n");
    let _ = writeln!(
        report,
        "| transport | size | msg/s (min-max) | GB/s | sender CPU % | receiver CPU % |\n|---|---|---|---|---|---|"
    );
    for ((transport, size), runs) in &grouped {
        let spread = Spread::of(&runs.iter().map(|run| run.msgs_per_s).collect::<Vec<_>>());
        let median = |field: fn(&BenchLine) -> f64| {
            Spread::of(&runs.iter().map(|run| field(run)).collect::<Vec<_>>()).median
        };
        let _ = writeln!(
            report,
            "| {transport} | {} | {:.0} ({:.0}-{:.0}) | {:.3} | {:.1} | {:.1} |",
            size_label(*size),
            spread.median,
            spread.min,
            spread.max,
            median(|run| run.gb_per_s),
            median(|run| run.sender_cpu),
            median(|run| run.receiver_cpu)
        );
    }
    let _ = writeln!(
        report,
        "\n## Ratios (same run)\n\n| size | shmem / zeromq-ipc | shmem / zeromq-tcp | ofi-tcp / zeromq-tcp |\n|---|---|---|---|"
    );
    let sizes: std::collections::BTreeSet<usize> = grouped.keys().map(|(_, size)| *size).collect();
    for size in &sizes {
        let ratio = |this: &str, other: &str| match (rate(this, *size), rate(other, *size)) {
            (Some(this), Some(other)) if other.median > 0.0 => {
                format!("{:.2}x", this.median / other.median)
            }
            _ => "-".to_owned(),
        };
        let _ = writeln!(
            report,
            "| {} | {} | {} | {} |",
            size_label(*size),
            ratio("shmem", "zeromq-ipc"),
            ratio("shmem", "zeromq-tcp"),
            ratio("ofi-tcp", "zeromq-tcp")
        );
    }
    let _ = writeln!(
        report,
        "\n## Targets\n\n| case | FairMQ | target | ferromq (median) | vs target |\n|---|---|---|---|---|"
    );
    for (transport, size, fairmq, target) in TARGETS {
        let measured =
            rate(transport, size).map_or("-".to_owned(), |spread| format!("{:.0}", spread.median));
        let versus = rate(transport, size).map_or("-".to_owned(), |spread| {
            format!("{:.0}%", spread.median / target * 100.0)
        });
        let _ = writeln!(
            report,
            "| {transport} {} msg/s | {fairmq:.0} | {target:.0} | {measured} | {versus} |",
            size_label(size)
        );
    }
    for (size, fairmq) in ZEROMQ_FAIRMQ {
        let measured = rate("zeromq-ipc", size)
            .map_or("-".to_owned(), |spread| format!("{:.0}", spread.median));
        let versus = rate("zeromq-ipc", size).map_or("-".to_owned(), |spread| {
            format!("{:.0}%", spread.median / fairmq * 100.0)
        });
        let _ = writeln!(
            report,
            "| zeromq-ipc {} msg/s | {fairmq:.0} | {fairmq:.0} | {measured} | {versus} |",
            size_label(size)
        );
    }
    let paced: Vec<&BenchLine> = runs
        .iter()
        .filter(|run| run.latency_us.is_none() && run.msg_rate > 0.0)
        .collect();
    if !paced.is_empty() {
        let _ = writeln!(
            report,
            "\n## CPU at a fixed rate (target: shmem at most 1% of a core per side at 1 MiB x 2500 msg/s)\n\n| transport | size | rate | sender CPU % | receiver CPU % |\n|---|---|---|---|---|"
        );
        for run in paced {
            let _ = writeln!(
                report,
                "| {} | {} | {:.0} msg/s | {:.1} | {:.1} |",
                run.transport,
                size_label(run.msg_size),
                run.msgs_per_s,
                run.sender_cpu,
                run.receiver_cpu
            );
        }
        if let Some((sender, receiver)) = floor {
            // What the machine takes before any work: see `side_by_side::wake_up_floor`.
            let _ = writeln!(
                report,
                "| wake-up floor (a thread that only wakes as a paced sender does, and the thread it wakes) | - | - | {sender:.1} | {receiver:.1} |"
            );
        }
    }
    let latencies: Vec<&BenchLine> = runs.iter().filter(|run| run.latency_us.is_some()).collect();
    if !latencies.is_empty() {
        let _ = writeln!(
            report,
            "\n## Round trips (req/rep, two processes)\n\n| transport | size | p50 µs | p99 µs | p99.9 µs |\n|---|---|---|---|---|"
        );
        for run in latencies {
            let [p50, p99, p999] = run.latency_us.expect("filtered");
            let _ = writeln!(
                report,
                "| {} | {} | {p50:.1} | {p99:.1} | {p999:.1} |",
                run.transport,
                size_label(run.msg_size)
            );
        }
    }
    if !criterion.is_empty() {
        let _ = writeln!(
            report,
            "\n## In one process (criterion), time per iteration\n\n| benchmark | median | min-max |\n|---|---|---|"
        );
        for (id, spread) in criterion {
            let _ = writeln!(
                report,
                "| {id} | {:.3} µs | {:.3}-{:.3} µs |",
                spread.median / 1e3,
                spread.min / 1e3,
                spread.max / 1e3
            );
        }
    }
    if let Some(profile) = profile {
        let _ = writeln!(
            report,
            "\n## Where the time goes (perf, shmem 64 B, both processes)\n\nSelf time by process and symbol, entries above 1.5%:\n\n```text\n{}\n```",
            profile.trim_end()
        );
    }
    let _ = writeln!(
        report,
        "\nPlots: [throughput.svg](throughput.svg), [latency.svg](latency.svg)."
    );
    report
}

/// Axis labels like 64, 1k, 1M for log axes.
fn short_number(value: &f64) -> String {
    match *value {
        value if value >= 1e9 => format!("{}G", value / 1e9),
        value if value >= 1e6 => format!("{}M", value / 1e6),
        value if value >= 1e3 => format!("{}k", value / 1e3),
        value => format!("{value}"),
    }
}

fn plot_throughput(runs: &[BenchLine], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut series: BTreeMap<String, BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    for run in runs.iter().filter(|run| run.latency_us.is_none()) {
        series
            .entry(run.transport.clone())
            .or_default()
            .entry(run.msg_size)
            .or_default()
            .push(run.msgs_per_s);
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Throughput between two processes (msg/s, log-log)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((32f64..16e6f64).log_scale(), (10f64..1e8f64).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("messages/s")
        .x_label_formatter(&short_number)
        .y_label_formatter(&short_number)
        .draw()?;
    for (idx, (transport, points)) in series.iter().enumerate() {
        let color = Palette99::pick(idx).to_rgba();
        let line: Vec<(f64, f64)> = points
            .iter()
            .map(|(size, rates)| (*size as f64, Spread::of(rates).median.max(10.0)))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(transport.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(
            line.into_iter()
                .map(|point| Circle::new(point, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn plot_latency(runs: &[BenchLine], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Round-trip latency, cumulative (p50, p99, p99.9)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((1f64..1e5f64).log_scale(), 0.5f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("round trip (µs)")
        .y_desc("fraction of round trips")
        .x_label_formatter(&short_number)
        .draw()?;
    for (idx, run) in runs
        .iter()
        .filter(|run| run.latency_us.is_some())
        .enumerate()
    {
        let [p50, p99, p999] = run.latency_us.expect("filtered");
        let color = Palette99::pick(idx).to_rgba();
        let line = vec![
            (p50.max(1.0), 0.5),
            (p99.max(1.0), 0.99),
            (p999.max(1.0), 0.999),
        ];
        let label = format!("{} {}", run.transport, size_label(run.msg_size));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// A `perf` profile of a shmem 64 B pair (sender and receiver), when `perf` works here.
fn profile_shmem(ferromq: &Path, report_dir: &Path) -> Option<String> {
    let data = report_dir.join("perf.data");
    let recorded = Command::new("perf")
        .args(["record", "-F", "999", "-g", "-o"])
        .arg(&data)
        .arg("--")
        .arg(ferromq)
        .args([
            "bench",
            "--transport",
            "shmem",
            "--msg-size",
            "64",
            "--duration",
            "2",
        ])
        .output()
        .ok()?;
    if !recorded.status.success() {
        return None;
    }
    let report = Command::new("perf")
        .args([
            "report",
            "--no-children",
            "--stdio",
            "--sort",
            "comm,symbol",
            "--percent-limit",
            "1.5",
            "-g",
            "none",
            "-i",
        ])
        .arg(&data)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&data);
    let text = String::from_utf8_lossy(&report.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        // perf pads each line with empty columns; keep the percentage, process and symbol.
        .map(|line| line.trim_end().trim_end_matches(['-', ' ']))
        .take(30)
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .map(|line| line.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{cores} cores, {cpu}")
}

/// The time now in UTC, as `date -u +FORMAT` writes it (empty if `date` cannot run).
pub(crate) fn utc_now(format: &str) -> String {
    Command::new("date")
        .arg("-u")
        .arg(format!("+{format}"))
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Runs everything and writes the report; false when a step failed.
pub fn run(cargo: &str, workspace: &Path) -> bool {
    let report_dir = workspace.join("target/bench-report");
    let _ = std::fs::create_dir_all(&report_dir);
    for bench in ["throughput", "latency", "shm_allocator", "messages"] {
        eprintln!("xtask: cargo bench --bench {bench}");
        let ok = Command::new(cargo)
            .args(["bench", "--bench", bench])
            .current_dir(workspace)
            .status()
            .is_ok_and(|status| status.success());
        if !ok {
            eprintln!("xtask: bench {bench} failed");
            return false;
        }
    }
    // With libfabric installed, the binary gets the ofi transport and ofi-tcp joins the runs.
    let with_ofi = Command::new("pkg-config")
        .args(["--exists", "libfabric"])
        .status()
        .is_ok_and(|status| status.success());
    if !with_ofi {
        eprintln!("xtask: libfabric not found (pkg-config): benchmarking without ofi-tcp");
    }
    let features: &[&str] = if with_ofi { &["ofi"] } else { &[] };
    let Some(ferromq) = crate::build_release_ferromq(cargo, workspace, features) else {
        return false;
    };
    let mut runs = Vec::new();
    let mut floor = None;
    let throughput_args = [
        "bench",
        "--json",
        "--duration",
        "2",
        "--transport",
        if with_ofi {
            "shmem,zeromq-ipc,zeromq-tcp,ofi-tcp"
        } else {
            "shmem,zeromq-ipc,zeromq-tcp"
        },
        "--msg-size",
        "64,1024,65536,1048576,8388608",
    ];
    let latency_args = [
        "bench",
        "--json",
        "--latency",
        "--duration",
        "2",
        "--transport",
        "shmem,zeromq-ipc",
        "--msg-size",
        "64,1048576",
    ];
    let busy_latency_args = [
        "bench",
        "--json",
        "--latency",
        "--busy-poll",
        "--duration",
        "2",
        "--transport",
        "shmem,zeromq-ipc",
        "--msg-size",
        "64,1048576",
    ];
    // CPU at FairMQ's reference point: 1 MiB x 2500 msg/s (2.5 GB/s).
    let paced_args = [
        "bench",
        "--json",
        "--duration",
        "3",
        "--transport",
        "shmem,zeromq-ipc",
        "--msg-size",
        "1048576",
        "--msg-rate",
        "2500",
    ];
    for (repetition, args) in [
        (0, &throughput_args[..]),
        (1, &throughput_args[..]),
        (2, &throughput_args[..]),
        (3, &latency_args[..]),
        (4, &busy_latency_args[..]),
        (5, &paced_args[..]),
    ] {
        if args == paced_args {
            floor = crate::side_by_side::wake_up_floor(
                Duration::from_secs(3),
                crate::side_by_side::wake_period(2500.0, Duration::from_millis(5)),
            );
        }
        eprintln!("xtask: ferromq {} (run {})", args.join(" "), repetition + 1);
        let Ok(output) = Command::new(&ferromq)
            .args(args)
            .current_dir(workspace)
            .output()
        else {
            return false;
        };
        if !output.status.success() {
            eprintln!(
                "xtask: ferromq bench failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            return false;
        }
        runs.extend(
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|line| serde_json::from_str::<BenchLine>(line).ok()),
        );
    }
    let criterion = criterion_results(&workspace.join("target/criterion"));
    let profile = profile_shmem(&ferromq, &report_dir);
    let date = utc_now("%Y-%m-%d %H:%M UTC");
    let Some(rpc_and_mcts) = crate::bench_rpc::run(cargo, workspace, &ferromq) else {
        return false;
    };
    let Some(metrics_cost) = crate::bench_metrics::measure(&ferromq, workspace, 3) else {
        return false;
    };
    let report = render_report(
        &runs,
        &criterion,
        profile.as_deref(),
        &machine(),
        &date,
        floor,
    ) + &rpc_and_mcts
        + &crate::bench_metrics::render(&metrics_cost);
    let written = std::fs::write(report_dir.join("report.md"), &report).is_ok()
        && plot_throughput(&runs, &report_dir.join("throughput.svg")).is_ok()
        && plot_latency(&runs, &report_dir.join("latency.svg")).is_ok();
    if written {
        println!("{report}");
        eprintln!(
            "xtask: report in {}",
            report_dir.join("report.md").display()
        );
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANNED_SAMPLE: &str =
        r#"{"sampling_mode":"Linear","iters":[10.0,20.0,30.0],"times":[1000.0,1800.0,3300.0]}"#;

    fn line(transport: &str, size: usize, rate: f64) -> BenchLine {
        BenchLine {
            transport: transport.into(),
            msg_size: size,
            msgs_per_s: rate,
            gb_per_s: rate * size as f64 / 1e9,
            sender_cpu: 99.0,
            receiver_cpu: 50.0,
            latency_us: None,
            msg_rate: 0.0,
        }
    }

    #[test]
    fn criterion_samples_become_per_iteration_spreads() {
        let spread = criterion_spread(CANNED_SAMPLE).unwrap();
        assert_eq!(
            spread,
            Spread {
                median: 100.0,
                min: 90.0,
                max: 110.0
            }
        );
        assert!(criterion_spread("{not json").is_none());
    }

    #[test]
    fn report_has_medians_ratios_and_targets() {
        let runs = vec![
            line("shmem", 64, 1.4e6),
            line("shmem", 64, 1.5e6),
            line("shmem", 64, 1.6e6),
            line("zeromq-ipc", 64, 2.0e6),
            BenchLine {
                latency_us: Some([50.0, 90.0, 150.0]),
                ..line("shmem", 64, 0.0)
            },
        ];
        let criterion = BTreeMap::from([(
            "throughput/shmem/64".to_owned(),
            criterion_spread(CANNED_SAMPLE).unwrap(),
        )]);
        let runs = [
            runs,
            vec![BenchLine {
                msg_rate: 2500.0,
                sender_cpu: 0.8,
                receiver_cpu: 0.5,
                ..line("shmem", 1048576, 2500.0)
            }],
        ]
        .concat();
        let report = render_report(
            &runs,
            &criterion,
            Some("  40.00%  ferromq  [.] describe"),
            "2 cores, test CPU",
            "2026-11-22",
            Some((0.7, 0.2)),
        );
        assert!(
            report.contains("| shmem | 64 B | 1500000 (1400000-1600000) |"),
            "{report}"
        );
        assert!(report.contains("| 64 B | 0.75x | - |"), "{report}");
        assert!(
            report.contains("| shmem 64 B msg/s | 1440000 | 3000000 | 1500000 | 50% |"),
            "{report}"
        );
        assert!(
            report.contains("| shmem | 64 B | 50.0 | 90.0 | 150.0 |"),
            "{report}"
        );
        assert!(
            report.contains("| throughput/shmem/64 | 0.100 µs | 0.090-0.110 µs |"),
            "{report}"
        );
        assert!(report.contains("Taken 2026-11-22 on 2 cores, test CPU"));
        assert!(
            report.contains("| shmem | 1 MiB | 2500 msg/s | 0.8 | 0.5 |"),
            "{report}"
        );
        assert!(
            report.contains("and the thread it wakes) | - | - | 0.7 | 0.2 |"),
            "{report}"
        );
        assert!(report.contains("40.00%  ferromq  [.] describe"), "{report}");
    }

    #[test]
    fn plots_are_svg() {
        let dir = std::env::temp_dir().join(format!("ferromq-xtask-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runs = vec![
            line("shmem", 64, 1.5e6),
            line("shmem", 1048576, 1.4e6),
            BenchLine {
                latency_us: Some([50.0, 90.0, 150.0]),
                ..line("shmem", 64, 0.0)
            },
        ];
        plot_throughput(&runs, &dir.join("t.svg")).unwrap();
        plot_latency(&runs, &dir.join("l.svg")).unwrap();
        let svg = std::fs::read_to_string(dir.join("t.svg")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("shmem"));
    }
}
