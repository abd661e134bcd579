//! The short pass CI runs: every target, a fixed seed, 20 000 inputs, no panic, no failed
//! property (a hang ends the test process with status 3). The long runs are in
//! `docs/fuzzing.md`.

use std::time::Duration;

use ferromq_fuzz::{RunOptions, targets};

const N_INPUTS: u64 = 20_000;

fn check(name: &str) {
    let target = targets::by_name(name).unwrap();
    let crash_dir =
        std::env::temp_dir().join(format!("ferromq-fuzz-{}-{name}", std::process::id()));
    let options = RunOptions {
        seed: 20_251_122,
        n_inputs: N_INPUTS,
        // Generous: debug builds on a shared machine; a real hang runs forever.
        hang_after: Duration::from_secs(10),
        crash_dir: Some(crash_dir.clone()),
        ..RunOptions::default()
    };
    let report = ferromq_fuzz::run(&target, &options).unwrap();
    let _ = std::fs::remove_dir_all(&crash_dir);
    assert_eq!(report.n_inputs, N_INPUTS);
    assert!(report.is_clean(), "{report}");
    assert!(
        report.n_accepted > 0 && report.n_accepted < N_INPUTS,
        "{name}: {} of {N_INPUTS} inputs accepted: the mutator should make both kinds",
        report.n_accepted
    );
}

#[test]
fn shm_frame() {
    check("shm-frame");
}

#[test]
fn rpc_frame() {
    check("rpc-frame");
}

#[test]
fn recording() {
    check("recording");
}

#[test]
fn tap_header() {
    check("tap-header");
}

#[cfg(feature = "ofi")]
#[test]
fn ofi_control() {
    check("ofi-control");
}

#[test]
fn control_request() {
    check("control-request");
}

#[test]
fn control_reply() {
    check("control-reply");
}

#[test]
fn mq_config() {
    check("mq-config");
}

#[test]
fn channel_config() {
    check("channel-config");
}

#[test]
fn topology() {
    check("topology");
}

#[test]
fn address() {
    check("address");
}

#[test]
fn every_target_has_a_test_here() {
    let source = include_str!("short_pass.rs");
    for target in targets::all() {
        assert!(
            source.contains(&format!("check(\"{}\")", target.name)),
            "target {} has no short pass",
            target.name
        );
    }
}
