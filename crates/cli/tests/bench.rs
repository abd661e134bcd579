//! `ferromq bench` as a smoke test: every transport reports, in both modes. No speed is asserted.

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

/// `ferromq bench --json ARGS` over every transport at 64 B and 64 KiB, half a second each:
/// the six results, each labelled with `suffix`.
fn every_transport(args: &[&str], suffix: &str) -> Vec<serde_json::Value> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "bench",
            "--json",
            "--duration",
            "0.5",
            "--msg-size",
            "64,65536",
        ])
        .args(["--transport", "shmem,zeromq-ipc,zeromq-tcp"])
        .args(["--shm-segment-size", "268435456"])
        .args(args)
        .output()
        .expect("run ferromq bench");
    let lines = json_lines(&output);
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
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "bench",
            "rpc",
            "--json",
            "--duration",
            "0.2",
            "--rounds",
            "1",
        ])
        .args(["--round-trips", "50", "--call-size", "8"])
        .args(args)
        .output()
        .expect("run ferromq bench rpc");
    json_lines(&output)
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
    }
    let modes: Vec<&str> = lines
        .iter()
        .map(|line| line["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["send", "trad", "ovfl", "send", "trad", "ovfl"]);
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
    for rate in ["0", "-5", "nan", "inf", "2e9", "fast"] {
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

#[test]
fn bench_rpc_names_a_size_or_mode_it_cannot_measure() {
    for (args, culprit) in [
        (["--call-size", "7"], "--call-size 7"),
        (["--mode", "fast"], "--mode \"fast\""),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
            .args(["bench", "rpc"])
            .args(args)
            .output()
            .expect("run ferromq bench rpc");
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(culprit), "{args:?}: {stderr}");
    }
}
