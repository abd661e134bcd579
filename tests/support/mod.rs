//! Helpers shared by the multi-process tests: deterministic payloads, unique ipc paths, and
//! children that are killed when the test drops them (a failing test leaves no process behind).

#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// Environment variable that puts the test binary into a child role.
pub const ROLE_VAR: &str = "FERROMQ_TEST_ROLE";

/// Bytes of message `idx`: its index in the first 8 bytes, then a pattern that depends on it.
pub fn payload(idx: u64, size: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..size)
        .map(|byte_idx| pattern_byte(idx, byte_idx))
        .collect();
    let header = idx.to_le_bytes();
    let n_header = size.min(8);
    bytes[..n_header].copy_from_slice(&header[..n_header]);
    bytes
}

fn pattern_byte(idx: u64, byte_idx: usize) -> u8 {
    (idx.wrapping_mul(31).wrapping_add(byte_idx as u64) % 251) as u8
}

/// Checks that `bytes` is exactly `payload(idx, bytes.len())`.
pub fn verify(idx: u64, bytes: &[u8]) -> Result<(), String> {
    let header = idx.to_le_bytes();
    let n_header = bytes.len().min(8);
    if bytes[..n_header] != header[..n_header] {
        return Err(format!(
            "message {idx}: wrong index header {:?}",
            &bytes[..n_header]
        ));
    }
    if let Some(byte_idx) =
        (n_header..bytes.len()).find(|&byte_idx| bytes[byte_idx] != pattern_byte(idx, byte_idx))
    {
        return Err(format!(
            "message {idx} of {} bytes: corrupt at byte {byte_idx}",
            bytes.len()
        ));
    }
    Ok(())
}

/// The index in a payload's header (messages shorter than 8 bytes give what they have).
pub fn index_of(bytes: &[u8]) -> u64 {
    let mut header = [0u8; 8];
    let n_header = bytes.len().min(8);
    header[..n_header].copy_from_slice(&bytes[..n_header]);
    u64::from_le_bytes(header)
}

static NEXT_PATH: AtomicUsize = AtomicUsize::new(0);

/// A unique ipc address in the temp directory, removed when dropped.
pub struct IpcPath(pub PathBuf);

impl IpcPath {
    pub fn new(tag: &str) -> IpcPath {
        let n = NEXT_PATH.fetch_add(1, Ordering::Relaxed);
        IpcPath(
            std::env::temp_dir().join(format!("ferromq-test-{tag}-{}-{n}.ipc", std::process::id())),
        )
    }

    pub fn address(&self) -> String {
        format!("ipc://{}", self.0.display())
    }
}

impl Drop for IpcPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A child process of this test binary in `role`, killed on drop.
pub struct ChildRole {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
}

impl ChildRole {
    pub fn spawn(role: &str, env: &[(&str, String)]) -> ChildRole {
        let mut command = Command::new(std::env::current_exe().expect("test binary path"));
        command
            .env(ROLE_VAR, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn child role");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        ChildRole { child, stdout }
    }

    /// The next line the child prints, within `timeout`.
    pub async fn line(&mut self, timeout: Duration) -> String {
        let mut line = String::new();
        tokio::time::timeout(timeout, self.stdout.read_line(&mut line))
            .await
            .expect("child printed no line in time")
            .expect("read child stdout");
        line.trim().to_owned()
    }

    /// Waits for the child to exit, within `timeout`; returns its exit code.
    pub async fn exit_code(&mut self, timeout: Duration) -> i32 {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .expect("child did not exit in time")
            .expect("wait for child");
        status.code().unwrap_or(-1)
    }

    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill child");
    }
}

pub fn env_string(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("child role needs {key}"))
}

pub fn env_number(key: &str) -> u64 {
    env_string(key)
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number"))
}

/// A libtest-mimic trial running `test`, its error chain as the failure message.
pub fn trial(name: &'static str, test: fn() -> anyhow::Result<()>) -> libtest_mimic::Trial {
    libtest_mimic::Trial::test(name, move || {
        test().map_err(|error| libtest_mimic::Failed::from(format!("{error:#}")))
    })
}

/// Runs a test on a fresh runtime, failing it after 240 s instead of hanging.
pub fn block_on(test: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()?
        .block_on(async { tokio::time::timeout(Duration::from_secs(240), test).await? })
}

/// Receives `n_msgs` messages of `n_parts` parts each and checks every part is
/// `payload(index, size)`.
pub async fn receive_verified(
    channel: &mut ferromq::Channel,
    n_msgs: u64,
    n_parts: usize,
) -> anyhow::Result<()> {
    use anyhow::Context;
    for msg_idx in 0..n_msgs {
        let parts = tokio::time::timeout(Duration::from_secs(60), channel.receive_parts())
            .await
            .with_context(|| format!("message {msg_idx} never came"))??;
        anyhow::ensure!(
            parts.len() == n_parts,
            "message {msg_idx} has {} parts, not {n_parts}",
            parts.len()
        );
        for part in &parts {
            verify(msg_idx, part.data()).map_err(anyhow::Error::msg)?;
        }
    }
    Ok(())
}

/// The environment of a "push" child role: address, sizes (comma-separated, cycled), parts per
/// message and message count (0: until killed).
pub fn push_env(
    address: &str,
    sizes: &str,
    parts: usize,
    count: u64,
) -> Vec<(&'static str, String)> {
    vec![
        ("ADDRESS", address.to_owned()),
        ("SIZES", sizes.to_owned()),
        ("PARTS", parts.to_string()),
        ("COUNT", count.to_string()),
    ]
}

/// In a child started by [`ChildRole::spawn`], runs its role (`FERROMQ_TEST_ROLE`) and returns
/// true (exiting with 1 when the role fails); in the test runner itself, returns false.
pub fn run_child_role(
    run: impl FnOnce(&str) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + '_>>,
) -> bool {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return false;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    if let Err(error) = runtime.block_on(run(&role)) {
        eprintln!("role {role} failed: {error:#}");
        std::process::exit(1);
    }
    true
}

/// The "push" child role's loop: sends what [`push_env`] describes (SIZES cycled, PARTS per
/// message, COUNT messages or, with 0, until killed), each part `payload(index, size)`, then
/// closes the channel.
pub async fn send_push_env_messages(mut channel: ferromq::Channel) -> anyhow::Result<()> {
    let sizes: Vec<usize> = env_string("SIZES")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let n_parts = env_number("PARTS") as usize;
    let n_msgs = env_number("COUNT");
    let mut msg_idx = 0u64;
    while n_msgs == 0 || msg_idx < n_msgs {
        let size = sizes[msg_idx as usize % sizes.len()];
        let parts: ferromq::Parts = (0..n_parts)
            .map(|_| ferromq::Message::from(payload(msg_idx, size)))
            .collect();
        channel
            .send_parts(parts)
            .await
            .map_err(|failed| failed.error)?;
        msg_idx += 1;
    }
    channel.close().await?;
    Ok(())
}
