//! The Prometheus endpoint (`--metrics ADDR`) of a device and of `ferromq run`, scraped while
//! they run and checked against the sink's own summary.

mod support;

use std::time::Duration;

use support::{Ipc, bundled, ferromq, finish, signal};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port nobody listens on now.
fn free_address() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .to_string()
}

/// GET /metrics, or `None` while nothing answers there.
async fn scrape(address: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: ferromq\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    response.starts_with("HTTP/1.1 200").then_some(response)
}

/// The value of metric `name` whose labels include every one of `labels`.
fn value_of(scraped: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scraped.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (label_text, value) = rest.rsplit_once("} ")?;
        labels
            .iter()
            .all(|(key, value)| label_text.contains(&format!("{key}=\"{value}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

/// Scrapes every 100 ms until `done` says yes (at most 30 s); the last scrape.
async fn scrape_until(address: &str, done: impl Fn(&str) -> bool) -> String {
    let mut look = tokio::time::interval(Duration::from_millis(100));
    let mut last = String::new();
    for _ in 0..300 {
        look.tick().await;
        if let Some(scraped) = scrape(address).await {
            if done(&scraped) {
                return scraped;
            }
            last = scraped;
        }
    }
    panic!("the endpoint at {address} never showed what was awaited; last scrape:\n{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_devices_endpoint_counts_what_its_summary_says() {
    let ipc = Ipc::new("metrics");
    let address = free_address();
    let data = |kind: &str, method: &str| {
        format!(
            "name=data,type={kind},method={method},address={},rateLogging=0",
            ipc.address()
        )
    };
    let sink = ferromq(&[
        "device",
        "sink",
        "--id",
        "sink",
        "--control",
        "static",
        "--metrics",
        &address,
        "--channel-config",
        &data("pull", "bind"),
    ]);
    let sampler = ferromq(&[
        "device",
        "sampler",
        "--id",
        "sampler",
        "--control",
        "static",
        "--max-iterations",
        "499",
        "--msg-size",
        "100",
        "--channel-config",
        &data("push", "connect"),
    ]);
    finish(sampler).await.assert_exited_0();
    let messages = [("device", "sink"), ("channel", "data")];
    let scraped = scrape_until(&address, |scraped| {
        value_of(scraped, "ferromq_channel_messages_in_total", &messages) == Some(500.0)
    })
    .await;
    assert_eq!(
        value_of(
            scraped.as_str(),
            "ferromq_channel_bytes_in_total",
            &messages
        ),
        Some(50_000.0)
    );
    assert_eq!(
        value_of(
            &scraped,
            "ferromq_device_state",
            &[("device", "sink"), ("state", "RUNNING")]
        ),
        Some(1.0)
    );
    signal(&sink, "INT");
    let sink = finish(sink).await;
    sink.assert_exited_0();
    assert!(
        sink.stdout.contains("received 500 messages, 50000 bytes"),
        "{}",
        sink.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_launchers_endpoint_shows_every_device_of_the_topology() {
    let address = free_address();
    let session = format!("metrics-{}", std::process::id());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferromq"));
    command.args([
        "run",
        &bundled("default.toml"),
        "--duration",
        "5",
        "--session",
        &session,
        "--metrics",
        &address,
    ]);
    let run = support::spawn_piped(command);
    let sink_in = [("device", "sink"), ("channel", "data")];
    let scraped = scrape_until(&address, |scraped| {
        value_of(scraped, "ferromq_channel_messages_in_total", &sink_in).unwrap_or(0.0) > 0.0
    })
    .await;
    let during = value_of(&scraped, "ferromq_channel_messages_in_total", &sink_in).unwrap();
    for device in ["sampler", "processor", "sink"] {
        assert_eq!(
            value_of(
                &scraped,
                "ferromq_device_state",
                &[("device", device), ("state", "RUNNING")]
            ),
            Some(1.0),
            "{device}:\n{scraped}"
        );
    }
    let ended = finish(run).await;
    ended.assert_exited_0();
    let received: f64 = ended
        .stdout
        .split("sink summary: received ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no sink summary:\n{}", ended.stdout));
    assert!(
        during <= received,
        "scraped {during} received before the end, the sink says {received}"
    );
}

#[tokio::test]
async fn a_metrics_address_that_is_taken_is_refused_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let sink_serving = |metrics: &str| {
        finish(ferromq(&[
            "device",
            "sink",
            "--id",
            "sink",
            "--metrics",
            metrics,
        ]))
    };
    let ended = sink_serving(&address).await;
    assert_eq!(ended.code, Some(2), "{}{}", ended.stdout, ended.stderr);
    assert!(
        ended.stderr.contains(&format!("--metrics {address}")),
        "{}",
        ended.stderr
    );
    // Not an address at all: clap names the value.
    let ended = sink_serving("here").await;
    assert_eq!(ended.code, Some(2));
    assert!(ended.stderr.contains("'here'"), "{}", ended.stderr);
}
