//! A sampler process pushing to a sink process over zeromq ipc; the sink prints its rate.
//!
//! `cargo run --release --example sampler_sink -- [SECONDS] [MSG_SIZE]` (defaults: 5 s, 1024 B).
//! The example starts itself a second time as the sampler.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferromq::ZmqTransport;
use ferromq::prelude::*;

const ROLE_VAR: &str = "FERROMQ_EXAMPLE_SAMPLER";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: u64 = args
        .first()
        .map_or(Ok(5), |text| text.parse())
        .context("SECONDS")?;
    let msg_size: usize = args
        .get(1)
        .map_or(Ok(1024), |text| text.parse())
        .context("MSG_SIZE")?;
    if let Ok(address) = std::env::var(ROLE_VAR) {
        return sampler(&address, msg_size).await;
    }
    let address = format!(
        "ipc://{}/ferromq-example-{}.ipc",
        std::env::temp_dir().display(),
        std::process::id()
    );
    let config = ChannelConfig::new("data", SocketType::Pull, Method::Bind).with_address(&address);
    let mut sink = Channel::open(&ZmqTransport::new(), config, "data").await?;
    sink.bind_configured().await?;
    let mut sampler_process = tokio::process::Command::new(std::env::current_exe()?)
        .args(&args)
        .env(ROLE_VAR, &address)
        .kill_on_drop(true)
        .spawn()?;
    println!("sink bound at {address}; sampler sends {msg_size}-byte messages for {seconds} s");
    let counters = sink.counters();
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut last = (Instant::now(), counters.snapshot());
    while Instant::now() < end {
        match sink.receive_timeout(Duration::from_millis(100)).await {
            Ok(_) | Err(ferromq::Error::Timeout { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        if last.0.elapsed() >= Duration::from_secs(1) {
            let now = (Instant::now(), counters.snapshot());
            let elapsed = now.0.duration_since(last.0).as_secs_f64();
            let n_msgs = (now.1.messages_in - last.1.messages_in) as f64;
            let n_bytes = (now.1.bytes_in - last.1.bytes_in) as f64;
            println!(
                "sink: {:>10.0} msg/s {:>9.1} MB/s",
                n_msgs / elapsed,
                n_bytes / elapsed / 1e6
            );
            last = now;
        }
    }
    sampler_process.kill().await?;
    println!(
        "sink: {} messages received in total",
        counters.snapshot().messages_in
    );
    sink.close().await?;
    Ok(())
}

async fn sampler(address: &str, msg_size: usize) -> Result<()> {
    let config =
        ChannelConfig::new("data", SocketType::Push, Method::Connect).with_address(address);
    let mut channel = Channel::open(&ZmqTransport::new(), config, "data").await?;
    channel.connect_configured().await?;
    loop {
        channel
            .send(Message::new(msg_size))
            .await
            .map_err(|failed| failed.error)?;
    }
}
