//! Devices that never starve and never hide a loss: real processes, real signals.

mod support;

use std::time::Duration;

use support::{Ipc, ferromq, finish, signal, wait_for_line};
use tokio::io::{AsyncBufReadExt, BufReader};

const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

fn channel(kind: &str, method: &str, address: &str) -> String {
    format!("name=data,type={kind},method={method},address={address},rateLogging=0")
}

/// An unthrottled publisher (its sends complete at once) still accepts subscribers and obeys
/// SIGINT and SIGTERM: sends give the runtime back now and then.
async fn unthrottled_publisher_serves_subscribers_and_signals(transport: &str, stop: &str) {
    let ipc = Ipc::new("starve");
    let session = format!("starve{}{transport}{stop}", std::process::id());
    let mut publisher = ferromq(&[
        "device",
        "sampler",
        "--id",
        "publisher",
        "--control",
        "static",
        "--transport",
        transport,
        "--session",
        &session,
        "--channel-config",
        &channel("pub", "bind", &ipc.address()),
    ]);
    let mut lines = BufReader::new(publisher.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "READY ---> RUNNING", &mut seen).await;
    let subscriber = ferromq(&[
        "device",
        "sink",
        "--id",
        "subscriber",
        "--control",
        "static",
        "--transport",
        transport,
        "--session",
        &session,
        "--max-iterations",
        "100",
        "--channel-config",
        &channel("sub", "connect", &ipc.address()),
    ]);
    let subscriber = finish(subscriber).await;
    assert_eq!(subscriber.code, Some(0), "{}", subscriber.stderr);
    assert!(
        subscriber.stdout.contains("RUNNING ---> READY"),
        "the subscriber never finished receiving: {}",
        subscriber.stdout
    );
    signal(&publisher, stop);
    let exit = tokio::time::timeout(EXIT_TIMEOUT, publisher.wait())
        .await
        .unwrap_or_else(|_| panic!("the publisher ignored SIG{stop}"))
        .expect("wait");
    assert_eq!(exit.code(), Some(0), "SIG{stop}: {seen:#?}");
}

#[tokio::test]
async fn unthrottled_zeromq_publisher_serves_subscribers_and_sigint() {
    unthrottled_publisher_serves_subscribers_and_signals("zeromq", "INT").await;
}

#[tokio::test]
async fn unthrottled_zeromq_publisher_obeys_sigterm() {
    unthrottled_publisher_serves_subscribers_and_signals("zeromq", "TERM").await;
}

#[tokio::test]
async fn unthrottled_shmem_publisher_serves_subscribers_and_sigint() {
    unthrottled_publisher_serves_subscribers_and_signals("shmem", "INT").await;
}

#[tokio::test]
async fn unthrottled_shmem_publisher_obeys_sigterm() {
    unthrottled_publisher_serves_subscribers_and_signals("shmem", "TERM").await;
}
