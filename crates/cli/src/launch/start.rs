//! Starting a topology: one process per instance, on its host (`hosts.rs`, `process.rs`), each
//! driven over its control endpoint, and stepping them together (all bound before any
//! connects, addresses handed from binders to connectors). A device that fails to start stops
//! the start; the caller stops what runs.
//!
//! Every device announces its control endpoint once bound (a tcp port on another host cannot
//! be guessed); the launcher connects to what it announced. Devices on other hosts are sent a
//! request at least every second (a heartbeat task per device shares the launcher's connection
//! to it) and go down after [`HEARTBEAT_LIMIT`] of silence (a minute before the first
//! request), so a launcher that dies leaves nothing running there.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use ferromq_core::{Address, Method, TcpHost};
use ferromq_device::control::{ControlClient, LauncherToDevice};
use ferromq_device::{State, Transition};
use ferromq_topology::{AutoAddress, DeviceKind, Instance, Topology};
use ferromq_zmq::ZmqTransport;

use super::hosts::{Host, Placement, StartOn};
use super::process::{self, DeviceCommand, OutputSink, SlurmTask};
use super::{CONTROL_TIMEOUT, Running};

/// How long a device on another host waits for a request before it takes its launcher for
/// gone (`FERROMQ_LAUNCHER_HEARTBEAT_MS`).
pub(super) const HEARTBEAT_LIMIT: Duration = Duration::from_secs(5);
/// How often the launcher's heartbeat task talks to a device on another host.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// What a launch knows beyond each device: enough to start any of them again the same way
/// (`restart.rs`).
pub(super) struct Wiring<'a> {
    pub(super) topology: &'a Topology,
    pub(super) placement: &'a Placement,
    pub(super) session: &'a str,
    pub(super) run_dir: &'a Path,
    /// For every binding `(instance, socket)`, the instances that connect to it.
    connectors: BTreeMap<(String, String), Vec<String>>,
    /// What every binder bound, by `(instance, socket)`: a restarted binder binds it again, so
    /// its connectors (which reconnect on their own) find it where it was.
    pub(super) bound: BTreeMap<(String, String), String>,
}

impl<'a> Wiring<'a> {
    pub(super) fn new(
        topology: &'a Topology,
        placement: &'a Placement,
        session: &'a str,
        run_dir: &'a Path,
    ) -> Wiring<'a> {
        Wiring {
            topology,
            placement,
            session,
            run_dir,
            connectors: connectors_of(&topology.instances()),
            bound: BTreeMap::new(),
        }
    }

    /// Whether any device connects to `(instance, socket)`.
    pub(super) fn has_connectors(&self, instance: &str, socket: &str) -> bool {
        self.connectors
            .get(&(instance.to_owned(), socket.to_owned()))
            .is_some_and(|connectors| !connectors.is_empty())
    }

    /// The command that starts `instance` on its host; a binder that bound before binds the
    /// same address again.
    pub(super) fn command(&self, instance: &Instance) -> DeviceCommand {
        device_command(self, instance)
    }
}

/// Whether the instances `a` and `b` run on one host.
fn same_host(placement: &Placement, a: &str, b: &str) -> bool {
    placement.host_of[a] == placement.host_of[b]
}

fn auto_bind_address(
    topology: &Topology,
    placement: &Placement,
    run_dir: &Path,
    instance: &Instance,
    config: &ferromq_core::ChannelConfig,
    connectors: &[String],
) -> String {
    let socket = &config.name;
    let host = placement.host(&instance.id);
    let transport = config.transport.as_deref().unwrap_or(&topology.transport);
    let binds_ipc = crate::built_in_transports()
        .traits(transport)
        .is_ok_and(|traits| traits.binds_ipc);
    let all_here = connectors
        .iter()
        .all(|connector| same_host(placement, connector, &instance.id));
    if !all_here {
        // Peers on other hosts reach it at its host's address.
        return format!("tcp://{}:0", bracketed(&host.address));
    }
    if !binds_ipc {
        // ofi goes between hosts: a tcp side channel, never ipc.
        return format!("tcp://{}:0", bracketed(&host.address));
    }
    match topology.auto_address {
        // The run directory exists on the launcher's host only. One ipc path takes one socket:
        // a channel of several (`numSockets`) binds each on loopback tcp, its own port (all on
        // one path, the second failed with "address in use").
        AutoAddress::Ipc if host.is_here() && config.num_sockets <= 1 => {
            format!("ipc://{}/{}.{socket}.ipc", run_dir.display(), instance.id)
        }
        AutoAddress::Ipc | AutoAddress::Tcp => "tcp://127.0.0.1:0".to_owned(),
    }
}

fn bracketed(address: &str) -> String {
    if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]")
    } else {
        address.to_owned()
    }
}

/// The address a device on `connector_host` connects to for what a device on `binder_host`
/// bound: a wildcard, or a loopback address seen from another host, becomes the binder host's
/// address.
fn reachable(bound: &str, binder_host: &Host, connector_host: &Host) -> String {
    let Ok(address) = Address::parse(bound) else {
        return bound.to_owned();
    };
    let elsewhere = binder_host != connector_host;
    let (scheme, host, port) = match &address {
        Address::Tcp { host, port } => ("tcp", host, *port),
        Address::Verbs { host, port } => ("verbs", host, *port),
        _ => return address.to_string(),
    };
    let (wildcard, loopback) = match host {
        TcpHost::Any => (true, false),
        TcpHost::Name(name) => (
            matches!(name.as_str(), "0.0.0.0" | "::"),
            matches!(name.as_str(), "127.0.0.1" | "localhost" | "::1"),
        ),
    };
    if wildcard && !elsewhere {
        return format!("{scheme}://127.0.0.1:{port}");
    }
    if wildcard || (loopback && elsewhere) {
        return format!("{scheme}://{}:{port}", bracketed(&binder_host.address));
    }
    address.to_string()
}

/// The command that starts `instance` on its host.
fn device_command(wiring: &Wiring<'_>, instance: &Instance) -> DeviceCommand {
    let Wiring {
        topology,
        placement,
        session,
        run_dir,
        connectors,
        bound,
    } = wiring;
    let host = placement.host(&instance.id);
    let (program, mut args) = match &instance.kind {
        DeviceKind::Builtin(kind) => (
            host.ferromq.clone(),
            vec!["device".to_owned(), kind.clone()],
        ),
        DeviceKind::Exec(argv) => (argv[0].clone(), argv[1..].to_vec()),
    };
    let control_address = if host.is_here() {
        format!("ipc://{}/{}.control", run_dir.display(), instance.id)
    } else {
        format!("tcp://{}:0", bracketed(&host.address))
    };
    let mut push = |items: &[&str]| args.extend(items.iter().map(|item| (*item).to_owned()));
    // `--key=value` where a value may start with `-` (an id "--help", a session "-x"): given
    // as the next word, the device took it for an option of its own.
    push(&[
        &format!("--id={}", instance.id),
        &format!("--session={session}"),
        "--transport",
        &topology.transport,
        "--control",
        "external",
        "--control-address",
        &control_address,
        "--max-iterations",
        &instance.max_iterations.to_string(),
    ]);
    if !std::io::stdout().is_terminal() || !host.is_here() {
        push(&["--color", "false"]);
    }
    for channel in &instance.channels {
        let mut config = channel.config.clone();
        if config.method == Method::Bind && config.address.is_none() {
            let key = (instance.id.clone(), config.name.clone());
            let peers = connectors.get(&key).map_or(&[][..], Vec::as_slice);
            // Started again: where it bound before (a tcp port 0 became a real port), so that
            // its connectors find it there. A channel of several sockets binds each anew.
            let before = bound.get(&key).filter(|_| config.num_sockets <= 1);
            config.address = Some(before.cloned().unwrap_or_else(|| {
                auto_bind_address(topology, placement, run_dir, instance, &config, peers)
            }));
        }
        push(&["--channel-config", &config.to_key_values()]);
    }
    for (key, value) in &instance.properties {
        push(&[&format!("--property={key}={value}")]);
    }
    let [index_key, count_key] = ferromq_topology::LAUNCHER_PROPERTIES;
    push(&[
        &format!("--property={index_key}={}", instance.replica_index),
        &format!("--property={count_key}={}", instance.replica_count),
    ]);
    let mut env = Vec::new();
    if !host.is_here() {
        env.push((
            crate::run::LAUNCHER_HEARTBEAT_ENV.to_owned(),
            HEARTBEAT_LIMIT.as_millis().to_string(),
        ));
    }
    DeviceCommand { program, args, env }
}

/// For every binding `(instance, socket)`, the instances that connect to it.
fn connectors_of(instances: &[Instance]) -> BTreeMap<(String, String), Vec<String>> {
    let mut connectors: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for instance in instances {
        for channel in &instance.channels {
            for (target, socket) in &channel.connect_to {
                connectors
                    .entry((target.clone(), socket.clone()))
                    .or_default()
                    .push(instance.id.clone());
            }
        }
    }
    connectors
}

/// Asks a device on another host for its state every [`HEARTBEAT_EVERY`], so that it knows
/// its launcher lives (see [`HEARTBEAT_LIMIT`]), over the launcher's own connection to it: a
/// beat is skipped while a request is under way, which the device counts as life too (a
/// second connection per device would double the launcher's sockets). Runs until aborted.
async fn heartbeat(control: std::sync::Arc<tokio::sync::Mutex<ControlClient>>) {
    loop {
        tokio::time::sleep(HEARTBEAT_EVERY).await;
        if let Ok(mut client) = control.try_lock() {
            // A failed beat is the launcher's business when it next asks; the device's
            // exit is watched elsewhere.
            let _ = client
                .request(&LauncherToDevice::State, CONTROL_TIMEOUT)
                .await;
        }
    }
}

/// Steps every device through `transition`, then waits until all are in `target`; every
/// device is asked at once (one slow device does not hold the others' requests back).
pub(super) async fn step_all(
    devices: &mut [Running],
    transition: Transition,
    target: Option<State>,
) -> Result<()> {
    let results = futures_util::future::join_all(devices.iter_mut().map(|device| async move {
        device
            .request(&LauncherToDevice::Transition { transition })
            .await?;
        if let Some(state) = target {
            let timeout_ms = Some(CONTROL_TIMEOUT.as_millis() as u64);
            device
                .request(&LauncherToDevice::WaitForState { state, timeout_ms })
                .await?;
        }
        Ok::<(), anyhow::Error>(())
    }))
    .await;
    results.into_iter().collect()
}

/// Hands every connecting channel the addresses its binders bound (as reachable from the
/// connector's host). Every device is asked at once, as in [`step_all`]: with a thousand
/// devices, one round trip after the other would take seconds.
pub(super) async fn wire_connections(
    devices: &mut [Running],
    wiring: &mut Wiring<'_>,
) -> Result<()> {
    let replies = futures_util::future::join_all(devices.iter_mut().map(|device| async move {
        let reply = device.request(&LauncherToDevice::Channels).await?;
        Ok::<_, anyhow::Error>((device.instance.id.clone(), reply.value))
    }))
    .await;
    for reply in replies {
        let (id, value) = reply?;
        let Some(serde_json::Value::Object(channels)) = value else {
            continue;
        };
        for (socket, address) in channels {
            if let Some(address) = address.as_str() {
                wiring
                    .bound
                    .insert((id.clone(), socket), address.to_owned());
            }
        }
    }
    let mut plans = Vec::with_capacity(devices.len());
    for device in devices.iter() {
        plans.push(connect_settings(device, wiring.placement, &wiring.bound)?);
    }
    let results = futures_util::future::join_all(devices.iter_mut().zip(plans).map(
        |(device, settings)| async move {
            for (key, value) in settings {
                device
                    .request(&LauncherToDevice::SetProperty { key, value })
                    .await?;
            }
            Ok::<(), anyhow::Error>(())
        },
    ))
    .await;
    results.into_iter().collect()
}

/// The `chan.<socket>.address` properties that tell `device`'s connecting channels where their
/// binders are, given what every binder bound.
fn connect_settings(
    device: &Running,
    placement: &Placement,
    bound: &BTreeMap<(String, String), String>,
) -> Result<Vec<(String, String)>> {
    let connector_host = placement.host(&device.instance.id);
    let mut all = Vec::new();
    for channel in &device.instance.channels {
        if channel.connect_to.is_empty() {
            continue;
        }
        let mut addresses = Vec::new();
        for (target, socket) in &channel.connect_to {
            let address = bound
                .get(&(target.clone(), socket.clone()))
                .or_else(|| bound.get(&(target.clone(), format!("{socket}[0]"))))
                .ok_or_else(|| anyhow!("device {target:?} did not bind {socket:?}"))?;
            addresses.push(reachable(address, placement.host(target), connector_host));
        }
        let name = &channel.config.name;
        let n_sockets = channel.config.num_sockets;
        if n_sockets > 1 && addresses.len() == n_sockets {
            // As many sockets as targets: socket i connects to the i-th target.
            all.extend(addresses.iter().enumerate().map(|(socket_idx, address)| {
                (
                    format!("chan.{name}[{socket_idx}].address"),
                    address.clone(),
                )
            }));
        } else if n_sockets > 1 {
            all.extend((0..n_sockets).map(|socket_idx| {
                (
                    format!("chan.{name}[{socket_idx}].address"),
                    addresses.join(";"),
                )
            }));
        } else {
            all.push((format!("chan.{name}.address"), addresses.join(";")));
        }
    }
    Ok(all)
}

/// Starts every instance on its host: directly, through ssh, or as tasks of one srun step.
fn spawn_all(wiring: &Wiring<'_>, devices: &mut Vec<Running>) -> Result<()> {
    let Wiring {
        placement, run_dir, ..
    } = wiring;
    let instances = wiring.topology.instances();
    let show_hosts = placement.spans_hosts();
    let mut slurm_tasks: Vec<(usize, SlurmTask)> = Vec::new();
    let mut started: Vec<Option<process::DeviceProcess>> = Vec::new();
    let mut sinks = Vec::new();
    for instance in &instances {
        let host = placement.host(&instance.id);
        let command = wiring.command(instance);
        let sink = OutputSink::new(&instance.id, show_hosts.then(|| host.name.clone()));
        let spawned = match &host.start {
            StartOn::Here => Some(process::spawn_here(&command, &sink)),
            StartOn::Ssh(destination) => Some(process::spawn_ssh(destination, &command, &sink)),
            StartOn::Slurm { node, .. } => {
                slurm_tasks.push((
                    started.len(),
                    SlurmTask {
                        node: node.clone(),
                        command: command.clone(),
                        sink: sink.clone(),
                    },
                ));
                None
            }
        };
        let spawned = spawned
            .transpose()
            .map_err(|error| anyhow!("cannot start device {:?}: {error:#}", instance.id))?;
        started.push(spawned);
        sinks.push(sink);
    }
    if let Some((_, first)) = slurm_tasks.first() {
        let StartOn::Slurm { job, .. } = &placement.host(&instances[0].id).start else {
            unreachable!("every host of a slurm placement is a node");
        };
        let ferromq = placement.hosts.first().map_or_else(
            || first.command.program.clone(),
            |host| host.ferromq.clone(),
        );
        let (indices, tasks): (Vec<usize>, Vec<SlurmTask>) = slurm_tasks.into_iter().unzip();
        let processes =
            process::spawn_slurm(job, &tasks, &run_dir.join("slurm-hostfile"), &ferromq)?;
        for (idx, process) in indices.into_iter().zip(processes) {
            started[idx] = Some(process);
        }
    }
    for ((instance, process), sink) in instances.into_iter().zip(started).zip(sinks) {
        let host = placement.host(&instance.id).name.clone();
        devices.push(Running {
            instance,
            host,
            control_address: String::new(),
            process: process.expect("every instance was started"),
            control: None,
            heartbeat: None,
            last_lines: sink.last_lines(),
            state: State::Idle,
            state_since: std::time::Instant::now(),
            counters: BTreeMap::new(),
            exited: None,
            restarts: 0,
            left_behind: None,
            leftovers_looked_for: false,
        });
    }
    Ok(())
}

/// Waits for `device` to announce its control endpoint, connects to it, and on another host
/// starts its heartbeat.
pub(super) async fn connect_control(device: &mut Running, host: &Host) -> Result<()> {
    let mut announced = device.process.announced();
    let announcement = tokio::select! {
        announcement = tokio::time::timeout(CONTROL_TIMEOUT, announced.wait_for(Option::is_some)) => {
            let announcement = announcement.map_err(|_| anyhow!(
                "device {:?}{} opened no control endpoint within {CONTROL_TIMEOUT:?}; its last lines:\n    {}",
                device.instance.id, device.on_host(), device.last_lines()
            ))?;
            announcement.ok().and_then(|announcement| announcement.clone())
        }
        status = device.process.wait() => {
            let status = status.map_or_else(|| "unknown status".to_owned(), |status| status.to_string());
            bail!("device {:?}{} exited at start ({status}):\n    {}", device.instance.id, device.on_host(), device.last_lines());
        }
    };
    let (address, _pid) =
        announcement.ok_or_else(|| anyhow!("device {:?} announced nothing", device.instance.id))?;
    let address = reachable(&address, host, host);
    let transport = ZmqTransport::new();
    let control = std::sync::Arc::new(tokio::sync::Mutex::new(
        ControlClient::connect(&transport, &address).await?,
    ));
    if !host.is_here() {
        device.heartbeat = Some(super::AbortOnDrop(tokio::spawn(heartbeat(control.clone()))));
    }
    device.control = Some(control);
    device.control_address = address;
    Ok(())
}

pub(super) async fn start(wiring: &mut Wiring<'_>, devices: &mut Vec<Running>) -> Result<()> {
    spawn_all(wiring, devices)?;
    let placement = wiring.placement;
    let connected = futures_util::future::join_all(devices.iter_mut().map(|device| {
        let host = placement.host(&device.instance.id).clone();
        async move { connect_control(device, &host).await }
    }))
    .await;
    connected.into_iter().collect::<Result<Vec<()>>>()?;
    drive_to_running(devices, wiring).await
}

/// Steps `devices`, connected to their control endpoints, from IDLE to RUNNING together: all
/// bound before any connects, connectors told where their binders are.
pub(super) async fn drive_to_running(
    devices: &mut [Running],
    wiring: &mut Wiring<'_>,
) -> Result<()> {
    step_all(devices, Transition::InitDevice, None).await?;
    step_all(devices, Transition::CompleteInit, Some(State::Initialized)).await?;
    step_all(devices, Transition::Bind, Some(State::Bound)).await?;
    wire_connections(devices, wiring).await?;
    step_all(devices, Transition::Connect, Some(State::DeviceReady)).await?;
    step_all(devices, Transition::InitTask, Some(State::Ready)).await?;
    step_all(devices, Transition::Run, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, address: &str, start: StartOn) -> Host {
        Host {
            name: name.to_owned(),
            address: address.to_owned(),
            ferromq: "ferromq".to_owned(),
            start,
        }
    }

    #[test]
    fn a_peer_on_another_host_connects_to_the_binders_host_address() {
        let here = host("localhost", "127.0.0.1", StartOn::Here);
        let far = host("n2", "10.0.0.2", StartOn::Ssh("n2".to_owned()));
        // (bound, binder's host, connector's host) -> what the connector is given.
        let cases = [
            ("tcp://0.0.0.0:5000", &far, &here, "tcp://10.0.0.2:5000"),
            ("tcp://127.0.0.1:5000", &far, &here, "tcp://10.0.0.2:5000"),
            ("tcp://127.0.0.1:5000", &far, &far, "tcp://127.0.0.1:5000"),
            ("tcp://0.0.0.0:5000", &here, &here, "tcp://127.0.0.1:5000"),
            ("tcp://10.0.0.2:7", &far, &here, "tcp://10.0.0.2:7"),
            ("ipc:///tmp/x.ipc", &here, &here, "ipc:///tmp/x.ipc"),
        ];
        for (bound, binder, connector, given) in cases {
            assert_eq!(reachable(bound, binder, connector), given, "{bound}");
        }
    }
}
