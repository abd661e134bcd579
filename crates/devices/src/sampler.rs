//! Senders: [`Sampler`] (generated, text or file payloads, checksummed) and
//! [`BenchmarkSampler`] (FairMQ's `bsampler`: as fast as allowed, optionally the same buffer).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use bytes::Bytes;
use ferromq_core::{BoxError, Message, Parts};
use ferromq_device::{Device, DeviceContext, DeviceError};

use crate::{
    Outgoing, Pacer, Properties, bool_property, channel_property, parts_property,
    rate_burst_property, rate_property, try_zeroed, write_checksum,
};

/// Sends `--max-iterations` messages (or until STOP) of `msg-size` bytes, or of the `text`
/// property, or of the file `payload-file`, at `rate` messages/s (0 = unlimited). With
/// `num-parts` N > 1 each message has N parts, part i the payload's first `len / (i + 1)`
/// bytes (at least 8 with checksums), each checksummed: a receiver that loses a boundary
/// fails its checks.
#[derive(Debug, Default)]
pub struct Sampler {
    out_channel: String,
    template: Vec<u8>,
    /// `payload-file`, read at INIT after the properties are checked.
    payload_file: Option<String>,
    num_parts: usize,
    /// `msg-size` of a generated payload, until RUNNING makes the template.
    generated_size: Option<usize>,
    checksum: bool,
    rate: f64,
    /// `rate-burst-ms`: how long ahead of their due time paced messages may leave together.
    rate_burst: std::time::Duration,
}

impl Sampler {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.out_channel = channel_property(props, "out-channel", "data");
        self.checksum = bool_property(props, "checksum", true)?;
        // The sampler writes every byte of every message anyway; `memset` changes nothing.
        bool_property(props, "memset", false)?;
        self.rate = rate_property(props, "rate", 0.0)?;
        self.rate_burst = rate_burst_property(props, self.rate)?;
        self.num_parts = parts_property(props)?;
        // One source of bytes: the others would be ignored, silently.
        let sources: Vec<&str> = ["payload-file", "text", "msg-size"]
            .into_iter()
            .filter(|key| props.text(key).is_some())
            .collect();
        if let [first, second, ..] = sources[..] {
            return Err(props.invalid(
                second,
                format!("is given with {first:?}: a sampler sends one of payload-file, text and msg-size"),
            ));
        }
        self.payload_file = props.text("payload-file");
        self.generated_size = None;
        self.template = Vec::new();
        if self.payload_file.is_none() {
            if let Some(text) = props.text("text") {
                self.template = text.into_bytes();
            } else {
                // Generated when RUNNING starts, after the transport has given a first message.
                self.generated_size = Some(props.parse_or("msg-size", 1000)?);
            }
            self.check_payload_size(props)?;
        }
        Ok(())
    }

    /// A checksummed payload has room for its 8-byte checksum.
    fn check_payload_size(&self, props: &impl Properties) -> Result<(), DeviceError> {
        let payload_size = self.generated_size.unwrap_or(self.template.len());
        if self.checksum && payload_size < 8 {
            return Err(props.invalid(
                "checksum",
                format!(
                    "needs messages of at least 8 bytes, the payload has {payload_size}; set checksum=false"
                ),
            ));
        }
        Ok(())
    }
}

/// The largest `payload-file` read: a message of a gigabyte is a payload; more, or a file
/// with no end (`/dev/zero`, read until memory ran out), is refused, naming the file.
const MAX_PAYLOAD_FILE_BYTES: u64 = 1 << 30;

/// The bytes of `payload-file` `path`, read up to one past [`MAX_PAYLOAD_FILE_BYTES`] (it
/// may be a pipe, whose size cannot be asked first).
fn read_payload_file(path: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file =
        std::fs::File::open(path).map_err(|error| format!("payload-file {path:?}: {error}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_PAYLOAD_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("payload-file {path:?}: {error}"))?;
    if bytes.len() as u64 > MAX_PAYLOAD_FILE_BYTES {
        return Err(format!(
            "payload-file {path:?}: longer than {} GiB, the most a payload file may hold",
            MAX_PAYLOAD_FILE_BYTES >> 30
        ));
    }
    Ok(bytes)
}

/// Bytes a sampler writes between two looks at STOP while it builds or fills a large message
/// (a multiple of the payload's 251-byte period). A 4 GiB message was built and copied in one
/// go on the runtime's thread, and a signal went unheard for ~20 s meanwhile (a bad-input
/// sweep); 16 MiB take a few milliseconds.
const BUILD_CHUNK: usize = (16 << 20) / 251 * 251;

/// The generated payload of `size` bytes, byte i being `i % 251`, written a chunk at a time
/// with a yield between chunks (so that a signal's STOP is heard); `None` when STOP came
/// first. Each byte is written once (no zeroing first): the first period by hand, the rest
/// copied from what is already there.
async fn build_template<S: Future<Output = ()>>(
    stopped: &mut Pin<&mut S>,
    size: usize,
) -> Result<Option<Vec<u8>>, BoxError> {
    let mut template = crate::try_with_capacity("msg-size", size)?;
    template.extend((0..size.min(251)).map(|byte_idx| byte_idx as u8));
    while template.len() < size {
        let len = template.len();
        // `len` stays a multiple of 251 (so the copy continues the pattern) until the last
        // piece, which may be shorter.
        let n = (size - len).min(len).min(BUILD_CHUNK);
        template.extend_from_within(..n);
        if template.len() < size && yield_and_look(stopped).await {
            return Ok(None);
        }
    }
    Ok(Some(template))
}

/// Copies `from` into `to` (of the same length), a [`BUILD_CHUNK`] at a time as
/// [`in_chunks_heeding_stop`] does. False when STOP came first (`to` is then partly written).
async fn copy_heeding_stop<S: Future<Output = ()>>(
    stopped: &mut Pin<&mut S>,
    to: &mut [u8],
    from: &[u8],
) -> bool {
    in_chunks_heeding_stop(stopped, to, |to, offset| {
        to.copy_from_slice(&from[offset..offset + to.len()]);
    })
    .await
}

/// Zeroes `bytes` (the bsampler's `memset`), a [`BUILD_CHUNK`] at a time as
/// [`in_chunks_heeding_stop`] does. False when STOP came first (`bytes` is then partly
/// zeroed).
async fn zero_heeding_stop<S: Future<Output = ()>>(
    stopped: &mut Pin<&mut S>,
    bytes: &mut [u8],
) -> bool {
    in_chunks_heeding_stop(stopped, bytes, |chunk, _| chunk.fill(0)).await
}

/// Runs `write(chunk, offset)` over `bytes`: in one go up to [`BUILD_CHUNK`], else a chunk at a
/// time with a yield and a look at STOP between chunks. False when STOP came first.
async fn in_chunks_heeding_stop<S: Future<Output = ()>>(
    stopped: &mut Pin<&mut S>,
    bytes: &mut [u8],
    mut write: impl FnMut(&mut [u8], usize),
) -> bool {
    if bytes.len() <= BUILD_CHUNK {
        write(bytes, 0);
        return true;
    }
    for (chunk_idx, chunk) in bytes.chunks_mut(BUILD_CHUNK).enumerate() {
        if chunk_idx > 0 && yield_and_look(stopped).await {
            return false;
        }
        write(chunk, chunk_idx * BUILD_CHUNK);
    }
    true
}

/// Lets the runtime's other tasks run (a signal's handler among them), then says whether
/// `stopped` (the device's `ctx.stopped()`) has completed, without waiting for it. (A
/// `&DeviceContext` held across the yield would make the device's future not `Send`.)
async fn yield_and_look<S: Future<Output = ()>>(stopped: &mut Pin<&mut S>) -> bool {
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| Poll::Ready(stopped.as_mut().poll(cx).is_ready())).await
}

#[async_trait::async_trait]
impl Device for Sampler {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        crate::checked_socket(ctx, &self.out_channel, crate::Role::Sends)?;
        if let Some(path) = self.payload_file.clone() {
            self.template = tokio::task::spawn_blocking(move || read_payload_file(&path))
                .await
                .map_err(|error| format!("payload-file: {error}"))??;
            self.check_payload_size(ctx)?;
        }
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let outgoing = Outgoing::new(ctx, &self.out_channel, "msg-size")?;
        let stopped = ctx.stopped();
        tokio::pin!(stopped);
        if let Some(msg_size) = self.generated_size {
            // One message from the transport first: a size its memory cannot hold (a shmem
            // segment too small) is reported by the transport, naming both sizes, before the
            // template takes as much heap. STOP meanwhile leaves the template to the next run
            // (and this one sends nothing: `next_iteration` sees STOP).
            if let Some(first) = outgoing.message(ctx, msg_size).await {
                drop(first?);
                match build_template(&mut stopped, msg_size).await? {
                    Some(template) => {
                        self.template = template;
                        self.generated_size = None;
                    }
                    None => tracing::info!(
                        device = %ctx.id(),
                        "STOP while the {msg_size}-byte payload was being built: nothing sent"
                    ),
                }
            }
        }
        let mut pacer = Pacer::with_burst(self.rate, self.rate_burst);
        let mut checksummed = 0;
        'messages: while ctx.next_iteration() {
            // The pacer first: when it is ready (always, unthrottled) STOP's future is not
            // polled, which would take its lock per message; `next_iteration` sees STOP.
            tokio::select! {
                biased;
                () = pacer.wait() => {}
                () = &mut stopped => break,
            }
            if checksummed >= crate::CHECKSUM_BYTES_PER_TURN {
                checksummed = 0;
                tokio::task::yield_now().await;
            }
            let mut parts = Parts::with_capacity(self.num_parts);
            for part_idx in 0..self.num_parts {
                let floor = if self.checksum { 8 } else { 0 };
                let size = (self.template.len() / (part_idx + 1)).max(floor);
                let Some(made) = outgoing.message(ctx, size).await else {
                    break 'messages;
                };
                let mut message = made?;
                let bytes = message.data_mut();
                if !copy_heeding_stop(&mut stopped, bytes, &self.template[..size]).await {
                    break 'messages;
                }
                if self.checksum {
                    // Vary the payload per message (and part) so that a misrouted, repeated or
                    // reordered message shows.
                    let mut vary = [0u8; 16];
                    vary[..8].copy_from_slice(&ctx.iterations().to_le_bytes());
                    vary[8..].copy_from_slice(&(part_idx as u64).to_le_bytes());
                    let n_vary = (bytes.len() - 8).min(16);
                    bytes[8..8 + n_vary].copy_from_slice(&vary[..n_vary]);
                    write_checksum(bytes);
                    checksummed += bytes.len();
                }
                parts.push(message);
            }
            let sent = if self.num_parts == 1 {
                let message = parts.into_vec().pop().expect("one part");
                ctx.send(&self.out_channel, message).await
            } else {
                ctx.send_parts(&self.out_channel, parts).await
            };
            match sent {
                Ok(()) => {}
                Err(error) if ctx.stop_requested() => {
                    tracing::debug!(%error, "send interrupted by STOP");
                    break;
                }
                Err(error) => return Err(error.into()),
            }
        }
        tracing::info!(device = %ctx.id(), "sent {} messages", ctx.counters(&self.out_channel)?.messages_out);
        Ok(())
    }
}

/// FairMQ's benchmark sampler: `msg-size`, `msg-rate` (0 = unlimited), `same-msg` (send one
/// buffer over and over instead of allocating each message), `num-parts` (parts per message;
/// FairMQ's `multipart false` sends single messages whatever `num-parts` says), `memset` (zero
/// every byte of each message before sending it, FairMQ's benchmark recipe).
#[derive(Debug, Default)]
pub struct BenchmarkSampler {
    out_channel: String,
    msg_size: usize,
    n_parts: usize,
    same_msg: bool,
    memset: bool,
    rate: f64,
    /// `rate-burst-ms`, as the sampler's.
    rate_burst: std::time::Duration,
}

impl BenchmarkSampler {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.out_channel = channel_property(props, "out-channel", "data");
        self.msg_size = props.parse_or("msg-size", 1_000_000)?;
        self.n_parts = parts_property(props)?;
        if props.text("multipart").is_some() && !bool_property(props, "multipart", false)? {
            self.n_parts = 1;
        }
        self.same_msg = bool_property(props, "same-msg", false)?;
        self.memset = bool_property(props, "memset", false)?;
        let rate = rate_property(props, "rate", 0.0)?;
        self.rate = rate_property(props, "msg-rate", rate)?;
        self.rate_burst = rate_burst_property(props, self.rate)?;
        // Two paces are one too many (msg-rate won, silently). `ferromq device` always sets
        // `rate`, 0 unless given, so 0 is no pace asked for.
        if rate != 0.0 && self.rate != rate {
            let text = |key| props.text(key).unwrap_or_default();
            return Err(props.invalid(
                "msg-rate",
                format!(
                    "(= {:?}) is given with \"rate\" (= {:?}): both are a bsampler's messages per second; give one",
                    text("msg-rate"),
                    text("rate")
                ),
            ));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Device for BenchmarkSampler {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        crate::checked_socket(ctx, &self.out_channel, crate::Role::Sends)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let mut pacer = Pacer::with_burst(self.rate, self.rate_burst);
        // With same-msg every message shares this one immutable (zeroed) buffer: no allocation,
        // no copy.
        let shared = if self.same_msg {
            Bytes::from(try_zeroed("msg-size", self.msg_size)?)
        } else {
            Bytes::new()
        };
        // Resolved once: no name lookup per message.
        let out = ctx.channel_id(&self.out_channel)?;
        let outgoing = Outgoing::new(ctx, &self.out_channel, "msg-size")?;
        let stopped = ctx.stopped();
        tokio::pin!(stopped);
        'messages: while ctx.next_iteration() {
            // The pacer first: when it is ready (always, unthrottled) STOP's future is not
            // polled, which would take its lock per message; `next_iteration` sees STOP.
            tokio::select! {
                biased;
                () = pacer.wait() => {}
                () = &mut stopped => break,
            }
            let mut parts = Parts::with_capacity(self.n_parts);
            for _ in 0..self.n_parts {
                let message = if self.same_msg {
                    Message::from(shared.clone())
                } else {
                    // The transport's own memory (a shmem block, a recycled zeromq buffer).
                    let Some(made) = outgoing.message(ctx, self.msg_size).await else {
                        break 'messages;
                    };
                    let mut message = made?;
                    // A large message a chunk at a time: a 4 GiB one was zeroed in one go, and
                    // a signal went unheard meanwhile (a bad-input sweep).
                    if self.memset && !zero_heeding_stop(&mut stopped, message.data_mut()).await {
                        tracing::info!(
                            device = %ctx.id(),
                            msg_size = self.msg_size,
                            "STOP while a {}-byte message was being zeroed (memset): it was not sent",
                            self.msg_size
                        );
                        break 'messages;
                    }
                    message
                };
                parts.push(message);
            }
            match ctx.send_parts_on(out, parts).await {
                Ok(()) => {}
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload built a chunk at a time is the byte-by-byte pattern, at every size around
    /// the period and the chunk; a copy in chunks is the slice copied.
    #[tokio::test]
    async fn a_payload_built_in_chunks_is_the_pattern_and_copies_whole() {
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        for size in [
            0,
            1,
            250,
            251,
            252,
            502,
            503,
            BUILD_CHUNK - 1,
            BUILD_CHUNK + 1,
            2 * BUILD_CHUNK + 7,
        ] {
            let template = build_template(&mut never, size)
                .await
                .expect("allocated")
                .expect("no STOP");
            assert_eq!(template.len(), size);
            let wrong = template
                .iter()
                .enumerate()
                .position(|(byte_idx, byte)| *byte != (byte_idx % 251) as u8);
            assert_eq!(wrong, None, "size {size}");
            let mut copy = vec![0u8; size];
            assert!(copy_heeding_stop(&mut never, &mut copy, &template).await);
            assert!(copy == template, "size {size}");
        }
        // STOP before the second chunk: nothing built, and a copy stops after its first chunk.
        let stopped = std::future::ready(());
        tokio::pin!(stopped);
        assert!(
            build_template(&mut stopped, 2 * BUILD_CHUNK)
                .await
                .expect("allocated")
                .is_none()
        );
        let mut copy = vec![0u8; 2 * BUILD_CHUNK];
        let from = vec![1u8; 2 * BUILD_CHUNK];
        let stopped = std::future::ready(());
        tokio::pin!(stopped);
        assert!(!copy_heeding_stop(&mut stopped, &mut copy, &from).await);
        assert_eq!(copy.iter().filter(|byte| **byte == 1).count(), BUILD_CHUNK);
    }

    /// `memset` zeroes every byte at every size around the chunk, and STOP ends a large fill
    /// after its first chunk.
    #[tokio::test]
    async fn a_message_zeroed_in_chunks_is_zero_and_heeds_stop() {
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        for size in [
            0,
            1,
            BUILD_CHUNK - 1,
            BUILD_CHUNK,
            BUILD_CHUNK + 1,
            2 * BUILD_CHUNK + 7,
        ] {
            let mut bytes = vec![9u8; size];
            assert!(zero_heeding_stop(&mut never, &mut bytes).await);
            assert!(bytes.iter().all(|byte| *byte == 0), "size {size}");
        }
        let stopped = std::future::ready(());
        tokio::pin!(stopped);
        let mut bytes = vec![9u8; 2 * BUILD_CHUNK];
        assert!(!zero_heeding_stop(&mut stopped, &mut bytes).await);
        assert_eq!(bytes.iter().filter(|byte| **byte == 0).count(), BUILD_CHUNK);
    }
}
