//! `ferromq bench` as a smoke test: every transport reports, in both modes. No speed is asserted.

use std::os::unix::process::CommandExt as _;

/// A message larger than any address space (4e18 bytes), which no machine can allocate.
const UNALLOCATABLE: &str = "4000000000000000000";

/// The JSON objects a successful `--json` run printed, one a line.
fn json_lines(output: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("json"))
        .collect()
}

/// `ferromq bench --json ARGS`, half a second a pair, shmem in a 256 MiB segment: the result
/// lines.
fn bench_json(args: &[&str]) -> Vec<serde_json::Value> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["bench", "--json", "--duration", "0.5"])
        .args(["--shm-segment-size", "268435456"])
        .args(args)
        .output()
        .expect("run ferromq bench");
    json_lines(&output)
}

/// `ferromq bench --json ARGS` over every transport at 64 B and 64 KiB, half a second each:
/// the six results, each labelled with `suffix`.
fn every_transport(args: &[&str], suffix: &str) -> Vec<serde_json::Value> {
    let mut all_args = vec![
        "--msg-size",
        "64,65536",
        "--transport",
        "shmem,zeromq-ipc,zeromq-tcp",
    ];
    all_args.extend_from_slice(args);
    let lines = bench_json(&all_args);
    assert_eq!(lines.len(), 6, "{lines:?}");
    for line in &lines {
        assert!(
            line["transport"].as_str().unwrap().ends_with(suffix),
            "{line}"
        );
    }
    lines
}

/// `ferromq ARGS` is refused as a usage error (exit 2) whose message names `names`.
fn refused_naming(args: &[&str], names: &str) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(args)
        .output()
        .expect("run ferromq bench");
    assert_eq!(output.status.code(), Some(2), "{args:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(names),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn bench_reports_for_every_transport() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "bench",
            "--json",
            "--duration",
            "1",
            "--transport",
            "shmem,zeromq-ipc,zeromq-tcp",
            "--msg-size",
            "64,65536",
        ])
        .args(["--shm-segment-size", "268435456"])
        .output()
        .expect("run ferromq bench");
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 6);
    for line in &lines {
        assert!(line["msgs_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["sender_cpu"].as_f64().unwrap() > 0.0, "{line}");
    }
}

/// A paced run sends at its rate and reports the rate and its burst; an unpaced one reports
/// no burst.
#[test]
fn a_paced_bench_reports_its_rate_and_burst() {
    let shmem_64 = ["--transport", "shmem", "--msg-size", "64"];
    for (extra, burst) in [(&[][..], 5), (&["--rate-burst-ms", "20"][..], 20)] {
        let mut args = vec!["--msg-rate", "2000"];
        args.extend_from_slice(&shmem_64);
        args.extend_from_slice(extra);
        let lines = bench_json(&args);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert_eq!(line["msg_rate"].as_f64(), Some(2000.0), "{line}");
        assert_eq!(line["rate_burst_ms"].as_u64(), Some(burst), "{line}");
        // Paced, not flat out (millions a second): no speed is asserted, only the pace's cap.
        let rate = line["msgs_per_s"].as_f64().unwrap();
        assert!(rate > 0.0 && rate < 20_000.0, "{line}");
    }
    let unpaced = bench_json(&shmem_64);
    assert_eq!(unpaced.len(), 1, "{unpaced:?}");
    assert!(unpaced[0].get("rate_burst_ms").is_none(), "{}", unpaced[0]);
}

/// `--pub-sub` publishes to one subscriber: every transport reports what its subscriber
/// received, labelled so; it excludes `--latency` (nothing comes back).
#[test]
fn bench_pub_sub_reports_what_the_subscriber_received() {
    for line in every_transport(&["--pub-sub"], "+pub-sub") {
        assert!(line["msgs_per_s"].as_f64().unwrap() > 0.0, "{line}");
    }
    refused_naming(&["bench", "--pub-sub", "--latency"], "--latency");
}

#[test]
fn bench_touch_mode_reports_the_memcpy_bound_beside_the_rate() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["bench", "--json", "--touch", "--duration", "1"])
        .args(["--transport", "shmem", "--msg-size", "65536"])
        .args(["--shm-segment-size", "268435456"])
        .output()
        .expect("run ferromq bench");
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0]["msgs_per_s"].as_f64().unwrap() > 0.0,
        "{}",
        lines[0]
    );
    assert!(
        lines[0]["memcpy_msgs_per_s"].as_f64().unwrap() > 0.0,
        "{}",
        lines[0]
    );
    // Without --touch there is no bound to report.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["bench", "--json", "--duration", "0.5"])
        .args(["--transport", "zeromq-ipc", "--msg-size", "64"])
        .output()
        .expect("run ferromq bench");
    let lines = json_lines(&output);
    assert!(lines[0].get("memcpy_msgs_per_s").is_none(), "{}", lines[0]);
}

#[test]
fn bench_latency_mode_reports_percentiles() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "bench",
            "--json",
            "--latency",
            "--duration",
            "1",
            "--transport",
            "shmem,zeromq-ipc",
            "--msg-size",
            "64",
        ])
        .args(["--shm-segment-size", "268435456"])
        .output()
        .expect("run ferromq bench");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let value: serde_json::Value = serde_json::from_str(line).expect("json");
        assert_ordered_percentiles(&value);
    }
}

/// A latency result's p50, p99 and p99.9: positive and in order.
fn assert_ordered_percentiles(value: &serde_json::Value) {
    let percentiles = value["latency_us"].as_array().expect("percentiles");
    let [p50, p99, p999] = [0, 1, 2].map(|idx| percentiles[idx].as_f64().unwrap());
    assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{value}");
}

/// Runs `ferromq bench --latency FLAG` over every transport at two sizes: each result is
/// labelled with `suffix` and has ordered percentiles.
fn latency_mode_reports_percentiles(flag: &str, suffix: &str) {
    for value in every_transport(&["--latency", flag], suffix) {
        assert_ordered_percentiles(&value);
    }
}

/// `--pair` measures the round trip out and back over one pair channel (shmem: a descriptor
/// ring each way), for every transport; it needs `--latency` and excludes `--push-pull`.
#[test]
fn bench_latency_over_pair_reports_percentiles() {
    latency_mode_reports_percentiles("--pair", "+pair");
    refused_naming(&["bench", "--pair"], "--latency");
    refused_naming(
        &["bench", "--latency", "--pair", "--push-pull"],
        "--push-pull",
    );
}

/// `--push-pull` measures the round trip over two push/pull channels (shmem's descriptor rings),
/// for every transport, and says so in the result's transport.
#[test]
fn bench_latency_over_push_pull_reports_percentiles() {
    latency_mode_reports_percentiles("--push-pull", "+push-pull");
    // Without --latency it is refused, naming what it needs.
    refused_naming(&["bench", "--push-pull"], "--latency");
}

/// `ferromq bench rpc --json`, one short round of 8 B calls, with `args`: its lines.
fn short_bench_rpc(args: &[&str]) -> Vec<serde_json::Value> {
    json_lines(&short_bench_rpc_rounds("1", args))
}

/// `ferromq bench rpc` with short rounds, `rounds` of them per cell.
fn short_bench_rpc_rounds(rounds: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "bench",
            "rpc",
            "--json",
            "--duration",
            "0.2",
            "--rounds",
            rounds,
        ])
        .args(["--round-trips", "50", "--call-size", "8"])
        .args(args)
        .output()
        .expect("run ferromq bench rpc")
}

#[test]
fn bench_rpc_reports_every_mode_as_json() {
    let lines = short_bench_rpc(&[
        "--transport",
        "shmem,zeromq-tcp",
        "--light-load-rate",
        "20000",
    ]);
    assert_eq!(lines.len(), 6, "2 transports x 3 modes");
    for line in &lines {
        // Every mode at the rate given, not at 1% of its own.
        assert_eq!(line["light_load_calls_per_s"], 20000.0, "{line}");
        assert!(line["light_load_p50_us"].as_f64().unwrap() > 0.0, "{line}");
        for key in [
            "calls_per_s",
            "mb_per_s",
            "return_p50_us",
            "returns_per_s_64_in_flight",
        ] {
            assert!(line[key].as_f64().unwrap() > 0.0, "{key}: {line}");
        }
        assert_eq!(line["call_size"], 8, "{line}");
        assert_eq!(line["calls_through"], "writer", "{line}");
    }
    let modes: Vec<&str> = lines
        .iter()
        .map(|line| line["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["send", "trad", "ovfl", "send", "trad", "ovfl"]);
}

/// `--shared-frame` streams through `Rpc::call`, and the line says so; every call counted ran
/// (the bench checks that the destination ran as many as were made).
#[test]
fn bench_rpc_streams_through_rpc_call_with_shared_frame() {
    let lines = short_bench_rpc(&["--transport", "shmem", "--mode", "trad", "--shared-frame"]);
    assert_eq!(lines.len(), 1, "one cell");
    assert_eq!(lines[0]["calls_through"], "rpc-call", "{}", lines[0]);
    assert!(
        lines[0]["calls_per_s"].as_f64().unwrap() > 0.0,
        "{}",
        lines[0]
    );
}

/// After each round the bench waits until nothing of the round's session runs before it
/// removes the session's files. Its own shared memory held the session's watchdog alive, so
/// every shmem round waited out the whole 5-s limit (and said so).
#[test]
fn bench_rpc_rounds_end_without_waiting_out_their_cleanup() {
    let output = short_bench_rpc_rounds("2", &["--transport", "shmem", "--mode", "send"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(json_lines(&output).len(), 1, "one cell: {stderr}");
    assert!(
        !stderr.contains("still ran after"),
        "a round's cleanup waited out its limit: {stderr}"
    );
}

#[test]
fn bench_rpc_runs_light_load_at_one_percent_of_each_rounds_rate_by_default() {
    let lines = short_bench_rpc(&["--transport", "shmem", "--mode", "send"]);
    assert_eq!(lines.len(), 1, "one cell");
    let line = &lines[0];
    let (rate, streamed) = (
        line["light_load_calls_per_s"].as_f64().unwrap(),
        line["calls_per_s"].as_f64().unwrap(),
    );
    assert!(
        rate > 0.0 && (rate - streamed / 100.0).abs() <= streamed * 1e-12,
        "{line}"
    );
}

#[test]
fn bench_rpc_refuses_a_light_load_rate_that_is_not_a_positive_number() {
    // 1e-300 and 9.5 were taken: the half-second light load then made one call, or four.
    for rate in ["0", "-5", "nan", "inf", "2e9", "fast", "1e-300", "9.5"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
            .args(["bench", "rpc", "--light-load-rate", rate])
            .output()
            .expect("run ferromq bench rpc");
        assert_eq!(output.status.code(), Some(2), "{rate}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("'{rate}' for '--light-load-rate"))
                && stderr.contains("calls per second"),
            "{rate}: {stderr}"
        );
    }
}

/// `ferromq ARGS` in a process group of its own (its members join it), stdout and stderr piped.
fn spawn_in_its_own_group(args: &[&str]) -> std::process::Child {
    spawn_in_its_own_group_in(None, args)
}

/// [`spawn_in_its_own_group`] with `TMPDIR` set to `temp_dir`, where it is given.
fn spawn_in_its_own_group_in(
    temp_dir: Option<&std::path::Path>,
    args: &[&str],
) -> std::process::Child {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"));
    if let Some(temp_dir) = temp_dir {
        command.env("TMPDIR", temp_dir);
    }
    command
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run ferromq bench")
}

/// What `wait` returns, on a channel a test can wait on with a timeout.
fn ended<T: Send + 'static>(
    wait: impl FnOnce() -> T + Send + 'static,
) -> std::sync::mpsc::Receiver<T> {
    let (exited, exit) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = exited.send(wait());
    });
    exit
}

/// What a test does with a bench that did not end as it should: kills its process group (the
/// bench, started with `process_group(0)`, and its members) and removes the shared memory and
/// the temp directory's files of either bench's session (`bench-PID`, `bench-rpc-PID`).
fn kill_and_clean_up(pid: u32) {
    let group = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    for session in ["bench", "bench-rpc"] {
        let session = format!("{session}-{pid}");
        let _ = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
            .args(["shm", "clean", "--force", "--session", &session])
            .output();
        for path in temp_files_of(&session) {
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
        }
    }
}

/// The temp directory's files and directories of a bench's `session`: the pair's directory
/// (`bench`), the members' ipc files (`bench rpc`).
fn temp_files_of(session: &str) -> Vec<std::path::PathBuf> {
    let prefix = format!("ferromq-{session}-");
    std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

/// Processes started with `--session SESSION` (a bench's members), zombies aside.
fn members_of(session: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&format!("--session {session} ")))
        .collect()
}

/// `ferromq ARGS` (a bench) started in a process group of its own, once it says that its
/// members measure (within 30 s, or it is killed with its members and the test fails), and
/// the lines of its standard error (which its members share) after that one.
fn measuring(args: &[&str]) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead as _;
    let mut bench = spawn_in_its_own_group(args);
    let stderr = bench.stderr.take().expect("piped");
    let (said, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = said.send(line);
        }
    });
    let measuring = lines.recv_timeout(std::time::Duration::from_secs(30));
    if !measuring
        .as_ref()
        .is_ok_and(|line| line.contains("measuring"))
    {
        kill_and_clean_up(bench.id());
        panic!("{args:?}: no measuring line: {measuring:?}");
    }
    (bench, lines)
}

/// The rest of what a bench and its members said on standard error, up to the end of the pipe
/// (all of them gone), or 10 s.
fn said_to_the_end(lines: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    let mut said = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) => said.push(line),
            Err(_) => break,
        }
    }
    said
}

/// What runs or stays of a bench's `session`: its members, its files in the temp directory,
/// its shared memory.
fn leftovers_of(session: &str) -> (Vec<String>, Vec<std::path::PathBuf>, Vec<String>) {
    (
        members_of(session),
        temp_files_of(session),
        std::fs::read_dir("/dev/shm")
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains(session))
            .collect(),
    )
}

/// The process ids of the members of a bench's `session` in `role` (sender, receiver).
fn member_pids(session: &str, role: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.contains(&format!("bench-role {role} "))
                && cmdline.contains(&format!("--session {session} ")))
            .then_some(pid)
        })
        .collect()
}

/// A bench ended by a signal sent to it alone (as `timeout` or `kill` sends it; its members get
/// none) kills its members, removes their shared memory and files, and exits with 128 plus the
/// signal's number. Before, the members ran on to the end of their `--duration` and the pair's
/// directory stayed in the temp directory.
#[test]
fn a_signalled_bench_stops_its_members_and_removes_their_files() {
    use nix::sys::signal::Signal;
    let plain = [
        "bench",
        "--transport",
        "shmem",
        "--msg-size",
        "64",
        "--duration",
        "60",
        "--shm-segment-size",
        "268435456",
    ];
    let rpc = [
        "bench",
        "rpc",
        "--transport",
        "shmem",
        "--mode",
        "send",
        "--call-size",
        "8",
        "--rounds",
        "1",
        "--duration",
        "60",
    ];
    for (args, session, signal, code) in [
        (&plain[..], "bench", Signal::SIGINT, 130),
        (&rpc[..], "bench-rpc", Signal::SIGTERM, 143),
        // A closed terminal's: it killed the bench alone, as SIGKILL does.
        (&plain[..], "bench", Signal::SIGHUP, 129),
        (&rpc[..], "bench-rpc", Signal::SIGHUP, 129),
    ] {
        let (mut bench, lines) = measuring(args);
        let pid = bench.id();
        let session = format!("{session}-{pid}");
        assert!(
            !members_of(&session).is_empty(),
            "{args:?}: no member running"
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).expect("signal");
        let exit = ended(move || bench.wait());
        let Ok(status) = exit.recv_timeout(std::time::Duration::from_secs(10)) else {
            kill_and_clean_up(pid);
            panic!("{args:?}: still running 10 s after {signal}");
        };
        let said = said_to_the_end(&lines);
        let leftovers = leftovers_of(&session);
        if leftovers != (Vec::new(), Vec::new(), Vec::new()) {
            kill_and_clean_up(pid);
            panic!("{args:?}: after {signal}, left {leftovers:?}");
        }
        assert_eq!(
            status.expect("wait").code(),
            Some(code),
            "{args:?}: {said:?}"
        );
        assert!(
            said.iter().any(|line| line.contains(signal.as_str())),
            "{args:?}: {said:?}"
        );
    }
}

/// `ferromq ARGS` fails at once (exit 1) with one line naming `culprit`: refused before any
/// member process starts (a member that starts and fails says so on a line of its own). A bench
/// that started members instead (100 000 processes for `--broadcast 100000`) is killed after
/// 10 s with its members (its process group), their shared memory and their files in the temp
/// directory are removed, and the test fails.
fn refused_before_any_member_starts(args: &[&str], culprit: &str) {
    refused_before_any_member_starts_in(None, args, culprit);
}

/// [`refused_before_any_member_starts`] with `TMPDIR` set to `temp_dir`, where it is given.
fn refused_before_any_member_starts_in(
    temp_dir: Option<&std::path::Path>,
    args: &[&str],
    culprit: &str,
) {
    // A usage error: clap's code.
    let code = 2;
    let bench = spawn_in_its_own_group_in(temp_dir, args);
    let pid = bench.id();
    let exit = ended(move || bench.wait_with_output());
    let Ok(output) = exit.recv_timeout(std::time::Duration::from_secs(10)) else {
        kill_and_clean_up(pid);
        let _ = exit.recv_timeout(std::time::Duration::from_secs(10));
        panic!("{args:?}: still running after 10 s");
    };
    let output = output.expect("wait for ferromq bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(stderr.contains(culprit), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
}

#[test]
fn bench_names_a_transport_part_count_or_segment_size_it_cannot_measure_before_it_starts_a_process()
{
    refused_before_any_member_starts(
        &["bench", "--transport", "shmem,bogus", "--duration", "0.1"],
        "--transport \"bogus\"",
    );
    for (options, culprit) in [
        (&["--num-parts", "0"][..], "--num-parts 0"),
        (&["--num-parts", "1025"], "--num-parts 1025"),
        // Smaller than the shm crate's smallest segment, which the member used to refuse.
        (&["--shm-segment-size", "0"], "--shm-segment-size 0"),
        // One message every ~31 years: the warm-up waited for its first.
        (&["--msg-rate", "1e-9"], "--msg-rate 1e-9"),
        (&["--msg-rate", "99"], "--msg-rate 99"),
        // A burst shapes a pace; with none it would be taken and do nothing.
        (
            &["--msg-rate", "0", "--rate-burst-ms", "20"],
            "--rate-burst-ms 20 with --msg-rate 0",
        ),
    ] {
        let mut args = vec!["bench", "--transport", "shmem", "--duration", "0.1"];
        args.extend_from_slice(options);
        refused_before_any_member_starts(&args, culprit);
    }
}

/// A measurement of a nanosecond reported 4e11 messages a second and exit 0.
#[test]
fn bench_durations_too_short_to_measure_are_usage_errors() {
    for args in [
        ["bench", "--duration", "1e-9"].as_slice(),
        ["bench", "--duration", "0.099"].as_slice(),
        ["bench", "rpc", "--duration", "1e-9"].as_slice(),
    ] {
        refused_naming(args, "expected at least 0.1 seconds");
    }
}

#[test]
fn bench_rpc_names_what_it_cannot_measure_before_it_starts_a_process() {
    for (args, culprit) in [
        (["--call-size", "7"], "--call-size 7"),
        (["--mode", "fast"], "--mode \"fast\""),
        (["--rounds", "0"], "--rounds 0"),
        (["--round-trips", "0"], "--round-trips 0"),
        // Aborted allocating 800 GB for the samples (a bad-input sweep).
        (
            ["--round-trips", "99999999999"],
            "--round-trips 99999999999: at most 10000000",
        ),
        (["--transport", "ofi"], "--transport \"ofi\""),
        (["--broadcast", "1"], "--broadcast 1"),
        (["--broadcast", "100000"], "--broadcast 100000"),
    ] {
        let args = [["bench", "rpc"].as_slice(), args.as_slice()].concat();
        refused_before_any_member_starts(&args, culprit);
    }
    // Taken and ignored (a bad-input sweep): a broadcast measures one kind of call.
    refused_naming(
        &["bench", "rpc", "--broadcast", "2", "--mode", "trad"],
        "'--broadcast <BROADCAST>' cannot be used with '--mode <MODE>'",
    );
}

/// A role process that fails (here the sender, which cannot allocate its message) was reported
/// as "sender said nothing": the error now says which role ended, and how.
#[test]
fn a_failing_role_is_named_with_its_exit_status() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["bench", "--transport", "zeromq-ipc", "--duration", "0.2"])
        .args(["--msg-size", UNALLOCATABLE])
        .output()
        .expect("run ferromq bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the sender ended (exit status: 1) without its report; its error is above"),
        "{stderr}"
    );
}

/// A message larger than the sender's segment holds failed in the sender, once both members
/// ran (exit 1). It is refused before anything starts, by the shm crate's block layout: a
/// segment of 8192 bytes has 4096 after its header, which a 4032-byte message and its 64-byte
/// header fill exactly.
#[test]
fn bench_refuses_a_message_its_shared_memory_segment_cannot_hold() {
    for (msg_size, segment_size, num_parts, culprit) in [
        (
            "8192",
            "8192",
            "1",
            "--msg-size 8192 with --shm-segment-size 8192 and --num-parts 1: a message takes 8256 bytes of a segment, which has room for 4096",
        ),
        (
            "4033",
            "8192",
            "1",
            "--msg-size 4033 with --shm-segment-size 8192",
        ),
        (
            "2000",
            "8192",
            "2",
            "--num-parts 2: a message takes 4224 bytes",
        ),
        // Larger than the default segment of 4 GiB.
        (
            "4294967296",
            "4294967296",
            "1",
            "--msg-size 4294967296 with --shm-segment-size 4294967296",
        ),
    ] {
        refused_before_any_member_starts(
            &[
                "bench",
                "--transport",
                "zeromq-ipc,shmem",
                "--duration",
                "0.1",
                "--msg-size",
                msg_size,
                "--shm-segment-size",
                segment_size,
                "--num-parts",
                num_parts,
            ],
            culprit,
        );
    }
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "bench",
            "--json",
            "--transport",
            "shmem",
            "--duration",
            "0.1",
        ])
        .args(["--msg-size", "4032", "--shm-segment-size", "8192"])
        .output()
        .expect("run ferromq bench");
    assert_eq!(json_lines(&output).len(), 1);
}

/// A bench rpc killed mid-run (here by SIGKILL; the sweep found it after an abort) left its
/// destination process serving for ever: it now goes when its parent does.
#[test]
fn a_destination_outlives_no_killed_bench() {
    let mut bench = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "bench",
            "rpc",
            "--transport",
            "zeromq-ipc",
            "--mode",
            "send",
        ])
        .args(["--call-size", "8", "--rounds", "1", "--duration", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ferromq bench rpc");
    let session = format!("bench-rpc-{}", bench.id());
    // Once it measures, its destination has the member list and serves (before, a bench gone
    // ended its destinations through their closed standard input).
    let stderr = std::io::BufReader::new(bench.stderr.take().expect("piped"));
    for line in std::io::BufRead::lines(stderr) {
        if line.expect("read the bench's stderr").contains("measuring") {
            break;
        }
    }
    let destinations = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| {
                let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
                (cmdline.contains("bench-rpc-role") && cmdline.contains(&session))
                    .then(|| pid.to_string())
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while destinations().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no destination started"
        );
        std::thread::yield_now();
    }
    bench.kill().expect("kill -9 the bench");
    bench.wait().expect("reap the bench");
    // What a bench killed with -9 cannot remove itself: its members' ipc files.
    for member in 0..2 {
        let _ = std::fs::remove_file(format!("/tmp/ferromq-{session}-rpc-{member}.ipc"));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = destinations();
        if left.is_empty() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            for pid in &left {
                let _ = std::process::Command::new("kill")
                    .args(["-9", pid])
                    .status();
            }
            let states: Vec<String> = left
                .iter()
                .map(|pid| {
                    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|task| {
                            let path = task.path();
                            let stat =
                                std::fs::read_to_string(path.join("stat")).unwrap_or_default();
                            let wchan =
                                std::fs::read_to_string(path.join("wchan")).unwrap_or_default();
                            let state = stat
                                .rsplit_once(") ")
                                .map_or("?", |(_, rest)| &rest[..1])
                                .to_owned();
                            format!("{state}:{wchan}")
                        })
                        .collect();
                    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
                        .unwrap_or_default()
                        .lines()
                        .filter(|l| l.starts_with("State") || l.starts_with("PPid"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    format!("{status} tasks {tasks:?}")
                })
                .collect();
            panic!("destinations {left:?} outlived their bench by 30 s: {states:?}");
        }
        std::thread::yield_now();
    }
}

/// `--touch` measures memcpy at the message's size with buffers of that size, made before any
/// member starts: a size the memory cannot hold aborted the bench (`memory allocation of
/// 1000000000000 bytes failed`, SIGABRT). It is now the pair's error, exit 1. A size no
/// allocation can have at all is refused before anything starts.
#[test]
fn bench_names_a_message_size_it_cannot_allocate() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["bench", "--touch", "--transport", "zeromq-ipc"])
        .args(["--msg-size", UNALLOCATABLE, "--duration", "0.1"])
        .output()
        .expect("run ferromq bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "zeromq-ipc at {UNALLOCATABLE} bytes: --touch: cannot allocate"
        )),
        "{stderr}"
    );
    refused_before_any_member_starts(
        &[
            "bench",
            "--msg-size",
            "9223372036854775808",
            "--duration",
            "0.1",
        ],
        "--msg-size 9223372036854775808 with --num-parts 1: a message has at most 9223372036854775807 bytes",
    );
    refused_before_any_member_starts(
        &[
            "bench",
            "--msg-size",
            "4611686018427387904",
            "--num-parts",
            "2",
        ],
        "--msg-size 4611686018427387904 with --num-parts 2",
    );
}

/// A bench killed where it cannot stop its members (SIGKILL here; SIGQUIT, or an abort, alike)
/// left them running to the end of their `--duration`, after which each panicked writing its
/// report to the closed pipe, and the pair's directory stayed in the temp directory. They now
/// notice that their parent is gone, stop without a panic and leave nothing behind.
#[test]
fn members_of_a_killed_bench_stop_and_leave_nothing() {
    let (mut bench, lines) = measuring(&[
        "bench",
        "--transport",
        "shmem",
        "--msg-size",
        "1024",
        "--duration",
        "60",
        "--shm-segment-size",
        "268435456",
    ]);
    let pid = bench.id();
    let session = format!("bench-{pid}");
    // Both run by the time the bench says it measures; on a loaded machine /proc may show the
    // sender a moment later.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while members_of(&session).len() < 2 {
        if std::time::Instant::now() >= deadline {
            kill_and_clean_up(pid);
            panic!("both members run: {:?}", members_of(&session));
        }
        std::thread::yield_now();
    }
    bench.kill().expect("kill -9 the bench");
    bench.wait().expect("reap the bench");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let leftovers = leftovers_of(&session);
        if leftovers == (Vec::new(), Vec::new(), Vec::new()) {
            break;
        }
        if std::time::Instant::now() >= deadline {
            kill_and_clean_up(pid);
            panic!("20 s after the bench was killed: {leftovers:?}");
        }
        std::thread::yield_now();
    }
    let said = said_to_the_end(&lines);
    assert!(
        !said.iter().any(|line| line.contains("panicked")),
        "{said:?}"
    );
}

/// A member killed mid-run (here the receiver, by SIGKILL) was noticed only once the sender's
/// report was overdue (69 s for a 3-s run), as "the sender wrote nothing", and a killed member
/// was said to have printed its error "above". The bench now ends at once, naming the member
/// and its signal; the sender, its peer gone, is stopped and nothing stays behind.
#[test]
fn a_killed_member_is_named_at_once() {
    let (mut bench, lines) = measuring(&[
        "bench",
        "--transport",
        "zeromq-ipc",
        "--msg-size",
        "1024",
        "--duration",
        "60",
    ]);
    let pid = bench.id();
    let session = format!("bench-{pid}");
    let receivers = member_pids(&session, "receiver");
    assert_eq!(receivers.len(), 1, "{:?}", members_of(&session));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(receivers[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the receiver");
    let exit = ended(move || bench.wait());
    let Ok(status) = exit.recv_timeout(std::time::Duration::from_secs(20)) else {
        kill_and_clean_up(pid);
        panic!("still running 20 s after its receiver was killed");
    };
    let said = said_to_the_end(&lines);
    let leftovers = leftovers_of(&session);
    if leftovers != (Vec::new(), Vec::new(), Vec::new()) {
        kill_and_clean_up(pid);
        panic!("left {leftovers:?}");
    }
    assert_eq!(status.expect("wait").code(), Some(1), "{said:?}");
    let error = said.last().map_or("", String::as_str);
    assert_eq!(
        error, "ferromq bench: zeromq-ipc at 1024 bytes: the receiver was killed (SIGKILL)",
        "{said:?}"
    );
}

/// A pair that fails after others finished threw their results away: nothing on standard
/// output, exit 1. They are now printed (table or JSON), then the error, exit 1.
#[test]
fn bench_prints_what_it_measured_before_a_pair_failed() {
    for json in [true, false] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
            .args(["bench", "--transport", "zeromq-ipc", "--duration", "0.1"])
            .args(["--msg-size", &format!("64,{UNALLOCATABLE}")])
            .args(json.then_some("--json"))
            .output()
            .expect("run ferromq bench");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "ferromq bench: zeromq-ipc at {UNALLOCATABLE} bytes: the sender ended"
            )),
            "{stderr}"
        );
        let rows: Vec<&str> = stdout.lines().collect();
        if json {
            assert_eq!(rows.len(), 1, "{stdout}");
            let result: serde_json::Value = serde_json::from_str(rows[0]).expect("json");
            assert_eq!(result["msg_size"], 64, "{stdout}");
        } else {
            // The header, then the 64-byte pair's row.
            assert_eq!(rows.len(), 2, "{stdout}");
            assert!(
                rows[1].starts_with("zeromq-ipc") && rows[1].contains(" 64 "),
                "{stdout}"
            );
        }
    }
}

/// A bench ended by SIGINT or SIGTERM once some of its pairs (or `bench rpc`'s cells) had
/// finished printed none of their results, only the signal's line: what they measured was
/// thrown away. Their rows (or JSON lines) are now printed as a whole run prints them, and the
/// bench exits with 128 plus the signal's number, also where a terminal's Ctrl-C reached its
/// members too.
#[test]
fn an_interrupted_bench_prints_what_it_measured() {
    use nix::sys::signal::Signal;
    let plain = [
        "bench",
        "--transport",
        "zeromq-ipc",
        "--msg-size",
        "64,128",
        "--duration",
        "2",
    ];
    let rpc = [
        "bench",
        "rpc",
        "--transport",
        "zeromq-ipc",
        "--mode",
        "send,trad",
        "--call-size",
        "8",
        "--rounds",
        "1",
        "--duration",
        "1",
        "--round-trips",
        "100",
    ];
    // SIGINT as a terminal's Ctrl-C sends it, to the bench and its members alike (a member
    // killed by it ended the bench as a failed pair, exit 1, when it died first); SIGTERM to
    // the bench alone, as `kill` sends it.
    for (args, json, session, signal, to_group, code) in [
        (&plain[..], false, "bench", Signal::SIGINT, true, 130),
        (&plain[..], true, "bench", Signal::SIGTERM, false, 143),
        (&rpc[..], false, "bench-rpc", Signal::SIGINT, true, 130),
        (&rpc[..], true, "bench-rpc", Signal::SIGTERM, false, 143),
    ] {
        let args = [args, json.then_some("--json").as_slice()].concat();
        // The first pair (cell) finished once the second measures, which then lasts a while:
        // a warm-up, and at least a second's measurement.
        let (mut bench, lines) = measuring(&args);
        let pid = bench.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut said = Vec::new();
        while !said
            .last()
            .is_some_and(|line: &String| line.contains("measuring"))
        {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Ok(line) = lines.recv_timeout(left) else {
                kill_and_clean_up(pid);
                panic!("{args:?}: the first pair never finished: {said:?}");
            };
            said.push(line);
        }
        let bench_pid = nix::unistd::Pid::from_raw(pid as i32);
        if to_group {
            nix::sys::signal::killpg(bench_pid, signal).expect("signal the bench's group");
        } else {
            nix::sys::signal::kill(bench_pid, signal).expect("signal the bench");
        }
        let mut stdout = bench.stdout.take().expect("piped");
        let exit = ended(move || {
            let mut printed = String::new();
            let read = std::io::Read::read_to_string(&mut stdout, &mut printed);
            (bench.wait(), read.map(|_| printed))
        });
        let Ok((status, printed)) = exit.recv_timeout(std::time::Duration::from_secs(20)) else {
            kill_and_clean_up(pid);
            panic!("{args:?}: still running 20 s after {signal}");
        };
        said.extend(said_to_the_end(&lines));
        let leftovers = leftovers_of(&format!("{session}-{pid}"));
        if leftovers != (Vec::new(), Vec::new(), Vec::new()) {
            kill_and_clean_up(pid);
            panic!("{args:?}: after {signal}, left {leftovers:?}");
        }
        let printed = printed.expect("read the bench's stdout");
        assert_eq!(
            status.expect("wait").code(),
            Some(code),
            "{args:?}: {said:?}\n{printed}"
        );
        // The first pair's row (after the table's header) or JSON line, and no other.
        let rows: Vec<&str> = printed.lines().skip(usize::from(!json)).collect();
        assert_eq!(rows.len(), 1, "{args:?}: {printed}");
        if json {
            let result: serde_json::Value = serde_json::from_str(rows[0]).expect("json");
            let (key, value) = if session == "bench" {
                ("msg_size", serde_json::json!(64))
            } else {
                ("mode", serde_json::json!("send"))
            };
            assert_eq!(result[key], value, "{args:?}: {printed}");
        } else {
            let first = if session == "bench" { " 64 " } else { " send " };
            assert!(
                rows[0].starts_with("zeromq-ipc") && rows[0].contains(first),
                "{args:?}: {printed}"
            );
        }
    }
}

/// A bench whose standard output was closed (`ferromq bench | head -0`) panicked printing
/// its results (`failed printing to stdout`, exit 101): it now says it cannot print them,
/// exit 1.
#[test]
fn a_bench_whose_output_is_closed_says_so() {
    let mut bench = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["bench", "--json", "--transport", "zeromq-ipc"])
        .args(["--msg-size", "64", "--duration", "0.1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ferromq bench");
    drop(bench.stdout.take());
    let output = bench.wait_with_output().expect("wait for ferromq bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ferromq bench: cannot print the 1 result(s) measured: Broken pipe"),
        "{stderr}"
    );
}

/// `--transport ofi-tcp` passed the check in a build without ofi: the receiver failed
/// (`unknown transport "ofi"`) after it started, exit 1. It is refused before anything starts,
/// naming what is built in.
#[cfg(not(feature = "ofi"))]
#[test]
fn bench_refuses_a_transport_this_build_lacks() {
    refused_before_any_member_starts(
        &[
            "bench",
            "--transport",
            "zeromq-ipc,ofi-tcp",
            "--duration",
            "0.1",
        ],
        "--transport \"ofi-tcp\": this ferromq was built without the ofi transport (built in: shmem, zeromq; build with --features ofi)",
    );
}

/// `TMPDIR=/nonexistent` made /nonexistent (`create_dir_all`) and left it behind; a `TMPDIR`
/// that made the pair's ipc path longer than a socket's path takes was refused only by the
/// receiver, exit 1. `bench rpc` did not look at TMPDIR at all: its destination failed to bind.
/// Either refuses a TMPDIR that is missing, a regular file or too long before anything starts,
/// naming TMPDIR and its path, and nothing is made.
#[test]
fn bench_refuses_a_temp_dir_it_cannot_use() {
    let own = std::env::temp_dir().join(format!("ferromq-bench-test-{}", std::process::id()));
    let missing = own.join("missing");
    let file = own.join("file");
    let bench = ["bench", "--transport", "shmem", "--msg-size", "64"];
    let bench = [&bench[..], &["--duration", "0.1"]].concat();
    let rpc = ["bench", "rpc", "--transport", "zeromq-tcp,shmem"];
    let rpc = [&rpc[..], &["--duration", "0.1"]].concat();
    let outcome = std::panic::catch_unwind(|| {
        for args in [&bench, &rpc] {
            refused_before_any_member_starts_in(
                Some(&missing),
                args,
                &format!(
                    "the temp directory {} (TMPDIR): No such file or directory",
                    missing.display()
                ),
            );
            assert!(!own.exists(), "{args:?}: {} was made", own.display());
        }
        std::fs::create_dir(&own).expect("make the test's directory");
        std::fs::write(&file, "").expect("make a regular file");
        for args in [&bench, &rpc] {
            refused_before_any_member_starts_in(
                Some(&file),
                args,
                &format!(
                    "the temp directory {} (TMPDIR): not a directory",
                    file.display()
                ),
            );
            let made: Vec<_> = std::fs::read_dir(&own)
                .expect("list the test's directory")
                .flatten()
                .map(|entry| entry.file_name())
                .collect();
            assert_eq!(made, ["file"], "{args:?}");
            assert!(file.is_file(), "{args:?}");
        }
        // 90 bytes of directory name: the pair's socket path is then over 107 bytes.
        let long = own.join("d".repeat(90));
        std::fs::create_dir_all(&long).expect("make the long temp directory");
        for args in [&bench, &rpc] {
            refused_before_any_member_starts_in(
                Some(&long),
                args,
                &format!(
                    "the temp directory {} (TMPDIR): address \"ipc://{}/ferromq-bench-",
                    long.display(),
                    long.display()
                ),
            );
        }
    });
    let _ = std::fs::remove_dir_all(&own);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// `--same-msg` (zeromq's) with shmem alone, and `--shm-segment-size` with no shmem transport,
/// were taken and ignored. Each is refused where no transport measured takes it.
#[test]
fn bench_refuses_an_option_no_transport_measured_takes() {
    refused_before_any_member_starts(
        &["bench", "--transport", "shmem", "--same-msg"],
        "--same-msg with --transport shmem: shared memory sends from its segment",
    );
    refused_before_any_member_starts(
        &[
            "bench",
            "--transport",
            "zeromq-ipc,zeromq-tcp",
            "--shm-segment-size",
            "268435456",
        ],
        "--shm-segment-size 268435456 with --transport zeromq-ipc,zeromq-tcp: no transport measured has a shared-memory segment",
    );
    // The default's own value, given, is given: it was taken for no option.
    refused_before_any_member_starts(
        &[
            "bench",
            "--transport",
            "zeromq-tcp",
            "--shm-segment-size",
            "4294967296",
        ],
        "--shm-segment-size 4294967296 with --transport zeromq-tcp: no transport measured has a shared-memory segment",
    );
}
