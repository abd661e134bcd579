//! The scenarios whose property is about processes: a sender that exits right after its last
//! send, a receiver killed mid-stream, a sender killed mid-stream. The other end runs in a child
//! process, this test binary re-executed in a role (`FERROMQ_CONFORMANCE_ROLE`), with the
//! trial's session so that both ends share it. Children are killed when their handle drops, so a
//! failing scenario leaves no process behind.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ferromq_core::{Address, Method, SocketType};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::failure::{During, Failure};
use crate::fixture::{Fixture, TrialEnv, parse, watch};
use crate::payload::{message, verify};
use crate::{ROLE_VAR, Scenario, Suite};

pub(crate) static ALL: &[Scenario] = &[
    scenario!(nothing_is_lost_when_the_sender_exits_right_after_sending),
    scenario!(a_receiver_killed_mid_stream_is_reported_to_the_sender),
    scenario!(a_killed_sender_leaves_the_receiver_usable_for_a_new_sender),
    scenario!(a_busy_polled_receiver_gets_every_message_of_another_process),
];

const SESSION_VAR: &str = "FERROMQ_CONFORMANCE_SESSION";
const ADDRESS_VAR: &str = "FERROMQ_CONFORMANCE_ADDRESS";
const COUNT_VAR: &str = "FERROMQ_CONFORMANCE_COUNT";
const SIZE_VAR: &str = "FERROMQ_CONFORMANCE_SIZE";
/// Set to 1: after its last send the child says `sent` and waits for its stdin to close before
/// it closes the channel (so the parent can kill it while it is connected).
const HOLD_VAR: &str = "FERROMQ_CONFORMANCE_HOLD";

/// A child of this test binary in a role, killed when dropped.
struct ChildRole {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl ChildRole {
    fn spawn(env: &TrialEnv, role: &str, vars: &[(&str, String)]) -> Result<ChildRole, Failure> {
        let exe = std::env::current_exe()
            .map_err(|error| Failure::call("finding the test binary", &error))?;
        let mut command = Command::new(exe);
        command
            .env(ROLE_VAR, role)
            .env(SESSION_VAR, env.session())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (key, value) in vars {
            command.env(key, value);
        }
        let mut child = command
            .spawn()
            .map_err(|error| Failure::call(&format!("starting the {role} child"), &error))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(Failure::expectation(
                "the child's stdin and stdout are not piped",
            ));
        };
        Ok(ChildRole {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
        })
    }

    /// Waits for the child to print `expected`.
    async fn expect_line(&mut self, expected: &str) -> Result<(), Failure> {
        let mut line = String::new();
        let what = format!("the child to say {expected:?}");
        let n_read = watch(&what, self.stdout.read_line(&mut line))
            .await?
            .map_err(|error| Failure::call("reading the child's output", &error))?;
        if n_read == 0 || line.trim() != expected {
            return Err(Failure::expectation(format!(
                "the child said {:?} instead of {expected:?}",
                line.trim()
            )));
        }
        Ok(())
    }

    /// Lets a holding child go on (closes its stdin).
    fn release(&mut self) {
        self.stdin = None;
    }

    async fn kill(&mut self) -> Result<(), Failure> {
        self.child
            .kill()
            .await
            .map_err(|error| Failure::call("killing the child", &error))
    }

    async fn exit_code(&mut self) -> Result<Option<i32>, Failure> {
        let status = watch("the child to exit", self.child.wait())
            .await?
            .map_err(|error| Failure::call("waiting for the child", &error))?;
        Ok(status.code())
    }
}

fn push_vars(
    address: &Address,
    count: u64,
    size: usize,
    hold: bool,
) -> Vec<(&'static str, String)> {
    vec![
        (ADDRESS_VAR, address.to_string()),
        (COUNT_VAR, count.to_string()),
        (SIZE_VAR, size.to_string()),
        (HOLD_VAR, u8::from(hold).to_string()),
    ]
}

async fn receive_all(
    pull: &mut ferromq_core::Channel,
    count: u64,
    size: usize,
) -> Result<(), Failure> {
    for idx in 0..count {
        let what = format!("receiving message {idx} of {count}");
        let received = watch(&what, pull.receive()).await?.during(&what)?;
        verify(idx, size, received.data())?;
    }
    Ok(())
}

async fn nothing_is_lost_when_the_sender_exits_right_after_sending(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let (pull, address) = fixture.bound(SocketType::Pull).await?;
    everything_from_a_sender_process(&fixture, pull, &address, 20_000, 256).await
}

/// A child process pushes `count` messages of `size` bytes to `pull` (bound at `address`) and
/// exits: every message arrives intact and in order, and the child exits 0.
async fn everything_from_a_sender_process(
    fixture: &Fixture,
    mut pull: ferromq_core::Channel,
    address: &Address,
    count: u64,
    size: usize,
) -> Result<(), Failure> {
    let mut sender = ChildRole::spawn(
        &fixture.env,
        "push",
        &push_vars(address, count, size, false),
    )?;
    receive_all(&mut pull, count, size).await?;
    match sender.exit_code().await? {
        Some(0) => Ok(()),
        code => Err(Failure::expectation(format!(
            "the sender exited with {code:?} after all {count} messages arrived"
        ))),
    }
}

/// `busyPoll`: the receive spins instead of sleeping, and still gets every message of a sender
/// in another process, whatever the first ones need before they can be handed out (shmem maps
/// the sender's memory off the async threads).
async fn a_busy_polled_receiver_gets_every_message_of_another_process(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let mut config = Fixture::config(SocketType::Pull, Method::Bind);
    config.busy_poll = true;
    let (pull, address) = fixture.bound_with(config).await?;
    // 4 KiB: above shmem's inline limit, in blocks of the sender's segment.
    everything_from_a_sender_process(&fixture, pull, &address, 2_000, 4096).await
}

async fn a_receiver_killed_mid_stream_is_reported_to_the_sender(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const BEFORE_KILL: u64 = 100;
    const LIMIT: u64 = 100_000;
    const SIZE: usize = 1024;
    let mut config = Fixture::config(SocketType::Push, Method::Bind);
    config.linger = 1000;
    let (mut push, address) = fixture.bound_with(config).await?;
    let mut receiver = ChildRole::spawn(
        &fixture.env,
        "pull",
        &[
            (ADDRESS_VAR, address.to_string()),
            (COUNT_VAR, BEFORE_KILL.to_string()),
            (SIZE_VAR, SIZE.to_string()),
        ],
    )?;
    for idx in 0..BEFORE_KILL {
        let sent = message(fixture.transport(), idx, SIZE).await?;
        let what = format!("sending message {idx} to the child");
        watch(&what, push.send(sent)).await?.during(&what)?;
    }
    receiver
        .expect_line(&format!("received {BEFORE_KILL}"))
        .await?;
    receiver.kill().await?;

    // Sends go on into the void; the loss must surface: a send that fails (handing its message
    // back) or a close that reports what it could not deliver.
    for idx in BEFORE_KILL..LIMIT {
        let sent = message(fixture.transport(), idx, SIZE).await?;
        let outcome = watch(
            "a send to a killed receiver",
            push.send_timeout(sent, Duration::from_millis(500)),
        )
        .await?;
        if let Err(failed) = outcome {
            return verify(idx, SIZE, failed.message.data());
        }
    }
    match watch("closing a push whose receiver was killed", push.close()).await? {
        Err(_) => Ok(()),
        Ok(()) => Err(Failure::expectation(format!(
            "{LIMIT} messages sent to a receiver killed after {BEFORE_KILL}, and neither a send \
             nor close reported a loss"
        ))),
    }
}

async fn a_killed_sender_leaves_the_receiver_usable_for_a_new_sender(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const FIRST: u64 = 500;
    const SECOND: u64 = 100;
    const SIZE: usize = 512;
    let (mut pull, address) = fixture.bound(SocketType::Pull).await?;
    let mut first = ChildRole::spawn(
        &fixture.env,
        "push",
        &push_vars(&address, FIRST, SIZE, true),
    )?;
    receive_all(&mut pull, FIRST, SIZE).await?;
    first.expect_line("sent").await?;
    first.kill().await?;
    drop(first);

    // The receiver is not broken by its peer's death: it may report the death (ofi says "peer
    // gone", zeromq says nothing) and receives nothing more from it; then a new sender gets
    // through. The new sender starts after the report or a quiet while: an ofi binder that has
    // not yet noticed the death refuses a second peer (ofi channels are one-to-one).
    let mut n_reports = 0;
    match pull.receive_timeout(Duration::from_secs(2)).await {
        Ok(message) => {
            return Err(Failure::expectation(format!(
                "a message of {} bytes arrived after all {FIRST} sent were received",
                message.len()
            )));
        }
        Err(ferromq_core::Error::PeerGone { .. }) => n_reports += 1,
        Err(ferromq_core::Error::Timeout { .. }) => {}
        Err(error) => {
            return Err(Failure::call(
                "receiving after the sender was killed",
                &error,
            ));
        }
    }
    let mut second = ChildRole::spawn(
        &fixture.env,
        "push",
        &push_vars(&address, SECOND, SIZE, false),
    )?;
    let mut idx = 0;
    while idx < SECOND {
        let what = format!("receiving message {idx} of the second sender");
        match watch(&what, pull.receive()).await? {
            Ok(received) => {
                verify(idx, SIZE, received.data())?;
                idx += 1;
            }
            Err(ferromq_core::Error::PeerGone { .. }) if n_reports == 0 && idx == 0 => {
                n_reports += 1;
            }
            Err(error) => return Err(Failure::call(&what, &error)),
        }
    }
    second.release();
    match second.exit_code().await? {
        Some(0) => Ok(()),
        code => Err(Failure::expectation(format!(
            "the second sender exited with {code:?} after all {SECOND} messages arrived"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Child roles

/// Runs `role` in this (child) process; the exit code: 0, or 1 after printing why to stderr.
pub(crate) fn run_child(suite: &Arc<Suite>, role: &str) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("child role {role}: cannot build a runtime: {error}");
            return 1;
        }
    };
    let outcome = runtime.block_on(child_role(suite, role));
    match outcome {
        Ok(()) => 0,
        Err(failure) => {
            eprintln!("child role {role} failed: {failure}");
            1
        }
    }
}

fn var(key: &str) -> Result<String, Failure> {
    std::env::var(key).map_err(|_| Failure::expectation(format!("the child role needs {key}")))
}

fn number<T: std::str::FromStr>(key: &str) -> Result<T, Failure> {
    let text = var(key)?;
    text.parse()
        .map_err(|_| Failure::expectation(format!("{key}={text:?} is not a number")))
}

async fn child_role(suite: &Arc<Suite>, role: &str) -> Result<(), Failure> {
    let env = TrialEnv::from_session(var(SESSION_VAR)?);
    let fixture = Fixture::new(Arc::clone(suite), env);
    let address = parse(&var(ADDRESS_VAR)?)?;
    let count: u64 = number(COUNT_VAR)?;
    let size: usize = number(SIZE_VAR)?;
    match role {
        "push" => {
            let mut push = fixture.connected(SocketType::Push, &address).await?;
            for idx in 0..count {
                let sent = message(fixture.transport(), idx, size).await?;
                let what = format!("sending message {idx}");
                watch(&what, push.send(sent)).await?.during(&what)?;
            }
            if number::<u8>(HOLD_VAR)? == 1 {
                println!("sent");
                // Until the parent closes our stdin (or kills us).
                let _ = tokio::task::spawn_blocking(|| {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line)
                })
                .await;
            }
            watch("closing the push", push.close())
                .await?
                .during("closing the push")
        }
        "pull" => {
            let mut pull = fixture.connected(SocketType::Pull, &address).await?;
            receive_all(&mut pull, count, size).await?;
            // Rust's stdout flushes at the newline.
            println!("received {count}");
            // Receives on until killed.
            loop {
                let _ = pull.receive().await.during("receiving on")?;
            }
        }
        other => Err(Failure::expectation(format!(
            "unknown child role {other:?}"
        ))),
    }
}
