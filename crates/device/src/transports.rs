//! The one place where a transport name becomes a transport.

use std::collections::BTreeMap;
use std::sync::Arc;
#[cfg(feature = "ofi")]
use std::time::Duration;

use ferromq_core::{Error, Result, Transport};

/// What a transport may need from the device that uses it.
#[derive(Debug, Clone, Default)]
pub struct TransportOptions {
    /// The device's session.
    pub session: String,
    /// The device's properties (`shm-segment-size`, ...).
    pub properties: BTreeMap<String, String>,
    /// Where a transport that receives into memory of its own choosing (ofi) allocates: the
    /// device's shmem transport when it has shmem channels, so that forwarding copies nothing.
    pub receive_memory: Option<Arc<dyn Transport>>,
}

/// The transport a configuration names (`"zeromq"`, `"shmem"`), with default options.
///
/// # Errors
/// [`Error::UnknownTransport`] for a name not built into this binary, listing those that are.
pub fn transport_by_name(name: &str) -> Result<Arc<dyn Transport>> {
    transport_for(
        name,
        &TransportOptions {
            session: "default".to_owned(),
            ..TransportOptions::default()
        },
    )
}

/// The transport `name`, configured for a device with `options`.
///
/// # Errors
/// [`Error::UnknownTransport`] for a name not built in; [`Error::Config`] for a transport
/// property of the wrong form.
pub fn transport_for(name: &str, options: &TransportOptions) -> Result<Arc<dyn Transport>> {
    let _ = options;
    match name {
        #[cfg(feature = "zeromq")]
        ferromq_zmq::ZmqTransport::NAME => Ok(Arc::new(ferromq_zmq::ZmqTransport::new())),
        #[cfg(feature = "shmem")]
        ferromq_shm::ShmTransport::NAME => {
            let mut shm = ferromq_shm::ShmOptions {
                session: options.session.clone(),
                ..ferromq_shm::ShmOptions::default()
            };
            if let Some(size) = number_property(options, "shm-segment-size")? {
                shm.segment_size = usize::try_from(size).map_err(|_| {
                    Error::Config(ferromq_core::ConfigError::InvalidValue {
                        key: "shm-segment-size".to_owned(),
                        value: size.to_string(),
                        expected: "a size this machine can address",
                    })
                })?;
            }
            if let Some(timeout_ms) = number_property(options, "shm-allocation-timeout-ms")? {
                shm.allocation_timeout = std::time::Duration::from_millis(timeout_ms);
            }
            if let Some(interval_ms) = number_property(options, "shm-allocation-retry-ms")? {
                shm.retry_interval = Some(std::time::Duration::from_millis(interval_ms));
            }
            if let Some(inline_max) = number_property(options, "shm-inline-max")? {
                shm.inline_max = inline_max as usize;
            }
            Ok(Arc::new(ferromq_shm::ShmTransport::new(shm)))
        }
        #[cfg(feature = "ofi")]
        ferromq_ofi::OfiTransport::NAME => {
            let mut ofi = ferromq_ofi::OfiOptions {
                receive_memory: options.receive_memory.clone(),
                ..ferromq_ofi::OfiOptions::default()
            };
            if let Some(size) = number_property(options, "ofi-max-chunk-size")? {
                ofi.max_chunk = size as usize;
            }
            if let Some(size) = number_property(options, "ofi-receive-window")? {
                ofi.receive_window = size as usize;
            }
            if let Some(timeout_ms) = number_property(options, "ofi-peer-timeout-ms")? {
                ofi.peer_timeout = Duration::from_millis(timeout_ms);
            }
            if let Some(size) = number_property(options, "ofi-max-message-size")? {
                ofi.max_message_size = size;
            }
            Ok(Arc::new(ferromq_ofi::OfiTransport::new(ofi)))
        }
        _ => Err(Error::UnknownTransport {
            name: name.to_owned(),
            available: available_transports().join(", "),
        }),
    }
}

#[cfg(feature = "shmem")]
fn number_property(options: &TransportOptions, key: &str) -> Result<Option<u64>> {
    let Some(text) = options.properties.get(key) else {
        return Ok(None);
    };
    text.trim().parse().map(Some).map_err(|_| {
        Error::Config(ferromq_core::ConfigError::InvalidValue {
            key: key.to_owned(),
            value: text.clone(),
            expected: "a non-negative integer",
        })
    })
}

/// The names of the transports built into this binary.
pub fn available_transports() -> Vec<&'static str> {
    [
        #[cfg(feature = "zeromq")]
        "zeromq",
        #[cfg(feature = "shmem")]
        "shmem",
        #[cfg(feature = "ofi")]
        "ofi",
    ]
    .to_vec()
}
