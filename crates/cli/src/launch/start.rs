//! Starting a topology: one process per instance, each driven over its control endpoint, and
//! stepping them together (all bound before any connects, addresses handed from binders to
//! connectors). A device that fails to start stops the start; the caller stops what runs.

use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};
use ferromq_core::{Address, Method};
use ferromq_device::control::{ControlClient, LauncherToDevice};
use ferromq_device::{State, Transition};
use ferromq_topology::{AutoAddress, DeviceKind, Instance, Topology};
use ferromq_zmq::ZmqTransport;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::console::Console;

use super::{CONTROL_TIMEOUT, LAST_LINES, Running};

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
        .env(crate::run::LAUNCHER_PID_ENV, std::process::id().to_string())
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

pub(super) async fn start(
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
