//! A pull in another process that takes a few messages and closes while its push still sends
//! accounts, with the push, for every message the push's `send` accepted: each was taken, or
//! counted by the pull's close (it reached the pull, which did not take it) or by the push's
//! (never written whole). Over tcp the pull's `shutdown(SHUT_RD)` told the push nothing: the
//! push went on writing into a connection the pull then dropped, and thousands of messages the
//! push had written were counted by nobody. Now the pull shuts its own writing instead, which
//! a ferromq push sees before its next batch: it stops writing and shuts its own, and the pull
//! reads up to that end.
//!
//! The pull is this test re-executed (`FERROMQ_TEST_ROLE=pull`, the test's own name as the
//! filter): it prints `unread N` once closed.

use std::process::Stdio;
use std::time::Duration;

use ferromq_core::{Channel, ChannelConfig, Error, Message, Method, SocketType};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

mod support;

const ROLE_VAR: &str = "FERROMQ_TEST_ROLE";
const ADDRESS_VAR: &str = "FERROMQ_TEST_ADDRESS";
/// What the pull takes before it closes.
const N_TAKEN: u64 = 5;
/// The longest wait for one step of the test.
const STEP: Duration = Duration::from_secs(30);

fn config(socket_type: SocketType, method: Method, address: &str) -> ChannelConfig {
    let mut config = ChannelConfig::new("data", socket_type, method).with_address(address);
    // A small inbox: the kernel's buffers fill behind it and the push keeps writing.
    config.rcv_buf_size = 10;
    // The pull's close reads this host's buffers (at least a second, whatever its linger); the
    // push's waits this long for a peer before it counts what is left.
    config.linger = 200;
    config
}

fn n_undelivered(closed: Result<(), Error>) -> u64 {
    match closed {
        Ok(()) => 0,
        Err(Error::Undelivered { n_messages, .. }) => n_messages,
        Err(other) => panic!("a close failed otherwise: {other}"),
    }
}

/// This test binary, to run test `test_name` alone in `role` against `address`; killed when
/// dropped, its stderr the test's.
fn role_process(test_name: &str, role: &str, address: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args(["--exact", test_name, "--nocapture", "--test-threads", "1"])
        .env(ROLE_VAR, role)
        .env(ADDRESS_VAR, address)
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    command
}

/// Takes `n` messages from `pull`, each within the step.
async fn take(pull: &mut Channel, n: u64) {
    for _ in 0..n {
        tokio::time::timeout(STEP, pull.receive())
            .await
            .expect("a message within the step")
            .expect("receive");
    }
}

/// The child of the stopped-push test: connects a push and sends 1-KiB messages until it is
/// killed.
async fn push_role(address: &str) {
    let mut push = support::open(config(SocketType::Push, Method::Connect, address)).await;
    loop {
        let _ = push
            .send_timeout(Message::from(vec![7u8; 1024]), Duration::from_millis(50))
            .await;
    }
}

/// The child: connects, waits for a line on its stdin (the push is held back: the kernel's
/// buffers between them are full), takes `N_TAKEN`, closes, says how many it did not take.
async fn pull_role(address: &str) {
    let mut pull = support::open(config(SocketType::Pull, Method::Connect, address)).await;
    tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
        .await
        .expect("reading stdin")
        .expect("the parent's go");
    take(&mut pull, N_TAKEN).await;
    let unread = n_undelivered(pull.close().await);
    println!("unread {unread}");
}

/// The parent: binds a push at `address`, sends 1-KiB messages until the pull says it closed
/// (telling the pull to go on once a send had to wait), then closes: taken + unread + unsent
/// must be what was accepted.
async fn push_against_a_closing_pull_process(test_name: &str, address: &str) {
    if let Ok(role) = std::env::var(ROLE_VAR) {
        assert_eq!(role, "pull", "unknown role");
        pull_role(&std::env::var(ADDRESS_VAR).expect("the address")).await;
        return;
    }
    let mut push: Channel = support::open(config(SocketType::Push, Method::Bind, address)).await;
    let mut child = role_process(test_name, "pull", address)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the pull's process");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut go = Some(child.stdin.take().expect("piped"));
    let mut n_accepted = 0u64;
    let streaming = async {
        loop {
            // A send cut short by the child's line is not accepted: it hands nothing over.
            tokio::select! {
                line = lines.next_line() => {
                    let line = line.expect("the child's output").expect("the child said `unread N`");
                    // The child's test harness prints the test's name before it, on one line.
                    if let Some((_, unread)) = line.rsplit_once("unread ") {
                        break unread.parse::<u64>().expect("a count");
                    }
                }
                sent = push.send_timeout(Message::from(vec![7u8; 1024]), Duration::from_millis(50)) => {
                    if sent.is_ok() {
                        n_accepted += 1;
                    } else if let Some(mut stdin) = go.take() {
                        stdin.write_all(b"go\n").await.expect("telling the pull to go on");
                    }
                }
            }
        }
    };
    let unread = tokio::time::timeout(STEP, streaming)
        .await
        .expect("the pull closed within the step");
    let status = tokio::time::timeout(STEP, child.wait())
        .await
        .expect("the child's exit")
        .expect("waiting for the child");
    assert!(status.success(), "the pull's process: {status}");
    let unsent = n_undelivered(push.close().await);
    assert_eq!(
        N_TAKEN + unread + unsent,
        n_accepted,
        "{address}: taken {N_TAKEN}, unread {unread}, unsent {unsent} of {n_accepted} accepted"
    );
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_process_closing_mid_stream_over_tcp_accounts_for_every_accepted_message() {
    // (The child takes the parent's address from its environment, not this one.)
    let address = format!("tcp://127.0.0.1:{}", free_tcp_port());
    push_against_a_closing_pull_process(
        "a_pull_process_closing_mid_stream_over_tcp_accounts_for_every_accepted_message",
        &address,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_process_closing_mid_stream_over_ipc_accounts_for_every_accepted_message() {
    let path = std::env::temp_dir().join(format!("ferromq-close-count-{}.ipc", std::process::id()));
    let address = format!("ipc://{}", path.display());
    push_against_a_closing_pull_process(
        "a_pull_process_closing_mid_stream_over_ipc_accounts_for_every_accepted_message",
        &address,
    )
    .await;
    let _ = std::fs::remove_file(&path);
}

/// A pull closing over tcp while its push (another process) is stopped, so that it never
/// answers the pull's end of writing: the close shuts its reading after half a second and ends,
/// instead of reading, for its whole linger (30 s here), a connection nothing comes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_closing_over_tcp_while_its_push_process_is_stopped_ends_without_its_linger() {
    const NAME: &str =
        "a_pull_closing_over_tcp_while_its_push_process_is_stopped_ends_without_its_linger";
    if let Ok(role) = std::env::var(ROLE_VAR) {
        assert_eq!(role, "push", "unknown role");
        push_role(&std::env::var(ADDRESS_VAR).expect("the address")).await;
        return;
    }
    let address = format!("tcp://127.0.0.1:{}", free_tcp_port());
    let mut pull_config = config(SocketType::Pull, Method::Bind, &address);
    pull_config.linger = 30_000;
    let mut pull = support::open(pull_config).await;
    let child = role_process(NAME, "push", &address)
        .stdout(Stdio::null())
        .spawn()
        .expect("the push's process");
    let pid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
    take(&mut pull, N_TAKEN).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("stopping the push");
    let started = tokio::time::Instant::now();
    let closed = tokio::time::timeout(STEP, pull.close()).await;
    let took = started.elapsed();
    // SIGKILL (the child's drop) ends a stopped process too.
    drop(child);
    let closed = closed.unwrap_or_else(|_| panic!("the close took over {STEP:?}"));
    assert!(
        took < Duration::from_secs(10),
        "the close took {took:?} ({closed:?})"
    );
    assert!(
        n_undelivered(closed) > 0,
        "the pull's inbox held messages it did not take"
    );
}
