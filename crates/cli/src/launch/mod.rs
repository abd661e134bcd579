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
//!
//! `start.rs` does 2 and 3, `supervise.rs` 4 and the decision to stop, `stop.rs` 5; this file
//! loads the topology, runs the whole, and turns how it ended into the exit code (6, 7).

use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use ferromq_device::State;
use ferromq_device::control::{ControlClient, DeviceToLauncher, LauncherToDevice};
use ferromq_devices::Builtin;
use ferromq_topology::{Instance, Known, Topology};
use tokio::process::Child;

use crate::console::Console;

mod start;
mod stop;
mod supervise;

use self::stop::stop_all;
use self::supervise::{Ending, Signals, exited_device};

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
        started = start::start(&topology, &session, &run_dir, &mut devices) => started.map_err(|error| format!("{error:#}")),
        name = signals.next() => Ok(Some(name)),
    };
    let ending = match started {
        // A Ctrl-C during start-up is a stop like any other: everything goes down cleanly.
        Ok(Some(name)) => Ending::Signal(name),
        Ok(None) => supervise::supervise(&mut devices, options.duration, &mut signals).await,
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
