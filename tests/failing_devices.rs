//! A device that fails after it sent: what `send` accepted is still delivered, or its loss is
//! counted and said, as on the normal way down (RESETTING DEVICE closes the channels). A failure
//! goes ERROR -> EXITING, past RESETTING DEVICE; the device used to drop its channels there,
//! and with them every message still on its way to a stalled receiver, without a word.
//!
//! This test binary runs the tests and, started again with `FERROMQ_TEST_ROLE`, plays the
//! devices: `failing-sender` sends `COUNT` messages of `SIZE` bytes on its channel `data`
//! (after the first it waits for a line on its standard input, so that the test can stop its
//! receiver first) and then fails; `counting-sink` receives and checks `COUNT` messages and
//! prints `FIRST` after the first and `ALL` after the last.

mod support;

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferromq::prelude::*;
use libtest_mimic::Arguments;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{IpcPath, ROLE_VAR, block_on, env_number, payload, trial, verify};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

const FAILURE_TEXT: &str = "the detector caught fire";
const N_MESSAGES: u64 = 60;
/// 60 of these are far more than a stalled zeromq receiver's socket buffers take, and none fits
/// in them whole (`KERNEL_SIZES`): nothing is written whole before the receiver stops.
const SIZE: u64 = 1 << 20;
/// The connections' kernel buffers, whatever the host's defaults.
const KERNEL_SIZES: &str = "sndKernelSize=65536,rcvKernelSize=65536";
/// What the runner logs as it closes the channels a failure left open.
const CLOSING_LEFT_OPEN: &str = "closing the channels the device left open";
const STEP: Duration = Duration::from_secs(60);

fn main() {
    if let Ok(role) = std::env::var(ROLE_VAR) {
        let code = match role.as_str() {
            "failing-sender" => ferromq::run_device_main(|_| FailingSender),
            "counting-sink" => ferromq::run_device_main(|_| CountingSink),
            other => {
                eprintln!("unknown role {other}");
                std::process::ExitCode::FAILURE
            }
        };
        std::process::exit(if code == std::process::ExitCode::SUCCESS {
            0
        } else {
            1
        });
    }
    let tests = vec![
        trial(
            "a_failing_shmem_sender_still_delivers_to_a_stalled_receiver",
            || stalled_receiver_gets_everything("shmem"),
        ),
        trial(
            "a_failing_zeromq_sender_still_delivers_to_a_stalled_receiver",
            || stalled_receiver_gets_everything("zeromq"),
        ),
        trial(
            "a_failing_shmem_sender_whose_receiver_died_names_the_count",
            || dead_receiver_is_counted("shmem"),
        ),
        trial(
            "a_failing_zeromq_sender_whose_receiver_died_names_the_count",
            || dead_receiver_is_counted("zeromq"),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), tests).exit();
}

// ---------------------------------------------------------------------------------------------
// The devices

struct FailingSender;

#[ferromq::async_trait]
impl Device for FailingSender {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let n_messages = env_number("COUNT");
        let size = env_number("SIZE") as usize;
        for idx in 0..n_messages {
            ctx.send("data", Message::from(payload(idx, size))).await?;
            if idx == 0 {
                // The test's go: its receiver has the first message and is stopped now.
                tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
                    .await??;
            }
        }
        println!("SENT {n_messages}");
        Err(FAILURE_TEXT.into())
    }
}

struct CountingSink;

#[ferromq::async_trait]
impl Device for CountingSink {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let n_messages = env_number("COUNT");
        for idx in 0..n_messages {
            let message = ctx.receive("data").await?;
            verify(idx, message.data())?;
            if idx == 0 {
                println!("FIRST");
            }
        }
        println!("ALL");
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

/// A device process of this binary in `role`, its stdout and stderr collected, killed on drop.
struct DeviceProcess {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl DeviceProcess {
    fn spawn(role: &str, args: &[String]) -> DeviceProcess {
        let mut child = Command::new(std::env::current_exe().expect("test binary path"))
            .env(ROLE_VAR, role)
            .env("COUNT", N_MESSAGES.to_string())
            .env("SIZE", SIZE.to_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a device");
        let stdin = child.stdin.take().expect("piped");
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        forward_lines(child.stdout.take().expect("piped"), sender.clone());
        forward_lines(child.stderr.take().expect("piped"), sender);
        DeviceProcess {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Writes a line to its standard input.
    async fn tell(&mut self, line: &str) -> Result<()> {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        Ok(self.stdin.flush().await?)
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().expect("running") as i32)
    }

    /// Waits for a line containing `wanted`.
    async fn wait_for(&mut self, wanted: &str) -> Result<()> {
        let found = tokio::time::timeout(STEP, async {
            while let Some(line) = self.lines.recv().await {
                let found = line.contains(wanted);
                self.seen.push(line);
                if found {
                    return true;
                }
            }
            false
        })
        .await;
        ensure!(
            found == Ok(true),
            "no line with {wanted:?} in\n{}",
            self.seen.join("\n")
        );
        Ok(())
    }

    /// Waits for the sender's exit, which must be 1 with its failure said; returns everything
    /// it printed.
    async fn exited_failing(&mut self) -> Result<String> {
        let (code, printed) = self.exit().await?;
        ensure!(code == Some(1), "the sender exited {code:?}:\n{printed}");
        ensure!(
            printed.contains(FAILURE_TEXT),
            "the sender did not say why it failed:\n{printed}"
        );
        Ok(printed)
    }

    /// Waits for the exit; returns its code and everything the process printed.
    async fn exit(&mut self) -> Result<(Option<i32>, String)> {
        let status = tokio::time::timeout(STEP, self.child.wait())
            .await
            .with_context(|| format!("no exit in time; printed\n{}", self.seen.join("\n")))??;
        while let Some(line) = self.lines.recv().await {
            self.seen.push(line);
        }
        Ok((status.code(), self.seen.join("\n")))
    }
}

fn forward_lines(
    stream: impl AsyncRead + Unpin + Send + 'static,
    lines: tokio::sync::mpsc::UnboundedSender<String>,
) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            let _ = lines.send(line);
        }
    });
}

/// The options of a device of this test: its channel `data` on `address` over `transport`.
fn device_args(
    id: &str,
    transport: &str,
    session: &str,
    channel: &str,
    address: &str,
) -> Vec<String> {
    [
        "--id",
        id,
        "--transport",
        transport,
        "--session",
        session,
        "--control",
        "static",
        "--color",
        "false",
        "--channel-config",
        &format!("name=data,{channel},{KERNEL_SIZES},address={address}"),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A shmem session's name, its objects removed when dropped (however the test ends): declared
/// before the devices, it is dropped after them (they are killed on drop).
struct Session(String);

impl Session {
    fn new(tag: &str) -> Session {
        Session(format!("failing-{tag}-{}", std::process::id()))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ =
            ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), &self.0, true);
    }
}

/// A sink, and a sender whose channel lingers `linger_ms`, after the sender's failure: the sink
/// took the first message and was stopped, and the sender is closing its channel with every
/// later message on its way. Fields drop in order: the devices (killed), then their session.
struct FailedWithReceiverStopped {
    sink: DeviceProcess,
    sender: DeviceProcess,
    _session: Session,
    path: IpcPath,
}

async fn fail_with_receiver_stopped(
    transport: &str,
    tag: &str,
    linger_ms: u64,
) -> Result<FailedWithReceiverStopped> {
    let path = IpcPath::new(&format!("failing-{tag}-{transport}"));
    let session = Session::new(&format!("{tag}-{transport}"));
    let mut sink = DeviceProcess::spawn(
        "counting-sink",
        &device_args(
            "sink",
            transport,
            &session.0,
            "type=pull,method=bind",
            &path.address(),
        ),
    );
    let mut sender = DeviceProcess::spawn(
        "failing-sender",
        &device_args(
            "sender",
            transport,
            &session.0,
            &format!("type=push,method=connect,linger={linger_ms}"),
            &path.address(),
        ),
    );
    sink.wait_for("FIRST").await?;
    kill(sink.pid(), Signal::SIGSTOP)?;
    sender.tell("go").await?;
    sender.wait_for(CLOSING_LEFT_OPEN).await?;
    Ok(FailedWithReceiverStopped {
        sink,
        sender,
        _session: session,
        path,
    })
}

/// The sender fails while its receiver is stopped with most of the messages on their way to
/// it; the receiver, continued after the sender's failure, gets every one of them.
fn stalled_receiver_gets_everything(transport: &'static str) -> Result<()> {
    block_on(async move {
        // The sender's close waits this long for a stalled receiver to take something.
        let mut failed = fail_with_receiver_stopped(transport, "stall", 20_000).await?;
        kill(failed.sink.pid(), Signal::SIGCONT)?;
        let printed = failed.sender.exited_failing().await?;
        ensure!(
            !printed.contains("were not delivered"),
            "the sender reported losses:\n{printed}"
        );
        let (code, printed) = failed.sink.exit().await?;
        ensure!(
            code == Some(0) && printed.contains("ALL"),
            "the receiver did not get every message (exit {code:?}):\n{printed}"
        );
        Ok(())
    })
}

/// The sender fails while its receiver is stopped, and the receiver is then killed: the
/// sender exits 1 with its failure and a count of the messages that were not delivered.
fn dead_receiver_is_counted(transport: &'static str) -> Result<()> {
    block_on(async move {
        let mut failed = fail_with_receiver_stopped(transport, "dead", 3000).await?;
        kill(failed.sink.pid(), Signal::SIGKILL)?;
        let _ = failed.sink.exit().await?;
        let printed = failed.sender.exited_failing().await?;
        // Its last word says both: why it failed, and what that cost. The receiver took the
        // first message; every later one was sent while it was stopped.
        let last_word = printed
            .lines()
            .find(|line| line.starts_with("ferromq: device \"sender\" failed:"))
            .with_context(|| format!("no final error line in\n{printed}"))?;
        let lost = format!(
            "channel \"data\" (push, {}): {} message(s) accepted by send were not delivered",
            failed.path.address(),
            N_MESSAGES - 1
        );
        ensure!(
            last_word.contains(FAILURE_TEXT) && last_word.contains(&lost),
            "the sender's last word does not name its failure and {lost:?}:\n{printed}"
        );
        Ok(())
    })
}
