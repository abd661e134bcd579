//! Running one device in this process: control mode, signals, exit code.
//!
//! # Signals
//! The first SIGINT or SIGTERM takes the device down cleanly from whatever state it is in
//! (STOP, RESET TASK, RESET DEVICE, END; a device stuck in a working state is aborted). A second
//! one exits at once with code 130, saying how many messages that sends accepted had not left
//! yet (they may be lost with the process).
//!
//! # Exit code
//! 0 only when the device went down without passing through ERROR; otherwise 1, with the cause
//! on standard error. Bad options exit with 2 before anything starts.

use std::io::IsTerminal;
use std::process::ExitCode;

use ferromq_device::{
    Device, DeviceController, DeviceRunner, State, control, error_chain, presence,
};

use crate::interactive;
use crate::options::{ControlMode, DeviceOptions};

/// Runs `device` configured by `options` (and `extra_properties`) to the end; returns the
/// process exit code.
pub fn run_device<D: Device>(
    device: D,
    options: &DeviceOptions,
    extra_properties: &[(&str, String)],
) -> ExitCode {
    run_checked_device(device, options, extra_properties, |_| Ok(()))
}

/// [`run_device`] for a built-in device: its properties are checked as it will read them
/// ([`Builtin::check_properties`](ferromq_devices::Builtin::check_properties)) before anything
/// binds, a bad value being a usage error (exit 2) like a bad option's.
pub fn run_builtin_device(
    kind: ferromq_devices::Builtin,
    options: &DeviceOptions,
    extra_properties: &[(&str, String)],
) -> ExitCode {
    run_checked_device(kind.create(), options, extra_properties, |config| {
        let transport_properties = crate::built_in_transports().property_keys();
        kind.check_properties(&config.id, &config.properties, &transport_properties)
    })
}

fn run_checked_device<D: Device>(
    device: D,
    options: &DeviceOptions,
    extra_properties: &[(&str, String)],
    check: impl FnOnce(&ferromq_device::DeviceConfig) -> Result<(), ferromq_device::DeviceError>,
) -> ExitCode {
    crate::logging::init(
        &options.id,
        options.severity,
        options.verbosity,
        options.color,
    );
    let config = match options
        .device_config(extra_properties)
        .and_then(|config| check(&config).map(|()| config).map_err(Into::into))
    {
        Ok(config) => config,
        Err(error) => {
            eprintln!("ferromq: {error:#}");
            return ExitCode::from(2);
        }
    };
    let id = config.id.clone();
    let session = config.session.clone();
    crate::block_on(1, async move {
        if let Err(error) =
            crate::metrics_endpoint::export(options.metrics, options.otlp_endpoint.as_deref())
        {
            eprintln!("ferromq: {error:#}");
            return ExitCode::from(2);
        }
        let (runner, controller) = DeviceRunner::new(device, config, crate::built_in_transports());
        if crate::metrics_endpoint::serving() {
            tokio::spawn(ferromq_device::metrics::publish(controller.clone()));
        }
        let device_task = tokio::spawn(runner.run());
        tokio::spawn(handle_signals(controller.clone()));
        // Kept to the end: dropping it removes the entry `ferromq top` finds this device by.
        let _presence = observe(&controller, &session);
        let driven = drive(&controller, options).await;
        let outcome = match device_task.await {
            Err(error) => Err(format!("device task failed: {error}")),
            Ok(Err(error)) => Err(error_chain(&error)),
            Ok(Ok(())) => driven,
        };
        // The last figures (the device's end state) reach an OTLP receiver too.
        crate::metrics_endpoint::finish();
        match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(cause) => {
                eprintln!("ferromq: device {id:?} failed: {cause}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn drive(controller: &DeviceController, options: &DeviceOptions) -> Result<(), String> {
    let mut mode = options.control;
    if mode == ControlMode::Interactive && !std::io::stdin().is_terminal() {
        tracing::warn!("standard input is not a terminal: --control interactive runs as static");
        mode = ControlMode::Static;
    }
    match mode {
        ControlMode::Static => control::run_static(controller)
            .await
            .map_err(|error| error_chain(&error)),
        ControlMode::Interactive => interactive::run(controller)
            .await
            .map_err(|error| format!("{error:#}")),
        ControlMode::External => {
            tokio::spawn(follow_parent(controller.clone()));
            let address = options
                .control_address
                .as_deref()
                .expect("checked by device_config");
            let heartbeat = std::env::var(LAUNCHER_HEARTBEAT_ENV)
                .ok()
                .and_then(|ms| ms.parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .map(std::time::Duration::from_millis);
            let endpoint = control::ControlEndpoint {
                address: address.to_owned(),
                heartbeat,
                first_contact: control::FIRST_CONTACT_LIMIT,
                read_only: false,
            };
            let transport = ferromq_zmq::ZmqTransport::new();
            let served = control::serve_external_control(
                &transport,
                &endpoint,
                controller.clone(),
                |bound| {
                    use std::io::Write;
                    let mut stdout = std::io::stdout().lock();
                    let _ = writeln!(stdout, "{}", control::announcement(bound));
                    let _ = stdout.flush();
                },
            )
            .await;
            if let Err(gone @ ferromq_device::DeviceError::LauncherGone { .. }) = &served {
                // Its work is stuck (a send to a peer on a lost host) and nobody is left to
                // stop it: end the process rather than run on unattended.
                eprintln!("ferromq: {gone}; exiting");
                std::process::exit(1);
            }
            if served.is_err() {
                // The endpoint failed (it could not bind, say): nothing can control the device
                // any more, so it goes down now instead of idling until a signal.
                let _ = control::shut_down(controller).await;
            }
            served.map_err(|error| error_chain(&error))
        }
    }
}

/// Makes this device findable by `ferromq top`: a read-only control endpoint in this user's
/// presence directory, announced there once bound (see `ferromq_device::presence`). A device
/// that cannot be made observable runs all the same, with a warning.
fn observe(
    controller: &DeviceController,
    session: &str,
) -> Option<std::sync::Arc<presence::Presence>> {
    let presence = match presence::Presence::prepare(controller.id(), session) {
        Ok(presence) => presence,
        Err(error) => {
            tracing::warn!(%error, "ferromq top will not see this device");
            return None;
        }
    };
    let endpoint = control::ControlEndpoint {
        address: presence.observe_address().to_owned(),
        heartbeat: None,
        first_contact: std::time::Duration::ZERO,
        read_only: true,
    };
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let observed = controller.clone();
    tokio::spawn(async move {
        let transport = ferromq_zmq::ZmqTransport::new();
        let served = control::serve_external_control(&transport, &endpoint, observed, |_| {
            let _ = bound_tx.send(());
        });
        if let Err(error) = served.await {
            tracing::warn!(error = %error_chain(&error), "ferromq top will not see this device");
        }
    });
    let presence = std::sync::Arc::new(presence);
    let announced = std::sync::Arc::clone(&presence);
    tokio::spawn(async move {
        if bound_rx.await.is_ok()
            && let Err(error) = announced.publish()
        {
            tracing::warn!(%error, "ferromq top will not see this device");
        }
    });
    Some(presence)
}

/// The environment variable in which `ferromq run` gives its devices its process id.
pub(crate) const LAUNCHER_PID_ENV: &str = "FERROMQ_LAUNCHER_PID";

/// The environment variable in which a launcher on another host gives its devices the longest
/// silence (milliseconds) after which they take it for gone (see
/// `ferromq_device::control::ControlEndpoint::heartbeat`).
pub(crate) const LAUNCHER_HEARTBEAT_ENV: &str = "FERROMQ_LAUNCHER_HEARTBEAT_MS";

/// The process that started this one and that it goes when it goes: the parent named by
/// [`LAUNCHER_PID_ENV`] (so that a launcher that died before this process looked is noticed
/// too), or else the parent now. Read it first thing: a parent that dies hands the process to
/// init or a subreaper.
pub(crate) fn launcher() -> nix::unistd::Pid {
    std::env::var(LAUNCHER_PID_ENV)
        .ok()
        .and_then(|pid| pid.parse::<i32>().ok())
        .map_or_else(nix::unistd::getppid, nix::unistd::Pid::from_raw)
}

/// Resolves once this process's parent is not `launcher` ([`launcher`]): it died, by SIGKILL
/// or an abort too, where it could stop nothing itself. Compares every 250 ms (the cli crate
/// forbids the unsafe `prctl(PR_SET_PDEATHSIG)`).
pub(crate) async fn launcher_gone(launcher: nix::unistd::Pid) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
    loop {
        tick.tick().await;
        if nix::unistd::getppid() != launcher {
            return;
        }
    }
}

/// A device driven by a launcher goes down when its launcher dies, so that no device is left
/// running without anybody to stop it.
async fn follow_parent(controller: DeviceController) {
    launcher_gone(launcher()).await;
    tracing::warn!("the launcher is gone; going down");
    controller.abort("the launcher exited");
    let _ = control::shut_down(&controller).await;
}

async fn handle_signals(controller: DeviceController) {
    let Ok(mut signals) = crate::Signals::install() else {
        tracing::warn!(
            "cannot install signal handlers; Ctrl-C will kill the device without teardown"
        );
        return;
    };
    let name = signals.next().await;
    tracing::info!("{name} received, going down (again to exit at once)");
    let state = controller.state();
    // INITIALIZING DEVICE too: making a zeroed or locked shared-memory segment there takes
    // seconds (23 s for 8 GiB here), and the signal waited for all of it.
    if matches!(
        state,
        State::Running
            | State::InitializingDevice
            | State::Binding
            | State::Connecting
            | State::InitializingTask
            | State::ResettingTask
    ) {
        // Only that state: one the device left meanwhile by itself (a RUNNING that reached
        // its --max-iterations as the signal came) is not failed; `shut_down` below takes it
        // down cleanly, its channels' closes reporting what they lost.
        controller.abort_in(state, format!("{name} received in {state}"));
    }
    let shutdown = {
        let controller = controller.clone();
        tokio::spawn(async move { control::shut_down(&controller).await })
    };
    tokio::select! {
        _ = signals.next() => {}
        _ = shutdown => return,
    }
    crate::interactive::restore_terminal();
    eprintln!(
        "ferromq: second signal, exiting now{}",
        abandoned(&controller.counters())
    );
    std::process::exit(130);
}

/// What a device that exits at once leaves behind: the messages its channels' sends accepted
/// and had not handed on (`queued`: zeromq's not yet written to the kernel, shmem's not yet
/// taken as of its last look), which may be lost with the process. Empty when there are none.
fn abandoned(counters: &[(String, ferromq_core::CounterSnapshot)]) -> String {
    let waiting: Vec<String> = counters
        .iter()
        .filter(|(_, counters)| counters.queued > 0)
        .map(|(name, counters)| format!("{name}: {}", counters.queued))
        .collect();
    if waiting.is_empty() {
        return String::new();
    }
    let total: u64 = counters.iter().map(|(_, counters)| counters.queued).sum();
    format!(
        "; {total} message(s) accepted by send had not left yet and may be lost ({})",
        waiting.join(", ")
    )
}
