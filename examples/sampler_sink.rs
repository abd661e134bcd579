//! A sampler process pushing to a sink process over zeromq ipc; the sink prints its rate.
//!
//! `cargo run --release --example sampler_sink -- [SECONDS] [MSG_SIZE]` (defaults: 5 s, 1024 B).
//! The example starts itself a second time as the sampler.
//!
//! SECONDS is a whole number from 1 to [`ferromq::MAX_SECONDS`]; MSG_SIZE a whole number of
//! bytes up to [`MAX_MSG_SIZE`] (1 GiB). Anything else, or a third argument, is refused with exit
//! code 2; `--help` prints the usage. When the sampler ends before the run does (it failed, or
//! was killed), the sink says how it ended and exits 1.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferromq::ZmqTransport;
use ferromq::prelude::*;

const ROLE_VAR: &str = "FERROMQ_EXAMPLE_SAMPLER";

const USAGE: &str = "usage: sampler_sink [SECONDS] [MSG_SIZE]   (defaults: 5 s, 1024 B)";

/// The largest MSG_SIZE: 1 GiB. Each message is a buffer the sampler fills and the sink
/// receives whole; larger ones measure the allocator and paging, not the transport, and soon
/// cannot be had at all (before this bound, a size no memory holds aborted the sampler).
const MAX_MSG_SIZE: usize = 1 << 30;

/// The most bytes either queue (the sampler's send queue, the sink's receive queue) holds:
/// queues of big messages are shortened to this, so that a run of 1-GiB messages needs a few GiB
/// of memory, not the 1000 messages of a default queue. Messages up to 1 MiB keep the default.
const QUEUED_BYTES: usize = 1 << 30;

/// What the command line asks for.
struct Options {
    seconds: u64,
    msg_size: usize,
}

/// The options in `args`; `Ok(None)` for `--help`; an error naming the argument and its value.
fn parse(args: &[String]) -> Result<Option<Options>, String> {
    if args.iter().any(|arg| arg == "--help" || arg == "-h") {
        return Ok(None);
    }
    if let Some(extra) = args.get(2) {
        return Err(format!(
            "unexpected argument {extra:?}: the example takes SECONDS and MSG_SIZE only"
        ));
    }
    let max_seconds = ferromq::MAX_SECONDS as u64;
    let seconds = match args.first() {
        None => 5,
        Some(text) => match text.parse::<u64>() {
            Ok(seconds) if (1..=max_seconds).contains(&seconds) => seconds,
            _ => {
                return Err(format!(
                    "SECONDS {text}: expected a whole number of seconds from 1 to {max_seconds}"
                ));
            }
        },
    };
    let msg_size = match args.get(1) {
        None => 1024,
        Some(text) => match text.parse::<usize>() {
            Ok(msg_size) if msg_size <= MAX_MSG_SIZE => msg_size,
            _ => {
                return Err(format!(
                    "MSG_SIZE {text}: expected a whole number of bytes from 0 to {MAX_MSG_SIZE} \
                     (1 GiB)"
                ));
            }
        },
    };
    Ok(Some(Options { seconds, msg_size }))
}

/// The queue bound (in messages) for `msg_size`-byte messages: the default, shortened to hold at
/// most [`QUEUED_BYTES`].
fn queue_bound(default: usize, msg_size: usize) -> usize {
    (QUEUED_BYTES / msg_size.max(1)).clamp(1, default)
}

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("sampler_sink: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    let ran = runtime.block_on(async {
        match std::env::var(ROLE_VAR) {
            Ok(address) => sampler(&address, options.msg_size).await,
            Err(_) => sink(&args, &options).await,
        }
    });
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sampler_sink: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn sink(args: &[String], options: &Options) -> Result<()> {
    let Options { seconds, msg_size } = *options;
    let address = format!(
        "ipc://{}/ferromq-example-{}.ipc",
        std::env::temp_dir().display(),
        std::process::id()
    );
    let mut config =
        ChannelConfig::new("data", SocketType::Pull, Method::Bind).with_address(&address);
    config.rcv_buf_size = queue_bound(config.rcv_buf_size, msg_size);
    let mut sink = Channel::open(&ZmqTransport::new(), config, "data").await?;
    sink.bind_configured().await?;
    let mut sampler_process = tokio::process::Command::new(std::env::current_exe()?)
        .args(args)
        .env(ROLE_VAR, &address)
        .kill_on_drop(true)
        .spawn()
        .context("start the sampler")?;
    let sampler_pid = sampler_process.id().unwrap_or_default();
    println!(
        "sink bound at {address}; sampler (pid {sampler_pid}) sends {msg_size}-byte messages for \
         {seconds} s"
    );
    let counters = sink.counters();
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut last = (Instant::now(), counters.snapshot());
    {
        // The sampler ending first fails the run: its rates would be zeros, not measurements.
        let sampler_exit = sampler_process.wait();
        tokio::pin!(sampler_exit);
        while Instant::now() < end {
            tokio::select! {
                exited = &mut sampler_exit => {
                    let how = match exited {
                        Ok(status) => status.to_string(),
                        Err(error) => format!("cannot be waited for ({error})"),
                    };
                    bail!(
                        "the sampler (pid {sampler_pid}) ended before the run did: {how}; \
                         {} messages received",
                        counters.snapshot().messages_in
                    );
                }
                received = sink.receive_timeout(Duration::from_millis(100)) => match received {
                    Ok(_) | Err(ferromq::Error::Timeout { .. }) => {}
                    Err(error) => return Err(error.into()),
                },
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
    }
    sampler_process.kill().await?;
    // What the sampler wrote before it was killed is the sink's: taken here, for a close with
    // messages not taken reports them lost.
    loop {
        match sink.receive_timeout(Duration::from_millis(100)).await {
            Ok(_) => {}
            Err(ferromq::Error::Timeout { .. }) => break,
            Err(error) => return Err(error.into()),
        }
    }
    println!(
        "sink: {} messages received in total",
        counters.snapshot().messages_in
    );
    sink.close().await?;
    Ok(())
}

async fn sampler(address: &str, msg_size: usize) -> Result<()> {
    let mut config =
        ChannelConfig::new("data", SocketType::Push, Method::Connect).with_address(address);
    config.snd_buf_size = queue_bound(config.snd_buf_size, msg_size);
    let mut channel = Channel::open(&ZmqTransport::new(), config, "data").await?;
    channel.connect_configured().await?;
    loop {
        let message = Message::try_new(msg_size)
            .with_context(|| format!("MSG_SIZE {msg_size}: cannot allocate a message"))?;
        channel.send(message).await.map_err(|failed| failed.error)?;
    }
}
