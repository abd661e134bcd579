//! A device's figures through the [`metrics`] facade: per channel messages and bytes in and
//! out, and the device's state and time in it, labelled by device (and host where a launcher
//! records devices of several hosts).
//!
//! Nothing here touches the data path: the channels count in atomics as they always do, and
//! [`publish`] copies those counters into the facade once per [`PUBLISH_EVERY`]. Without an
//! installed recorder the facade drops everything, so a program that does not export metrics
//! pays nothing unless it runs [`publish`], and then one wake-up a second. `ferromq device
//! --metrics ADDR` installs a Prometheus recorder and runs it; `ferromq run --metrics ADDR`
//! records every device of the topology from the counters its live table polls.
//!
//! Names (Prometheus): `ferromq_channel_messages_in_total`, `ferromq_channel_bytes_in_total`,
//! `ferromq_channel_messages_out_total`, `ferromq_channel_bytes_out_total` (labels `device`,
//! `channel`), `ferromq_device_state` (1 for the state the device is in, 0 for the others;
//! labels `device`, `state`) and `ferromq_device_state_seconds` (time in the current state).
//!
//! On cancellation [`publish`] just stops; when the device reaches EXITING it records once more
//! and returns, so a scrape after the end of the run sees the final counts.

use std::time::{Duration, Instant};

use ferromq_core::CounterSnapshot;

use crate::{DeviceController, State};

/// How often [`publish`] copies a device's counters into the facade.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Gives every metric its help text and unit, for the exporter to show; call once after
/// installing a recorder.
pub fn describe() {
    for (direction, preposition) in [("in", "received on"), ("out", "sent on")] {
        ::metrics::describe_counter!(
            format!("ferromq_channel_messages_{direction}_total"),
            ::metrics::Unit::Count,
            format!("Messages {preposition} the channel (a multipart message counts once)")
        );
        ::metrics::describe_counter!(
            format!("ferromq_channel_bytes_{direction}_total"),
            ::metrics::Unit::Bytes,
            format!("Payload bytes {preposition} the channel")
        );
    }
    ::metrics::describe_counter!(
        "ferromq_channel_lost_total",
        ::metrics::Unit::Count,
        "Messages lost, by cause: undelivered (accepted by send, not delivered at close: the device fails for it), slow-subscriber (a publisher's copy for a subscriber whose queue was full)"
    );
    ::metrics::describe_gauge!(
        "ferromq_channel_send_queue",
        ::metrics::Unit::Count,
        "Messages accepted by send and not handed on yet (zeromq: not yet written; shmem: not yet taken by a receiver)"
    );
    ::metrics::describe_gauge!(
        "ferromq_channel_send_wait_seconds",
        ::metrics::Unit::Seconds,
        "Seconds sends waited for room (sndBufSize, a full segment) or a peer since the channel opened: back-pressure (only grows)"
    );
    for (name, unit, text) in [
        (
            "ferromq_transport_memory_bytes",
            ::metrics::Unit::Bytes,
            "Bytes of the transport's memory in this process (shmem: its own segment) messages can take",
        ),
        (
            "ferromq_transport_memory_used_bytes",
            ::metrics::Unit::Bytes,
            "Bytes of it taken by blocks still referenced, here or by any receiver",
        ),
        (
            "ferromq_transport_memory_largest_free_bytes",
            ::metrics::Unit::Bytes,
            "The largest free block: the biggest message that fits now",
        ),
        (
            "ferromq_transport_memory_live_blocks",
            ::metrics::Unit::Count,
            "Blocks still referenced",
        ),
        (
            "ferromq_transport_regions",
            ::metrics::Unit::Count,
            "Unmanaged regions the device created and holds",
        ),
        (
            "ferromq_transport_region_buffers_lent",
            ::metrics::Unit::Count,
            "Buffers of those regions lent to messages and not released yet",
        ),
    ] {
        ::metrics::describe_gauge!(name, unit, text);
    }
    ::metrics::describe_gauge!(
        "ferromq_device_state",
        "1 for the state the device is in (label state), 0 for the others"
    );
    ::metrics::describe_counter!(
        "ferromq_device_restarts_total",
        ::metrics::Unit::Count,
        "How many times the launcher started the device again (restart policies)"
    );
    ::metrics::describe_gauge!(
        "ferromq_device_state_seconds",
        ::metrics::Unit::Seconds,
        "How long the device has been in its current state"
    );
}

/// One device's figures, as a device knows them or as a launcher polled them.
pub struct DeviceFigures<'a> {
    /// The device id.
    pub device: &'a str,
    /// The host it runs on, where a launcher records devices of several hosts.
    pub host: Option<&'a str>,
    /// Its state.
    pub state: State,
    /// How long it has been in that state.
    pub in_state: Duration,
    /// Its channels' counters (channel or socket name, counters).
    pub channels: &'a [(String, CounterSnapshot)],
    /// How many times a launcher started it again (`None` where nobody restarts it: a device
    /// recording itself).
    pub restarts: Option<u32>,
    /// How its transports' memory is used (transport name, figures); empty where unknown.
    pub memory: &'a [(String, ferromq_core::MemoryFigures)],
}

/// Records `figures` through the facade (a no-op without a recorder).
pub fn record(figures: &DeviceFigures<'_>) {
    let mut device_labels = vec![("device", figures.device.to_owned())];
    if let Some(host) = figures.host {
        device_labels.push(("host", host.to_owned()));
    }
    for (channel, counters) in figures.channels {
        let mut labels = device_labels.clone();
        labels.push(("channel", channel.clone()));
        for (name, value) in [
            ("ferromq_channel_messages_in_total", counters.messages_in),
            ("ferromq_channel_bytes_in_total", counters.bytes_in),
            ("ferromq_channel_messages_out_total", counters.messages_out),
            ("ferromq_channel_bytes_out_total", counters.bytes_out),
        ] {
            ::metrics::counter!(name, &labels).absolute(value);
        }
        for (cause, lost) in [
            ("undelivered", counters.lost_undelivered),
            ("slow-subscriber", counters.lost_slow_subscriber),
        ] {
            let mut by_cause = labels.clone();
            by_cause.push(("cause", cause.to_owned()));
            ::metrics::counter!("ferromq_channel_lost_total", &by_cause).absolute(lost);
        }
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!("ferromq_channel_send_queue", &labels).set(counters.queued as f64);
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!("ferromq_channel_send_wait_seconds", &labels)
            .set(counters.send_waited_ns as f64 / 1e9);
    }
    for state in State::ALL {
        let mut labels = device_labels.clone();
        labels.push(("state", state.name().to_owned()));
        let value = if state == figures.state { 1.0 } else { 0.0 };
        ::metrics::gauge!("ferromq_device_state", &labels).set(value);
    }
    ::metrics::gauge!("ferromq_device_state_seconds", &device_labels)
        .set(figures.in_state.as_secs_f64());
    for (transport, memory) in figures.memory {
        let mut labels = device_labels.clone();
        labels.push(("transport", transport.clone()));
        #[allow(clippy::cast_precision_loss)]
        for (name, value) in [
            ("ferromq_transport_memory_bytes", memory.size),
            ("ferromq_transport_memory_used_bytes", memory.used),
            (
                "ferromq_transport_memory_largest_free_bytes",
                memory.largest_free,
            ),
            ("ferromq_transport_memory_live_blocks", memory.live_blocks),
            ("ferromq_transport_regions", memory.regions),
            (
                "ferromq_transport_region_buffers_lent",
                memory.region_buffers_lent,
            ),
        ] {
            ::metrics::gauge!(name, &labels).set(value as f64);
        }
    }
    if let Some(restarts) = figures.restarts {
        ::metrics::counter!("ferromq_device_restarts_total", &device_labels)
            .absolute(u64::from(restarts));
    }
}

/// Records `controller`'s device every [`PUBLISH_EVERY`] and at each state change, until it
/// reaches EXITING (recorded too).
pub async fn publish(controller: DeviceController) {
    let mut states = controller.subscribe();
    let mut state = *states.borrow_and_update();
    let mut entered = Instant::now();
    let mut tick = tokio::time::interval(PUBLISH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let gone = tokio::select! {
            changed = states.changed() => changed.is_err(),
            _ = tick.tick() => false,
        };
        let now = *states.borrow_and_update();
        if now != state {
            state = now;
            entered = Instant::now();
        }
        record(&DeviceFigures {
            device: controller.id(),
            host: None,
            state,
            in_state: entered.elapsed(),
            channels: &controller.counters(),
            restarts: None,
            memory: &controller.memory(),
        });
        if gone || state == State::Exiting {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn a_device_is_recorded_with_its_channels_and_state() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let channels = vec![(
            "data".to_owned(),
            CounterSnapshot {
                messages_in: 3,
                bytes_in: 300,
                messages_out: 0,
                bytes_out: 0,
                queued: 7,
                send_waited_ns: 1_500_000_000,
                lost_undelivered: 0,
                lost_slow_subscriber: 4,
            },
        )];
        ::metrics::with_local_recorder(&recorder, || {
            record(&DeviceFigures {
                device: "sink",
                host: Some("n2"),
                state: State::Running,
                in_state: Duration::from_secs(2),
                channels: &channels,
                restarts: None,
                memory: &[(
                    "shmem".to_owned(),
                    ferromq_core::MemoryFigures {
                        size: 1000,
                        used: 250,
                        largest_free: 700,
                        live_blocks: 3,
                        regions: 1,
                        region_buffers_lent: 5,
                    },
                )],
            });
        });
        /// A metric's name, its labels and its value.
        type Recorded = (String, Vec<(String, String)>, DebugValue);
        let values: Vec<Recorded> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let labels = key
                    .labels()
                    .map(|label| (label.key().to_owned(), label.value().to_owned()))
                    .collect();
                (key.name().to_owned(), labels, value)
            })
            .collect();
        let find = |name: &str, extra: (&str, &str)| {
            values
                .iter()
                .find(|(key, labels, _)| {
                    key == name
                        && labels.contains(&("device".to_owned(), "sink".to_owned()))
                        && labels.contains(&("host".to_owned(), "n2".to_owned()))
                        && labels.contains(&(extra.0.to_owned(), extra.1.to_owned()))
                })
                .map(|(_, _, value)| value)
        };
        assert_eq!(
            find("ferromq_channel_messages_in_total", ("channel", "data")),
            Some(&DebugValue::Counter(3))
        );
        assert_eq!(
            find("ferromq_channel_bytes_in_total", ("channel", "data")),
            Some(&DebugValue::Counter(300))
        );
        assert_eq!(
            find("ferromq_channel_send_queue", ("channel", "data")),
            Some(&DebugValue::Gauge(7.0.into()))
        );
        assert_eq!(
            find("ferromq_channel_send_wait_seconds", ("channel", "data")),
            Some(&DebugValue::Gauge(1.5.into()))
        );
        assert_eq!(
            find(
                "ferromq_transport_memory_used_bytes",
                ("transport", "shmem")
            ),
            Some(&DebugValue::Gauge(250.0.into()))
        );
        assert_eq!(
            find("ferromq_device_state", ("state", "RUNNING")),
            Some(&DebugValue::Gauge(1.0.into()))
        );
        assert_eq!(
            find("ferromq_device_state", ("state", "READY")),
            Some(&DebugValue::Gauge(0.0.into()))
        );
        assert_eq!(
            find("ferromq_device_state_seconds", ("device", "sink")),
            Some(&DebugValue::Gauge(2.0.into()))
        );
    }
}
