//! `ferromq-fuzz`: runs the fuzz targets of `ferromq_fuzz` (see `docs/fuzzing.md`).
//!
//! The process you start is a supervisor: the inputs run in a worker process (this binary with
//! `--worker`) under an address-space limit. A panic, a failed property or a hang is found by
//! the worker itself; a crash that kills the worker (an abort, a stack overflow, an allocation
//! beyond the limit) is found by the supervisor, which runs the inputs since the worker's last
//! checkpoint again, writing each to disk before running it, to capture the one that kills,
//! then goes on after it.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ferromq_fuzz::targets::{self, Target};
use ferromq_fuzz::{EXIT_HANG, Progress, RunOptions};

/// Fuzz ferromq's decoders of hostile input (stable toolchain, no coverage feedback).
#[derive(Parser, Debug)]
#[command(name = "ferromq-fuzz")]
struct Cli {
    /// A target (see --list), or `all`.
    target: Option<String>,
    /// Inputs per target.
    #[arg(long, default_value_t = 100_000)]
    inputs: u64,
    /// Seed of the run; with an input's index it decides the input.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Index of the first input.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// An input running longer than this is a hang (exit status 3).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    hang_ms: u64,
    /// Where inputs that panicked, failed a property, crashed or hung are saved.
    #[arg(long, default_value = "target/fuzz-findings", value_name = "DIR")]
    crash_dir: PathBuf,
    /// The worker's address-space limit; a bigger allocation fails and is reported as a crash.
    #[arg(long, default_value_t = 4096, value_name = "MIB")]
    memory_limit_mib: u64,
    /// List the targets and exit.
    #[arg(long)]
    list: bool,
    /// Run this file's bytes through the target once and say what happens.
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// Write input INDEX of --seed to stdout.
    #[arg(long, value_name = "INDEX")]
    print_input: Option<u64>,
    /// Run the inputs in this process (what the supervisor starts).
    #[arg(long, hide = true)]
    worker: bool,
    /// With --worker: write each input to FILE before running it.
    #[arg(long, hide = true, value_name = "FILE")]
    trace: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("ferromq-fuzz: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    if cli.list {
        for target in targets::all() {
            println!("{:16} {}", target.name, target.about);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(name) = cli.target.as_deref() else {
        return Err("name a target or `all` (--list shows them)".to_owned());
    };
    let chosen: Vec<Target> = if name == "all" {
        targets::all()
    } else {
        vec![targets::by_name(name).map_err(|error| error.to_string())?]
    };
    if let Some(path) = &cli.replay {
        let input = std::fs::read(path).map_err(|error| format!("{}: {error}", path.display()))?;
        limit_address_space(cli.memory_limit_mib)?;
        return Ok(replay(&chosen, &input));
    }
    if let Some(index) = cli.print_input {
        let [target] = chosen.as_slice() else {
            return Err("--print-input needs one target".to_owned());
        };
        let seeds = target.seeds().map_err(|error| error.to_string())?;
        let input = ferromq_fuzz::input(target, &seeds, cli.seed, index);
        use std::io::Write;
        std::io::stdout()
            .write_all(&input)
            .map_err(|error| format!("stdout: {error}"))?;
        return Ok(ExitCode::SUCCESS);
    }
    if cli.worker {
        let [target] = chosen.as_slice() else {
            return Err("--worker needs one target".to_owned());
        };
        return worker(cli, target);
    }
    let mut worst = 0;
    let mut outcomes = Vec::new();
    for target in &chosen {
        let outcome = supervise(cli, target)?;
        println!("{outcome}");
        worst = worst.max(outcome.exit_status());
        outcomes.push(outcome);
        if worst == EXIT_HANG {
            break;
        }
    }
    if outcomes.len() > 1 {
        println!("--- all targets, seed {}:", cli.seed);
        for outcome in &outcomes {
            println!("{outcome}");
        }
    }
    Ok(ExitCode::from(worst as u8))
}

fn replay(chosen: &[Target], input: &[u8]) -> ExitCode {
    let mut failed = false;
    for target in chosen {
        match ferromq_fuzz::check_one(target, input) {
            Ok(true) => println!("{}: ok, accepted", target.name),
            Ok(false) => println!("{}: ok, refused with an error", target.name),
            Err(problem) => {
                failed = true;
                println!("{}: FAILED: {problem}", target.name);
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs inputs in this process, reporting progress on stdout for the supervisor.
fn worker(cli: &Cli, target: &Target) -> Result<ExitCode, String> {
    limit_address_space(cli.memory_limit_mib)?;
    let traced = cli.trace.is_some();
    let options = RunOptions {
        seed: cli.seed,
        first_input: cli.first,
        n_inputs: cli.inputs,
        hang_after: Duration::from_millis(cli.hang_ms),
        crash_dir: Some(cli.crash_dir.clone()),
        trace: cli.trace.clone(),
        progress: Some(Box::new(|progress: &Progress| {
            println!(
                "progress {} {} {} {}",
                progress.next_input,
                progress.n_accepted,
                progress.n_panics,
                progress.n_property_failures
            );
        })),
        progress_every: if traced { 1 } else { 16_384 },
        print_findings: true,
    };
    let report = ferromq_fuzz::run(target, &options).map_err(|error| error.to_string())?;
    println!(
        "progress {} {} {} {}",
        cli.first + report.n_inputs,
        report.n_accepted,
        report.n_panics,
        report.n_property_failures
    );
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Caps the address space (a runaway allocation fails at once) and turns core dumps off (a
/// worker that aborts on a found input must not write gigabytes of core files).
fn limit_address_space(limit_mib: u64) -> Result<(), String> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) =
        getrlimit(Resource::RLIMIT_AS).map_err(|error| format!("getrlimit: {error}"))?;
    let soft = limit_mib.saturating_mul(1 << 20).min(hard);
    setrlimit(Resource::RLIMIT_AS, soft, hard)
        .map_err(|error| format!("--memory-limit-mib {limit_mib}: {error}"))?;
    let (_, core_hard) =
        getrlimit(Resource::RLIMIT_CORE).map_err(|error| format!("getrlimit: {error}"))?;
    setrlimit(Resource::RLIMIT_CORE, 0, core_hard)
        .map_err(|error| format!("turning core dumps off: {error}"))
}

/// The totals of one target.
struct Outcome {
    target: &'static str,
    seed: u64,
    first: u64,
    n_inputs: u64,
    elapsed: Duration,
    n_accepted: u64,
    n_panics: u64,
    n_property_failures: u64,
    crashes: Vec<(u64, PathBuf)>,
    hung: bool,
}

impl Outcome {
    fn exit_status(&self) -> i32 {
        if self.hung {
            EXIT_HANG
        } else if self.n_panics + self.n_property_failures > 0 || !self.crashes.is_empty() {
            1
        } else {
            0
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:16} {} inputs (#{}.., seed {}) in {:.1} s = {:.0} inputs/s, {:.1}% accepted: {} panics, {} property failures, {} crashes, {} hangs",
            self.target,
            self.n_inputs,
            self.first,
            self.seed,
            self.elapsed.as_secs_f64(),
            self.n_inputs as f64 / self.elapsed.as_secs_f64().max(1e-9),
            100.0 * self.n_accepted as f64 / self.n_inputs.max(1) as f64,
            self.n_panics,
            self.n_property_failures,
            self.crashes.len(),
            u8::from(self.hung),
        )?;
        for (index, path) in &self.crashes {
            write!(
                f,
                "\n  crash at input #{index}, saved to {}",
                path.display()
            )?;
        }
        Ok(())
    }
}

/// What one worker process said before it ended.
struct Segment {
    last: Progress,
    status: std::process::ExitStatus,
}

fn spawn_worker(
    cli: &Cli,
    target: &Target,
    first: u64,
    n_inputs: u64,
    trace: Option<&Path>,
) -> Result<Segment, String> {
    let exe = std::env::current_exe().map_err(|error| format!("current_exe: {error}"))?;
    let mut command = Command::new(exe);
    command
        .arg(target.name)
        .arg("--worker")
        .args(["--seed", &cli.seed.to_string()])
        .args(["--first", &first.to_string()])
        .args(["--inputs", &n_inputs.to_string()])
        .args(["--hang-ms", &cli.hang_ms.to_string()])
        .args(["--memory-limit-mib", &cli.memory_limit_mib.to_string()])
        .arg("--crash-dir")
        .arg(&cli.crash_dir)
        .stdout(Stdio::piped());
    if let Some(trace) = trace {
        command.arg("--trace").arg(trace);
    }
    let mut child = command
        .spawn()
        .map_err(|error| format!("starting a worker: {error}"))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut last = Progress {
        next_input: first,
        n_accepted: 0,
        n_panics: 0,
        n_property_failures: 0,
    };
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let numbers: Vec<u64> = line
            .strip_prefix("progress ")
            .map(|rest| {
                rest.split(' ')
                    .filter_map(|word| word.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        if let [next_input, n_accepted, n_panics, n_property_failures] = numbers[..] {
            last = Progress {
                next_input,
                n_accepted,
                n_panics,
                n_property_failures,
            };
        }
    }
    let status = child
        .wait()
        .map_err(|error| format!("waiting for the worker: {error}"))?;
    Ok(Segment { last, status })
}

fn supervise(cli: &Cli, target: &Target) -> Result<Outcome, String> {
    let started = Instant::now();
    let end = cli.first.saturating_add(cli.inputs);
    let mut outcome = Outcome {
        target: target.name,
        seed: cli.seed,
        first: cli.first,
        n_inputs: 0,
        elapsed: Duration::ZERO,
        n_accepted: 0,
        n_panics: 0,
        n_property_failures: 0,
        crashes: Vec::new(),
        hung: false,
    };
    std::fs::create_dir_all(&cli.crash_dir)
        .map_err(|error| format!("{}: {error}", cli.crash_dir.display()))?;
    let trace_path =
        cli.crash_dir
            .join(format!("{}-trace-{}.bin", target.name, std::process::id()));
    let mut next = cli.first;
    let mut tracing = false;
    while next < end {
        let segment = spawn_worker(
            cli,
            target,
            next,
            end - next,
            tracing.then_some(trace_path.as_path()),
        )?;
        outcome.n_accepted += segment.last.n_accepted;
        outcome.n_panics += segment.last.n_panics;
        outcome.n_property_failures += segment.last.n_property_failures;
        let code = segment.status.code();
        if matches!(code, Some(0 | 1)) {
            outcome.n_inputs += end - next;
            break;
        }
        if code == Some(2) {
            return Err(format!("{}: the worker failed (see above)", target.name));
        }
        if code == Some(EXIT_HANG) {
            outcome.n_inputs += segment.last.next_input - next;
            outcome.hung = true;
            break;
        }
        // The worker died. Traced, the input that killed it is on disk; otherwise run again
        // from its last checkpoint, traced.
        outcome.n_inputs += segment.last.next_input - next;
        if !tracing {
            eprintln!(
                "{}: the worker died ({}) after input #{}; replaying from there to capture the input",
                target.name, segment.status, segment.last.next_input
            );
            next = segment.last.next_input;
            tracing = true;
            continue;
        }
        let index: u64 = std::fs::read_to_string(trace_path.with_extension("index"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(segment.last.next_input);
        let saved = cli.crash_dir.join(format!(
            "{}-crash-seed{}-{index}.bin",
            target.name, cli.seed
        ));
        std::fs::rename(&trace_path, &saved)
            .map_err(|error| format!("{}: {error}", saved.display()))?;
        eprintln!(
            "{}: CRASH: input #{index} killed the worker ({}); saved to {}",
            target.name,
            segment.status,
            saved.display()
        );
        outcome.n_inputs += 1;
        outcome.crashes.push((index, saved));
        next = index + 1;
        tracing = false;
    }
    let _ = std::fs::remove_file(&trace_path);
    let _ = std::fs::remove_file(trace_path.with_extension("index"));
    outcome.elapsed = started.elapsed();
    Ok(outcome)
}
