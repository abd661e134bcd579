//! Event building, request-driven (FairMQ/ALICE's FLP→EPN, with ATLAS's flow control).
//!
//! N [`StfSource`]s hold sub-timeframes; M [`Builder`]s each assemble the events whose id is
//! theirs (`id % M == builder index`) from one part per source. A builder *requests* an event id
//! from every source and keeps at most `max-outstanding` ids requested and not yet complete, so
//! no source can flood a builder and the memory in flight stays bounded whatever the rates.
//!
//! Wire format: a request is `[event id u64][builder index u32]`; a sub-timeframe starts with
//! `[event id u64][source index u32]` followed by `stf-size - 12` payload bytes.

use std::collections::HashMap;

use ferromq_core::{BoxError, Message};
use ferromq_device::{Device, DeviceContext, DeviceError};

fn read_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Answers event requests on `requests` with a sub-timeframe of `stf-size` bytes, sent on the
/// socket of `data-out` that leads to the requesting builder.
#[derive(Debug, Default)]
pub struct StfSource {
    outputs: Vec<String>,
    stf_size: usize,
    source_index: u32,
}

#[async_trait::async_trait]
impl Device for StfSource {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.outputs = crate::sockets_of(ctx, "data-out")?;
        ctx.channel("requests")?;
        self.stf_size = ctx.property_or("stf-size", 65536usize)?.max(12);
        self.source_index = ctx.property_or("replica-index", 0u32)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let inputs = vec!["requests".to_owned()];
        while ctx.next_iteration() {
            let request = match ctx.poll(&inputs).await {
                Ok((_, request)) => request,
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            };
            let first = request.get(0).map(Message::data).unwrap_or_default();
            let (Some(event_id), Some(builder)) = (read_u64(first), read_u32(first, 8)) else {
                return Err(format!("malformed event request of {} bytes", first.len()).into());
            };
            let output = self
                .outputs
                .get(builder as usize % self.outputs.len())
                .expect("outputs is not empty")
                .clone();
            let mut stf = crate::allocate(ctx, &output, "stf-size", self.stf_size).await?;
            stf.data_mut()[..8].copy_from_slice(&event_id.to_le_bytes());
            stf.data_mut()[8..12].copy_from_slice(&self.source_index.to_le_bytes());
            if ctx.send(&output, stf).await.is_err() && ctx.stop_requested() {
                break;
            }
        }
        Ok(())
    }
}

/// Requests its events from every source (one socket of `requests` per source), assembles one
/// sub-timeframe per source into each event, and keeps at most `max-outstanding` events requested
/// and incomplete. `--max-iterations` bounds the events built.
#[derive(Debug, Default)]
pub struct Builder {
    sources: Vec<String>,
    index: u64,
    n_builders: u64,
    max_outstanding: usize,
    next_event: u64,
    incomplete: HashMap<u64, Vec<bool>>,
    n_built: u64,
}

impl Builder {
    async fn request_next(&mut self, ctx: &mut DeviceContext) -> Result<(), DeviceError> {
        let event_id = self.index + self.next_event * self.n_builders;
        self.next_event += 1;
        for source in self.sources.clone() {
            let mut request = Message::new(12);
            request.data_mut()[..8].copy_from_slice(&event_id.to_le_bytes());
            request.data_mut()[8..12].copy_from_slice(&(self.index as u32).to_le_bytes());
            ctx.send(&source, request).await?;
        }
        self.incomplete
            .insert(event_id, vec![false; self.sources.len()]);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Device for Builder {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.sources = crate::sockets_of(ctx, "requests")?;
        ctx.channel("data-in")?;
        self.index = ctx.property_or("replica-index", 0u64)?;
        self.n_builders = ctx.property_or("replica-count", 1u64)?.max(1);
        self.max_outstanding = ctx.property_or("max-outstanding", 8usize)?.max(1);
        self.next_event = 0;
        self.incomplete.clear();
        self.n_built = 0;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let inputs = vec!["data-in".to_owned()];
        let stopped = |error: &DeviceError, ctx: &DeviceContext| {
            ctx.stop_requested() || matches!(error, DeviceError::Channel(e) if e.is_interrupted())
        };
        for _ in 0..self.max_outstanding {
            if let Err(error) = self.request_next(ctx).await {
                return if stopped(&error, ctx) {
                    Ok(())
                } else {
                    Err(error.into())
                };
            }
        }
        while ctx.next_iteration() {
            loop {
                let stf = match ctx.poll(&inputs).await {
                    Ok((_, stf)) => stf,
                    Err(error) if stopped(&error, ctx) => return self.report(ctx),
                    Err(error) => return Err(error.into()),
                };
                let first = stf.get(0).map(Message::data).unwrap_or_default();
                let (Some(event_id), Some(source)) = (read_u64(first), read_u32(first, 8)) else {
                    return Err(format!("malformed sub-timeframe of {} bytes", first.len()).into());
                };
                let Some(parts) = self.incomplete.get_mut(&event_id) else {
                    return Err(format!(
                        "sub-timeframe of event {event_id}, which this builder did not request"
                    )
                    .into());
                };
                let Some(seen) = parts.get_mut(source as usize) else {
                    return Err(format!(
                        "event {event_id}: source index {source} beyond {} sources",
                        parts.len()
                    )
                    .into());
                };
                if std::mem::replace(seen, true) {
                    return Err(
                        format!("event {event_id}: source {source} sent its part twice").into(),
                    );
                }
                if parts.iter().all(|&seen| seen) {
                    self.incomplete.remove(&event_id);
                    self.n_built += 1;
                    break;
                }
            }
            if let Err(error) = self.request_next(ctx).await {
                return if stopped(&error, ctx) {
                    self.report(ctx)
                } else {
                    Err(error.into())
                };
            }
        }
        self.report(ctx)
    }
}

impl Builder {
    fn report(&self, ctx: &DeviceContext) -> Result<(), BoxError> {
        println!(
            "[{}] builder summary: built {} events from {} sources, at most {} outstanding",
            ctx.id(),
            self.n_built,
            self.sources.len(),
            self.max_outstanding
        );
        Ok(())
    }
}
