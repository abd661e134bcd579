//! ferromq's project automation, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `ci`: what `.ci/run` checks (after installing the system packages it needs): formatting,
//!   clippy with warnings denied, the test suite, each without and with `--features ofi,otel`,
//!   and the docs with rustdoc's warnings denied.
//! - `fmt`: formats the workspace.
//! - `lint`: clippy over every target with warnings denied, without and with `--features ofi,otel`,
//!   and rustdoc with warnings denied.
//! - `bench`: the criterion suites and `ferromq bench`, then `target/bench-report/report.md` and
//!   SVG plots.
//! - `soak --minutes N`: the default and pub/sub topologies under the release `ferromq run`,
//!   watching every device's RSS and the session's /dev/shm use, and every message's arrival.
//! - `launch-scale`: `ferromq run --launcher slurm` over two simulated Slurm nodes, topologies
//!   of 10 to 1000 trivial devices: time to RUNNING and memory per device;
//!   `target/launch-scale/report.md` (needs root, slurm-wlm and munge).
//! - `side-by-side --fairmq PREFIX`: C++ FairMQ's benchmark device pair and ferromq's, same
//!   options, interleaved; `target/side-by-side/report.md`.
//! - `mcts-scaling`: the `mcts-hex` example with one worker and with N, rounds interleaved,
//!   nothing started beside a search; each round's efficiency and their medians.
//!
//! The project's tidy rules (no sleeps in tests, module docs, unsafe confined to the crates that
//! need it) are `#[test]`s in this crate, so `cargo test --workspace` enforces them.
#![forbid(unsafe_code)]

mod bench;
mod bench_metrics;
mod bench_rpc;
mod launch_scale;
mod mcts_scaling;
mod side_by_side;
mod soak;
mod tidy;

use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ferromq project automation")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// fmt --check, clippy -D warnings and the whole test suite, without and with `--features
    /// ofi,otel`, and rustdoc (what CI runs; `.ci/run` installs the system packages, then calls
    /// this).
    Ci,
    /// Format the workspace.
    Fmt,
    /// Clippy over every target with warnings denied, without and with `--features ofi,otel`.
    Lint,
    /// Criterion suites and `ferromq bench`; writes target/bench-report/report.md and plots.
    Bench,
    /// Runs the default and the pub/sub topologies with the release `ferromq run` for N minutes
    /// each; fails if a device's RSS or /dev/shm use grows or a message is lost.
    Soak {
        /// Minutes per topology (at least 0.14: 8 samples, a second apart).
        #[arg(long, default_value_t = 10.0, value_parser = soak::minutes)]
        minutes: f64,
    },
    /// Time to RUNNING and memory per device of topologies of N trivial devices launched with
    /// `--launcher slurm` over two simulated Slurm nodes on this host (root, slurm-wlm, munge);
    /// writes target/launch-scale/report.md.
    LaunchScale {
        /// Topology sizes in devices, comma separated, each even, from 2 to the most instances
        /// a topology may have (ferromq-topology's MAX_INSTANCES).
        #[arg(long, value_delimiter = ',', default_values_t = [10usize, 100, 500, 1000])]
        devices: Vec<usize>,
        /// Runs per size.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
        rounds: u64,
    },
    /// C++ FairMQ's bsampler -> sink and ferromq's, same options, interleaved on this machine;
    /// writes target/side-by-side/report.md (medians, min-max, ferromq ÷ FairMQ pair by pair).
    SideBySide {
        /// FairMQ's install prefix (from ../shared/peers/build-fairmq.sh).
        #[arg(long)]
        fairmq: std::path::PathBuf,
        /// Rounds; each runs both pairs at every size.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
        rounds: u64,
        /// Transports, comma separated; each is measured at every size.
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [side_by_side::Transport::Shmem])]
        transports: Vec<side_by_side::Transport>,
        /// Message sizes in bytes, comma separated; at least 1, and with shmem below the
        /// devices' segment (FairMQ's default, 2 000 000 000 bytes).
        #[arg(long, value_delimiter = ',', default_values_t = [64usize, 1024, 65536])]
        sizes: Vec<usize>,
        /// Messages per run at every size (--max-iterations; both sides send one more),
        /// instead of --seconds.
        #[arg(long, conflicts_with = "seconds", value_parser = clap::value_parser!(u64).range(1..))]
        messages: Option<u64>,
        /// How long each run measures: every run of a size sends the messages ferromq's pair
        /// sent in this many seconds in a calibration run before the first round (FairMQ's
        /// take longer where it is slower); paced runs send --msg-rate times this.
        #[arg(long, default_value_t = 3.0, value_parser = run_seconds)]
        seconds: f64,
        /// Pace the samplers at this many messages per second (--msg-rate) and report the CPU
        /// each process used (% of a core) instead of the message rate, beside the machine's
        /// wake-up floor measured in each round (a thread that only sleeps and rings a
        /// doorbell as often as the samplers wake, and the thread it wakes); --seconds says
        /// for how long (e.g. 30). A pace at which a run's messages outlast the run's timeout
        /// is refused.
        #[arg(long, value_parser = positive_rate)]
        msg_rate: Option<f64>,
        /// With --msg-rate: ferromq's sampler lets paced messages leave together within this
        /// many ms (its --rate-burst-ms, 0 to 1000; FairMQ's limiter and ferromq's default
        /// use 5); the wake-up floor is measured at ferromq's period.
        #[arg(long, requires = "msg_rate", value_parser = clap::value_parser!(u64).range(0..=1000))]
        rate_burst_ms: Option<u64>,
    },
    /// The `mcts-hex` example's scaling efficiency: one worker against N, rounds interleaved,
    /// each run's JSON read after it ended (nothing starts beside a search); prints each round
    /// and the medians (min-max), and how many rounds reached --bound.
    MctsScaling {
        /// Rounds; each runs one search with one worker, then one with --workers.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100))]
        rounds: u64,
        /// Workers compared with one.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..=64))]
        workers: u64,
        /// Hex board size (--board; 2 to 19, as the game takes).
        #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u64).range(2..=19))]
        board: u64,
        /// Rollouts per search (default 40 000; with --seconds, no limit but the time).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        rollouts: Option<u64>,
        /// Seconds per search.
        #[arg(long, value_parser = run_seconds)]
        seconds: Option<f64>,
        /// Seconds of a search before the measured one (BENCHMARKS.md's warm-up).
        #[arg(long, value_parser = run_seconds)]
        warm_up: Option<f64>,
        /// Aggregation of the calls between workers.
        #[arg(long, default_value = "ovfl", value_parser = ["none", "trad", "ovfl"])]
        aggregate: String,
        /// Nodes deeper than this many moves below the root stay with their parent's owner
        /// (the example's --spread-depth; default: every node placed by its hash).
        #[arg(long)]
        spread_depth: Option<u32>,
        /// The efficiency a round counts as reaching (issue 15: 0.7 at 2 workers).
        #[arg(long, default_value_t = 0.7, value_parser = efficiency_bound)]
        bound: f64,
    },
}

/// An efficiency for `--bound`: above 0, at most 1.
fn efficiency_bound(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(bound) if bound > 0.0 && bound <= 1.0 => Ok(bound),
        _ => Err(format!(
            "{text:?} is not an efficiency: expected a number above 0 and at most 1"
        )),
    }
}

/// Seconds for `--seconds`: from 0.1 to 600.
fn run_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.1..=600.0).contains(&seconds) => Ok(seconds),
        _ => Err(format!(
            "{text:?} is not a run's length: expected seconds from 0.1 to 600"
        )),
    }
}

/// A message rate for `--msg-rate`: a finite number above zero.
fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a message rate: expected a number of messages per second above 0"
        )),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace");
    let mut env = Vec::new();
    let steps = match cli.task {
        Task::Bench => return exit_code(bench::run(&cargo, workspace)),
        Task::LaunchScale { devices, rounds } => {
            let options = launch_scale::Options {
                devices,
                rounds: rounds as usize,
            };
            return exit_code(launch_scale::run(&cargo, workspace, &options));
        }
        Task::Soak { minutes } => return exit_code(soak::run(&cargo, workspace, minutes)),
        Task::MctsScaling {
            rounds,
            workers,
            board,
            rollouts,
            seconds,
            warm_up,
            aggregate,
            spread_depth,
            bound,
        } => {
            let mut search_args = vec![
                "--board".to_owned(),
                board.to_string(),
                "--aggregate".to_owned(),
                aggregate,
            ];
            // A time given alone bounds the search (the example then sets no rollout limit);
            // otherwise 40 000 rollouts (the README's).
            let rollouts = rollouts.or(seconds.is_none().then_some(40_000));
            if let Some(rollouts) = rollouts {
                search_args.extend(["--rollouts".to_owned(), rollouts.to_string()]);
            }
            for (flag, value) in [("--seconds", seconds), ("--warm-up", warm_up)] {
                if let Some(value) = value {
                    search_args.extend([flag.to_owned(), value.to_string()]);
                }
            }
            if let Some(depth) = spread_depth {
                search_args.extend(["--spread-depth".to_owned(), depth.to_string()]);
            }
            let options = mcts_scaling::Options {
                rounds: rounds as usize,
                workers: workers as usize,
                search_args,
                bound,
            };
            return exit_code(mcts_scaling::run(&cargo, workspace, &options));
        }
        Task::SideBySide {
            fairmq,
            rounds,
            transports,
            sizes,
            messages,
            seconds,
            msg_rate,
            rate_burst_ms,
        } => {
            let options = side_by_side::Options {
                fairmq,
                rounds: rounds as usize,
                transports,
                sizes,
                length: messages.map_or(
                    side_by_side::RunLength::Seconds(seconds),
                    side_by_side::RunLength::Messages,
                ),
                msg_rate,
                rate_burst_ms,
            };
            return exit_code(side_by_side::run(&cargo, workspace, &options));
        }
        Task::Ci => {
            // How much room there is, for the next "No space left on device".
            let _ = Command::new("df").args(["-h", "."]).status();
            env = lean_ci_env();
            ci_steps()
        }
        Task::Fmt => vec![vec!["fmt", "--all"]],
        Task::Lint => lint_steps(),
    };
    for step in steps {
        if !run_cargo(&cargo, &step, &env) {
            eprintln!("xtask: `cargo {}` failed", step.join(" "));
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Clippy with warnings denied over every target, without and with the ofi transport; then
/// rustdoc with warnings denied (a public doc linking a private item, a link that resolves to
/// nothing), with every feature on so that the ofi crates' docs are read too.
fn lint_steps() -> Vec<Vec<&'static str>> {
    vec![
        vec![
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        vec![
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            "ofi,otel",
            "--",
            "-D",
            "warnings",
        ],
        vec![
            "doc",
            "--workspace",
            "--no-deps",
            "--features",
            "ofi,otel",
            "--config",
            "build.rustdocflags=[\"-D\", \"warnings\"]",
        ],
    ]
}

/// The one definition of CI: formatting, lints, then the README's test command without and
/// with `--features ofi,otel` (the ofi transport and its tests need libfabric-dev; otel is the
/// OTLP exporter, off by default).
fn ci_steps() -> Vec<Vec<&'static str>> {
    let mut steps = vec![vec!["fmt", "--all", "--", "--check"]];
    steps.extend(lint_steps());
    steps.push(vec!["test", "--workspace"]);
    steps.push(vec!["test", "--workspace", "--features", "ofi,otel"]);
    steps
}

/// The environment of CI's cargo runs. CI builds every test binary twice (without and with
/// `--features ofi,otel`) in a fresh clone, on a disk it shares with the session that submitted:
/// with incremental state and full debug info that came to tens of GiB, and a run failed with
/// "No space left on device". CI gains nothing from incremental state (one build per clone), and
/// line tables keep the file:line of a panic's backtrace. A variable set by the caller wins.
fn lean_ci_env() -> Vec<(&'static str, &'static str)> {
    [
        ("CARGO_INCREMENTAL", "0"),
        ("CARGO_PROFILE_DEV_DEBUG", "line-tables-only"),
    ]
    .into_iter()
    .filter(|(key, _)| std::env::var_os(key).is_none())
    .collect()
}

fn exit_code(success: bool) -> ExitCode {
    if success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Builds the release `ferromq` binary (with `features`) in `workspace`; its path, or `None`
/// when the build failed (cargo said why).
pub(crate) fn build_release_ferromq(
    cargo: &str,
    workspace: &std::path::Path,
    features: &[&str],
) -> Option<std::path::PathBuf> {
    let mut args = vec!["build", "--release", "-p", "ferromq-cli"];
    if !features.is_empty() {
        args.push("--features");
        args.extend(features);
    }
    eprintln!("xtask: cargo {}", args.join(" "));
    let built = Command::new(cargo)
        .args(&args)
        .current_dir(workspace)
        .status()
        .is_ok_and(|status| status.success());
    if !built {
        eprintln!("xtask: building the release ferromq failed");
    }
    built.then(|| workspace.join("target/release/ferromq"))
}

fn run_cargo(cargo: &str, args: &[&str], env: &[(&str, &str)]) -> bool {
    eprintln!("xtask: cargo {}", args.join(" "));
    let started = std::time::Instant::now();
    let success = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .is_ok_and(|status| status.success());
    eprintln!(
        "xtask: cargo {} took {:.0} s",
        args.join(" "),
        started.elapsed().as_secs_f64()
    );
    success
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_rate_must_be_a_number_above_zero() {
        assert_eq!(positive_rate("2500"), Ok(2500.0));
        for bad in ["0", "-1", "NaN", "inf", "fast"] {
            let error = positive_rate(bad).expect_err(bad);
            assert!(error.contains(bad), "{error}");
        }
    }

    /// The checks of `soak --minutes` are the parser's: a bad value is refused as typed, with
    /// the flag, before anything is built.
    #[test]
    fn soak_minutes_are_refused_as_typed() {
        let refused = |minutes: &str| {
            Cli::try_parse_from(["xtask", "soak", "--minutes", minutes])
                .err()
                .map(|error| error.to_string())
        };
        for bad in ["1e308", "0.0001"] {
            let error = refused(bad).unwrap_or_else(|| panic!("--minutes {bad} was taken"));
            assert!(
                error.contains("--minutes") && error.contains(&format!("{bad:?}")),
                "{error}"
            );
        }
        assert_eq!(refused("10"), None);
    }

    /// `.ci/run` only installs system packages and calls `cargo xtask ci`: CI has one
    /// definition, here.
    #[test]
    fn ci_script_calls_xtask_ci_and_ci_covers_both_feature_sets() {
        let script = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/run"),
        )
        .expect("read .ci/run");
        assert!(
            script.contains("cargo xtask ci"),
            ".ci/run must call `cargo xtask ci`"
        );
        for forbidden in ["cargo test", "--workspace", "-D warnings", "--check"] {
            assert!(
                !script.contains(forbidden),
                ".ci/run has `{forbidden}`: checks belong in `cargo xtask ci`"
            );
        }
        let steps: Vec<String> = ci_steps().iter().map(|step| step.join(" ")).collect();
        for expected in [
            "fmt --all -- --check",
            "clippy --workspace --all-targets -- -D warnings",
            "clippy --workspace --all-targets --features ofi,otel -- -D warnings",
            "doc --workspace --no-deps --features ofi,otel --config build.rustdocflags=[\"-D\", \"warnings\"]",
            "test --workspace",
            "test --workspace --features ofi,otel",
        ] {
            assert!(
                steps.iter().any(|step| step == expected),
                "ci lacks `cargo {expected}`: {steps:?}"
            );
        }
    }
}
