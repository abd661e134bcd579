//! Helpers shared by the CLI's end-to-end tests.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Child;

const FINISH_TIMEOUT: Duration = Duration::from_secs(90);

/// How a process ended and what it printed.
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Reads everything a child prints and waits for it, within a bound.
pub async fn finish(mut child: Child) -> Finished {
    let mut stdout = String::new();
    let mut stderr = String::new();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let status = tokio::time::timeout(FINISH_TIMEOUT, async {
        let (_, _, status) = tokio::join!(
            out.read_to_string(&mut stdout),
            err.read_to_string(&mut stderr),
            child.wait()
        );
        status
    })
    .await
    .expect("the process did not exit in time")
    .expect("wait for the process");
    Finished {
        code: status.code(),
        stdout,
        stderr,
    }
}
