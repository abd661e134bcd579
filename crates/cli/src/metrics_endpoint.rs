//! Where metrics go. The Prometheus scrape endpoint of `ferromq device --metrics ADDR` and
//! `ferromq run --metrics ADDR`, or (feature `otel`) OTLP pushes to `--otlp-endpoint URL` every
//! second. Prometheus: `metrics-exporter-prometheus` as the `metrics` facade's recorder, serving
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

/// Installs the recorder `--metrics` and `--otlp-endpoint` ask for, if any (one of them: the
/// facade takes one recorder per process).
///
/// # Errors
/// Both were given, the address cannot be bound, the endpoint is not an `http://` URL, or this
/// binary was built without OTLP export; each names the option and the value.
pub fn export(metrics: Option<SocketAddr>, otlp_endpoint: Option<&str>) -> Result<()> {
    match (metrics, otlp_endpoint) {
        (Some(address), Some(endpoint)) => Err(anyhow!(
            "--metrics {address} and --otlp-endpoint {endpoint}: give one (a process has one \
             metrics recorder)"
        )),
        (Some(address), None) => serve(address),
        (None, Some(endpoint)) => export_otlp(endpoint),
        (None, None) => Ok(()),
    }
}

/// Flushes what an OTLP exporter has not pushed yet (at the process's end); nothing otherwise.
pub fn finish() {
    #[cfg(feature = "otel")]
    if let Some(provider) = OTLP_PROVIDER.get() {
        let _ = provider.force_flush();
        let _ = provider.shutdown();
    }
}

#[cfg(feature = "otel")]
static OTLP_PROVIDER: std::sync::OnceLock<opentelemetry_sdk::metrics::SdkMeterProvider> =
    std::sync::OnceLock::new();

/// How often the OTLP exporter pushes.
pub const OTLP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(feature = "otel")]
fn export_otlp(endpoint: &str) -> Result<()> {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    if !endpoint.starts_with("http://") {
        return Err(anyhow!(
            "--otlp-endpoint {endpoint:?}: expected an http:// URL of an OTLP/HTTP receiver, e.g. \
             http://127.0.0.1:4318/v1/metrics (this build has no TLS)"
        ));
    }
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .build()
        .map_err(|error| anyhow!("--otlp-endpoint {endpoint}: {error}"))?;
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
        .with_interval(OTLP_EVERY)
        .build();
    let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_reader(reader)
        .build();
    let recorder = metrics_exporter_otel::OpenTelemetryRecorder::new(provider.meter("ferromq"));
    metrics::set_global_recorder(recorder)
        .map_err(|error| anyhow!("--otlp-endpoint {endpoint}: {error}"))?;
    let _ = OTLP_PROVIDER.set(provider);
    ferromq_device::metrics::describe();
    SERVING.store(true, Ordering::Relaxed);
    Ok(())
}

#[cfg(not(feature = "otel"))]
fn export_otlp(endpoint: &str) -> Result<()> {
    Err(anyhow!(
        "--otlp-endpoint {endpoint}: this ferromq was built without OTLP export (build it with \
         `--features otel`); --metrics ADDR serves Prometheus instead"
    ))
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
