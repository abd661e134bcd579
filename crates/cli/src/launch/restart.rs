//! What the launcher does when a device's process ends while the topology runs: start it again
//! (`restart = "on-failure" | "always"`, with a doubling delay and a limit), go on without it
//! (`expendable = true`, `min-replicas`), or fail the topology as without either.
//!
//! A restarted device is the same command again (the same id, options and channels) and is
//! stepped alone from IDLE to RUNNING as at the start. A binder binds what it bound before (a
//! tcp port 0 became a real port, reused now), so its connectors, whose zeromq sockets
//! reconnect on their own, find it where it was; a connector is told its binders' addresses
//! again. What the dead process had taken and not passed on is lost with it; what its peers
//! had not handed to it yet waits in their queues for the new one (or another replica). What
//! it started and left running in its process group is killed, and named, before anything
//! else is decided (`stop::kill_and_name_leftovers`).
//!
//! Restarts count per instance for the whole run; the table shows them, `--metrics` exports
//! them (`ferromq_device_restarts_total`). A stop or signal during a restart stops the new
//! process like any other: it is the device's process from the moment it is spawned.

use anyhow::{Result, anyhow, bail};
use ferromq_device::State;

use super::Running;
use super::hosts::StartOn;
use super::process::{self, OutputSink};
use super::start::{Wiring, connect_control, drive_to_running};

/// What the launcher decided about a device whose process ended.
pub(super) enum AfterExit {
    /// It runs again.
    Restarted,
    /// The topology goes on without it (expendable); the text says why it may.
    LeftBehind(String),
    /// The topology fails: the text says why.
    Fails(String),
}

/// Decides what follows the end of device `idx` (its `exited` set), and restarts it when its
/// policy says so.
pub(super) async fn after_exit(
    devices: &mut [Running],
    idx: usize,
    wiring: &mut Wiring<'_>,
) -> AfterExit {
    let status = devices[idx]
        .exited
        .expect("called for a device that exited");
    // What it started and left running goes now, not when the run ends: a restarted device's
    // old processes would run beside the new ones (and hold what they hold) until then.
    if let Some(pid) = devices[idx].process.local_pid() {
        devices[idx].leftovers_looked_for = true;
        super::stop::kill_and_name_leftovers(vec![(devices[idx].instance.id.clone(), pid)]).await;
    }
    let policy = devices[idx].instance.restart;
    let host_lost = devices[idx].process.lost_its_host();
    let mut why_not = None;
    if policy.when.applies(status.success()) && !host_lost {
        if devices[idx].restarts < policy.limit {
            let restart = devices[idx].restarts + 1;
            let delay = policy.delay_before(restart);
            println!(
                "ferromq: device {:?}{} exited ({status}) while {}; restarting it in {:.1} s \
                 (restart {restart} of at most {})",
                devices[idx].instance.id,
                devices[idx].on_host(),
                devices[idx].state,
                delay.as_secs_f64(),
                policy.limit
            );
            tokio::time::sleep(delay).await;
            match restart_one(&mut devices[idx], wiring).await {
                Ok(()) => {
                    println!(
                        "ferromq: device {:?} is RUNNING again (restart {restart})",
                        devices[idx].instance.id
                    );
                    return AfterExit::Restarted;
                }
                Err(error) => {
                    why_not = Some(format!("restart {restart} failed: {error:#}"));
                    if let Some(status) = devices[idx].process.try_wait() {
                        devices[idx].exited = Some(status);
                    }
                }
            }
        } else {
            why_not = Some(format!(
                "it was restarted {} time(s), its limit (max-restarts)",
                policy.limit
            ));
        }
    }
    if let Some(reason) = expendable(devices, idx) {
        return AfterExit::LeftBehind(reason);
    }
    let mut failure = super::supervise::exit_failure(devices, idx);
    if let Some(why_not) = why_not {
        failure.push_str(&format!("\n    not restarted: {why_not}"));
    }
    AfterExit::Fails(failure)
}

/// Why the topology may go on without device `idx` (enough of its device's replicas still
/// live), or `None`.
fn expendable(devices: &mut [Running], idx: usize) -> Option<String> {
    let instance = &devices[idx].instance;
    let living = devices
        .iter()
        .enumerate()
        .filter(|(other, device)| {
            *other != idx
                && device.instance.device == instance.device
                && device.left_behind.is_none()
                && device.exited.is_none()
        })
        .count();
    (living >= instance.min_replicas).then(|| {
        format!(
            "{living} of {} replica(s) of {:?} still run, at least {} needed",
            instance.replica_count, instance.device, instance.min_replicas
        )
    })
}

/// Starts `device` again and steps it to RUNNING.
async fn restart_one(device: &mut Running, wiring: &mut Wiring<'_>) -> Result<()> {
    let host = wiring.placement.host(&device.instance.id).clone();
    let command = wiring.command(&device.instance);
    // A new sink: the old one holds the dead process's control announcement.
    let sink = OutputSink::new(
        &device.instance.id,
        wiring.placement.spans_hosts().then(|| host.name.clone()),
    );
    let process = match &host.start {
        StartOn::Here => process::spawn_here(&command, &sink)?,
        StartOn::Ssh(destination) => process::spawn_ssh(destination, &command, &sink)?,
        StartOn::Slurm { .. } => bail!("a task of a Slurm job step cannot be started again"),
    };
    let bound_before: Vec<((String, String), String)> = wiring
        .bound
        .iter()
        .filter(|((id, _), _)| *id == device.instance.id)
        .map(|(key, address)| (key.clone(), address.clone()))
        .collect();
    device.process = process;
    device.last_lines = sink.last_lines();
    device.exited = None;
    device.control = None;
    device.heartbeat = None;
    device.control_address.clear();
    device.state = State::Idle;
    device.state_since = std::time::Instant::now();
    device.counters.clear();
    device.restarts += 1;
    device.leftovers_looked_for = false;
    connect_control(device, &host).await?;
    drive_to_running(std::slice::from_mut(device), wiring).await?;
    for ((id, socket), before) in bound_before {
        let now = wiring.bound.get(&(id.clone(), socket.clone()));
        if now != Some(&before) && wiring.has_connectors(&id, &socket) {
            return Err(anyhow!(
                "it bound {socket:?} at {} instead of {before}, where its connectors still look",
                now.map_or("nothing", String::as_str)
            ));
        }
    }
    Ok(())
}

/// Refuses restart policies a launcher cannot carry out: a task of a Slurm job step cannot be
/// started again on its own.
pub(super) fn check_policies(wiring: &Wiring<'_>) -> Result<()> {
    let slurm = wiring
        .placement
        .hosts
        .iter()
        .any(|host| matches!(host.start, StartOn::Slurm { .. }));
    if !slurm {
        return Ok(());
    }
    let restarting: Vec<String> = wiring
        .topology
        .devices
        .iter()
        .filter(|device| device.restart.when != ferromq_topology::Restart::Never)
        .map(|device| format!("{:?}", device.id))
        .collect();
    if restarting.is_empty() {
        return Ok(());
    }
    bail!(
        "device(s) {} have a restart policy, which --launcher slurm cannot carry out (every \
         device is a task of one job step, and a task cannot be started again); use --launcher \
         ssh inside the allocation, or Slurm's own --requeue for the whole job",
        restarting.join(", ")
    )
}
