//! `ferromq run FILE`: one process per device, driven through the state machine in step.
//!
//! 1. Load and check the topology (every error with file:line:col) as it will run, with
//!    `--transport` in place of the file's `transport`; nothing starts on an error.
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
//! 7. Afterwards the session's shared memory is removed, whatever happened, unless a process
//!    that is not one of this run's devices (one started by hand into the session) still uses
//!    it: then all of it stays for the last process of the session (or its watchdog), and the
//!    launcher says so.
//!
//!
//! Devices may run on other hosts (`--launcher ssh|slurm`): `hosts.rs` places every instance,
//! `process.rs` starts it there and signals it, and the steps above are the same everywhere.
//!
//! `start.rs` does 2 and 3, `supervise.rs` 4 and the decision to stop, `stop.rs` 5; this file
//! loads the topology, runs the whole, and turns how it ended into the exit code (6, 7).

use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Signals;
use crate::console::Console;
use anyhow::{Context, Result, anyhow, bail};
use ferromq_device::State;
use ferromq_device::control::{ControlClient, DeviceToLauncher, LauncherToDevice};
use ferromq_devices::Builtin;
use ferromq_topology::{Instance, Known, Topology};

mod hosts;
mod process;
mod restart;
mod start;
mod stop;
mod supervise;

pub use self::hosts::LauncherKind;
pub use self::process::run_slurm_task;

use self::stop::stop_all;
use self::supervise::{Ending, exited_device};

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
    /// How devices are started (here, through ssh, as Slurm tasks).
    pub launcher: LauncherKind,
    /// Hosts by position, for devices placed by index (`host = 1`) with `--launcher ssh`.
    pub hosts: Vec<String>,
    /// Print the sbatch script for the topology instead of running it.
    pub print_batch: bool,
    /// Serve Prometheus metrics of every device here.
    pub metrics: Option<std::net::SocketAddr>,
    /// Or push them to this OTLP/HTTP receiver.
    pub otlp_endpoint: Option<String>,
}

impl RunOptions {
    /// The options a batch job's `ferromq run` is given (`--print-batch`): those that change
    /// what runs or how it is watched, as given here. `--launcher` is the script's own, and
    /// `--hosts` (positions for `--launcher ssh`) Slurm's allocation replaces.
    fn passed_on(&self) -> Vec<String> {
        let mut options = Vec::new();
        let mut pass = |name: &str, value: String| {
            options.push(name.to_owned());
            options.push(value);
        };
        if let Some(transport) = &self.transport {
            pass("--transport", transport.clone());
        }
        if let Some(duration) = self.duration {
            pass("--duration", duration.as_secs_f64().to_string());
        }
        if let Some(session) = &self.session {
            pass("--session", session.clone());
        }
        if let Some(metrics) = self.metrics {
            pass("--metrics", metrics.to_string());
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            pass("--otlp-endpoint", endpoint.clone());
        }
        options
    }
}

/// Loads and checks a topology file for this binary's kinds and transports; `transport`: the
/// transport its channels that name none run on instead of the file's (`--transport`), which
/// they are checked with too.
///
/// # Errors
/// The file cannot be read, or every validation error, one per line.
pub fn load_topology(file: &Path, transport: Option<&str>) -> Result<Topology> {
    let text = crate::config_file::read_config(file, "topology")?;
    let kinds = Builtin::names();
    let registry = crate::built_in_transports();
    let transports = registry.names();
    let transport_properties = registry.property_keys();
    let transport_schemes = registry.schemes();
    let known = Known {
        kinds: &kinds,
        transports: &transports,
        transport_properties: &transport_properties,
        transport_schemes: &transport_schemes,
        rpc_group_keys: &ferromq_rpc::GROUP_KEYS,
        check_properties: Some(ferromq_devices::check_topology_properties),
        required_channels: Some(ferromq_devices::required_channels),
    };
    let file = file.display().to_string();
    match transport {
        None => ferromq_topology::load(&file, &text, &known),
        Some(transport) => ferromq_topology::load_with_transport(&file, &text, &known, transport),
    }
    .map_err(|errors| anyhow!("{errors}"))
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Running {
    instance: Instance,
    /// The name of the host it runs on.
    host: String,
    control_address: String,
    process: process::DeviceProcess,
    /// Shared with the heartbeat task, which speaks only when no request is under way.
    control: Option<Arc<tokio::sync::Mutex<ControlClient>>>,
    /// For a device on another host: the task that keeps telling it the launcher lives.
    heartbeat: Option<AbortOnDrop>,
    last_lines: Arc<Mutex<VecDeque<String>>>,
    state: State,
    /// When the launcher first saw it in `state`.
    state_since: std::time::Instant,
    counters: BTreeMap<String, ferromq_core::CounterSnapshot>,
    exited: Option<std::process::ExitStatus>,
    /// How many times it was started again (`restart.rs`).
    restarts: u32,
    /// Why the topology went on without it, once it ended and was expendable.
    left_behind: Option<String>,
    /// Its process's leftovers were looked for when its exit was handled (`restart.rs`): the
    /// stop's look passes it by, since its group's id may belong to another process by then.
    leftovers_looked_for: bool,
}

impl Running {
    /// ` on HOST` for a device on another host, nothing for one here.
    fn on_host(&self) -> String {
        if self.host == "localhost" {
            String::new()
        } else {
            format!(" on {}", self.host)
        }
    }

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
            .clone()
            .ok_or_else(|| anyhow!("device {id:?} has no control connection"))?;
        let mut control = control.lock().await;
        // A device that dies (or whose host is lost) while asked answers at once: with its exit.
        let mut exits = self.process.exits();
        let reply = tokio::select! {
            reply = control.request(request, CONTROL_TIMEOUT) => {
                reply.with_context(|| format!("device {id:?}"))?
            }
            _ = exits.wait_for(Option::is_some) => bail!("device {id:?} exited while asked"),
        };
        if reply.state != self.state {
            self.state_since = std::time::Instant::now();
        }
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

/// Runs a topology to its end; returns the exit code.
pub async fn run(options: RunOptions) -> ExitCode {
    let mut signals = match Signals::install() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("ferromq: cannot install signal handlers: {error:#}");
            return ExitCode::FAILURE;
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
    }
    // Checked as it will run: the channels that name no transport on `--transport`'s.
    let topology = match load_topology(&options.file, options.transport.as_deref()) {
        Ok(topology) => topology,
        Err(error) => {
            eprintln!("{error:#}");
            if let Some(transport) = &options.transport {
                eprintln!(
                    "ferromq: checked as it would run: on --transport {transport}, every channel that names no transport"
                );
            }
            return ExitCode::from(2);
        }
    };
    if options.print_batch {
        return match hosts::batch_script(&topology, &options.file, &options.passed_on()) {
            Ok(script) => {
                print!("{script}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("ferromq: {error:#}");
                ExitCode::from(2)
            }
        };
    }
    if let Err(error) =
        crate::metrics_endpoint::export(options.metrics, options.otlp_endpoint.as_deref())
    {
        eprintln!("ferromq: {error:#}");
        return ExitCode::from(2);
    }
    let registry = crate::built_in_transports();
    let one_host: Vec<&str> = registry
        .names()
        .into_iter()
        .filter(|name| registry.traits(name).is_ok_and(|traits| traits.one_host))
        .collect();
    let placement = match hosts::place(
        &topology,
        &topology.instances(),
        options.launcher,
        &options.hosts,
        &one_host,
    ) {
        Ok(placement) => placement,
        Err(error) => {
            eprintln!("ferromq: {error:#}");
            return ExitCode::from(2);
        }
    };
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
    let on_hosts = if placement.spans_hosts() {
        format!(
            " on {}",
            placement
                .hosts
                .iter()
                .map(|host| host.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        String::new()
    };
    println!(
        "ferromq: {} ({n_instances} processes{on_hosts}, session {session}, default transport {})",
        topology.file, topology.transport
    );
    let mut wiring = start::Wiring::new(&topology, &placement, &session, &run_dir);
    if let Err(error) = restart::check_policies(&wiring) {
        eprintln!("ferromq: {error:#}");
        return ExitCode::from(2);
    }
    let mut devices = Vec::new();
    let launched_at = std::time::Instant::now();
    let started = tokio::select! {
        started = start::start(&mut wiring, &mut devices) => started.map(|()| None).map_err(|error| format!("{error:#}")),
        name = signals.next() => Ok(Some(name)),
    };
    let ending = match started {
        // A Ctrl-C during start-up is a stop like any other: everything goes down cleanly.
        Ok(Some(name)) => Ending::Signal(name),
        Ok(None) => {
            println!(
                "ferromq: {n_instances} devices RUNNING {:.2} s after the launch began",
                launched_at.elapsed().as_secs_f64()
            );
            supervise::supervise(&mut devices, &mut wiring, options.duration, &mut signals).await
        }
        // A device that died while being started makes its control requests fail: name the death,
        // not the broken control connection it caused.
        Err(failure) => Ending::Failure(
            exited_device(&mut devices)
                .await
                .map_or(failure, |idx| supervise::exit_failure(&devices, idx)),
        ),
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
        if let Some(reason) = &device.left_behind {
            eprintln!(
                "ferromq: device {:?}{} ended ({}) and the topology went on without it: {reason}",
                device.instance.id,
                device.on_host(),
                device
                    .exited
                    .map_or_else(|| "unknown status".to_owned(), |status| status.to_string())
            );
            continue;
        }
        if device.restarts > 0 {
            println!(
                "ferromq: device {:?} was restarted {} time(s)",
                device.instance.id, device.restarts
            );
        }
        if let Some(status) = device.exited.filter(|status| !status.success()) {
            eprintln!(
                "ferromq: device {:?}{} exited with {status}",
                device.instance.id,
                device.on_host()
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
        _ if devices.iter().any(|device| {
            device.left_behind.is_none() && device.exited.is_some_and(|status| !status.success())
        }) =>
        {
            Err("a device did not exit cleanly".to_owned())
        }
        _ => Ok(()),
    };
    // ssh failing (255) means its host was unreachable or lost.
    let lost: std::collections::BTreeSet<String> = devices
        .iter()
        .filter(|device| device.process.lost_its_host())
        .map(|device| device.host.clone())
        .collect();
    // Devices of this run that have not exited (a kill that took longer than its wait), by
    // their pid here, to name them if they still hold the session's memory.
    let not_exited: BTreeMap<u32, String> = devices
        .iter()
        .filter(|device| device.exited.is_none())
        .filter_map(|device| Some((device.process.local_pid()?, device.instance.id.clone())))
        .collect();
    drop(devices);
    stop::clean_other_hosts(&placement, &session, &lost).await;
    stop::clean_this_host(&session, not_exited).await;
    drop(session_dir);
    crate::metrics_endpoint::finish();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("ferromq: {failure}");
            ExitCode::FAILURE
        }
    }
}
