//! The conformance suite over the zeromq transport on ipc (unix domain sockets).

use std::sync::Arc;

use ferromq_conformance::{AddressScheme, Suite};
use ferromq_zmq::ZmqTransport;

fn main() {
    Suite::new("zeromq-ipc", AddressScheme::Ipc, |_trial| {
        Arc::new(ZmqTransport::new())
    })
    .run()
}
