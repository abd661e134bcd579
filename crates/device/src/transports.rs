//! The one place where a transport name becomes a transport.

use std::sync::Arc;

use ferromq_core::{Error, Result, Transport};

/// The transport a configuration names (`"zeromq"`).
///
/// # Errors
/// [`Error::UnknownTransport`] for a name not built into this binary, listing those that are.
pub fn transport_by_name(name: &str) -> Result<Arc<dyn Transport>> {
    match name {
        #[cfg(feature = "zeromq")]
        ferromq_zmq::ZmqTransport::NAME => Ok(Arc::new(ferromq_zmq::ZmqTransport::new())),
        _ => Err(Error::UnknownTransport {
            name: name.to_owned(),
            available: available_transports().join(", "),
        }),
    }
}

/// The names of the transports built into this binary.
pub fn available_transports() -> Vec<&'static str> {
    [
        #[cfg(feature = "zeromq")]
        "zeromq",
    ]
    .to_vec()
}
