//! A snapshot as text: the plain table of `--once`, JSON, and the rows the live view draws.

use crate::snapshot::{ChannelView, DeviceView, Snapshot};

/// The columns of the table, in order.
pub const COLUMNS: [&str; 14] = [
    "session",
    "device",
    "pid",
    "state",
    "in state",
    "channel",
    "in msg/s",
    "in MB/s",
    "out msg/s",
    "out MB/s",
    "queued",
    "wait %",
    "lost",
    "memory used",
];

/// One row per channel (one for a device without channels or that did not answer); the
/// session, device, pid and state cells only on a device's first row.
pub fn rows(snapshot: &Snapshot) -> Vec<[String; 14]> {
    let mut rows = Vec::new();
    for device in &snapshot.devices {
        let head = device_cells(device);
        if device.channels.is_empty() {
            let mut row = head.clone();
            row[5] = device.unreachable.clone().unwrap_or_default();
            rows.push(row);
            continue;
        }
        for (idx, channel) in device.channels.iter().enumerate() {
            let mut row: [String; 14] = if idx == 0 {
                head.clone()
            } else {
                Default::default()
            };
            let [messages_in, mb_in, messages_out, mb_out, waited] = channel_cells(channel);
            row[5] = channel.name.clone();
            row[6] = messages_in;
            row[7] = mb_in;
            row[8] = messages_out;
            row[9] = mb_out;
            row[10] = channel.queued.to_string();
            row[11] = waited;
            row[12] = (channel.lost_undelivered + channel.lost_slow_subscriber).to_string();
            rows.push(row);
        }
    }
    rows
}

fn device_cells(device: &DeviceView) -> [String; 14] {
    let mut row: [String; 14] = Default::default();
    row[0] = device.session.clone();
    row[1] = device.id.clone();
    row[2] = device.pid.to_string();
    row[3] = device
        .state
        .clone()
        .unwrap_or_else(|| "not answering".to_owned());
    row[4] = device.seconds_in_state.map(duration).unwrap_or_default();
    row[13] = device
        .memory
        .iter()
        .map(|memory| {
            #[allow(clippy::cast_precision_loss)]
            let used = megabytes(memory.figures.used as f64);
            #[allow(clippy::cast_precision_loss)]
            let size = megabytes(memory.figures.size as f64);
            let regions = if memory.figures.regions > 0 {
                format!(
                    ", {} region buffer(s) lent",
                    memory.figures.region_buffers_lent
                )
            } else {
                String::new()
            };
            format!("{} {used}/{size} MB{regions}", memory.transport)
        })
        .collect::<Vec<_>>()
        .join(", ");
    row
}

/// Rates when the snapshot has them, otherwise the totals (marked with `total`); the share
/// of time sends waited (back-pressure).
fn channel_cells(channel: &ChannelView) -> [String; 5] {
    match channel.rates {
        Some(rates) => [
            count(rates.messages_in),
            megabytes(rates.bytes_in),
            count(rates.messages_out),
            megabytes(rates.bytes_out),
            format!("{:.0}", rates.send_wait * 100.0),
        ],
        #[allow(clippy::cast_precision_loss)]
        None => [
            format!("{} total", count(channel.messages_in as f64)),
            megabytes(channel.bytes_in as f64),
            format!("{} total", count(channel.messages_out as f64)),
            megabytes(channel.bytes_out as f64),
            format!("{:.1} s", channel.send_wait_s),
        ],
    }
}

fn count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} M", value / 1e6)
    } else if value >= 1e4 {
        format!("{:.1} k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

fn megabytes(bytes: f64) -> String {
    format!("{:.1}", bytes / 1e6)
}

fn duration(seconds: f64) -> String {
    if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let whole = seconds as u64;
        format!("{}:{:02}:{:02}", whole / 3600, whole / 60 % 60, whole % 60)
    }
}

/// The first line: how much was found.
pub fn summary(snapshot: &Snapshot) -> String {
    let answering = snapshot
        .devices
        .iter()
        .filter(|device| device.state.is_some())
        .count();
    let mut line = format!(
        "{} device(s) in {} session(s)",
        snapshot.devices.len(),
        snapshot.sessions()
    );
    if answering < snapshot.devices.len() {
        line.push_str(&format!(
            ", {} not answering",
            snapshot.devices.len() - answering
        ));
    }
    if let Some(seconds) = snapshot.interval_s {
        line.push_str(&format!("; rates over the last {seconds:.1} s"));
    }
    line
}

/// The snapshot as a plain table (`ferromq top --once`).
pub fn text(snapshot: &Snapshot) -> String {
    let rows = rows(snapshot);
    let mut widths = COLUMNS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 14]| {
        let mut text = String::new();
        for (idx, (cell, width)) in cells.iter().zip(widths).enumerate() {
            // Names left, figures right.
            if idx >= 6 {
                text.push_str(&format!("{cell:>width$}  "));
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_owned()
    };
    let mut out = summary(snapshot);
    out.push('\n');
    out.push_str(&line(COLUMNS));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row.each_ref().map(String::as_str)));
        out.push('\n');
    }
    out
}

/// The snapshot as JSON (`ferromq top --once --json`).
pub fn json(snapshot: &Snapshot) -> String {
    serde_json::to_string_pretty(snapshot).expect("snapshots serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::ChannelRates;

    fn snapshot() -> Snapshot {
        Snapshot {
            taken_unix_ms: 0,
            interval_s: Some(1.0),
            devices: vec![
                DeviceView {
                    session: "s".into(),
                    id: "sink".into(),
                    pid: 42,
                    state: Some("RUNNING".into()),
                    seconds_in_state: Some(75.0),
                    unreachable: None,
                    memory: vec![crate::MemoryView {
                        transport: "shmem".into(),
                        figures: ferromq_core::MemoryFigures {
                            size: 2_000_000_000,
                            used: 64_000_000,
                            largest_free: 1_900_000_000,
                            live_blocks: 10,
                            ..ferromq_core::MemoryFigures::default()
                        },
                    }],
                    channels: vec![ChannelView {
                        name: "data".into(),
                        messages_in: 10,
                        bytes_in: 100,
                        messages_out: 0,
                        bytes_out: 0,
                        queued: 3,
                        send_wait_s: 0.0,
                        lost_undelivered: 0,
                        lost_slow_subscriber: 0,
                        rates: Some(ChannelRates {
                            messages_in: 2_500_000.0,
                            bytes_in: 160e6,
                            ..ChannelRates::default()
                        }),
                    }],
                },
                DeviceView {
                    session: "s".into(),
                    id: "stuck".into(),
                    pid: 43,
                    state: None,
                    seconds_in_state: None,
                    unreachable: Some("no answer within 1s".into()),
                    channels: vec![],
                    memory: vec![],
                },
            ],
        }
    }

    #[test]
    fn the_table_has_a_row_per_channel_and_says_who_did_not_answer() {
        let text = text(&snapshot());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "2 device(s) in 1 session(s), 1 not answering; rates over the last 1.0 s"
        );
        assert!(lines[1].starts_with("session"));
        assert!(
            lines[2].contains("sink") && lines[2].contains("RUNNING"),
            "{text}"
        );
        assert!(
            lines[2].contains("0:01:15") && lines[2].contains("2.50 M"),
            "{text}"
        );
        assert!(lines[2].contains("160.0"), "{text}");
        assert!(lines[2].contains("shmem 64.0/2000.0 MB"), "{text}");
        assert!(
            lines[3].contains("not answering") && lines[3].contains("no answer"),
            "{text}"
        );
    }

    #[test]
    fn json_carries_every_figure() {
        let value: serde_json::Value = serde_json::from_str(&json(&snapshot())).unwrap();
        assert_eq!(value["devices"][0]["channels"][0]["messages_in"], 10);
        assert_eq!(
            value["devices"][0]["channels"][0]["rates"]["messages_in"],
            2_500_000.0
        );
        assert_eq!(value["devices"][1]["unreachable"], "no answer within 1s");
    }
}
