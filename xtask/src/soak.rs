//! `cargo xtask soak --minutes N`: long runs that must not grow and must not lose.
//!
//! For each of the default topology (push/pull, lossless) and the pub/sub topology, it builds the
//! release `ferromq`, starts `ferromq run FILE --duration N*60 --session soak<pid><name>` with its
//! output in `target/soak/<name>.log`, and every few seconds samples:
//!
//! - each device process (the launcher's children, named by their `--id`): `VmRSS` and
//!   `RssShmem` from `/proc/<pid>/status`. The criterion uses the private part,
//!   `VmRSS - RssShmem` (heap, stacks, the binary): shared memory a device maps is counted once,
//!   below, not once per process that touched it.
//! - the session's shared memory: the files `/dev/shm/ferromq_*` of the run's session, their
//!   allocated bytes (pages in RAM, what `df /dev/shm` counts, not the sparse file size) and
//!   their count; and, from `ferromq shm list --session S`, the bytes in live blocks (`used`)
//!   and the live messages, which tell leaked blocks from an allocator that touches new pages.
//!
//! # Growth criterion
//! The first quarter of the samples is warm-up and ignored. Of the rest, the median of the last
//! third must not exceed the median of the first third by more than 10% plus a small absolute
//! slack (8 MiB per process, 16 MiB of shared memory pages, 64 MiB of live blocks: a send queue
//! of 1000 messages of 64 KiB may fill meanwhile, no extra file). Medians make one spike
//! harmless; a leak of a few MiB per minute over ten minutes is caught.
//!
//! The pages are judged beyond the live blocks' highest use so far (allocated bytes less the
//! largest `used` sampled until then): a page once touched stays in RAM, so the pages follow the
//! deepest the send queues have been, and a queue whose depth wanders within its `sndBufSize`
//! reaches a new depth now and then. Judged raw, that failed a 4-minute soak of the default
//! topology (pages 15.7 -> 39.9 MiB while the live blocks went 12.6 -> 24.1 MiB, live messages
//! 195 -> 378 of the 2000 its two hops may hold). An allocator that touches new pages while the
//! live blocks stay where they were still shows as growth.
//!
//! # Loss
//! From the run's output (see [`Counts`]): the messages each sampler said it sent, each sink's
//! summary of what it received, launcher lines that give sent and received counts of a link, and
//! any line reporting messages lost or not delivered. In a lossless topology (push/pull), the
//! sources' total must equal the sinks' total and no line may report a loss; in pub/sub, a
//! subscriber may miss messages (a slow subscriber is dropped for, as in ZeroMQ), so each
//! subscriber's shortfall is reported as drops, not as a failure. The run must also exit 0 and
//! leave no shared memory behind.
//!
//! `--minutes` is at least 0.14 (8 s): a sample a second at most, the fewest that leave
//! `MIN_SAMPLES` after the warm-up; a shorter soak could only end in "too few samples".
//!
//! The findings go to stdout and `target/soak/report.md`; the exit code is non-zero when a
//! topology failed, with one line per failure on stderr.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::median;

/// Fraction of the samples ignored at the start.
const WARMUP_FRACTION: f64 = 0.25;
/// Allowed growth of the last third's median over the first third's, relative.
const RELATIVE_GROWTH: f64 = 0.10;
/// Allowed growth of a process's private memory, absolute, on top of the relative part.
const PROCESS_SLACK_BYTES: f64 = 8.0 * 1024.0 * 1024.0;
/// Allowed growth of the session's shared memory in use, absolute.
const SHM_SLACK_BYTES: f64 = 16.0 * 1024.0 * 1024.0;
/// Allowed growth of the bytes in live shared-memory blocks, absolute: a full send queue.
const SHM_USED_SLACK_BYTES: f64 = 64.0 * 1024.0 * 1024.0;
/// How long after its duration `ferromq run` may take to start, stop and clean up.
const STOP_ALLOWANCE: Duration = Duration::from_secs(120);
/// Fewer samples after warm-up than this cannot show a trend.
const MIN_SAMPLES: usize = 6;

/// One topology to soak.
struct Soak {
    name: &'static str,
    file: &'static str,
    /// Every message sent must arrive (push/pull); false where the pattern may drop (pub/sub).
    lossless: bool,
}

const SOAKS: [Soak; 2] = [
    Soak {
        name: "default",
        file: "topologies/default.toml",
        lossless: true,
    },
    Soak {
        name: "pubsub",
        file: "topologies/pubsub.toml",
        lossless: false,
    },
];

/// The shortest interval between samples (about 60 per run, one a second to one every five).
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest interval between samples.
const MAX_INTERVAL: Duration = Duration::from_secs(5);
/// The longest soak per topology: a day.
const MAX_MINUTES: f64 = 24.0 * 60.0;

/// The shortest soak that can be judged: enough samples, one per [`MIN_INTERVAL`], that
/// [`MIN_SAMPLES`] remain after the warm-up (8 s). A shorter one could only end in "too few
/// samples to judge".
fn min_duration() -> Duration {
    let needed = (MIN_SAMPLES as f64 / (1.0 - WARMUP_FRACTION)).ceil();
    MIN_INTERVAL.mul_f64(needed)
}

/// `--minutes`: a number of minutes from [`min_duration`] to [`MAX_MINUTES`]; the error quotes
/// what was typed (Clap adds the flag).
pub fn minutes(text: &str) -> Result<f64, String> {
    let shortest = min_duration().as_secs_f64();
    // Shown rounded up, so that the minimum as printed is accepted.
    let shortest_minutes = (shortest / 60.0 * 100.0).ceil() / 100.0;
    match text.parse::<f64>() {
        Ok(minutes) if minutes * 60.0 >= shortest && minutes <= MAX_MINUTES => Ok(minutes),
        Ok(minutes) if minutes > 0.0 && minutes * 60.0 < shortest => Err(format!(
            "{text:?} is too short to judge growth: expected at least {shortest_minutes} minutes \
             ({shortest} s: a sample a second at most, {MIN_SAMPLES} of them after the first \
             {:.0}% of warm-up)",
            WARMUP_FRACTION * 100.0
        )),
        _ => Err(format!(
            "{text:?} is not a soak's length: expected minutes from {shortest_minutes} to \
             {MAX_MINUTES}"
        )),
    }
}

/// Runs every soak for `minutes` each (as [`minutes`] took them); prints what it found; true
/// when all passed.
pub fn run(cargo: &str, workspace: &Path, minutes: f64) -> bool {
    let Some(ferromq) = crate::build_release_ferromq(cargo, workspace, &[]) else {
        return false;
    };
    let out_dir = workspace.join("target/soak");
    if let Err(error) = std::fs::create_dir_all(&out_dir) {
        eprintln!("xtask soak: cannot create {}: {error}", out_dir.display());
        return false;
    }
    let duration = Duration::from_secs_f64(minutes * 60.0);
    let mut all_passed = true;
    let mut report = format!("# Soak, {minutes} min per topology\n\n");
    for soak in &SOAKS {
        let outcome = soak_one(soak, &ferromq, workspace, &out_dir, duration);
        println!("{}", outcome.report);
        let _ = writeln!(report, "{}", outcome.report);
        all_passed &= outcome.failures.is_empty();
        for failure in &outcome.failures {
            eprintln!("xtask soak: {}: FAILED: {failure}", soak.name);
            let _ = writeln!(report, "FAILED: {failure}\n");
        }
    }
    let report_path = out_dir.join("report.md");
    if let Err(error) = std::fs::write(&report_path, &report) {
        eprintln!(
            "xtask soak: cannot write {}: {error}",
            report_path.display()
        );
    }
    println!(
        "xtask soak: {} ({minutes} min per topology; report in {})",
        if all_passed { "passed" } else { "FAILED" },
        report_path.display()
    );
    all_passed
}

/// What one topology's soak found.
struct Outcome {
    report: String,
    failures: Vec<String>,
}

/// Kills the launcher if the soak (or a launch-scale run) ends early; its devices follow
/// their parent.
pub(crate) struct LauncherGuard(pub(crate) Child);

impl Drop for LauncherGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn soak_one(
    soak: &Soak,
    ferromq: &Path,
    workspace: &Path,
    out_dir: &Path,
    duration: Duration,
) -> Outcome {
    let mut failures = Vec::new();
    let mut report = String::new();
    let session = format!("soak{}{}", std::process::id(), soak.name);
    let log_path = out_dir.join(format!("{}.log", soak.name));
    let fail = |failure: String| Outcome {
        report: format!("## {}\n", soak.name),
        failures: vec![failure],
    };
    let log = match File::create(&log_path) {
        Ok(log) => log,
        Err(error) => return fail(format!("cannot create {}: {error}", log_path.display())),
    };
    let Ok(log_err) = log.try_clone() else {
        return fail(format!("cannot share {}", log_path.display()));
    };
    eprintln!(
        "xtask soak: {}: ferromq run {} for {:.0} s (output in {})",
        soak.name,
        soak.file,
        duration.as_secs_f64(),
        log_path.display()
    );
    let spawned = Command::new(ferromq)
        .arg("run")
        .arg(soak.file)
        .arg("--duration")
        .arg(format!("{}", duration.as_secs_f64()))
        .arg("--session")
        .arg(&session)
        .current_dir(workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .spawn();
    let mut launcher = match spawned {
        Ok(child) => LauncherGuard(child),
        Err(error) => return fail(format!("cannot start {}: {error}", ferromq.display())),
    };
    let launcher_pid = launcher.0.id();
    // About 60 samples per run, between one per second and one per five.
    let interval = (duration / 60).clamp(MIN_INTERVAL, MAX_INTERVAL);
    // The launcher stops its devices within its own timeouts; give it generous room.
    let deadline = Instant::now() + duration + STOP_ALLOWANCE;
    let mut samples: Vec<Sample> = Vec::new();
    let status = loop {
        match launcher.0.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(error) => return fail(format!("cannot wait for the launcher: {error}")),
        }
        if Instant::now() > deadline {
            failures.push(format!(
                "`ferromq run` did not end within {STOP_ALLOWANCE:?} after its duration; killed"
            ));
            break None;
        }
        samples.push(Sample::take(launcher_pid, ferromq, &session));
        // A poll with a period, not a synchronisation: the sample interval is the point.
        std::thread::sleep(interval);
    };
    drop(launcher);
    if let Some(status) = status
        && !status.success()
    {
        failures.push(format!(
            "`ferromq run` exited with {status} (see {})",
            log_path.display()
        ));
    }
    let leftover = shm_files(&session);
    if !leftover.is_empty() {
        failures.push(format!(
            "the run left {} shared memory object(s) of session {session}: {leftover:?}",
            leftover.len()
        ));
        for name in &leftover {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
        }
    }

    let _ = writeln!(report, "## {} ({})", soak.name, soak.file);
    let _ = writeln!(
        report,
        "{} samples every {:.0} s; growth = last third's median vs first third's after the first {:.0}% (limit +{:.0}% + slack)",
        samples.len(),
        interval.as_secs_f64(),
        WARMUP_FRACTION * 100.0,
        RELATIVE_GROWTH * 100.0
    );
    let mut devices: Vec<&str> = samples
        .iter()
        .flat_map(|sample| sample.processes.keys().map(String::as_str))
        .collect();
    devices.sort_unstable();
    devices.dedup();
    if devices.is_empty() {
        failures.push("no device process was ever seen".to_owned());
    }
    let mut series: Vec<(String, Vec<f64>, f64)> = devices
        .iter()
        .map(|device| {
            let values = samples
                .iter()
                .filter_map(|sample| sample.processes.get(*device))
                .map(|memory| memory.private_bytes() as f64)
                .collect();
            (
                format!("device {device}: private memory (VmRSS - RssShmem)"),
                values,
                PROCESS_SLACK_BYTES,
            )
        })
        .collect();
    // One figure of every sample, as the series take them.
    let column = |figure: fn(&Sample) -> f64| samples.iter().map(figure).collect::<Vec<f64>>();
    let pages = column(|sample| sample.shm_bytes as f64);
    let used = column(|sample| sample.shm_used as f64);
    information(
        &mut report,
        "shared memory in use (/dev/shm, allocated bytes)",
        &pages,
        human,
    );
    series.push((
        "shared memory pages beyond the live blocks' highest use so far (/dev/shm allocated - peak `used`)"
            .to_owned(),
        pages_beyond_live_peak(&pages, &used),
        SHM_SLACK_BYTES,
    ));
    series.push((
        "shared memory in live blocks (`ferromq shm list`, used)".to_owned(),
        used,
        SHM_USED_SLACK_BYTES,
    ));
    series.push((
        "shared memory objects (count)".to_owned(),
        column(|sample| sample.shm_files as f64),
        0.0,
    ));
    information(
        &mut report,
        "live shared-memory messages",
        &column(|sample| sample.shm_messages as f64),
        |count| format!("{count:.0}"),
    );
    for (what, values, slack) in &series {
        match growth(values, RELATIVE_GROWTH, *slack) {
            Some(verdict) => {
                let _ = writeln!(report, "- {what}: {verdict}");
                if verdict.grows {
                    failures.push(format!("{what} grows: {verdict}"));
                }
            }
            None => {
                let _ = writeln!(
                    report,
                    "- {what}: only {} samples, too few to judge",
                    values.len()
                );
                failures.push(format!(
                    "{what}: only {} samples after warm-up, at least {MIN_SAMPLES} needed (run longer)",
                    values.len()
                ));
            }
        }
    }

    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let counts = Counts::parse(&output);
    let verdict = counts.judge(soak.lossless);
    let _ = write!(report, "{}", verdict.report);
    failures.extend(verdict.failures);
    Outcome { report, failures }
}

/// Memory figures of one process, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ProcessMemory {
    pub(crate) rss: u64,
    rss_shmem: u64,
    /// Anonymous resident pages: what the process alone costs (no file-backed or shared pages).
    pub(crate) rss_anon: u64,
}

impl ProcessMemory {
    /// Parses `/proc/<pid>/status` (`VmRSS:  1234 kB`).
    pub(crate) fn parse(status: &str) -> Option<ProcessMemory> {
        let field = |key: &str| {
            status.lines().find_map(|line| {
                let rest = line.strip_prefix(key)?.strip_prefix(':')?;
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                Some(kib * 1024)
            })
        };
        Some(ProcessMemory {
            rss: field("VmRSS")?,
            rss_shmem: field("RssShmem").unwrap_or(0),
            rss_anon: field("RssAnon").unwrap_or(0),
        })
    }

    fn private_bytes(self) -> u64 {
        self.rss.saturating_sub(self.rss_shmem)
    }
}

/// One sample of every device process and of the session's shared memory.
struct Sample {
    processes: BTreeMap<String, ProcessMemory>,
    shm_bytes: u64,
    shm_files: usize,
    shm_used: u64,
    shm_messages: u64,
}

impl Sample {
    fn take(launcher_pid: u32, ferromq: &Path, session: &str) -> Sample {
        let mut processes = BTreeMap::new();
        for (pid, device) in children(launcher_pid) {
            if let Some(memory) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .as_deref()
                .and_then(ProcessMemory::parse)
            {
                processes.insert(device, memory);
            }
        }
        let mut shm_bytes = 0;
        let names = shm_files(session);
        for name in &names {
            if let Ok(metadata) = std::fs::metadata(Path::new("/dev/shm").join(name)) {
                shm_bytes += metadata.blocks() * 512;
            }
        }
        let listing = Command::new(ferromq)
            .args(["shm", "list", "--session", session])
            .stderr(Stdio::null())
            .output()
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
            .unwrap_or_default();
        let (shm_used, shm_messages) = parse_shm_list(&listing);
        Sample {
            processes,
            shm_bytes,
            shm_files: names.len(),
            shm_used,
            shm_messages,
        }
    }
}

/// Sums the `used` and `messages` columns of `ferromq shm list`'s object lines
/// (`  ferromq_... 2.0 GiB 41.4 MiB 2.0 GiB 661 pid,pid`).
fn parse_shm_list(listing: &str) -> (u64, u64) {
    let mut used = 0;
    let mut messages = 0;
    for line in listing.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens
            .first()
            .is_none_or(|name| !name.starts_with("ferromq_"))
            || tokens.len() < 8
        {
            continue;
        }
        used += parse_size(tokens[3], tokens[4]).unwrap_or(0);
        messages += tokens[7].parse::<u64>().unwrap_or(0);
    }
    (used, messages)
}

/// `41.4` `MiB` -> bytes.
fn parse_size(number: &str, unit: &str) -> Option<u64> {
    let value: f64 = number.parse().ok()?;
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((value * scale) as u64)
}

/// The launcher's child processes: (pid, device id from `--id`, else the pid).
fn children(parent: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if parent_pid(&stat) != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|&byte| byte == 0)
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        let id = device_id(&args).unwrap_or_else(|| format!("pid {pid}"));
        found.push((pid, id));
    }
    found
}

/// The parent pid in `/proc/<pid>/stat`: the second field after the command name, which is in
/// parentheses and may itself contain spaces and parentheses.
fn parent_pid(stat: &str) -> Option<u32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// The value of `--id` (or `--id=`) in a device's arguments.
fn device_id(args: &[String]) -> Option<String> {
    args.iter().enumerate().find_map(|(idx, arg)| {
        if arg == "--id" {
            args.get(idx + 1).cloned()
        } else {
            arg.strip_prefix("--id=").map(str::to_owned)
        }
    })
}

/// Names of the session's objects in /dev/shm (`ferromq_<uid>_<session>_...`).
fn shm_files(session: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let marker = format!("_{session}_");
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with("ferromq_") && name.contains(&marker))
        .collect();
    names.sort();
    names
}

/// The verdict on one series of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Growth {
    baseline: f64,
    last: f64,
    limit: f64,
    grows: bool,
}

impl std::fmt::Display for Growth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} (limit {}){}",
            human(self.baseline),
            human(self.last),
            human(self.limit),
            if self.grows { ": GROWS" } else { "" }
        )
    }
}

fn human(value: f64) -> String {
    if value >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", value / (1024.0 * 1024.0))
    } else if value >= 1024.0 {
        format!("{:.1} KiB", value / 1024.0)
    } else {
        format!("{value:.0}")
    }
}

/// Reports how the medians of `values` moved (first third to last, as [`growth`] takes them),
/// shown by `show`, without judging them.
fn information(report: &mut String, what: &str, values: &[f64], show: fn(f64) -> String) {
    if let Some(verdict) = growth(values, RELATIVE_GROWTH, 0.0) {
        let _ = writeln!(
            report,
            "- {what} (information only): median {} -> {}",
            show(verdict.baseline),
            show(verdict.last)
        );
    }
}

/// Each sample's pages less the most bytes in live blocks seen up to it (see the module docs).
fn pages_beyond_live_peak(pages: &[f64], used: &[f64]) -> Vec<f64> {
    let mut peak = 0.0_f64;
    pages
        .iter()
        .zip(used)
        .map(|(&pages, &used)| {
            peak = peak.max(used);
            pages - peak
        })
        .collect()
}

/// Drops the warm-up, then compares the median of the last third with the median of the first
/// third; `None` when fewer than [`MIN_SAMPLES`] samples remain.
fn growth(values: &[f64], relative: f64, slack: f64) -> Option<Growth> {
    let n_warmup = (values.len() as f64 * WARMUP_FRACTION).ceil() as usize;
    let steady = values.get(n_warmup..)?;
    if steady.len() < MIN_SAMPLES {
        return None;
    }
    let third = steady.len() / 3;
    let baseline = median(&steady[..third]);
    let last = median(&steady[steady.len() - third..]);
    let limit = baseline * (1.0 + relative) + slack;
    Some(Growth {
        baseline,
        last,
        limit,
        grows: last > limit,
    })
}

/// What a `ferromq run` output says about the messages.
///
/// Parsed, line by line:
/// - `[<device>] sent N messages` or a log line `[time][LEVEL][<device>] sent N messages`: the
///   sampler's final count (`sent` per device).
/// - `sink summary: received N messages`: a sink's final count (`received` per device).
/// - `processor summary: forwarded N messages` (any `summary: forwarded N`): a forwarder's count
///   (`forwarded` per device), reported to show where a loss happened.
/// - a launcher line (`ferromq: ...`) with both `sent N` (or `N sent`) and `received N` (or
///   `N received`): a link's summary (`links`), its text before the counts as its name.
/// - a line with `lost` or `not delivered` next to a non-zero number (`lost=3`, `lost 3`,
///   `3 message(s) ... were lost`, `3 messages not delivered`): a loss report (`losses`).
#[derive(Debug, Default, PartialEq)]
struct Counts {
    sent: BTreeMap<String, u64>,
    received: BTreeMap<String, u64>,
    forwarded: BTreeMap<String, u64>,
    links: Vec<(String, u64, u64)>,
    losses: Vec<String>,
}

/// The result of [`Counts::judge`].
struct LossVerdict {
    report: String,
    failures: Vec<String>,
}

impl Counts {
    fn parse(output: &str) -> Counts {
        let mut counts = Counts::default();
        for line in output.lines() {
            let (device, message) = split_prefix(line);
            let words = words(message);
            if message.contains("sink summary") {
                if let (Some(device), Some(n_msgs)) = (&device, number_next_to(&words, "received"))
                {
                    counts.received.insert(device.clone(), n_msgs);
                }
            } else if message.contains("summary")
                && let (Some(device), Some(n_msgs)) = (&device, number_next_to(&words, "forwarded"))
            {
                counts.forwarded.insert(device.clone(), n_msgs);
            } else if line.starts_with("ferromq:")
                && let (Some(n_sent), Some(n_received)) = (
                    number_next_to(&words, "sent"),
                    number_next_to(&words, "received"),
                )
            {
                let name = line
                    .trim_start_matches("ferromq:")
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                counts.links.push((name, n_sent, n_received));
            } else if let (Some(device), Some(n_sent)) = (&device, sent_messages(&words)) {
                *counts.sent.entry(device.clone()).or_default() += n_sent;
            }
            let reports_loss = ["lost", "undelivered"]
                .iter()
                .any(|word| number_next_to(&words, word).is_some_and(|n| n > 0))
                || message.contains("not delivered")
                    && number_next_to(&words, "not").is_some_and(|n| n > 0);
            if reports_loss {
                counts.losses.push(line.trim().to_owned());
            }
        }
        counts
    }

    fn judge(&self, lossless: bool) -> LossVerdict {
        let mut report = String::new();
        let mut failures = Vec::new();
        let total_sent: u64 = self.sent.values().sum();
        let _ = writeln!(report, "- sent: {:?}", self.sent);
        let _ = writeln!(report, "- received: {:?}", self.received);
        if !self.forwarded.is_empty() {
            let _ = writeln!(report, "- forwarded: {:?}", self.forwarded);
        }
        for (link, n_sent, n_received) in &self.links {
            let _ = writeln!(
                report,
                "- link {link}: sent {n_sent}, received {n_received}"
            );
        }
        if self.sent.is_empty() || self.received.is_empty() {
            failures.push(format!(
                "cannot check for loss: the output has {} sent count(s) and {} received count(s)",
                self.sent.len(),
                self.received.len()
            ));
        }
        if total_sent == 0 && !self.sent.is_empty() {
            failures.push("no message was sent".to_owned());
        }
        if lossless {
            let total_received: u64 = self.received.values().sum();
            if total_sent != total_received {
                failures.push(format!(
                    "lost messages: sources sent {total_sent}, sinks received {total_received} ({} missing)",
                    i128::from(total_sent) - i128::from(total_received)
                ));
            }
            for (link, n_sent, n_received) in &self.links {
                if n_sent != n_received {
                    failures.push(format!("link {link}: sent {n_sent}, received {n_received}"));
                }
            }
            for line in &self.losses {
                failures.push(format!("the run reports a loss: {line}"));
            }
        } else {
            for (subscriber, n_received) in &self.received {
                let n_dropped = i128::from(total_sent) - i128::from(*n_received);
                let _ = writeln!(
                    report,
                    "- {subscriber}: {n_dropped} of {total_sent} dropped (pub/sub may drop for a slow or late subscriber)"
                );
                if n_dropped < 0 {
                    failures.push(format!(
                        "{subscriber} received {n_received}, more than the {total_sent} sent"
                    ));
                }
                if *n_received == 0 {
                    failures.push(format!("{subscriber} received nothing"));
                }
            }
            for line in &self.losses {
                let _ = writeln!(report, "- pub/sub drop report: {line}");
            }
        }
        LossVerdict { report, failures }
    }
}

/// Splits a log line into the device id of its leading `[...]` tags (the last tag that is not a
/// time or a level) and the message after them.
fn split_prefix(line: &str) -> (Option<String>, &str) {
    let mut rest = line.trim_start();
    let mut device = None;
    while let Some(tag_and_rest) = rest.strip_prefix('[') {
        let Some(end) = tag_and_rest.find(']') else {
            break;
        };
        let tag = &tag_and_rest[..end];
        let is_time = tag.chars().any(|c| c == ':') && tag.chars().any(|c| c.is_ascii_digit());
        let is_level = [
            "TRACE",
            "DEBUG",
            "INFO",
            "WARN",
            "WARNING",
            "ERROR",
            "FATAL",
            "STATE",
            "ALARM",
            "IMPORTANT",
        ]
        .iter()
        .any(|level| tag.trim().eq_ignore_ascii_case(level));
        if !is_time && !is_level && !tag.is_empty() {
            device = Some(tag.trim().to_owned());
        }
        rest = tag_and_rest[end + 1..].trim_start();
    }
    (device, rest)
}

fn words(message: &str) -> Vec<&str> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .filter(|word| !word.is_empty())
        .collect()
}

/// A number right after `keyword` (`lost 3`, `lost=3`, `received 3`) or up to six words before
/// it (`3 lost`, `3 message(s) in transfer were lost`).
fn number_next_to(words: &[&str], keyword: &str) -> Option<u64> {
    let at = words
        .iter()
        .position(|word| word.eq_ignore_ascii_case(keyword))?;
    let parse = |word: &&str| word.parse::<u64>().ok();
    if let Some(n) = words.get(at + 1).and_then(parse) {
        return Some(n);
    }
    words[at.saturating_sub(6)..at].iter().rev().find_map(parse)
}

/// `sent N messages` (a source's final count).
fn sent_messages(words: &[&str]) -> Option<u64> {
    let at = words.iter().position(|word| *word == "sent")?;
    let n = words.get(at + 1)?.parse().ok()?;
    words
        .get(at + 2)
        .is_some_and(|word| word.starts_with("message"))
        .then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_growth(values: &[f64], slack: f64, grows: bool) {
        let verdict = growth(values, RELATIVE_GROWTH, slack).expect("enough samples");
        assert_eq!(verdict.grows, grows, "{values:?}: {verdict}");
    }

    /// Found by a bad-input sweep: `--minutes 1e308` was refused as a 309-digit number, and
    /// `--minutes 0.0001` was taken, though no growth can be judged in 6 ms.
    #[test]
    fn minutes_are_long_enough_to_judge_and_refused_as_typed() {
        assert_eq!(minutes("10"), Ok(10.0));
        assert_eq!(
            minutes("0.14"),
            Ok(0.14),
            "the minimum as the error prints it"
        );
        for (bad, says) in [
            (
                "1e308",
                "\"1e308\" is not a soak's length: expected minutes from 0.14 to 1440",
            ),
            (
                "0.0001",
                "\"0.0001\" is too short to judge growth: expected at least 0.14 minutes (8 s",
            ),
            ("0.13", "\"0.13\" is too short"),
            ("0", "\"0\" is not a soak's length"),
            ("-1", "\"-1\" is not"),
            ("NaN", "\"NaN\" is not"),
            ("inf", "\"inf\" is not"),
            ("long", "\"long\" is not"),
        ] {
            let error = minutes(bad).expect_err(bad);
            assert!(error.starts_with(says), "{bad}: {error}");
        }
        // The shortest soak leaves its minimum of samples after the warm-up.
        let n_samples = (min_duration().as_secs_f64() / MIN_INTERVAL.as_secs_f64()) as usize;
        let values = vec![1.0; n_samples];
        assert!(growth(&values, RELATIVE_GROWTH, 0.0).is_some());
        assert!(growth(&values[1..], RELATIVE_GROWTH, 0.0).is_none());
    }

    #[test]
    fn flat_or_noisy_series_do_not_grow() {
        check_growth(&[100.0; 20], 0.0, false);
        // Warm-up growth is ignored; one spike in the last third is outvoted by the median.
        let mut values = vec![10.0, 50.0, 80.0, 100.0, 100.0];
        values.extend([
            100.0, 103.0, 98.0, 101.0, 99.0, 100.0, 102.0, 500.0, 100.0, 101.0,
        ]);
        check_growth(&values, 0.0, false);
        // Growth within the slack passes.
        let values: Vec<f64> = (0..30).map(|idx| 1000.0 + f64::from(idx)).collect();
        check_growth(&values, 100.0, false);
    }

    #[test]
    fn steady_growth_is_caught() {
        // A leak of 1% of the baseline per sample.
        let values: Vec<f64> = (0..40).map(|idx| 1000.0 + 10.0 * f64::from(idx)).collect();
        check_growth(&values, 0.0, true);
        // One extra shm object that stays.
        let mut files = vec![3.0; 20];
        files.extend([4.0; 12]);
        check_growth(&files, 0.0, true);
    }

    #[test]
    fn pages_that_follow_a_deepening_queue_do_not_grow_and_others_do() {
        const MIB: f64 = 1024.0 * 1024.0;
        // A send queue that reaches new depths: the live blocks' peak rises from 10 to 50 MiB
        // and the pages follow it, 3 MiB above (judged raw, the pages would fail).
        let used: Vec<f64> = (0..40)
            .map(|idx| (10.0 + 40.0 * f64::from(idx) / 39.0) * MIB)
            .collect();
        let pages: Vec<f64> = used.iter().map(|used| used + 3.0 * MIB).collect();
        check_growth(&pages, SHM_SLACK_BYTES, true);
        check_growth(
            &pages_beyond_live_peak(&pages, &used),
            SHM_SLACK_BYTES,
            false,
        );
        // Pages that grow while the live blocks stay at 12 MiB: an allocator touching new
        // memory, caught.
        let flat = vec![12.0 * MIB; 40];
        let touching: Vec<f64> = (0..40).map(|idx| (15.0 + f64::from(idx)) * MIB).collect();
        check_growth(
            &pages_beyond_live_peak(&touching, &flat),
            SHM_SLACK_BYTES,
            true,
        );
        // A queue that drained again keeps its pages (touched once, they stay): the peak, not
        // the current use, is what they are judged against.
        let mut drained = used.clone();
        drained[30..].fill(10.0 * MIB);
        let mut kept = pages.clone();
        let high_water = kept[29];
        kept[30..].fill(high_water);
        check_growth(
            &pages_beyond_live_peak(&kept, &drained),
            SHM_SLACK_BYTES,
            false,
        );
    }

    #[test]
    fn too_few_samples_are_not_judged() {
        assert_eq!(growth(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.1, 0.0), None);
        assert_eq!(growth(&[], 0.1, 0.0), None);
    }

    #[test]
    fn proc_status_and_stat_parse() {
        let status =
            "Name:\tferromq\nVmRSS:\t   20480 kB\nRssAnon:\t 8192 kB\nRssShmem:\t  4096 kB\n";
        let memory = ProcessMemory::parse(status).expect("VmRSS present");
        assert_eq!(memory.rss, 20480 * 1024);
        assert_eq!(memory.private_bytes(), 16384 * 1024);
        assert_eq!(ProcessMemory::parse("Name:\tzombie\n"), None);
        let stat = "4242 (ferromq (dev) x) S 4200 4242 4200 0 -1 4194560";
        assert_eq!(parent_pid(stat), Some(4200));
        let args: Vec<String> = [
            "ferromq",
            "device",
            "sink",
            "--id",
            "sink",
            "--control",
            "external",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(device_id(&args).as_deref(), Some("sink"));
        assert_eq!(
            device_id(&["x".to_owned(), "--id=a1".to_owned()]).as_deref(),
            Some("a1")
        );
    }

    #[test]
    fn shm_list_parses() {
        let listing = "\
session soak1default (in use)
  object                                                     size       used largest free messages  processes
  ferromq_0_soak1default_seg_11849_0                      2.0 GiB   41.4 MiB      2.0 GiB      661  11849,11850,11851
  ferromq_0_soak1default_seg_11850_0                      2.0 GiB      512 B      2.0 GiB        1  11850
";
        let (used, messages) = parse_shm_list(listing);
        assert_eq!(used, (41.4 * 1024.0 * 1024.0) as u64 + 512);
        assert_eq!(messages, 662);
        assert_eq!(
            parse_shm_list("no ferromq shared memory for user 0\n"),
            (0, 0)
        );
    }

    const PUSH_PULL_OUTPUT: &str = "\
ferromq: topologies/default.toml (3 processes, session soak1default, default transport shmem)
device           state              channel          in msg/s    in MB/s    out msg/s   out MB/s
[12:00:01][INFO][sampler] IDLE ---> INITIALIZING DEVICE
[12:01:01][INFO][sampler] sent 1200 messages
[processor] processor summary: forwarded 1200 messages, 78643200 bytes (1200 arrived in shared memory), copied 0 payload bytes
[sink] sink summary: received 1200 messages, 78643200 bytes in 60.001 s (20 msg/s), 1200 checksums ok
ferromq: duration reached: stopping every device
ferromq: link sampler.data -> processor.data-in: sent 1200, received 1200
";

    #[test]
    fn push_pull_output_parses_and_passes() {
        let counts = Counts::parse(PUSH_PULL_OUTPUT);
        assert_eq!(counts.sent, BTreeMap::from([("sampler".to_owned(), 1200)]));
        assert_eq!(counts.received, BTreeMap::from([("sink".to_owned(), 1200)]));
        assert_eq!(
            counts.forwarded,
            BTreeMap::from([("processor".to_owned(), 1200)])
        );
        assert_eq!(
            counts.links,
            vec![(
                "link sampler.data -> processor.data-in".to_owned(),
                1200,
                1200
            )]
        );
        assert!(counts.losses.is_empty(), "{:?}", counts.losses);
        let verdict = counts.judge(true);
        assert!(verdict.failures.is_empty(), "{:?}", verdict.failures);
    }

    #[test]
    fn losses_fail_a_lossless_topology() {
        let lossy = PUSH_PULL_OUTPUT.replace("received 1200 messages", "received 1190 messages");
        let verdict = Counts::parse(&lossy).judge(true);
        assert!(
            verdict
                .failures
                .iter()
                .any(|failure| failure.contains("10 missing")),
            "{:?}",
            verdict.failures
        );
        for line in [
            "[12:00:02][WARN][processor] closing channel data-out: 21495 in-flight messages lost",
            "[12:00:02][WARN][sampler] linger expired: lost=199",
            "[sink] the side channel to the peer broke; 4 message(s) in transfer were lost",
            "[12:00:02][ERROR][sampler] 7 messages not delivered",
        ] {
            let output = format!("{PUSH_PULL_OUTPUT}{line}\n");
            let counts = Counts::parse(&output);
            assert_eq!(counts.losses, vec![line.to_owned()]);
            assert!(!counts.judge(true).failures.is_empty(), "{line}");
        }
        let zero = format!("{PUSH_PULL_OUTPUT}[sampler] lost=0 after linger\n");
        assert!(Counts::parse(&zero).losses.is_empty());
    }

    #[test]
    fn missing_counts_fail_instead_of_passing_silently() {
        let verdict = Counts::parse("ferromq: duration reached\n").judge(true);
        assert!(
            verdict
                .failures
                .iter()
                .any(|failure| failure.contains("cannot check")),
            "{:?}",
            verdict.failures
        );
    }

    #[test]
    fn pub_sub_drops_are_reported_not_failed() {
        let output = "\
[12:01:01][INFO][publisher] sent 1000 messages
[subscriber-0] sink summary: received 1000 messages, 1 bytes in 1 s (1 msg/s)
[subscriber-1] sink summary: received 990 messages, 1 bytes in 1 s (1 msg/s)
[12:01:01][WARN][publisher] dropped for a slow subscriber: 10 lost
";
        let counts = Counts::parse(output);
        assert_eq!(counts.received.len(), 2);
        let verdict = counts.judge(false);
        assert!(verdict.failures.is_empty(), "{:?}", verdict.failures);
        assert!(
            verdict.report.contains("subscriber-1: 10 of 1000 dropped"),
            "{}",
            verdict.report
        );
        assert!(verdict.report.contains("drop report"), "{}", verdict.report);
        let silent = output.replace("received 990", "received 0");
        assert!(!Counts::parse(&silent).judge(false).failures.is_empty());
    }
}
