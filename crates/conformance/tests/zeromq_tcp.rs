//! The conformance suite over the zeromq transport on tcp loopback.

use std::sync::Arc;

use ferromq_conformance::{AddressScheme, Suite};
use ferromq_zmq::ZmqTransport;

fn main() {
    Suite::new("zeromq-tcp", AddressScheme::Tcp, |_trial| {
        Arc::new(ZmqTransport::new())
    })
    .run()
}
