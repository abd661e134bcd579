//! [`Replay`]: feeds a recording (`ferromq record`) into a channel.

use std::time::Duration;

use ferromq_core::{BoxError, Message, Parts};
use ferromq_device::{Device, DeviceContext, DeviceError};
use ferromq_record::Reader;

use crate::{Properties, channel_property};

/// Sends every message of the recording `file` on `out-channel` (default `data`), parts and
/// boundaries as recorded, at the recorded pace times `speed` (default 1; 2 is twice as fast;
/// 0 as fast as the channel takes them). `--max-iterations` bounds how many. A file cut short
/// (its recorder did not finish) is replayed up to its last whole message, with a warning; a
/// corrupt or inconsistent one (a message without parts, a sequence number not above the one
/// before, a summary that disagrees with the messages, bytes after the end record) fails the
/// device where the reading reaches the bad record, naming the file, the offset and the value,
/// once the messages before it were sent.
#[derive(Debug, Default)]
pub struct Replay {
    out_channel: String,
    file: String,
    speed: f64,
}

/// The largest `speed` taken: past it the pace is "as fast as possible" anyway.
pub const MAX_SPEED: f64 = 1e9;

/// The smallest `speed` other than 0: a thousand times slower than recorded (a recorded
/// millisecond takes a second). Below it a recorded millisecond would take hours, and the
/// schedule's arithmetic leaves what a clock can hold.
pub const MIN_SPEED: f64 = 1e-3;

impl Replay {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.out_channel = channel_property(props, "out-channel", "data");
        self.file = props
            .text("file")
            .filter(|file| !file.is_empty())
            .ok_or_else(|| {
                props.invalid(
                    "file",
                    "is missing: replay needs the recording to play (`ferromq replay FILE` gives it)"
                        .to_owned(),
                )
            })?;
        self.speed = props.parse_or("speed", 1.0)?;
        if !(self.speed == 0.0 || (MIN_SPEED..=MAX_SPEED).contains(&self.speed)) {
            // `{:?}`: 1e308 as `1e308`, not 309 digits.
            return Err(props.invalid(
                "speed",
                format!(
                    "has invalid value \"{:?}\": expected 0 (as fast as possible) or a factor from {MIN_SPEED:e} to {MAX_SPEED:e}",
                    self.speed
                ),
            ));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Device for Replay {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        crate::checked_socket(ctx, &self.out_channel, crate::Role::Sends)?;
        // Fail at INIT TASK, not RUNNING, on a file that is no recording.
        let path = std::path::PathBuf::from(&self.file);
        tokio::task::spawn_blocking(move || Reader::open(&path).map(|_| ()))
            .await
            .map_err(|error| format!("reading {}: {error}", self.file))??;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let out = ctx.channel_id(&self.out_channel)?;
        // Read ahead on a blocking thread: a large recording never stalls the device's runtime.
        let (records, mut incoming) = tokio::sync::mpsc::channel(1024);
        let path = std::path::PathBuf::from(&self.file);
        let reading = tokio::task::spawn_blocking(move || {
            let mut reader = Reader::open(&path)?;
            while let Some(record) = reader.next_record()? {
                if records.blocking_send(record).is_err() {
                    break;
                }
            }
            Ok::<_, ferromq_record::RecordingError>(reader.summary())
        });
        let started = tokio::time::Instant::now();
        let mut first_at: Option<Duration> = None;
        let (mut n_messages, mut n_bytes) = (0u64, 0u64);
        // Whether the loop took everything the reader had: only then does what the reader
        // found at the end (its summary, an error) concern this run.
        let mut read_to_end = false;
        while ctx.next_iteration() {
            let Some(record) = incoming.recv().await else {
                read_to_end = true;
                break;
            };
            if self.speed > 0.0 {
                let first = *first_at.get_or_insert(record.at);
                let since_first = record.at.saturating_sub(first);
                // A corrupt or absurd timestamp (centuries after the first) is no panic: the
                // schedule it asks for is refused, naming the message.
                let due = Duration::try_from_secs_f64(since_first.as_secs_f64() / self.speed)
                    .ok()
                    .and_then(|wait| started.checked_add(wait))
                    .ok_or_else(|| {
                        format!(
                            "{}: message {} was recorded {:?} after the first; at speed {:?} its time to leave is past what the clock can hold",
                            self.file,
                            n_messages + 1,
                            since_first,
                            self.speed
                        )
                    })?;
                if due > tokio::time::Instant::now() {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = ctx.stopped() => break,
                    }
                }
            }
            let mut parts = Parts::with_capacity(record.parts.len());
            let mut size = 0u64;
            for part in record.parts {
                size += part.len() as u64;
                parts.push(Message::from(part));
            }
            match ctx.send_parts_on(out, parts).await {
                Ok(()) => {
                    n_messages += 1;
                    n_bytes += size;
                }
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            }
        }
        drop(incoming);
        let outcome = reading.await.map_err(|error| error.to_string())?;
        // Stopped early (a stop, `--max-iterations`): the reader, cut off, reached no end
        // record, and what it found past the last message sent is not this run's business.
        if read_to_end {
            match outcome {
                Ok(Some(_)) => {}
                Ok(None) => tracing::warn!(
                    device = %ctx.id(),
                    file = %self.file,
                    "the recording has no end record (its recorder did not finish): replayed what it holds"
                ),
                Err(error) => return Err(error.into()),
            }
        }
        tracing::info!(
            device = %ctx.id(),
            "replayed {n_messages} messages ({n_bytes} bytes) from {} in {:.3} s",
            self.file,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
