//! `ferromq bench` as a smoke test: every transport reports, in both modes. No speed is asserted.

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
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("json"))
        .collect();
    assert_eq!(lines.len(), 6);
    for line in &lines {
        assert!(line["msgs_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["sender_cpu"].as_f64().unwrap() > 0.0, "{line}");
    }
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
        let percentiles = value["latency_us"].as_array().expect("percentiles");
        let [p50, p99, p999] = [0, 1, 2].map(|idx| percentiles[idx].as_f64().unwrap());
        assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{value}");
    }
}
