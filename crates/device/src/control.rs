//! Ways to drive a device: the static sequence, a clean shutdown from any state, and the
//! external control endpoint a launcher talks to.
//!
//! # The external control protocol
//! A device started with `--control external --control-address ADDR` binds a zmq REP socket at
//! ADDR (ipc or tcp). Each request is one JSON object ([`LauncherToDevice`], tagged by
//! `"request"`); each reply one JSON object ([`DeviceToLauncher`]). Examples:
//!
//! ```text
//! {"request":"transition","transition":"BIND"}        -> {"ok":true,"state":"BINDING"}
//! {"request":"wait_for_state","state":"BOUND","timeout_ms":5000}
//!                                                      -> {"ok":true,"state":"BOUND"}
//! {"request":"state"}                                  -> {"ok":true,"state":"RUNNING"}
//! {"request":"channels"}                               -> {"ok":true,"state":"BOUND","value":{"data":"tcp://*:41234"}}
//! {"request":"counters"}                               -> {"ok":true,...,"value":{"data":{"messages_in":10,...}}}
//! {"request":"get_property","key":"msg-size"}          -> {"ok":true,...,"value":"1024"}
//! {"request":"set_property","key":"rate","value":"0"}  -> {"ok":true,...}
//! {"request":"shutdown"}                               -> {"ok":true,...} then STOP ... END
//! {"request":"overview"}                               -> {"ok":true,"state":"RUNNING","value":{"pid":4242,
//!                                                          "seconds_in_state":3.5,"counters":{"data":{...}},
//!                                                          "memory":{"shmem":{"size":...,"used":...}}}}
//! ```
//!
//! # Observers
//! Every `ferromq device` process also serves a **read-only** endpoint (see
//! [`ControlEndpoint::read_only`] and [`crate::presence`]) for `ferromq top`: it answers the
//! requests that read (`state`, `overview`, `counters`, `channels`, `properties`,
//! `get_property`) and refuses the rest, so looking at a run never steers it, and an observer's
//! requests never count as a launcher's sign of life.
//! A refused request answers `{"ok":false,"state":...,"error":"transition RUN is not allowed in state IDLE"}`.
//! A transition is answered once it is made: END from ERROR only after the channels the
//! failure left open are closed (each within its `linger`), during which the endpoint answers
//! nothing else; a launcher that must not wait sends `shutdown`, which is answered at once.

use std::time::Duration;

use std::collections::BTreeMap;

use ferromq_core::{
    Address, Channel, ChannelConfig, CounterSnapshot, MemoryFigures, Message, Method, SocketType,
    Transport,
};
use serde::{Deserialize, Serialize};

use crate::error::{DeviceError, Result};
use crate::runner::DeviceController;
use crate::state::{State, Transition};

/// Drives a device from IDLE to RUNNING, waits until it leaves RUNNING (its `run` returned, or
/// STOP), then takes it down to EXITING: FairMQ's `--control static`.
///
/// # Errors
/// The device's error when it entered ERROR (it is still taken to EXITING).
pub async fn run_static(controller: &DeviceController) -> Result<()> {
    let steps = [
        (Transition::InitDevice, State::InitializingDevice),
        (Transition::CompleteInit, State::Initialized),
        (Transition::Bind, State::Bound),
        (Transition::Connect, State::DeviceReady),
        (Transition::InitTask, State::Ready),
        (Transition::Run, State::Ready),
    ];
    for (transition, target) in steps {
        let reached = match controller.change_state(transition).await {
            Ok(_) => controller.wait_for_state(target, None).await,
            Err(error) => Err(error),
        };
        if reached.is_err() {
            // ERROR or an abort: still leave through EXITING, reporting why.
            return shut_down(controller).await;
        }
    }
    shut_down(controller).await
}

/// Takes a device from whatever state it is in down to EXITING: STOP, RESET TASK, RESET DEVICE,
/// END, waiting for each working state to finish.
///
/// # Errors
/// The device's last error when it went through ERROR.
pub async fn shut_down(controller: &DeviceController) -> Result<()> {
    let mut states = controller.subscribe();
    loop {
        let state = *states.borrow_and_update();
        let step = match state {
            State::Exiting => {
                return match controller.last_error() {
                    Some(error) => Err(DeviceError::Interrupted {
                        device: controller.id().to_owned(),
                        state: State::Error,
                        reason: error,
                    }),
                    None => Ok(()),
                };
            }
            State::Running => Some(Transition::Stop),
            State::Ready => Some(Transition::ResetTask),
            State::Initialized | State::Bound | State::DeviceReady => Some(Transition::ResetDevice),
            State::InitializingDevice => Some(Transition::CompleteInit),
            State::Idle | State::Error => Some(Transition::End),
            State::Binding
            | State::Connecting
            | State::InitializingTask
            | State::ResettingTask
            | State::ResettingDevice => None,
        };
        if let Some(transition) = step {
            // A refusal means the state moved meanwhile; the loop looks again.
            let _ = controller.change_state(transition).await;
        }
        if *states.borrow() == state && states.changed().await.is_err() {
            return Err(DeviceError::DeviceGone {
                device: controller.id().to_owned(),
            });
        }
    }
}

/// A request from a launcher to a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case", deny_unknown_fields)]
pub enum LauncherToDevice {
    /// Request a state transition.
    Transition {
        /// Which.
        transition: Transition,
    },
    /// Read the current state.
    State,
    /// Wait until the device is in `state`.
    WaitForState {
        /// The state.
        state: State,
        /// Give up after this long (none: wait as long as it takes).
        timeout_ms: Option<u64>,
    },
    /// Read a property.
    GetProperty {
        /// Its key.
        key: String,
    },
    /// Set a property.
    SetProperty {
        /// Its key.
        key: String,
        /// Its value.
        value: String,
    },
    /// Every property.
    Properties,
    /// The addresses bound by the device's channels.
    Channels,
    /// Every channel's message and byte counters.
    Counters,
    /// Go down to EXITING from wherever the device is (STOP, RESET TASK, RESET DEVICE, END).
    Shutdown,
    /// What an observer shows in one answer: the process id, the time in the current state and
    /// every channel's counters.
    Overview,
    /// Copy every message channel `channel` sends or receives to a stream for a recorder (see
    /// [`crate::tap`]); the answer's value is `{"address": ..., "config": ...}`.
    Tap {
        /// The channel (socket) name.
        channel: String,
    },
    /// Close the tap on `channel`.
    Untap {
        /// The channel (socket) name.
        channel: String,
    },
}

impl LauncherToDevice {
    /// True for the requests that only read (a tap reads too: it copies, and the device's own
    /// sends and receives never wait for it), the ones a read-only endpoint answers.
    pub fn only_reads(&self) -> bool {
        matches!(
            self,
            Self::State
                | Self::GetProperty { .. }
                | Self::Properties
                | Self::Channels
                | Self::Counters
                | Self::Overview
                | Self::Tap { .. }
                | Self::Untap { .. }
        )
    }
}

/// A device's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceToLauncher {
    /// Whether the request was carried out.
    pub ok: bool,
    /// The device's state after the request.
    pub state: State,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The answer's data, for the requests that read something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

/// Every channel's counters as the `counters` and `overview` answers carry them: channel name
/// to [`CounterSnapshot`]'s JSON form.
fn counters_value(controller: &DeviceController) -> serde_json::Value {
    let counters: BTreeMap<String, CounterSnapshot> = controller.counters().into_iter().collect();
    serde_json::to_value(counters).expect("counters serialise")
}

/// The counters a `counters` or `overview` answer carried (see `counters_value`), by channel;
/// what is not counters is left out.
pub fn counters_from_value(value: &serde_json::Value) -> BTreeMap<String, CounterSnapshot> {
    serde_json::from_value(value.clone()).unwrap_or_default()
}

/// The memory figures an `overview` answer carried, by transport.
pub fn memory_from_value(value: &serde_json::Value) -> BTreeMap<String, MemoryFigures> {
    serde_json::from_value(value.clone()).unwrap_or_default()
}

async fn answer(
    transport: &dyn Transport,
    controller: &DeviceController,
    request: LauncherToDevice,
    state_entered: tokio::time::Instant,
) -> DeviceToLauncher {
    let value: Result<Option<serde_json::Value>> = match request {
        LauncherToDevice::Tap { channel } => match crate::presence::tap_address() {
            Ok(address) => crate::tap::serve(transport, controller, &channel, &address)
                .await
                .map(|(address, config)| {
                    Some(serde_json::json!({ "address": address, "config": config }))
                })
                .map_err(|problem| DeviceError::Control {
                    address: address.clone(),
                    problem: format!("cannot tap: {problem}"),
                }),
            Err(error) => Err(DeviceError::Control {
                address: crate::presence::directory().display().to_string(),
                problem: format!("cannot tap: {error}"),
            }),
        },
        LauncherToDevice::Untap { channel } => {
            controller.untap(&channel);
            Ok(None)
        }
        LauncherToDevice::Transition { transition } => {
            controller.change_state(transition).await.map(|_| None)
        }
        LauncherToDevice::State => Ok(None),
        LauncherToDevice::WaitForState { state, timeout_ms } => controller
            .wait_for_state(state, timeout_ms.map(Duration::from_millis))
            .await
            .map(|()| None),
        LauncherToDevice::GetProperty { key } => {
            Ok(controller.property(&key).map(serde_json::Value::String))
        }
        LauncherToDevice::SetProperty { key, value } => {
            controller.set_property(key, value);
            Ok(None)
        }
        LauncherToDevice::Properties => Ok(Some(serde_json::json!(controller.properties()))),
        LauncherToDevice::Channels => {
            let bound: serde_json::Map<String, serde_json::Value> = controller
                .bound_addresses()
                .into_iter()
                .map(|(name, address)| (name, serde_json::Value::String(address)))
                .collect();
            Ok(Some(serde_json::Value::Object(bound)))
        }
        LauncherToDevice::Counters => Ok(Some(counters_value(controller))),
        LauncherToDevice::Overview => {
            let memory: BTreeMap<String, MemoryFigures> = controller.memory().into_iter().collect();
            Ok(Some(serde_json::json!({
                "pid": std::process::id(),
                "seconds_in_state": state_entered.elapsed().as_secs_f64(),
                "counters": counters_value(controller),
                "memory": memory,
            })))
        }
        LauncherToDevice::Shutdown => {
            let controller = controller.clone();
            tokio::spawn(async move {
                let _ = shut_down(&controller).await;
            });
            Ok(None)
        }
    };
    let state = controller.state();
    match value {
        Ok(value) => DeviceToLauncher {
            ok: true,
            state,
            error: None,
            value,
        },
        Err(error) => DeviceToLauncher {
            ok: false,
            state,
            error: Some(ferromq_core::error_chain(&error)),
            value: None,
        },
    }
}

fn control_channel_config(socket_type: SocketType, method: Method, address: &str) -> ChannelConfig {
    ChannelConfig {
        rate_logging: 0,
        linger: 100,
        ..ChannelConfig::new("control", socket_type, method).with_address(address)
    }
}

/// How a device started by a launcher tells it where its control endpoint is: one line on
/// standard output, `ferromq-control-endpoint: <address> pid <pid>`, printed once bound. A
/// launcher on another host cannot know a tcp port the device picked, nor a pid there.
pub const ANNOUNCE_PREFIX: &str = "ferromq-control-endpoint: ";

/// The announcement line for `address` and this process.
pub fn announcement(address: &str) -> String {
    format!("{ANNOUNCE_PREFIX}{address} pid {}", std::process::id())
}

/// Reads an announcement line: the address and the pid.
pub fn parse_announcement(line: &str) -> Option<(String, u32)> {
    let rest = line.trim_end().strip_prefix(ANNOUNCE_PREFIX)?;
    let (address, pid) = rest.split_once(" pid ")?;
    Some((address.to_owned(), pid.parse().ok()?))
}

/// How long a device with a heartbeat limit should wait for its launcher's first request
/// (`ControlEndpoint::first_contact`, as `ferromq device` sets it): a launcher
/// starting a thousand devices across hosts learns of the last ones seconds after the first
/// were up.
pub const FIRST_CONTACT_LIMIT: Duration = Duration::from_secs(60);

/// How a device serves its external control endpoint.
#[derive(Debug, Clone, Default)]
pub struct ControlEndpoint {
    /// Where to bind (`ipc://path`, or `tcp://address:0` for a launcher on another host).
    pub address: String,
    /// Go down when no request came for this long (and none is being answered): the launcher
    /// is on another host and keeps talking; its silence means it is gone. `None`: no limit.
    pub heartbeat: Option<Duration>,
    /// With `heartbeat`: how long to wait for the launcher's first request, if longer than
    /// `heartbeat` (see [`FIRST_CONTACT_LIMIT`]).
    pub first_contact: Duration,
    /// Answer only the requests that read ([`LauncherToDevice::only_reads`]): an observer's
    /// endpoint. Requests to it are no sign of a launcher's life.
    pub read_only: bool,
}

/// Serves the external control protocol at `endpoint.address` until the device reaches
/// EXITING. Once bound, `on_bound` is told the address actually bound (a tcp port 0 becomes
/// the real port), so that a launcher that cannot guess it can learn it.
///
/// # Heartbeat
/// With `endpoint.heartbeat`, a device that has not been sent a request for that long (before
/// the first request, for `endpoint.first_contact` if that is longer; one
/// being answered counts as a sign of life, however long it waits) aborts what it does and
/// goes down to EXITING, with the cause "the launcher fell silent": a launcher on another
/// host that died, or a host cut off from it, leaves nothing running. A device whose work
/// does not end within the same time again (a send to a peer on a lost host) makes this
/// return [`DeviceError::LauncherGone`], on which the caller ends the process.
///
/// # Errors
/// [`DeviceError::Control`] when the endpoint cannot be bound; [`DeviceError::LauncherSilent`]
/// when the device went down for the launcher's silence; [`DeviceError::LauncherGone`].
pub async fn serve_external_control(
    transport: &dyn Transport,
    endpoint: &ControlEndpoint,
    controller: DeviceController,
    on_bound: impl FnOnce(&str),
) -> Result<()> {
    let address = endpoint.address.as_str();
    let control_error = |problem: String| DeviceError::Control {
        address: address.to_owned(),
        problem,
    };
    let config = control_channel_config(SocketType::Rep, Method::Bind, address);
    // With its causes: "bad address" alone did not say what was wrong with it.
    let mut channel = Channel::open(transport, config, "control")
        .await
        .map_err(|error| control_error(ferromq_core::error_chain(&error)))?;
    let bound = channel
        .bind_configured()
        .await
        .map_err(|error| control_error(ferromq_core::error_chain(&error)))?;
    if endpoint.read_only {
        // Every device has one (for `ferromq top`): not worth a line of its log.
        tracing::debug!(device = %controller.id(), address = %bound, "observer endpoint bound");
    } else {
        tracing::info!(device = %controller.id(), address = %bound, "external control endpoint bound");
    }
    on_bound(&bound.to_string());
    let mut states = controller.subscribe();
    let mut state_entered = tokio::time::Instant::now();
    let mut last_request = tokio::time::Instant::now();
    // Until the launcher first speaks, it may still be starting the others (a thousand Slurm
    // tasks take seconds, and their announcements reach it late): a longer allowance then.
    let mut spoken = false;
    // When the launcher fell silent: from then on the device has the same time again to get
    // down before the caller is told to end the process.
    let mut fell_silent: Option<(tokio::time::Instant, Duration)> = None;
    loop {
        let silence = async {
            match (endpoint.heartbeat, fell_silent) {
                (Some(limit), None) => {
                    let allowed = if spoken {
                        limit
                    } else {
                        limit.max(endpoint.first_contact)
                    };
                    tokio::time::sleep_until(last_request + allowed).await;
                    allowed
                }
                (Some(limit), Some((since, _))) => {
                    tokio::time::sleep_until(since + limit).await;
                    limit
                }
                (None, _) => std::future::pending().await,
            }
        };
        let request = tokio::select! {
            request = channel.receive() => request,
            changed = states.changed() => {
                if changed.is_err() || *states.borrow() == State::Exiting {
                    break;
                }
                state_entered = tokio::time::Instant::now();
                continue;
            }
            limit = silence => {
                if fell_silent.is_some() {
                    let _ = channel.close().await;
                    // The caller ends the process with the channels unclosed: what they hold
                    // is said, since no close will count it.
                    let unsent = controller
                        .counters()
                        .into_iter()
                        .filter(|(_, counters)| counters.queued > 0)
                        .map(|(channel, counters)| (channel, counters.queued))
                        .collect();
                    return Err(DeviceError::LauncherGone {
                        device: controller.id().to_owned(),
                        silent_for: limit,
                        unsent,
                    });
                }
                fell_silent = Some((tokio::time::Instant::now(), limit));
                tracing::warn!(device = %controller.id(), "no request from the launcher for {limit:?}: it is gone; going down");
                controller.abort(format!("the launcher fell silent for {limit:?}"));
                let controller = controller.clone();
                tokio::spawn(async move {
                    let _ = shut_down(&controller).await;
                });
                continue;
            }
        };
        let request = match request {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(device = %controller.id(), %error, "control endpoint receive failed");
                // Never starve the runtime, whatever keeps failing: signals and the launcher
                // watch run on it.
                tokio::task::yield_now().await;
                continue;
            }
        };
        let reply = match serde_json::from_slice::<LauncherToDevice>(request.data()) {
            Ok(request) if endpoint.read_only && !request.only_reads() => DeviceToLauncher {
                ok: false,
                state: controller.state(),
                error: Some(format!(
                    "this endpoint only observes: {request:?} is refused (steer a device \
                     through its launcher or its own control mode)"
                )),
                value: None,
            },
            Ok(request) => answer(transport, &controller, request, state_entered).await,
            Err(error) => DeviceToLauncher {
                ok: false,
                state: controller.state(),
                error: Some(format!("malformed control request: {error}")),
                value: None,
            },
        };
        // A request answered, however long it took, is a sign of life (of a launcher: an
        // observer's endpoint has no heartbeat).
        last_request = tokio::time::Instant::now();
        spoken = true;
        let bytes = serde_json::to_vec(&reply).expect("replies serialise");
        if let Err(failed) = channel.send(Message::from(bytes)).await {
            tracing::warn!(device = %controller.id(), error = %failed.error, "control reply failed");
        }
    }
    let _ = channel.close().await;
    match fell_silent {
        Some((_, silent_for)) => Err(DeviceError::LauncherSilent {
            device: controller.id().to_owned(),
            silent_for,
        }),
        None => Ok(()),
    }
}

/// The launcher's side of the external control protocol.
pub struct ControlClient {
    channel: Channel,
    address: String,
}

impl ControlClient {
    /// Connects to a device's control endpoint.
    ///
    /// # Errors
    /// [`DeviceError::Control`] when the address is invalid.
    pub async fn connect(transport: &dyn Transport, address: &str) -> Result<ControlClient> {
        let control_error = |problem: String| DeviceError::Control {
            address: address.to_owned(),
            problem,
        };
        let config = control_channel_config(SocketType::Req, Method::Connect, address);
        let mut channel = Channel::open(transport, config, "control")
            .await
            .map_err(|error| control_error(error.to_string()))?;
        let parsed = Address::parse(address).map_err(|error| control_error(error.to_string()))?;
        channel
            .connect(&parsed)
            .await
            .map_err(|error| control_error(error.to_string()))?;
        Ok(ControlClient {
            channel,
            address: address.to_owned(),
        })
    }

    /// Sends one request and waits for its answer, at most `timeout`.
    ///
    /// # Errors
    /// [`DeviceError::Control`] when the device does not answer in time or answers garbage.
    pub async fn request(
        &mut self,
        request: &LauncherToDevice,
        timeout: Duration,
    ) -> Result<DeviceToLauncher> {
        let control_error = |problem: String| DeviceError::Control {
            address: self.address.clone(),
            problem,
        };
        let bytes = serde_json::to_vec(request).expect("requests serialise");
        self.channel
            .send_timeout(Message::from(bytes), timeout)
            .await
            .map_err(|failed| control_error(failed.error.to_string()))?;
        let reply = self
            .channel
            .receive_timeout(timeout)
            .await
            .map_err(|error| control_error(error.to_string()))?;
        serde_json::from_slice(reply.data())
            .map_err(|error| control_error(format!("malformed reply: {error}")))
    }

    /// Sends one request; an answer with `ok: false` becomes an error.
    ///
    /// # Errors
    /// As [`ControlClient::request`], and [`DeviceError::Control`] with the device's refusal.
    pub async fn expect_ok(
        &mut self,
        request: &LauncherToDevice,
        timeout: Duration,
    ) -> Result<DeviceToLauncher> {
        let reply = self.request(request, timeout).await?;
        if reply.ok {
            return Ok(reply);
        }
        Err(DeviceError::Control {
            address: self.address.clone(),
            problem: reply.error.unwrap_or_else(|| "refused".to_owned()),
        })
    }
}
