//! `ferromq bench rpc`: remote invocation between two processes (like Seriema's Table 2).
//!
//! This process is the caller (one thread); a `bench-rpc-role` process is the destination,
//! whose handlers do nothing but count (the light load's record when each ran). Per transport, mode and call size, each round streams
//! calls for `--duration` through a `CallWriter` (one caller's own frame, as Seriema's threads
//! each have theirs; `--shared-frame`: through `Rpc::call`, under the outlet's lock per call;
//! `trad` and `ovfl` differ, a writer sends `send`'s calls through `Rpc::call`) and then asks
//! the destination how many it ran (so a call counts once its handler ran); then it measures `call_return` round trips one at a time (p50, p99) and
//! with 64 in flight (returns per second), calls' latency at 1% of the measured rate (or at
//! `--light-load-rate`, one rate for every mode, so that modes compare at the same load): one
//! way, from the call (made as the round streamed them) to its handler's start, on the host's
//! CLOCK_MONOTONIC stamped into the call's arguments; and
//! `call_buffer` of 4 KiB and 64 MiB until the handler ran (64 MiB twice: in memory new to the
//! destination, then in memory it has had buffers in). The rounds' medians are reported,
//! with min and max. The caller measures from a task, as a device's code runs (see
//! `run_round`).
//! MB/s counts the call's argument bytes only (`--call-size`), not frame or record headers.

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferromq_core::{Address, Transport};
use ferromq_rpc::{Aggregation, Confirm, Handlers, Inbound, Member, Procedure, Rpc, RpcOptions};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Options of `ferromq bench rpc`.
#[derive(Debug, Clone, Args)]
pub struct RpcBenchOptions {
    /// Transports: shmem, zeromq-ipc, zeromq-tcp.
    #[arg(long, value_delimiter = ',', default_value = "shmem,zeromq-ipc")]
    pub transport: Vec<String>,
    /// Bytes of arguments per call: 8, 64 or 256.
    #[arg(long = "call-size", value_delimiter = ',', default_value = "8,64,256")]
    pub call_size: Vec<usize>,
    /// send (one call per frame), trad, ovfl.
    #[arg(long, value_delimiter = ',', default_value = "send,trad,ovfl")]
    pub mode: Vec<String>,
    /// Seconds each round streams calls.
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true, value_parser = crate::options::bench_seconds)]
    pub duration: f64,
    /// Rounds per cell (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Sequential `call_return` round trips measured per round.
    #[arg(long = "round-trips", default_value_t = 2000)]
    pub round_trips: usize,
    /// Instead of calls: a broadcast to this many members (this process and N-1 others) until
    /// each ran the handler, against a call_return round trip to one of them (p50s of 200);
    /// 2 to 256. It measures one kind of call: not with --mode or --call-size.
    #[arg(long, default_value_t = 0, conflicts_with_all = ["mode", "call_size"])]
    pub broadcast: usize,
    /// Both ends spin on their inbound channels instead of sleeping (channel option busyPoll).
    #[arg(long = "busy-poll")]
    pub busy_poll: bool,
    /// Stream (and make the light load's calls) through `Rpc::call` (the destination's frame,
    /// shared by every task of the member, written under a lock per call) instead of a
    /// `CallWriter` (the caller's own
    /// frame, Seriema's per-thread buffer). `trad` and `ovfl` differ (an `ovfl` writer holds
    /// calls while the destination lags); a writer sends `send`'s calls through `Rpc::call`.
    #[arg(long = "shared-frame")]
    pub shared_frame: bool,
    /// shmem: every process locks its own segment and its peers' into memory (FairMQ's
    /// --shm-mlock-segment), so that no first look at a block costs a page fault.
    #[arg(long = "shm-mlock-segment")]
    pub shm_mlock_segment: bool,
    /// Calls per second of the light-load measurement, for every mode (default: 1% of the
    /// rate each mode streamed in the same round, which for an aggregating mode is several
    /// times the calls of unaggregated `send`'s 1%). A rate near or above a mode's streaming
    /// rate is no longer a light load: the calls then queue up.
    #[arg(long = "light-load-rate", value_name = "CALLS_PER_S", allow_hyphen_values = true, value_parser = crate::options::calls_per_second)]
    pub light_load_rate: Option<f64>,
    /// One JSON object per cell instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One cell: transport × mode × call size, medians over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RpcBenchResult {
    /// shmem, zeromq-ipc or zeromq-tcp.
    pub transport: String,
    /// send, trad or ovfl.
    pub mode: String,
    /// What the streamed and the light load's calls were made through: `writer` (a
    /// `CallWriter`, the default) or `rpc-call` (`Rpc::call`, `--shared-frame`). `trad` and
    /// `ovfl` differ between the two.
    #[serde(default)]
    pub calls_through: String,
    /// Bytes of arguments per call.
    pub call_size: usize,
    /// Calls run by the destination per second (median of the rounds).
    pub calls_per_s: f64,
    /// The slowest round.
    pub calls_per_s_min: f64,
    /// The fastest round.
    pub calls_per_s_max: f64,
    /// Argument bytes per second, in 10^6.
    pub mb_per_s: f64,
    /// Share of the calls' records that travelled in a frame with others.
    pub aggregated_share: f64,
    /// `call_return` round trips, one at a time, in microseconds.
    pub return_p50_us: f64,
    /// As `return_p50_us`, the 99th percentile.
    pub return_p99_us: f64,
    /// `call_return`s per second with 64 in flight.
    pub returns_per_s_64_in_flight: f64,
    /// A call's latency from the call until its handler ran (one way: stamped with the host's
    /// CLOCK_MONOTONIC at the call, read at the handler), p50 in microseconds, with calls made
    /// as the round streamed them, paced at `light_load_calls_per_s`. (Until 2026-12-07: through
    /// `Rpc::call`, until a `Consumed` ticket returned.)
    pub light_load_p50_us: f64,
    /// The rate of that measurement: 1% of the rate measured in the same round, or
    /// `--light-load-rate` (median over the rounds).
    #[serde(default)]
    pub light_load_calls_per_s: f64,
    /// `call_buffer` of 4 KiB until its handler ran, p50 in microseconds.
    pub buffer_4k_us: f64,
    /// `call_buffer` of 64 MiB (memory of the transport) until its handler ran, p50 in µs, in
    /// memory the destination has had buffers in before (as in a running pipeline, whose
    /// transport hands freed memory out again).
    pub buffer_64m_us: f64,
    /// As `buffer_64m_us`, in memory the destination has not touched yet: its first look at a
    /// block's header maps the page (a page fault, and page tables for a new 2 MiB range).
    #[serde(default)]
    pub buffer_64m_fresh_us: f64,
    /// Rounds measured.
    pub rounds: usize,
}

ferromq_rpc::procedures! {
    /// 8 bytes of arguments.
    Call8 = "bench-8": [u8; 8] => ();
    /// 64 bytes of arguments.
    Call64 = "bench-64": [[u8; 32]; 2] => ();
    /// 256 bytes of arguments.
    Call256 = "bench-256": [[u8; 32]; 8] => ();
    /// As [`Call8`], whose arguments are when the call was made (CLOCK_MONOTONIC, ns,
    /// little-endian: one clock for every process of the host): the destination records how
    /// long after that its handler ran, for the light-load measurement.
    Stamped8 = "bench-stamped-8": [u8; 8] => ();
    /// As [`Call64`], the first 8 bytes a stamp as [`Stamped8`]'s.
    Stamped64 = "bench-stamped-64": [[u8; 32]; 2] => ();
    /// As [`Call256`], the first 8 bytes a stamp as [`Stamped8`]'s.
    Stamped256 = "bench-stamped-256": [[u8; 32]; 8] => ();
    /// How many stamped calls the destination ran since the last ask, and the p50 of their
    /// latency in nanoseconds (0 when none); the record starts again.
    TakeLatencies = "bench-take-latencies": () => (u64, u64);
    /// How many calls the destination ran (and resets the count).
    TakeCount = "bench-take-count": () => u64;
    /// A round trip with 64 bytes each way.
    Echo = "bench-echo": [[u8; 32]; 2] => [[u8; 32]; 2];
    /// Takes a buffer (the handler runs once it is there in full).
    TakeBuffer = "bench-take-buffer": u64 => ();
    /// Nothing: for broadcasts and bare round trips.
    Ping = "bench-ping": () => ();
    /// Ends the destination.
    Quit = "bench-quit": () => ();
}

/// The destination's record of stamped calls' latencies (ns), kept by its handlers.
#[derive(Default)]
struct Latencies(std::sync::Mutex<Vec<u64>>);

impl Latencies {
    /// A stamped call ran now: its stamp is in the first 8 bytes of `args`.
    fn record(&self, args: &[u8]) {
        self.record_at(args, ferromq_shm::monotonic_ns());
    }

    /// A stamped call ran at `now_ns`; arguments too short for a stamp are not counted.
    fn record_at(&self, args: &[u8], now_ns: u64) {
        let Some(stamp) = args.first_chunk::<8>() else {
            return;
        };
        let latency = now_ns.saturating_sub(u64::from_le_bytes(*stamp));
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(latency);
    }

    /// How many were recorded and their p50 (ns); the record starts again.
    fn take(&self) -> (u64, u64) {
        let mut latencies = std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        latencies.sort_unstable();
        let p50 = latencies.get(latencies.len() / 2).copied().unwrap_or(0);
        (latencies.len() as u64, p50)
    }
}

fn aggregation(mode: &str) -> Result<Aggregation> {
    match mode {
        "send" | "none" => Ok(Aggregation::None),
        "trad" => Ok(Aggregation::Trad),
        "ovfl" => Ok(Aggregation::Ovfl),
        other => bail!("--mode {other:?}: the modes are send, trad and ovfl"),
    }
}

fn transport_and_address(
    name: &str,
    session: &str,
    member: usize,
    shm_mlock_segment: bool,
) -> Result<(Arc<dyn Transport>, Address)> {
    let transports = crate::built_in_transports();
    let mut options = ferromq_core::TransportOptions::for_session(session);
    if shm_mlock_segment {
        options
            .properties
            .insert("shm-mlock-segment".to_owned(), "true".to_owned());
    }
    Ok((
        transports.create(crate::bench::transport_kind(name, false)?, &options)?,
        Address::parse(
            &member_ipc_address(name, session, member)
                .unwrap_or_else(|| "tcp://127.0.0.1:0".to_owned()),
        )?,
    ))
}

/// Where member `member` of a group over transport `name` binds, where that is an ipc file in
/// the temp directory, named after the session; `None` for `zeromq-tcp`, which binds loopback
/// tcp.
fn member_ipc_address(name: &str, session: &str, member: usize) -> Option<String> {
    (name != "zeromq-tcp").then(|| {
        format!(
            "ipc://{}/ferromq-{session}-rpc-{member}.ipc",
            std::env::temp_dir().display()
        )
    })
}

/// The most members `--broadcast` starts: each one but this process is a process of its own.
const MAX_BROADCAST_MEMBERS: usize = 256;

/// The most `--round-trips` a round measures: their samples are kept (80 MB at this bound), and
/// 10 M round trips take minutes already. 99 999 999 999 aborted the bench allocating them.
const MAX_ROUND_TRIPS: usize = 10_000_000;

/// Refuses, before any process starts, what the bench cannot measure.
fn check_options(options: &RpcBenchOptions) -> Result<()> {
    for transport in &options.transport {
        crate::bench::transport_kind(transport, false)?;
    }
    if options.broadcast > 0 {
        if options.broadcast < 2 {
            bail!("--broadcast {}: at least 2 members", options.broadcast);
        }
        if options.broadcast > MAX_BROADCAST_MEMBERS {
            bail!(
                "--broadcast {}: at most {MAX_BROADCAST_MEMBERS} members (each one but this \
                 process is a process of its own)",
                options.broadcast
            );
        }
        return Ok(());
    }
    for &size in &options.call_size {
        if ![8, 64, 256].contains(&size) {
            bail!("--call-size {size}: the sizes measured are 8, 64 and 256 bytes");
        }
    }
    for mode in &options.mode {
        aggregation(mode)?;
    }
    if options.rounds == 0 {
        bail!("--rounds 0: at least one round is needed");
    }
    if options.round_trips == 0 {
        bail!("--round-trips 0: at least one round trip is needed for their p50 and p99");
    }
    if options.round_trips > MAX_ROUND_TRIPS {
        bail!(
            "--round-trips {}: at most {MAX_ROUND_TRIPS} (each one's time is kept for the p50 and p99)",
            options.round_trips
        );
    }
    Ok(())
}

/// The temp directory can hold the members' ipc files, as `ferromq bench` checks it for its
/// pairs' (a group over `zeromq-tcp` alone has none); `options` passed [`check_options`].
fn check_temp_dir(options: &RpcBenchOptions) -> Result<()> {
    let n_members = if options.broadcast > 0 {
        options.broadcast
    } else {
        2
    };
    let in_temp_dir: Vec<String> = options
        .transport
        .iter()
        .flat_map(|transport| {
            (0..n_members)
                .filter_map(move |member| member_ipc_address(transport, &session(), member))
        })
        .collect();
    if in_temp_dir.is_empty() {
        return Ok(());
    }
    crate::bench::check_temp_dir(in_temp_dir)
}

/// One broadcast measurement (`--broadcast N`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BroadcastResult {
    /// shmem, zeromq-ipc or zeromq-tcp.
    pub transport: String,
    /// Members reached, this process included.
    pub broadcast_members: usize,
    /// Until every member ran the handler, p50 in microseconds.
    pub broadcast_p50_us: f64,
    /// A call_return round trip to one member, p50 in microseconds.
    pub round_trip_p50_us: f64,
    /// The broadcast in round trips.
    pub round_trips: f64,
}

/// Measures a broadcast per transport, adding each result to `results` as it is measured.
async fn run_broadcasts(
    options: &RpcBenchOptions,
    results: &mut Vec<BroadcastResult>,
) -> Result<()> {
    check_options(options)?;
    for transport in &options.transport {
        let (broadcast, round_trip) = broadcast_round(options, transport, options.broadcast)
            .await
            .with_context(|| format!("{transport}, broadcast to {}", options.broadcast))?;
        results.push(BroadcastResult {
            transport: transport.clone(),
            broadcast_members: options.broadcast,
            broadcast_p50_us: broadcast,
            round_trip_p50_us: round_trip,
            round_trips: broadcast / round_trip.max(1e-9),
        });
    }
    Ok(())
}

/// Runs every cell and prints the results, those measured before a failure or a signal too; a
/// signal ends it as `ferromq bench` (see `bench.rs`'s module docs).
pub async fn run(options: RpcBenchOptions) -> ExitCode {
    // A usage error, with clap's code, as `ferromq bench` refuses its own.
    if let Err(error) = check_options(&options).and_then(|()| check_temp_dir(&options)) {
        eprintln!("ferromq bench rpc: {error:#}");
        return ExitCode::from(2);
    }
    let command = "ferromq bench rpc";
    if options.broadcast > 0 {
        return crate::bench::measure_to_the_end(
            command,
            &session(),
            async |results| run_broadcasts(&options, results).await,
            |out, results| {
                if options.json {
                    return crate::bench::write_json_lines(out, results);
                }
                for result in results {
                    writeln!(
                        out,
                        "{}: broadcast to {} members {:.1} µs p50, a round trip {:.1} µs: {:.1} round trips",
                        result.transport,
                        result.broadcast_members,
                        result.broadcast_p50_us,
                        result.round_trip_p50_us,
                        result.round_trips
                    )?;
                }
                Ok(())
            },
        )
        .await;
    }
    crate::bench::measure_to_the_end(
        command,
        &session(),
        async |results| run_all(&options, results).await,
        |out, results| {
            if options.json {
                crate::bench::write_json_lines(out, results)
            } else {
                print_table(out, results, options.light_load_rate)
            }
        },
    )
    .await
}

/// `@27k/s`, `@1.5M/s`, `@0.5/s`: a light-load rate in the table's header, at most 9 wide.
fn rate_label(rate: f64) -> String {
    if rate >= 1e7 {
        format!("@{:.0}M/s", rate / 1e6)
    } else if rate >= 1e6 {
        format!("@{:.1}M/s", rate / 1e6)
    } else if rate >= 1e3 {
        format!("@{:.0}k/s", rate / 1e3)
    } else {
        format!("@{rate:.1}/s")
    }
}

/// The table; `light_load_rate`: the rate the light-load column was measured at, when one was
/// given (the column's header says it; 1% of each row's rate otherwise).
fn print_table(
    out: &mut dyn std::io::Write,
    results: &[RpcBenchResult],
    light_load_rate: Option<f64>,
) -> std::io::Result<()> {
    let light_load = light_load_rate.map_or_else(|| "1%-load".to_owned(), rate_label);
    writeln!(
        out,
        "{:<11} {:<5} {:>5} {:>12} {:>21} {:>8} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "transport",
        "mode",
        "bytes",
        "calls/s",
        "(min-max)",
        "MB/s",
        "aggr",
        "rt p50",
        "rt p99",
        "rt/s @64",
        light_load,
        "buf 4K",
        "buf 64M",
        "64M new"
    )?;
    for result in results {
        writeln!(
            out,
            "{:<11} {:<5} {:>5} {:>12.0} {:>21} {:>8.1} {:>4.0}% {:>7.1}µs {:>7.1}µs {:>9.0} {:>7.1}µs {:>7.0}µs {:>8.0}µs {:>8.0}µs",
            result.transport,
            result.mode,
            result.call_size,
            result.calls_per_s,
            format!(
                "({:.0}-{:.0})",
                result.calls_per_s_min, result.calls_per_s_max
            ),
            result.mb_per_s,
            result.aggregated_share * 100.0,
            result.return_p50_us,
            result.return_p99_us,
            result.returns_per_s_64_in_flight,
            result.light_load_p50_us,
            result.buffer_4k_us,
            result.buffer_64m_us,
            result.buffer_64m_fresh_us,
        )?;
    }
    Ok(())
}

/// Measures every cell, adding each one's result to `results` as its rounds end.
async fn run_all(options: &RpcBenchOptions, results: &mut Vec<RpcBenchResult>) -> Result<()> {
    check_options(options)?;
    for transport in &options.transport {
        for mode in &options.mode {
            let aggregation = aggregation(mode)?;
            for &size in &options.call_size {
                let mut rounds = Vec::new();
                for round in 1..=options.rounds {
                    let label = format!(
                        "{transport}, {mode}, {size} B, round {round} of {}",
                        options.rounds
                    );
                    rounds.push(
                        run_round(options, transport, aggregation, size, &label)
                            .await
                            .with_context(|| format!("{transport}, {mode}, {size} B"))?,
                    );
                }
                let mut label = transport.clone();
                if options.busy_poll {
                    label.push_str("+busy-poll");
                }
                if options.shm_mlock_segment {
                    label.push_str("+mlock");
                }
                let mut result = summarise(&label, mode, size, &mut rounds);
                result.calls_through = if options.shared_frame {
                    "rpc-call"
                } else {
                    "writer"
                }
                .to_owned();
                results.push(result);
            }
        }
    }
    Ok(())
}

struct Round {
    calls_per_s: f64,
    aggregated_share: f64,
    p50_us: f64,
    p99_us: f64,
    returns_per_s: f64,
    light_load_p50_us: f64,
    light_load_calls_per_s: f64,
    buffer_4k_us: f64,
    buffer_64m_us: f64,
    buffer_64m_fresh_us: f64,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn summarise(transport: &str, mode: &str, size: usize, rounds: &mut [Round]) -> RpcBenchResult {
    let mut rates: Vec<f64> = rounds.iter().map(|round| round.calls_per_s).collect();
    let calls_per_s = median(&mut rates);
    let pick = |value: fn(&Round) -> f64| median(&mut rounds.iter().map(value).collect::<Vec<_>>());
    RpcBenchResult {
        transport: transport.to_owned(),
        mode: mode.to_owned(),
        calls_through: String::new(),
        call_size: size,
        calls_per_s,
        calls_per_s_min: rates[0],
        calls_per_s_max: rates[rates.len() - 1],
        mb_per_s: calls_per_s * size as f64 / 1e6,
        aggregated_share: pick(|round| round.aggregated_share),
        return_p50_us: pick(|round| round.p50_us),
        return_p99_us: pick(|round| round.p99_us),
        returns_per_s_64_in_flight: pick(|round| round.returns_per_s),
        light_load_p50_us: pick(|round| round.light_load_p50_us),
        light_load_calls_per_s: pick(|round| round.light_load_calls_per_s),
        buffer_4k_us: pick(|round| round.buffer_4k_us),
        buffer_64m_us: pick(|round| round.buffer_64m_us),
        buffer_64m_fresh_us: pick(|round| round.buffer_64m_fresh_us),
        rounds: rounds.len(),
    }
}

fn rpc_options(aggregation: Aggregation, busy_poll: bool) -> RpcOptions {
    RpcOptions {
        aggregation,
        timeout: Duration::from_secs(30),
        busy_poll,
        ..RpcOptions::default()
    }
}

/// A group for one round: this process is member 0, `n_members - 1` role processes the rest.
struct Group {
    rpc: Rpc,
    lender: Arc<dyn Transport>,
    roles: Vec<tokio::process::Child>,
    session: String,
}

/// The session this bench's members share, and the start of their files' names.
fn session() -> String {
    format!("bench-rpc-{}", std::process::id())
}

async fn start_group(
    options: &RpcBenchOptions,
    transport_name: &str,
    aggregation: Aggregation,
    n_members: usize,
) -> Result<Group> {
    let session = session();
    let mut roles = Vec::new();
    let mut addresses = Vec::new();
    for me in 1..n_members {
        let mut role = tokio::process::Command::new(std::env::current_exe()?)
            .args([
                "bench-rpc-role",
                "--transport",
                transport_name,
                "--session",
                &session,
            ])
            .args(["--mode", &aggregation.to_string(), "--me", &me.to_string()])
            .args(options.busy_poll.then_some("--busy-poll"))
            .args(options.shm_mlock_segment.then_some("--shm-mlock-segment"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env(crate::run::LAUNCHER_PID_ENV, std::process::id().to_string())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(role.stdout.take().context("stdout")?).lines();
        let bound = crate::bench::role_line(
            &format!("destination {me}"),
            &mut role,
            &mut lines,
            Duration::from_secs(30),
        )
        .await
        .context("a destination never bound")?;
        let address = bound
            .strip_prefix("bound ")
            .with_context(|| format!("destination {me} said {bound:?}, not its address"))?;
        addresses.push(Address::parse(address)?);
        roles.push(role);
    }
    let (transport, address) =
        transport_and_address(transport_name, &session, 0, options.shm_mlock_segment)?;
    let rpc_options = rpc_options(aggregation, options.busy_poll);
    let inbound = Inbound::bind_with(transport.as_ref(), &address, &rpc_options).await?;
    addresses.insert(0, inbound.address().clone());
    let list = addresses
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    for role in &mut roles {
        let stdin = role.stdin.as_mut().context("stdin")?;
        stdin
            .write_all(format!("members {list}\n").as_bytes())
            .await?;
        stdin.flush().await?;
    }
    let handlers = Handlers::new().on_sync::<Ping, _>(|_, ()| ());
    let rpc = Rpc::start(
        Arc::clone(&transport),
        0,
        &members(&addresses),
        inbound,
        handlers,
        rpc_options,
    )
    .await?;
    Ok(Group {
        rpc,
        lender: transport,
        roles,
        session,
    })
}

impl Group {
    /// Every role quits and must exit 0; the session's shared memory and files are removed in
    /// any case.
    async fn stop(self) -> Result<()> {
        let Group {
            rpc,
            lender,
            mut roles,
            session,
        } = self;
        let outcome = async {
            for member in 1..=roles.len() {
                rpc.call_return::<Quit>(member, &()).await?;
            }
            rpc.shutdown().await?;
            for role in &mut roles {
                let status = tokio::time::timeout(Duration::from_secs(30), role.wait()).await??;
                if !status.success() {
                    bail!("a destination exited with {status}");
                }
            }
            Ok(())
        }
        .await;
        // This process's own shared memory goes first: while this process holds it, the
        // session's watchdog rightly stays, and the cleanup would wait its whole 5 s for it
        // after every round.
        drop((rpc, lender));
        crate::bench::clean_up_after(&session).await;
        outcome
    }
}

fn members(addresses: &[Address]) -> Vec<Member> {
    addresses
        .iter()
        .enumerate()
        .map(|(idx, address)| Member {
            name: if idx == 0 {
                "caller".to_owned()
            } else {
                format!("destination-{idx}")
            },
            address: address.clone(),
        })
        .collect()
}

async fn run_round(
    options: &RpcBenchOptions,
    transport_name: &str,
    aggregation: Aggregation,
    size: usize,
    label: &str,
) -> Result<Round> {
    let group = start_group(options, transport_name, aggregation, 2).await?;
    eprintln!("ferromq bench rpc: {label}: measuring");
    // In a task of its own, as a device's code runs (`ferromq run` spawns the device): a
    // result that wakes a current-thread runtime's `block_on` future costs an eventfd write
    // and an I/O driver turn, ~2 us more per busy-polled round trip than waking a task.
    let measured = {
        let (options, rpc, lender) = (
            options.clone(),
            group.rpc.clone(),
            Arc::clone(&group.lender),
        );
        tokio::spawn(async move { measure(&options, &rpc, lender.as_ref(), size).await })
            .await
            .map_err(anyhow::Error::from)
            .and_then(|measured| measured)
    };
    let stopped = group.stop().await;
    let round = measured?;
    stopped?;
    Ok(round)
}

/// A broadcast to `n_members` (this process and `n_members - 1` others), until every member ran
/// the handler, against a `call_return` round trip to one member: p50s over 200 of each.
async fn broadcast_round(
    options: &RpcBenchOptions,
    transport_name: &str,
    n_members: usize,
) -> Result<(f64, f64)> {
    let group = start_group(options, transport_name, Aggregation::Ovfl, n_members).await?;
    eprintln!("ferromq bench rpc: {transport_name}, broadcast to {n_members} members: measuring");
    let measured = async {
        let rpc = &group.rpc;
        let (mut broadcasts, mut round_trips) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            let sent_at = Instant::now();
            rpc.broadcast::<Ping>(&()).await?.confirmed().await?;
            broadcasts.push(sent_at.elapsed().as_secs_f64() * 1e6);
            let sent_at = Instant::now();
            rpc.call_return::<Ping>(1, &()).await?;
            round_trips.push(sent_at.elapsed().as_secs_f64() * 1e6);
        }
        Ok::<_, anyhow::Error>((median(&mut broadcasts), median(&mut round_trips)))
    }
    .await;
    let stopped = group.stop().await;
    let measured = measured?;
    stopped?;
    Ok(measured)
}

/// Calls `P` at member 1 for `duration` through `Rpc::call` (`--shared-frame`); how many.
async fn stream<P: Procedure>(rpc: &Rpc, args: &P::Args, duration: Duration) -> Result<u64> {
    let started = Instant::now();
    let mut n_calls = 0u64;
    loop {
        for _ in 0..256 {
            rpc.call::<P>(1, args).await?;
        }
        n_calls += 256;
        if started.elapsed() >= duration {
            return Ok(n_calls);
        }
    }
}

/// Calls `P` at member 1 for `duration` through a `CallWriter`; how many. What the writer
/// holds at the end is flushed before the count.
async fn stream_written<P: Procedure>(
    rpc: &Rpc,
    args: &P::Args,
    duration: Duration,
) -> Result<u64> {
    let started = Instant::now();
    let mut n_calls = 0u64;
    let mut writer = rpc.writer(1)?;
    loop {
        for _ in 0..256 {
            writer.call::<P>(args).await?;
        }
        n_calls += 256;
        if started.elapsed() >= duration {
            writer.flush().await?;
            return Ok(n_calls);
        }
    }
}

async fn measure(
    options: &RpcBenchOptions,
    rpc: &Rpc,
    transport: &dyn Transport,
    size: usize,
) -> Result<Round> {
    let duration = Duration::from_secs_f64(options.duration);
    // Warm-up: connections made, memory touched.
    stream::<Call8>(rpc, &[1; 8], duration / 4).await?;
    rpc.call_return::<TakeCount>(1, &()).await?;
    let before = rpc.stats();
    let started = Instant::now();
    let n_sent = match (size, options.shared_frame) {
        (8, true) => stream::<Call8>(rpc, &[7; 8], duration).await?,
        (64, true) => stream::<Call64>(rpc, &[[7; 32]; 2], duration).await?,
        (_, true) => stream::<Call256>(rpc, &[[7; 32]; 8], duration).await?,
        (8, false) => stream_written::<Call8>(rpc, &[7; 8], duration).await?,
        (64, false) => stream_written::<Call64>(rpc, &[[7; 32]; 2], duration).await?,
        (_, false) => stream_written::<Call256>(rpc, &[[7; 32]; 8], duration).await?,
    };
    let n_run = rpc.call_return::<TakeCount>(1, &()).await?;
    let seconds = started.elapsed().as_secs_f64();
    if n_run != n_sent {
        bail!("{n_sent} calls made, the destination ran {n_run}");
    }
    let after = rpc.stats();
    let records = (after.records - before.records).max(1);
    let aggregated_share =
        (after.aggregated_records - before.aggregated_records) as f64 / records as f64;

    let mut round_trips = Vec::with_capacity(options.round_trips);
    for _ in 0..options.round_trips {
        let sent_at = Instant::now();
        rpc.call_return::<Echo>(1, &[[3; 32]; 2]).await?;
        round_trips.push(sent_at.elapsed().as_secs_f64() * 1e6);
    }
    round_trips.sort_by(f64::total_cmp);
    let at = |share: f64| {
        round_trips
            .get(
                ((round_trips.len() as f64 * share) as usize)
                    .min(round_trips.len().saturating_sub(1)),
            )
            .copied()
            .unwrap_or(0.0)
    };

    let in_flight_started = Instant::now();
    let n_returns = 64 * 200;
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    let mut n_done = 0;
    let mut n_started = 0;
    use futures_util::StreamExt as _;
    while n_done < n_returns {
        while n_started < n_returns && in_flight.len() < 64 {
            in_flight.push(rpc.call_return::<Echo>(1, &[[5; 32]; 2]));
            n_started += 1;
        }
        if let Some(result) = in_flight.next().await {
            result?;
            n_done += 1;
        }
    }
    let returns_per_s = n_returns as f64 / in_flight_started.elapsed().as_secs_f64();
    let calls_per_s = n_sent as f64 / seconds;
    let light_load_calls_per_s = options.light_load_rate.unwrap_or(calls_per_s / 100.0);
    let light_load_p50_us =
        light_load(rpc, size, light_load_calls_per_s, options.shared_frame).await?;
    let buffer_4k_us = buffer_calls(rpc, transport, 4 << 10, 20).await?;
    // First in memory the destination has not seen, then (the freed blocks handed out again)
    // in memory it has: a first look at a block's header costs the destination a page fault
    // (~5 µs on this project's AMD EPYC machine for a read, ~2.7 µs since a large block's
    // header is first touched by a write), which a running pipeline, reusing its memory, pays
    // once.
    let buffer_64m_fresh_us = buffer_calls(rpc, transport, 64 << 20, 10).await?;
    let buffer_64m_us = buffer_calls(rpc, transport, 64 << 20, 10).await?;
    Ok(Round {
        light_load_p50_us,
        light_load_calls_per_s,
        buffer_4k_us,
        buffer_64m_us,
        buffer_64m_fresh_us,
        calls_per_s: n_sent as f64 / seconds,
        aggregated_share,
        p50_us: at(0.5),
        p99_us: at(0.99),
        returns_per_s,
    })
}

/// The p50 of calls' latency from the call until their handler ran, `rate` calls per second
/// for 0.5 s, evenly spaced, made as the round streamed them (through a `CallWriter`, or
/// `Rpc::call` with `--shared-frame`): a light load of the path whose rate it is a share of.
/// Each call carries when it was made (CLOCK_MONOTONIC), and the destination records how long
/// after that its handler ran: one way, on one clock. A `trad` writer has no timer: it looks
/// at `aggregate-us` on calls, so a held call leaves with the first call made after that much
/// passed (or at the flush that ends the load), and `trad`'s figure is `aggregate-us` plus up
/// to one gap between calls. (Until 2026-12-07 the calls went
/// through `Rpc::call` with a `Consumed` ticket whatever the mode, timed to the ticket's
/// return: at 1 % of a writer's `trad` rate that was a quarter of what the ticketed path
/// carries at 8 B, no light load.)
async fn light_load(rpc: &Rpc, size: usize, rate: f64, shared_frame: bool) -> Result<f64> {
    let started = Instant::now();
    let mut n_sent = 0u64;
    let mut writer = if shared_frame {
        None
    } else {
        Some(rpc.writer(1)?)
    };
    // Each call when it is due, evenly spaced: tokio's millisecond timers would send them in a
    // burst per millisecond (at 1% of 12 M calls/s, 124 at once), which is not 1% load and
    // which `ovfl` then rightly packs. The caller looks at the clock between calls, yielding to
    // the member's tasks. Slot k is due k / rate after the start; a caller held up past several
    // slots (descheduled) skips the ones it missed instead of sending them back to back, which
    // would be a burst, not a light load.
    let mut next_slot = 0f64;
    while started.elapsed() < Duration::from_millis(500) {
        let slots_due = started.elapsed().as_secs_f64() * rate;
        if slots_due < next_slot {
            tokio::task::yield_now().await;
            continue;
        }
        next_slot = slots_due.floor() + 1.0;
        n_sent += 1;
        let stamp = ferromq_shm::monotonic_ns().to_le_bytes();
        match (size, writer.as_mut()) {
            (8, Some(writer)) => writer.call::<Stamped8>(&stamp).await?,
            (8, None) => rpc.call::<Stamped8>(1, &stamp).await?,
            (64, writer) => {
                let mut args = [[7; 32]; 2];
                args[0][..8].copy_from_slice(&stamp);
                match writer {
                    Some(writer) => writer.call::<Stamped64>(&args).await?,
                    None => rpc.call::<Stamped64>(1, &args).await?,
                }
            }
            (_, writer) => {
                let mut args = [[7; 32]; 8];
                args[0][..8].copy_from_slice(&stamp);
                match writer {
                    Some(writer) => writer.call::<Stamped256>(&args).await?,
                    None => rpc.call::<Stamped256>(1, &args).await?,
                }
            }
        }
    }
    match writer.as_mut() {
        Some(writer) => writer.flush().await?,
        None => rpc.flush().await?,
    }
    drop(writer);
    let (n_run, p50_ns) = rpc.call_return::<TakeLatencies>(1, &()).await?;
    if n_run != n_sent {
        bail!("{n_sent} light-load calls made, the destination ran {n_run}");
    }
    Ok(p50_ns as f64 / 1e3)
}

/// The p50 time of `call_buffer` with a buffer of `size` bytes made by the transport, until the
/// handler ran (the buffers are all made and written before the first call, not timed).
async fn buffer_calls(
    rpc: &Rpc,
    transport: &dyn Transport,
    size: usize,
    n_calls: usize,
) -> Result<f64> {
    // Every buffer made and written before the first call: writing 64 MiB right before a call
    // left the caches cold and the destination asleep for the call that followed, whatever its
    // size (a 4 KiB call after such a write took as long as a 64 MiB one: ~200-280 µs, 44-47
    // busy-polled, against 13-16 and 12). Made ahead, both sizes are timed alike.
    let mut buffers = Vec::with_capacity(n_calls);
    for _ in 0..n_calls {
        let mut buffer = transport.new_message(size).await?;
        buffer.data_mut().fill(1);
        buffers.push(buffer);
    }
    let mut times = Vec::with_capacity(n_calls);
    for buffer in buffers {
        let sent_at = Instant::now();
        rpc.to(1)
            .confirm(Confirm::Consumed)
            .call_buffer::<TakeBuffer>(&(size as u64), buffer)
            .await?
            .confirmed()
            .await?;
        times.push(sent_at.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut times))
}

/// Options of the hidden `bench-rpc-role` subcommand (the destination of `ferromq bench rpc`).
#[derive(Debug, Clone, Args)]
pub struct RpcRoleOptions {
    #[arg(long)]
    transport: String,
    #[arg(long)]
    session: String,
    #[arg(long)]
    mode: String,
    /// This role's member index (1..).
    #[arg(long, default_value_t = 1)]
    me: usize,
    #[arg(long = "busy-poll")]
    busy_poll: bool,
    #[arg(long = "shm-mlock-segment")]
    shm_mlock_segment: bool,
}

/// The destination: binds, learns the caller's address on stdin, counts calls (and records the
/// light load's latencies) until told to quit.
pub async fn run_role(options: RpcRoleOptions) -> ExitCode {
    match role(&options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ferromq bench-rpc-role: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The destination's empty handler: counts the call. A member runs its handlers one at a time
/// on its dispatcher, so the count needs no locked add (`fetch_add` was a tenth of the
/// destination's work at 8-byte calls, perf); `TakeCount`, served there too, reads it.
fn count_call(count: &AtomicU64) {
    count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

async fn role(options: &RpcRoleOptions) -> Result<()> {
    // The bench that started this process (it gives its pid), read first: read once the group
    // runs, a bench killed meanwhile had already left it to init, and the change was never seen.
    let bench = crate::run::launcher();
    let aggregation = aggregation(&options.mode)?;
    let (transport, address) = transport_and_address(
        &options.transport,
        &options.session,
        options.me,
        options.shm_mlock_segment,
    )?;
    let rpc_options = rpc_options(aggregation, options.busy_poll);
    let inbound = Inbound::bind_with(transport.as_ref(), &address, &rpc_options).await?;
    println!("bound {}", inbound.address());
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await??;
    let addresses = line
        .trim_end()
        .strip_prefix("members ")
        .context("no member list on stdin")?
        .split(' ')
        .map(Address::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let members = members(&addresses);
    let count = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Latencies::default());
    let quit = Arc::new(tokio::sync::Notify::new());
    let handlers = {
        let (c8, c64, c256, take, quit) = (
            Arc::clone(&count),
            Arc::clone(&count),
            Arc::clone(&count),
            Arc::clone(&count),
            Arc::clone(&quit),
        );
        Handlers::new()
            .on_sync::<Call8, _>(move |_, _| count_call(&c8))
            .on_sync::<Call64, _>(move |_, _| count_call(&c64))
            .on_sync::<Call256, _>(move |_, _| count_call(&c256))
            .on_sync::<TakeCount, _>(move |_, ()| take.swap(0, Ordering::Relaxed))
            .on_sync::<Stamped8, _>({
                let latencies = Arc::clone(&latencies);
                move |_, args| latencies.record(&args)
            })
            .on_sync::<Stamped64, _>({
                let latencies = Arc::clone(&latencies);
                move |_, args| latencies.record(&args[0])
            })
            .on_sync::<Stamped256, _>({
                let latencies = Arc::clone(&latencies);
                move |_, args| latencies.record(&args[0])
            })
            .on_sync::<TakeLatencies, _>(move |_, ()| latencies.take())
            .on_sync::<Echo, _>(|_, args| args)
            .on_sync::<Ping, _>(|_, ()| ())
            .on_buffer_sync::<TakeBuffer, _>(|_, len, buffer: ferromq_core::Message| {
                debug_assert_eq!(buffer.len() as u64, len);
            })
            .on::<Quit, _, _>(move |_, ()| {
                quit.notify_one();
                std::future::ready(())
            })
    };
    let rpc = Rpc::start(
        transport,
        options.me,
        &members,
        inbound,
        handlers,
        rpc_options,
    )
    .await?;
    // A bench that dies (a signal, an abort) cannot send `Quit`: the destination would serve
    // an empty group for ever, orphaned. Its parent changing says so.
    tokio::select! {
        () = quit.notified() => {}
        () = crate::run::launcher_gone(bench) => {
            bail!("the bench that started this destination is gone")
        }
    }
    rpc.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The destination's record: each stamped call's latency from the stamp in its first 8
    /// bytes; arguments too short for a stamp are not counted; a take gives the count and the
    /// p50 and starts again.
    #[test]
    fn latencies_are_measured_from_the_stamp_and_taken_once() {
        let latencies = Latencies::default();
        let now_ns = 50_000;
        for stamp_ns in [49_000u64, 47_000, 48_000] {
            latencies.record_at(&stamp_ns.to_le_bytes(), now_ns);
        }
        latencies.record_at(&[1, 2, 3], now_ns);
        assert_eq!(latencies.take(), (3, 2_000));
        assert_eq!(latencies.take(), (0, 0));
    }

    #[test]
    fn a_light_load_rate_label_fits_its_column() {
        for (rate, label) in [
            (0.5, "@0.5/s"),
            (27_000.0, "@27k/s"),
            (135_000.0, "@135k/s"),
            (1.5e6, "@1.5M/s"),
            (1e9, "@1000M/s"),
        ] {
            assert_eq!(rate_label(rate), label);
        }
        for rate in [
            999.96,
            999_999.0,
            9_999_999.0,
            crate::options::MAX_CALLS_PER_SECOND,
        ] {
            assert!(
                rate_label(rate).chars().count() <= 9,
                "{}",
                rate_label(rate)
            );
        }
    }
}
