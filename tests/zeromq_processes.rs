//! The zeromq transport across two OS processes: this test binary runs the tests and, started
//! again with `FERROMQ_TEST_ROLE`, plays the peer.

mod support;

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ferromq::prelude::*;
use ferromq::{Error, ZmqTransport};
use libtest_mimic::Arguments;
use support::{
    ChildRole, IpcPath, block_on, env_number, env_string, payload, push_env, receive_verified,
    run_child_role, send_push_env_messages, trial, verify,
};

const STEP: Duration = Duration::from_secs(60);

fn main() {
    if run_child_role(|role| Box::pin(run_role(role))) {
        return;
    }
    let tests = vec![
        trial(
            "push_pull_tcp_payloads_from_0_b_to_64_mib",
            push_pull_tcp_payloads,
        ),
        trial(
            "push_pull_ipc_multipart_of_3_frames",
            push_pull_ipc_multipart,
        ),
        trial(
            "nothing_lost_when_sender_exits_right_after_sending",
            nothing_lost_at_exit,
        ),
        trial("pub_sub_with_topic_filter", pub_sub_topic_filter),
        trial("req_rep_round_trips", req_rep),
        trial("pair_ping_pong", pair_ping_pong),
        trial("receiver_connects_before_sender_binds", late_binder),
        trial(
            "sender_killed_mid_stream_then_a_new_sender_reconnects",
            sender_killed,
        ),
        trial(
            "receiver_killed_mid_stream_sender_times_out_with_message",
            receiver_killed,
        ),
        trial("address_in_use_is_reported", address_in_use),
    ];
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
// Child roles

async fn run_role(role: &str) -> Result<()> {
    let address = env_string("ADDRESS");
    match role {
        "push" => {
            let channel = open(SocketType::Push, Method::Connect, &address).await?;
            send_push_env_messages(channel).await?;
        }
        "bind-push" => {
            let n_msgs = env_number("COUNT");
            let mut channel = open(SocketType::Push, Method::Bind, &address).await?;
            for msg_idx in 0..n_msgs {
                channel
                    .send(Message::from(payload(msg_idx, 64)))
                    .await
                    .map_err(|failed| failed.error)?;
            }
            channel.close().await?;
        }
        "pull" => {
            let mut channel = open(SocketType::Pull, Method::Connect, &address).await?;
            loop {
                channel.receive().await?;
            }
        }
        "pub" => {
            let mut channel = open(SocketType::Pub, Method::Connect, &address).await?;
            for msg_idx in 0u64.. {
                let topic = if msg_idx.is_multiple_of(2) { "a" } else { "b" };
                let parts: Parts =
                    vec![Message::from(topic), Message::from(payload(msg_idx, 128))].into();
                channel
                    .send_parts(parts)
                    .await
                    .map_err(|failed| failed.error)?;
                if msg_idx.is_multiple_of(64) {
                    // Pub drops for a slow subscriber; yielding keeps the drops few.
                    tokio::task::yield_now().await;
                }
            }
        }
        "req" => {
            let n_msgs = env_number("COUNT");
            let mut channel = open(SocketType::Req, Method::Connect, &address).await?;
            for msg_idx in 0..n_msgs {
                channel
                    .send(Message::from(payload(msg_idx, 256)))
                    .await
                    .map_err(|failed| failed.error)?;
                let reply = channel.receive().await?;
                let mut expected = payload(msg_idx, 256);
                expected.reverse();
                ensure!(
                    reply.data() == expected,
                    "reply {msg_idx} is not the reversed request"
                );
            }
            channel.close().await?;
        }
        "pair" => {
            let n_msgs = env_number("COUNT");
            let mut channel = open(SocketType::Pair, Method::Connect, &address).await?;
            for _ in 0..n_msgs {
                let message = channel.receive().await?;
                channel.send(message).await.map_err(|failed| failed.error)?;
            }
            channel.close().await?;
        }
        other => bail!("unknown role {other}"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests

fn push_pull_tcp_payloads() -> Result<()> {
    block_on(async {
        let mut pull = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = pull.bound_address().context("bound")?.to_string();
        ensure!(
            !address.ends_with(":0"),
            "bind reports the real port, got {address}"
        );
        let sizes = "0,1,64,1024,65536,1048576,67108864";
        let mut child = ChildRole::spawn("push", &push_env(&address, sizes, 1, 7));
        receive_verified(&mut pull, 7, 1).await?;
        ensure!(child.exit_code(STEP).await == 0, "sender failed");
        Ok(())
    })
}

fn push_pull_ipc_multipart() -> Result<()> {
    block_on(async {
        let path = IpcPath::new("multipart");
        let mut pull = open(SocketType::Pull, Method::Bind, &path.address()).await?;
        let mut child =
            ChildRole::spawn("push", &push_env(&path.address(), "0,300000,17", 3, 1000));
        receive_verified(&mut pull, 1000, 3).await?;
        ensure!(child.exit_code(STEP).await == 0, "sender failed");
        pull.close().await?;
        ensure!(
            !path.0.exists(),
            "closing the binder removes its ipc socket file"
        );
        Ok(())
    })
}

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

fn pub_sub_topic_filter() -> Result<()> {
    block_on(async {
        let config = ChannelConfig::new("updates", SocketType::Sub, Method::Bind)
            .with_address("tcp://127.0.0.1:0");
        let mut sub = Channel::open(&ZmqTransport::new(), config, "updates").await?;
        sub.subscribe("a").await?;
        let address = sub.bind_configured().await?.to_string();
        let mut publisher = ChildRole::spawn("pub", &[("ADDRESS", address)]);
        for _ in 0..200 {
            let parts = tokio::time::timeout(STEP, sub.receive_parts()).await??;
            ensure!(parts.len() == 2, "topic and payload");
            ensure!(
                parts.get(0).context("topic")?.data() == b"a",
                "only topic a passes the filter"
            );
            let body = parts.get(1).context("payload")?.data();
            verify(support::index_of(body), body).map_err(anyhow::Error::msg)?;
        }
        publisher.kill().await;
        Ok(())
    })
}

fn req_rep() -> Result<()> {
    block_on(async {
        let path = IpcPath::new("reqrep");
        let mut rep = open(SocketType::Rep, Method::Bind, &path.address()).await?;
        let mut client = ChildRole::spawn(
            "req",
            &[("ADDRESS", path.address()), ("COUNT", "500".into())],
        );
        for msg_idx in 0..500 {
            let request = tokio::time::timeout(STEP, rep.receive()).await??;
            verify(msg_idx, request.data()).map_err(anyhow::Error::msg)?;
            let mut reply = request.data().to_vec();
            reply.reverse();
            rep.send(Message::from(reply))
                .await
                .map_err(|failed| failed.error)?;
        }
        ensure!(
            client.exit_code(STEP).await == 0,
            "client saw a wrong reply"
        );
        Ok(())
    })
}

fn pair_ping_pong() -> Result<()> {
    block_on(async {
        let mut pair = open(SocketType::Pair, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = pair.bound_address().context("bound")?.to_string();
        let mut peer = ChildRole::spawn("pair", &[("ADDRESS", address), ("COUNT", "300".into())]);
        for msg_idx in 0..300 {
            pair.send(Message::from(payload(msg_idx, 1000)))
                .await
                .map_err(|failed| failed.error)?;
            let echo = tokio::time::timeout(STEP, pair.receive()).await??;
            verify(msg_idx, echo.data()).map_err(anyhow::Error::msg)?;
        }
        ensure!(peer.exit_code(STEP).await == 0, "pair peer failed");
        Ok(())
    })
}

fn late_binder() -> Result<()> {
    block_on(async {
        let path = IpcPath::new("late");
        let config = ChannelConfig::new("data", SocketType::Pull, Method::Connect)
            .with_address(path.address());
        let mut pull = Channel::open(&ZmqTransport::new(), config, "data").await?;
        // The connect starts first; the binder appears while it waits.
        let env = [("ADDRESS", path.address()), ("COUNT", "1000".into())];
        let (connected, mut sender) = tokio::join!(pull.connect_configured(), async {
            tokio::task::yield_now().await;
            ChildRole::spawn("bind-push", &env)
        });
        connected?;
        receive_verified(&mut pull, 1000, 1).await?;
        ensure!(sender.exit_code(STEP).await == 0, "late binder failed");
        Ok(())
    })
}

fn sender_killed() -> Result<()> {
    block_on(async {
        let mut pull = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
        let address = pull.bound_address().context("bound")?.to_string();
        let mut sender = ChildRole::spawn("push", &push_env(&address, "4096", 1, 0));
        receive_verified(&mut pull, 100, 1).await?;
        sender.kill().await;
        // Drain what the dead sender had already written, then the survivor times out: no hang.
        let outcome = loop {
            match pull.receive_timeout(Duration::from_millis(500)).await {
                Ok(message) => verify(support::index_of(message.data()), message.data())
                    .map_err(anyhow::Error::msg)?,
                Err(error) => break error,
            }
        };
        ensure!(outcome.is_timeout(), "expected a timeout, got {outcome}");
        // A new sender connects to the same survivor and is heard.
        let mut second = ChildRole::spawn("push", &push_env(&address, "64", 1, 50));
        receive_verified(&mut pull, 50, 1).await?;
        ensure!(second.exit_code(STEP).await == 0, "second sender failed");
        Ok(())
    })
}

fn receiver_killed() -> Result<()> {
    block_on(async {
        let config = ChannelConfig {
            snd_buf_size: 100,
            ..ChannelConfig::new("data", SocketType::Push, Method::Bind)
                .with_address("tcp://127.0.0.1:0")
        };
        let mut push = Channel::open(&ZmqTransport::new(), config, "data").await?;
        let address = push
            .bind_configured()
            .await?
            .for_local_connect()
            .to_string();
        let mut receiver = ChildRole::spawn("pull", &[("ADDRESS", address)]);
        for msg_idx in 0..1000 {
            push.send(Message::from(payload(msg_idx, 1024)))
                .await
                .map_err(|failed| failed.error)?;
        }
        receiver.kill().await;
        // With no receiver, the queue fills and a send times out, handing the message back.
        let mut msg_idx = 1000u64;
        let failed = loop {
            let message = Message::from(payload(msg_idx, 1024));
            match push.send_timeout(message, Duration::from_millis(200)).await {
                Ok(()) => msg_idx += 1,
                Err(failed) => break failed,
            }
            ensure!(
                msg_idx < 1_000_000,
                "sends never blocked without a receiver"
            );
        };
        ensure!(
            failed.error.is_timeout(),
            "expected a timeout, got {}",
            failed.error
        );
        verify(msg_idx, failed.message.data()).map_err(anyhow::Error::msg)?;
        Ok(())
    })
}

fn address_in_use() -> Result<()> {
    block_on(async {
        let first = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
        let taken = first.bound_address().context("bound")?.to_string();
        let second = open(SocketType::Pull, Method::Bind, &taken).await;
        let error = second.err().context("second bind must fail")?;
        let error = error.downcast::<Error>()?;
        ensure!(matches!(error, Error::AddressInUse { .. }), "got {error}");
        ensure!(
            error.to_string().contains(&taken),
            "the error names the address: {error}"
        );

        let path = IpcPath::new("inuse");
        let _ipc = open(SocketType::Pull, Method::Bind, &path.address()).await?;
        let error = open(SocketType::Pull, Method::Bind, &path.address())
            .await
            .err()
            .context("ipc")?;
        ensure!(
            matches!(error.downcast::<Error>()?, Error::AddressInUse { .. }),
            "ipc in use"
        );
        Ok(())
    })
}
