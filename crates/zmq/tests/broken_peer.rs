//! A peer that dies in the middle of a frame leaves a connection that zmq.rs reports as broken
//! on every read. A rep socket used to hand that error to every receive, at once and forever: a
//! device's control endpoint spun at 100% of a core and starved its runtime, so it ignored
//! SIGTERM and outlived its launcher. The broken requester must be dropped and the next one served.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ferromq_core::{Channel, ChannelConfig, Message, Method, SocketType};
use ferromq_zmq::ZmqTransport;

const STEP: Duration = Duration::from_secs(20);

/// A directory of the test's own, removed however the test ends.
struct TestDir(std::path::PathBuf);

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A ZMTP 3.0 greeting (NULL mechanism, as client) and a READY announcing `socket_type`.
fn handshake(socket_type: &str) -> Vec<u8> {
    let mut bytes = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    let mut mechanism = b"NULL".to_vec();
    mechanism.resize(20, 0);
    bytes.extend(mechanism);
    bytes.push(0); // as-server
    bytes.extend([0; 31]);
    let mut ready = vec![5];
    ready.extend(b"READY");
    ready.push(11);
    ready.extend(b"Socket-Type");
    ready.extend((socket_type.len() as u32).to_be_bytes());
    ready.extend(socket_type.as_bytes());
    bytes.push(0x04); // a short command frame
    bytes.push(ready.len() as u8);
    bytes.extend(ready);
    bytes
}

/// Sends `bytes` on `channel`.
async fn send(channel: &mut Channel, bytes: &[u8]) {
    channel
        .send(Message::from(bytes.to_vec()))
        .await
        .map_err(|failed| failed.error)
        .expect("send");
}

/// The next message on `channel`, which must be `expected`; `what` names it if it never comes.
async fn receive(channel: &mut Channel, expected: &[u8], what: &str) {
    let message = tokio::time::timeout(STEP, channel.receive())
        .await
        .unwrap_or_else(|_| panic!("{what} never came"))
        .unwrap_or_else(|error| panic!("receiving {what}: {error}"));
    assert_eq!(message.data(), expected);
}

#[tokio::test]
async fn a_requester_dying_mid_frame_is_dropped_and_the_next_one_is_served() {
    let dir =
        TestDir(std::env::temp_dir().join(format!("ferromq-broken-peer-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("a directory for the socket");
    let path = dir.0.join("rep.ipc");
    let address = format!("ipc://{}", path.display());
    let transport = ZmqTransport::new();
    let config = ChannelConfig::new("data", SocketType::Rep, Method::Bind).with_address(&address);
    let mut rep = Channel::open(&transport, config, "data")
        .await
        .expect("open");
    rep.bind_configured().await.expect("bind");

    // One whole request (empty delimiter, then "ping"): the requester is connected and heard.
    let mut raw = UnixStream::connect(&path).expect("connect");
    raw.write_all(&handshake("REQ")).expect("handshake");
    raw.write_all(&[0x01, 0, 0x00, 4]).expect("delimiter");
    raw.write_all(b"ping").expect("request");
    receive(&mut rep, b"ping", "the whole request").await;
    send(&mut rep, b"pong").await;
    // Then half a frame (200 bytes announced, 10 sent) and the end of the connection.
    raw.write_all(&[0x01, 0, 0x00, 200]).expect("frame header");
    raw.write_all(&[7; 10]).expect("part of the body");
    drop(raw);

    let config =
        ChannelConfig::new("data", SocketType::Req, Method::Connect).with_address(&address);
    let mut req = Channel::open(&transport, config, "data")
        .await
        .expect("open");
    req.connect_configured().await.expect("connect");
    send(&mut req, b"hello").await;
    // Before: the broken requester failed this receive (and every one after it).
    receive(&mut rep, b"hello", "the second requester's request").await;
    send(&mut rep, b"world").await;
    receive(&mut req, b"world", "the reply").await;
}
