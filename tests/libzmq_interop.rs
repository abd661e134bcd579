//! Wire compatibility with libzmq, the C library FairMQ and most ZeroMQ programs use.
//!
//! libzmq runs on its own blocking threads; ferromq on tokio. Payloads are checksummed by their
//! deterministic content, multipart messages keep their frame boundaries.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferromq::ZmqTransport;
use ferromq::prelude::*;
use support::{payload, verify};

const STEP: Duration = Duration::from_secs(30);
const N_MSGS: u64 = 2000;
const FRAME_SIZES: [usize; 3] = [0, 300_000, 64];

async fn open(socket_type: SocketType, method: Method, address: &str) -> Result<Channel> {
    let mut config = ChannelConfig::new("data", socket_type, method).with_address(address);
    // A close waits as long as the test's own step, not FairMQ's default 500 ms: on a loaded CI
    // machine the libzmq thread took no message for 500 ms once, and the push's close gave the
    // rest up (475 of them), which is what linger is for, not what these tests check.
    config.linger = STEP.as_millis() as u64;
    let mut channel = Channel::open(&ZmqTransport::new(), config, "data").await?;
    channel.attach_configured().await?;
    Ok(channel)
}

fn multipart(msg_idx: u64) -> Vec<Vec<u8>> {
    FRAME_SIZES
        .iter()
        .map(|&size| payload(msg_idx, size))
        .collect()
}

fn verify_frames<'a>(msg_idx: u64, frames: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<()> {
    ensure!(
        frames.len() == FRAME_SIZES.len(),
        "message {msg_idx} has {} frames",
        frames.len()
    );
    for (frame, expected_size) in frames.zip(FRAME_SIZES) {
        ensure!(
            frame.len() == expected_size,
            "message {msg_idx}: frame of {} bytes",
            frame.len()
        );
        verify(msg_idx, frame).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libzmq_push_to_ferromq_pull_multipart() -> Result<()> {
    let mut pull = open(SocketType::Pull, Method::Bind, "tcp://127.0.0.1:0").await?;
    let address = pull.bound_address().context("bound")?.to_string();
    let sender = std::thread::spawn(move || -> Result<()> {
        let context = zmq::Context::new();
        let push = context.socket(zmq::PUSH)?;
        push.connect(&address)?;
        for msg_idx in 0..N_MSGS {
            push.send_multipart(multipart(msg_idx), 0)?;
        }
        Ok(())
    });
    for msg_idx in 0..N_MSGS {
        let parts = tokio::time::timeout(STEP, pull.receive_parts()).await??;
        verify_frames(msg_idx, parts.iter().map(Message::data))?;
    }
    sender.join().expect("libzmq thread")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferromq_push_to_libzmq_pull_multipart() -> Result<()> {
    let context = zmq::Context::new();
    let pull = context.socket(zmq::PULL)?;
    pull.bind("tcp://127.0.0.1:*")?;
    let address = pull
        .get_last_endpoint()?
        .map_err(|_| anyhow::anyhow!("endpoint is not UTF-8"))?;
    pull.set_rcvtimeo(STEP.as_millis() as i32)?;
    let receiver = std::thread::spawn(move || -> Result<()> {
        for msg_idx in 0..N_MSGS {
            let frames = pull
                .recv_multipart(0)
                .with_context(|| format!("message {msg_idx}"))?;
            verify_frames(msg_idx, frames.iter().map(Vec::as_slice))?;
        }
        Ok(())
    });
    let mut push = open(SocketType::Push, Method::Connect, &address).await?;
    for msg_idx in 0..N_MSGS {
        let parts: Parts = multipart(msg_idx).into_iter().map(Message::from).collect();
        push.send_parts(parts)
            .await
            .map_err(|failed| failed.error)?;
    }
    push.close().await?;
    tokio::task::spawn_blocking(move || receiver.join().expect("libzmq thread")).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libzmq_pub_to_ferromq_sub_with_topic_filter() -> Result<()> {
    let config =
        ChannelConfig::new("data", SocketType::Sub, Method::Bind).with_address("tcp://127.0.0.1:0");
    let mut sub = Channel::open(&ZmqTransport::new(), config, "data").await?;
    sub.subscribe("keep").await?;
    let address = sub.bind_configured().await?.to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || -> Result<()> {
            let context = zmq::Context::new();
            let publisher = context.socket(zmq::PUB)?;
            publisher.connect(&address)?;
            // Publish until the subscriber has enough: subscriptions take a moment to arrive.
            let mut msg_idx = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let topic: &[u8] = if msg_idx.is_multiple_of(2) {
                    b"keep"
                } else {
                    b"drop"
                };
                publisher.send_multipart([topic.to_vec(), payload(msg_idx, 512)], 0)?;
                msg_idx += 1;
                if msg_idx.is_multiple_of(100) {
                    std::thread::yield_now();
                }
            }
            Ok(())
        })
    };
    for _ in 0..300 {
        let parts = tokio::time::timeout(STEP, sub.receive_parts()).await??;
        ensure!(
            parts.get(0).context("topic")?.data() == b"keep",
            "the filter lets only 'keep' through"
        );
        let body = parts.get(1).context("body")?.data();
        verify(support::index_of(body), body).map_err(anyhow::Error::msg)?;
    }
    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || publisher.join().expect("libzmq thread")).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferromq_pub_to_libzmq_sub_with_topic_filter() -> Result<()> {
    let context = zmq::Context::new();
    let sub = context.socket(zmq::SUB)?;
    sub.set_subscribe(b"keep")?;
    sub.bind("tcp://127.0.0.1:*")?;
    sub.set_rcvtimeo(STEP.as_millis() as i32)?;
    let address = sub
        .get_last_endpoint()?
        .map_err(|_| anyhow::anyhow!("endpoint is not UTF-8"))?;
    let done = Arc::new(AtomicBool::new(false));
    let subscriber = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || -> Result<()> {
            for _ in 0..300 {
                let frames = sub.recv_multipart(0)?;
                ensure!(
                    frames.len() == 2 && frames[0] == b"keep",
                    "only 'keep' passes the filter"
                );
                verify(support::index_of(&frames[1]), &frames[1]).map_err(anyhow::Error::msg)?;
            }
            done.store(true, Ordering::Relaxed);
            Ok(())
        })
    };
    let mut publisher = open(SocketType::Pub, Method::Connect, &address).await?;
    let mut msg_idx = 0u64;
    while !done.load(Ordering::Relaxed) && !subscriber.is_finished() {
        let topic = if msg_idx.is_multiple_of(2) {
            "keep"
        } else {
            "drop"
        };
        let parts: Parts = vec![Message::from(topic), Message::from(payload(msg_idx, 512))].into();
        publisher
            .send_parts(parts)
            .await
            .map_err(|failed| failed.error)?;
        msg_idx += 1;
        if msg_idx.is_multiple_of(100) {
            tokio::task::yield_now().await;
        }
        ensure!(msg_idx < 10_000_000, "libzmq subscriber received nothing");
    }
    tokio::task::spawn_blocking(move || subscriber.join().expect("libzmq thread")).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libzmq_req_to_ferromq_rep() -> Result<()> {
    let mut rep = open(SocketType::Rep, Method::Bind, "tcp://127.0.0.1:0").await?;
    let address = rep.bound_address().context("bound")?.to_string();
    let client = std::thread::spawn(move || -> Result<()> {
        let context = zmq::Context::new();
        let req = context.socket(zmq::REQ)?;
        req.set_rcvtimeo(STEP.as_millis() as i32)?;
        req.connect(&address)?;
        for msg_idx in 0..200 {
            req.send(payload(msg_idx, 100), 0)?;
            let reply = req.recv_bytes(0)?;
            ensure!(reply.len() == 200, "reply doubles the request");
            verify(msg_idx, &reply[..100]).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    });
    for _ in 0..200 {
        let request = tokio::time::timeout(STEP, rep.receive()).await??;
        let mut reply = request.data().to_vec();
        reply.extend_from_slice(request.data());
        rep.send(Message::from(reply))
            .await
            .map_err(|failed| failed.error)?;
    }
    tokio::task::spawn_blocking(move || client.join().expect("libzmq thread")).await??;
    Ok(())
}

/// ferromq's pair speaks libzmq's PAIR (FairMQ's pair channels): multipart messages both ways
/// over one connection. (It was a DEALER on zmq.rs, which a libzmq PAIR refuses.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libzmq_pair_and_ferromq_pair_exchange_multipart_both_ways() -> Result<()> {
    let mut pair = open(SocketType::Pair, Method::Bind, "tcp://127.0.0.1:0").await?;
    let address = pair.bound_address().context("bound")?.to_string();
    let peer = std::thread::spawn(move || -> Result<()> {
        let context = zmq::Context::new();
        let pair = context.socket(zmq::PAIR)?;
        pair.set_rcvtimeo(STEP.as_millis() as i32)?;
        pair.connect(&address)?;
        for msg_idx in 0..N_MSGS {
            pair.send_multipart(multipart(msg_idx), 0)?;
        }
        for msg_idx in 0..N_MSGS {
            let frames = pair
                .recv_multipart(0)
                .with_context(|| format!("message {msg_idx}"))?;
            verify_frames(msg_idx, frames.iter().map(Vec::as_slice))?;
        }
        Ok(())
    });
    for msg_idx in 0..N_MSGS {
        let parts = tokio::time::timeout(STEP, pair.receive_parts()).await??;
        verify_frames(msg_idx, parts.iter().map(Message::data))?;
    }
    for msg_idx in 0..N_MSGS {
        let parts: Parts = multipart(msg_idx).into_iter().map(Message::from).collect();
        pair.send_parts(parts)
            .await
            .map_err(|failed| failed.error)?;
    }
    pair.close().await?;
    tokio::task::spawn_blocking(move || peer.join().expect("libzmq thread")).await??;
    Ok(())
}
