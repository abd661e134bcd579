//! Reservations (`Channel::reserve`) where the transport cannot promise room ahead of a send:
//! the caller is told so, naming the channel, and keeps its message; a socket that cannot send
//! at all says that instead.

use ferromq_core::{Channel, ChannelConfig, Error, Message, Method, SocketType};
use ferromq_zmq::ZmqTransport;

async fn bound(socket_type: SocketType, name: &str) -> Channel {
    let config =
        ChannelConfig::new(name, socket_type, Method::Bind).with_address("tcp://127.0.0.1:0");
    let mut channel = Channel::open(&ZmqTransport::new(), config, name)
        .await
        .expect("open");
    channel.bind_configured().await.expect("bind");
    channel
}

#[tokio::test]
async fn a_pattern_without_reservations_says_so_naming_the_channel() {
    let mut publisher = bound(SocketType::Pub, "updates").await;
    let error = publisher.reserve().await.expect_err("pub reserves nothing");
    assert!(
        matches!(error, Error::Unsupported { .. }),
        "expected Unsupported, got {error:?}"
    );
    let text = error.to_string();
    assert!(text.contains("\"updates\""), "{text}");
    assert!(text.contains("send_timeout"), "{text}");
    // The plain send still works, and the message was never the reservation's.
    publisher
        .send(Message::from("still sendable"))
        .await
        .map_err(|failed| failed.error)
        .expect("send on pub");
    publisher.close().await.expect("close");
}

#[tokio::test]
async fn a_socket_that_cannot_send_refuses_a_reservation() {
    let mut pull = bound(SocketType::Pull, "input").await;
    let error = pull.reserve().await.expect_err("pull sends nothing");
    assert!(
        matches!(error, Error::WrongSocketType { .. }),
        "expected WrongSocketType, got {error:?}"
    );
    assert!(error.to_string().contains("\"input\""), "{error}");
    pull.close().await.expect("close");
}
