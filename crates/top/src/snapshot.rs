//! Looking at every observable device once, and rates between two looks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferromq_core::{CounterSnapshot, Transport};
use ferromq_device::control::{ControlClient, LauncherToDevice};
use ferromq_device::presence::{self, PresenceEntry};
use serde::Serialize;

/// How long a device has to answer one look.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(1);

/// What one look saw.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// When, in milliseconds since the Unix epoch.
    pub taken_unix_ms: u64,
    /// Seconds since the look the rates are measured against (none on a first look).
    pub interval_s: Option<f64>,
    /// Every device found, by session, then id.
    pub devices: Vec<DeviceView>,
}

impl Snapshot {
    /// How many distinct sessions the devices belong to.
    pub fn sessions(&self) -> usize {
        let mut sessions: Vec<&str> = self.devices.iter().map(|d| d.session.as_str()).collect();
        sessions.dedup();
        sessions.len()
    }
}

/// One device.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceView {
    /// Its session.
    pub session: String,
    /// Its id.
    pub id: String,
    /// Its process.
    pub pid: u32,
    /// Its state (FairMQ's names), when it answered.
    pub state: Option<String>,
    /// Seconds in that state.
    pub seconds_in_state: Option<f64>,
    /// Why it could not be read, when it did not answer.
    pub unreachable: Option<String>,
    /// Its channels, by name.
    pub channels: Vec<ChannelView>,
    /// How its transports' memory is used (shmem: its own segment), by transport.
    pub memory: Vec<MemoryView>,
}

/// The use of one transport's memory in a device.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryView {
    /// The transport.
    pub transport: String,
    /// Its figures (size, used, largest free block, live blocks, regions, buffers lent).
    #[serde(flatten)]
    pub figures: ferromq_core::MemoryFigures,
}

/// One channel of a device: totals since the device bound or connected it, and rates.
#[derive(Debug, Clone, Serialize)]
pub struct ChannelView {
    /// The channel's name (`data`, `data[1]`).
    pub name: String,
    /// Messages received.
    pub messages_in: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Messages sent.
    pub messages_out: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Messages waiting in its send queue (accepted by send, not handed on yet).
    pub queued: u64,
    /// Seconds its sends waited for room or a peer (back-pressure), in all.
    pub send_wait_s: f64,
    /// Messages lost: accepted by send and undelivered at close.
    pub lost_undelivered: u64,
    /// Messages lost: a publisher's copies for subscribers whose queue was full.
    pub lost_slow_subscriber: u64,
    /// Per second since the previous look (none on a first look).
    pub rates: Option<ChannelRates>,
}

/// Per-second rates of one channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ChannelRates {
    /// Messages received per second.
    pub messages_in: f64,
    /// Bytes received per second.
    pub bytes_in: f64,
    /// Messages sent per second.
    pub messages_out: f64,
    /// Bytes sent per second.
    pub bytes_out: f64,
    /// The share of the time its sends waited for room or a peer (0 to 1).
    pub send_wait: f64,
}

/// Counters of one channel at one instant.
#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Instant,
    totals: CounterSnapshot,
}

/// Looks at devices again and again over the connections it keeps.
pub struct Observer {
    transport: Arc<dyn Transport>,
    /// Connections by process id and start time (a new process that got a reused pid is
    /// another device: its connection is made anew).
    clients: BTreeMap<(u32, u64), ControlClient>,
    /// The previous look's counters, by (pid, start, channel).
    seen: BTreeMap<(u32, u64, String), Seen>,
    previous_look: Option<Instant>,
}

impl Observer {
    /// An observer that reaches endpoints over `transport` (zeromq's, for ipc).
    pub fn new(transport: Arc<dyn Transport>) -> Observer {
        Observer {
            transport,
            clients: BTreeMap::new(),
            seen: BTreeMap::new(),
            previous_look: None,
        }
    }

    /// Every running device of this user on this host (only `session`'s when given), asked at
    /// once.
    pub async fn look(&mut self, session: Option<&str>) -> Snapshot {
        let entries: Vec<PresenceEntry> = presence::list()
            .into_iter()
            .filter(|entry| session.is_none_or(|session| entry.session == session))
            .collect();
        let now = Instant::now();
        // Connections to processes that are gone are closed.
        self.clients
            .retain(|key, _| entries.iter().any(|entry| key_of(entry) == *key));
        let transport = Arc::clone(&self.transport);
        let mut clients = std::mem::take(&mut self.clients);
        let asks = entries.iter().map(|entry| {
            let client = clients.remove(&key_of(entry));
            let transport = Arc::clone(&transport);
            async move {
                let outcome = ask(transport.as_ref(), entry, client).await;
                (entry, outcome)
            }
        });
        let answers = futures_util::future::join_all(asks).await;
        let mut devices = Vec::with_capacity(answers.len());
        let mut seen = BTreeMap::new();
        for (entry, outcome) in answers {
            let mut view = DeviceView {
                session: entry.session.clone(),
                id: entry.id.clone(),
                pid: entry.pid,
                state: None,
                seconds_in_state: None,
                unreachable: None,
                channels: Vec::new(),
                memory: Vec::new(),
            };
            match outcome {
                Ok((client, overview)) => {
                    self.clients.insert(key_of(entry), client);
                    view.state = Some(overview.state);
                    view.seconds_in_state = Some(overview.seconds_in_state);
                    view.memory = overview.memory;
                    for (name, totals) in overview.counters {
                        let key = (entry.pid, entry.started_unix, name.clone());
                        let rates = self
                            .seen
                            .get(&key)
                            .map(|before| rates_between(*before, Seen { at: now, totals }));
                        seen.insert(key, Seen { at: now, totals });
                        #[allow(clippy::cast_precision_loss)]
                        view.channels.push(ChannelView {
                            name,
                            messages_in: totals.messages_in,
                            bytes_in: totals.bytes_in,
                            messages_out: totals.messages_out,
                            bytes_out: totals.bytes_out,
                            queued: totals.queued,
                            send_wait_s: totals.send_waited_ns as f64 / 1e9,
                            lost_undelivered: totals.lost_undelivered,
                            lost_slow_subscriber: totals.lost_slow_subscriber,
                            rates,
                        });
                    }
                }
                Err(problem) => view.unreachable = Some(problem),
            }
            devices.push(view);
        }
        devices.sort_by(|a, b| (&a.session, &a.id, a.pid).cmp(&(&b.session, &b.id, b.pid)));
        self.seen = seen;
        let interval_s = self
            .previous_look
            .map(|before| now.duration_since(before).as_secs_f64());
        self.previous_look = Some(now);
        Snapshot {
            taken_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| {
                    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                }),
            interval_s,
            devices,
        }
    }
}

fn key_of(entry: &PresenceEntry) -> (u32, u64) {
    (entry.pid, entry.started_unix)
}

/// A device's answer to `overview`.
struct Overview {
    state: String,
    seconds_in_state: f64,
    /// By channel name.
    counters: BTreeMap<String, CounterSnapshot>,
    memory: Vec<MemoryView>,
}

/// Asks one device for its overview, over `client` or a new connection. A connection that
/// failed is dropped (a request socket whose answer never came cannot ask again).
async fn ask(
    transport: &dyn Transport,
    entry: &PresenceEntry,
    client: Option<ControlClient>,
) -> Result<(ControlClient, Overview), String> {
    let mut client = match client {
        Some(client) => client,
        None => ControlClient::connect(transport, &entry.observe)
            .await
            .map_err(|error| error.to_string())?,
    };
    let reply = client
        .request(&LauncherToDevice::Overview, ANSWER_LIMIT)
        .await
        .map_err(|_| format!("no answer within {ANSWER_LIMIT:?}"))?;
    if !reply.ok {
        return Err(reply.error.unwrap_or_else(|| "refused".to_owned()));
    }
    let value = reply.value.unwrap_or_default();
    let memory = ferromq_device::control::memory_from_value(&value["memory"])
        .into_iter()
        .map(|(transport, figures)| MemoryView { transport, figures })
        .collect();
    let counters = ferromq_device::control::counters_from_value(&value["counters"]);
    let overview = Overview {
        memory,
        state: reply.state.to_string(),
        seconds_in_state: value
            .get("seconds_in_state")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0),
        counters,
    };
    Ok((client, overview))
}

fn rates_between(before: Seen, now: Seen) -> ChannelRates {
    let seconds = now.at.duration_since(before.at).as_secs_f64();
    if seconds <= 0.0 {
        return ChannelRates::default();
    }
    // Counters restart from zero when a device binds anew: no negative rates.
    #[allow(clippy::cast_precision_loss)]
    let per_second = |count: fn(&CounterSnapshot) -> u64| {
        count(&now.totals).saturating_sub(count(&before.totals)) as f64 / seconds
    };
    ChannelRates {
        messages_in: per_second(|totals| totals.messages_in),
        bytes_in: per_second(|totals| totals.bytes_in),
        messages_out: per_second(|totals| totals.messages_out),
        bytes_out: per_second(|totals| totals.bytes_out),
        send_wait: (per_second(|totals| totals.send_waited_ns) / 1e9).min(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_and_never_negative() {
        let start = Instant::now();
        let totals = |messages_in, bytes_in, messages_out, send_waited_ns| CounterSnapshot {
            messages_in,
            bytes_in,
            messages_out,
            bytes_out: 500,
            send_waited_ns,
            ..CounterSnapshot::default()
        };
        let before = Seen {
            at: start,
            totals: totals(100, 1000, 50, 0),
        };
        let now = Seen {
            at: start + Duration::from_millis(500),
            totals: totals(200, 3000, 10, 250_000_000),
        };
        let rates = rates_between(before, now);
        assert_eq!(rates.messages_in, 200.0);
        assert_eq!(rates.bytes_in, 4000.0);
        assert_eq!(
            rates.messages_out, 0.0,
            "a counter that went back counts as none"
        );
        assert_eq!(rates.bytes_out, 0.0);
        assert_eq!(
            rates.send_wait, 0.5,
            "a quarter second of waiting in half a second"
        );
    }
}
