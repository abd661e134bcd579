//! [`Sink`]: receives, counts, optionally verifies checksums, optionally writes what it
//! receives to a file (FairMQ's `out-filename`, `max-file-size`), and prints a summary.

use std::time::Instant;

use tokio::io::AsyncWriteExt;

use ferromq_core::{BoxError, Parts};
use ferromq_device::{Device, DeviceContext, DeviceError, Flow};

use crate::{Properties, bool_property, channel_property, checksum_ok};

/// What a sink saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkSummary {
    /// Messages received (a multipart message counts once).
    pub n_msgs: u64,
    /// Payload bytes received.
    pub n_bytes: u64,
    /// Messages whose checksum was verified.
    pub n_verified: u64,
}

/// Counts what arrives on `in-channel` (default `data`) until STOP or `--max-iterations`;
/// with `verify`, fails on the first message whose checksum is wrong (every part's), or whose
/// part count is not `num-parts` (when given). With `out-filename`, every
/// part received is appended to that file (created or truncated at INIT TASK) until
/// `max-file-size` bytes (FairMQ's default 2000000000; 0 = unlimited) are written, which also
/// ends the run, as in FairMQ. `multipart` is accepted: whole messages are always received.
#[derive(Debug, Default)]
pub struct Sink {
    in_channel: String,
    verify: bool,
    /// With `verify`: the parts every message must have (0: any).
    num_parts: usize,
    /// `max-file-size`, for the file of `out-filename`.
    max_file_size: u64,
    summary: SinkSummary,
    /// Bytes verified since the runtime's other tasks last had a turn.
    verified_bytes: usize,
    started: Option<Instant>,
    output: Option<OutputFile>,
}

/// The file of `out-filename`.
#[derive(Debug)]
struct OutputFile {
    path: String,
    file: tokio::io::BufWriter<tokio::fs::File>,
    n_written: u64,
    max_size: u64,
}

/// FairMQ's default `max-file-size`.
const FAIRMQ_MAX_FILE_SIZE: u64 = 2_000_000_000;

impl Sink {
    /// What this sink has seen so far.
    pub fn summary(&self) -> SinkSummary {
        self.summary
    }

    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.in_channel = channel_property(props, "in-channel", "data");
        self.verify = bool_property(props, "verify", false)?;
        // Absent: any count (0). Given, a count a message can have: `--num-parts 0` is refused
        // as a usage error, and the property the same.
        self.num_parts = props.parse_or("num-parts", 0)?;
        if let Some(text) = props.text("num-parts").filter(|_| self.num_parts == 0) {
            return Err(props.invalid(
                "num-parts",
                format!("has invalid value {text:?}: expected at least 1 part"),
            ));
        }
        bool_property(props, "multipart", false)?;
        self.max_file_size = props.parse_or("max-file-size", FAIRMQ_MAX_FILE_SIZE)?;
        Ok(())
    }
}

impl Sink {
    /// Counts, checks and writes one message (`on_data`'s work, called directly by `run` so that
    /// the hot path boxes no future).
    async fn consume(&mut self, parts: Parts, device: &str) -> Result<Flow, BoxError> {
        self.started.get_or_insert_with(Instant::now);
        if self.verify {
            if self.num_parts > 0 && parts.len() != self.num_parts {
                return Err(format!(
                    "message {} has {} part(s), num-parts says {}",
                    self.summary.n_msgs,
                    parts.len(),
                    self.num_parts
                )
                .into());
            }
            for (part_idx, part) in parts.iter().enumerate() {
                if !checksum_ok(part.data()) {
                    // A part too short to hold one was never given a checksum (a sender
                    // without `verify`, or of a size under 8): not a corrupted one.
                    let problem = if part.len() < 8 {
                        "too short to carry a checksum (it takes 8 bytes): was it sent with verify?"
                    } else {
                        "checksum mismatch"
                    };
                    return Err(format!(
                        "message {} part {part_idx} ({} bytes): {problem}",
                        self.summary.n_msgs,
                        part.len()
                    )
                    .into());
                }
            }
            self.summary.n_verified += 1;
            self.verified_bytes += parts.total_size();
        }
        self.summary.n_msgs += 1;
        self.summary.n_bytes += parts.total_size() as u64;
        if let Some(output) = &mut self.output {
            for part in &parts {
                output
                    .file
                    .write_all(part.data())
                    .await
                    .map_err(|error| format!("out-filename {:?}: {error}", output.path))?;
                output.n_written += part.len() as u64;
            }
            if output.max_size > 0 && output.n_written >= output.max_size {
                tracing::info!(
                    device,
                    bytes = output.n_written,
                    "max-file-size reached, stopping"
                );
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }
}

#[async_trait::async_trait]
impl Device for Sink {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        crate::checked_socket(ctx, &self.in_channel, crate::Role::Receives)?;
        self.summary = SinkSummary::default();
        self.output = match ctx
            .property_text("out-filename")
            .filter(|path| !path.is_empty())
        {
            None => None,
            Some(path) => {
                let file = tokio::fs::File::create(&path)
                    .await
                    .map_err(|error| format!("out-filename {path:?}: {error}"))?;
                Some(OutputFile {
                    path,
                    file: tokio::io::BufWriter::new(file),
                    n_written: 0,
                    max_size: self.max_file_size,
                })
            }
        };
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        // Resolved once: no name lookup per message.
        let input = ctx.channel_id(&self.in_channel)?;
        while ctx.next_iteration() {
            let parts = match ctx.receive_parts_on(input).await {
                Ok(parts) => parts,
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            };
            if self.consume(parts, ctx.id()).await? == Flow::Stop {
                break;
            }
            if self.verified_bytes >= crate::CHECKSUM_BYTES_PER_TURN {
                // Messages waiting make every receive complete at once: without this, the
                // control and observer endpoints waited for tokio's budget (128 receives).
                self.verified_bytes = 0;
                tokio::task::yield_now().await;
            }
        }
        if let Some(output) = &mut self.output {
            output
                .file
                .flush()
                .await
                .map_err(|error| format!("out-filename {:?}: {error}", output.path))?;
            tracing::info!(device = %ctx.id(), path = %output.path, bytes = output.n_written, "output file written");
        }
        Ok(())
    }

    async fn on_data(
        &mut self,
        _channel: &str,
        parts: Parts,
        ctx: &mut DeviceContext,
    ) -> Result<Flow, BoxError> {
        self.consume(parts, ctx.id()).await
    }

    async fn reset_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.output = None;
        let seconds = self
            .started
            .take()
            .map_or(0.0, |started| started.elapsed().as_secs_f64());
        let SinkSummary {
            n_msgs,
            n_bytes,
            n_verified,
        } = self.summary;
        let rate = if seconds > 0.0 {
            n_msgs as f64 / seconds
        } else {
            0.0
        };
        let checksums = if self.verify {
            format!(", {n_verified} checksums ok")
        } else {
            String::new()
        };
        // The summary is the sink's result: it goes to stdout whatever the log level.
        crate::print_summary(format_args!(
            "[{}] sink summary: received {n_msgs} messages, {n_bytes} bytes in {seconds:.3} s ({rate:.0} msg/s){checksums}",
            ctx.id()
        ));
        ctx.set_property("received-messages", n_msgs);
        ctx.set_property("received-bytes", n_bytes);
        Ok(())
    }
}
