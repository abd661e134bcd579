//! A device whose hook panics goes to ERROR and exits non-zero with the panic's message, under
//! every control mode a person uses (`static`, `interactive`): it used to hang, ignoring signals.
//! This test binary, started again with `FERROMQ_TEST_ROLE=panicking-device`, is that device.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use ferromq::prelude::*;

const ROLE_VAR: &str = "FERROMQ_TEST_ROLE";
const PANIC_TEXT: &str = "the detector caught fire";

struct PanickingDevice;

#[ferromq::async_trait]
impl Device for PanickingDevice {
    async fn run(&mut self, _ctx: &mut DeviceContext) -> Result<(), BoxError> {
        panic!("{PANIC_TEXT}");
    }
}

fn main() -> ExitCode {
    if std::env::var(ROLE_VAR).as_deref() == Ok("panicking-device") {
        return ferromq::run_device_main(|_| PanickingDevice);
    }
    let mut failures = Vec::new();
    for control in ["static", "interactive"] {
        match panics_end_in_error(control) {
            Ok(()) => println!("test a_panicking_hook_exits_1_under_{control} ... ok"),
            Err(problem) => {
                println!("test a_panicking_hook_exits_1_under_{control} ... FAILED\n{problem}");
                failures.push(control);
            }
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed",
        if failures.is_empty() { "ok" } else { "FAILED" },
        2 - failures.len(),
        failures.len()
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn panics_end_in_error(control: &str) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    runtime.block_on(async {
        let child = tokio::process::Command::new(std::env::current_exe().expect("own path"))
            .env(ROLE_VAR, "panicking-device")
            .args(["--id", "panicker", "--control", control, "--color", "false"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| error.to_string())?;
        let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .map_err(|_| format!("--control {control}: the device hung after its panic"))?
            .map_err(|error| error.to_string())?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.code() != Some(1) {
            return Err(format!("exit {:?}\n{stdout}\n{stderr}", output.status));
        }
        for wanted in ["RUNNING ---> ERROR", "ERROR ---> EXITING"] {
            if !stdout.contains(wanted) {
                return Err(format!("no {wanted:?} in\n{stdout}"));
            }
        }
        if !stderr.contains(&format!(
            "run failed in state RUNNING: panicked: {PANIC_TEXT}"
        )) && !stdout.contains(&format!("panicked: {PANIC_TEXT}"))
        {
            return Err(format!(
                "the panic's message is not named:\n{stdout}\n{stderr}"
            ));
        }
        Ok(())
    })
}
