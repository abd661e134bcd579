//! `ferromq run FILE`: one process per device, driven through the state machine in step.
//!
//! 1. Load and check the topology (every error with file:line:col); nothing starts on an error.
//! 2. Start every device with `--control external` and connect to its control endpoint.
//! 3. Step all of them together: INIT DEVICE and COMPLETE INIT, then BIND (all bound), read the
//!    addresses they bound and hand each connector its binders' addresses, then CONNECT (all
//!    ready), INIT TASK, RUN. No device connects before every binder is bound.
//! 4. While running: a live table of states and rates (redrawn in place on a terminal, plain
//!    periodic lines otherwise); the devices' own log lines pass through, prefixed with their id.
//! 5. Stop on Ctrl-C/SIGTERM, `--duration`, or when every device has finished its work: each
//!    device goes down through STOP, RESET TASK, RESET DEVICE, END; a device that does not exit
//!    in time is killed. A second Ctrl-C kills at once.
//! 6. A device that exits or enters ERROR stops everything, and the exit code says so, naming it,
//!    its state and its last output lines.
//! 7. Afterwards the session's shared memory is removed, whatever happened.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ferromq_core::{Address, Method, SocketType};
use ferromq_device::control::{ControlClient, DeviceToLauncher, LauncherToDevice};
use ferromq_device::rates::Rates;
use ferromq_device::{State, Transition};
use ferromq_devices::Builtin;
use ferromq_topology::{AutoAddress, DeviceKind, Instance, Known, Topology};
use ferromq_zmq::ZmqTransport;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::console::Console;

const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const LAST_LINES: usize = 20;

/// What `ferromq run` was asked.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The topology file.
    pub file: PathBuf,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Override the topology's default transport.
    pub transport: Option<String>,
    /// Session id (default: one per run).
    pub session: Option<String>,
}

/// Loads and checks a topology file for this binary's kinds and transports.
///
/// # Errors
/// The file cannot be read, or every validation error, one per line.
pub fn load_topology(file: &Path) -> Result<Topology> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let kinds = Builtin::names();
    let transports = crate::built_in_transports().names();
    let known = Known {
        kinds: &kinds,
        transports: &transports,
    };
    ferromq_topology::load(&file.display().to_string(), &text, &known)
        .map_err(|errors| anyhow!("{errors}"))
}

struct Running {
    instance: Instance,
    control_address: String,
    child: Child,
    control: Option<ControlClient>,
    last_lines: Arc<Mutex<VecDeque<String>>>,
    state: State,
    counters: BTreeMap<String, ferromq_core::CounterSnapshot>,
    exited: Option<std::process::ExitStatus>,
}

impl Running {
    fn last_lines(&self) -> String {
        self.last_lines
            .lock()
            .expect("line buffer poisoned")
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n    ")
    }

    async fn request(&mut self, request: &LauncherToDevice) -> Result<DeviceToLauncher> {
        let id = self.instance.id.clone();
        let control = self
            .control
            .as_mut()
            .ok_or_else(|| anyhow!("device {id:?} has no control connection"))?;
        let reply = control
            .request(request, CONTROL_TIMEOUT)
            .await
            .with_context(|| format!("device {id:?}"))?;
        self.state = reply.state;
        if !reply.ok {
            bail!(
                "device {id:?} in {}: {}",
                reply.state,
                reply.error.unwrap_or_default()
            );
        }
        Ok(reply)
    }
}

fn forward_lines(
    id: String,
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    to_stderr: bool,
    last_lines: Arc<Mutex<VecDeque<String>>>,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            {
                let mut last = last_lines.lock().expect("line buffer poisoned");
                if last.len() == LAST_LINES {
                    last.pop_front();
                }
                last.push_back(line.clone());
            }
            // Device log lines already carry the device id; other output gets it here.
            let line = if line.contains(&format!("[{id}]")) {
                line
            } else {
                format!("[{id}] {line}")
            };
            if to_stderr {
                Console::global().error_line(&line);
            } else {
                Console::global().line(&line);
            }
        }
    });
}

fn auto_bind_address(
    topology: &Topology,
    run_dir: &Path,
    instance: &str,
    config: &ferromq_core::ChannelConfig,
) -> String {
    let socket = &config.name;
    let transport = config.transport.as_deref().unwrap_or(&topology.transport);
    let binds_ipc = crate::built_in_transports()
        .traits(transport)
        .is_ok_and(|traits| traits.binds_ipc);
    if !binds_ipc {
        // ofi goes between hosts: a tcp side channel, never ipc.
        return "tcp://127.0.0.1:0".to_owned();
    }
    match topology.auto_address {
        AutoAddress::Ipc => format!("ipc://{}/{instance}.{socket}.ipc", run_dir.display()),
        AutoAddress::Tcp => "tcp://127.0.0.1:0".to_owned(),
    }
}

fn spawn_device(
    topology: &Topology,
    instance: &Instance,
    session: &str,
    run_dir: &Path,
    control_address: &str,
) -> Result<Child> {
    let mut command = match &instance.kind {
        DeviceKind::Builtin(kind) => {
            let mut command =
                Command::new(std::env::current_exe().context("cannot find the ferromq binary")?);
            command.args(["device", kind]);
            command
        }
        DeviceKind::Exec(argv) => {
            let mut command = Command::new(&argv[0]);
            command.args(&argv[1..]);
            command
        }
    };
    command.args([
        "--id",
        &instance.id,
        "--session",
        session,
        "--transport",
        &topology.transport,
    ]);
    command.args([
        "--control",
        "external",
        "--control-address",
        control_address,
    ]);
    command.args(["--max-iterations", &instance.max_iterations.to_string()]);
    if !std::io::stdout().is_terminal() {
        command.args(["--color", "false"]);
    }
    for channel in &instance.channels {
        let mut config = channel.config.clone();
        if config.method == Method::Bind && config.address.is_none() {
            config.address = Some(auto_bind_address(topology, run_dir, &instance.id, &config));
        }
        command.args(["--channel-config", &config.to_key_values()]);
    }
    for (key, value) in &instance.properties {
        command.args(["--property", &format!("{key}={value}")]);
    }
    command.args([
        "--property",
        &format!("replica-index={}", instance.replica_index),
    ]);
    command.args([
        "--property",
        &format!("replica-count={}", instance.replica_count),
    ]);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
        .spawn()
        .with_context(|| format!("cannot start device {:?}", instance.id))
}

/// Steps every device through `transition`, then waits until all are in `target`.
async fn step_all(
    devices: &mut [Running],
    transition: Transition,
    target: Option<State>,
) -> Result<()> {
    for device in devices.iter_mut() {
        device
            .request(&LauncherToDevice::Transition { transition })
            .await?;
    }
    if let Some(state) = target {
        for device in devices.iter_mut() {
            let timeout_ms = Some(CONTROL_TIMEOUT.as_millis() as u64);
            device
                .request(&LauncherToDevice::WaitForState { state, timeout_ms })
                .await?;
        }
    }
    Ok(())
}

/// Hands every connecting channel the addresses its binders bound.
async fn wire_connections(devices: &mut [Running]) -> Result<()> {
    let mut bound: BTreeMap<(String, String), String> = BTreeMap::new();
    for device in devices.iter_mut() {
        let reply = device.request(&LauncherToDevice::Channels).await?;
        let Some(serde_json::Value::Object(channels)) = reply.value else {
            continue;
        };
        for (socket, address) in channels {
            let Some(address) = address.as_str() else {
                continue;
            };
            let local = Address::parse(address)
                .map(|address| address.for_local_connect().to_string())
                .unwrap_or_else(|_| address.to_owned());
            bound.insert((device.instance.id.clone(), socket), local);
        }
    }
    for device in devices.iter_mut() {
        for channel in device.instance.channels.clone() {
            if channel.connect_to.is_empty() {
                continue;
            }
            let mut addresses = Vec::new();
            for (target, socket) in &channel.connect_to {
                let address = bound
                    .get(&(target.clone(), socket.clone()))
                    .or_else(|| bound.get(&(target.clone(), format!("{socket}[0]"))))
                    .ok_or_else(|| anyhow!("device {target:?} did not bind {socket:?}"))?;
                addresses.push(address.clone());
            }
            let name = &channel.config.name;
            let n_sockets = channel.config.num_sockets;
            if n_sockets > 1 && addresses.len() == n_sockets {
                // As many sockets as targets: socket i connects to the i-th target.
                for (socket_idx, address) in addresses.iter().enumerate() {
                    let key = format!("chan.{name}[{socket_idx}].address");
                    device
                        .request(&LauncherToDevice::SetProperty {
                            key,
                            value: address.clone(),
                        })
                        .await?;
                }
            } else if n_sockets > 1 {
                for socket_idx in 0..n_sockets {
                    let key = format!("chan.{name}[{socket_idx}].address");
                    device
                        .request(&LauncherToDevice::SetProperty {
                            key,
                            value: addresses.join(";"),
                        })
                        .await?;
                }
            } else {
                let key = format!("chan.{name}.address");
                device
                    .request(&LauncherToDevice::SetProperty {
                        key,
                        value: addresses.join(";"),
                    })
                    .await?;
            }
        }
    }
    Ok(())
}

async fn start(
    topology: &Topology,
    session: &str,
    run_dir: &Path,
    devices: &mut Vec<Running>,
) -> Result<Option<&'static str>> {
    let transport = ZmqTransport::new();
    for instance in topology.instances() {
        let control_address = format!("ipc://{}/{}.control", run_dir.display(), instance.id);
        let mut child = spawn_device(topology, &instance, session, run_dir, &control_address)?;
        let last_lines = Arc::new(Mutex::new(VecDeque::new()));
        forward_lines(
            instance.id.clone(),
            child.stdout.take().expect("piped"),
            false,
            Arc::clone(&last_lines),
        );
        forward_lines(
            instance.id.clone(),
            child.stderr.take().expect("piped"),
            true,
            Arc::clone(&last_lines),
        );
        devices.push(Running {
            instance,
            control_address: control_address.clone(),
            child,
            control: None,
            last_lines,
            state: State::Idle,
            counters: BTreeMap::new(),
            exited: None,
        });
        let device = devices.last_mut().expect("just pushed");
        let connect = ControlClient::connect(&transport, &control_address);
        let control = tokio::select! {
            control = tokio::time::timeout(CONTROL_TIMEOUT, connect) => control
                .map_err(|_| anyhow!("device {:?} opened no control endpoint within {CONTROL_TIMEOUT:?}", device.instance.id))??,
            status = device.child.wait() => {
                bail!("device {:?} exited at start ({}):\n    {}", device.instance.id, status?, device.last_lines());
            }
        };
        device.control = Some(control);
    }
    step_all(devices, Transition::InitDevice, None).await?;
    step_all(devices, Transition::CompleteInit, Some(State::Initialized)).await?;
    step_all(devices, Transition::Bind, Some(State::Bound)).await?;
    wire_connections(devices).await?;
    step_all(devices, Transition::Connect, Some(State::DeviceReady)).await?;
    step_all(devices, Transition::InitTask, Some(State::Ready)).await?;
    step_all(devices, Transition::Run, None).await?;
    Ok(None)
}

/// SIGINT and SIGTERM, installed before anything starts so that no signal finds the launcher
/// without a handler.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        crate::transports::prepare_termination_signals();
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

/// Why the run ends.
enum Ending {
    Signal(&'static str),
    Duration,
    Finished,
    Failure(String),
}

fn table(
    devices: &[Running],
    previous: &BTreeMap<(String, String), ferromq_core::CounterSnapshot>,
    seconds: f64,
) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<16} {:<18} {:<12} {:>12} {:>10} {:>12} {:>10}",
        "device", "state", "channel", "in msg/s", "in MB/s", "out msg/s", "out MB/s"
    )];
    for device in devices {
        let state = match device.exited {
            Some(status) => format!("exited ({status})"),
            None => device.state.to_string(),
        };
        if device.counters.is_empty() {
            lines.push(format!("{:<16} {state:<18}", device.instance.id));
        }
        for (channel_idx, (channel, now)) in device.counters.iter().enumerate() {
            // Counters start at zero: the first table shows the rates since the start.
            let before = previous
                .get(&(device.instance.id.clone(), channel.clone()))
                .copied()
                .unwrap_or_default();
            let rates = Rates::between(before, *now, seconds);
            let (id, state) = if channel_idx == 0 {
                (device.instance.id.as_str(), state.as_str())
            } else {
                ("", "")
            };
            lines.push(format!(
                "{id:<16} {state:<18} {channel:<12} {:>12.0} {:>10.1} {:>12.0} {:>10.1}",
                rates.msgs_in, rates.mb_in, rates.msgs_out, rates.mb_out
            ));
        }
    }
    lines
}

async fn supervise(
    devices: &mut [Running],
    duration: Option<Duration>,
    signals: &mut Signals,
) -> Ending {
    let started = Instant::now();
    let interval = if Console::global().is_live() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(2)
    };
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut previous: BTreeMap<(String, String), ferromq_core::CounterSnapshot> = BTreeMap::new();
    let mut last_table = Instant::now();
    // The RUN replies said every device entered RUNNING; all back in READY later means done.
    let mut seen_running = devices.iter().any(|device| device.state == State::Running);
    loop {
        tokio::select! {
            name = signals.next() => return Ending::Signal(name),
            _ = tick.tick() => {}
        }
        if duration.is_some_and(|duration| started.elapsed() >= duration) {
            return Ending::Duration;
        }
        // Requests to a device that hangs can take their whole timeout: a signal meanwhile is
        // acted on at once, not after them.
        let poll = poll_devices(
            devices,
            &mut seen_running,
            &mut previous,
            &mut last_table,
            interval,
        );
        tokio::select! {
            name = signals.next() => return Ending::Signal(name),
            ending = poll => if let Some(ending) = ending {
                return ending;
            },
        }
    }
}

/// One round of supervision: exits, states, and every `interval` the table of rates.
async fn poll_devices(
    devices: &mut [Running],
    seen_running: &mut bool,
    previous: &mut BTreeMap<(String, String), ferromq_core::CounterSnapshot>,
    last_table: &mut Instant,
    interval: Duration,
) -> Option<Ending> {
    for device in devices.iter_mut() {
        if let Ok(Some(status)) = device.child.try_wait() {
            device.exited = Some(status);
            return Some(Ending::Failure(format!(
                "device {:?} exited ({status}) while {}; its last lines:\n    {}",
                device.instance.id,
                device.state,
                device.last_lines()
            )));
        }
        let Ok(reply) = device.request(&LauncherToDevice::State).await else {
            continue;
        };
        if reply.state == State::Error {
            return Some(Ending::Failure(format!(
                "device {:?} is in ERROR; its last lines:\n    {}",
                device.instance.id,
                device.last_lines()
            )));
        }
    }
    *seen_running |= devices.iter().any(|device| device.state == State::Running);
    if *seen_running && devices.iter().all(|device| device.state == State::Ready) {
        return Some(Ending::Finished);
    }
    if last_table.elapsed() >= interval {
        let seconds = last_table.elapsed().as_secs_f64();
        let before: BTreeMap<_, _> = devices
            .iter()
            .flat_map(|device| {
                device.counters.iter().map(|(channel, counters)| {
                    ((device.instance.id.clone(), channel.clone()), *counters)
                })
            })
            .collect();
        for device in devices.iter_mut() {
            if let Ok(reply) = device.request(&LauncherToDevice::Counters).await
                && let Some(serde_json::Value::Object(channels)) = reply.value
            {
                device.counters = channels
                    .into_iter()
                    .map(|(channel, value)| {
                        let field = |key: &str| {
                            value
                                .get(key)
                                .and_then(serde_json::Value::as_u64)
                                .unwrap_or(0)
                        };
                        let snapshot = ferromq_core::CounterSnapshot {
                            messages_in: field("messages_in"),
                            bytes_in: field("bytes_in"),
                            messages_out: field("messages_out"),
                            bytes_out: field("bytes_out"),
                        };
                        (channel, snapshot)
                    })
                    .collect();
            }
        }
        previous.extend(before);
        Console::global().table(&table(devices, previous, seconds));
        for device in devices.iter() {
            for (channel, counters) in &device.counters {
                previous.insert((device.instance.id.clone(), channel.clone()), *counters);
            }
        }
        *last_table = Instant::now();
    }
    None
}

/// The first device whose process has exited (waiting up to a second: a broken control
/// connection can be seen before the death that broke it), with its status.
async fn exited_device(devices: &mut [Running]) -> Option<(&Running, std::process::ExitStatus)> {
    let deadline = Instant::now() + Duration::from_secs(1);
    let idx = loop {
        let found = devices.iter_mut().position(|device| {
            if let Ok(Some(status)) = device.child.try_wait() {
                device.exited = Some(status);
            }
            device.exited.is_some()
        });
        if found.is_some() || Instant::now() >= deadline {
            break found?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let device = &devices[idx];
    Some((device, device.exited?))
}

/// For each device, the indices of the devices that send into it (push/pub into its pull/sub),
/// from the topology's wiring. Pair, req and rep go both ways and impose no order.
fn upstream_of(devices: &[Running]) -> Vec<BTreeSet<usize>> {
    let index: BTreeMap<&str, usize> = devices
        .iter()
        .enumerate()
        .map(|(idx, device)| (device.instance.id.as_str(), idx))
        .collect();
    let mut upstream = vec![BTreeSet::new(); devices.len()];
    for (idx, device) in devices.iter().enumerate() {
        for channel in &device.instance.channels {
            for (peer, _) in &channel.connect_to {
                let Some(&peer_idx) = index.get(peer.as_str()) else {
                    continue;
                };
                match channel.config.socket_type {
                    SocketType::Pull | SocketType::Sub => {
                        upstream[idx].insert(peer_idx);
                    }
                    SocketType::Push | SocketType::Pub => {
                        upstream[peer_idx].insert(idx);
                    }
                    _ => {}
                }
            }
        }
    }
    upstream
}

/// How long a device's inputs must stay still before it counts as drained.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// The longest a stop waits for a device's inputs to go still.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a device has to answer one control request during a stop.
const STOP_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Stops every device that still runs and returns the devices that had to be killed.
///
/// With `drain`, devices stop in the order data flows: sources first, and a device only once
/// every device sending into it has exited and its own inputs have been still for
/// [`QUIET_FOR`], so that what was in flight at the stop is received, not lost. Devices of one
/// stage stop together. A device that does not exit is killed once [`STOP_TIMEOUT`] passed since
/// it was asked and since the devices still running last did work (a closing sender may rightly
/// take long to drain into a slow receiver); a second SIGINT/SIGTERM kills every device at once. Either is a stop by force,
/// which the caller reports as a failure.
async fn stop_all(devices: &mut [Running], signals: &mut Signals, drain: bool) -> Vec<String> {
    let upstream = upstream_of(devices);
    let mut stopped = vec![false; devices.len()];
    let mut forced = Vec::new();
    loop {
        let remaining: Vec<usize> = (0..devices.len()).filter(|&idx| !stopped[idx]).collect();
        if remaining.is_empty() {
            break;
        }
        let mut stage: Vec<usize> = remaining
            .iter()
            .copied()
            .filter(|&idx| !drain || upstream[idx].iter().all(|&up| stopped[up]))
            .collect();
        if stage.is_empty() {
            // A cycle of push/pull: no order drains it; stop what is left together.
            stage = remaining;
        }
        // Every device still running: while they work, the stage may still be delivering (a
        // closing sender waits for its peers to take what it sent).
        let running_pids: Vec<u32> = devices
            .iter()
            .enumerate()
            .filter(|(idx, device)| !stopped[*idx] && device.exited.is_none())
            .filter_map(|(_, device)| device.child.id())
            .collect();
        let last_progress = Mutex::new(Instant::now());
        let stop_stage = futures_util::future::join_all(
            devices
                .iter_mut()
                .enumerate()
                .filter(|(idx, _)| stage.contains(idx))
                .map(|(idx, device)| {
                    stop_one(device, drain && !upstream[idx].is_empty(), &last_progress)
                }),
        );
        tokio::select! {
            results = stop_stage => forced.extend(results.into_iter().flatten()),
            () = watch_progress(&running_pids, &last_progress) => {}
            name = signals.next() => {
                eprintln!("ferromq: second signal ({name}): killing every device");
                for device in devices.iter_mut().filter(|device| device.exited.is_none()) {
                    let _ = device.child.start_kill();
                    forced.push(device.instance.id.clone());
                }
                break;
            }
        }
        for idx in stage {
            stopped[idx] = true;
        }
    }
    for device in devices.iter_mut() {
        let _ = device.child.kill().await;
    }
    forced
}

/// Records in `last_progress` when the processes `pids` last did work together: at least
/// [`BUSY_TICKS`] of CPU within a second (an idle device's timers use far less; a device
/// verifying, forwarding or draining uses far more). Counting CPU, not messages, keeps working when
/// a busy device is slow to answer control requests. Never completes.
async fn watch_progress(pids: &[u32], last_progress: &Mutex<Instant>) {
    let total = || {
        pids.iter()
            .filter_map(|&pid| cpu_ticks_of(pid))
            .sum::<u64>()
    };
    let mut before = total();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = total();
        if now.saturating_sub(before) >= BUSY_TICKS {
            *last_progress.lock().expect("progress lock") = Instant::now();
        }
        before = now;
    }
}

/// CPU clock ticks (usually 10 ms each) per second that count as work during a stop.
const BUSY_TICKS: u64 = 5;

/// User plus system CPU time of process `pid`, in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks_of(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let after_name = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = after_name.split(' ').collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(user + system)
}

/// The messages a device has received on all its channels; `None` when it does not answer.
async fn received_by(control: &mut ControlClient) -> Option<u64> {
    let reply = control
        .request(&LauncherToDevice::Counters, STOP_REQUEST_TIMEOUT)
        .await
        .ok()?;
    match &reply.value {
        Some(serde_json::Value::Object(channels)) => Some(
            channels
                .values()
                .filter_map(|channel| channel.get("messages_in")?.as_u64())
                .sum(),
        ),
        _ => None,
    }
}

/// Asks one device to go down (after its inputs went still, with `drain_first`) and waits for it
/// to exit; kills it after [`STOP_TIMEOUT`] without progress (see `last_progress`). Returns its id
/// when it had to be killed.
async fn stop_one(
    device: &mut Running,
    drain_first: bool,
    last_progress: &Mutex<Instant>,
) -> Option<String> {
    if let Ok(Some(status)) = device.child.try_wait() {
        device.exited.get_or_insert(status);
    }
    if device.exited.is_some() {
        return None;
    }
    // A fresh connection: a request cancelled by the signal may have left the old one waiting
    // for a reply that will never be read.
    let connect = async {
        ControlClient::connect(&ZmqTransport::new(), &device.control_address)
            .await
            .ok()
    };
    let mut control = tokio::time::timeout(STOP_REQUEST_TIMEOUT, connect)
        .await
        .ok()
        .flatten();
    if drain_first && let Some(control) = control.as_mut() {
        wait_until_inputs_are_still(control).await;
    }
    let asked = match control.as_mut() {
        Some(control) => control
            .request(&LauncherToDevice::Shutdown, STOP_REQUEST_TIMEOUT)
            .await
            .is_ok(),
        None => false,
    };
    if !asked && let Some(pid) = device.child.id() {
        // No answer on the control endpoint (a loaded machine, a broken connection): SIGTERM
        // takes a device down just as cleanly, from any state.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    // The time to exit counts from the request, not from the start of the stage.
    *last_progress.lock().expect("progress lock") = Instant::now();
    let exited = loop {
        match tokio::time::timeout(Duration::from_millis(250), device.child.wait()).await {
            Ok(exited) => break exited.ok(),
            Err(_) => {
                let since = last_progress.lock().expect("progress lock").elapsed();
                if since >= STOP_TIMEOUT {
                    break None;
                }
            }
        }
    };
    match exited {
        Some(status) => {
            device.exited = Some(status);
            None
        }
        None => {
            eprintln!(
                "ferromq: device {:?} did not stop within {STOP_TIMEOUT:?} (in {}); killing it",
                device.instance.id, device.state
            );
            let _ = device.child.kill().await;
            Some(device.instance.id.clone())
        }
    }
}

/// Waits until the messages a device has received stop growing for [`QUIET_FOR`] (at most
/// [`DRAIN_TIMEOUT`]; a device that does not answer is not waited for).
async fn wait_until_inputs_are_still(control: &mut ControlClient) {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut last_count = None;
    let mut still_since = Instant::now();
    while Instant::now() < deadline {
        let Some(received) = received_by(control).await else {
            return;
        };
        if last_count != Some(received) {
            last_count = Some(received);
            still_since = Instant::now();
        } else if still_since.elapsed() >= QUIET_FOR {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a topology to its end; returns the exit code.
pub async fn run(options: RunOptions) -> ExitCode {
    let mut signals = match Signals::install() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("ferromq: cannot install signal handlers: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut topology = match load_topology(&options.file) {
        Ok(topology) => topology,
        Err(error) => {
            eprintln!("{error:#}");
            return ExitCode::from(2);
        }
    };
    if let Some(transport) = &options.transport {
        let built_in = crate::built_in_transports();
        if !built_in.contains(transport) {
            eprintln!(
                "ferromq: --transport {transport:?} is not built in (built in: {})",
                built_in.names().join(", ")
            );
            return ExitCode::from(2);
        }
        topology.transport.clone_from(transport);
    }
    let session = options
        .session
        .clone()
        .unwrap_or_else(|| format!("run-{}", std::process::id()));
    let session_dir = match crate::session_dir::SessionDir::acquire(&session) {
        Ok(session_dir) => session_dir,
        Err(error) => {
            eprintln!("ferromq: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let run_dir = session_dir.path().to_owned();
    let n_instances = topology.instances().len();
    Console::init(std::io::stdout().is_terminal());
    println!(
        "ferromq: {} ({n_instances} processes, session {session}, default transport {})",
        topology.file, topology.transport
    );
    let mut devices = Vec::new();
    let started = tokio::select! {
        started = start(&topology, &session, &run_dir, &mut devices) => started.map_err(|error| format!("{error:#}")),
        name = signals.next() => Ok(Some(name)),
    };
    let ending = match started {
        // A Ctrl-C during start-up is a stop like any other: everything goes down cleanly.
        Ok(Some(name)) => Ending::Signal(name),
        Ok(None) => supervise(&mut devices, options.duration, &mut signals).await,
        // A device that died while being started makes its control requests fail: name the death,
        // not the broken control connection it caused.
        Err(failure) => Ending::Failure(exited_device(&mut devices).await.map_or(
            failure,
            |(device, status)| {
                format!(
                    "device {:?} exited ({status}) while {}; its last lines:\n    {}",
                    device.instance.id,
                    device.state,
                    device.last_lines()
                )
            },
        )),
    };
    // The last table stays on screen; the stop's lines go below it.
    Console::global().finish();
    match &ending {
        Ending::Signal(name) => println!("ferromq: {name}: stopping every device (again to kill)"),
        Ending::Duration => println!("ferromq: duration reached: stopping every device"),
        Ending::Finished => println!("ferromq: every device finished its work: stopping"),
        Ending::Failure(_) => {}
    }
    // A failure stops everything at once; any other ending drains first.
    let drain = !matches!(ending, Ending::Failure(_));
    let forced = stop_all(&mut devices, &mut signals, drain).await;
    for device in &devices {
        if let Some(status) = device.exited.filter(|status| !status.success()) {
            eprintln!(
                "ferromq: device {:?} exited with {status}",
                device.instance.id
            );
        }
    }
    let outcome = match ending {
        Ending::Failure(failure) => Err(failure),
        _ if !forced.is_empty() => Err(format!(
            "stopped by force: {} killed",
            forced
                .iter()
                .map(|id| format!("{id:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ if devices
            .iter()
            .any(|device| device.exited.is_some_and(|status| !status.success())) =>
        {
            Err("a device did not exit cleanly".to_owned())
        }
        _ => Ok(()),
    };
    let removed =
        ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), &session, true)
            .unwrap_or_default();
    if !removed.is_empty() {
        println!(
            "ferromq: removed {} shared memory object(s) of session {session}",
            removed.len()
        );
    }
    drop(session_dir);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("ferromq: {failure}");
            ExitCode::FAILURE
        }
    }
}
