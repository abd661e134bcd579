//! The conformance suite over the ofi transport on libfabric's tcp provider (loopback). ofi
//! channels are one-to-one and carry no pub/sub, by design: the suite checks that pub/sub is
//! refused with an error naming the channel, and runs its fan-in scenario with one sender.

use std::sync::Arc;
use std::time::Duration;

use ferromq_conformance::{AddressScheme, Suite};
use ferromq_core::SocketType;
use ferromq_ofi::{OfiOptions, OfiTransport};

fn main() {
    Suite::new("ofi-tcp", AddressScheme::Tcp, |_trial| {
        Arc::new(OfiTransport::new(OfiOptions {
            max_chunk: 1 << 20,
            // A killed peer is noticed after this much silence (sooner when its side channel
            // breaks). Not shorter: a debug build filling a 64 MiB payload on a worker of a
            // busy 2-core machine can hold the heartbeats back for half a second.
            peer_timeout: Duration::from_secs(3),
            ..OfiOptions::default()
        }))
    })
    .refusing(&[SocketType::Pub, SocketType::Sub])
    .one_peer_per_channel()
    .run()
}
