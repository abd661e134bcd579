//! Addresses a connecting socket cannot reach are refused at the connect, naming the channel
//! and the address, whatever the pattern (ferromq's own push/pull/pair/pub and zmq.rs's
//! others).

use ferromq_core::{Channel, ChannelConfig, Error, Method, SocketType};
use ferromq_zmq::ZmqTransport;

/// Port 0 asks a binding socket for a free port; a connecting socket took it and tried, for
/// as long as it ran, to reach a port no peer can have (a bad-input sweep).
#[tokio::test]
async fn connecting_to_port_0_is_refused_naming_the_address() {
    for socket_type in [
        SocketType::Push,
        SocketType::Pull,
        SocketType::Pair,
        SocketType::Sub,
        SocketType::Req,
    ] {
        let config = ChannelConfig::new("data", socket_type, Method::Connect)
            .with_address("tcp://127.0.0.1:0");
        let mut channel = Channel::open(&ZmqTransport::new(), config, "data")
            .await
            .expect("open");
        let error = channel
            .connect_configured()
            .await
            .expect_err("a connect to port 0 must be refused");
        assert!(
            matches!(error, Error::UnsupportedAddress { .. }),
            "{socket_type:?}: {error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains("\"data\"")
                && text.contains("tcp://127.0.0.1:0")
                && text.contains("cannot connect to port 0"),
            "{socket_type:?}: {text}"
        );
    }
}
