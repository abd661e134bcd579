//! The ofi transport across two OS processes over libfabric's tcp provider on loopback: this test
//! binary runs the tests and, started again with `FERROMQ_TEST_ROLE`, plays the peer.
//! Built only with `--features ofi`.

mod support;

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ferromq::prelude::*;
use ferromq::{Error, OfiOptions, OfiTransport};
use libtest_mimic::Arguments;
use support::{
    ChildRole, block_on, env_string, payload, push_env, receive_verified, run_child_role,
    send_push_env_messages, trial, verify,
};

const STEP: Duration = Duration::from_secs(60);

fn main() {
    if run_child_role(|role| Box::pin(run_role(role))) {
        return;
    }
    let tests = vec![
        trial(
            "push_pull_64_b_1_mib_64_mib_checksummed",
            push_pull_payloads,
        ),
        trial("push_pull_multipart_of_3_parts", push_pull_multipart),
        trial(
            "nothing_lost_when_sender_exits_right_after_sending",
            nothing_lost_at_exit,
        ),
        trial("receiver_started_after_the_sender", late_receiver),
        trial("sender_killed_mid_stream_is_reported", sender_killed),
        trial("receiver_killed_mid_stream_is_reported", receiver_killed),
    ];
    libtest_mimic::run(&Arguments::from_args(), tests).exit();
}

fn transport() -> OfiTransport {
    OfiTransport::new(OfiOptions::default())
}

async fn open(socket_type: SocketType, method: Method, address: &str) -> Result<Channel> {
    let config = ChannelConfig {
        linger: 60_000,
        ..ChannelConfig::new("data", socket_type, method).with_address(address)
    };
    let mut channel = Channel::open(&transport(), config, "data").await?;
    channel.attach_configured().await?;
    Ok(channel)
}

/// A free loopback port for a binder that starts after its connector.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local address").port()
}

// ---------------------------------------------------------------------------------------------
// Child roles

async fn run_role(role: &str) -> Result<()> {
    let address = env_string("ADDRESS");
    match role {
        "push" | "bind-push" => {
            let method = if role == "push" {
                Method::Connect
            } else {
                Method::Bind
            };
            let channel = open(SocketType::Push, method, &address).await?;
            send_push_env_messages(channel).await?;
        }
        "pull" => {
            let mut channel = open(SocketType::Pull, Method::Connect, &address).await?;
            let first = channel.receive().await?;
            println!("received {}", first.len());
            loop {
                channel.receive().await?;
            }
        }
        other => bail!("unknown role {other}"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests

fn push_pull_payloads() -> Result<()> {
    block_on(async {
        let mut pull = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = pull.bound_address().context("bound")?.to_string();
        ensure!(!address.ends_with(":0"), "bind reports the real port");
        // 64 MiB travels in 8 chunks of the default 8 MiB.
        let sizes = "64,1048576,67108864";
        let mut child = ChildRole::spawn("push", &push_env(&address, sizes, 1, 9));
        receive_verified(&mut pull, 9, 1).await?;
        ensure!(child.exit_code(STEP).await == 0, "sender failed");
        Ok(())
    })
}

fn push_pull_multipart() -> Result<()> {
    block_on(async {
        let mut pull = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = pull.bound_address().context("bound")?.to_string();
        let mut child = ChildRole::spawn("push", &push_env(&address, "0,300000,17", 3, 500));
        receive_verified(&mut pull, 500, 3).await?;
        ensure!(child.exit_code(STEP).await == 0, "sender failed");
        Ok(())
    })
}

fn nothing_lost_at_exit() -> Result<()> {
    block_on(async {
        let mut pull = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = pull.bound_address().context("bound")?.to_string();
        let n_msgs = 20_000;
        let mut child = ChildRole::spawn("push", &push_env(&address, "64,4096", 1, n_msgs));
        // The sender closes and exits the moment its last send returns; everything it
        // acknowledged must still arrive.
        receive_verified(&mut pull, n_msgs, 1).await?;
        ensure!(child.exit_code(STEP).await == 0, "sender failed");
        let extra = pull.receive_timeout(Duration::from_millis(100)).await;
        ensure!(
            matches!(extra, Err(Error::Timeout { .. })),
            "no message beyond the {n_msgs} sent: {extra:?}"
        );
        Ok(())
    })
}

fn late_receiver() -> Result<()> {
    block_on(async {
        // The sender connects and sends before anything listens; the receiver binds later.
        let address = format!("tcp://127.0.0.1:{}", free_port());
        let mut child = ChildRole::spawn("push", &push_env(&address, "1000", 1, 1000));
        let mut pull = open(SocketType::Pull, Method::Bind, &address).await?;
        receive_verified(&mut pull, 1000, 1).await?;
        ensure!(child.exit_code(STEP).await == 0, "sender failed");
        Ok(())
    })
}

fn sender_killed() -> Result<()> {
    block_on(async {
        let mut pull = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = pull.bound_address().context("bound")?.to_string();
        let mut sender = ChildRole::spawn("push", &push_env(&address, "65536", 1, 0));
        receive_verified(&mut pull, 100, 1).await?;
        sender.kill().await;
        // What arrived whole is delivered; then the death is reported, not a hang.
        let error = loop {
            match tokio::time::timeout(STEP, pull.receive()).await? {
                Ok(message) => verify(support::index_of(message.data()), message.data())
                    .map_err(anyhow::Error::msg)?,
                Err(error) => break error,
            }
        };
        ensure!(
            matches!(error, Error::PeerGone { .. }),
            "expected PeerGone, got {error:?}"
        );
        Ok(())
    })
}

fn receiver_killed() -> Result<()> {
    block_on(async {
        let mut push = open(SocketType::Push, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = push.bound_address().context("bound")?.to_string();
        let mut receiver = ChildRole::spawn("pull", &[("ADDRESS", address)]);
        let mut msg_idx = 0;
        // Keep sending while the receiver starts, receives, and is killed.
        let sending = async {
            loop {
                let sent = push
                    .send_timeout(Message::from(payload(msg_idx, 65536)), STEP)
                    .await;
                if let Err(failed) = sent {
                    break failed.error;
                }
                msg_idx += 1;
            }
        };
        let killing = async {
            let line = receiver.line(STEP).await;
            assert!(line.starts_with("received"), "{line}");
            receiver.kill().await;
            std::future::pending::<()>().await
        };
        let error = tokio::select! {
            error = sending => error,
            () = killing => unreachable!(),
        };
        ensure!(
            matches!(error, Error::PeerGone { .. }),
            "expected PeerGone, got {error:?}"
        );
        Ok(())
    })
}
