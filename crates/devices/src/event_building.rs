//! Event building, request-driven (FairMQ/ALICE's FLP→EPN, with ATLAS's flow control).
//!
//! N [`StfSource`]s hold sub-timeframes; M [`Builder`]s each assemble the events whose id is
//! theirs (`id % M == builder index`) from one part per source. A builder *requests* an event id
//! from every source and keeps at most `max-outstanding` ids requested and not yet complete, so
//! no source can flood a builder and the memory in flight stays bounded whatever the rates.
//!
//! # Stopping
//! Requests and data form a cycle, so no stop order drains it: every device of the cycle is
//! stopped at once. A builder then requests nothing more and waits for the parts of the events
//! it did request (up to [`DRAIN_SILENCE`] without a part); a source goes on answering requests
//! until none came for [`DRAIN_SILENCE`]. So a stop loses nothing, and the shmem transport can
//! prove it (every message sent was taken); a device cut off meanwhile is reported by its peers'
//! closes as undelivered messages.
//!
//! Wire format: a request is `[event id u64][builder index u32]`; a sub-timeframe starts with
//! `[event id u64][source index u32]` followed by `stf-size - 12` payload bytes.

use std::collections::HashMap;
use std::time::Duration;

use ferromq_core::{BoxError, Message};
use ferromq_device::{Device, DeviceContext, DeviceError};

use crate::Properties;

/// How long a stopping device waits for its peers' last messages (see `# Stopping`).
pub const DRAIN_SILENCE: Duration = Duration::from_millis(500);

/// How long a source waits for a builder to take one answer (and a builder for a source to take
/// one request) before it fails: a peer that takes nothing for this long, while it asked, is
/// stalled or on a lost host, and a topology that has lost a host should stop soon.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

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

impl StfSource {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.stf_size = crate::at_least(
            props,
            "stf-size",
            65536,
            12,
            "bytes (a sub-timeframe starts with its 8-byte event id and 4-byte source index)",
        )?;
        self.source_index = props.parse_or("replica-index", 0u32)?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Device for StfSource {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        crate::checked_socket(ctx, "requests", crate::Role::Receives)?;
        self.outputs = crate::checked_sockets(ctx, "data-out", crate::Role::Sends)?;
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
            self.answer(ctx, &request).await?;
        }
        if ctx.stop_requested() {
            // The builders stop requesting: answer what they asked for until they are silent.
            loop {
                let requests = ctx.channel("requests")?;
                match requests.receive_parts_timeout(DRAIN_SILENCE).await {
                    Ok(request) => self.answer(ctx, &request).await?,
                    Err(error) if error.is_timeout() => break,
                    Err(error) => return Err(error.into()),
                }
            }
        }
        Ok(())
    }
}

impl StfSource {
    /// Sends the sub-timeframe `request` asks for.
    async fn answer(
        &self,
        ctx: &mut DeviceContext,
        request: &ferromq_core::Parts,
    ) -> Result<(), BoxError> {
        let first = request.get(0).map(Message::data).unwrap_or_default();
        let (Some(event_id), Some(builder)) = (read_u64(first), read_u32(first, 8)) else {
            return Err(format!("malformed event request of {} bytes", first.len()).into());
        };
        let output = self
            .outputs
            .get(builder as usize % self.outputs.len())
            .expect("outputs is not empty")
            .clone();
        // Not interrupted by STOP, as the send below.
        let mut stf = crate::allocate_promised(ctx, &output, "stf-size", self.stf_size).await?;
        stf.data_mut()[..8].copy_from_slice(&event_id.to_le_bytes());
        stf.data_mut()[8..12].copy_from_slice(&self.source_index.to_le_bytes());
        // Not interrupted by STOP: a request taken is a promise to its builder. A builder that
        // takes nothing for long is reported by the send's error.
        ctx.channel(&output)?
            .send_timeout(stf, ANSWER_TIMEOUT)
            .await
            .map_err(|failed| failed.error)?;
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
    /// Requests the next event from every source; false once `--max-iterations` events were
    /// requested. Not interrupted by STOP: an event is requested from all sources or none.
    async fn request_next(&mut self, ctx: &mut DeviceContext) -> Result<bool, BoxError> {
        let limit = ctx.max_iterations();
        if limit > 0 && self.next_event >= limit {
            return Ok(false);
        }
        let event_id = self.index + self.next_event * self.n_builders;
        self.next_event += 1;
        for source in self.sources.clone() {
            let mut request = Message::new(12);
            request.data_mut()[..8].copy_from_slice(&event_id.to_le_bytes());
            request.data_mut()[8..12].copy_from_slice(&(self.index as u32).to_le_bytes());
            ctx.channel(&source)?
                .send_timeout(request, ANSWER_TIMEOUT)
                .await
                .map_err(|failed| failed.error)?;
        }
        self.incomplete
            .insert(event_id, vec![false; self.sources.len()]);
        Ok(true)
    }

    /// Files one sub-timeframe; true when it completed its event.
    fn take(&mut self, stf: &ferromq_core::Parts) -> Result<bool, BoxError> {
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
            return Err(format!("event {event_id}: source {source} sent its part twice").into());
        }
        if parts.iter().all(|&seen| seen) {
            self.incomplete.remove(&event_id);
            self.n_built += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Receives the parts of every event requested and not complete, until none came for
    /// [`DRAIN_SILENCE`].
    async fn finish_requested(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        while !self.incomplete.is_empty() {
            match ctx
                .channel("data-in")?
                .receive_parts_timeout(DRAIN_SILENCE)
                .await
            {
                Ok(stf) => {
                    self.take(&stf)?;
                }
                Err(error) if error.is_timeout() => {
                    tracing::warn!(
                        device = ctx.id(),
                        n_events = self.incomplete.len(),
                        "events requested and never completed: a source stopped answering"
                    );
                    break;
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }
}

impl Builder {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.index = props.parse_or("replica-index", 0u64)?;
        self.n_builders = props.parse_or("replica-count", 1u64)?.max(1);
        self.max_outstanding = crate::at_least(
            props,
            "max-outstanding",
            8,
            1,
            "event (a builder with none requested builds nothing)",
        )?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Device for Builder {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        crate::checked_socket(ctx, "data-in", crate::Role::Receives)?;
        self.sources = crate::checked_sockets(ctx, "requests", crate::Role::Sends)?;
        self.next_event = 0;
        self.incomplete.clear();
        self.n_built = 0;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let inputs = vec!["data-in".to_owned()];
        for _ in 0..self.max_outstanding {
            if ctx.stop_requested() || !self.request_next(ctx).await? {
                break;
            }
        }
        // Until STOP: each completed event makes room for one more request.
        while !self.incomplete.is_empty() && !ctx.stop_requested() {
            let stf = match ctx.poll(&inputs).await {
                Ok((_, stf)) => stf,
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            };
            if self.take(&stf)? && !ctx.stop_requested() {
                self.request_next(ctx).await?;
            }
        }
        // What was requested is finished, STOP or not: the sources have sent it or will.
        self.finish_requested(ctx).await?;
        self.report(ctx)
    }
}

impl Builder {
    fn report(&self, ctx: &DeviceContext) -> Result<(), BoxError> {
        crate::print_summary(format_args!(
            "[{}] builder summary: built {} events from {} sources, at most {} outstanding",
            ctx.id(),
            self.n_built,
            self.sources.len(),
            self.max_outstanding
        ));
        Ok(())
    }
}
