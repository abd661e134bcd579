//! The ofi transport's drain on close, as two processes (feature `ofi`).
//!
//! In a test binary of its own, so that no other test's processes compete for the two cores
//! while it runs (cargo runs test binaries one after another). It used to fail about one run in
//! six: the sampler builds its 64 MiB messages on its own thread and accepted all 20 before its
//! side channel was up; its connect attempts then rode the heartbeat tick (every 625 ms), later
//! than close's 500 ms `linger`. The driver now retries a connect 100 ms after a failed attempt,
//! and a close counts the peer's welcome and grants as progress.
#![cfg(feature = "ofi")]

mod support;

use support::{Device, finish, wait_for_line};
use tokio::io::{AsyncBufReadExt, BufReader};

/// ofi over libfabric's tcp provider: 20 × 64 MiB take far longer to move than `linger`
/// (500 ms) after the sender's last send, and still all arrive: linger bounds silence only.
#[tokio::test]
async fn an_ofi_sender_drains_everything_while_the_peer_keeps_taking() {
    let session = format!("ofidrain{}", std::process::id());
    let device = |kind: &str, socket_type: &str, method: &str, address: &str| {
        let mut device = Device::new(kind, kind)
            .args(&["--transport", "ofi", "--max-iterations", "19"])
            .args(&["--session", &session]);
        if kind == "sampler" {
            device = device.args(&["--msg-size", "67108864"]);
        }
        device.channel(socket_type, method, address).spawn()
    };
    // The sink binds a port of the system's choosing and says which: a port picked here and
    // freed could be taken by a parallel test before the sink binds it (the sink would then
    // move to another port, and the sampler would knock on a stranger's).
    let mut sink = device("sink", "pull", "bind", "tcp://127.0.0.1:0");
    let mut lines = BufReader::new(sink.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "bound channel=data address=", &mut seen).await;
    let address = seen
        .last()
        .and_then(|line| line.split("address=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the sink names its address")
        .to_owned();
    let sampler = device("sampler", "push", "connect", &address);
    // The sink's output is read while the sampler runs (a full pipe would stall it).
    let sink = tokio::spawn(support::finish_rest(sink, lines));
    let sampler = finish(sampler).await;
    sampler.assert_exited_0();
    let mut sink = sink.await.expect("the sink's reader");
    sink.stdout.insert_str(0, &(seen.join("\n") + "\n"));
    assert_eq!(sink.code, Some(0), "{}{}", sink.stdout, sink.stderr);
    assert!(
        sink.stdout
            .contains("received 20 messages, 1342177280 bytes"),
        "{}",
        sink.stdout
    );
}
