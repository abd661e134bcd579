//! The zeromq transport across two OS processes, where zmq.rs alone loses messages: a sender
//! that exits the moment its last send returns. This test binary runs the test and, started
//! again with `FERROMQ_TEST_ROLE`, plays the sender. Every other cross-process property
//! (patterns, payload sizes, late binders, killed peers, address reuse) is in the conformance
//! suite (`crates/conformance`), run for zeromq over tcp, ipc and inproc.

mod support;

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use ferromq::prelude::*;
use ferromq::{Error, ZmqTransport};
use libtest_mimic::Arguments;
use support::{
    ChildRole, IpcPath, block_on, env_string, push_env, receive_verified, run_child_role,
    send_push_env_messages, trial,
};

const STEP: Duration = Duration::from_secs(60);

fn main() {
    if run_child_role(|role| Box::pin(run_role(role))) {
        return;
    }
    let tests = vec![trial(
        "nothing_lost_when_sender_exits_right_after_sending",
        nothing_lost_at_exit,
    )];
    libtest_mimic::run(&Arguments::from_args(), tests).exit();
}

async fn open(socket_type: SocketType, method: Method, address: &str) -> Result<Channel> {
    // Debug-build receivers verifying hundreds of MB are slow: give senders time to drain.
    let config = ChannelConfig {
        linger: 60_000,
        ..ChannelConfig::new("data", socket_type, method).with_address(address)
    };
    let mut channel = Channel::open(&ZmqTransport::new(), config, "data").await?;
    channel.attach_configured().await?;
    Ok(channel)
}

// ---------------------------------------------------------------------------------------------
// Child role

async fn run_role(role: &str) -> Result<()> {
    let address = env_string("ADDRESS");
    match role {
        "push" => {
            let channel = open(SocketType::Push, Method::Connect, &address).await?;
            send_push_env_messages(channel).await?;
        }
        other => bail!("unknown role {other}"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Test

fn nothing_lost_at_exit() -> Result<()> {
    block_on(async {
        // zmq.rs alone loses ~100 000 of 1 M queued messages when the sender exits right away.
        let path = IpcPath::new("linger");
        let mut pull = open(SocketType::Pull, Method::Bind, &path.address()).await?;
        let n_msgs = 200_000;
        let mut child = ChildRole::spawn("push", &push_env(&path.address(), "64", 1, n_msgs));
        // The sender closes its channel and exits the moment its last send returns; everything
        // it acknowledged must still arrive.
        receive_verified(&mut pull, n_msgs, 1).await?;
        ensure!(child.exit_code(STEP).await == 0, "sender failed");
        let extra = pull.receive_timeout(Duration::from_millis(100)).await;
        ensure!(
            matches!(extra, Err(Error::Timeout { .. })),
            "no message beyond the {n_msgs} sent"
        );
        Ok(())
    })
}
