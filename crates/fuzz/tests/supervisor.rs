//! The `ferromq-fuzz` binary end to end: a crash that kills the worker process and a hang are
//! found, their inputs saved, and the exit status says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ferromq-fuzz-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fuzz(args: &[&str], crash_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferromq-fuzz"))
        .args(args)
        .arg("--crash-dir")
        .arg(crash_dir)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn saved_inputs(dir: &Path, prefix: &str) -> Vec<Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(prefix)
        })
        .map(|path| std::fs::read(path).unwrap())
        .collect()
}

#[test]
fn an_input_that_aborts_the_worker_is_captured_and_the_run_goes_on() {
    let dir = TempDir::new("abort");
    let output = fuzz(&["selftest-abort", "--inputs", "40", "--seed", "3"], &dir.0);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("selftest-abort   40 inputs"), "{stdout}");
    assert!(stderr.contains("CRASH: input #"), "{stderr}");
    let crashes = saved_inputs(&dir.0, "selftest-abort-crash-seed3-");
    assert!(!crashes.is_empty(), "{stdout}\n{stderr}");
    assert!(crashes.iter().all(|input| input.starts_with(b"abort")));
    assert!(
        stdout.contains(&format!(
            "0 panics, 0 property failures, {} crashes, 0 hangs",
            crashes.len()
        )),
        "{stdout}"
    );
}

#[test]
fn a_hang_is_reported_with_its_input_and_exit_status_3() {
    let dir = TempDir::new("hang");
    let output = fuzz(
        &["selftest-hang", "--inputs", "1000", "--hang-ms", "300"],
        &dir.0,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(stderr.contains("HANG: input #"), "{stderr}");
    assert!(stdout.contains("1 hangs"), "{stdout}");
    let hangs = saved_inputs(&dir.0, "selftest-hang-hang-seed1-");
    assert_eq!(hangs.len(), 1);
    assert!(hangs[0].starts_with(b"hang"));
}

#[test]
fn a_clean_run_exits_0_and_an_unknown_target_is_a_usage_error() {
    let dir = TempDir::new("clean");
    let output = fuzz(&["address", "--inputs", "2000"], &dir.0);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("address          2000 inputs"), "{stdout}");
    let output = fuzz(&["nope"], &dir.0);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown target \"nope\""));
}
