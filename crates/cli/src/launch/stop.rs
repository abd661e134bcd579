//! Stopping a topology: in data-flow order when draining (sources first, each later device once
//! its senders exited and its inputs are still), every device down through STOP, RESET TASK,
//! RESET DEVICE, END; a device without progress for 30 s, or on a second signal, is killed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferromq_core::SocketType;
use ferromq_device::control::{ControlClient, LauncherToDevice};
use ferromq_zmq::ZmqTransport;

use super::{Running, STOP_TIMEOUT};
use crate::Signals;

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
        // An rpc group's channels (`[[rpc]]`: `<group>` and `<group>-out`) carry calls among
        // peers, not a flow to drain: its members stop together, each ending its calls itself.
        let rpc_channels: BTreeSet<String> = device
            .instance
            .properties
            .keys()
            .filter_map(|key| key.strip_prefix("rpc.")?.strip_suffix(".members"))
            .flat_map(|group| [group.to_owned(), format!("{group}-out")])
            .collect();
        for channel in &device.instance.channels {
            if rpc_channels.contains(&channel.config.name) {
                continue;
            }
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
pub(super) async fn stop_all(
    devices: &mut [Running],
    signals: &mut Signals,
    drain: bool,
) -> Vec<String> {
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
            .filter_map(|(_, device)| device.process.local_pid())
            .collect();
        let last_progress = Mutex::new(Instant::now());
        let stop_stage = futures_util::future::join_all(
            devices
                .iter_mut()
                .enumerate()
                .filter(|(idx, _)| stage.contains(idx))
                .map(|(idx, device)| {
                    // Waiting for still inputs only makes sense once every sender into this
                    // device has exited; in a cycle stopped together they never go still.
                    let senders_gone = upstream[idx].iter().all(|&up| stopped[up]);
                    let wait_still = drain && !upstream[idx].is_empty() && senders_gone;
                    stop_one(device, wait_still, &last_progress)
                }),
        );
        tokio::select! {
            results = stop_stage => forced.extend(results.into_iter().flatten()),
            () = watch_progress(&running_pids, &last_progress) => {}
            name = signals.next() => {
                eprintln!("ferromq: second signal ({name}): killing every device");
                for device in devices.iter_mut().filter(|device| device.exited.is_none()) {
                    device.process.signal(nix::sys::signal::Signal::SIGKILL);
                    forced.push(device.instance.id.clone());
                }
                break;
            }
        }
        for idx in stage {
            stopped[idx] = true;
        }
    }
    futures_util::future::join_all(devices.iter_mut().map(|device| device.process.kill())).await;
    for device in devices.iter_mut() {
        if let Some(status) = device.process.try_wait() {
            device.exited.get_or_insert(status);
        }
        device.heartbeat = None;
    }
    kill_leftovers(devices).await;
    forced
}

/// Kills what local devices that exited left running in their process groups, naming it.
async fn kill_leftovers(devices: &[Running]) {
    let exited: Vec<(String, u32)> = devices
        .iter()
        .filter(|device| device.exited.is_some() && !device.leftovers_looked_for)
        .filter_map(|device| Some((device.instance.id.clone(), device.process.local_pid()?)))
        .collect();
    kill_and_name_leftovers(exited).await;
}

/// Kills what the exited local devices `exited` (id and pid) left running in their process
/// groups, and names it on stderr. One scan of `/proc`, off the async threads, which also
/// says what it killed: a caller cancelled meanwhile (a signal while a restart is decided)
/// loses neither.
pub(super) async fn kill_and_name_leftovers(exited: Vec<(String, u32)>) {
    if exited.is_empty() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || {
        for (id, processes) in super::process::kill_leftovers(&exited) {
            let named: Vec<String> = processes
                .iter()
                .map(|(pid, name)| format!("{pid} {name}"))
                .collect();
            eprintln!(
                "ferromq: device {id:?} exited and left {} process(es) it started running ({}): \
                 killed",
                processes.len(),
                named.join(", ")
            );
        }
    })
    .await;
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
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state is field 3, utime 14, stime 15.
    let (_, mut fields) = super::process::stat_fields(&stat)?;
    let user: u64 = fields.nth(11)?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
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
    if let Some(status) = device.process.try_wait() {
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
    if !asked {
        // No answer on the control endpoint (a loaded machine, a broken connection): SIGTERM
        // takes a device down just as cleanly, from any state.
        device.process.signal(nix::sys::signal::Signal::SIGTERM);
    }
    // The time to exit counts from the request, not from the start of the stage.
    *last_progress.lock().expect("progress lock") = Instant::now();
    let exited = loop {
        match tokio::time::timeout(Duration::from_millis(250), device.process.wait()).await {
            Ok(exited) => break exited,
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
            device.process.kill().await;
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

/// Removes this host's shared memory of the session as `ferromq shm clean` without `--force`
/// does: all of it once no process uses any of it. While a process of the session lives that is
/// not one of this run's devices (a device started by hand into the session), all of it stays,
/// this run's devices' memory too: a process may hold descriptors into a segment it has not
/// mapped yet (a subscriber of this run's publisher that has not read them), so nothing of a
/// session with a live process is removed (`ferromq_shm::cleanup`); the last process of the
/// session removes it as it leaves, or the session's watchdog after a crash. Says what it
/// removed, or what it left and for whom; `not_exited` names this run's devices, by pid, that
/// had not exited. Reading /proc and removing files block: on a thread of their own.
pub(super) async fn clean_this_host(session: &str, not_exited: BTreeMap<u32, String>) {
    let session = session.to_owned();
    let _ = tokio::task::spawn_blocking(move || {
        let uid = ferromq_shm::names::current_uid();
        match ferromq_shm::cleanup::clean_session(uid, &session, false) {
            Ok(removed) if removed.is_empty() => {}
            Ok(removed) => println!(
                "ferromq: removed {} shared memory object(s) of session {session}",
                removed.len()
            ),
            Err(in_use) => {
                let n_left = ferromq_shm::cleanup::list_objects(uid, Some(&session)).len();
                let users = in_use
                    .pids
                    .iter()
                    .map(|pid| match not_exited.get(pid) {
                        Some(id) => format!("{pid} (device {id:?} of this run, not exited yet)"),
                        None => pid.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let pid_word = if in_use.pids.len() == 1 {
                    "pid"
                } else {
                    "pids"
                };
                println!(
                    "ferromq: left {n_left} shared memory object(s) of session {session} in use by \
                     {pid_word} {users}: the last process of the session removes them as it \
                     leaves (or the session's watchdog, after a crash)"
                );
            }
        }
    })
    .await;
}

/// Removes the session's shared memory on every other host the devices ran on (this host's is
/// [`clean_this_host`]'s): `ferromq shm clean` there, without `--force` (processes of the
/// session that this run did not start keep it, as here), through ssh or `srun --overlap` on
/// the node, each given 20 s; hosts in `lost` (unreachable) are only named. What it cannot
/// reach, or leaves, is reported, not waited for.
pub(super) async fn clean_other_hosts(
    placement: &super::hosts::Placement,
    session: &str,
    lost: &BTreeSet<String>,
) {
    use super::hosts::StartOn;
    for host in lost {
        eprintln!(
            "ferromq: shared memory of session {session} on lost host {host} is left to `ferromq shm clean --stale` there"
        );
    }
    let reachable = placement
        .hosts
        .iter()
        .filter(|host| !host.is_here() && !lost.contains(&host.name));
    let cleanups = reachable.map(|host| async move {
        let session_arg = format!("--session={session}");
        let words = [host.ferromq.as_str(), "shm", "clean", &session_arg];
        // ssh hands its remote command to the remote user's shell as one line: quoted, as a
        // device's start is (a path with a space, or `;`, ran as two commands); srun runs the
        // words as they are.
        let (prefix, remote) = match &host.start {
            StartOn::Here => return,
            StartOn::Ssh(destination) => {
                match (
                    super::process::ssh_command(destination),
                    shlex::try_join(words),
                ) {
                    (Ok(ssh), Ok(line)) => (ssh, vec![line]),
                    _ => return,
                }
            }
            StartOn::Slurm { job, node } => (
                super::process::on_node(job, node),
                words.map(str::to_owned).to_vec(),
            ),
        };
        let mut command = tokio::process::Command::new(&prefix[0]);
        command
            .args(&prefix[1..])
            .args(&remote)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let outcome = tokio::time::timeout(Duration::from_secs(20), command.output()).await;
        match outcome {
            Ok(Ok(output)) if output.status.success() => {}
            // Refused while processes of the session run there, or failed: its words say which.
            Ok(Ok(output)) => eprintln!(
                "ferromq: shared memory of session {session} on {} left ({}): {}",
                host.name,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            Ok(Err(error)) => eprintln!(
                "ferromq: cannot clean shared memory on {}: {error}",
                host.name
            ),
            Err(_) => eprintln!(
                "ferromq: cleaning shared memory on {} took over 20 s; left as it is",
                host.name
            ),
        }
    });
    futures_util::future::join_all(cleanups).await;
}
