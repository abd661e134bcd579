//! An inproc pull that closes and a new one bound under the same name: the push connected to
//! the first is linked to the second and its sends reach it, as a tcp or ipc push reconnects
//! to a restarted peer. Before, the push was never linked again and its sends waited for ever.

use std::time::Duration;

use ferromq_core::{ChannelConfig, Message, Method, SocketType};

mod support;

#[tokio::test]
async fn a_push_reaches_a_pull_bound_again_under_the_same_name() {
    let address = format!("inproc://rebind-{}", std::process::id());
    let bound =
        || ChannelConfig::new("data", SocketType::Pull, Method::Bind).with_address(&address);
    let mut first = support::open(bound()).await;
    let mut push = support::open(
        ChannelConfig::new("data", SocketType::Push, Method::Connect).with_address(&address),
    )
    .await;
    push.send(Message::from("one"))
        .await
        .map_err(|failed| failed.error)
        .expect("send to the first");
    assert_eq!(first.receive().await.expect("receive").data(), b"one");
    first.close().await.expect("close the first");
    drop(first);
    let mut second = support::open(bound()).await;
    push.send_timeout(Message::from("two"), Duration::from_secs(20))
        .await
        .map_err(|failed| failed.error)
        .expect("the push is linked to the pull bound again");
    assert_eq!(second.receive().await.expect("receive").data(), b"two");
    push.close().await.expect("close push");
    second.close().await.expect("close the second");
}
