//! The Prometheus scrape endpoint of `ferromq device --metrics ADDR` and `ferromq run --metrics
//! ADDR`: `metrics-exporter-prometheus` as the `metrics` facade's recorder, serving
//! `http://ADDR/metrics` (its default features are off: they pull a push gateway with a C
//! crypto build we do not need). Installed once per process, on the current tokio runtime;
//! the listener is bound before this returns, so a taken address is an error naming it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, anyhow};

static SERVING: AtomicBool = AtomicBool::new(false);

/// Whether this process serves metrics: recording costs label allocations even with no
/// recorder installed, so callers that poll many devices skip it otherwise.
pub fn serving() -> bool {
    SERVING.load(Ordering::Relaxed)
}

/// Installs the recorder and serves it at `address`.
///
/// # Errors
/// The address cannot be bound, or a recorder is installed already.
pub fn serve(address: SocketAddr) -> Result<()> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(address)
        .install()
        .map_err(|error| anyhow!("--metrics {address}: {error}"))?;
    ferromq_device::metrics::describe();
    SERVING.store(true, Ordering::Relaxed);
    Ok(())
}
