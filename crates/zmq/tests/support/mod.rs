//! What the zeromq transport's tests share.

use ferromq_core::{Channel, ChannelConfig, Method};
use ferromq_zmq::ZmqTransport;

/// A channel of `config` on a zeromq transport, bound or connected at its address as its
/// method says.
pub async fn open(config: ChannelConfig) -> Channel {
    let method = config.method;
    let name = config.name.clone();
    let mut channel = Channel::open(&ZmqTransport::new(), config, &name)
        .await
        .expect("open");
    match method {
        Method::Bind => {
            channel.bind_configured().await.expect("bind");
        }
        Method::Connect => channel.connect_configured().await.expect("connect"),
    }
    channel
}
