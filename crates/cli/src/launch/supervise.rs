//! While a topology runs: signals ([`Signals`]), the live table, and watching every device's
//! state, counters and exit, until a stop is due (a signal, the duration, completion, a failure).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ferromq_device::State;
use ferromq_device::control::LauncherToDevice;
use ferromq_device::rates::Rates;

use crate::Signals;
use crate::console::Console;

use super::Running;
use super::restart::{self, AfterExit};
use super::start::Wiring;

/// Why the run ends.
pub(super) enum Ending {
    Signal(&'static str),
    Duration,
    Finished,
    Failure(String),
}

pub(super) fn table(
    devices: &[Running],
    previous: &BTreeMap<(String, String), ferromq_core::CounterSnapshot>,
    seconds: f64,
) -> Vec<String> {
    // Devices on several hosts: each row says where its device runs.
    let show_hosts = devices.iter().any(|device| device.host != devices[0].host);
    let host_width = devices
        .iter()
        .map(|device| device.host.len())
        .max()
        .unwrap_or(0)
        .max(4);
    let host_column = |host: &str| {
        if show_hosts {
            format!("{host:<host_width$} ")
        } else {
            String::new()
        }
    };
    let mut lines = vec![format!(
        "{}{:<16} {:<18} {:<12} {:>12} {:>10} {:>12} {:>10}",
        host_column("host"),
        "device",
        "state",
        "channel",
        "in msg/s",
        "in MB/s",
        "out msg/s",
        "out MB/s"
    )];
    for device in devices {
        let mut state = match device.exited {
            Some(status) if device.left_behind.is_some() => format!("left ({status})"),
            Some(status) => format!("exited ({status})"),
            None => device.state.to_string(),
        };
        if device.restarts > 0 {
            state.push_str(&format!(" ↻{}", device.restarts));
        }
        if device.counters.is_empty() {
            lines.push(format!(
                "{}{:<16} {state:<18}",
                host_column(&device.host),
                device.instance.id
            ));
        }
        for (channel_idx, (channel, now)) in device.counters.iter().enumerate() {
            // Counters start at zero: the first table shows the rates since the start.
            let before = previous
                .get(&(device.instance.id.clone(), channel.clone()))
                .copied()
                .unwrap_or_default();
            let rates = Rates::between(before, *now, seconds);
            let (host, id, state) = if channel_idx == 0 {
                (
                    host_column(&device.host),
                    device.instance.id.as_str(),
                    state.as_str(),
                )
            } else {
                (host_column(""), "", "")
            };
            lines.push(format!(
                "{host}{id:<16} {state:<18} {channel:<12} {:>12.0} {:>10.1} {:>12.0} {:>10.1}",
                rates.msgs_in, rates.mb_in, rates.msgs_out, rates.mb_out
            ));
        }
    }
    lines
}

pub(super) async fn supervise(
    devices: &mut [Running],
    wiring: &mut Wiring<'_>,
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
    loop {
        // Made anew each round: a restarted device has a new process, and one left behind
        // (expendable) is watched no more.
        let exits: Vec<_> = devices
            .iter()
            .filter(|device| device.left_behind.is_none())
            .map(|device| device.process.exits())
            .collect();
        tokio::select! {
            name = signals.next() => return Ending::Signal(name),
            _ = tick.tick() => {}
        }
        if duration.is_some_and(|duration| started.elapsed() >= duration) {
            return Ending::Duration;
        }
        // Requests to a device that hangs can take their whole timeout: a signal meanwhile is
        // acted on at once, not after them.
        let poll = poll_devices(devices, &mut previous, &mut last_table, interval);
        let round = tokio::select! {
            name = signals.next() => return Ending::Signal(name),
            round = poll => round,
            // A device that exits (a host lost) is noticed at once, not after a request to it
            // timed out: the next round reports it.
            () = any_exit(&exits) => Round::Continue,
        };
        match round {
            Round::Continue => {}
            Round::Ends(ending) => return ending,
            // Decided outside the race with the exits above: a restart waits and starts a new
            // process while the old one's exit is still there to be seen.
            Round::Exited(idx) => {
                let after = tokio::select! {
                    name = signals.next() => return Ending::Signal(name),
                    after = restart::after_exit(devices, idx, wiring) => after,
                };
                match after {
                    AfterExit::Restarted => {}
                    AfterExit::LeftBehind(reason) => {
                        let status = devices[idx].exited.map_or_else(
                            || "unknown status".to_owned(),
                            |status| status.to_string(),
                        );
                        println!(
                            "ferromq: device {:?}{} ended ({status}); expendable, the topology \
                             goes on without it: {reason}",
                            devices[idx].instance.id,
                            devices[idx].on_host()
                        );
                        devices[idx].left_behind = Some(reason);
                    }
                    AfterExit::Fails(failure) => return Ending::Failure(failure),
                }
            }
        }
    }
}

/// What one round of supervision found.
enum Round {
    /// Nothing that ends the run.
    Continue,
    /// Device `idx` exited: restart it, go on without it, or fail.
    Exited(usize),
    /// The run ends.
    Ends(Ending),
}

/// Completes when any of `exits` holds an exit status.
async fn any_exit(exits: &[tokio::sync::watch::Receiver<Option<std::process::ExitStatus>>]) {
    let waits = exits.iter().map(|exit| {
        let mut exit = exit.clone();
        Box::pin(async move {
            let _ = exit.wait_for(Option::is_some).await;
        })
    });
    let waits: Vec<_> = waits.collect();
    if waits.is_empty() {
        return std::future::pending().await;
    }
    futures_util::future::select_all(waits).await;
}

/// One round of supervision: exits, states, and every `interval` the table of rates.
async fn poll_devices(
    devices: &mut [Running],
    previous: &mut BTreeMap<(String, String), ferromq_core::CounterSnapshot>,
    last_table: &mut Instant,
    interval: Duration,
) -> Round {
    for (idx, device) in devices.iter_mut().enumerate() {
        if device.left_behind.is_some() {
            continue;
        }
        if let Some(status) = device.process.try_wait() {
            device.exited = Some(status);
            return Round::Exited(idx);
        }
        let Ok(reply) = device.request(&LauncherToDevice::State).await else {
            continue;
        };
        if reply.state == State::Error {
            return Round::Ends(Ending::Failure(format!(
                "device {:?} is in ERROR; its last lines:\n    {}",
                device.instance.id,
                device.last_lines()
            )));
        }
    }
    // Supervision starts once every device answered RUN by entering RUNNING: all back in READY
    // means done. (It used to wait until it had seen one RUNNING itself: devices that finished
    // their work at once were READY at the start's last look, and the run waited for ever, a
    // sampler and sink of 101 messages under load.)
    if devices
        .iter()
        .filter(|device| device.left_behind.is_none())
        .all(|device| device.state == State::Ready)
    {
        return Round::Ends(Ending::Finished);
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
        for device in devices
            .iter_mut()
            .filter(|device| device.left_behind.is_none())
        {
            if let Ok(reply) = device.request(&LauncherToDevice::Counters).await
                && let Some(value) = reply.value
            {
                device.counters = ferromq_device::control::counters_from_value(&value);
            }
        }
        previous.extend(before);
        if crate::metrics_endpoint::serving() {
            record_metrics(devices);
        }
        Console::global().table(&table(devices, previous, seconds));
        for device in devices.iter() {
            for (channel, counters) in &device.counters {
                previous.insert((device.instance.id.clone(), channel.clone()), *counters);
            }
        }
        *last_table = Instant::now();
    }
    Round::Continue
}

/// Every device's counters and state through the metrics facade (`--metrics`).
fn record_metrics(devices: &[Running]) {
    let spans_hosts = devices.iter().any(|device| device.host != "localhost");
    for device in devices {
        let channels: Vec<(String, ferromq_core::CounterSnapshot)> = device
            .counters
            .iter()
            .map(|(channel, counters)| (channel.clone(), *counters))
            .collect();
        ferromq_device::metrics::record(&ferromq_device::metrics::DeviceFigures {
            device: &device.instance.id,
            host: spans_hosts.then_some(device.host.as_str()),
            state: device.state,
            in_state: device.state_since.elapsed(),
            channels: &channels,
            restarts: Some(device.restarts),
            // The launcher polls counters, not memory: a device's own --metrics has it.
            memory: &[],
        });
    }
}

/// What to say of device `idx`, which exited while it should not have: its host, state, exit
/// status and last lines. ssh's own failure (255) is the host's: unreachable or lost, and every
/// device placed there is named.
pub(super) fn exit_failure(devices: &[Running], idx: usize) -> String {
    let device = &devices[idx];
    let status = device
        .exited
        .map_or_else(|| "unknown status".to_owned(), |status| status.to_string());
    if device.process.lost_its_host() {
        let on_host: Vec<String> = devices
            .iter()
            .filter(|other| other.host == device.host)
            .map(|other| format!("{:?}", other.instance.id))
            .collect();
        return format!(
            "host {:?} is unreachable or was lost (ssh exited 255 for device {:?} while {}); \
             devices on it: {}; last lines:\n    {}",
            device.host,
            device.instance.id,
            device.state,
            on_host.join(", "),
            device.last_lines()
        );
    }
    format!(
        "device {:?}{} exited ({status}) while {}; its last lines:\n    {}",
        device.instance.id,
        device.on_host(),
        device.state,
        device.last_lines()
    )
}

/// The first device whose process has exited (waiting up to a second: a broken control
/// connection can be seen before the death that broke it).
pub(super) async fn exited_device(devices: &mut [Running]) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let found = devices.iter_mut().position(|device| {
            if let Some(status) = device.process.try_wait() {
                device.exited = Some(status);
            }
            device.exited.is_some()
        });
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
