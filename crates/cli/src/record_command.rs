//! `ferromq record SESSION DEVICE CHANNEL --output FILE`: taps a running device's channel and
//! writes what passes through it into a recording (`ferromq-record`'s format), until Ctrl-C,
//! `--duration`, `--messages` or the device's end. `ferromq replay FILE` feeds one back.
//!
//! The device is found through its presence entry (`ferromq top` finds it the same way) and
//! asked for a tap over its read-only control endpoint; copies arrive over ipc. The device never
//! waits for the recorder: what the recorder could not take in time is counted, by the device,
//! as missed, and the recording's summary and the exit code (1) say so. A device that ends
//! closes its tap, which tells the recorder so (after the copies still queued); one that was
//! killed cannot, and the recorder, finding its process gone (or a zombie), says that the
//! recording may lack copies it could not count, and exits 1.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ferromq_core::{Address, Channel, ChannelConfig, Method, SocketType};
use ferromq_device::control::{ControlClient, LauncherToDevice};
use ferromq_device::presence;
use ferromq_device::tap::{TapHeader, TapKind};
use ferromq_record::{Direction, Header, Record, Writer};

/// What `ferromq record` was asked.
#[derive(Debug, clap::Args)]
pub struct RecordOptions {
    /// The session of the device (`ferromq top` lists them).
    #[arg(value_parser = crate::options::session_id)]
    pub session: String,
    /// The device's id.
    pub device: String,
    /// The channel (socket) to record, e.g. `data` or `data[1]`.
    pub channel: String,
    /// The recording to write (created or replaced).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Stop after this many messages (at least 1: `--messages 0` recorded nothing and exited 0).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub messages: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_parser = crate::options::seconds)]
    pub duration: Option<f64>,
}

/// How long the device has to answer the tap request.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the recorder still looks for copies and the tap's end once the device's process is
/// gone: they are already on this host, in the stream's queues.
const LAST_LOOK: Duration = Duration::from_millis(500);

/// Runs `ferromq record`; 0 when everything that passed was recorded, 1 when messages were
/// missed (or may have been: a killed device) or the device cannot be tapped, 2 for bad
/// options (clap's).
pub fn run(options: &RecordOptions) -> ExitCode {
    crate::block_on(1, async {
        match record(options).await {
            Ok(0) => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(error) => {
                eprintln!("ferromq: record: {error:#}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Records; returns how many messages were missed.
async fn record(options: &RecordOptions) -> Result<u64> {
    let entries = presence::list();
    let Some(entry) = entries
        .iter()
        .find(|entry| entry.session == options.session && entry.id == options.device)
    else {
        let in_session: Vec<&str> = entries
            .iter()
            .filter(|entry| entry.session == options.session)
            .map(|entry| entry.id.as_str())
            .collect();
        if in_session.is_empty() {
            bail!(
                "no running device of session {:?} on this host (`ferromq top` lists them)",
                options.session
            );
        }
        bail!(
            "session {:?} has no device {:?}; its devices: {}",
            options.session,
            options.device,
            in_session.join(", ")
        );
    };
    let transport = ferromq_zmq::ZmqTransport::new();
    let mut control = ControlClient::connect(&transport, &entry.observe).await?;
    let reply = control
        .request(
            &LauncherToDevice::Tap {
                channel: options.channel.clone(),
            },
            ASK_TIMEOUT,
        )
        .await?;
    if !reply.ok {
        bail!(
            "device {:?}: {}",
            options.device,
            reply.error.unwrap_or_default()
        );
    }
    let value = reply.value.unwrap_or_default();
    let address = value["address"]
        .as_str()
        .ok_or_else(|| anyhow!("the device answered the tap without an address"))?
        .to_owned();
    let channel_config = value["config"].as_str().unwrap_or_default().to_owned();
    let header = Header {
        device: options.device.clone(),
        session: options.session.clone(),
        channel: options.channel.clone(),
        channel_config,
        started_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            }),
        ferromq_version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let output = options.output.clone();
    // A recorder's own process: nothing else runs on its thread, so plain file writes.
    let mut writer = Writer::create(&output, &header)?;
    let config = ChannelConfig {
        rate_logging: 0,
        // It sends nothing: its close waits only for the tap's connection to end.
        linger: 0,
        ..ChannelConfig::new("tap", SocketType::Pull, Method::Connect).with_address(&address)
    };
    let mut stream = Channel::open(&transport, config, "tap").await?;
    stream
        .connect(&Address::parse(&address)?)
        .await
        .with_context(|| format!("cannot reach the tap at {address}"))?;
    println!(
        "ferromq: recording {}/{}/{} into {} (Ctrl-C to stop)",
        options.session,
        options.device,
        options.channel,
        options.output.display()
    );
    let signals = crate::Signals::install()?;
    let outcome = take_copies(options, entry.pid, &mut stream, &mut writer, signals).await;
    // Whatever ended it: the device stops copying.
    let _ = control
        .request(
            &LauncherToDevice::Untap {
                channel: options.channel.clone(),
            },
            ASK_TIMEOUT,
        )
        .await;
    // Copies that came after the stop are not the recording's: what the close counts of them
    // (a pull's unread messages) is no loss, and a stream dropped without a close says it is.
    let _ = stream.close().await;
    let Copies {
        missed,
        started,
        vanished,
    } = outcome?;
    let summary = writer.finish(missed)?;
    println!(
        "ferromq: recorded {} messages ({} bytes) in {:.3} s into {}",
        summary.messages,
        summary.bytes,
        started.elapsed().as_secs_f64(),
        options.output.display()
    );
    if missed > 0 {
        eprintln!(
            "ferromq: record: missed {missed} message(s) that passed while recording: the \
             recorder did not keep up (the device never waits for it); the recording says so"
        );
    }
    if vanished {
        bail!(
            "device {:?} (pid {}) ended without closing its tap (killed, or its tap's forwarder \
             did not finish in time): copies it had not sent may be missing from the recording, \
             uncounted",
            options.device,
            entry.pid
        );
    }
    Ok(missed)
}

/// Writes copies until a stop; says what was missed.
async fn take_copies(
    options: &RecordOptions,
    pid: u32,
    stream: &mut Channel,
    writer: &mut Writer,
    mut signals: crate::Signals,
) -> Result<Copies> {
    let started = Instant::now();
    let deadline = options
        .duration
        .map(|seconds| tokio::time::Instant::now() + Duration::from_secs_f64(seconds));
    // Missed: gaps in the numbers, and what the device counted as missed.
    let mut expected = 0u64;
    let mut gaps = 0u64;
    let mut end_missed = None;
    let mut vanished = false;
    // The device's process is gone: one short look more for what it sent before it went (its
    // end marker may be queued here, behind the last copies).
    let mut device_gone = false;
    loop {
        if options
            .messages
            .is_some_and(|limit| writer.summary().messages >= limit)
        {
            break;
        }
        let wait = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        let look = if device_gone {
            LAST_LOOK
        } else {
            Duration::from_secs(1)
        };
        let parts = tokio::select! {
            name = signals.next() => {
                println!("ferromq: {name}: stopping the recording");
                break;
            }
            () = wait => break,
            parts = stream.receive_parts_timeout(look) => parts,
        };
        let parts = match parts {
            Ok(parts) => parts,
            Err(ferromq_core::Error::Timeout { .. }) => {
                // A device's end closes its tap (the end marker below); one that did not get
                // there (killed) may have had copies on their way. A zombie has exited too: a
                // parent that has not waited for it yet keeps its pid.
                if device_gone {
                    vanished = true;
                    break;
                }
                device_gone = !ferromq_shm::segment::ProcessId { pid, start_time: 0 }.is_alive();
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let mut parts = parts.into_vec().into_iter();
        let header = parts
            .next()
            .and_then(|first| TapHeader::decode(first.data()))
            .ok_or_else(|| anyhow!("the tap sent a message without its header"))?;
        let direction = match header.kind {
            TapKind::End => {
                // The tap closed on the device's side: its count covers what followed the
                // last copy too.
                println!(
                    "ferromq: device {:?} closed the tap after {} message(s)",
                    options.device, header.sequence
                );
                end_missed = Some(header.missed);
                break;
            }
            TapKind::In => Direction::In,
            TapKind::Out => Direction::Out,
        };
        gaps += header.sequence.saturating_sub(expected);
        expected = header.sequence + 1;
        let record = Record {
            direction,
            sequence: header.sequence,
            at: header.at,
            parts: parts.map(ferromq_core::Message::into_bytes).collect(),
        };
        writer.write(&record)?;
    }
    // The device numbers every message and counts the ones it could not copy: the gaps are
    // those, seen from here, up to the last copy; a closing tap's count also covers the rest.
    let missed = end_missed.map_or(gaps, |missed| missed.max(gaps));
    Ok(Copies {
        missed,
        started,
        vanished,
    })
}

/// How recording went.
struct Copies {
    /// Messages the device numbered that are not in the recording.
    missed: u64,
    /// When recording started.
    started: Instant,
    /// The device's process ended without closing the tap (killed): copies it had not sent yet
    /// may be missing, uncounted.
    vanished: bool,
}
