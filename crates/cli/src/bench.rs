//! `ferromq bench`: a sender and a receiver in two processes, like FairMQ's `fairmq-bsampler`
//! and `fairmq-sink`, across transports and message sizes.
//!
//! Each pair runs a warm-up, then measures for `--duration`; each process reports its own CPU
//! use (user + system time from `getrusage`, over wall time). The receiver's count is the
//! throughput. `--latency` measures round trips over req/rep instead.
//!
//! # Interruption and failure
//! The members are the bench's children (`kill_on_drop`) and share its session (`bench-PID`):
//! their shared memory and their files in the temp directory are named after it. However the
//! bench ends (its results, a member's failure, SIGINT, SIGTERM or SIGHUP), `run_to_the_end`
//! kills the members still running and removes what they leave; then `measure_to_the_end`
//! prints the results of the pairs that finished (the rows or JSON lines a whole run prints),
//! and a failure ends the bench with 1, a signal with 128 plus its number (130, 143, 129), as a
//! shell reports it, also where a terminal's Ctrl-C reached a member too and its death ended
//! the pair first. A bench that cannot stop them (SIGKILL, SIGQUIT, an abort) leaves its
//! members to themselves: each watches its parent (`crate::run::launcher_gone`) and, once the
//! bench is gone, stops and removes the pair's directory; their shared memory goes with the
//! last of them (or the session's watchdog).
//! `ferromq bench rpc` ends the same way.

use std::io::Write as _;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferromq_core::{Channel, ChannelConfig, Message, Method, Parts, SocketType, Transport};
use futures_util::FutureExt as _;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Options of `ferromq bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchOptions {
    /// Transports to measure: zeromq-ipc, zeromq-tcp, shmem.
    #[arg(long, value_delimiter = ',', default_value = "shmem,zeromq-ipc")]
    pub transport: Vec<String>,
    /// Message sizes in bytes.
    #[arg(
        long = "msg-size",
        value_delimiter = ',',
        default_value = "64,1024,65536,1048576,8388608"
    )]
    pub msg_size: Vec<usize>,
    /// Parts per message (1 to 1024).
    #[arg(long = "num-parts", default_value_t = 1)]
    pub num_parts: usize,
    /// Messages per second to send (0 = as fast as possible).
    #[arg(long = "msg-rate", default_value_t = 0.0, allow_hyphen_values = true, value_parser = crate::options::messages_per_second)]
    pub msg_rate: f64,
    /// With --msg-rate: how long ahead of their due time messages may leave together, in ms
    /// (0 to 1000; 5, FairMQ's slice, when not given), as the samplers' --rate-burst-ms.
    #[arg(long = "rate-burst-ms", value_name = "MS", requires = "msg_rate", value_parser = crate::options::rate_burst_ms)]
    pub rate_burst_ms: Option<u64>,
    /// Seconds to measure each pair (after a warm-up of a quarter of it, at least 0.25 s).
    #[arg(long, default_value_t = 3.0, allow_hyphen_values = true, value_parser = crate::options::bench_seconds)]
    pub duration: f64,
    /// Send one buffer over and over instead of a new message each time (zeromq; shmem sends
    /// from its segment, and is refused with it alone).
    #[arg(long = "same-msg")]
    pub same_msg: bool,
    /// Write every byte at the sender and read every byte at the receiver.
    #[arg(long)]
    pub touch: bool,
    /// Measure round-trip latency over req/rep instead of throughput.
    #[arg(long)]
    pub latency: bool,
    /// With --latency: out over one push/pull channel and back over another instead of req/rep.
    #[arg(long = "push-pull", requires = "latency")]
    pub push_pull: bool,
    /// With --latency: out and back over one pair channel instead of req/rep.
    #[arg(long, requires = "latency", conflicts_with = "push_pull")]
    pub pair: bool,
    /// Publish to one subscriber instead of pushing to a pull. A publisher drops for a
    /// subscriber that falls behind (as ZeroMQ's PUB does): the rate is what the subscriber
    /// received.
    #[arg(long = "pub-sub", conflicts_with = "latency")]
    pub pub_sub: bool,
    /// Both ends spin on their receives instead of sleeping (channel option busyPoll).
    #[arg(long = "busy-poll")]
    pub busy_poll: bool,
    /// One JSON object per measurement instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Size of each process's shared-memory segment (shmem; 4 GiB by default; refused where
    /// no transport measured has a segment).
    #[arg(long = "shm-segment-size")]
    pub shm_segment_size: Option<u64>,
    /// Another benchmark instead of messages (`ferromq bench rpc --help`).
    #[command(subcommand)]
    pub what: Option<BenchKind>,
}

/// `--shm-segment-size` by default: 4 GiB.
const DEFAULT_SHM_SEGMENT_SIZE: u64 = 4 << 30;

impl BenchOptions {
    /// `--shm-segment-size`, or the default.
    fn segment_size(&self) -> u64 {
        self.shm_segment_size.unwrap_or(DEFAULT_SHM_SEGMENT_SIZE)
    }

    /// `--rate-burst-ms`, or the samplers' default.
    fn rate_burst_ms_or_default(&self) -> u64 {
        self.rate_burst_ms
            .unwrap_or(ferromq_devices::DEFAULT_RATE_BURST_MS)
    }
}

/// The benchmarks other than message throughput and latency.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchKind {
    /// Remote invocation between two processes: calls/s and MB/s per mode and call size, and
    /// `call_return` round trips.
    Rpc(crate::rpc_bench::RpcBenchOptions),
}

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchResult {
    /// zeromq-ipc, zeromq-tcp or shmem.
    pub transport: String,
    /// Bytes per part.
    pub msg_size: usize,
    /// Messages per second received (throughput mode).
    pub msgs_per_s: f64,
    /// Payload GB/s (10^9 bytes) received.
    pub gb_per_s: f64,
    /// CPU % of one core used by the sender.
    pub sender_cpu: f64,
    /// CPU % of one core used by the receiver.
    pub receiver_cpu: f64,
    /// Round-trip percentiles in microseconds (latency mode): p50, p99, p99.9.
    pub latency_us: Option<[f64; 3]>,
    /// The rate limit the sender ran at (0 = as fast as possible).
    #[serde(default)]
    pub msg_rate: f64,
    /// With a rate limit: how long ahead of their due time its messages could leave together,
    /// in ms (`--rate-burst-ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_burst_ms: Option<u64>,
    /// Touch mode: messages per second one core copies with `memcpy` at this size, measured
    /// by `ferromq bench` just before the pair ran: the bound a pipeline that writes and reads
    /// every byte is compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcpy_msgs_per_s: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct RoleReport {
    n_msgs: u64,
    seconds: f64,
    cpu_percent: f64,
    latency_us: Option<[f64; 3]>,
}

fn cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0.0;
    };
    let seconds =
        |time: nix::sys::time::TimeVal| time.tv_sec() as f64 + time.tv_usec() as f64 / 1e6;
    seconds(usage.user_time()) + seconds(usage.system_time())
}

fn transport_and_address(
    name: &str,
    dir: &std::path::Path,
    session: &str,
    options: &BenchOptions,
) -> Result<(std::sync::Arc<dyn Transport>, String)> {
    let mut transport_options = ferromq_core::TransportOptions::for_session(session);
    transport_options.properties.insert(
        "shm-segment-size".to_owned(),
        options.segment_size().to_string(),
    );
    let transport = transport_kind(name, true)?;
    Ok((
        crate::built_in_transports().create(transport, &transport_options)?,
        pair_address(name, dir),
    ))
}

/// The directory of a pair's files (its ipc sockets) in the temp directory, named after the
/// bench's session (the bench's own process id).
fn pair_dir(transport: &str, msg_size: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ferromq-{}-{transport}-{msg_size}", session()))
}

/// Where the receiver of a pair of `transport` whose files are in `dir` binds: loopback tcp for
/// the `-tcp` transports, an ipc socket in `dir` for the others.
fn pair_address(transport: &str, dir: &std::path::Path) -> String {
    if transport.ends_with("-tcp") {
        "tcp://127.0.0.1:0".to_owned()
    } else {
        format!("ipc://{}/bench.ipc", dir.display())
    }
}

/// Where a push/pull round trip comes back, bound by the receiver too: beside `address`.
fn back_address(address: &str) -> String {
    match address.strip_suffix(".ipc") {
        Some(stem) => format!("{stem}-back.ipc"),
        None => address.to_owned(),
    }
}

/// The transport a bench transport's name creates; the `-tcp` ones are reached over loopback
/// tcp, the others over an ipc file. `ofi-tcp` only where `with_ofi` (`ferromq bench rpc` has
/// no ofi members).
pub(crate) fn transport_kind(name: &str, with_ofi: bool) -> Result<&'static str> {
    match name {
        "zeromq-ipc" | "zeromq-tcp" => Ok("zeromq"),
        "shmem" => Ok("shmem"),
        "ofi-tcp" if with_ofi => Ok("ofi"),
        other if with_ofi => bail!(
            "--transport {other:?}: the transports are zeromq-ipc, zeromq-tcp, shmem and ofi-tcp (with --features ofi)"
        ),
        other => {
            bail!("--transport {other:?}: the transports are shmem, zeromq-ipc and zeromq-tcp")
        }
    }
}

/// Runs every transport × size pair and prints the results.
pub async fn run(options: BenchOptions) -> ExitCode {
    if let Some(BenchKind::Rpc(rpc)) = options.what {
        return crate::rpc_bench::run(rpc).await;
    }
    // Refused before any process starts, as a usage error (clap's code).
    if let Err(error) = check(&options) {
        eprintln!("ferromq bench: {error:#}");
        return ExitCode::from(2);
    }
    measure_to_the_end(
        "ferromq bench",
        &session(),
        async |results| run_all(&options, results).await,
        |out, results| {
            if options.json {
                write_json_lines(out, results)
            } else {
                print_table(out, results, options.latency)
            }
        },
    )
    .await
}

/// Runs `measure`, which adds each result to the list it is given as soon as it has it, to its
/// end through [`run_to_the_end`]; then `print` writes what was measured to standard output,
/// whether `measure` ended with its last result, with a failure or by a signal, so that
/// nothing measured is lost. The exit code: 0; 1 after a failure (said on standard error, as
/// is a result that cannot be printed); or the signal's.
pub(crate) async fn measure_to_the_end<R>(
    command: &str,
    session: &str,
    measure: impl AsyncFnOnce(&mut Vec<R>) -> Result<()>,
    print: impl FnOnce(&mut dyn std::io::Write, &[R]) -> std::io::Result<()>,
) -> ExitCode {
    let mut results = Vec::new();
    let ended = run_to_the_end(command, session, measure(&mut results)).await;
    // Not `println!`, which panics where standard output is closed (`| head`, or a reader
    // that the same Ctrl-C ended).
    let printed = if results.is_empty() {
        Ok(())
    } else {
        let mut out = std::io::stdout().lock();
        print(&mut out, &results).and_then(|()| out.flush())
    };
    if let Err(error) = &printed {
        eprintln!(
            "{command}: cannot print the {} result(s) measured: {error}",
            results.len()
        );
    }
    match ended {
        Err(interrupted) => interrupted,
        Ok(Err(error)) => {
            eprintln!("{command}: {error:#}");
            ExitCode::FAILURE
        }
        Ok(Ok(())) if printed.is_err() => ExitCode::FAILURE,
        Ok(Ok(())) => ExitCode::SUCCESS,
    }
}

/// `results` as JSON, one object a line (`--json`).
pub(crate) fn write_json_lines<R: Serialize>(
    out: &mut dyn std::io::Write,
    results: &[R],
) -> std::io::Result<()> {
    for result in results {
        let line = serde_json::to_string(result).expect("results serialise");
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The session this bench's members share, and the start of their files' names.
fn session() -> String {
    format!("bench-{}", std::process::id())
}

/// Runs `bench` (a bench whose members share `session`) until it ends or SIGINT, SIGTERM or
/// SIGHUP arrives, then removes what its members leave ([`clean_up_after`]). On a signal,
/// `bench` is dropped first, which kills the members it started (`kill_on_drop`), and the
/// exit code to end with is the `Err`: 128 plus the signal's number.
pub(crate) async fn run_to_the_end<T>(
    command: &str,
    session: &str,
    bench: impl std::future::Future<Output = T>,
) -> std::result::Result<T, ExitCode> {
    let Ok(mut signals) = crate::Signals::install() else {
        eprintln!(
            "{command}: cannot handle SIGINT and SIGTERM; a signal leaves the members' files"
        );
        let outcome = bench.await;
        clean_up_after(session).await;
        return Ok(outcome);
    };
    // The hangup of the terminal it runs in stops it as SIGTERM does (exit 129).
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let hung_up = async {
        match &mut hangup {
            Some(hangup) => drop(hangup.recv().await),
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        biased;
        name = signals.next() => Err((name, crate::Signals::exit_code(name))),
        () = hung_up => Err(("SIGHUP", 129)),
        outcome = bench => Ok(outcome),
    };
    // A terminal's Ctrl-C (or hangup) reaches the members too, and one that died of it may
    // have ended the bench, as a failed pair, before the signal was seen here. The signal came
    // first (the kernel sends it to the whole group before a member can die of it): one more
    // turn of the drivers, which `yield_now` gives, delivers it.
    let outcome = match outcome {
        Ok(ended) => {
            tokio::task::yield_now().await;
            let hung_up = hangup
                .as_mut()
                .is_some_and(|hangup| hangup.recv().now_or_never().is_some());
            match signals.next().now_or_never() {
                Some(name) => Err((name, crate::Signals::exit_code(name))),
                None if hung_up => Err(("SIGHUP", 129)),
                None => Ok(ended),
            }
        }
        interrupted => interrupted,
    };
    clean_up_after(session).await;
    outcome.map_err(|(name, code)| {
        eprintln!("{command}: {name}: stopped; its members were killed and their files removed");
        ExitCode::from(code)
    })
}

/// Once no member of `session` is alive, nor a shared-memory watchdog one of them started (at
/// most 5 s: killed members, after a signal or the other member of a pair that failed, may
/// still be dying, and a dying member or its watchdog may still create what is to be removed),
/// removes what they left, and says so on stderr when something still ran at the limit. The
/// caller must hold no shared memory of `session` itself: the session's watchdog stays while
/// it does. Reading /proc and removing files block: on a thread of their own.
pub(crate) async fn clean_up_after(session: &str) {
    let session = session.to_owned();
    let _ = tokio::task::spawn_blocking(move || {
        let limit = Duration::from_secs(5);
        let deadline = Instant::now() + limit;
        // A member's shared-memory watchdog, started late, would make its lock file again
        // after the removal below (it removes it once it sees its member gone).
        let still_running = loop {
            let running = if members_alive(&session) {
                Some("a member")
            } else if ferromq_shm::cleanup::watchdog_running(&session) {
                Some("a shared-memory watchdog")
            } else {
                None
            };
            if running.is_none() || Instant::now() >= deadline {
                break running;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Some(what) = still_running {
            eprintln!(
                "ferromq bench: {what} of session {session} still ran after {limit:?}; its files are removed anyway"
            );
        }
        remove_member_leftovers(&session);
    })
    .await;
}

/// Whether a process started with `--session SESSION` (a member of this bench) still runs; a
/// zombie has no command line and does not count.
fn members_alive(session: &str) -> bool {
    let option = format!("--session\0{session}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .any(|cmdline| {
            cmdline
                .windows(option.len())
                .any(|window| window == option.as_bytes())
        })
}

/// Removes what the members of `session` leave: its shared memory, and the files and
/// directories in the temp directory named after it (`ferromq-SESSION-...`: a pair's ipc
/// directory, the rpc members' ipc files).
fn remove_member_leftovers(session: &str) {
    let _ = ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), session, true);
    let prefix = format!("ferromq-{session}-");
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let path = entry.path();
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
        }
    }
}

fn print_table(
    out: &mut dyn std::io::Write,
    results: &[BenchResult],
    latency: bool,
) -> std::io::Result<()> {
    let touch = results
        .iter()
        .any(|result| result.memcpy_msgs_per_s.is_some());
    if latency {
        writeln!(
            out,
            "{:<12} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
            "transport", "size", "p50 us", "p99 us", "p99.9 us", "cpu S%", "cpu R%"
        )?;
    } else if touch {
        writeln!(
            out,
            "{:<12} {:>10} {:>12} {:>8} {:>8} {:>8} {:>12} {:>9}",
            "transport", "size", "msg/s", "GB/s", "cpu S%", "cpu R%", "memcpy msg/s", "÷ memcpy"
        )?;
    } else {
        writeln!(
            out,
            "{:<12} {:>10} {:>12} {:>8} {:>8} {:>8}",
            "transport", "size", "msg/s", "GB/s", "cpu S%", "cpu R%"
        )?;
    }
    for result in results {
        match result.latency_us {
            Some([p50, p99, p999]) => writeln!(
                out,
                "{:<12} {:>10} {:>10.1} {:>10.1} {:>10.1} {:>8.1} {:>8.1}",
                result.transport,
                result.msg_size,
                p50,
                p99,
                p999,
                result.sender_cpu,
                result.receiver_cpu
            )?,
            None if touch => {
                let memcpy = result.memcpy_msgs_per_s.unwrap_or(f64::NAN);
                writeln!(
                    out,
                    "{:<12} {:>10} {:>12.0} {:>8.3} {:>8.1} {:>8.1} {:>12.0} {:>9.2}",
                    result.transport,
                    result.msg_size,
                    result.msgs_per_s,
                    result.gb_per_s,
                    result.sender_cpu,
                    result.receiver_cpu,
                    memcpy,
                    result.msgs_per_s / memcpy
                )?;
            }
            None => writeln!(
                out,
                "{:<12} {:>10} {:>12.0} {:>8.3} {:>8.1} {:>8.1}",
                result.transport,
                result.msg_size,
                result.msgs_per_s,
                result.gb_per_s,
                result.sender_cpu,
                result.receiver_cpu
            )?,
        }
    }
    Ok(())
}

/// The fewest messages a paced run must send while it measures.
const MIN_PACED_MESSAGES: f64 = 10.0;

/// What the options ask for is measurable: known transports, parts, a segment that holds a
/// message, and a rate that sends something while it measures.
fn check(options: &BenchOptions) -> Result<()> {
    let mut measures_shmem = false;
    let built_in = crate::built_in_transports();
    let mut traits = Vec::new();
    for transport in &options.transport {
        let kind = transport_kind(transport, true)?;
        if !built_in.contains(kind) {
            bail!(
                "--transport {transport:?}: this ferromq was built without the {kind} transport (built in: {}; build with --features {kind})",
                built_in.names().join(", ")
            );
        }
        measures_shmem |= kind == "shmem";
        traits.push(built_in.traits(kind)?);
    }
    // Options no transport measured takes would be ignored without a word. A transport that
    // lends shared memory sends from it (`send`), not from one heap buffer.
    let transports = options.transport.join(",");
    if options.same_msg && traits.iter().all(|traits| traits.lends_shared_memory) {
        bail!(
            "--same-msg with --transport {transports}: shared memory sends from its segment, not from one buffer; it is for zeromq"
        );
    }
    let reads_segment_size = traits
        .iter()
        .any(|traits| traits.properties.contains(&"shm-segment-size"));
    if let Some(size) = options.shm_segment_size
        && !reads_segment_size
    {
        bail!(
            "--shm-segment-size {size} with --transport {transports}: no transport measured has a shared-memory segment"
        );
    }
    let max_parts = ferromq_devices::MAX_PARTS;
    if !(1..=max_parts).contains(&options.num_parts) {
        bail!(
            "--num-parts {}: expected 1 to {max_parts}",
            options.num_parts
        );
    }
    // No allocation holds more than `isize::MAX` bytes: a larger message cannot be made.
    let max_message = isize::MAX as usize;
    for &msg_size in &options.msg_size {
        if msg_size
            .checked_mul(options.num_parts)
            .is_none_or(|bytes| bytes > max_message)
        {
            bail!(
                "--msg-size {msg_size} with --num-parts {}: a message has at most {max_message} bytes",
                options.num_parts
            );
        }
    }
    let min_segment = ferromq_shm::segment::MIN_SEGMENT_SIZE as u64;
    if measures_shmem && options.segment_size() < min_segment {
        bail!(
            "--shm-segment-size {}: expected at least {min_segment} bytes",
            options.segment_size()
        );
    }
    // A message's parts are blocks in the sender's segment (the shm crate's "Block layout"):
    // one that cannot fit failed in the sender.
    if measures_shmem {
        use ferromq_shm::managed::{block_footprint, block_room};
        let segment_size = usize::try_from(options.segment_size()).unwrap_or(usize::MAX);
        let room = block_room(segment_size);
        for &msg_size in &options.msg_size {
            let needed = block_footprint(msg_size).saturating_mul(options.num_parts);
            if needed > room {
                bail!(
                    "--msg-size {msg_size} with --shm-segment-size {} and --num-parts {}: a message takes {needed} bytes of a segment, which has room for {room}",
                    options.segment_size(),
                    options.num_parts
                );
            }
        }
    }
    check_temp_dir(options.transport.iter().flat_map(|transport| {
        options.msg_size.iter().flat_map(move |&msg_size| {
            let address = pair_address(transport, &pair_dir(transport, msg_size));
            let back = options.push_pull.then(|| back_address(&address));
            std::iter::once(address).chain(back)
        })
    }))?;
    // `--msg-rate 1e-9` waited ~31 years for the warm-up's first message.
    if options.msg_rate > 0.0 && options.msg_rate * options.duration < MIN_PACED_MESSAGES {
        bail!(
            "--msg-rate {:?} with --duration {:?}: fewer than {MIN_PACED_MESSAGES} messages to measure; raise either",
            options.msg_rate,
            options.duration
        );
    }
    if let (Some(burst_ms), 0.0) = (options.rate_burst_ms, options.msg_rate) {
        bail!(
            "--rate-burst-ms {burst_ms} with --msg-rate 0: it shapes the bursts of a paced sender, and 0 does not pace"
        );
    }
    Ok(())
}

/// The temp directory (`TMPDIR`) can hold a bench's ipc sockets, whose `addresses` are in it:
/// it is a directory (one that is missing is not made), and its path leaves theirs short
/// enough for a socket. The error names TMPDIR and its path.
pub(crate) fn check_temp_dir(addresses: impl IntoIterator<Item = String>) -> Result<()> {
    let temp_dir = std::env::temp_dir();
    let temp_dir_error = |error: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "the temp directory {} (TMPDIR): {error}",
            temp_dir.display()
        )
    };
    match std::fs::metadata(&temp_dir) {
        Ok(metadata) if metadata.is_dir() => {}
        Ok(_) => return Err(temp_dir_error(&"not a directory")),
        Err(error) => return Err(temp_dir_error(&error)),
    }
    for address in addresses {
        if let Err(error) = ferromq_core::Address::parse(&address) {
            return Err(temp_dir_error(&error));
        }
    }
    Ok(())
}

/// Runs the transport × size pairs in turn until one fails, adding each pair's result to
/// `results` as it ends (a signal may end the run at any pair).
async fn run_all(options: &BenchOptions, results: &mut Vec<BenchResult>) -> Result<()> {
    for transport in &options.transport {
        for &msg_size in &options.msg_size {
            let result = run_pair(options, transport, msg_size)
                .await
                .with_context(|| format!("{transport} at {msg_size} bytes"))?;
            results.push(result);
        }
    }
    Ok(())
}

async fn run_pair(options: &BenchOptions, transport: &str, msg_size: usize) -> Result<BenchResult> {
    // Measured before the pair starts, so neither disturbs the other.
    let memcpy_msgs_per_s = if options.touch && !options.latency {
        // `check` bounds the product.
        Some(memcpy_rate((msg_size * options.num_parts).max(1))?)
    } else {
        None
    };
    // Not `create_dir_all`: a temp directory that is not there is not made.
    let dir = pair_dir(transport, msg_size);
    std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let exe = std::env::current_exe()?;
    let common = |role: &str| {
        let mut command = tokio::process::Command::new(&exe);
        command
            .args([
                "bench-role",
                role,
                "--transport",
                transport,
                "--msg-size",
                &msg_size.to_string(),
            ])
            .args([
                "--num-parts",
                &options.num_parts.to_string(),
                "--msg-rate",
                &options.msg_rate.to_string(),
                "--rate-burst-ms",
                &options.rate_burst_ms_or_default().to_string(),
            ])
            .args([
                "--duration",
                &options.duration.to_string(),
                "--shm-segment-size",
                &options.segment_size().to_string(),
            ])
            .args(["--session", &session()])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env(crate::run::LAUNCHER_PID_ENV, std::process::id().to_string())
            .kill_on_drop(true);
        // The roles take the same switches as the command.
        let switches = [
            (options.same_msg, "--same-msg"),
            (options.touch, "--touch"),
            (options.latency, "--latency"),
            (options.push_pull, "--push-pull"),
            (options.pair, "--pair"),
            (options.pub_sub, "--pub-sub"),
            (options.busy_poll, "--busy-poll"),
        ];
        for (_, switch) in switches.iter().filter(|(on, _)| *on) {
            command.arg(switch);
        }
        command
    };
    let mut receiver = common("receiver").spawn()?;
    let mut receiver_lines = BufReader::new(receiver.stdout.take().expect("piped")).lines();
    let ready = role_line(
        "receiver",
        &mut receiver,
        &mut receiver_lines,
        Duration::from_secs(30),
    )
    .await
    .context("the receiver never got ready")?;
    let address = ready
        .strip_prefix("READY ")
        .map(str::to_owned)
        .with_context(|| format!("the receiver said {ready:?}, not its address"))?;
    // A push/pull round trip's receiver names both of its addresses: out, then back.
    let mut sender = common("sender")
        .arg("--address")
        .args(address.split(' '))
        .spawn()?;
    let mut sender_lines = BufReader::new(sender.stdout.take().expect("piped")).lines();
    eprintln!(
        "ferromq bench: {transport} at {msg_size} bytes: measuring for {} s",
        options.duration
    );
    // Both at once: a member that ends without its report (killed, failed) ends the pair as
    // soon as it does, whichever it is, and the other is killed on the way out.
    let limit = Duration::from_secs_f64(options.duration * 3.0 + 60.0);
    let (sender_report, receiver_report) = tokio::try_join!(
        role_line("sender", &mut sender, &mut sender_lines, limit),
        role_line("receiver", &mut receiver, &mut receiver_lines, limit),
    )?;
    let (sender_status, receiver_status) = (sender.wait().await?, receiver.wait().await?);
    // Before the next pair starts; a pair that fails early is cleaned up by `run_to_the_end`.
    clean_up_after(&session()).await;
    if !sender_status.success() || !receiver_status.success() {
        bail!("sender {sender_status}, receiver {receiver_status}");
    }
    let sender_report: RoleReport = serde_json::from_str(&sender_report)?;
    let receiver_report: RoleReport = serde_json::from_str(&receiver_report)?;
    let msgs_per_s = receiver_report.n_msgs as f64 / receiver_report.seconds.max(1e-9);
    Ok(BenchResult {
        transport: format!(
            "{transport}{}{}{}{}",
            if options.push_pull { "+push-pull" } else { "" },
            if options.pair { "+pair" } else { "" },
            if options.pub_sub { "+pub-sub" } else { "" },
            if options.busy_poll { "+busy-poll" } else { "" }
        ),
        msg_size,
        msgs_per_s,
        gb_per_s: msgs_per_s * (msg_size * options.num_parts) as f64 / 1e9,
        sender_cpu: sender_report.cpu_percent,
        receiver_cpu: receiver_report.cpu_percent,
        latency_us: sender_report.latency_us,
        msg_rate: options.msg_rate,
        rate_burst_ms: (options.msg_rate > 0.0).then(|| options.rate_burst_ms_or_default()),
        memcpy_msgs_per_s,
    })
}

/// The next line a bench role process writes (`role` names it in errors), within `limit`. A
/// role that ends without one failed: the error says how it ended, not only that it "said
/// nothing". One that exited printed its error to standard error, which it shares with this
/// process; one killed by a signal printed nothing.
pub(crate) async fn role_line(
    role: &str,
    child: &mut tokio::process::Child,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    limit: Duration,
) -> Result<String> {
    let line = tokio::time::timeout(limit, lines.next_line())
        .await
        .with_context(|| format!("the {role} wrote nothing for {limit:?}"))?
        .with_context(|| format!("reading the {role}'s output"))?;
    if let Some(line) = line {
        return Ok(line);
    }
    // Its output closed: it is ending, or has ended.
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    match status {
        Ok(Ok(status)) => match std::os::unix::process::ExitStatusExt::signal(&status) {
            Some(number) => {
                let signal = nix::sys::signal::Signal::try_from(number)
                    .map_or_else(|_| format!("signal {number}"), |signal| signal.to_string());
                bail!("the {role} was killed ({signal})")
            }
            None => bail!("the {role} ended ({status}) without its report; its error is above"),
        },
        _ => bail!("the {role} closed its output without its report"),
    }
}

/// How many times a second one core copies `size` bytes with `memcpy` (`copy_from_slice`),
/// cycling through buffers of 64 MiB in all on each side (more than the caches hold, like the
/// blocks a stream of messages cycles through) for about 0.3 s after one warm-up pass. The
/// buffers are allocated fallibly: a size the memory cannot hold four times (two buffers a
/// side from 32 MiB on) is an error, not an abort.
fn memcpy_rate(size: usize) -> Result<f64> {
    const WORKING_SET: usize = 64 << 20;
    const MEASURE: Duration = Duration::from_millis(300);
    let n_buffers = (WORKING_SET / size).clamp(2, 64);
    let buffer = |fill: u8| -> Result<Vec<u8>> {
        let mut buffer = Vec::new();
        buffer.try_reserve_exact(size).with_context(|| {
            format!(
                "--touch: cannot allocate {} buffers of {size} bytes to measure memcpy",
                2 * n_buffers
            )
        })?;
        buffer.resize(size, fill);
        Ok(buffer)
    };
    let sources = (0..n_buffers)
        .map(|idx| buffer(idx as u8))
        .collect::<Result<Vec<_>>>()?;
    let mut targets = (0..n_buffers)
        .map(|_| buffer(0))
        .collect::<Result<Vec<_>>>()?;
    for (target, source) in targets.iter_mut().zip(&sources) {
        target.copy_from_slice(source);
    }
    let started = Instant::now();
    let mut n_copies = 0usize;
    while started.elapsed() < MEASURE {
        let target = n_copies % n_buffers;
        let source = (n_copies + 1) % n_buffers;
        targets[target].copy_from_slice(&sources[source]);
        std::hint::black_box(&targets[target]);
        n_copies += 1;
    }
    Ok(n_copies as f64 / started.elapsed().as_secs_f64())
}

/// Options of the hidden `bench-role` subcommand (one side of a pair).
#[derive(Debug, Clone, Args)]
pub struct RoleOptions {
    /// sender or receiver.
    pub role: String,
    #[arg(long)]
    transport: String,
    #[arg(long = "msg-size")]
    msg_size: usize,
    #[arg(long = "num-parts")]
    num_parts: usize,
    #[arg(long = "msg-rate")]
    msg_rate: f64,
    #[arg(long = "rate-burst-ms")]
    rate_burst_ms: u64,
    #[arg(long)]
    duration: f64,
    #[arg(long = "shm-segment-size")]
    shm_segment_size: u64,
    #[arg(long)]
    session: String,
    #[arg(long)]
    dir: std::path::PathBuf,
    /// Where the receiver bound: one address, or (a push/pull round trip) out and back.
    #[arg(long, num_args = 1..=2)]
    address: Vec<String>,
    #[arg(long = "same-msg")]
    same_msg: bool,
    #[arg(long)]
    touch: bool,
    #[arg(long)]
    latency: bool,
    #[arg(long = "push-pull")]
    push_pull: bool,
    #[arg(long)]
    pair: bool,
    #[arg(long = "pub-sub")]
    pub_sub: bool,
    #[arg(long = "busy-poll")]
    busy_poll: bool,
}

/// Runs one side of a pair; prints one JSON report line. A member whose bench dies stops,
/// and removes the pair's directory (its shared memory goes with its last process).
pub async fn run_role(options: RoleOptions) -> ExitCode {
    // The bench gives its pid: one killed before this process looked is noticed too.
    let bench = crate::run::launcher();
    let name = options.role.clone();
    let dir = options.dir.clone();
    // A task of its own, as a device's run is (`run.rs`), so that its receives wait as a
    // device's do: a busy-polled receive that wakes its own task takes a place in the run
    // queue, where the future the runtime blocks on would get a turn of the drivers instead.
    let mut task = tokio::spawn(async move { role(&options).await });
    let outcome = tokio::select! {
        outcome = &mut task => outcome,
        () = crate::run::launcher_gone(bench) => {
            // Its channels and transport closed before the directory goes.
            task.abort();
            let _ = task.await;
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!("ferromq bench {name}: the bench that started it is gone; stopped");
            return ExitCode::FAILURE;
        }
    };
    match outcome {
        Ok(Ok(report)) => {
            let line = serde_json::to_string(&report).expect("reports serialise");
            // Not `println!`, which panics when the bench's end of the pipe is closed.
            if let Err(error) = writeln!(std::io::stdout(), "{line}") {
                eprintln!("ferromq bench {name}: cannot hand in the report: {error}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Ok(Err(error)) => {
            eprintln!("ferromq bench {name}: {error:#}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("ferromq bench {name}: the role's task failed: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn role(options: &RoleOptions) -> Result<RoleReport> {
    let bench_options = BenchOptions {
        transport: vec![],
        msg_size: vec![],
        num_parts: options.num_parts,
        msg_rate: options.msg_rate,
        rate_burst_ms: Some(options.rate_burst_ms),
        duration: options.duration,
        same_msg: options.same_msg,
        touch: options.touch,
        latency: options.latency,
        push_pull: options.push_pull,
        pair: options.pair,
        pub_sub: options.pub_sub,
        busy_poll: options.busy_poll,
        json: true,
        shm_segment_size: Some(options.shm_segment_size),
        what: None,
    };
    let (transport, address) = transport_and_address(
        &options.transport,
        &options.dir,
        &options.session,
        &bench_options,
    )?;
    let warm_up = Duration::from_secs_f64((options.duration / 4.0).max(0.25));
    let measure = Duration::from_secs_f64(options.duration);
    let (receiver_type, sender_type) = match (options.latency, options.push_pull, options.pair) {
        (true, _, true) => (SocketType::Pair, SocketType::Pair),
        (true, false, false) => (SocketType::Rep, SocketType::Req),
        _ if options.pub_sub => (SocketType::Sub, SocketType::Pub),
        _ => (SocketType::Pull, SocketType::Push),
    };
    // Queues bounded in bytes too (about 256 MiB in flight), so big messages do not pile up
    // gigabytes that then take longer than the linger to drain.
    let message_bytes = (options.msg_size * options.num_parts).max(1);
    let queue = ((256 << 20) / message_bytes).clamp(4, 10_000);
    let config = |socket_type, method, address: &str| ChannelConfig {
        snd_buf_size: queue,
        rcv_buf_size: queue,
        linger: 60_000,
        rate_logging: 0,
        busy_poll: options.busy_poll,
        ..ChannelConfig::new("data", socket_type, method).with_address(address)
    };
    // A push/pull round trip comes back over a second channel, bound by the receiver too.
    let back_address = back_address(&address);
    if options.role == "receiver" {
        let mut channel = Channel::open(
            transport.as_ref(),
            config(receiver_type, Method::Bind, &address),
            "data",
        )
        .await?;
        let bound = channel.bind_configured().await?.for_local_connect();
        if options.pub_sub {
            channel.subscribe("").await?;
        }
        let mut back = None;
        if options.push_pull {
            let mut channel = Channel::open(
                transport.as_ref(),
                config(SocketType::Push, Method::Bind, &back_address),
                "back",
            )
            .await?;
            let back_bound = channel.bind_configured().await?.for_local_connect();
            println!("READY {bound} {back_bound}");
            back = Some(channel);
        } else {
            println!("READY {bound}");
        }
        let report = receive(&mut channel, back.as_mut(), options, warm_up).await?;
        // Close in order: the last reply leaves before the process does.
        if let Some(back) = &mut back {
            back.close().await?;
        }
        channel.close().await?;
        return Ok(report);
    }
    let (address, back_address) = match options.address.as_slice() {
        [address] => (address, None),
        [address, back] => (address, Some(back)),
        _ => bail!("the sender needs --address"),
    };
    let mut channel = Channel::open(
        transport.as_ref(),
        config(sender_type, Method::Connect, address),
        "data",
    )
    .await?;
    channel.connect_configured().await?;
    let mut back = match back_address {
        Some(back_address) => {
            let mut back = Channel::open(
                transport.as_ref(),
                config(SocketType::Pull, Method::Connect, back_address),
                "back",
            )
            .await?;
            back.connect_configured().await?;
            Some(back)
        }
        None => None,
    };
    let sent = send(
        &mut channel,
        back.as_mut(),
        transport.as_ref(),
        options,
        (warm_up, measure),
    )
    .await;
    if let Some(back) = &mut back {
        back.close().await?;
    }
    sent
}

async fn make_parts(
    transport: &dyn Transport,
    options: &RoleOptions,
    same: &Option<bytes::Bytes>,
    msg_idx: u64,
) -> Result<Parts> {
    let mut parts = Parts::new();
    for _ in 0..options.num_parts {
        let mut message = match same {
            Some(bytes) => Message::from(bytes.clone()),
            None => transport.new_message(options.msg_size).await?,
        };
        if options.touch {
            message.data_mut().fill(msg_idx as u8);
        }
        parts.push(message);
    }
    Ok(parts)
}

/// The end of the stream: a message with one more part than data messages have.
fn end_marker(options: &RoleOptions) -> Parts {
    (0..=options.num_parts).map(|_| Message::empty()).collect()
}

async fn send(
    channel: &mut Channel,
    mut back: Option<&mut Channel>,
    transport: &dyn Transport,
    options: &RoleOptions,
    (warm_up, measure): (Duration, Duration),
) -> Result<RoleReport> {
    // A transport with memory of its own sends from it; one shared heap buffer would be copied.
    let lends_memory = crate::built_in_transports()
        .traits(transport.name())
        .is_ok_and(|traits| traits.lends_shared_memory);
    let same = (options.same_msg && !lends_memory)
        .then(|| bytes::Bytes::from(vec![0u8; options.msg_size]));
    let mut pacer = ferromq_devices::Pacer::with_burst(
        options.msg_rate,
        std::time::Duration::from_millis(options.rate_burst_ms),
    );
    let started = Instant::now();
    let mut measure_start = None;
    let mut cpu_at_start = 0.0;
    let mut round_trips_us: Vec<f64> = Vec::new();
    let mut n_msgs = 0u64;
    let mut n_sent = 0u64;
    let mut elapsed = Duration::ZERO;
    loop {
        // Reading the clock per message cost 6% of a 64 B sender: look every 64 messages.
        if n_sent.is_multiple_of(64) || options.latency || options.msg_rate > 0.0 {
            elapsed = started.elapsed();
        }
        n_sent += 1;
        if elapsed >= warm_up + measure {
            break;
        }
        if measure_start.is_none() && elapsed >= warm_up {
            measure_start = Some(Instant::now());
            cpu_at_start = cpu_seconds();
            n_msgs = 0;
        }
        pacer.wait().await;
        let parts = make_parts(transport, options, &same, n_msgs).await?;
        let sent_at = Instant::now();
        channel
            .send_parts(parts)
            .await
            .map_err(|failed| failed.error)?;
        if options.latency {
            match back.as_deref_mut() {
                Some(back) => back.receive_parts().await?,
                None => channel.receive_parts().await?,
            };
            if measure_start.is_some() {
                round_trips_us.push(sent_at.elapsed().as_secs_f64() * 1e6);
            }
        }
        n_msgs += 1;
    }
    let seconds = measure_start.map_or(0.0, |start| start.elapsed().as_secs_f64());
    let cpu_percent = (cpu_seconds() - cpu_at_start) / seconds.max(1e-9) * 100.0;
    if options.latency {
        channel
            .send_parts(end_marker(options))
            .await
            .map_err(|failed| failed.error)?;
        match back {
            Some(back) => back.receive_parts().await?,
            None => channel.receive_parts().await?,
        };
    } else {
        // A publisher drops what a subscriber that is behind has no room for: the end marker
        // goes again until it was not dropped (over zeromq drops are not counted; the
        // subscriber's own time bound ends its run if the marker is lost).
        for _ in 0..1_000 {
            let dropped = channel.counters().snapshot().lost_slow_subscriber;
            channel
                .send_parts(end_marker(options))
                .await
                .map_err(|failed| failed.error)?;
            if !options.pub_sub || channel.counters().snapshot().lost_slow_subscriber == dropped {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    channel.close().await?;
    let latency_us = options.latency.then(|| percentiles(&mut round_trips_us));
    Ok(RoleReport {
        n_msgs,
        seconds,
        cpu_percent,
        latency_us,
    })
}

/// Reads every byte of `data` and folds them into a sum, eight at a time: a byte-by-byte sum
/// runs at a quarter of the memory's speed and would measure the loop, not the transport.
fn read_every_byte(data: &[u8]) -> u64 {
    let words = data.chunks_exact(8);
    let tail = words
        .remainder()
        .iter()
        .fold(0u64, |sum, &byte| sum.wrapping_add(u64::from(byte)));
    words.fold(tail, |sum, word| {
        let word: [u8; 8] = word.try_into().expect("chunks of eight");
        sum.wrapping_add(u64::from_le_bytes(word))
    })
}

/// Sends a round trip's message back: over `back` (push/pull) or the channel it came by (rep).
async fn answer(channel: &mut Channel, back: Option<&mut Channel>, parts: Parts) -> Result<()> {
    back.unwrap_or(channel)
        .send_parts(parts)
        .await
        .map_err(|failed| failed.error)?;
    Ok(())
}

fn percentiles(samples: &mut [f64]) -> [f64; 3] {
    if samples.is_empty() {
        return [0.0; 3];
    }
    samples.sort_by(f64::total_cmp);
    let at = |quantile: f64| {
        samples[((samples.len() as f64 * quantile) as usize).min(samples.len() - 1)]
    };
    [at(0.5), at(0.99), at(0.999)]
}

async fn receive(
    channel: &mut Channel,
    mut back: Option<&mut Channel>,
    options: &RoleOptions,
    warm_up: Duration,
) -> Result<RoleReport> {
    let mut first_at: Option<Instant> = None;
    let mut measure_start: Option<(Instant, f64)> = None;
    let mut n_msgs = 0u64;
    let mut digest = 0u64;
    // A subscriber whose end marker was dropped (zeromq's PUB drops without counting) ends
    // when the sender must have finished.
    let started = Instant::now();
    let run = warm_up + Duration::from_secs_f64(options.duration) + Duration::from_secs(3);
    let mut last_at = None;
    loop {
        let parts = if options.pub_sub {
            let ends_at = match first_at {
                Some(first) => first + run,
                None => started + Duration::from_secs(30),
            };
            let left = ends_at.saturating_duration_since(Instant::now());
            match channel.receive_parts_timeout(left).await {
                Ok(parts) => parts,
                // Measured up to the last message, not over the wait.
                Err(ferromq_core::Error::Timeout { .. }) => break,
                Err(error) => return Err(error.into()),
            }
        } else {
            channel.receive_parts().await?
        };
        if parts.len() == options.num_parts + 1 {
            if options.latency {
                answer(channel, back.as_deref_mut(), parts).await?;
            }
            break;
        }
        let now = Instant::now();
        last_at = Some(now);
        let first = *first_at.get_or_insert(now);
        if options.touch {
            for part in &parts {
                digest = digest.wrapping_add(read_every_byte(part.data()));
            }
        }
        if options.latency {
            answer(channel, back.as_deref_mut(), parts).await?;
        }
        if measure_start.is_none() && now.duration_since(first) >= warm_up {
            measure_start = Some((now, cpu_seconds()));
            n_msgs = 0;
        }
        n_msgs += 1;
    }
    let (start, cpu_at_start) = measure_start.unwrap_or((Instant::now(), cpu_seconds()));
    let ended = match (options.pub_sub, last_at) {
        (true, Some(last_at)) => last_at.max(start),
        _ => Instant::now(),
    };
    let seconds = ended.duration_since(start).as_secs_f64();
    let cpu_percent = (cpu_seconds() - cpu_at_start) / seconds.max(1e-9) * 100.0;
    std::hint::black_box(digest);
    Ok(RoleReport {
        n_msgs,
        seconds,
        cpu_percent,
        latency_us: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_every_byte_sums_what_a_byte_by_byte_sum_does() {
        // Lengths around the word size, so the tail is covered too.
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 1000] {
            let data: Vec<u8> = (0..len).map(|idx| (idx * 37 + 11) as u8).collect();
            let words = read_every_byte(&data);
            // The word sum equals the bytes weighted by their place in each word.
            let expected = data.chunks(8).fold(0u64, |sum, chunk| {
                let weighted = if chunk.len() == 8 {
                    u64::from_le_bytes(chunk.try_into().unwrap())
                } else {
                    chunk.iter().map(|&byte| u64::from(byte)).sum()
                };
                sum.wrapping_add(weighted)
            });
            assert_eq!(words, expected, "length {len}");
        }
        // A byte changed anywhere changes the sum: every byte is read.
        let mut data = vec![0u8; 100];
        let base = read_every_byte(&data);
        for idx in 0..data.len() {
            data[idx] = 1;
            assert_ne!(read_every_byte(&data), base, "byte {idx}");
            data[idx] = 0;
        }
    }
}
