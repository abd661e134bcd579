//! [`DeviceRunner`] drives one device through the state machine; [`DeviceController`] is the
//! handle through which anything else (a static sequence, a terminal, the external control
//! endpoint, a signal handler) requests transitions and observes states.
//!
//! # Shutdown
//! Working states (binding, connecting, running, ...) run concurrently with the request queue, so
//! a STOP or an abort is seen at once in every state: a device blocked in CONNECTING on a peer
//! that never comes can still be taken down ([`DeviceController::abort`] moves it to ERROR).
//! From ERROR the device leaves through END, past RESETTING DEVICE: at END, before it announces
//! EXITING, the runner closes the channels still open, together, each within its `linger`, so
//! that a failure delivers or counts what they accepted instead of dropping it (the last error
//! then names those losses after the failure); the same when every controller is dropped
//! before END. A channel RESETTING DEVICE closed is out of the device's list at once, so an
//! abort during that state leaves only the others to close at END, and the one it was closing,
//! which is closed again (a loss it had found is logged).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferromq_core::{
    Address, Channel, CounterSnapshot, Error, TcpHost, TransportOptions, TransportRegistry,
    error_chain,
};
use futures_util::FutureExt;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{DeviceConfig, SocketConfig};
use crate::device::{Device, DeviceContext};
use crate::error::{DeviceError, Result};
use crate::rates;
use crate::state::{State, Transition, next_state};
use crate::stop::StopSignal;
use crate::tap::TAP_FLUSH;

enum Request {
    Change(Transition, oneshot::Sender<Result<State>>),
    /// Why, and the state it is meant for (`None`: whatever the device is in).
    Abort(String, Option<State>),
}

/// One state change, as seen by [`DeviceController::subscribe_changes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateChange {
    /// The state left.
    pub from: State,
    /// The state entered.
    pub to: State,
}

/// One channel as controllers reach it without asking the device's task.
struct SharedChannel {
    /// The socket name (`data`, `data[1]`).
    name: String,
    counters: Arc<ferromq_core::ChannelCounters>,
    /// Where a recorder taps it (see [`DeviceController::tap`]).
    tap: Arc<ferromq_core::TapSlot>,
    /// Its configuration, `key=value,...` (FairMQ's `--channel-config` form).
    config: String,
}

/// What controllers can read about the device without asking its task.
#[derive(Default)]
struct Shared {
    bound_addresses: Vec<(String, String)>,
    /// What a controller reads or opens of each channel, by socket name.
    channels: Vec<SharedChannel>,
    /// The device's transports, by name, for their memory figures.
    transports: Vec<(String, Arc<dyn ferromq_core::Transport>)>,
    last_error: Option<String>,
    /// The tasks forwarding taps' copies to recorders (`tap.rs`), waited for at EXITING.
    tap_forwarders: Vec<tokio::task::JoinHandle<()>>,
    /// Set when the device closed its taps for good (at EXITING): no tap opens after.
    taps_closed: bool,
}

impl Shared {
    /// Opens a tap on channel `name` unless there is none or the taps were closed for good.
    fn open_tap(
        &self,
        name: &str,
        capacity: usize,
    ) -> std::result::Result<ferromq_core::TapReceiver, TapRefused> {
        if self.taps_closed {
            return Err(TapRefused::Ending);
        }
        let channel = self
            .channels
            .iter()
            .find(|channel| channel.name == name)
            .ok_or_else(|| TapRefused::NoChannel(name.to_owned()))?;
        Ok(channel.tap.open(capacity))
    }
}

/// Why a tap was not opened ([`DeviceController::tap_forwarded`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TapRefused {
    /// No such channel (yet).
    #[error("no channel {0:?}")]
    NoChannel(String),
    /// The device is ending: its taps are closed.
    #[error("the device is ending: its taps are closed")]
    Ending,
}

/// A handle to a running device: request transitions, wait for states, read properties.
#[derive(Clone)]
pub struct DeviceController {
    id: String,
    requests: mpsc::Sender<Request>,
    state: watch::Receiver<State>,
    changes: broadcast::Sender<StateChange>,
    properties: Arc<Mutex<BTreeMap<String, String>>>,
    shared: Arc<Mutex<Shared>>,
}

impl DeviceController {
    /// The device id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The current state.
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// A receiver of the current state; it may skip states that pass quickly (use
    /// [`DeviceController::subscribe_changes`] to see every one).
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.clone()
    }

    /// A receiver of every state change from now on, in order.
    pub fn subscribe_changes(&self) -> broadcast::Receiver<StateChange> {
        self.changes.subscribe()
    }

    /// Requests `transition`; returns the state it leads to once accepted (the work of that
    /// state may still be going on: wait for the state that follows it).
    ///
    /// # Errors
    /// [`DeviceError::InvalidTransition`] naming the state and the transition;
    /// [`DeviceError::DeviceGone`] when the device task has ended.
    pub async fn change_state(&self, transition: Transition) -> Result<State> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request::Change(transition, reply))
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())?
    }

    /// Takes the device out of whatever it is doing: a STOP when RUNNING, otherwise the current
    /// working state is cancelled and the device goes to ERROR with `reason`.
    pub fn abort(&self, reason: impl Into<String>) {
        let _ = self.requests.try_send(Request::Abort(reason.into(), None));
    }

    /// [`DeviceController::abort`] of `state` only: a device that has left it by the time the
    /// request is handled (a RUNNING that ended by itself as the signal came) is not failed;
    /// whoever asked then takes it down cleanly ([`crate::control::shut_down`]).
    pub fn abort_in(&self, state: State, reason: impl Into<String>) {
        let _ = self
            .requests
            .try_send(Request::Abort(reason.into(), Some(state)));
    }

    /// Waits until the device is in `wanted`, at most `timeout` (forever if `None`).
    ///
    /// # Errors
    /// [`DeviceError::WaitTimeout`]; [`DeviceError::StateUnreachable`] when the device enters
    /// ERROR or EXITING first (unless that is what was asked for).
    pub async fn wait_for_state(&self, wanted: State, timeout: Option<Duration>) -> Result<()> {
        // Subscribe before reading the current state, so that no change falls in between.
        let mut changes = self.changes.subscribe();
        let mut state = self.state.clone();
        let unreachable = |current| DeviceError::StateUnreachable {
            device: self.id.clone(),
            wanted,
            current,
        };
        let wait = async {
            let current = *state.borrow_and_update();
            if current == wanted {
                return Ok(());
            }
            if matches!(current, State::Error | State::Exiting) {
                return Err(unreachable(current));
            }
            loop {
                match changes.recv().await {
                    Ok(change) if change.to == wanted => return Ok(()),
                    Ok(change) if matches!(change.to, State::Error | State::Exiting) => {
                        return Err(unreachable(change.to));
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let current = *state.borrow_and_update();
                        if current == wanted {
                            return Ok(());
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        let current = *state.borrow();
                        return if current == wanted {
                            Ok(())
                        } else {
                            Err(unreachable(current))
                        };
                    }
                }
            }
        };
        match timeout {
            None => wait.await,
            Some(timeout) => tokio::time::timeout(timeout, wait)
                .await
                .unwrap_or_else(|_| {
                    Err(DeviceError::WaitTimeout {
                        device: self.id.clone(),
                        wanted,
                        current: self.state(),
                        timeout_ms: timeout.as_millis() as u64,
                    })
                }),
        }
    }

    /// A property as text.
    pub fn property(&self, key: &str) -> Option<String> {
        self.properties
            .lock()
            .expect("properties poisoned")
            .get(key)
            .cloned()
    }

    /// Every property.
    pub fn properties(&self) -> BTreeMap<String, String> {
        self.properties.lock().expect("properties poisoned").clone()
    }

    /// Sets a property; the device reads it in its next hook.
    pub fn set_property(&self, key: impl Into<String>, value: impl Into<String>) {
        self.properties
            .lock()
            .expect("properties poisoned")
            .insert(key.into(), value.into());
    }

    /// The addresses the device's channels bound, as `(socket name, address)`.
    pub fn bound_addresses(&self) -> Vec<(String, String)> {
        self.shared
            .lock()
            .expect("shared state poisoned")
            .bound_addresses
            .clone()
    }

    /// Every channel's counters, as `(socket name, snapshot)`.
    pub fn counters(&self) -> Vec<(String, CounterSnapshot)> {
        let shared = self.shared.lock().expect("shared state poisoned");
        shared
            .channels
            .iter()
            .map(|channel| (channel.name.clone(), channel.counters.snapshot()))
            .collect()
    }

    /// Opens a tap on channel (socket) `name`: a copy of every message it sends or receives
    /// from now on, up to `capacity` waiting copies (more are counted missed, never waited
    /// for). `None` when the device has no such channel (yet: channels exist from INITIALIZING
    /// DEVICE on) or is ending (its taps closed at EXITING). Another tap on the same channel
    /// replaces this one.
    pub fn tap(&self, name: &str, capacity: usize) -> Option<ferromq_core::TapReceiver> {
        let shared = self.shared.lock().expect("shared state poisoned");
        shared.open_tap(name, capacity).ok()
    }

    /// Opens a tap on channel `name` (as [`DeviceController::tap`]) and starts its forwarder
    /// with `forward`, keeping the task so that the device's end waits (a while) for it to hand
    /// over the last copies and the tap's end (see [`crate::tap::TAP_FLUSH`]). Both happen
    /// under the lock the end takes to close the taps: a tap opens before them (and is
    /// waited for) or is refused.
    pub(crate) fn tap_forwarded(
        &self,
        name: &str,
        capacity: usize,
        forward: impl FnOnce(ferromq_core::TapReceiver) -> tokio::task::JoinHandle<()>,
    ) -> std::result::Result<(), TapRefused> {
        let mut shared = self.shared.lock().expect("shared state poisoned");
        let tap = shared.open_tap(name, capacity)?;
        shared.tap_forwarders.retain(|kept| !kept.is_finished());
        shared.tap_forwarders.push(forward(tap));
        Ok(())
    }

    /// Closes the tap on channel `name`, if one is open.
    pub fn untap(&self, name: &str) {
        let shared = self.shared.lock().expect("shared state poisoned");
        if let Some(channel) = shared.channels.iter().find(|channel| channel.name == name) {
            channel.tap.close();
        }
    }

    /// The channels (sockets) that can be tapped now, with their configuration as
    /// `key=value,...` (FairMQ's `--channel-config` form).
    pub fn channel_configs(&self) -> Vec<(String, String)> {
        let shared = self.shared.lock().expect("shared state poisoned");
        shared
            .channels
            .iter()
            .map(|channel| (channel.name.clone(), channel.config.clone()))
            .collect()
    }

    /// How the memory of each of the device's transports that has some is used now (shmem:
    /// this process's segment), by transport name.
    pub fn memory(&self) -> Vec<(String, ferromq_core::MemoryFigures)> {
        let shared = self.shared.lock().expect("shared state poisoned");
        shared
            .transports
            .iter()
            .filter_map(|(name, transport)| Some((name.clone(), transport.memory_figures()?)))
            .collect()
    }

    /// The error that moved the device to ERROR, if any; from EXITING on, with what closing
    /// the channels it left open lost ([`DeviceError::FailedThenLost`]).
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .lock()
            .expect("shared state poisoned")
            .last_error
            .clone()
    }

    fn gone(&self) -> DeviceError {
        DeviceError::DeviceGone {
            device: self.id.clone(),
        }
    }
}

/// Runs a device: owns it, its context and its configuration, and executes the state machine.
pub struct DeviceRunner<D: Device> {
    device: D,
    config: DeviceConfig,
    ctx: DeviceContext,
    requests: mpsc::Receiver<Request>,
    state_sender: watch::Sender<State>,
    changes: broadcast::Sender<StateChange>,
    shared: Arc<Mutex<Shared>>,
    rate_logger: Option<CancellationToken>,
    failure: Option<DeviceError>,
}

impl<D: Device> DeviceRunner<D> {
    /// A runner in IDLE and its controller. Channels get their transports from `transports`,
    /// by the names the configuration gives (`transport = "shmem"`): the binary decides which
    /// transports exist (see [`TransportRegistry`]).
    pub fn new(
        device: D,
        config: DeviceConfig,
        transports: Arc<TransportRegistry>,
    ) -> (DeviceRunner<D>, DeviceController) {
        let (request_sender, requests) = mpsc::channel(16);
        let (state_sender, state) = watch::channel(State::Idle);
        let (changes, _) = broadcast::channel(64);
        let properties = Arc::new(Mutex::new(config.properties.clone()));
        let shared = Arc::new(Mutex::new(Shared::default()));
        let ctx = DeviceContext {
            id: config.id.clone(),
            session: config.session.clone(),
            channels: Vec::new(),
            channel_generation: 0,
            registry: transports,
            transports: BTreeMap::new(),
            last_transport: None,
            properties: Arc::clone(&properties),
            stop: StopSignal::new(),
            max_iterations: config.max_iterations,
            n_iterations: 0,
            poll_start: 0,
        };
        let controller = DeviceController {
            id: config.id.clone(),
            requests: request_sender,
            state,
            changes: changes.clone(),
            properties,
            shared: Arc::clone(&shared),
        };
        let runner = DeviceRunner {
            device,
            config,
            ctx,
            requests,
            state_sender,
            changes,
            shared,
            rate_logger: None,
            failure: None,
        };
        (runner, controller)
    }

    /// Executes requested transitions until EXITING.
    ///
    /// # Errors
    /// The error that moved the device to ERROR (it still ends through END → EXITING, or
    /// when every controller was dropped before END), or [`DeviceError::DeviceGone`] when
    /// every controller was dropped before END and nothing had failed.
    pub async fn run(mut self) -> Result<()> {
        loop {
            let state = *self.state_sender.borrow();
            if state == State::Exiting {
                break;
            }
            let Some(request) = self.requests.recv().await else {
                self.stop_rate_logger();
                let losses = self.close_channels_left().await;
                self.close_taps().await;
                // A device that failed ends with its failure (the controllers' end says
                // nothing of why it is in ERROR); else with its controllers' end.
                let failure = self
                    .failure
                    .take()
                    .unwrap_or_else(|| DeviceError::DeviceGone {
                        device: self.config.id.clone(),
                    });
                return Err(self.with_losses(failure, losses));
            };
            match request {
                Request::Abort(_, Some(meant_for)) if meant_for != state => {}
                Request::Abort(reason, _) => {
                    if !matches!(state, State::Error | State::Idle) {
                        self.fail(DeviceError::Interrupted {
                            device: self.config.id.clone(),
                            state,
                            reason,
                        });
                    }
                }
                Request::Change(transition, reply) => {
                    let Some(next) = next_state(state, transition) else {
                        let _ =
                            reply.send(Err(DeviceError::InvalidTransition { state, transition }));
                        continue;
                    };
                    if transition == Transition::CompleteInit {
                        // INITIALIZED is announced only once the channels exist and `init` ran.
                        let _ = reply.send(Ok(next));
                        self.work(State::InitializingDevice, State::Initialized)
                            .await;
                        continue;
                    }
                    if transition == Transition::End {
                        // Before EXITING is announced: a device that is EXITING has closed
                        // its channels and its last error is final.
                        self.stop_rate_logger();
                        let mut losses = self.close_channels_left().await;
                        match self.failure.take() {
                            Some(failure) => self.failure = Some(self.with_losses(failure, losses)),
                            // Channels are left open only by a failure; were a loss to come
                            // without one, it fails the device (the first; each is logged).
                            None if !losses.is_empty() => {
                                self.record_failure(DeviceError::Channel(losses.swap_remove(0)));
                            }
                            None => {}
                        }
                    }
                    // Published before the reply, so the requester never reads the old state.
                    self.set_state(next);
                    let _ = reply.send(Ok(next));
                    if transition == Transition::ErrorFound {
                        self.record_failure(DeviceError::Interrupted {
                            device: self.config.id.clone(),
                            state,
                            reason: "ERROR FOUND requested".to_owned(),
                        });
                    } else if let Some(after) = next.auto_next() {
                        self.work(next, after).await;
                    }
                }
            }
        }
        self.stop_rate_logger();
        self.close_taps().await;
        match self.failure.take() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Closes the channels a failure left open (at END, before EXITING is announced). ERROR
    /// goes to EXITING past RESETTING DEVICE, which closes them on the way down without one;
    /// dropped instead, they took with them what `send` had accepted and not yet delivered (a
    /// stalled receiver's messages over zeromq), without a word. Closed here, together, each
    /// gets its `linger` to deliver it or hand it over as on the way down, and what is lost all
    /// the same (or, at a receiver, reached it and was not taken) is returned, each loss with
    /// its count and channel, for [`Self::with_losses`] to put after the failure.
    async fn close_channels_left(&mut self) -> Vec<Error> {
        if self.ctx.channels.is_empty() {
            return Vec::new();
        }
        tracing::info!(device = %self.config.id, n_channels = self.ctx.channels.len(), "closing the channels the device left open, each within its linger");
        // Together: the exit waits for the longest linger, not for their sum.
        let closed = futures_util::future::join_all(
            self.ctx.channels.iter_mut().map(|channel| channel.close()),
        )
        .await;
        let losses: Vec<Error> = closed.into_iter().filter_map(Result::err).collect();
        for loss in &losses {
            tracing::error!(device = %self.config.id, error = %loss, "closing a channel the device left open lost messages");
        }
        self.ctx.clear_channels();
        self.shared
            .lock()
            .expect("shared state poisoned")
            .bound_addresses
            .clear();
        losses
    }

    /// `failure`, with what closing the channels after it lost (see
    /// [`Self::close_channels_left`]), also as the device's last error.
    fn with_losses(&self, failure: DeviceError, losses: Vec<Error>) -> DeviceError {
        if losses.is_empty() {
            return failure;
        }
        let failure = DeviceError::FailedThenLost {
            failure: Box::new(failure),
            losses,
        };
        self.shared
            .lock()
            .expect("shared state poisoned")
            .last_error = Some(error_chain(&failure));
        failure
    }

    /// Closes every open tap and gives their forwarders up to [`TAP_FLUSH`] to hand the copies
    /// still queued, and the tap's end with its count of missed copies, to their recorders:
    /// without this the process would end with them, and a recording would lose its last
    /// copies without knowing.
    async fn close_taps(&mut self) {
        let forwarders = {
            let mut shared = self.shared.lock().expect("shared state poisoned");
            shared.taps_closed = true;
            for channel in &shared.channels {
                channel.tap.close();
            }
            std::mem::take(&mut shared.tap_forwarders)
        };
        if forwarders.is_empty() {
            return;
        }
        let all = futures_util::future::join_all(forwarders);
        if tokio::time::timeout(TAP_FLUSH, all).await.is_err() {
            tracing::warn!(device = %self.config.id, flush = ?TAP_FLUSH, "tap forwarders did not finish: their last copies and the tap's end are dropped");
        }
    }

    fn set_state(&mut self, next: State) {
        let previous = self.state_sender.send_replace(next);
        if previous != next {
            tracing::info!(device = %self.config.id, "{previous} ---> {next}");
            let _ = self.changes.send(StateChange {
                from: previous,
                to: next,
            });
        }
    }

    fn record_failure(&mut self, failure: DeviceError) {
        let text = error_chain(&failure);
        tracing::error!(device = %self.config.id, "{text}");
        self.shared
            .lock()
            .expect("shared state poisoned")
            .last_error = Some(text);
        self.failure = Some(failure);
    }

    fn fail(&mut self, failure: DeviceError) {
        self.ctx.stop.request();
        self.record_failure(failure);
        self.set_state(State::Error);
    }

    /// Does the work of `state` while answering requests, then moves to `after` (or ERROR).
    async fn work(&mut self, state: State, after: State) {
        if state == State::Running {
            self.ctx.stop = StopSignal::new();
        }
        let stop = self.ctx.stop.clone();
        let id = self.config.id.clone();
        let outcome = {
            // A panicking hook is a failing hook: the device goes to ERROR and on down to
            // EXITING like for any other failure, instead of taking the runner task with it
            // (which left the process waiting forever for states that never came).
            let step = std::panic::AssertUnwindSafe(do_work(
                &mut self.device,
                &mut self.ctx,
                &self.config,
                &self.shared,
                state,
            ))
            .catch_unwind()
            .map(|finished| {
                finished.unwrap_or_else(|panic| {
                    Err(DeviceError::Hook {
                        device: id.clone(),
                        hook: hook_of(state),
                        state,
                        source: format!("panicked: {}", panic_message(panic.as_ref())).into(),
                    })
                })
            });
            tokio::pin!(step);
            loop {
                tokio::select! {
                    outcome = &mut step => break outcome,
                    request = self.requests.recv() => match request {
                        Some(Request::Change(Transition::Stop, reply)) if state == State::Running => {
                            stop.request();
                            let _ = reply.send(Ok(State::Ready));
                        }
                        Some(Request::Change(transition, reply)) if transition != Transition::ErrorFound => {
                            let _ = reply.send(Err(DeviceError::InvalidTransition { state, transition }));
                        }
                        Some(Request::Change(_, reply)) => {
                            let _ = reply.send(Ok(State::Error));
                            break Err(DeviceError::Interrupted { device: id.clone(), state, reason: "ERROR FOUND requested".to_owned() });
                        }
                        Some(Request::Abort(_, Some(meant_for))) if meant_for != state => {}
                        Some(Request::Abort(reason, _)) if state == State::Running => {
                            tracing::info!(device = %id, %reason, "stopping");
                            stop.request();
                        }
                        Some(Request::Abort(reason, _)) => {
                            break Err(DeviceError::Interrupted { device: id.clone(), state, reason });
                        }
                        None => {
                            break Err(DeviceError::DeviceGone { device: id.clone() });
                        }
                    },
                }
            }
        };
        match outcome {
            Ok(()) => {
                match state {
                    State::InitializingDevice => self.start_rate_logger(),
                    State::ResettingDevice => self.stop_rate_logger(),
                    _ => {}
                }
                self.set_state(after);
            }
            Err(failure) => self.fail(failure),
        }
    }

    fn start_rate_logger(&mut self) {
        self.stop_rate_logger();
        let counters = self.ctx.shared_counters();
        let mut shared = self.shared.lock().expect("shared state poisoned");
        shared.channels = self
            .ctx
            .channels
            .iter()
            .map(|channel| SharedChannel {
                name: channel.name().to_owned(),
                counters: channel.counters(),
                tap: channel.tap_slot(),
                config: channel.config().to_key_values(),
            })
            .collect();
        shared.transports = self
            .ctx
            .transports
            .iter()
            .map(|(name, transport)| (name.clone(), Arc::clone(transport)))
            .collect();
        drop(shared);
        self.rate_logger = rates::spawn_rate_logger(self.config.id.clone(), counters);
    }

    fn stop_rate_logger(&mut self) {
        if let Some(token) = self.rate_logger.take() {
            token.cancel();
        }
    }
}

/// The device hook that runs in `state` (for naming a panic).
fn hook_of(state: State) -> &'static str {
    match state {
        State::InitializingDevice => "init",
        State::InitializingTask => "init_task",
        State::Running => "run",
        State::ResettingTask => "reset_task",
        State::ResettingDevice => "reset",
        State::Binding => "bind",
        State::Connecting => "connect",
        _ => "state work",
    }
}

/// The text a panic was raised with (`panic!("...")` gives a `&str` or a `String`).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// The work of one state. Separate from the runner so that the request loop can borrow the
/// runner's other fields while this future holds the device and its context.
async fn do_work<D: Device>(
    device: &mut D,
    ctx: &mut DeviceContext,
    config: &DeviceConfig,
    shared: &Mutex<Shared>,
    state: State,
) -> Result<()> {
    let hook_failed = |hook: &'static str| {
        let device_id = config.id.clone();
        move |source| DeviceError::Hook {
            device: device_id,
            hook,
            state,
            source,
        }
    };
    match state {
        State::InitializingDevice => {
            create_channels(ctx, config).await?;
            device.init(ctx).await.map_err(hook_failed("init"))
        }
        State::Binding => {
            let overrides = address_overrides(ctx, &config.id)?;
            let mut bound = Vec::new();
            for channel in ctx
                .channels
                .iter_mut()
                .filter(|channel| channel.config().binds())
            {
                let address = match overrides.get(channel.name()) {
                    Some(addresses) => {
                        let mut bound_to = None;
                        for address in addresses {
                            bound_to = Some(channel.bind(address).await?);
                        }
                        bound_to.expect("an override has at least one address")
                    }
                    None => bind_channel(channel).await?,
                };
                tracing::info!(device = %config.id, channel = %channel.name(), %address, "bound");
                bound.push((channel.name().to_owned(), address.to_string()));
            }
            shared
                .lock()
                .expect("shared state poisoned")
                .bound_addresses = bound;
            Ok(())
        }
        State::Connecting => {
            let overrides = address_overrides(ctx, &config.id)?;
            for channel in ctx
                .channels
                .iter_mut()
                .filter(|channel| channel.config().connects())
            {
                match overrides.get(channel.name()) {
                    // A launcher names the addresses its binders actually bound (one per replica).
                    Some(addresses) => {
                        for address in addresses {
                            channel.connect(address).await?;
                        }
                    }
                    None => channel.connect_configured().await?,
                }
                tracing::debug!(device = %config.id, channel = %channel.name(), "connected");
            }
            Ok(())
        }
        State::InitializingTask => device
            .init_task(ctx)
            .await
            .map_err(hook_failed("init_task")),
        State::Running => {
            ctx.n_iterations = 0;
            device.run(ctx).await.map_err(hook_failed("run"))
        }
        State::ResettingTask => device
            .reset_task(ctx)
            .await
            .map_err(hook_failed("reset_task")),
        State::ResettingDevice => {
            // A message `send` accepted and the peer never got is a failure of the device, not
            // a warning: the device goes to ERROR and exits non-zero with the count.
            let mut undelivered = UnreportedLoss {
                device: &config.id,
                loss: None,
            };
            while let Some(channel) = ctx.channels.first_mut() {
                let closed = channel.close().await;
                // Out once closed: after an abort meanwhile the runner closes at END only what
                // this did not (and the one it was closing, again).
                ctx.channels.remove(0);
                if let Err(error) = closed {
                    if undelivered.loss.is_some() {
                        tracing::error!(device = %config.id, %error, "closing a channel failed");
                    } else {
                        undelivered.loss = Some(error);
                    }
                }
            }
            let undelivered = undelivered.loss.take();
            ctx.clear_channels();
            shared
                .lock()
                .expect("shared state poisoned")
                .bound_addresses
                .clear();
            device.reset(ctx).await.map_err(hook_failed("reset"))?;
            match undelivered {
                Some(error) => Err(DeviceError::Channel(error)),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// The first loss RESETTING DEVICE found, to be returned once every channel is closed. An
/// abort that cuts the state short drops it here: it is logged then, not lost unsaid.
struct UnreportedLoss<'a> {
    device: &'a str,
    loss: Option<Error>,
}

impl Drop for UnreportedLoss<'_> {
    fn drop(&mut self) {
        if let Some(error) = self.loss.take() {
            tracing::error!(device = %self.device, %error, "closing a channel failed (RESETTING DEVICE was interrupted)");
        }
    }
}

/// The namespace of the per-socket properties: `chan.<socket>.address` is the one key in it.
pub const CHANNEL_PROPERTY_PREFIX: &str = "chan.";

/// Reads property `key` = `value` of the channel namespace ([`CHANNEL_PROPERTY_PREFIX`]): the
/// socket a `chan.<socket>.address` names (`data`, or `data[1]` for a channel of several
/// sockets) and its addresses (`;` between several). `Ok(None)` for a key outside the
/// namespace.
///
/// # Errors
/// What is wrong, as a property error's problem says it: a key of the namespace of another
/// shape (`chan.data.adress`, FairMQ's `chan.data.0.address`), or a value that is empty, has
/// an empty entry, or has an address that does not parse.
pub fn read_address_property<'key>(
    key: &'key str,
    value: &str,
) -> std::result::Result<Option<(&'key str, Vec<Address>)>, String> {
    let Some(rest) = key.strip_prefix(CHANNEL_PROPERTY_PREFIX) else {
        return Ok(None);
    };
    let socket = rest
        .strip_suffix(".address")
        .filter(|socket| !socket.is_empty() && !socket.contains('.'))
        .ok_or_else(|| {
            format!(
                "(= {value:?}) is not read: the one property per channel is \
                 chan.<channel>.address (chan.<channel>[<socket index>].address for a channel \
                 of several sockets)"
            )
        })?;
    let entries: Vec<&str> = value.split(';').collect();
    let mut addresses = Vec::with_capacity(entries.len());
    for (idx, entry) in entries.iter().enumerate() {
        if entry.trim().is_empty() {
            return Err(if entries.len() == 1 {
                "is empty; give the address to use (several separated by ';')".to_owned()
            } else {
                format!(
                    "(= {value:?}) has an empty address, number {} of {}",
                    idx + 1,
                    entries.len()
                )
            });
        }
        addresses.push(Address::parse(entry).map_err(|error| {
            format!("(= {value:?}) has an address that does not parse: {error}")
        })?);
    }
    Ok(Some((socket, addresses)))
}

/// Addresses set through properties `chan.<socket>.address` (`;` between several), which
/// override the configured ones: how a launcher hands out addresses decided at run time.
///
/// # Errors
/// [`DeviceError::Property`] for a property of the channel namespace that
/// [`read_address_property`] refuses or that names a socket the device does not have: an
/// address given and silently not used would leave the device on another one.
fn address_overrides(ctx: &DeviceContext, device: &str) -> Result<BTreeMap<String, Vec<Address>>> {
    let properties = ctx.properties.lock().expect("properties poisoned");
    let names = ctx.channel_names();
    let mut overrides = BTreeMap::new();
    for (key, value) in properties.range(CHANNEL_PROPERTY_PREFIX.to_owned()..) {
        if !key.starts_with(CHANNEL_PROPERTY_PREFIX) {
            break;
        }
        let problem = |problem: String| DeviceError::Property {
            device: device.to_owned(),
            key: key.clone(),
            problem,
        };
        let Some((socket, addresses)) = read_address_property(key, value).map_err(problem)? else {
            continue;
        };
        if !names.iter().any(|name| name == socket) {
            return Err(problem(format!(
                "(= {value:?}) names no channel of this device; its channels: {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            )));
        }
        overrides.insert(socket.to_owned(), addresses);
    }
    Ok(overrides)
}

/// For a transport that wants memory to receive into (ofi): the device's transport that lends
/// shared memory (shmem; made now if need be) when the device has channels on it, so that
/// messages received over the one go on over the other without a copy. Every other transport
/// allocates its own memory.
fn receive_memory_for(
    ctx: &mut DeviceContext,
    config: &DeviceConfig,
    transport_name: &str,
) -> Result<Option<Arc<dyn ferromq_core::Transport>>> {
    if !ctx.registry.traits(transport_name)?.wants_receive_memory {
        return Ok(None);
    }
    // An unknown name is reported when its channel is made.
    let lender = config
        .sockets
        .iter()
        .map(|socket| transport_name_of(socket, config))
        .find(|name| {
            ctx.registry
                .traits(name)
                .is_ok_and(|traits| traits.lends_shared_memory)
        });
    let Some(lender) = lender else {
        return Ok(None);
    };
    if let Some(transport) = ctx.transports.get(lender) {
        return Ok(Some(Arc::clone(transport)));
    }
    let transport = ctx
        .registry
        .create(lender, &transport_options(ctx, config, None))?;
    ctx.transports
        .insert(lender.to_owned(), Arc::clone(&transport));
    Ok(Some(transport))
}

fn transport_name_of<'a>(socket: &'a SocketConfig, config: &'a DeviceConfig) -> &'a str {
    socket
        .config
        .transport
        .as_deref()
        .unwrap_or(&config.transport)
}

fn transport_options(
    ctx: &DeviceContext,
    config: &DeviceConfig,
    receive_memory: Option<Arc<dyn ferromq_core::Transport>>,
) -> TransportOptions {
    TransportOptions {
        session: config.session.clone(),
        properties: ctx.properties.lock().expect("properties poisoned").clone(),
        receive_memory,
    }
}

async fn create_channels(ctx: &mut DeviceContext, config: &DeviceConfig) -> Result<()> {
    ctx.clear_channels();
    for socket in &config.sockets {
        let transport_name = transport_name_of(socket, config);
        let transport = match ctx.transports.get(transport_name) {
            Some(transport) => Arc::clone(transport),
            None => {
                let receive_memory = receive_memory_for(ctx, config, transport_name)?;
                let options = transport_options(ctx, config, receive_memory);
                let transport = ctx.registry.create(transport_name, &options)?;
                ctx.transports
                    .insert(transport_name.to_owned(), Arc::clone(&transport));
                transport
            }
        };
        // The name it was made from, so that the channel's traits can be looked up again.
        let mut channel_config = socket.config.clone();
        channel_config.transport = Some(transport_name.to_owned());
        let channel = Channel::open(transport.as_ref(), channel_config, &socket.name).await?;
        ctx.channels.push(channel);
    }
    Ok(())
}

/// Binds a channel's address; without one, a free tcp port. When a configured tcp port is taken
/// and `autoBind` is on, a port of `portRangeMin..=portRangeMax` instead (FairMQ's autoBind: up
/// to 1000 ports of the range, starting at a random one).
async fn bind_channel(channel: &mut Channel) -> Result<Address> {
    // FairMQ's multi-endpoint address (`@tcp://*:5555,+tcp://host:5556`): every `@` endpoint.
    if channel.config().endpoints().map_err(Error::from)?.len() > 1 {
        return Ok(channel.bind_configured().await?);
    }
    let configured = channel.config().parsed_address().map_err(Error::from)?;
    let Some(address) = configured else {
        return Ok(channel
            .bind(&Address::Tcp {
                host: TcpHost::Any,
                port: 0,
            })
            .await?);
    };
    match channel.bind(&address).await {
        Err(Error::AddressInUse { .. }) if channel.config().auto_bind => {
            let Address::Tcp { host, .. } = &address else {
                return Err(Error::AddressInUse {
                    channel: channel.label().clone(),
                }
                .into());
            };
            let (min, max) = (
                channel.config().port_range_min,
                channel.config().port_range_max,
            );
            if min == 0 || min > max {
                return Err(Error::Bind {
                    channel: channel.label().clone(),
                    source: format!(
                        "{address} is in use, and autoBind cannot use portRangeMin = {min}, portRangeMax = {max} (it needs 1 <= portRangeMin <= portRangeMax)"
                    )
                    .into(),
                }
                .into());
            }
            tracing::warn!(channel = %channel.name(), %address, min, max, "address in use; autoBind tries the port range");
            let n_ports = u32::from(max - min) + 1;
            // A random start, so that devices started together do not all race for one port.
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.subsec_nanos())
                ^ std::process::id();
            let start = seed % n_ports;
            for attempt in 0..n_ports.min(1000) {
                let port = min + ((start + attempt) % n_ports) as u16;
                let candidate = Address::Tcp {
                    host: host.clone(),
                    port,
                };
                match channel.bind(&candidate).await {
                    Err(Error::AddressInUse { .. }) => continue,
                    other => return Ok(other?),
                }
            }
            Err(Error::Bind {
                channel: channel.label().clone(),
                source: format!(
                    "{address} is in use, and so is every port of portRangeMin..=portRangeMax = {min}..={max} that was tried"
                )
                .into(),
            }
            .into())
        }
        other => Ok(other?),
    }
}
