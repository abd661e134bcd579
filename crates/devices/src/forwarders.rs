//! Devices that move messages between channels without looking into them (unless asked):
//! [`Processor`], [`Splitter`], [`Merger`], [`Proxy`], [`Multiplier`].
//!
//! None of them copies a payload: a message received is the message sent on. The multiplier
//! shares one immutable buffer between its outputs.

use ferromq_core::{BoxError, Message, Parts};
use ferromq_device::{ChannelId, Device, DeviceContext, DeviceError};

use crate::{Properties, bool_property, channel_property, fnv1a};

/// Receives from any of `inputs`; `None` once STOP or `--max-iterations` ends the run.
async fn next_message(
    ctx: &mut DeviceContext,
    inputs: &[String],
) -> Result<Option<Parts>, BoxError> {
    if !ctx.next_iteration() {
        return Ok(None);
    }
    match ctx.poll(inputs).await {
        Ok((_, parts)) => Ok(Some(parts)),
        Err(_) if ctx.stop_requested() => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Sends a message this device took from an input ([`DeviceContext::forward_parts_on`]: STOP
/// ends the receiving, not the message in hand); `false` once STOP ends the run.
async fn forward(
    ctx: &mut DeviceContext,
    output: ChannelId,
    parts: Parts,
) -> Result<bool, BoxError> {
    ctx.forward_parts_on(output, parts).await?;
    Ok(!ctx.stop_requested())
}

/// The sockets `names`, resolved once per run: no name lookup or copy per message.
fn resolved(ctx: &DeviceContext, names: &[String]) -> Result<Vec<ChannelId>, DeviceError> {
    names.iter().map(|name| ctx.channel_id(name)).collect()
}

/// Passes each message from `in-channel` (`data-in`) to `out-channel` (`data-out`); with
/// `touch`, reads every byte first (the cost a real processing step pays). At the end it prints
/// a summary with the payload bytes this process copied (`ferromq_core::copied_bytes`), which
/// is 0 on a zero-copy path (shmem to shmem, shmem to ofi, ofi to shmem).
#[derive(Debug, Default)]
pub struct Processor {
    inputs: Vec<String>,
    output: String,
    touch: bool,
    /// Keeps the reads of `touch` from being optimised away.
    digest: u64,
    forwarded: u64,
    forwarded_bytes: u64,
    /// Messages whose every part was in shared memory when it arrived.
    in_shared_memory: u64,
}

impl Processor {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.touch = bool_property(props, "touch", false)?;
        Ok(())
    }
}

/// Every socket of `in-channel` (default `data-in`), each able to receive.
fn input_sockets(ctx: &mut DeviceContext) -> Result<Vec<String>, DeviceError> {
    let base = channel_property(ctx, "in-channel", "data-in");
    crate::checked_sockets(ctx, &base, crate::Role::Receives)
}

/// Every socket of `out-channel` (default `data-out`), each able to send.
fn output_sockets(ctx: &mut DeviceContext) -> Result<Vec<String>, DeviceError> {
    let base = channel_property(ctx, "out-channel", "data-out");
    crate::checked_sockets(ctx, &base, crate::Role::Sends)
}

#[async_trait::async_trait]
impl Device for Processor {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        self.inputs = input_sockets(ctx)?;
        self.output = channel_property(ctx, "out-channel", "data-out");
        crate::checked_socket(ctx, &self.output, crate::Role::Sends)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let copied_before = ferromq_core::copied_bytes();
        let output = ctx.channel_id(&self.output)?;
        while let Some(parts) = next_message(ctx, &self.inputs).await? {
            if self.touch {
                for part in &parts {
                    self.digest ^= fnv1a(part.data());
                }
            }
            self.forwarded += 1;
            self.forwarded_bytes += parts.total_size() as u64;
            if parts.iter().all(|part| part.memory_kind() == "shmem") {
                self.in_shared_memory += 1;
            }
            if !forward(ctx, output, parts).await? {
                break;
            }
        }
        tracing::debug!(digest = self.digest, "processor done");
        // Like the sink's summary, this is the device's result: stdout whatever the log level.
        crate::print_summary(format_args!(
            "[{}] processor summary: forwarded {} messages, {} bytes ({} arrived in shared memory), copied {} payload bytes",
            ctx.id(),
            self.forwarded,
            self.forwarded_bytes,
            self.in_shared_memory,
            ferromq_core::copied_bytes() - copied_before
        ));
        Ok(())
    }
}

/// How a splitter picks an output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Routing {
    #[default]
    RoundRobin,
    /// The first 8 bytes of the first part, little endian, modulo the number of outputs: all
    /// messages with one key go to one output (event building routes by event id this way).
    Key,
}

/// One input (`data-in`) to the sockets of `data-out`, round robin or by key (`routing`).
#[derive(Debug, Default)]
pub struct Splitter {
    inputs: Vec<String>,
    outputs: Vec<String>,
    routing: Routing,
    next_output: usize,
}

impl Splitter {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.routing = match props.text("routing").as_deref() {
            None | Some("round-robin") => Routing::RoundRobin,
            Some("key") => Routing::Key,
            Some(other) => {
                return Err(props.invalid(
                    "routing",
                    format!("has invalid value {other:?}: expected round-robin or key"),
                ));
            }
        };
        Ok(())
    }
}

#[async_trait::async_trait]
impl Device for Splitter {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        self.inputs = input_sockets(ctx)?;
        self.outputs = output_sockets(ctx)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let outputs = resolved(ctx, &self.outputs)?;
        while let Some(parts) = next_message(ctx, &self.inputs).await? {
            let output_idx = match self.routing {
                Routing::RoundRobin => {
                    self.next_output = (self.next_output + 1) % self.outputs.len();
                    self.next_output
                }
                Routing::Key => {
                    let first = parts.get(0).map(Message::data).unwrap_or_default();
                    let mut key = [0u8; 8];
                    let n_key = first.len().min(8);
                    key[..n_key].copy_from_slice(&first[..n_key]);
                    (u64::from_le_bytes(key) % self.outputs.len() as u64) as usize
                }
            };
            if !forward(ctx, outputs[output_idx], parts).await? {
                break;
            }
        }
        Ok(())
    }
}

/// The sockets of `data-in` (fairly polled) to `data-out`.
#[derive(Debug, Default)]
pub struct Merger {
    inputs: Vec<String>,
    output: String,
}

#[async_trait::async_trait]
impl Device for Merger {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.inputs = input_sockets(ctx)?;
        self.output = channel_property(ctx, "out-channel", "data-out");
        crate::checked_socket(ctx, &self.output, crate::Role::Sends)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let output = ctx.channel_id(&self.output)?;
        while let Some(parts) = next_message(ctx, &self.inputs).await? {
            if !forward(ctx, output, parts).await? {
                break;
            }
        }
        Ok(())
    }
}

/// Forwards `data-in` to `data-out` unchanged (multipart kept).
#[derive(Debug, Default)]
pub struct Proxy {
    merger: Merger,
}

#[async_trait::async_trait]
impl Device for Proxy {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.merger.init_task(ctx).await
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.merger.run(ctx).await
    }
}

/// Sends each message of `data-in` to every socket of `data-out`. The outputs share one
/// immutable buffer per part; nothing is copied.
#[derive(Debug, Default)]
pub struct Multiplier {
    inputs: Vec<String>,
    outputs: Vec<String>,
}

#[async_trait::async_trait]
impl Device for Multiplier {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.inputs = input_sockets(ctx)?;
        self.outputs = output_sockets(ctx)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let outputs = resolved(ctx, &self.outputs)?;
        while let Some(parts) = next_message(ctx, &self.inputs).await? {
            let frames: Vec<bytes::Bytes> = parts.into_iter().map(Message::into_bytes).collect();
            // Every output gets the message, STOP or not: a copy in hand is no less accepted.
            let mut go_on = true;
            for &output in &outputs {
                let shared: Parts = frames.iter().cloned().map(Message::from).collect();
                go_on &= forward(ctx, output, shared).await?;
            }
            if !go_on {
                return Ok(());
            }
        }
        Ok(())
    }
}
