//! The transports this binary was built with: the one place a feature flag becomes a transport.
//!
//! The libraries below know no transport by name (the device runner takes a
//! [`TransportRegistry`]); the binary picks the engines here, as ripgrep's binary picks its
//! search engines. zeromq and shmem are always built in; ofi with the `ofi` feature.

use std::sync::{Arc, OnceLock};

use ferromq_core::TransportRegistry;

/// The transports built into this binary, registered under their configuration names.
pub fn built_in_transports() -> Arc<TransportRegistry> {
    static BUILT_IN: OnceLock<Arc<TransportRegistry>> = OnceLock::new();
    Arc::clone(BUILT_IN.get_or_init(|| {
        let mut registry = TransportRegistry::new();
        ferromq_zmq::register(&mut registry);
        ferromq_shm::register(&mut registry);
        #[cfg(feature = "ofi")]
        ferromq_ofi::register(&mut registry);
        Arc::new(registry)
    }))
}

/// Prepares the process's termination signals for ferromq's handlers: with the ofi transport
/// built in, takes SIGINT/SIGTERM back from libraries that grabbed them at load time (see
/// `ferromq_ofi::reclaim_termination_signals`); otherwise does nothing.
pub fn prepare_termination_signals() {
    #[cfg(feature = "ofi")]
    ferromq_ofi::reclaim_termination_signals();
}
