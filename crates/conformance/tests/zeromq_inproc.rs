//! The conformance suite over the zeromq transport's inproc sockets (one process, so the
//! multi-process scenarios do not apply).

use std::sync::Arc;

use ferromq_conformance::{AddressScheme, Suite};
use ferromq_zmq::ZmqTransport;

fn main() {
    Suite::new("zeromq-inproc", AddressScheme::Inproc, |_trial| {
        Arc::new(ZmqTransport::new())
    })
    .run()
}
