//! The [`Device`] trait users implement, and the [`DeviceContext`] its hooks receive.
//!
//! A device overrides either [`Device::run`] (a loop it writes, ending when
//! [`DeviceContext::next_iteration`] says so) or [`Device::on_data`] (called for every message
//! on its input channels by the default `run`). Everything else has a default.
//!
//! # Cancel safety and STOP
//! STOP fires the context's cancellation token. The context's send and receive calls, and a
//! `new_message` waiting for a full transport's room, return [`Error::Interrupted`] as soon as
//! it fires, so a device blocked on a channel leaves RUNNING promptly; a message whose send was
//! interrupted is dropped, as the device is stopping: right for a message the device made,
//! which nobody had accepted yet. A message it took from an input was accepted by its sender,
//! so a device passing messages on sends them with [`DeviceContext::forward_parts`], which
//! keeps a message through STOP for the channel's `linger` and fails the device naming it if
//! it still cannot leave. A device that must still send after STOP
//! (an answer it promised) goes to the channel and the transport themselves
//! ([`DeviceContext::channel`], [`DeviceContext::transport_of`]), which STOP does not interrupt.
//!
//! # Long computations
//! A standalone device runs its hooks on a current-thread tokio runtime, the one its channels'
//! transport tasks run on too: zeromq's writers, the ofi driver's connects, grants and
//! heartbeats, the control channel. They run only while a hook waits. A hook that computes for
//! long between two waits (a send that a free credit completes at once does not wait) holds them
//! all: an ofi sender that builds one large message after another connects and starts moving
//! bytes only when it first waits, and one that computes for longer than `ofi-peer-timeout-ms`
//! is taken for dead by its peer. Put such work on a thread of its own
//! (`tokio::task::spawn_blocking`) or yield between its pieces (`tokio::task::yield_now`).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ferromq_core::{
    BoxError, Channel, ChannelCounters, CounterSnapshot, Decode, Encode, Error, Message, Parts,
    Transport, TransportRegistry, TransportTraits,
};
use futures_util::FutureExt;

use crate::error::DeviceError;
use crate::stop::StopSignal;

/// How long [`DeviceContext::forward_parts`] waits in one go on a socket that cannot set room
/// aside (`Channel::reserve` unsupported) before it looks at STOP again: how late it may notice
/// STOP there.
const UNRESERVED_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(50);

/// What an `on_data` handler wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep receiving.
    Continue,
    /// Leave RUNNING (as if `run` returned).
    Stop,
}

/// A device: hooks called in the states of FairMQ's state machine.
///
/// # Examples
/// ```
/// use ferromq_device::{Device, DeviceContext, Flow};
/// use ferromq_core::{BoxError, Parts};
///
/// struct Counter { n_msgs: u64 }
///
/// #[ferromq_device::async_trait]
/// impl Device for Counter {
///     async fn on_data(&mut self, _channel: &str, _parts: Parts, _ctx: &mut DeviceContext) -> Result<Flow, BoxError> {
///         self.n_msgs += 1;
///         Ok(Flow::Continue)
///     }
/// }
/// ```
#[async_trait]
pub trait Device: Send + 'static {
    /// INITIALIZING DEVICE, after the channels are created: read properties, check options.
    ///
    /// # Errors
    /// Any error moves the device to ERROR.
    async fn init(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let _ = ctx;
        Ok(())
    }

    /// INITIALIZING TASK: prepare the work (open files, allocate buffers).
    ///
    /// # Errors
    /// Any error moves the device to ERROR.
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let _ = ctx;
        Ok(())
    }

    /// RUNNING: the device's work. Returning leaves RUNNING for READY.
    ///
    /// The default receives from every input channel (fairly, see [`DeviceContext::poll`]) and
    /// calls [`Device::on_data`], until STOP, `--max-iterations`, or `on_data` returns
    /// [`Flow::Stop`].
    ///
    /// # Errors
    /// Any error moves the device to ERROR.
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let inputs = ctx.input_channel_names();
        if inputs.is_empty() {
            return Err("the device has no input channel for on_data; implement `run`".into());
        }
        while ctx.next_iteration() {
            let (channel, parts) = match ctx.poll(&inputs).await {
                Ok(received) => received,
                Err(DeviceError::Channel(Error::Interrupted { .. })) => break,
                Err(error) => return Err(error.into()),
            };
            if self.on_data(&channel, parts, ctx).await? == Flow::Stop {
                break;
            }
        }
        Ok(())
    }

    /// A message arrived on `channel` (called by the default [`Device::run`]).
    ///
    /// # Errors
    /// Any error moves the device to ERROR.
    async fn on_data(
        &mut self,
        channel: &str,
        parts: Parts,
        ctx: &mut DeviceContext,
    ) -> Result<Flow, BoxError> {
        let _ = (channel, parts, ctx);
        Err("the device implements neither `run` nor `on_data`".into())
    }

    /// RESETTING TASK: undo `init_task`.
    ///
    /// # Errors
    /// Any error moves the device to ERROR.
    async fn reset_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let _ = ctx;
        Ok(())
    }

    /// RESETTING DEVICE, after the channels are closed: undo `init`.
    ///
    /// # Errors
    /// Any error moves the device to ERROR.
    async fn reset(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let _ = ctx;
        Ok(())
    }
}

/// A boxed device is a device, so that devices chosen at run time (by a kind name) run the same way.
#[async_trait]
impl Device for Box<dyn Device> {
    async fn init(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.as_mut().init(ctx).await
    }
    async fn init_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.as_mut().init_task(ctx).await
    }
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.as_mut().run(ctx).await
    }
    async fn on_data(
        &mut self,
        channel: &str,
        parts: Parts,
        ctx: &mut DeviceContext,
    ) -> Result<Flow, BoxError> {
        self.as_mut().on_data(channel, parts, ctx).await
    }
    async fn reset_task(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.as_mut().reset_task(ctx).await
    }
    async fn reset(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.as_mut().reset(ctx).await
    }
}

/// The index of a sub-channel name (`out[2]` → 2; `out` → 0).
fn sub_channel_index(name: &str) -> usize {
    name.strip_suffix(']')
        .and_then(|rest| rest.rsplit_once('['))
        .and_then(|(_, idx)| idx.parse().ok())
        .unwrap_or(0)
}

/// A channel of a device, resolved once by name with [`DeviceContext::channel_id`], so that a
/// loop sending or receiving on it does no name lookup per message. Valid until the device's
/// channels are made again (RESET DEVICE, then INIT DEVICE): a handle from before is refused
/// with [`DeviceError::StaleChannel`], never taken for another channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelId {
    idx: usize,
    generation: u64,
}

/// A device's channels, properties and stop signal, as its hooks see them.
pub struct DeviceContext {
    pub(crate) id: String,
    pub(crate) session: String,
    pub(crate) channels: Vec<Channel>,
    /// Counts the times the channels were made anew (see [`ChannelId`]).
    pub(crate) channel_generation: u64,
    /// Where transports come from, by name.
    pub(crate) registry: Arc<TransportRegistry>,
    /// The transports made so far, by name: one per name per device. Only ever added to.
    pub(crate) transports: BTreeMap<String, Arc<dyn Transport>>,
    /// The transport [`DeviceContext::new_message_on`] used last, by its name: a sender's loop
    /// makes every message from one transport, without a map lookup each time (valid because
    /// `transports` is only ever added to).
    pub(crate) last_transport: Option<(&'static str, Arc<dyn Transport>)>,
    pub(crate) properties: Arc<Mutex<BTreeMap<String, String>>>,
    pub(crate) stop: StopSignal,
    pub(crate) max_iterations: u64,
    pub(crate) n_iterations: u64,
    pub(crate) poll_start: usize,
}

impl DeviceContext {
    /// The device id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Names of every socket (`data`, `out[0]`, `out[1]`).
    pub fn channel_names(&self) -> Vec<String> {
        self.channels
            .iter()
            .map(|channel| channel.name().to_owned())
            .collect()
    }

    /// The channels, `, `-separated, for an error naming one that is not there; "none" said
    /// as such (a device without channels read "its channels: " and nothing).
    fn available_channels(&self) -> String {
        if self.channels.is_empty() {
            "none (give it one with --channel-config, --mq-config or a topology's [[device.channel]])".to_owned()
        } else {
            self.channel_names().join(", ")
        }
    }

    /// Names of the sockets that receive (pull, sub, rep, req, pair), in configuration order.
    pub fn input_channel_names(&self) -> Vec<String> {
        self.channels
            .iter()
            .filter(|channel| {
                matches!(
                    channel.config().socket_type,
                    ferromq_core::SocketType::Pull
                        | ferromq_core::SocketType::Sub
                        | ferromq_core::SocketType::Rep
                        | ferromq_core::SocketType::Pair
                )
            })
            .map(|channel| channel.name().to_owned())
            .collect()
    }

    /// Names of the sockets of channel `base` (`out` → `out[0]`, `out[1]`, or just `out`).
    pub fn sub_channel_names(&self, base: &str) -> Vec<String> {
        self.channels
            .iter()
            .filter(|channel| channel.config().name == base)
            .map(|channel| channel.name().to_owned())
            .collect()
    }

    fn channel_idx(&self, name: &str) -> Result<usize, DeviceError> {
        let position = |wanted: &str| {
            self.channels
                .iter()
                .position(|channel| channel.name() == wanted)
        };
        position(name)
            // `data` reaches `data[0]` when the channel has sub-channels.
            .or_else(|| position(&format!("{name}[0]")))
            .ok_or_else(|| DeviceError::UnknownChannel {
                device: self.id.clone(),
                name: name.to_owned(),
                available: self.available_channels(),
            })
    }

    /// Resolves channel (socket) `name` once, for the `*_on` operations.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`] listing the names that exist.
    pub fn channel_id(&self, name: &str) -> Result<ChannelId, DeviceError> {
        Ok(ChannelId {
            idx: self.channel_idx(name)?,
            generation: self.channel_generation,
        })
    }

    fn resolve(&self, channel: ChannelId) -> Result<usize, DeviceError> {
        if channel.generation != self.channel_generation || channel.idx >= self.channels.len() {
            return Err(DeviceError::StaleChannel {
                device: self.id.clone(),
            });
        }
        Ok(channel.idx)
    }

    /// Drops every channel; handles made before are stale from now on.
    pub(crate) fn clear_channels(&mut self) {
        self.channels.clear();
        self.channel_generation += 1;
    }

    /// The channel (socket) `name`: `data`, `data[1]`.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`] listing the names that exist.
    pub fn channel(&mut self, name: &str) -> Result<&mut Channel, DeviceError> {
        let idx = self.channel_idx(name)?;
        Ok(&mut self.channels[idx])
    }

    /// Takes the sockets of channel `base` (`base`, or `base[0]`, `base[1]`, ... in index order)
    /// out of the device, for a layer that owns them from now on: remote invocation
    /// (`ferromq::rpc::join`) takes its group's channels so. The device no longer sends,
    /// receives, counts or closes them; their new owner closes them. Handles from
    /// [`DeviceContext::channel_id`] resolved before are stale afterwards (take first, then
    /// resolve).
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`] when the device has no such channel.
    pub fn take_channel_sockets(&mut self, base: &str) -> Result<Vec<Channel>, DeviceError> {
        let (taken, kept): (Vec<Channel>, Vec<Channel>) = std::mem::take(&mut self.channels)
            .into_iter()
            .partition(|channel| channel.config().name == base);
        self.channels = kept;
        if taken.is_empty() {
            return Err(DeviceError::UnknownChannel {
                device: self.id.clone(),
                name: base.to_owned(),
                available: self.available_channels(),
            });
        }
        self.channel_generation += 1;
        let mut taken = taken;
        // Configuration order is index order already; sorted by the index for certainty.
        taken.sort_by_key(|channel| sub_channel_index(channel.name()));
        Ok(taken)
    }

    /// The transport of channel `name`, made once per device (what [`DeviceContext::new_message`]
    /// allocates from): for a layer that makes messages in the channel's memory itself.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`].
    pub fn transport_of(&self, name: &str) -> Result<Arc<dyn Transport>, DeviceError> {
        let idx = self.channel_idx(name)?;
        let transport_name = self.channels[idx].transport_name();
        self.transports
            .get(transport_name)
            .cloned()
            .ok_or_else(|| DeviceError::UnknownChannel {
                device: self.id.clone(),
                name: format!("{name} (its transport {transport_name} is not made)"),
                available: self.available_channels(),
            })
    }

    /// What the transport of channel `name` can do: whether it has memory of its own
    /// ([`TransportTraits::lends_shared_memory`]: allocate messages from the channel to send
    /// without a copy), and so on.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`].
    pub fn transport_traits(&self, name: &str) -> Result<TransportTraits, DeviceError> {
        let channel = &self.channels[self.channel_idx(name)?];
        let transport = channel
            .config()
            .transport
            .as_deref()
            .unwrap_or(channel.transport_name());
        Ok(self
            .registry
            .traits(transport)
            .unwrap_or(TransportTraits::PLAIN))
    }

    /// The counters of channel `name`.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`].
    pub fn counters(&self, name: &str) -> Result<CounterSnapshot, DeviceError> {
        let idx = self.channel_idx(name)?;
        Ok(self.channels[idx].counters().snapshot())
    }

    pub(crate) fn shared_counters(&self) -> Vec<(String, u64, Arc<ChannelCounters>)> {
        self.channels
            .iter()
            .map(|channel| {
                (
                    channel.name().to_owned(),
                    channel.config().rate_logging,
                    channel.counters(),
                )
            })
            .collect()
    }

    /// A message of `size` bytes from the transport of channel `name` (shared memory for a
    /// shmem channel, so that sending it copies nothing). A transport without room waits for
    /// it (up to its allocation timeout, if it has one) unless STOP comes first.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`], [`Error::Interrupted`] when STOP came before the
    /// transport had room (at once if it came earlier), or the transport's allocation error.
    pub async fn new_message(&mut self, name: &str, size: usize) -> Result<Message, DeviceError> {
        let idx = self.channel_idx(name)?;
        self.new_message_at(idx, size).await
    }

    /// [`DeviceContext::new_message`] for a channel resolved with [`DeviceContext::channel_id`].
    ///
    /// # Errors
    /// [`DeviceError::StaleChannel`], or as [`DeviceContext::new_message`].
    pub async fn new_message_on(
        &mut self,
        channel: ChannelId,
        size: usize,
    ) -> Result<Message, DeviceError> {
        let idx = self.resolve(channel)?;
        self.new_message_at(idx, size).await
    }

    async fn new_message_at(&mut self, idx: usize, size: usize) -> Result<Message, DeviceError> {
        let transport_name = self.channels[idx].transport_name();
        let cached = self
            .last_transport
            .as_ref()
            // The same static name as a rule: its address settles it without reading it.
            .is_some_and(|(name, _)| {
                std::ptr::eq(*name, transport_name) || *name == transport_name
            });
        if !cached {
            self.last_transport = self
                .transports
                .get(transport_name)
                .map(|transport| (transport_name, Arc::clone(transport)));
        }
        match &self.last_transport {
            Some((_, transport)) => match transport.try_new_message(size) {
                Some(message) => Ok(message),
                // A full transport (a shmem segment whose blocks a stalled receiver holds)
                // waits for room; STOP ends the wait as it ends a send's, or a device would sit
                // out its stop for the transport's allocation timeout (or for ever).
                None => {
                    let outcome = self.stop.interrupt(transport.new_message(size)).await;
                    self.settle(idx, outcome)
                }
            },
            None => Message::try_new(size).map_err(|error| {
                DeviceError::from(ferromq_core::Error::Allocation {
                    transport: transport_name,
                    source: format!("{size} bytes: {error}").into(),
                })
            }),
        }
    }

    /// The outcome of an operation on channel `idx`: its label is read only if STOP interrupted
    /// it, so the hot path clones nothing.
    fn settle<T>(&self, idx: usize, outcome: Option<Result<T, Error>>) -> Result<T, DeviceError> {
        match outcome {
            Some(result) => Ok(result?),
            None => Err(DeviceError::Channel(Error::Interrupted {
                channel: self.channels[idx].label().clone(),
            })),
        }
    }

    /// Sends on channel `name`; returns [`Error::Interrupted`] if STOP comes first, and the
    /// message is dropped then (a message taken from an input goes by
    /// [`DeviceContext::forward_parts`] instead).
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`], or the channel's error.
    pub async fn send(&mut self, name: &str, message: Message) -> Result<(), DeviceError> {
        let idx = self.channel_idx(name)?;
        self.send_parts_at(idx, Parts::from(message)).await
    }

    /// Sends a multipart message on channel `name`.
    ///
    /// # Errors
    /// As [`DeviceContext::send`].
    pub async fn send_parts(&mut self, name: &str, parts: Parts) -> Result<(), DeviceError> {
        let idx = self.channel_idx(name)?;
        self.send_parts_at(idx, parts).await
    }

    /// [`DeviceContext::send_parts`] on a channel resolved with [`DeviceContext::channel_id`].
    ///
    /// # Errors
    /// [`DeviceError::StaleChannel`], or as [`DeviceContext::send`].
    pub async fn send_parts_on(
        &mut self,
        channel: ChannelId,
        parts: Parts,
    ) -> Result<(), DeviceError> {
        let idx = self.resolve(channel)?;
        self.send_parts_at(idx, parts).await
    }

    /// What a send or a receive on channel `idx` does before it tries the socket at once: STOP
    /// requested before the call wins (the channel's `Interrupted`), and a unit of the
    /// cooperative budget is spent as a waiting call spends it, so a device whose every call
    /// completes at once still yields to the runtime's other tasks. (`&mut`: the context is
    /// not `Sync`, and a shared borrow held across the yield would make the future not `Send`.)
    async fn take_turn(&mut self, idx: usize) -> Result<(), DeviceError> {
        if self.stop.is_requested() {
            return self.settle(idx, None);
        }
        tokio::task::consume_budget().await;
        Ok(())
    }

    async fn send_parts_at(&mut self, idx: usize, parts: Parts) -> Result<(), DeviceError> {
        // The usual case first: the socket takes the parts at once. No future is built around
        // the send (moving it into `interrupt` was 4 % of a 64 B shmem sampler).
        self.take_turn(idx).await?;
        let parts = match self.channels[idx].try_send_parts(parts) {
            Ok(()) => return Ok(()),
            Err(parts) => parts,
        };
        let send = async {
            self.channels[idx]
                .send_parts(parts)
                .await
                .map_err(|failed| failed.error)
        };
        let outcome = self.stop.interrupt(send).await;
        self.settle(idx, outcome)
    }

    /// Sends a message this device took from one of its inputs, which STOP must not drop.
    ///
    /// [`DeviceContext::send_parts`] gives up at STOP, and the parts in its wait go with it:
    /// right for a message the device made (nobody had accepted it yet), wrong for one it
    /// received, which its sender already counts as accepted. `forward_parts` keeps it. It
    /// waits for room as a send does; once STOP is requested (before the call or during its
    /// wait) it waits at most the channel's `linger` more, as a closing channel drains. A
    /// message that still cannot leave is lost, and the call says so with
    /// [`Error::Undelivered`] (one message), which moves the device to ERROR and makes its
    /// process exit non-zero naming the loss. The built-in forwarders (processor, splitter,
    /// merger, proxy, multiplier) send with it; a device of one's own that passes messages on
    /// should too, and end its loop once [`DeviceContext::stop_requested`] says so.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`], [`Error::Undelivered`] as above, or the channel's
    /// error.
    ///
    /// # Cancel safety
    /// Dropping the future drops the parts, as with [`DeviceContext::send_parts`]; the call
    /// itself never drops a future that holds them.
    pub async fn forward_parts(&mut self, name: &str, parts: Parts) -> Result<(), DeviceError> {
        let idx = self.channel_idx(name)?;
        self.forward_parts_at(idx, parts).await
    }

    /// [`DeviceContext::forward_parts`] on a channel resolved with
    /// [`DeviceContext::channel_id`].
    ///
    /// # Errors
    /// [`DeviceError::StaleChannel`], or as [`DeviceContext::forward_parts`].
    pub async fn forward_parts_on(
        &mut self,
        channel: ChannelId,
        parts: Parts,
    ) -> Result<(), DeviceError> {
        let idx = self.resolve(channel)?;
        self.forward_parts_at(idx, parts).await
    }

    async fn forward_parts_at(&mut self, idx: usize, parts: Parts) -> Result<(), DeviceError> {
        // As `send_parts_at`, the usual case first; but STOP requested before the call does
        // not refuse the parts: they are in hand, and only a wait is bounded by STOP.
        tokio::task::consume_budget().await;
        let parts = match self.channels[idx].try_send_parts(parts) {
            Ok(()) => return Ok(()),
            Err(parts) => parts,
        };
        let linger = self.channels[idx].config().linger_duration();
        // No future that holds the parts is ever dropped: a socket that can set room aside
        // waits for that (cancel-safe, the parts stay here); one that cannot waits in timed
        // slices, whose timeouts hand the parts back, looking at STOP between them. Once STOP
        // is requested, one timed send of `linger` has the last word.
        let parts = if self.stop.is_requested() {
            parts
        } else {
            let stopped = self.stop.requested_owned();
            tokio::pin!(stopped);
            let stop = &self.stop;
            let channel = &mut self.channels[idx];
            tokio::select! {
                reserved = channel.reserve() => match reserved {
                    Ok(permit) => return permit.send_parts(parts).map_err(|failed| failed.error.into()),
                    Err(Error::Unsupported { .. }) => {
                        let mut parts = parts;
                        loop {
                            match channel.send_parts_timeout(parts, UNRESERVED_WAIT_SLICE).await {
                                Ok(()) => return Ok(()),
                                Err(failed) if matches!(failed.error, Error::Timeout { .. }) => {
                                    parts = failed.message;
                                }
                                Err(failed) => return Err(failed.error.into()),
                            }
                            if stop.is_requested() {
                                break parts;
                            }
                        }
                    }
                    Err(error) => return Err(error.into()),
                },
                () = &mut stopped => parts,
            }
        };
        let channel = &mut self.channels[idx];
        match channel.send_parts_timeout(parts, linger).await {
            Ok(()) => Ok(()),
            Err(failed) if matches!(failed.error, Error::Timeout { .. }) => {
                Err(DeviceError::Channel(Error::Undelivered {
                    channel: channel.label().clone(),
                    n_messages: 1,
                    reason: format!(
                        "a message taken from an input was not forwarded: stopped, and no room came for linger {linger:?}"
                    ),
                }))
            }
            Err(failed) => Err(failed.error.into()),
        }
    }

    /// Receives one frame from channel `name`.
    ///
    /// # Errors
    /// As [`DeviceContext::send`].
    pub async fn receive(&mut self, name: &str) -> Result<Message, DeviceError> {
        let idx = self.channel_idx(name)?;
        let outcome = self.stop.interrupt(self.channels[idx].receive()).await;
        self.settle(idx, outcome)
    }

    /// Receives a whole multipart message from channel `name`.
    ///
    /// # Errors
    /// As [`DeviceContext::send`].
    pub async fn receive_parts(&mut self, name: &str) -> Result<Parts, DeviceError> {
        let idx = self.channel_idx(name)?;
        self.receive_parts_at(idx).await
    }

    /// [`DeviceContext::receive_parts`] on a channel resolved with
    /// [`DeviceContext::channel_id`].
    ///
    /// # Errors
    /// [`DeviceError::StaleChannel`], or as [`DeviceContext::send`].
    pub async fn receive_parts_on(&mut self, channel: ChannelId) -> Result<Parts, DeviceError> {
        let idx = self.resolve(channel)?;
        self.receive_parts_at(idx).await
    }

    async fn receive_parts_at(&mut self, idx: usize) -> Result<Parts, DeviceError> {
        // As `send_parts_at`: a message that is there is taken without a future around the
        // receive (moving it into `interrupt` was 5 % of a 64 B shmem sink).
        self.take_turn(idx).await?;
        if let Some(parts) = self.channels[idx].try_receive_parts() {
            return Ok(parts);
        }
        let outcome = self
            .stop
            .interrupt(self.channels[idx].receive_parts())
            .await;
        self.settle(idx, outcome)
    }

    /// Encodes `value` with its type's codec and sends it on channel `name`.
    ///
    /// # Errors
    /// As [`DeviceContext::send`], and [`Error::Codec`].
    pub async fn send_value<T: Encode>(&mut self, name: &str, value: T) -> Result<(), DeviceError> {
        let idx = self.channel_idx(name)?;
        let message = value.encode().map_err(|source| Error::Codec {
            channel: self.channels[idx].label().clone(),
            source,
        })?;
        self.send(name, message).await
    }

    /// Receives one message from channel `name` and decodes it with `T`'s codec.
    ///
    /// # Errors
    /// As [`DeviceContext::receive`], and [`Error::Codec`].
    pub async fn receive_value<T: Decode>(&mut self, name: &str) -> Result<T, DeviceError> {
        let idx = self.channel_idx(name)?;
        let message = self.receive(name).await?;
        Ok(T::decode(message).map_err(|source| Error::Codec {
            channel: self.channels[idx].label().clone(),
            source,
        })?)
    }

    /// Waits for a message on any of `names`; returns the channel it came from and the message.
    ///
    /// Fair: each call starts looking one channel further than the last, so a busy channel
    /// cannot starve the others.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`], [`Error::Interrupted`] on STOP, or a channel's error.
    ///
    /// # Cancel safety
    /// Cancel-safe: receives are cancel-safe, so no message is lost when another channel wins.
    pub async fn poll(&mut self, names: &[String]) -> Result<(String, Parts), DeviceError> {
        let mut wanted = Vec::with_capacity(names.len());
        for name in names {
            wanted.push(self.channel_idx(name)?);
        }
        if wanted.is_empty() {
            return Err(DeviceError::UnknownChannel {
                device: self.id.clone(),
                name: String::new(),
                available: self.available_channels(),
            });
        }
        if let [idx] = wanted[..] {
            // One input: no rotation, no boxed futures (the path of every sink and processor).
            let outcome = self
                .stop
                .interrupt(self.channels[idx].receive_parts())
                .await;
            let parts = self.settle(idx, outcome)?;
            return Ok((self.channels[idx].name().to_owned(), parts));
        }
        self.poll_start = (self.poll_start + 1) % wanted.len();
        wanted.rotate_left(self.poll_start);
        let stop = self.stop.requested_owned();
        let mut receives = Vec::with_capacity(wanted.len());
        // Disjoint mutable borrows of the wanted channels, in the rotated order.
        let mut slots: Vec<Option<&mut Channel>> = self.channels.iter_mut().map(Some).collect();
        for idx in wanted {
            let channel = slots[idx].take().expect("channel indices are distinct");
            receives.push(
                async move {
                    let name = channel.name().to_owned();
                    channel.receive_parts().await.map(|parts| (name, parts))
                }
                .boxed(),
            );
        }
        tokio::select! {
            biased;
            () = stop => Err(DeviceError::Channel(Error::Interrupted {
                channel: ferromq_core::ChannelLabel::new("poll", ferromq_core::SocketType::Pull),
            })),
            (result, _, _) = futures_util::future::select_all(receives) => Ok(result?),
        }
    }

    /// True until STOP or `--max-iterations`; counts one iteration per call.
    pub fn next_iteration(&mut self) -> bool {
        if self.stop.is_requested() {
            return false;
        }
        if self.max_iterations > 0 && self.n_iterations >= self.max_iterations {
            return false;
        }
        self.n_iterations += 1;
        true
    }

    /// Iterations counted so far by [`DeviceContext::next_iteration`].
    pub fn iterations(&self) -> u64 {
        self.n_iterations
    }

    /// The `--max-iterations` limit (0 = none).
    pub fn max_iterations(&self) -> u64 {
        self.max_iterations
    }

    /// True once STOP was requested.
    pub fn stop_requested(&self) -> bool {
        self.stop.is_requested()
    }

    /// Completes when STOP is requested (for `select!` in a device's own loops). The future
    /// does not borrow the context, so channel calls can run beside it.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        self.stop.requested_owned()
    }

    /// A property as text.
    pub fn property_text(&self, key: &str) -> Option<String> {
        self.properties
            .lock()
            .expect("properties poisoned")
            .get(key)
            .cloned()
    }

    /// A property parsed as `T`, or `default` when absent.
    ///
    /// # Errors
    /// [`DeviceError::Property`] when present but not a `T`.
    pub fn property_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, DeviceError>
    where
        T::Err: std::fmt::Display,
    {
        parse_property(&self.id, key, self.property_text(key), default)
    }

    /// Sets a property (visible to controllers).
    pub fn set_property(&self, key: impl Into<String>, value: impl ToString) {
        self.properties
            .lock()
            .expect("properties poisoned")
            .insert(key.into(), value.to_string());
    }
}

/// Property `key` of device `device` parsed as `T` from `text`, or `default` when it is absent:
/// what [`DeviceContext::property_or`] does, for code that checks properties without a
/// context (`ferromq validate` checking a topology's built-in devices).
///
/// # Errors
/// [`DeviceError::Property`] naming the device, the key and the text when it is not a `T`.
pub fn parse_property<T: FromStr>(
    device: &str,
    key: &str,
    text: Option<String>,
    default: T,
) -> Result<T, DeviceError>
where
    T::Err: std::fmt::Display,
{
    match text {
        None => Ok(default),
        Some(text) => text.parse().map_err(|error: T::Err| DeviceError::Property {
            device: device.to_owned(),
            key: key.to_owned(),
            problem: format!("has invalid value {text:?}: {error}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> DeviceContext {
        DeviceContext {
            id: "dev".to_owned(),
            session: "default".to_owned(),
            channels: Vec::new(),
            channel_generation: 0,
            registry: Arc::default(),
            transports: BTreeMap::new(),
            last_transport: None,
            properties: Arc::default(),
            stop: StopSignal::new(),
            max_iterations: 0,
            n_iterations: 0,
            poll_start: 0,
        }
    }

    #[test]
    fn a_channel_handle_from_before_the_channels_were_made_again_is_refused() {
        let mut ctx = context();
        let unknown = ctx.channel_id("data").expect_err("no channel yet");
        assert!(matches!(unknown, DeviceError::UnknownChannel { .. }));
        // A handle resolved while index 0 existed, then RESET DEVICE made the channels again.
        let old = ChannelId {
            idx: 0,
            generation: ctx.channel_generation,
        };
        ctx.clear_channels();
        let stale = ctx.resolve(old).expect_err("stale handle");
        assert!(matches!(stale, DeviceError::StaleChannel { ref device } if device == "dev"));
        assert!(stale.to_string().contains("resolve it again"), "{stale}");
    }
}
