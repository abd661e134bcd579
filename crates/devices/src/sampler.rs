//! Senders: [`Sampler`] (generated, text or file payloads, checksummed) and
//! [`BenchmarkSampler`] (FairMQ's `bsampler`: as fast as allowed, optionally the same buffer).

use bytes::Bytes;
use ferromq_core::{BoxError, Message, Parts};
use ferromq_device::{Device, DeviceContext};

use crate::{Pacer, bool_property, channel_property, write_checksum};

/// Sends `--max-iterations` messages (or until STOP) of `msg-size` bytes, or of the `text`
/// property, or of the file `payload-file`, at `rate` messages/s (0 = unlimited).
#[derive(Debug, Default)]
pub struct Sampler {
    out_channel: String,
    template: Vec<u8>,
    checksum: bool,
    rate: f64,
}

#[async_trait::async_trait]
impl Device for Sampler {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.out_channel = channel_property(ctx, "out-channel", "data");
        ctx.channel(&self.out_channel)?;
        self.checksum = bool_property(ctx, "checksum", true)?;
        self.rate = ctx.property_or("rate", 0.0)?;
        self.template = if let Some(path) = ctx.property_text("payload-file") {
            tokio::fs::read(&path)
                .await
                .map_err(|error| format!("payload-file {path:?}: {error}"))?
        } else if let Some(text) = ctx.property_text("text") {
            text.into_bytes()
        } else {
            let msg_size: usize = ctx.property_or("msg-size", 1000)?;
            (0..msg_size)
                .map(|byte_idx| (byte_idx % 251) as u8)
                .collect()
        };
        if self.checksum && self.template.len() < 8 {
            return Err(format!(
                "checksummed messages need at least 8 bytes, the payload has {}; set checksum=false",
                self.template.len()
            )
            .into());
        }
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let mut pacer = Pacer::new(self.rate);
        while ctx.next_iteration() {
            pacer.wait().await;
            let mut message = ctx
                .new_message(&self.out_channel, self.template.len())
                .await?;
            let bytes = message.data_mut();
            bytes.copy_from_slice(&self.template);
            if self.checksum {
                // Vary the payload per message so that a misrouted or repeated message shows.
                let iteration = ctx.iterations().to_le_bytes();
                let n_vary = (bytes.len() - 8).min(8);
                bytes[8..8 + n_vary].copy_from_slice(&iteration[..n_vary]);
                write_checksum(bytes);
            }
            match ctx.send(&self.out_channel, message).await {
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
/// buffer over and over instead of allocating each message), `num-parts`.
#[derive(Debug, Default)]
pub struct BenchmarkSampler {
    out_channel: String,
    msg_size: usize,
    n_parts: usize,
    same_msg: bool,
    rate: f64,
}

#[async_trait::async_trait]
impl Device for BenchmarkSampler {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.out_channel = channel_property(ctx, "out-channel", "data");
        ctx.channel(&self.out_channel)?;
        self.msg_size = ctx.property_or("msg-size", 1_000_000)?;
        self.n_parts = ctx.property_or("num-parts", 1)?;
        self.same_msg = bool_property(ctx, "same-msg", false)?;
        let rate: f64 = ctx.property_or("rate", 0.0)?;
        self.rate = ctx.property_or("msg-rate", rate)?;
        if self.n_parts == 0 {
            return Err("num-parts must be at least 1".into());
        }
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let mut pacer = Pacer::new(self.rate);
        // With same-msg every message shares this one immutable buffer (no allocation, no copy).
        let shared = Bytes::from(vec![0u8; self.msg_size]);
        while ctx.next_iteration() {
            pacer.wait().await;
            let mut parts = Parts::new();
            for _ in 0..self.n_parts {
                let message = if self.same_msg {
                    Message::from(shared.clone())
                } else {
                    ctx.new_message(&self.out_channel, self.msg_size).await?
                };
                parts.push(message);
            }
            match ctx.send_parts(&self.out_channel, parts).await {
                Ok(()) => {}
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }
}
