//! The devices every pipeline needs, so that a topology can be built without writing code.
//!
//! Each device reads its options from properties (set by `ferromq device KIND --msg-size ...` or
//! a topology's `[[device]]` table, `properties = { ... }`); [`Builtin::create`] makes one by name.
//!
//! | kind | channels (default names) | properties |
//! |---|---|---|
//! | `sampler` | out `data` | `msg-size`, `text`, `payload-file`, `rate`, `rate-burst-ms`, `checksum`, `memset`, `num-parts` |
//! | `bsampler` | out `data` | `msg-size`, `msg-rate`, `rate-burst-ms`, `same-msg`, `num-parts`, `multipart`, `memset` |
//! | `sink` | in `data` | `verify`, `num-parts`, `out-filename`, `max-file-size`, `multipart` |
//! | `processor` | in `data-in`, out `data-out` | `touch` |
//! | `splitter` | in `data-in`, out `data-out[i]` | `routing` (`round-robin` or `key`) |
//! | `merger` | in `data-in[i]`, out `data-out` | |
//! | `proxy` | in `data-in`, out `data-out` | |
//! | `multiplier` | in `data-in`, out `data-out[i]` | |
//! | `client` | req `data` | `msg-size` |
//! | `server` | rep `data` | |
//! | `stf-source` | in `requests`, out `data-out[i]` (one per builder) | `stf-size` |
//! | `builder` | in `data-in`, out `requests[i]` (one per source) | `max-outstanding` |
//! | `mcts-driver` | rpc group `search` (first member; `rpc-group` renames it) | `game`, `board`, `rollouts`, `moves`, `in-flight`, `seconds` |
//! | `mcts-worker` | rpc group `search` (`rpc-group`) | `game`, `board`, `playouts`, `spread-depth` |
//! | `replay` | out `data` | `file` (a recording of `ferromq record`), `speed` (1: as recorded, 0: as fast as possible) |
//!
//! A device checks its channels' socket types at INIT, naming a channel of the wrong type: an
//! output ("out") is push, pub or pair, an input ("in") pull, sub or pair, a client's channel
//! req or pair and a server's rep or pair (a req or rep sends and receives only in turn).
//!
//! `in-channel` and `out-channel` rename the channels. Every device also takes
//! [`COMMON_PROPERTIES`] (`rate`, `replica-index`, `replica-count`), `chan.<channel>.address`,
//! the `rpc.<group>.*` namespace, and the transports' keys (`shm-segment-size`, ...); any other key
//! is refused ([`Builtin::check_properties`]). A `sampler` takes one of `payload-file`, `text`
//! and `msg-size`.
//!
//! # `--max-iterations`: FairMQ's count
//! FairMQ's `fairmq-bsampler` and `fairmq-sink` count `--max-iterations N` as *N iterations after
//! the first*: the bsampler sends N + 1 messages and the sink waits for N + 1. Every built-in
//! device here counts the same way ([`fairmq_iterations`]), so that any pair with the same N
//! finishes: FairMQ bsampler → ferromq sink, ferromq bsampler (or sampler) → FairMQ sink, and
//! ferromq's own pairs and chains (a processor with N forwards N + 1 too). A sampler and a sink
//! run with `--max-iterations 1000` therefore move 1001 messages, exactly as FairMQ's pair does.
//! Devices of your own (`run_device_main`) get N iterations from `next_iteration`, as FairMQ's
//! example devices do.
//!
//! # Bad values
//! [`Builtin::check_properties`] refuses, before anything runs, what a device would refuse when
//! it starts (the same reading; `ferromq validate`, `run` and `graph` call it for a topology's
//! built-in devices, `ferromq device` for its own properties). Rates must be 0 (unlimited) or finite and at least [`MIN_RATE`]; sizes are allocated
//! fallibly, through the channel's transport (a shmem channel reports a message larger than its
//! segment, naming both sizes), so that an impossible `msg-size` is an error naming the size,
//! never an abort.
//!
//! # Checksums
//! With `checksum` (on by default for `sampler`), the first 8 bytes of each message are the
//! FNV-1a hash of the rest; a `sink` with `verify` checks it and fails on the first mismatch.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod event_building;
mod forwarders;
mod mcts;
mod pacing;
mod replay;
mod reqrep;
mod sampler;
mod sink;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use ferromq_core::{BoxError, Message, SocketType, Transport};
use ferromq_device::{ChannelId, Device, DeviceContext, DeviceError};

pub use event_building::{Builder as EventBuilder, StfSource};
pub use forwarders::{Merger, Multiplier, Processor, Proxy, Splitter};
pub use mcts::{MctsDriver, MctsWorker};
pub use pacing::{BURST, DEFAULT_RATE_BURST_MS, MAX_BURST, MAX_RATE_BURST_MS, Pacer};
pub use replay::{MAX_SPEED as MAX_REPLAY_SPEED, MIN_SPEED as MIN_REPLAY_SPEED, Replay};
pub use reqrep::{Client, Server};
pub use sampler::{BenchmarkSampler, Sampler};
pub use sink::{Sink, SinkSummary};

/// The built-in device kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// Sends generated, text or file messages.
    Sampler,
    /// FairMQ's benchmark sampler.
    BenchmarkSampler,
    /// Counts (and verifies) what it receives.
    Sink,
    /// Passes messages on, optionally touching every byte.
    Processor,
    /// One input to N outputs.
    Splitter,
    /// N inputs to one output.
    Merger,
    /// Forwards unchanged.
    Proxy,
    /// One input copied to N outputs.
    Multiplier,
    /// Sends requests and checks the replies.
    Client,
    /// Echoes requests.
    Server,
    /// Event-building source of sub-timeframes.
    StfSource,
    /// Event builder.
    Builder,
    /// Plays moves by distributed Monte-Carlo tree search (an rpc group's first member).
    MctsDriver,
    /// Holds part of a distributed search tree.
    MctsWorker,
    /// Feeds a recording into a channel.
    Replay,
}

impl Builtin {
    /// Every kind with its name.
    pub const ALL: [(&'static str, Builtin); 15] = [
        ("sampler", Builtin::Sampler),
        ("bsampler", Builtin::BenchmarkSampler),
        ("sink", Builtin::Sink),
        ("processor", Builtin::Processor),
        ("splitter", Builtin::Splitter),
        ("merger", Builtin::Merger),
        ("proxy", Builtin::Proxy),
        ("multiplier", Builtin::Multiplier),
        ("client", Builtin::Client),
        ("server", Builtin::Server),
        ("stf-source", Builtin::StfSource),
        ("builder", Builtin::Builder),
        ("mcts-driver", Builtin::MctsDriver),
        ("mcts-worker", Builtin::MctsWorker),
        ("replay", Builtin::Replay),
    ];

    /// The kind called `name`.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL
            .iter()
            .find(|(kind_name, _)| *kind_name == name)
            .map(|(_, kind)| *kind)
    }

    /// This kind's name, as a topology's `kind` and `ferromq device KIND` spell it.
    pub fn name(self) -> &'static str {
        Builtin::ALL
            .iter()
            .find(|(_, kind)| *kind == self)
            .map_or("device", |(name, _)| *name)
    }

    /// The names, for help texts and errors.
    pub fn names() -> Vec<&'static str> {
        Builtin::ALL.iter().map(|(name, _)| *name).collect()
    }

    /// The channel endpoints this kind uses, FairMQ's `--print-channels` form
    /// `(name, min sockets, max sockets)`; `property` gives `in-channel`/`out-channel` renames.
    pub fn channel_endpoints(
        self,
        property: impl Fn(&str) -> Option<String>,
    ) -> Vec<(String, u32, u32)> {
        const ANY: u32 = i32::MAX as u32;
        let input = |default: &str| property("in-channel").unwrap_or_else(|| default.to_owned());
        let output = |default: &str| property("out-channel").unwrap_or_else(|| default.to_owned());
        match self {
            Builtin::Sampler | Builtin::BenchmarkSampler | Builtin::Client | Builtin::Replay => {
                vec![(output("data"), 1, 1)]
            }
            Builtin::Sink | Builtin::Server => vec![(input("data"), 1, 1)],
            Builtin::Processor | Builtin::Proxy => {
                vec![(input("data-in"), 1, 1), (output("data-out"), 1, 1)]
            }
            Builtin::Splitter | Builtin::Multiplier => {
                vec![(input("data-in"), 1, 1), (output("data-out"), 1, ANY)]
            }
            Builtin::Merger => vec![(input("data-in"), 1, ANY), (output("data-out"), 1, 1)],
            Builtin::StfSource => vec![
                ("requests".to_owned(), 1, 1),
                ("data-out".to_owned(), 1, ANY),
            ],
            Builtin::Builder => vec![
                ("data-in".to_owned(), 1, 1),
                ("requests".to_owned(), 1, ANY),
            ],
            Builtin::MctsDriver | Builtin::MctsWorker => {
                let group = property("rpc-group").unwrap_or_else(|| "search".to_owned());
                vec![(group.clone(), 1, 1), (format!("{group}-out"), 1, ANY)]
            }
        }
    }

    /// A new device of this kind.
    pub fn create(self) -> Box<dyn Device> {
        match self {
            Builtin::Sampler => Box::new(Sampler::default()),
            Builtin::BenchmarkSampler => Box::new(BenchmarkSampler::default()),
            Builtin::Sink => Box::new(Sink::default()),
            Builtin::Processor => Box::new(Processor::default()),
            Builtin::Splitter => Box::new(Splitter::default()),
            Builtin::Merger => Box::new(Merger::default()),
            Builtin::Proxy => Box::new(Proxy::default()),
            Builtin::Multiplier => Box::new(Multiplier::default()),
            Builtin::Client => Box::new(Client::default()),
            Builtin::Server => Box::new(Server::default()),
            Builtin::StfSource => Box::new(StfSource::default()),
            Builtin::Builder => Box::new(EventBuilder::default()),
            Builtin::MctsDriver => Box::new(MctsDriver),
            Builtin::MctsWorker => Box::new(MctsWorker),
            Builtin::Replay => Box::new(Replay::default()),
        }
    }

    /// The properties a device of this kind reads besides [`COMMON_PROPERTIES`] (the crate
    /// docs' table, with the channel renames).
    pub fn properties(self) -> &'static [&'static str] {
        match self {
            Builtin::Sampler => &[
                "out-channel",
                "msg-size",
                "rate-burst-ms",
                "text",
                "payload-file",
                "num-parts",
                "checksum",
                "memset",
            ],
            Builtin::BenchmarkSampler => &[
                "out-channel",
                "msg-size",
                "msg-rate",
                "rate-burst-ms",
                "same-msg",
                "num-parts",
                "multipart",
                "memset",
            ],
            Builtin::Sink => &[
                "in-channel",
                "verify",
                "num-parts",
                "multipart",
                "out-filename",
                "max-file-size",
            ],
            Builtin::Processor => &["in-channel", "out-channel", "touch"],
            Builtin::Splitter => &["in-channel", "out-channel", "routing"],
            Builtin::Merger | Builtin::Proxy | Builtin::Multiplier => {
                &["in-channel", "out-channel"]
            }
            Builtin::Client => &["out-channel", "msg-size"],
            Builtin::Server => &["in-channel"],
            Builtin::StfSource => &["stf-size"],
            Builtin::Builder => &["max-outstanding"],
            Builtin::MctsDriver => &[
                "rpc-group",
                "game",
                "board",
                "rollouts",
                "moves",
                "in-flight",
                "seconds",
            ],
            Builtin::MctsWorker => &["rpc-group", "game", "board", "playouts", "spread-depth"],
            Builtin::Replay => &["out-channel", "file", "speed"],
        }
    }

    /// Whether a device of this kind takes property `key`: one of its own, one every device
    /// takes, one of the channel or rpc namespaces, or one of `transport_properties` (what the
    /// binary's transports read).
    fn takes(self, key: &str, transport_properties: &[&str]) -> bool {
        if rpc_property_problem(key).is_some() {
            return false;
        }
        self.properties().contains(&key)
            || COMMON_PROPERTIES.contains(&key)
            || PROPERTY_NAMESPACES
                .iter()
                .any(|namespace| key.starts_with(namespace))
            || transport_properties.contains(&key)
    }

    /// Checks the properties a device of this kind called `id` would be given, as the device
    /// reads them when it starts (at INIT; the mcts devices as RUNNING starts), before anything
    /// runs (`ferromq validate`, `run` and `graph` on a topology, `ferromq device` before it
    /// binds): the same reading, so the same values are refused with the same error. What
    /// needs the device's surroundings (its channels, a `payload-file` or recording to read, an
    /// `out-filename` to create, its rpc group) is left to INIT.
    ///
    /// A key that no device of this kind reads (none of [`Builtin::properties`],
    /// [`COMMON_PROPERTIES`], the [`PROPERTY_NAMESPACES`] and `transport_properties`) is
    /// refused first, naming the nearest key it does take: a mistyped `msg-sise`, or `verify`
    /// given to a sampler, would otherwise change nothing, silently (FairMQ's devices refuse an
    /// option they do not have). `transport_properties` are the keys the binary's transports
    /// read ([`ferromq_core::TransportRegistry::property_keys`]).
    ///
    /// # Errors
    /// [`DeviceError::Property`] naming the device, the property and its value.
    pub fn check_properties(
        self,
        id: &str,
        properties: &BTreeMap<String, String>,
        transport_properties: &[&str],
    ) -> Result<(), DeviceError> {
        if let Some((key, value)) = properties
            .iter()
            .find(|(key, _)| !self.takes(key, transport_properties))
        {
            return Err(DeviceError::Property {
                device: id.to_owned(),
                key: key.clone(),
                problem: self.not_taken(key, value, transport_properties),
            });
        }
        for (key, value) in properties {
            ferromq_device::read_address_property(key, value).map_err(|problem| {
                DeviceError::Property {
                    device: id.to_owned(),
                    key: key.clone(),
                    problem,
                }
            })?;
        }
        let table = PropertyTable { id, properties };
        check_common_properties(&table)?;
        self.configure(&table)
    }

    /// What is wrong with property `key` (= `value`), which this kind does not take.
    fn not_taken(self, key: &str, value: &str, transport_properties: &[&str]) -> String {
        if let Some(problem) = rpc_property_problem(key) {
            return format!("(= {value:?}) {problem}");
        }
        let name = self.name();
        let own = self.properties();
        let nearest = own
            .iter()
            .chain(&COMMON_PROPERTIES)
            .chain(transport_properties)
            .map(|known| (strsim::levenshtein(key, known), *known))
            .filter(|(distance, _)| *distance <= 2)
            .min();
        let hint = match fairmq_option_as_property(key) {
            Some(hint) => format!("{hint}; "),
            None => nearest.map_or_else(String::new, |(_, known)| {
                format!("did you mean {known:?}? ")
            }),
        };
        let own = if own.is_empty() {
            "none of its own".to_owned()
        } else {
            own.join(", ")
        };
        format!(
            "(= {value:?}) is not one a {name} reads; {hint}it reads {own}, and any device's {}, \
             chan.<channel>.address, rpc.<group>.* and the transports' {}",
            COMMON_PROPERTIES.join(", "),
            if transport_properties.is_empty() {
                "(none)".to_owned()
            } else {
                transport_properties.join(", ")
            }
        )
    }

    /// Reads `props` as a device of this kind does at INIT (each device's `configure`).
    fn configure(self, table: &impl Properties) -> Result<(), DeviceError> {
        match self {
            Builtin::Sampler => Sampler::default().configure(table),
            Builtin::BenchmarkSampler => BenchmarkSampler::default().configure(table),
            Builtin::Sink => Sink::default().configure(table),
            Builtin::Processor => Processor::default().configure(table),
            Builtin::Splitter => Splitter::default().configure(table),
            Builtin::Client => Client::default().configure(table),
            Builtin::StfSource => StfSource::default().configure(table),
            Builtin::Builder => EventBuilder::default().configure(table),
            Builtin::MctsDriver => mcts::driver_settings(table).map(drop),
            Builtin::MctsWorker => mcts::worker_settings(table).map(drop),
            Builtin::Replay => Replay::default().configure(table),
            // Channel names only: any text is a name.
            Builtin::Merger | Builtin::Proxy | Builtin::Multiplier | Builtin::Server => Ok(()),
        }
    }
}

/// For a FairMQ device option given as a property (`bad-alloc-max-attempts = -1` in a
/// topology's `properties`, `--property shm-throw-bad-alloc=false`), what to give instead:
/// these options become other properties (`ferromq device`'s `DeviceOptions::shm_properties`),
/// so their own names are read by nobody.
fn fairmq_option_as_property(key: &str) -> Option<&'static str> {
    match key {
        "shm-throw-bad-alloc" | "bad-alloc-max-attempts" => Some(
            "it is a FairMQ device option (--shm-throw-bad-alloc, --bad-alloc-max-attempts): as a \
             property, give shm-allocation-timeout-ms (milliseconds an allocation waits for room)",
        ),
        "bad-alloc-attempt-interval" => Some(
            "it is a FairMQ device option (--bad-alloc-attempt-interval): as a property, give \
             shm-allocation-retry-ms",
        ),
        _ => None,
    }
}

/// The [`COMMON_PROPERTIES`]' values, whichever kind reads them: a sink took `rate=abc` or
/// `replica-index=abc` without a word, as it does not read them, where a sampler refused the
/// first. The rate is a rate; the replica index a number, below the replica count when that
/// is given.
fn check_common_properties(props: &impl Properties) -> Result<(), DeviceError> {
    rate_property(props, COMMON_PROPERTIES[0], 0.0)?;
    let index: u64 = props.parse_or(COMMON_PROPERTIES[1], 0)?;
    // The index alone (a seed, say) has no count to be below.
    if props.text(COMMON_PROPERTIES[2]).is_none() {
        return Ok(());
    }
    let count: u64 = props.parse_or(COMMON_PROPERTIES[2], 1)?;
    if count == 0 {
        return Err(props.invalid(
            COMMON_PROPERTIES[2],
            "has invalid value \"0\": expected at least 1 replica".to_owned(),
        ));
    }
    if index >= count {
        return Err(props.invalid(
            COMMON_PROPERTIES[1],
            format!(
                "has invalid value \"{index}\": expected below replica-count ({count}): replicas are numbered from 0"
            ),
        ));
    }
    Ok(())
}

/// Properties every device takes, whatever its kind: FairMQ's generic `rate` (`ferromq device`
/// always sets it; the samplers pace by it) and the launcher's replica index and count
/// ([`ferromq_topology::LAUNCHER_PROPERTIES`]).
pub const COMMON_PROPERTIES: [&str; 3] = [
    "rate",
    ferromq_topology::LAUNCHER_PROPERTIES[0],
    ferromq_topology::LAUNCHER_PROPERTIES[1],
];

/// What is wrong with `key` in the `rpc.` namespace: a key no rpc group's member reads
/// ([`ferromq_rpc::GROUP_KEYS`]), as a topology's check says it.
fn rpc_property_problem(key: &str) -> Option<String> {
    ferromq_topology::rpc_property_problem(key, &ferromq_rpc::GROUP_KEYS)
}

/// The namespaces of properties set per channel and per rpc group, which every device takes:
/// `chan.<channel>.address` (where the device runner binds a channel; the one key of its
/// namespace, [`ferromq_device::read_address_property`]) and `rpc.<group>.<setting>` (an rpc
/// group's members and settings, from the launcher).
pub const PROPERTY_NAMESPACES: [&str; 2] = [ferromq_device::CHANNEL_PROPERTY_PREFIX, "rpc."];

/// [`ferromq_topology::Known::check_properties`] for the built-in devices: what each would
/// refuse when it starts ([`Builtin::check_properties`]), checked while a topology loads, before
/// `ferromq validate` or `graph` says anything of a file or `ferromq run` starts a process. A
/// kind that is not built in is left alone. The fuzz crate's topology target loads with it too.
///
/// # Errors
/// The property at fault (when one is) and the device's error, naming the device, the property
/// and its value.
pub fn check_topology_properties(
    kind: &str,
    id: &str,
    properties: &BTreeMap<String, String>,
    transport_properties: &[&str],
) -> Result<(), ferromq_topology::PropertyProblem> {
    let Some(builtin) = Builtin::from_name(kind) else {
        return Ok(());
    };
    builtin
        .check_properties(id, properties, transport_properties)
        .map_err(|error| ferromq_topology::PropertyProblem {
            key: match &error {
                DeviceError::Property { key, .. } => Some(key.clone()),
                _ => None,
            },
            message: error.to_string(),
        })
}

/// [`ferromq_topology::Known::required_channels`] for the built-in devices: the channels a
/// device of `kind` uses ([`Builtin::channel_endpoints`], renamed by its properties as the
/// device renames them), each with how a device gets it; `None` for a kind not built in.
pub fn required_channels(
    kind: &str,
    properties: &BTreeMap<String, String>,
) -> Option<Vec<(String, String)>> {
    let builtin = Builtin::from_name(kind)?;
    let renames = builtin.properties();
    let how = |name: &str| match builtin {
        Builtin::MctsDriver | Builtin::MctsWorker => format!(
            "an [[rpc]] group named {:?} gives its members this channel",
            name.trim_end_matches("-out")
        ),
        _ => {
            let renamed: Vec<&str> = ["in-channel", "out-channel"]
                .into_iter()
                .filter(|key| renames.contains(key))
                .collect();
            if renamed.is_empty() {
                format!("a {kind} uses it")
            } else {
                format!("a {kind} uses it; {} renames it", renamed.join(" or "))
            }
        }
    };
    let endpoints = builtin.channel_endpoints(|key| properties.get(key).cloned());
    Some(
        endpoints
            .into_iter()
            .map(|(name, _, _)| {
                let how = how(&name);
                (name, how)
            })
            .collect(),
    )
}

/// Where a built-in device reads its properties: its context at INIT, or a topology's table
/// when [`Builtin::check_properties`] checks them before anything runs. Each device reads them
/// in one function (`configure`) over this trait, so both refuse the same values.
pub(crate) trait Properties {
    /// The device's id, for errors.
    fn device_id(&self) -> &str;

    /// Property `key` as text.
    fn text(&self, key: &str) -> Option<String>;

    /// Property `key` parsed as `T`, `default` when absent.
    fn parse_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, DeviceError>
    where
        T::Err: std::fmt::Display,
    {
        ferromq_device::parse_property(self.device_id(), key, self.text(key), default)
    }

    /// The error of property `key`, whose value is wrong as `problem` says.
    fn invalid(&self, key: &str, problem: String) -> DeviceError {
        DeviceError::Property {
            device: self.device_id().to_owned(),
            key: key.to_owned(),
            problem,
        }
    }
}

impl Properties for DeviceContext {
    fn device_id(&self) -> &str {
        self.id()
    }

    fn text(&self, key: &str) -> Option<String> {
        self.property_text(key)
    }
}

/// A topology's properties of one device, checked before it runs.
struct PropertyTable<'a> {
    id: &'a str,
    properties: &'a BTreeMap<String, String>,
}

impl Properties for PropertyTable<'_> {
    fn device_id(&self) -> &str {
        self.id
    }

    fn text(&self, key: &str) -> Option<String> {
        self.properties.get(key).cloned()
    }
}

/// `--max-iterations N` as FairMQ's benchmark devices count it: N iterations after the first,
/// N + 1 in all; 0 stays "no limit". See the crate docs.
pub fn fairmq_iterations(max_iterations: u64) -> u64 {
    if max_iterations == 0 {
        0
    } else {
        max_iterations.saturating_add(1)
    }
}

/// The most parts (`num-parts`) a sampler's or bsampler's message may have.
pub const MAX_PARTS: usize = 1024;

/// Property `num-parts` of a sender (sampler, bsampler): 1 to [`MAX_PARTS`], 1 when absent. A
/// message's parts are listed before they are made, so a count beyond that asked for a list no
/// memory holds and aborted the device.
pub(crate) fn parts_property(props: &impl Properties) -> Result<usize, DeviceError> {
    let n_parts = props.parse_or("num-parts", 1)?;
    if !(1..=MAX_PARTS).contains(&n_parts) {
        return Err(props.invalid(
            "num-parts",
            format!("has invalid value \"{n_parts}\": expected 1 to {MAX_PARTS}"),
        ));
    }
    Ok(n_parts)
}

/// Property `key` as a count or size of at least `minimum` (`default` when absent); `unit`
/// follows the minimum in the error, with why the device needs it. A smaller value is refused,
/// not raised to the minimum behind the user's back.
pub(crate) fn at_least(
    props: &impl Properties,
    key: &str,
    default: usize,
    minimum: usize,
    unit: &str,
) -> Result<usize, DeviceError> {
    let value = props.parse_or(key, default)?;
    if value < minimum {
        return Err(props.invalid(
            key,
            format!("has invalid value \"{value}\": expected at least {minimum} {unit}"),
        ));
    }
    Ok(value)
}

/// The lowest positive rate a sender takes: one message every ~31 years. Lower rates have an
/// interval no clock can represent.
pub const MIN_RATE: f64 = 1e-9;

/// Checks a rate in messages per second: 0 (unlimited), or finite and at least [`MIN_RATE`].
///
/// # Errors
/// The value and what was expected, for the caller to prefix with the option's name.
pub fn check_rate(rate: f64) -> Result<f64, String> {
    if rate == 0.0 || (rate.is_finite() && rate >= MIN_RATE) {
        Ok(rate)
    } else {
        Err(format!(
            "{rate:?}: expected 0 (unlimited) or a finite number of messages per second, at least {MIN_RATE:?}"
        ))
    }
}

/// Property `key` as a rate ([`check_rate`]).
pub(crate) fn rate_property(
    props: &impl Properties,
    key: &str,
    default: f64,
) -> Result<f64, DeviceError> {
    let rate: f64 = props.parse_or(key, default)?;
    check_rate(rate).map_err(|problem| props.invalid(key, format!("has invalid value {problem}")))
}

/// `rate-burst-ms` as a [`Pacer`]'s burst: 0 (a wake-up per message) up to
/// [`MAX_RATE_BURST_MS`].
///
/// # Errors
/// The value and what was expected, for the caller to prefix with the option's name.
pub fn check_rate_burst_ms(burst_ms: u64) -> Result<std::time::Duration, String> {
    if burst_ms <= MAX_RATE_BURST_MS {
        Ok(std::time::Duration::from_millis(burst_ms))
    } else {
        Err(format!(
            "{burst_ms}: expected 0 to {MAX_RATE_BURST_MS} ms, how long ahead of their due time paced messages may leave together"
        ))
    }
}

/// Property `rate-burst-ms` ([`check_rate_burst_ms`]; [`DEFAULT_RATE_BURST_MS`], FairMQ's
/// slice, when absent) of a sender paced to `rate` messages a second. Given without a pace
/// (`rate` 0) it would shape nothing, so it is refused.
pub(crate) fn rate_burst_property(
    props: &impl Properties,
    rate: f64,
) -> Result<std::time::Duration, DeviceError> {
    let burst_ms: u64 = props.parse_or("rate-burst-ms", DEFAULT_RATE_BURST_MS)?;
    let burst = check_rate_burst_ms(burst_ms).map_err(|problem| {
        props.invalid("rate-burst-ms", format!("has invalid value {problem}"))
    })?;
    if rate == 0.0 && props.text("rate-burst-ms").is_some() {
        return Err(props.invalid(
            "rate-burst-ms",
            format!(
                "(= {burst_ms}) is given without a pace: it shapes the bursts of a paced sender (give rate or msg-rate too)"
            ),
        ));
    }
    Ok(burst)
}

/// A zeroed heap buffer of `size` bytes, or an error naming `key` and the size when this process
/// cannot have that much memory (instead of aborting).
pub(crate) fn try_zeroed(key: &str, size: usize) -> Result<Vec<u8>, BoxError> {
    let mut bytes = try_with_capacity(key, size)?;
    bytes.resize(size, 0);
    Ok(bytes)
}

/// An empty heap buffer with room for `size` bytes, or [`try_zeroed`]'s error.
pub(crate) fn try_with_capacity(key: &str, size: usize) -> Result<Vec<u8>, BoxError> {
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(size)
        .map_err(|_| format!("{key} {size}: cannot allocate {size} bytes"))?;
    Ok(bytes)
}

/// A message of `size` bytes (property `key`) for channel `channel`, promised before STOP (an
/// answer to a request taken): from the transport, fallibly, waiting for its room whether or
/// not STOP came, as the promise's send does. Other senders use [`Outgoing`].
pub(crate) async fn allocate_promised(
    ctx: &mut DeviceContext,
    channel: &str,
    key: &str,
    size: usize,
) -> Result<Message, BoxError> {
    let made = match ctx.transport_of(channel) {
        Ok(transport) => transport.new_message(size).await.map_err(DeviceError::from),
        // A channel whose transport is not made gets its messages from the context, which
        // makes them on the heap without waiting.
        Err(_) => ctx.new_message(channel, size).await,
    };
    made.map_err(|error| allocation_failed(key, size, &error))
}

/// The messages a sender makes for one channel, from the channel's transport (a shmem block, a
/// recycled zeromq buffer), fallibly: an impossible size is an error naming the property
/// (`key`) and the size.
///
/// A transport with room makes a message at once, and no future is built around it (racing
/// every allocation against STOP cost a 64 B shmem bsampler 8 % of its rate). A full one
/// waits for room (a shmem segment whose blocks a stalled receiver holds): up to its
/// allocation timeout or, with `shm-throw-bad-alloc false`, for as long as it takes. STOP
/// (SIGINT included) ends that wait ([`DeviceContext::new_message`]), as FairMQ's allocation
/// loop gives up when the device is interrupted; a sender would otherwise sit out the stop the
/// same time.
pub(crate) struct Outgoing {
    channel: ChannelId,
    /// The channel's transport, for the messages made at once.
    transport: Option<Arc<dyn Transport>>,
    key: &'static str,
}

impl Outgoing {
    /// The messages of channel `name`, whose size is property `key`.
    ///
    /// # Errors
    /// [`DeviceError::UnknownChannel`].
    pub(crate) fn new(
        ctx: &DeviceContext,
        name: &str,
        key: &'static str,
    ) -> Result<Outgoing, DeviceError> {
        Ok(Outgoing {
            channel: ctx.channel_id(name)?,
            // A channel whose transport is not made gets its messages from the context.
            transport: ctx.transport_of(name).ok(),
            key,
        })
    }

    /// A message of `size` bytes; `None` when STOP came while the transport waited for room.
    pub(crate) async fn message(
        &self,
        ctx: &mut DeviceContext,
        size: usize,
    ) -> Option<Result<Message, BoxError>> {
        let at_once = self
            .transport
            .as_ref()
            .and_then(|transport| transport.try_new_message(size));
        if let Some(message) = at_once {
            return Some(Ok(message));
        }
        match ctx.new_message_on(self.channel, size).await {
            Err(DeviceError::Channel(ferromq_core::Error::Interrupted { .. })) => None,
            made => Some(made.map_err(|error| allocation_failed(self.key, size, &error))),
        }
    }
}

/// The error of a message of `size` bytes (property `key`) that could not be made.
pub(crate) fn allocation_failed(
    key: &str,
    size: usize,
    error: &(dyn std::error::Error + 'static),
) -> BoxError {
    format!(
        "{key} {size}: cannot allocate {size} bytes: {}",
        ferromq_core::error_chain(error)
    )
    .into()
}

/// Prints a device's summary line (its result: `[id] sink summary: ...`) on stdout, whatever the
/// log level. A stdout that cannot take it (closed: `ferromq device sink ... | head -c 1`) loses
/// the line and nothing else, as the log lines are lost there: `println!` panicked on a broken
/// pipe, and the device failed.
pub(crate) fn print_summary(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _lost = writeln!(std::io::stdout().lock(), "{line}");
}

/// FNV-1a, 64 bits: fast, dependency-free, enough to catch corruption and misrouting.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes the checksum header of `message` (its first 8 bytes hash the rest).
pub fn write_checksum(message: &mut [u8]) {
    if message.len() < 8 {
        return;
    }
    let hash = fnv1a(&message[8..]);
    message[..8].copy_from_slice(&hash.to_le_bytes());
}

/// True when the first 8 bytes of `message` hash the rest.
pub fn checksum_ok(message: &[u8]) -> bool {
    message.len() >= 8 && message[..8] == fnv1a(&message[8..]).to_le_bytes()
}

pub(crate) fn channel_property(props: &impl Properties, key: &str, default: &str) -> String {
    props.text(key).unwrap_or_else(|| default.to_owned())
}

/// The sockets of channel `base` (`data-out[0]`, `data-out[1]`, or just `data-out`).
///
/// # Errors
/// The context's [`DeviceError::UnknownChannel`]: it lists the channels, or says there are
/// none and how to give one.
pub(crate) fn sockets_of(ctx: &DeviceContext, base: &str) -> Result<Vec<String>, DeviceError> {
    let names = ctx.sub_channel_names(base);
    if names.is_empty() {
        // No channel `base`: resolved as every operation resolves a name, it fails with the
        // context's own error (a socket configured as `base[0]` would be found, and used).
        ctx.channel_id(base)?;
        return Ok(vec![base.to_owned()]);
    }
    Ok(names)
}

/// Bytes checksummed (written by a sampler, read by a verifying sink) between two turns a
/// device gives the runtime's other tasks, its control and observer endpoints among them. A
/// checksum reads every byte, ~1 ms a MiB here (ten times that in a debug build), and a
/// sampler behind its pace (or a sink with messages waiting) never waits, so it gave them a
/// turn only every 128 sends or receives (tokio's budget): a 1 MiB sampler at 200 msg/s in a
/// debug build left `ferromq top` without an answer for over a second.
pub(crate) const CHECKSUM_BYTES_PER_TURN: usize = 4 << 20;

/// What a built-in device does on a channel: checked against its sockets' types at INIT, so
/// that a sampler whose `data` is a pull fails there, naming the channel and its type, not at
/// its first send in RUNNING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Sends one message after another (push, pub, pair): a req sends one request and then
    /// waits for its reply, and a rep sends only replies.
    Sends,
    /// Receives one message after another (pull, sub, pair): a rep must answer each request
    /// before it takes the next, and a req receives only replies.
    Receives,
    /// Sends requests and receives their replies (req, pair): a client.
    Requests,
    /// Receives requests and answers each (rep, pair): a server.
    Answers,
}

impl Role {
    /// Whether a socket of `socket_type` does this, and the verb for an error that it does not.
    fn done_by(self, socket_type: SocketType) -> (bool, &'static str) {
        use SocketType::{Pair, Pub, Pull, Push, Rep, Req, Sub};
        match self {
            Role::Sends => (matches!(socket_type, Push | Pub | Pair), "send"),
            Role::Receives => (matches!(socket_type, Pull | Sub | Pair), "receive"),
            Role::Requests => (matches!(socket_type, Req | Pair), "request"),
            Role::Answers => (matches!(socket_type, Rep | Pair), "answer"),
        }
    }
}

/// The sockets of channel `base` (`base`, or `base[0]`, `base[1]`, ...), each of a type that
/// can do `role`: for devices that use every socket of the channel (a processor's inputs).
///
/// # Errors
/// [`DeviceError::UnknownChannel`] listing the channels; [`DeviceError::ChannelRole`] naming a
/// socket of the wrong type.
pub(crate) fn checked_sockets(
    ctx: &mut DeviceContext,
    base: &str,
    role: Role,
) -> Result<Vec<String>, DeviceError> {
    let names = sockets_of(ctx, base)?;
    for name in &names {
        checked_socket(ctx, name, role)?;
    }
    Ok(names)
}

/// The socket `name` the device uses (`name` itself, or `name[0]` of a channel with
/// sub-channels, as every operation on `name` resolves it) can do `role`.
///
/// # Errors
/// [`DeviceError::UnknownChannel`] listing the channels; [`DeviceError::ChannelRole`] naming the
/// socket and its type.
pub(crate) fn checked_socket(
    ctx: &mut DeviceContext,
    name: &str,
    role: Role,
) -> Result<(), DeviceError> {
    let socket = ctx.channel(name)?.config();
    let (socket_type, socket_name) = (socket.socket_type, socket.name.clone());
    let (able, action) = role.done_by(socket_type);
    if able {
        return Ok(());
    }
    Err(DeviceError::ChannelRole {
        device: ctx.id().to_owned(),
        channel: if socket_name == name {
            name.to_owned()
        } else {
            format!("{name} ({socket_name})")
        },
        socket_type,
        action,
    })
}

/// A boolean property in FairMQ's spellings: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`.
pub(crate) fn bool_property(
    props: &impl Properties,
    key: &str,
    default: bool,
) -> Result<bool, DeviceError> {
    let Some(text) = props.text(key) else {
        return Ok(default);
    };
    flag_value(&text).ok_or_else(|| {
        props.invalid(
            key,
            format!("has invalid value {text:?}: expected true or false"),
        )
    })
}

/// A flag property's value as the devices read it: `true`, `1`, `yes`, `on` or their
/// opposites, in any case; `None` for anything else.
pub fn flag_value(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_round_trip_and_detection() {
        let mut message = b"01234567payload".to_vec();
        write_checksum(&mut message);
        assert!(checksum_ok(&message));
        message[10] ^= 1;
        assert!(!checksum_ok(&message));
        assert!(!checksum_ok(b"short"));
    }

    #[test]
    fn rates_are_checked() {
        for good in [0.0, 1.0, 1e6, MIN_RATE] {
            assert_eq!(check_rate(good), Ok(good));
        }
        for bad in [-1.0, 1e-300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let problem = check_rate(bad).unwrap_err();
            assert!(problem.starts_with(&format!("{bad:?}:")), "{problem}");
        }
    }

    /// A topology's replay with a tiny `speed` passed `ferromq validate` and then panicked
    /// the device turning the first recorded gap into a wait.
    #[test]
    fn replay_speeds_are_checked_before_anything_runs() {
        let with_speed = |speed: &str| {
            let properties = BTreeMap::from([
                ("file".to_owned(), "rec.fmqr".to_owned()),
                ("speed".to_owned(), speed.to_owned()),
            ]);
            check_topology_properties("replay", "replay1", &properties, &[])
        };
        for good in ["0", "1", "2.5", "0.001", "1e9"] {
            assert!(with_speed(good).is_ok(), "speed {good}");
        }
        for bad in ["1e-30", "1e-300", "0.0009", "-1", "NaN", "inf", "2e9"] {
            let problem = with_speed(bad).unwrap_err();
            assert_eq!(problem.key.as_deref(), Some("speed"), "speed {bad}");
            assert!(
                problem.message.contains("from 1e-3 to 1e9"),
                "{}",
                problem.message
            );
        }
    }

    /// Found by a sweep: a bsampler took any `num-parts`, and 10^12 aborted it listing the
    /// parts of its first message (`memory allocation of 48000000000000 bytes failed`).
    #[test]
    fn both_samplers_send_1_to_max_parts() {
        let with_parts = |kind: &str, n_parts: &str| {
            let properties = BTreeMap::from([("num-parts".to_owned(), n_parts.to_owned())]);
            check_topology_properties(kind, "d", &properties, &[])
        };
        for kind in ["sampler", "bsampler"] {
            for good in ["1", "1024"] {
                assert!(with_parts(kind, good).is_ok(), "{kind} num-parts {good}");
            }
            for bad in ["0", "1025", "1000000000000"] {
                let problem = with_parts(kind, bad).unwrap_err();
                assert_eq!(
                    problem.message,
                    format!(
                        "device \"d\": property \"num-parts\" has invalid value \"{bad}\": expected 1 to 1024"
                    ),
                    "{kind}"
                );
            }
        }
    }

    /// [`check_topology_properties`] of device "d" of `kind` with the properties `pairs`.
    fn check_pairs(
        kind: &str,
        pairs: &[(&str, &str)],
    ) -> Result<(), ferromq_topology::PropertyProblem> {
        let properties: BTreeMap<String, String> = pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        check_topology_properties(kind, "d", &properties, &[])
    }

    /// `rate-burst-ms`: 0 to 1000 on both samplers when they are paced; anything else refused
    /// naming it, and so is a burst given to a sender without a pace (it would shape nothing).
    #[test]
    fn both_samplers_take_a_rate_burst_of_0_to_1000_ms_with_a_pace() {
        for (kind, pace) in [("sampler", "rate"), ("bsampler", "msg-rate")] {
            let with_burst =
                |burst: &str| check_pairs(kind, &[(pace, "2500"), ("rate-burst-ms", burst)]);
            for good in ["0", "5", "20", "1000"] {
                assert!(with_burst(good).is_ok(), "{kind} rate-burst-ms {good}");
            }
            let problem = with_burst("1001").unwrap_err();
            assert_eq!(problem.key.as_deref(), Some("rate-burst-ms"));
            assert!(
                problem.message.starts_with(
                    "device \"d\": property \"rate-burst-ms\" has invalid value 1001: expected 0 to 1000 ms"
                ),
                "{kind}: {}",
                problem.message
            );
            for bad in ["-5", "2.5", "abc"] {
                let problem = with_burst(bad).unwrap_err();
                assert!(
                    problem.message.contains("\"rate-burst-ms\"") && problem.message.contains(bad),
                    "{kind}: {}",
                    problem.message
                );
            }
            let problem = check_pairs(kind, &[("rate-burst-ms", "20")]).unwrap_err();
            assert_eq!(
                problem.message,
                "device \"d\": property \"rate-burst-ms\" (= 20) is given without a pace: it shapes the bursts of a paced sender (give rate or msg-rate too)",
                "{kind}"
            );
        }
        // A kind that does not pace refuses it as one it does not read.
        let problem = check_pairs("sink", &[("rate-burst-ms", "20")]).unwrap_err();
        assert!(
            problem.message.starts_with(
                "device \"d\": property \"rate-burst-ms\" (= \"20\") is not one a sink reads"
            ),
            "{}",
            problem.message
        );
    }

    /// Found by a sweep: a sink, which reads none of them, took `rate=abc`, `replica-index=abc`
    /// and a replica index at or past the replica count without a word.
    #[test]
    fn every_kind_checks_the_common_properties() {
        for kind in ["sink", "sampler", "server"] {
            for (pairs, problem) in [
                (&[("rate", "abc")][..], "property \"rate\""),
                (
                    &[("replica-index", "abc")][..],
                    "property \"replica-index\"",
                ),
                (
                    &[("replica-index", "5"), ("replica-count", "2")][..],
                    "property \"replica-index\" has invalid value \"5\": expected below replica-count (2)",
                ),
                (
                    &[("replica-count", "0")][..],
                    "property \"replica-count\" has invalid value \"0\": expected at least 1 replica",
                ),
            ] {
                let refused = check_pairs(kind, pairs).unwrap_err();
                assert!(
                    refused.message.contains(problem),
                    "{kind}: {}",
                    refused.message
                );
            }
            assert!(
                check_pairs(
                    kind,
                    &[
                        ("replica-index", "1"),
                        ("replica-count", "2"),
                        ("rate", "0")
                    ]
                )
                .is_ok()
            );
        }
    }

    /// Found by a sweep: values below what a device can work with were raised silently (a
    /// client's `msg-size` 0 sent 8-byte requests, a stf-source's `stf-size` 0 sent 12 bytes,
    /// a builder's `max-outstanding` 0 kept one event in flight).
    #[test]
    fn values_below_a_minimum_are_refused_naming_it() {
        let check = |kind: &str, key: &str, value: &str| {
            let properties = BTreeMap::from([(key.to_owned(), value.to_owned())]);
            check_topology_properties(kind, "d", &properties, &[])
        };
        for (kind, key, below, minimum) in [
            ("client", "msg-size", "0", "8"),
            ("client", "msg-size", "7", "8"),
            ("stf-source", "stf-size", "0", "12"),
            ("stf-source", "stf-size", "11", "12"),
            ("builder", "max-outstanding", "0", "1"),
        ] {
            assert!(check(kind, key, minimum).is_ok(), "{kind} {key} {minimum}");
            let problem = check(kind, key, below).unwrap_err();
            assert_eq!(problem.key.as_deref(), Some(key));
            let expected = format!(
                "device \"d\": property \"{key}\" has invalid value \"{below}\": expected at least {minimum} "
            );
            assert!(
                problem.message.starts_with(&expected),
                "{}",
                problem.message
            );
        }
        // A simulation's playouts are not interrupted: 10^9 of them kept a worker in one
        // handler for hours, past any search's time; 0 evaluated nothing.
        let max = ferromq_mcts::search::SearchSettings::MAX_PLAYOUTS.to_string();
        assert!(check("mcts-worker", "playouts", &max).is_ok());
        for bad in ["0", "65537", "1000000000"] {
            let problem = check("mcts-worker", "playouts", bad).unwrap_err();
            assert_eq!(
                problem.message,
                format!(
                    "device \"d\": property \"playouts\" has invalid value \"{bad}\": expected 1 \
                     to 65536 random games per new node"
                )
            );
        }
    }

    /// Found by a sweep: `bsampler --rate 10 --msg-rate 1000` sent 1000 a second, silently.
    /// `ferromq device` always sets `rate` (0 unless given), so 0 counts as not given.
    #[test]
    fn a_bsampler_takes_one_rate() {
        let check = |rates: &[(&str, &str)]| {
            let properties = rates
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect();
            check_topology_properties("bsampler", "d", &properties, &[])
        };
        for good in [
            &[("rate", "10")][..],
            &[("msg-rate", "1000")],
            &[("rate", "0"), ("msg-rate", "1000")],
            &[("rate", "10"), ("msg-rate", "10")],
        ] {
            assert!(check(good).is_ok(), "{good:?}");
        }
        let problem = check(&[("rate", "10"), ("msg-rate", "1000")]).unwrap_err();
        assert_eq!(problem.key.as_deref(), Some("msg-rate"));
        assert_eq!(
            problem.message,
            "device \"d\": property \"msg-rate\" (= \"1000\") is given with \"rate\" (= \"10\"): \
             both are a bsampler's messages per second; give one"
        );
    }

    #[test]
    fn iterations_count_as_fairmq_does() {
        assert_eq!(fairmq_iterations(0), 0);
        assert_eq!(fairmq_iterations(1000), 1001);
        assert_eq!(fairmq_iterations(u64::MAX), u64::MAX);
    }

    #[test]
    fn impossible_sizes_are_errors_naming_the_size() {
        let error = try_zeroed("msg-size", usize::MAX).unwrap_err().to_string();
        assert!(error.contains(&usize::MAX.to_string()), "{error}");
        assert_eq!(try_zeroed("msg-size", 3).unwrap(), vec![0; 3]);
    }

    /// Records the keys a device's reading asks for.
    struct Recording {
        asked: std::cell::RefCell<std::collections::BTreeSet<String>>,
    }

    impl Properties for Recording {
        fn device_id(&self) -> &str {
            "recording"
        }

        fn text(&self, key: &str) -> Option<String> {
            self.asked.borrow_mut().insert(key.to_owned());
            None
        }
    }

    /// Every key a kind's reading asks for is one it says it takes: a key missing from
    /// [`Builtin::properties`] would be refused although the device reads it.
    #[test]
    fn each_kind_is_found_by_its_own_name() {
        for (name, kind) in Builtin::ALL {
            assert_eq!(kind.name(), name);
            assert_eq!(Builtin::from_name(name), Some(kind));
        }
    }

    #[test]
    fn each_kind_reads_only_the_properties_it_lists() {
        for (name, kind) in Builtin::ALL {
            let recording = Recording {
                asked: std::cell::RefCell::default(),
            };
            // Some readings stop at a missing required key (`replay`'s file): still a subset.
            let _ = kind.configure(&recording);
            for key in recording.asked.into_inner() {
                assert!(
                    kind.takes(&key, &[]),
                    "{name} reads {key:?} but does not list it"
                );
            }
            let renamed = |key: &str| {
                assert!(kind.takes(key, &[]), "{name}'s channels read {key:?}");
                None
            };
            kind.channel_endpoints(renamed);
        }
    }

    /// Found by a bad-input sweep: `ferromq device sink --msg-size 100`, a topology's sampler
    /// with `msg-sise = 100` or `verify = true`, were taken and changed nothing.
    #[test]
    fn a_property_the_kind_does_not_read_is_refused_naming_the_nearest() {
        let check = |kind: &str, key: &str| {
            let properties = BTreeMap::from([(key.to_owned(), "100".to_owned())]);
            check_topology_properties(kind, "d", &properties, &["shm-segment-size"])
        };
        let problem = check("sampler", "msg-sise").unwrap_err();
        assert_eq!(problem.key.as_deref(), Some("msg-sise"));
        assert!(
            problem.message.starts_with(
                "device \"d\": property \"msg-sise\" (= \"100\") is not one a sampler reads; \
                 did you mean \"msg-size\"? it reads out-channel, msg-size,"
            ),
            "{}",
            problem.message
        );
        assert!(
            problem
                .message
                .ends_with("the transports' shm-segment-size"),
            "{}",
            problem.message
        );
        let problem = check("sink", "msg-size").unwrap_err();
        assert!(
            problem
                .message
                .contains("is not one a sink reads; it reads in-channel"),
            "{}",
            problem.message
        );
        // FairMQ's allocation options are options, not properties: said so, with the
        // properties they become.
        let problem = check("sampler", "bad-alloc-max-attempts").unwrap_err();
        assert!(
            problem.message.contains(
                "property \"bad-alloc-max-attempts\" (= \"100\") is not one a sampler reads; it \
                 is a FairMQ device option (--shm-throw-bad-alloc, --bad-alloc-max-attempts): as a \
                 property, give shm-allocation-timeout-ms"
            ),
            "{}",
            problem.message
        );
        let problem = check("sink", "bad-alloc-attempt-interval").unwrap_err();
        assert!(
            problem
                .message
                .contains("as a property, give shm-allocation-retry-ms"),
            "{}",
            problem.message
        );
        let problem = check("merger", "shm-segment-sise").unwrap_err();
        assert!(
            problem
                .message
                .contains("did you mean \"shm-segment-size\""),
            "{}",
            problem.message
        );
        // What every device takes, the namespaces, the transports' keys; a kind not built in
        // is not checked.
        for key in [
            "rate",
            "replica-index",
            "rpc.search.aggregate",
            "shm-segment-size",
        ] {
            assert!(check("sink", key).is_ok(), "{key}");
        }
        // The channel namespace holds one key, whose value is a list of addresses.
        let address = BTreeMap::from([(
            "chan.data.address".to_owned(),
            "tcp://127.0.0.1:0;ipc:///tmp/x".to_owned(),
        )]);
        assert!(check_topology_properties("sink", "d", &address, &[]).is_ok());
        let problem = check("sink", "chan.data.address").unwrap_err();
        assert_eq!(problem.key.as_deref(), Some("chan.data.address"));
        assert!(
            problem
                .message
                .contains("has an address that does not parse"),
            "{}",
            problem.message
        );
        assert!(check("exec", "anything").is_ok());
        // Of the rpc namespace only the keys a group's member reads: `ferromq device` took a
        // mistyped `rpc.g.agregate` and changed nothing.
        let problem = check("mcts-worker", "rpc.search.agregate").unwrap_err();
        assert_eq!(
            problem.message,
            "device \"d\": property \"rpc.search.agregate\" (= \"100\") is not one an rpc group \
             reads; did you mean \"rpc.search.aggregate\"? it reads rpc.<group>.members, aggregate, \
             aggregate-bytes, aggregate-us, timeout-ms, tree-arity"
        );
        assert!(check("sink", "rpc.search").is_err());
    }

    #[test]
    fn every_kind_has_a_name() {
        for (name, kind) in Builtin::ALL {
            assert_eq!(Builtin::from_name(name), Some(kind));
        }
        assert_eq!(Builtin::from_name("teleporter"), None);
    }
}
