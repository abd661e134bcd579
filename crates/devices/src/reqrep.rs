//! [`Client`] and [`Server`]: request/reply devices. The client sends `msg-size`-byte requests
//! and checks every reply; the server answers each request with it (an echo), so a client can
//! verify the round trip and measure it.

use ferromq_core::BoxError;
use ferromq_device::{Device, DeviceContext, DeviceError};

use crate::{Properties, channel_property};

/// Sends requests on `out-channel` (default `data`) and checks that each reply echoes it.
#[derive(Debug, Default)]
pub struct Client {
    channel: String,
    msg_size: usize,
}

impl Client {
    /// Reads the properties (INIT's part that [`crate::Builtin::check_properties`] shares).
    pub(crate) fn configure(&mut self, props: &impl Properties) -> Result<(), DeviceError> {
        self.channel = channel_property(props, "out-channel", "data");
        self.msg_size = crate::at_least(
            props,
            "msg-size",
            64,
            8,
            "bytes (a request starts with its 8-byte number, which the reply must echo)",
        )?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Device for Client {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.configure(ctx)?;
        crate::checked_socket(ctx, &self.channel, crate::Role::Requests)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let outgoing = crate::Outgoing::new(ctx, &self.channel, "msg-size")?;
        let mut n_round_trips = 0u64;
        while ctx.next_iteration() {
            let Some(made) = outgoing.message(ctx, self.msg_size).await else {
                break;
            };
            let mut request = made?;
            request.data_mut()[..8].copy_from_slice(&n_round_trips.to_le_bytes());
            match ctx.send(&self.channel, request).await {
                Ok(()) => {}
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            }
            let reply = match ctx.receive(&self.channel).await {
                Ok(reply) => reply,
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            };
            if reply.len() != self.msg_size || reply.data()[..8] != n_round_trips.to_le_bytes() {
                return Err(format!("reply {n_round_trips} does not echo its request").into());
            }
            n_round_trips += 1;
        }
        tracing::info!(device = %ctx.id(), "{n_round_trips} round trips");
        Ok(())
    }
}

/// Answers every request on `in-channel` (default `data`) with the request itself.
#[derive(Debug, Default)]
pub struct Server {
    channel: String,
}

#[async_trait::async_trait]
impl Device for Server {
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.channel = channel_property(ctx, "in-channel", "data");
        crate::checked_socket(ctx, &self.channel, crate::Role::Answers)?;
        Ok(())
    }

    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        while ctx.next_iteration() {
            let request = match ctx.receive_parts(&self.channel).await {
                Ok(request) => request,
                Err(_) if ctx.stop_requested() => break,
                Err(error) => return Err(error.into()),
            };
            match ctx.send_parts(&self.channel, request).await {
                Ok(()) => {}
                Err(_) if ctx.stop_requested() => break,
                // A requester that left before its answer costs that answer only, as with
                // FairMQ's rep (zeromq drops it): the next request is answered.
                Err(DeviceError::Channel(error @ ferromq_core::Error::PeerGone { .. })) => {
                    tracing::warn!(device = %ctx.id(), %error, "answer dropped");
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }
}
