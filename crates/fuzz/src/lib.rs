//! Fuzzing ferromq's decoders of hostile input, on the stable toolchain.
//!
//! Every decoder fed from outside the process has a [`Target`]: shmem descriptor frames, ofi
//! side-channel frames (feature `ofi`), remote-invocation frames, the control protocol's JSON in
//! both directions, `--mq-config` JSON, `--channel-config` lists, TOML topologies and channel
//! addresses. [`run`] feeds a target inputs made by [`mutate::generate`] from valid seeds, each under
//! [`std::panic::catch_unwind`], with a watchdog thread that declares a hang when one input runs
//! longer than [`RunOptions::hang_after`]. Input `i` of seed `s` is a pure function of `(s, i)`
//! ([`input`]), so every finding is reproducible from two numbers, and the `ferromq-fuzz` binary
//! can replay the inputs around a crash that killed its worker process (an abort, a stack
//! overflow, an allocation beyond its memory limit).
//!
//! No coverage feedback: stable Rust has no sanitizer coverage, so the mutator leans on seeds
//! made by the real encoders and on structure-aware mutations instead. How to run it, and the
//! long runs done so far, are in `docs/fuzzing.md`.
//!
//! ```
//! let target = ferromq_fuzz::targets::by_name("channel-config").unwrap();
//! let options = ferromq_fuzz::RunOptions { n_inputs: 200, ..ferromq_fuzz::RunOptions::default() };
//! let report = ferromq_fuzz::run(&target, &options).unwrap();
//! assert_eq!(report.n_inputs, 200);
//! assert!(report.is_clean(), "{report}");
//! ```
//!
//! Sits beside the product crates, above all of them; nothing depends on it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod mutate;
pub mod rng;
pub mod targets;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use crate::targets::Target;

/// Exit status of a process that found a hang.
pub const EXIT_HANG: i32 = 3;

/// What can go wrong setting up a run (findings are not errors: they are in the [`Report`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FuzzError {
    /// A seed file or directory cannot be read.
    #[error("seed {}: {source}", path.display())]
    Seeds {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No target has this name.
    #[error("unknown target {name:?} (targets: {known})")]
    UnknownTarget {
        /// The name given.
        name: String,
        /// The targets there are.
        known: String,
    },
    /// A finding or trace file cannot be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// See [`RunOptions::progress`].
pub type ProgressCallback = Box<dyn Fn(&Progress)>;

/// How to run a target.
pub struct RunOptions {
    /// Seed of the run: with the index, it decides every input.
    pub seed: u64,
    /// Index of the first input (a run can continue where another stopped).
    pub first_input: u64,
    /// How many inputs.
    pub n_inputs: u64,
    /// An input that runs longer than this is a hang: the watchdog saves it, says so on stderr
    /// and ends the process with [`EXIT_HANG`] (a hung thread cannot be stopped otherwise).
    pub hang_after: Duration,
    /// Where inputs that panicked, failed a property or hung are saved.
    pub crash_dir: Option<PathBuf>,
    /// Write every input to this file (and its index to `<file>.index`) before running it, so
    /// that an input that kills the process is on disk afterwards. Slow; for replays.
    pub trace: Option<PathBuf>,
    /// Called every [`RunOptions::progress_every`] inputs.
    pub progress: Option<ProgressCallback>,
    /// See [`RunOptions::progress`].
    pub progress_every: u64,
    /// Print each distinct finding on stderr as soon as it is found (a later crash of the
    /// process would lose the report).
    pub print_findings: bool,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            seed: 1,
            first_input: 0,
            n_inputs: 10_000,
            hang_after: Duration::from_secs(1),
            crash_dir: None,
            trace: None,
            progress: None,
            progress_every: 65_536,
            print_findings: false,
        }
    }
}

/// Where a run is, for [`RunOptions::progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Index of the next input (every input before it has run).
    pub next_input: u64,
    /// Inputs the decoder accepted so far.
    pub n_accepted: u64,
    /// Inputs that panicked so far.
    pub n_panics: u64,
    /// Inputs that failed a property so far.
    pub n_property_failures: u64,
}

/// What a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingKind {
    /// The decoder panicked.
    Panic,
    /// A property (round trip, consistency) failed.
    Property,
}

/// One distinct problem (the first input that showed it).
#[derive(Debug, Clone)]
pub struct Finding {
    /// Panic or property.
    pub kind: FindingKind,
    /// Index of the input.
    pub index: u64,
    /// The panic message with its location, or the property that failed.
    pub message: String,
    /// The input.
    pub input: Vec<u8>,
    /// How many inputs showed the same problem.
    pub n_inputs: u64,
    /// Where the input was saved.
    pub saved_to: Option<PathBuf>,
}

/// The outcome of [`run`].
#[derive(Debug, Clone)]
pub struct Report {
    /// The target.
    pub target: &'static str,
    /// The seed.
    pub seed: u64,
    /// Index of the first input.
    pub first_input: u64,
    /// Inputs run.
    pub n_inputs: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Inputs the decoder accepted (the others it refused with an error, as it should).
    pub n_accepted: u64,
    /// Inputs that panicked.
    pub n_panics: u64,
    /// Inputs that failed a property.
    pub n_property_failures: u64,
    /// Distinct problems, in the order found.
    pub findings: Vec<Finding>,
}

impl Report {
    /// Inputs per second of wall time.
    pub fn inputs_per_second(&self) -> f64 {
        self.n_inputs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// No panic and no failed property.
    pub fn is_clean(&self) -> bool {
        self.n_panics == 0 && self.n_property_failures == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} inputs (#{}..#{}, seed {}) in {:.1} s, {:.0} inputs/s, {} accepted, {} panics, {} property failures",
            self.target,
            self.n_inputs,
            self.first_input,
            self.first_input + self.n_inputs,
            self.seed,
            self.elapsed.as_secs_f64(),
            self.inputs_per_second(),
            self.n_accepted,
            self.n_panics,
            self.n_property_failures,
        )?;
        for finding in &self.findings {
            write!(f, "\n  {finding} ({} inputs alike)", finding.n_inputs)?;
        }
        Ok(())
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} at input #{}{}: {}\n    input: {}",
            self.kind,
            self.index,
            self.saved_to
                .as_ref()
                .map(|path| format!(", saved to {}", path.display()))
                .unwrap_or_default(),
            self.message,
            escape(&self.input, 300),
        )
    }
}

/// `input` as printable text, cut after `max_len` bytes.
pub fn escape(input: &[u8], max_len: usize) -> String {
    let shown = &input[..input.len().min(max_len)];
    let mut text: String = shown.escape_ascii().to_string();
    if input.len() > max_len {
        text.push_str(&format!("... ({} bytes)", input.len()));
    }
    text
}

/// Input `index` of the run with `seed` (the same every time).
pub fn input(target: &Target, seeds: &[Vec<u8>], seed: u64, index: u64) -> Vec<u8> {
    let mut rng = rng::Rng::for_input(seed, index);
    mutate::generate(&mut rng, seeds, target.shape, target.dictionary)
}

thread_local! {
    /// Set while this thread runs fuzz inputs: its panics are recorded, not printed.
    static LAST_PANIC: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that records the panics of fuzzing threads silently and leaves
/// every other thread's panics to the previous hook.
fn install_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let recorded = LAST_PANIC.with(|last| {
                let mut last = last.borrow_mut();
                match last.as_mut() {
                    Some(slot) => {
                        *slot = Some(info.to_string());
                        true
                    }
                    None => false,
                }
            });
            if !recorded {
                previous(info);
            }
        }));
    });
}

/// What the watchdog watches.
struct Watch {
    origin: Instant,
    /// Nanoseconds after `origin` when the current input started; `IDLE` between inputs.
    input_started: AtomicU64,
    index: AtomicU64,
    finished: AtomicBool,
}

const IDLE: u64 = u64::MAX;

fn save(dir: &Path, name: &str, input: &[u8]) -> Result<PathBuf, FuzzError> {
    let write_error = |path: &Path, source| FuzzError::Write {
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|source| write_error(dir, source))?;
    let path = dir.join(name);
    std::fs::write(&path, input).map_err(|source| write_error(&path, source))?;
    Ok(path)
}

fn spawn_watchdog(
    target: Target,
    seeds: Arc<Vec<Vec<u8>>>,
    seed: u64,
    hang_after: Duration,
    crash_dir: Option<PathBuf>,
    watch: Arc<Watch>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let tick = (hang_after / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
        while !watch.finished.load(Ordering::Acquire) {
            std::thread::sleep(tick);
            let index = watch.index.load(Ordering::Acquire);
            let started = watch.input_started.load(Ordering::Acquire);
            if started == IDLE || watch.index.load(Ordering::Acquire) != index {
                continue;
            }
            let running_for = watch
                .origin
                .elapsed()
                .saturating_sub(Duration::from_nanos(started));
            if running_for < hang_after {
                continue;
            }
            let hung = input(&target, &seeds, seed, index);
            let saved = crash_dir.as_deref().map(|dir| {
                save(
                    dir,
                    &format!("{}-hang-seed{seed}-{index}.bin", target.name),
                    &hung,
                )
            });
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(
                stderr,
                "{}: HANG: input #{index} (seed {seed}) has run for {:.1} s (limit {:.1} s)\n  input: {}",
                target.name,
                running_for.as_secs_f64(),
                hang_after.as_secs_f64(),
                escape(&hung, 300)
            );
            match saved {
                Some(Ok(path)) => {
                    let _ = writeln!(stderr, "  saved to {}", path.display());
                }
                Some(Err(error)) => {
                    let _ = writeln!(stderr, "  not saved: {error}");
                }
                None => {}
            }
            std::process::exit(EXIT_HANG);
        }
    })
}

/// Runs `options.n_inputs` inputs through `target`.
///
/// A panic or a failed property is recorded in the [`Report`] (and the input saved to
/// `options.crash_dir`); the run goes on. A hang ends the process (see
/// [`RunOptions::hang_after`]).
///
/// # Errors
/// [`FuzzError::Seeds`] when the target's seeds cannot be read; [`FuzzError::Write`] when a
/// finding or the trace cannot be written.
pub fn run(target: &Target, options: &RunOptions) -> Result<Report, FuzzError> {
    let seeds = Arc::new(target.seeds()?);
    run_with_seeds(target, &seeds, options)
}

fn run_with_seeds(
    target: &Target,
    seeds: &Arc<Vec<Vec<u8>>>,
    options: &RunOptions,
) -> Result<Report, FuzzError> {
    install_panic_hook();
    let watch = Arc::new(Watch {
        origin: Instant::now(),
        input_started: AtomicU64::new(IDLE),
        index: AtomicU64::new(options.first_input),
        finished: AtomicBool::new(false),
    });
    let watchdog = spawn_watchdog(
        *target,
        Arc::clone(seeds),
        options.seed,
        options.hang_after,
        options.crash_dir.clone(),
        Arc::clone(&watch),
    );
    let mut report = Report {
        target: target.name,
        seed: options.seed,
        first_input: options.first_input,
        n_inputs: 0,
        elapsed: Duration::ZERO,
        n_accepted: 0,
        n_panics: 0,
        n_property_failures: 0,
        findings: Vec::new(),
    };
    // Findings by panic location or property message, so that one bug is reported once.
    let mut finding_by_key: BTreeMap<String, usize> = BTreeMap::new();
    let started = Instant::now();
    let result = (|| {
        for index in options.first_input..options.first_input.saturating_add(options.n_inputs) {
            let input = input(target, seeds, options.seed, index);
            if let Some(trace) = &options.trace {
                write_trace(trace, index, &input)?;
            }
            watch.index.store(index, Ordering::Release);
            watch
                .input_started
                .store(watch.origin.elapsed().as_nanos() as u64, Ordering::Release);
            LAST_PANIC.with(|last| *last.borrow_mut() = Some(None));
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| target.check(&input)));
            let panic_message = LAST_PANIC.with(|last| last.borrow_mut().take().flatten());
            watch.input_started.store(IDLE, Ordering::Release);
            report.n_inputs += 1;
            let problem = match outcome {
                Ok(Ok(accepted)) => {
                    report.n_accepted += u64::from(accepted);
                    None
                }
                Ok(Err(message)) => {
                    report.n_property_failures += 1;
                    Some((FindingKind::Property, message.clone(), message))
                }
                Err(_) => {
                    report.n_panics += 1;
                    let message = panic_message.unwrap_or_else(|| "panicked".to_owned());
                    // The location (first line) identifies the bug; the message varies.
                    let key = message.lines().next().unwrap_or_default().to_owned();
                    Some((FindingKind::Panic, key, message))
                }
            };
            if let Some((kind, key, message)) = problem {
                if let Some(&finding_idx) = finding_by_key.get(&key) {
                    report.findings[finding_idx].n_inputs += 1;
                } else {
                    let kind_name = match kind {
                        FindingKind::Panic => "panic",
                        FindingKind::Property => "property",
                    };
                    let saved_to = match &options.crash_dir {
                        Some(dir) => Some(save(
                            dir,
                            &format!(
                                "{}-{kind_name}-seed{}-{index}.bin",
                                target.name, options.seed
                            ),
                            &input,
                        )?),
                        None => None,
                    };
                    let finding = Finding {
                        kind,
                        index,
                        message,
                        input,
                        n_inputs: 1,
                        saved_to,
                    };
                    if options.print_findings {
                        eprintln!("{}: {finding}", target.name);
                    }
                    finding_by_key.insert(key, report.findings.len());
                    report.findings.push(finding);
                }
            }
            let next = index + 1;
            if let Some(progress) = &options.progress
                && (next - options.first_input).is_multiple_of(options.progress_every.max(1))
            {
                progress(&Progress {
                    next_input: next,
                    n_accepted: report.n_accepted,
                    n_panics: report.n_panics,
                    n_property_failures: report.n_property_failures,
                });
            }
        }
        Ok::<(), FuzzError>(())
    })();
    report.elapsed = started.elapsed();
    watch.finished.store(true, Ordering::Release);
    let _ = watchdog.join();
    result?;
    Ok(report)
}

fn write_trace(trace: &Path, index: u64, input: &[u8]) -> Result<(), FuzzError> {
    let write_error = |path: &Path, source| FuzzError::Write {
        path: path.to_owned(),
        source,
    };
    let index_path = trace.with_extension("index");
    std::fs::write(&index_path, index.to_string())
        .map_err(|source| write_error(&index_path, source))?;
    std::fs::write(trace, input).map_err(|source| write_error(trace, source))
}

/// Runs one input through `target` (a replay): whether the decoder accepted it.
///
/// # Errors
/// The property that failed, or the panic message.
pub fn check_one(target: &Target, input: &[u8]) -> Result<bool, String> {
    install_panic_hook();
    LAST_PANIC.with(|last| *last.borrow_mut() = Some(None));
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| target.check(input)));
    let panic_message = LAST_PANIC.with(|last| last.borrow_mut().take().flatten());
    match outcome {
        Ok(result) => result,
        Err(_) => Err(panic_message.unwrap_or_else(|| "panicked".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_and_failed_properties_are_caught_recorded_once_and_saved() {
        let target = targets::by_name("selftest-panic").unwrap();
        let crash_dir =
            std::env::temp_dir().join(format!("ferromq-fuzz-unit-{}", std::process::id()));
        let options = RunOptions {
            n_inputs: 2000,
            crash_dir: Some(crash_dir.clone()),
            ..RunOptions::default()
        };
        let report = run(&target, &options).unwrap();
        let saved: Vec<PathBuf> = report
            .findings
            .iter()
            .filter_map(|finding| finding.saved_to.clone())
            .collect();
        let saved_inputs: Vec<Vec<u8>> = saved
            .iter()
            .map(|path| std::fs::read(path).unwrap())
            .collect();
        let _ = std::fs::remove_dir_all(&crash_dir);
        assert_eq!(report.n_inputs, 2000);
        assert!(
            report.n_panics > 0 && report.n_property_failures > 0,
            "{report}"
        );
        assert!(!report.is_clean());
        let kinds: Vec<FindingKind> = report.findings.iter().map(|finding| finding.kind).collect();
        assert_eq!(kinds.len(), 2, "one finding per bug: {report}");
        assert!(kinds.contains(&FindingKind::Panic) && kinds.contains(&FindingKind::Property));
        let panic = report
            .findings
            .iter()
            .find(|finding| finding.kind == FindingKind::Panic)
            .unwrap();
        assert!(
            panic.message.contains("selftest panic"),
            "{}",
            panic.message
        );
        assert!(panic.message.contains("lib.rs") || panic.message.contains("targets.rs"));
        assert_eq!(panic.n_inputs, report.n_panics);
        assert_eq!(
            panic.input,
            input(&target, &target.seeds().unwrap(), 1, panic.index)
        );
        assert_eq!(saved.len(), 2);
        for (finding, saved_input) in report.findings.iter().zip(&saved_inputs) {
            assert_eq!(&finding.input, saved_input);
        }
        assert!(
            check_one(&target, &panic.input)
                .unwrap_err()
                .contains("selftest panic")
        );
        assert_eq!(check_one(&target, b"fine"), Ok(true));
    }
}
