//! `cargo xtask side-by-side --fairmq PREFIX`: C++ FairMQ's benchmark device pair and ferromq's,
//! with the same options, interleaved on this machine, so that every ratio compares runs taken
//! minutes apart under the same load (a figure remembered from another day or machine is not a
//! comparison). Build FairMQ with `../shared/peers/build-fairmq.sh`; PREFIX is its install
//! directory (`bin/fairmq-bsampler`, `bin/fairmq-sink`, `lib/`).
//!
//! Each run: the sink binds (pull), the sampler connects (push), both `--control static
//! --max-iterations N --transport T` (`--transports shmem,zeromq`; shmem adds
//! `--shm-throw-bad-alloc false --bad-alloc-attempt-interval 1`), over ipc,
//! `linger=60000` on the channels (FairMQ's 500 ms default
//! drops data at exit). The rate is (N + 1) messages (both sides count FairMQ's way) over the
//! time between the devices' own microsecond log timestamps: FairMQ's "Starting the benchmark"
//! (bsampler) to "Received" (sink); ferromq's sampler `READY ---> RUNNING` to sink
//! `RUNNING ---> READY`. Process start-up is outside both intervals.
//!
//! How long: `--seconds S` (3 by default, `BENCHMARKS.md`'s shortest measurement) makes every
//! run of a size send the same N, chosen from a ferromq run of `CALIBRATION_MESSAGES` made
//! before the first round so that ferromq's runs take about S (FairMQ's as long as its rate
//! makes them: longer where it is slower); a run of a fraction of a second weighs a start-up
//! hiccup as heavily as the transport. `--messages N` sends N everywhere instead; a paced run
//! sends S × the rate.
//!
//! Rounds alternate FairMQ, ferromq for every size; the report gives each side's median with
//! min-max and the ratio ferromq ÷ FairMQ taken pair by pair (median, min-max). Every session's
//! shared memory is removed after its run, also after a failure or a timeout.
//!
//! Paced runs (`--msg-rate`) report CPU instead, and beside it the machine's wake-up floor,
//! measured in the same round right before the pair ([`wake_up_floor`]): what a sender that does
//! nothing but sleep until its next burst and ring a doorbell costs, and what the receiver that
//! the doorbell wakes costs. Both devices sleep and wake once per burst whatever they send (5 ms
//! apart, or ferromq's `--rate-burst-ms`, which `--rate-burst-ms` here passes to its sampler;
//! the floor is then measured at ferromq's period), and on a virtual machine a timer's wake-up
//! alone costs most of a percent of a core at 200 a second, varying by the hour: the floor says
//! how much of a device's figure is the machine's.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::Spread;

/// A run that takes longer than this is killed and reported as failed (longer for runs of more
/// than 2 s: see [`Options::run_timeout`]).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Messages of the ferromq run that calibrates a size's count for `--seconds`: long enough that
/// its rate is the pair's, not its start's (0.1 s at 3 M msg/s).
const CALIBRATION_MESSAGES: u64 = 299_999;

/// The fewest messages a calibrated run sends (`BENCHMARKS.md`: warm up at least 10 000).
const FEWEST_MESSAGES: u64 = 10_000;

/// A transport both sides have, by the name both sides' `--transport` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Shared memory (descriptors over zeromq).
    Shmem,
    /// ZeroMQ over ipc.
    Zeromq,
}

impl Transport {
    /// The name `--transport` takes.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Shmem => "shmem",
            Transport::Zeromq => "zeromq",
        }
    }
}

/// One cell of the comparison: a transport, a size, and what each side measured in it.
pub struct Cell {
    /// The transport.
    pub transport: Transport,
    /// Message size in bytes.
    pub size: usize,
    /// `--max-iterations` of its runs (each sends one more).
    pub messages: u64,
    /// FairMQ's runs, one per round counted.
    pub fairmq: Vec<RunResult>,
    /// ferromq's runs, paired with FairMQ's by index.
    pub ferromq: Vec<RunResult>,
    /// Paced runs: the wake-up floor measured in each round before the pair, % of a core of its
    /// sender and of its receiver ([`wake_up_floor`]).
    pub floor: Vec<(f64, f64)>,
}

/// What to compare.
pub struct Options {
    /// FairMQ's install prefix.
    pub fairmq: PathBuf,
    /// Rounds (each runs both pairs at every size).
    pub rounds: usize,
    /// Transports, each measured at every size.
    pub transports: Vec<Transport>,
    /// Message sizes in bytes.
    pub sizes: Vec<usize>,
    /// How many messages each run sends.
    pub length: RunLength,
    /// Paced runs (`--msg-rate`): report CPU use instead of the message rate.
    pub msg_rate: Option<f64>,
    /// Paced runs: ferromq's sampler's `--rate-burst-ms` (its default, 5, when `None`).
    pub rate_burst_ms: Option<u64>,
}

impl Options {
    /// How long ahead of their due time ferromq's paced messages leave together.
    fn ferromq_burst(&self) -> Duration {
        self.rate_burst_ms.map_or(BURST, Duration::from_millis)
    }
}

/// How many messages a run sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunLength {
    /// This many at every size (`--max-iterations`).
    Messages(u64),
    /// As many as ferromq sends in this many seconds, per size; paced: the rate times this.
    Seconds(f64),
}

impl Options {
    /// `--max-iterations` of the runs of a size, when it needs no calibration: fixed, or paced
    /// (the rate times the seconds).
    fn fixed_messages(&self) -> Option<u64> {
        match (self.length, self.msg_rate) {
            (RunLength::Messages(messages), _) => Some(messages),
            (RunLength::Seconds(seconds), Some(rate)) => {
                Some(((rate * seconds).ceil() as u64).max(2) - 1)
            }
            (RunLength::Seconds(_), None) => None,
        }
    }

    /// How long a run may take before it is killed: [`RUN_TIMEOUT`], or 30 times the seconds
    /// asked for (FairMQ's pair runs up to 15 times slower than ferromq's at 8 MiB).
    fn run_timeout(&self) -> Duration {
        match self.length {
            RunLength::Messages(_) => RUN_TIMEOUT,
            RunLength::Seconds(seconds) => {
                RUN_TIMEOUT.max(Duration::from_secs_f64(seconds.clamp(0.0, 3600.0) * 30.0))
            }
        }
    }
}

/// FairMQ's default `--shm-segment-size` (2 000 000 000 bytes), the smaller of the segments the
/// two pairs get (ferromq's default is 2 GiB); neither side is given another.
const FAIRMQ_SEGMENT_SIZE: usize = 2_000_000_000;

impl Options {
    /// Refuses, before the release build, what no run could measure: a size of 0, a shmem size
    /// that cannot fit the devices' segment, a pace too slow for a run to end within
    /// [`Options::run_timeout`].
    ///
    /// The segment is checked only as far as xtask can without the shm crate (which would bring
    /// tokio, zeromq and nix into xtask's build): a message at least the segment's size never
    /// fits; a little smaller, the segment's and the block's headers decide, and the devices
    /// refuse it naming both sizes.
    pub fn check(&self) -> Result<(), String> {
        let shmem = self.transports.contains(&Transport::Shmem);
        for &size in &self.sizes {
            if size == 0 {
                return Err("--sizes 0: expected message sizes of at least 1 byte".to_owned());
            }
            if shmem && size >= FAIRMQ_SEGMENT_SIZE {
                return Err(format!(
                    "--sizes {size} with --transports shmem: a message must fit the devices' \
                     shared-memory segment ({FAIRMQ_SEGMENT_SIZE} bytes, FairMQ's default, with \
                     its headers): expected sizes below {FAIRMQ_SEGMENT_SIZE}"
                ));
            }
        }
        if let (Some(rate), Some(messages)) = (self.msg_rate, self.fixed_messages()) {
            // Both sides send one more than --max-iterations.
            let sent = messages as f64 + 1.0;
            let timeout = self.run_timeout().as_secs_f64();
            if sent / rate > timeout {
                let slowest = (sent / timeout * 1000.0).ceil() / 1000.0;
                return Err(format!(
                    "--msg-rate {rate:?}: a paced run sends {sent} messages, {:.0} s at that \
                     rate, longer than a run may take ({timeout} s): expected at least {slowest} \
                     messages per second",
                    sent / rate
                ));
            }
        }
        Ok(())
    }
}

/// The `--max-iterations` that makes a pair measured at `rate` messages a second (counting
/// N + 1) run about `seconds`.
fn calibrated_messages(rate: f64, seconds: f64) -> u64 {
    let wanted = (rate * seconds).ceil();
    if wanted.is_finite() && wanted >= 1.0 {
        (wanted as u64).max(FEWEST_MESSAGES) - 1
    } else {
        FEWEST_MESSAGES - 1
    }
}

/// What one run of one side measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunResult {
    /// Messages per second.
    pub rate: f64,
    /// CPU use of the sampler and the sink in % of a core, between the first second of the run
    /// and its end (paced runs only).
    pub cpu: Option<(f64, f64)>,
}

/// A process's CPU time so far in clock ticks (utime + stime of `/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// How often a paced device sleeps and wakes at most: FairMQ's rate limiter sleeps once per
/// 5 ms of messages, ferromq's pacer once per `BURST` (5 ms) unless `--rate-burst-ms` says
/// otherwise; slower rates sleep before every message.
const BURST: Duration = Duration::from_millis(5);

/// How far apart a device paced to `msg_rate` messages a second in bursts of `burst` wakes.
pub(crate) fn wake_period(msg_rate: f64, burst: Duration) -> Duration {
    Duration::try_from_secs_f64(1.0 / msg_rate)
        .unwrap_or(burst)
        .max(burst)
}

/// How long the wake-up floor is measured in each round.
const FLOOR_RUN: Duration = Duration::from_secs(10);

/// This thread's CPU time so far in nanoseconds (the scheduler's own count,
/// `/proc/thread-self/schedstat`, exact where clock ticks are 10 ms apart).
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The wake-up floor of a paced pair on this machine now, for `run_for`: a sender thread that
/// sleeps until its next wake-up every `period` and then sends one datagram, and a receiver
/// thread blocked in `recv` that the datagram wakes; nothing else. Their CPU in % of a core
/// (sender, receiver), or `None` where the threads' CPU cannot be read (no schedstat) or the
/// doorbell failed. A device paced to sleep as often costs at least this much.
pub(crate) fn wake_up_floor(run_for: Duration, period: Duration) -> Option<(f64, f64)> {
    let (doorbell, bell) = std::os::unix::net::UnixDatagram::pair().ok()?;
    // A lost doorbell ends the receiver instead of hanging the run.
    bell.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let n_wakes = (run_for.as_nanos() / period.as_nanos().max(1)).max(1);
    let receiver = std::thread::spawn(move || {
        let before = thread_cpu_ns()?;
        let mut byte = [0u8; 1];
        for _ in 0..n_wakes {
            bell.recv(&mut byte).ok()?;
        }
        Some(thread_cpu_ns()? - before)
    });
    let started = Instant::now();
    let before = thread_cpu_ns();
    let mut due = started;
    let mut rung = true;
    for _ in 0..n_wakes {
        due += period;
        if let Some(left) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        rung &= doorbell.send(&[1]).is_ok();
    }
    let sender_ns = thread_cpu_ns()
        .zip(before)
        .map(|(after, before)| after - before);
    let receiver_ns = receiver.join().ok().flatten();
    let seconds = started.elapsed().as_secs_f64();
    let percent = |ns: u64| ns as f64 / 1e9 / seconds * 100.0;
    rung.then_some((percent(sender_ns?), percent(receiver_ns?)))
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's usual value, if that fails).
fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU samples of one process: the first one taken after the warm-up, and the latest.
#[derive(Default)]
struct CpuWindow {
    first: Option<(Instant, u64)>,
    last: Option<(Instant, u64)>,
}

impl CpuWindow {
    fn sample(&mut self, pid: u32, started: Instant) {
        // The first second is start-up and connection: not what a paced run costs.
        if started.elapsed() < Duration::from_secs(1) {
            return;
        }
        if let Some(ticks) = cpu_ticks(pid) {
            let now = (Instant::now(), ticks);
            self.first.get_or_insert(now);
            self.last = Some(now);
        }
    }

    /// % of a core between the first and the last sample.
    fn percent(&self, ticks_per_second: f64) -> Option<f64> {
        let ((t0, c0), (t1, c1)) = (self.first?, self.last?);
        let seconds = (t1 - t0).as_secs_f64();
        (seconds > 0.5).then(|| (c1 - c0) as f64 / ticks_per_second / seconds * 100.0)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    FairMq,
    Ferromq,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::FairMq => "FairMQ",
            Side::Ferromq => "ferromq",
        }
    }
}

/// Seconds since midnight of the first `[hh:mm:ss.micros]` on the first line containing
/// `marker` (FairMQ's lines carry colour codes around it).
pub fn timestamp_of(log: &str, marker: &str) -> Option<f64> {
    let line = log.lines().find(|line| line.contains(marker))?;
    let plain: String = strip_colours(line);
    plain.split('[').find_map(|field| {
        let stamp = field.split(']').next()?;
        let mut parts = stamp.split(':');
        let (hours, minutes, seconds) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || !seconds.contains('.') {
            return None;
        }
        Some(
            hours.parse::<f64>().ok()? * 3600.0
                + minutes.parse::<f64>().ok()? * 60.0
                + seconds.parse::<f64>().ok()?,
        )
    })
}

fn strip_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // ESC [ ... m
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

struct Pair {
    sink: Child,
    sampler: Child,
}

fn spawn(
    program: &Path,
    args: &[String],
    library_path: &Path,
    log: &Path,
) -> std::io::Result<Child> {
    let log_file = std::fs::File::create(log)?;
    Command::new(program)
        .args(args)
        .env("LD_LIBRARY_PATH", library_path)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
}

/// Waits for `child` up to `deadline`; kills it past that. True when it exited 0.
/// One run of one side: what it measured, or why not.
fn run_once(
    side: Side,
    options: &Options,
    ferromq: &Path,
    (transport, size, messages): (Transport, usize, u64),
    session: &str,
    dir: &Path,
) -> Result<RunResult, String> {
    let address = format!("ipc://{}", ipc_file(dir, session).display());
    let channel = |kind: &str, method: &str| {
        format!("name=data,type={kind},method={method},address={address},linger=60000")
    };
    let common = |id: &str| {
        let mut args = vec![
            "--id".to_owned(),
            id.to_owned(),
            "--transport".to_owned(),
            transport.name().to_owned(),
            "--session".to_owned(),
            session.to_owned(),
            "--control".to_owned(),
            "static".to_owned(),
            "--max-iterations".to_owned(),
            messages.to_string(),
            "--verbosity".to_owned(),
            "veryhigh".to_owned(),
        ];
        if transport != Transport::Shmem {
            return args;
        }
        args.extend([
            // A full segment makes the sampler wait for room instead of failing: with its
            // default, FairMQ's bsampler dies with "could not create a message" at 1 MiB and
            // 8 MiB once the sink falls behind (its 2 GiB segment fills), which measures nothing.
            "--shm-throw-bad-alloc".to_owned(),
            "false".to_owned(),
            // Both look again every millisecond (FairMQ's default waits 50 ms between
            // attempts, ferromq's backs off from 100 us to 10 ms): the pairs then differ in
            // their transports, not in how long they sleep on a full segment.
            "--bad-alloc-attempt-interval".to_owned(),
            "1".to_owned(),
        ]);
        args
    };
    let mut sink_args = common("sink");
    sink_args.extend(["--channel-config".to_owned(), channel("pull", "bind")]);
    let mut sampler_args = common("sampler");
    if let Some(rate) = options.msg_rate {
        sampler_args.extend(["--msg-rate".to_owned(), rate.to_string()]);
    }
    sampler_args.extend([
        "--msg-size".to_owned(),
        size.to_string(),
        "--channel-config".to_owned(),
        channel("push", "connect"),
    ]);
    let (sink_program, sampler_program) = match side {
        Side::FairMq => (
            options.fairmq.join("bin/fairmq-sink"),
            options.fairmq.join("bin/fairmq-bsampler"),
        ),
        Side::Ferromq => {
            sink_args.splice(0..0, ["device".to_owned(), "sink".to_owned()]);
            sampler_args.splice(0..0, ["device".to_owned(), "bsampler".to_owned()]);
            // FairMQ's bsampler has no such option: its limiter's slices are 5 ms.
            if let Some(burst_ms) = options.rate_burst_ms {
                sampler_args.extend(["--rate-burst-ms".to_owned(), burst_ms.to_string()]);
            }
            (ferromq.to_owned(), ferromq.to_owned())
        }
    };
    let library_path = options.fairmq.join("lib");
    let sink_log = dir.join(format!("{session}.sink.log"));
    let sampler_log = dir.join(format!("{session}.sampler.log"));
    let run_timeout = options.run_timeout();
    let deadline = Instant::now() + run_timeout;
    let sink = spawn(&sink_program, &sink_args, &library_path, &sink_log)
        .map_err(|error| format!("{}: {error}", sink_program.display()))?;
    // The sink binds first, as in FairMQ's own benchmark scripts.
    std::thread::sleep(Duration::from_millis(300));
    let sampler = match spawn(&sampler_program, &sampler_args, &library_path, &sampler_log) {
        Ok(sampler) => sampler,
        Err(error) => {
            let mut sink = sink;
            let _ = sink.kill();
            let _ = sink.wait();
            return Err(format!("{}: {error}", sampler_program.display()));
        }
    };
    let mut pair = Pair { sink, sampler };
    let (sampler_ok, sink_ok, cpu) = watch_pair(&mut pair, deadline, options.msg_rate.is_some());
    let sink_text = std::fs::read_to_string(&sink_log).unwrap_or_default();
    let sampler_text = std::fs::read_to_string(&sampler_log).unwrap_or_default();
    if !(sampler_ok && sink_ok) {
        return Err(format!(
            "{} {} {size} B: the pair failed or ran past {run_timeout:?} (logs in {})",
            side.name(),
            transport.name(),
            dir.display()
        ));
    }
    let (start, end) = match side {
        Side::FairMq => (
            timestamp_of(&sampler_text, "Starting the benchmark"),
            timestamp_of(&sink_text, "Received "),
        ),
        Side::Ferromq => (
            timestamp_of(&sampler_text, "READY ---> RUNNING"),
            timestamp_of(&sink_text, "RUNNING ---> READY"),
        ),
    };
    let (Some(start), Some(end)) = (start, end) else {
        return Err(format!(
            "{} {} {size} B: no start or end timestamp in the logs in {}",
            side.name(),
            transport.name(),
            dir.display()
        ));
    };
    // Across midnight the clock restarts.
    let seconds = if end >= start {
        end - start
    } else {
        end + 86_400.0 - start
    };
    let _ = std::fs::remove_file(&sink_log);
    let _ = std::fs::remove_file(&sampler_log);
    Ok(RunResult {
        rate: (messages + 1) as f64 / seconds.max(1e-6),
        cpu,
    })
}

/// Waits for both processes of a pair (killing what runs past `deadline`); with `measure_cpu`,
/// samples their CPU time every 20 ms while they run. (sampler ok, sink ok, CPU % of each).
fn watch_pair(
    pair: &mut Pair,
    deadline: Instant,
    measure_cpu: bool,
) -> (bool, bool, Option<(f64, f64)>) {
    let started = Instant::now();
    let (mut sampler_cpu, mut sink_cpu) = (CpuWindow::default(), CpuWindow::default());
    let mut outcome: [Option<bool>; 2] = [None, None];
    loop {
        for (idx, child) in [&mut pair.sampler, &mut pair.sink].into_iter().enumerate() {
            if outcome[idx].is_some() {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) => outcome[idx] = Some(status.success()),
                Ok(None) if Instant::now() < deadline => {
                    if measure_cpu {
                        let window = if idx == 0 {
                            &mut sampler_cpu
                        } else {
                            &mut sink_cpu
                        };
                        window.sample(child.id(), started);
                    }
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    outcome[idx] = Some(false);
                }
            }
        }
        if let [Some(sampler_ok), Some(sink_ok)] = outcome {
            let ticks = ticks_per_second();
            let cpu = sampler_cpu.percent(ticks).zip(sink_cpu.percent(ticks));
            return (sampler_ok, sink_ok, cpu);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ipc socket file a run's address names.
fn ipc_file(dir: &Path, session: &str) -> PathBuf {
    dir.join(format!("{session}.ipc"))
}

/// Removes what a run left in /dev/shm: ferromq's objects of the session, and FairMQ's through
/// its own monitor.
fn clean(side: Side, options: &Options, ferromq: &Path, session: &str) {
    let _ = match side {
        Side::FairMq => Command::new(options.fairmq.join("bin/fairmq-shmmonitor"))
            .args(["--session", session, "--cleanup"])
            .env("LD_LIBRARY_PATH", options.fairmq.join("lib"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status(),
        Side::Ferromq => Command::new(ferromq)
            .args(["shm", "clean", "--session", session])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status(),
    };
}

/// [`run_once`] in a session of its own (named after `label`), whose shared memory and ipc file
/// are removed after it, also after a failure.
fn run_in_session(
    side: Side,
    options: &Options,
    ferromq: &Path,
    run: (Transport, usize, u64),
    label: &str,
    dir: &Path,
) -> Result<RunResult, String> {
    let (transport, size, _) = run;
    let side_idx = u8::from(side == Side::Ferromq);
    let session = format!(
        "sbs{}{label}{}{size}s{side_idx}",
        std::process::id(),
        &transport.name()[..1]
    );
    let result = run_once(side, options, ferromq, run, &session, dir);
    clean(side, options, ferromq, &session);
    let _ = std::fs::remove_file(ipc_file(dir, &session));
    result
}

/// The `--max-iterations` that makes ferromq's pair run `--seconds` at this size, from one run
/// of [`CALIBRATION_MESSAGES`]. A failed calibration is noted in `failures` and leaves the size
/// at the count of a run as long as the calibration's.
fn calibrate(
    options: &Options,
    ferromq: &Path,
    (transport, size): (Transport, usize),
    dir: &Path,
    failures: &mut Vec<(Side, String)>,
) -> u64 {
    let RunLength::Seconds(seconds) = options.length else {
        return CALIBRATION_MESSAGES;
    };
    let run = (transport, size, CALIBRATION_MESSAGES);
    match run_in_session(Side::Ferromq, options, ferromq, run, "cal", dir) {
        Ok(result) => {
            let messages = calibrated_messages(result.rate, seconds);
            eprintln!(
                "xtask: calibration {} {size} B: {:.0} msg/s -> {} messages a run",
                transport.name(),
                result.rate,
                messages + 1
            );
            messages
        }
        Err(failure) => {
            eprintln!("xtask: calibration: {failure}");
            failures.push((Side::Ferromq, format!("calibration: {failure}")));
            CALIBRATION_MESSAGES
        }
    }
}

/// Runs the comparison and writes `target/side-by-side/report.md`; false when a ferromq run
/// failed. A FairMQ run that fails (its sink still waiting for messages its sampler sent, seen
/// now and then at 1 KiB) is listed in the report and leaves that round out of the ratios.
pub fn run(cargo: &str, workspace: &Path, options: &Options) -> bool {
    if let Err(error) = options.check() {
        eprintln!("xtask side-by-side: {error}");
        return false;
    }
    for program in [
        "bin/fairmq-bsampler",
        "bin/fairmq-sink",
        "bin/fairmq-shmmonitor",
    ] {
        if !options.fairmq.join(program).is_file() {
            eprintln!(
                "xtask: --fairmq {}: no {program} (build FairMQ with ../shared/peers/build-fairmq.sh)",
                options.fairmq.display()
            );
            return false;
        }
    }
    let Some(ferromq) = crate::build_release_ferromq(cargo, workspace, &[]) else {
        return false;
    };
    let dir = workspace.join("target/side-by-side");
    let _ = std::fs::create_dir_all(&dir);
    let mut failures = Vec::new();
    let mut cells: Vec<Cell> = Vec::new();
    for &transport in &options.transports {
        for &size in &options.sizes {
            let messages = options.fixed_messages().unwrap_or_else(|| {
                calibrate(options, &ferromq, (transport, size), &dir, &mut failures)
            });
            cells.push(Cell {
                transport,
                size,
                messages,
                fairmq: Vec::new(),
                ferromq: Vec::new(),
                floor: Vec::new(),
            });
        }
    }
    for round in 0..options.rounds {
        for cell in &mut cells {
            let (transport, size, messages) = (cell.transport, cell.size, cell.messages);
            if let Some(msg_rate) = options.msg_rate {
                let period = wake_period(msg_rate, options.ferromq_burst());
                match wake_up_floor(FLOOR_RUN, period) {
                    Some(floor) => {
                        eprintln!(
                            "xtask: round {} wake-up floor every {period:?}: sender {:.2}% receiver {:.2}%",
                            round + 1,
                            floor.0,
                            floor.1
                        );
                        cell.floor.push(floor);
                    }
                    None => eprintln!(
                        "xtask: round {} wake-up floor not measured (no /proc/thread-self/schedstat, or a doorbell failed)",
                        round + 1
                    ),
                }
            }
            let mut pair_rates = [RunResult::default(); 2];
            for (side_idx, side) in [Side::FairMq, Side::Ferromq].into_iter().enumerate() {
                let run = (transport, size, messages);
                let rate = run_in_session(side, options, &ferromq, run, &format!("r{round}"), &dir);
                match rate {
                    Ok(result) => {
                        let cpu = result.cpu.map_or_else(String::new, |(sampler, sink)| {
                            format!(", CPU sampler {sampler:.2}% sink {sink:.2}%")
                        });
                        eprintln!(
                            "xtask: round {} {} {} {size} B: {:.0} msg/s{cpu}",
                            round + 1,
                            side.name(),
                            transport.name(),
                            result.rate
                        );
                        pair_rates[side_idx] = result;
                    }
                    Err(failure) => {
                        eprintln!("xtask: {failure}");
                        failures.push((side, failure));
                    }
                }
            }
            let measured = |result: &RunResult| {
                result.rate > 0.0 && (options.msg_rate.is_none() || result.cpu.is_some())
            };
            if pair_rates.iter().all(measured) {
                cell.fairmq.push(pair_rates[0]);
                cell.ferromq.push(pair_rates[1]);
            }
        }
    }
    let mut report = render(options, &cells);
    for (side, failure) in &failures {
        let _ = writeln!(
            report,
            "\nNot counted: {} run failed: {failure}",
            side.name()
        );
    }
    print!("{report}");
    let _ = std::fs::write(dir.join("report.md"), &report);
    !failures.iter().any(|(side, _)| *side == Side::Ferromq)
}

fn millions(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.2} M", rate / 1e6)
    } else if rate >= 1e4 {
        format!("{:.0} k", rate / 1e3)
    } else if rate >= 1e3 {
        format!("{:.2} k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

/// The report: per size, both sides' medians (min-max) and the pairwise ratio; for paced runs
/// the CPU each process used instead.
pub fn render(options: &Options, cells: &[Cell]) -> String {
    if let Some(msg_rate) = options.msg_rate {
        return render_cpu(options, msg_rate, cells);
    }
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# ferromq vs FairMQ, side by side\n\n{}; {} rounds, {}, device pairs over ipc (sink \
         binds, sampler connects), interleaved; medians with min-max.\n",
        crate::bench::machine(),
        options.rounds,
        length_text(options.length),
    );
    let _ = writeln!(
        report,
        "| transport | size | messages | FairMQ msg/s | ferromq msg/s | ferromq ÷ FairMQ |\n|---|---|---|---|---|---|"
    );
    for cell in cells {
        let (transport, size) = (cell.transport.name(), cell.size);
        let rates = |runs: &[RunResult]| -> Vec<f64> { runs.iter().map(|run| run.rate).collect() };
        let (fairmq, ferromq) = (rates(&cell.fairmq), rates(&cell.ferromq));
        if fairmq.is_empty() {
            let _ = writeln!(
                report,
                "| {transport} | {size} B | {} | failed | failed | - |",
                cell.messages + 1
            );
            continue;
        }
        let ratios: Vec<f64> = ferromq.iter().zip(&fairmq).map(|(f, c)| f / c).collect();
        let (a, b, r) = (
            Spread::of(&fairmq),
            Spread::of(&ferromq),
            Spread::of(&ratios),
        );
        let _ = writeln!(
            report,
            "| {transport} | {size} B | {} | {} ({}-{}) | {} ({}-{}) | {:.2} ({:.2}-{:.2}) |",
            cell.messages + 1,
            millions(a.median),
            millions(a.min),
            millions(a.max),
            millions(b.median),
            millions(b.min),
            millions(b.max),
            r.median,
            r.min,
            r.max
        );
    }
    report
}

/// How long the runs were, for a report's header.
fn length_text(length: RunLength) -> String {
    match length {
        RunLength::Messages(messages) => format!("{} messages a run", messages + 1),
        RunLength::Seconds(seconds) => format!(
            "runs of about {seconds} s (the messages ferromq's pair sent in that time in a \
             calibration run before the first round; a paced run: the rate times that)"
        ),
    }
}

/// The report of paced runs: CPU % of a core per process, medians (min-max), and the wake-up
/// floor measured beside them.
fn render_cpu(options: &Options, msg_rate: f64, cells: &[Cell]) -> String {
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# ferromq vs FairMQ, side by side: CPU at {msg_rate} msg/s\n\n{}; {} rounds, {}, \
         device pairs over ipc (sink binds, sampler connects), interleaved; CPU time of \
         each process from its first second to its end, in % of one core; medians with min-max. \
         Wake-up floor: in each round before the pair, a thread that only sleeps until its next \
         burst ({:?} apart, {}) and rings a doorbell, and the thread it wakes ({:?} each \
         round).\n",
        crate::bench::machine(),
        options.rounds,
        length_text(options.length),
        wake_period(msg_rate, options.ferromq_burst()),
        match options.rate_burst_ms {
            None => "as both samplers sleep".to_owned(),
            Some(burst_ms) => format!(
                "as ferromq's sampler sleeps with --rate-burst-ms {burst_ms}; FairMQ's wakes every {:?}",
                wake_period(msg_rate, BURST)
            ),
        },
        FLOOR_RUN
    );
    let _ = writeln!(
        report,
        "| transport | size | FairMQ sampler | FairMQ sink | ferromq sampler | ferromq sink | floor: sender | floor: receiver |\n|---|---|---|---|---|---|---|---|"
    );
    let percent = |values: Vec<f64>, missing: &str| {
        if values.is_empty() {
            return missing.to_owned();
        }
        let spread = Spread::of(&values);
        format!(
            "{:.2}% ({:.2}-{:.2})",
            spread.median, spread.min, spread.max
        )
    };
    let spread = |runs: &[RunResult], pick: fn((f64, f64)) -> f64| {
        percent(
            runs.iter().filter_map(|run| run.cpu.map(pick)).collect(),
            "failed",
        )
    };
    for cell in cells {
        let floor =
            |pick: fn(&(f64, f64)) -> f64| percent(cell.floor.iter().map(pick).collect(), "-");
        let _ = writeln!(
            report,
            "| {} | {} B | {} | {} | {} | {} | {} | {} |",
            cell.transport.name(),
            cell.size,
            spread(&cell.fairmq, |cpu| cpu.0),
            spread(&cell.fairmq, |cpu| cpu.1),
            spread(&cell.ferromq, |cpu| cpu.0),
            spread(&cell.ferromq, |cpu| cpu.1),
            floor(|floor| floor.0),
            floor(|floor| floor.1)
        );
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_read_from_both_log_formats() {
        let fairmq = "[\x1b[01;34mfairmq-sink\x1b[0m][\x1b[01;36m21:44:02.417472\x1b[0m][\x1b[01;32mINFO\x1b[0m][Sink.h:111:Run] Received 99999 messages in 561.388ms.";
        let ferromq = "[21:40:53.605689][INFO][sink][ferromq_device::runner] RUNNING ---> READY";
        let at = |h: f64, m: f64, s: f64| h * 3600.0 + m * 60.0 + s;
        let fairmq_at = timestamp_of(fairmq, "Received ").unwrap();
        assert!((fairmq_at - at(21.0, 44.0, 2.417472)).abs() < 1e-6);
        let ferromq_at = timestamp_of(ferromq, "RUNNING ---> READY").unwrap();
        assert!((ferromq_at - at(21.0, 40.0, 53.605689)).abs() < 1e-6);
        assert_eq!(timestamp_of(ferromq, "not there"), None);
        assert_eq!(timestamp_of("[sink] no time here", "sink"), None);
    }

    #[test]
    fn the_report_gives_pairwise_ratios() {
        let options = Options {
            fairmq: PathBuf::new(),
            rounds: 2,
            transports: vec![Transport::Shmem],
            sizes: vec![64],
            length: RunLength::Messages(9),
            msg_rate: None,
            rate_burst_ms: None,
        };
        let runs = |rates: &[f64]| -> Vec<RunResult> {
            rates
                .iter()
                .map(|&rate| RunResult { rate, cpu: None })
                .collect()
        };
        let cell = |transport, fairmq, ferromq| Cell {
            transport,
            size: 64,
            messages: 9,
            fairmq,
            ferromq,
            floor: Vec::new(),
        };
        let report = render(
            &options,
            &[
                cell(Transport::Shmem, runs(&[2e6, 1e6]), runs(&[1e6, 1e6])),
                cell(Transport::Zeromq, runs(&[1e6, 1e6]), runs(&[5e5, 2e6])),
            ],
        );
        assert!(
            report.contains(
                "| shmem | 64 B | 10 | 1.50 M (1.00 M-2.00 M) | 1.00 M (1.00 M-1.00 M) | 0.75 (0.50-1.00) |"
            ),
            "{report}"
        );
        assert!(
            report.contains(
                "| zeromq | 64 B | 10 | 1.00 M (1.00 M-1.00 M) | 1.25 M (500 k-2.00 M) | 1.25 (0.50-2.00) |"
            ),
            "{report}"
        );
        assert!(report.contains("2 rounds, 10 messages a run,"), "{report}");
    }

    #[test]
    fn seconds_give_each_size_the_messages_ferromq_sends_in_them() {
        let options = |length, msg_rate| Options {
            fairmq: PathBuf::new(),
            rounds: 1,
            transports: vec![Transport::Shmem],
            sizes: vec![64],
            length,
            msg_rate,
            rate_burst_ms: None,
        };
        // 4 M msg/s for 3 s: 12 M messages, FairMQ's count (N + 1).
        assert_eq!(calibrated_messages(4e6, 3.0), 11_999_999);
        // Never fewer than BENCHMARKS.md's warm-up, whatever the calibration measured.
        assert_eq!(calibrated_messages(100.0, 3.0), FEWEST_MESSAGES - 1);
        assert_eq!(calibrated_messages(f64::NAN, 3.0), FEWEST_MESSAGES - 1);
        let calibrated = options(RunLength::Seconds(3.0), None);
        assert_eq!(calibrated.fixed_messages(), None, "measured per size");
        assert_eq!(calibrated.run_timeout(), Duration::from_secs(90));
        assert_eq!(
            options(RunLength::Seconds(30.0), Some(2500.0)).fixed_messages(),
            Some(74_999),
            "a paced run sends the rate times the seconds"
        );
        let fixed = options(RunLength::Messages(999_999), None);
        assert_eq!(fixed.fixed_messages(), Some(999_999));
        assert_eq!(fixed.run_timeout(), RUN_TIMEOUT);
        assert!(
            render(&calibrated, &[]).contains("runs of about 3 s"),
            "the report says how long its runs were"
        );
    }

    /// Found by a bad-input sweep: `--sizes` was never checked (0, or larger than the devices'
    /// segment), and `--msg-rate 0.001` was taken though a run at that pace outlasts its
    /// timeout; both went on to a release build and runs that could only fail.
    #[test]
    fn sizes_and_paces_no_run_can_measure_are_refused() {
        let options = |transports: &[Transport], sizes: &[usize], length, msg_rate| Options {
            fairmq: PathBuf::new(),
            rounds: 1,
            transports: transports.to_vec(),
            sizes: sizes.to_vec(),
            length,
            msg_rate,
            rate_burst_ms: None,
        };
        let both = [Transport::Shmem, Transport::Zeromq];
        let seconds = RunLength::Seconds(3.0);
        let refused = |options: Options| options.check().expect_err("refused");
        assert_eq!(
            options(&both, &[64, 1024, 65536], seconds, None).check(),
            Ok(())
        );
        assert_eq!(
            options(&both, &[1999999999], seconds, Some(2500.0)).check(),
            Ok(())
        );
        assert!(
            refused(options(&both, &[64, 0], seconds, None))
                .starts_with("--sizes 0: expected message sizes of at least 1 byte")
        );
        assert!(
            refused(options(&both, &[2000000000], seconds, None))
                .starts_with("--sizes 2000000000 with --transports shmem: a message must fit")
        );
        // Without shmem there is no segment to fit.
        assert_eq!(
            options(&[Transport::Zeromq], &[2000000000], seconds, None).check(),
            Ok(())
        );
        // Two messages at 0.001 a second: 2000 s; a run of 3 s may take 90.
        assert_eq!(
            refused(options(&both, &[64], seconds, Some(0.001))),
            "--msg-rate 0.001: a paced run sends 2 messages, 2000 s at that rate, longer than a \
             run may take (90 s): expected at least 0.023 messages per second"
        );
        assert_eq!(options(&both, &[64], seconds, Some(0.023)).check(), Ok(()));
        assert!(
            refused(options(&both, &[64], seconds, Some(1e-300))).starts_with("--msg-rate 1e-300:")
        );
        // --messages 999 at 10 a second: 100 s, past the 60 s of a run of a fixed count.
        assert!(
            refused(options(&both, &[64], RunLength::Messages(999), Some(10.0)))
                .ends_with("expected at least 16.667 messages per second")
        );
    }

    #[test]
    fn slow_rates_keep_their_digits() {
        assert_eq!(millions(2_345_678.0), "2.35 M");
        assert_eq!(millions(43_210.0), "43 k");
        assert_eq!(millions(3_456.0), "3.46 k");
        assert_eq!(millions(321.4), "321");
    }

    #[test]
    fn paced_runs_report_cpu_per_process() {
        let options = Options {
            fairmq: PathBuf::new(),
            rounds: 1,
            transports: vec![Transport::Shmem],
            sizes: vec![1048576],
            length: RunLength::Messages(24_999),
            msg_rate: Some(2500.0),
            rate_burst_ms: None,
        };
        let run = |sampler, sink| RunResult {
            rate: 2500.0,
            cpu: Some((sampler, sink)),
        };
        let report_with_floor = |floor: Vec<(f64, f64)>| {
            render(
                &options,
                &[Cell {
                    transport: Transport::Shmem,
                    size: 1048576,
                    messages: 24_999,
                    fairmq: vec![run(3.3, 2.5)],
                    ferromq: vec![run(0.8, 0.4)],
                    floor,
                }],
            )
        };
        let report = report_with_floor(vec![(0.7, 0.2)]);
        assert!(report.contains("CPU at 2500 msg/s"), "{report}");
        assert!(
            report.contains("(5ms apart, as both samplers sleep)"),
            "{report}"
        );
        assert!(
            report.contains("| shmem | 1048576 B | 3.30% (3.30-3.30) | 2.50% (2.50-2.50) | 0.80% (0.80-0.80) | 0.40% (0.40-0.40) | 0.70% (0.70-0.70) | 0.20% (0.20-0.20) |"),
            "{report}"
        );
        // A round whose floor could not be measured leaves the columns empty, not failed.
        let report = report_with_floor(Vec::new());
        assert!(report.contains("| 0.40% (0.40-0.40) | - | - |"), "{report}");
    }

    #[test]
    fn a_slow_rate_wakes_per_message_and_a_fast_one_per_burst() {
        assert_eq!(wake_period(2500.0, BURST), BURST);
        assert_eq!(wake_period(10.0, BURST), Duration::from_millis(100));
        let burst = Duration::from_millis(20);
        assert_eq!(wake_period(2500.0, burst), burst);
        assert_eq!(wake_period(10.0, burst), Duration::from_millis(100));
    }

    #[test]
    fn the_wake_up_floor_is_measured_by_both_threads() {
        if thread_cpu_ns().is_none() {
            eprintln!("skipped: no /proc/thread-self/schedstat on this kernel");
            return;
        }
        let started = Instant::now();
        let (sender, receiver) =
            wake_up_floor(Duration::from_millis(200), Duration::from_millis(5))
                .expect("both threads' CPU, every doorbell received");
        // Forty sleeps of 5 ms: the sender kept its schedule (it never ran ahead).
        assert!(started.elapsed() >= Duration::from_millis(200));
        // Each thread ran (a wake-up costs something) and slept most of the time.
        for cpu in [sender, receiver] {
            assert!(cpu > 0.0 && cpu < 100.0, "{sender}% / {receiver}%");
        }
    }

    #[test]
    fn cpu_is_read_from_proc_and_averaged_over_the_window() {
        assert!(
            cpu_ticks(std::process::id()).is_some(),
            "this process's own stat"
        );
        assert_eq!(cpu_ticks(u32::MAX), None);
        let start = Instant::now();
        let window = CpuWindow {
            first: Some((start, 100)),
            last: Some((start + Duration::from_secs(2), 150)),
        };
        // 50 ticks of 100 per second over 2 s: a quarter of a core.
        assert_eq!(window.percent(100.0), Some(25.0));
        assert_eq!(CpuWindow::default().percent(100.0), None);
    }
}
