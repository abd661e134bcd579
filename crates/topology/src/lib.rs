//! Topologies: a whole pipeline in one TOML file.
//!
//! This is the only crate that knows TOML. [`load`] parses a file, checks it (reporting every
//! problem, each with file, line and column and the device and channel it is about), and gives a
//! typed [`Topology`]; [`Topology::instances`] expands replicas and connections into the device
//! instances a launcher starts. The format is documented in `docs/topology.md`.
//!
//! ```
//! let text = r#"
//! transport = "zeromq"
//! [[device]]
//! id = "sampler"
//! kind = "sampler"
//! [[device.channel]]
//! name = "data"
//! type = "push"
//! [[device]]
//! id = "sink"
//! kind = "sink"
//! [[device.channel]]
//! name = "data"
//! type = "pull"
//! connect = "sampler.data"
//! "#;
//! let known = ferromq_topology::Known {
//!     kinds: &["sampler", "sink"],
//!     transports: &["zeromq"],
//!     transport_properties: &[],
//!     transport_schemes: &[("zeromq", &["tcp", "ipc"])],
//!     rpc_group_keys: &["members"],
//!     check_properties: None,
//!     required_channels: None,
//! };
//! let topology = ferromq_topology::load("demo.toml", text, &known).unwrap();
//! assert_eq!(topology.instances().len(), 2);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod check;

pub use check::rpc_property_problem;
mod file_form;

use std::collections::BTreeMap;
use std::fmt;

use ferromq_core::ChannelConfig;

/// The properties a launcher gives every instance of a device itself (its replica's index and
/// the device's replica count), which a topology file may not set.
pub const LAUNCHER_PROPERTIES: [&str; 2] = ["replica-index", "replica-count"];

/// What the binary that loads the topology has built in.
#[derive(Debug, Clone, Copy)]
pub struct Known<'a> {
    /// Built-in device kinds (`exec` is always known).
    pub kinds: &'a [&'a str],
    /// Transports.
    pub transports: &'a [&'a str],
    /// The device properties those transports read (`shm-segment-size`, ...), handed to
    /// [`Known::check_properties`]: a built-in device takes them besides its own.
    pub transport_properties: &'a [&'a str],
    /// The address schemes each transport takes (`("ofi", &["tcp", "verbs"])`): a channel's
    /// address with another is refused at its line. A transport not listed is not judged.
    pub transport_schemes: &'a [(&'a str, &'a [&'a str])],
    /// The keys an rpc group's member reads, `rpc.<group>.<key>` (ferromq-rpc's
    /// `GROUP_KEYS`): any other `rpc.` property is refused as one that changes nothing.
    pub rpc_group_keys: &'a [&'a str],
    /// Checks a built-in device's `properties` as the device itself will read them, so that a
    /// value it would refuse when it starts is reported with the file's line before anything
    /// runs;
    /// `None` checks nothing beyond their form.
    pub check_properties: Option<CheckProperties>,
    /// The channels a built-in device uses, each with what provides it, so that a device
    /// without one is reported at its kind before anything runs; `None` checks no names.
    pub required_channels: Option<RequiredChannels>,
}

/// A built-in kind's channels as its properties name them (`in-channel` renames, an rpc group's
/// `rpc-group`): `(name, how a device gets it)`; `None` for a kind that is not built in.
pub type RequiredChannels =
    fn(kind: &str, properties: &BTreeMap<String, String>) -> Option<Vec<(String, String)>>;

/// A built-in kind's property check: the kind, the device's id, its properties as text, and the
/// keys the transports read ([`Known::transport_properties`]).
pub type CheckProperties = fn(
    kind: &str,
    id: &str,
    properties: &BTreeMap<String, String>,
    transport_properties: &[&str],
) -> Result<(), PropertyProblem>;

/// What [`CheckProperties`] found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropertyProblem {
    /// The property at fault, when one is (the error is reported at its value).
    pub key: Option<String>,
    /// What is wrong, naming the device, the property and its value (reported as it is).
    pub message: String,
}

/// One problem in a topology file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyError {
    /// The file.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Device and channel it is about (`device "sink" channel "data"`), or empty.
    pub context: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if !self.context.is_empty() {
            write!(f, "{}: ", self.context)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a topology file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct TopologyErrors(pub Vec<TopologyError>);

impl fmt::Display for TopologyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}
/// How a device is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// A built-in device of the `ferromq` binary.
    Builtin(String),
    /// A program and its arguments; it takes FairMQ's device options (`run_device_main`).
    Exec(Vec<String>),
}

/// A channel of a device, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSpec {
    /// The configuration (address `None` for the launcher to assign).
    pub config: ChannelConfig,
    /// `(device, channel)` pairs a connecting channel connects to.
    pub connect: Vec<(String, String)>,
}

/// A device of the topology, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Its id.
    pub id: String,
    /// How to start it.
    pub kind: DeviceKind,
    /// How many copies (worker pools).
    pub replicas: usize,
    /// Device properties, as text.
    pub properties: BTreeMap<String, String>,
    /// Leave RUNNING after this many iterations (0 = never).
    pub max_iterations: u64,
    /// Its channels.
    pub channels: Vec<ChannelSpec>,
    /// Where its replicas run, in turn (replica i on `hosts[i % len]`); empty: the launcher's
    /// host.
    pub hosts: Vec<HostRef>,
    /// Whether a launcher starts a replica again when its process ends while the topology runs.
    pub restart: RestartPolicy,
    /// The fewest replicas that must live for the topology to go on (`replicas` unless the
    /// file says `expendable = true`, which is 0, or `min-replicas`).
    pub min_replicas: usize,
}

/// When a launcher starts a device's process again (`restart = "..."`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Restart {
    /// Never: its end ends the topology (unless it is expendable).
    #[default]
    Never,
    /// When it exits with a non-zero code or is killed by a signal.
    OnFailure,
    /// Whenever it exits while the topology runs, with code 0 too.
    Always,
}

impl Restart {
    /// Whether a process that ended with `success` (exit code 0) is started again.
    pub fn applies(self, success: bool) -> bool {
        match self {
            Restart::Never => false,
            Restart::OnFailure => !success,
            Restart::Always => true,
        }
    }
}

/// How a device is restarted: when, how many times at most, and how long to wait first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// When.
    pub when: Restart,
    /// The most restarts of one instance (`max-restarts`); one more end fails the topology as
    /// without a policy.
    pub limit: u32,
    /// The wait before the first restart (`restart-delay`, seconds); it doubles for each
    /// further one, up to [`RestartPolicy::MAX_DELAY`].
    pub delay: std::time::Duration,
}

impl RestartPolicy {
    /// `max-restarts` when the file gives none.
    pub const DEFAULT_LIMIT: u32 = 5;
    /// The most restarts a file may allow.
    pub const MAX_LIMIT: u32 = 1_000_000;
    /// `restart-delay` when the file gives none.
    pub const DEFAULT_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
    /// The longest wait between restarts, however many came before.
    pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(60);

    /// The wait before restart number `restart` (1 for the first): the delay doubled for each
    /// one before it, at most [`RestartPolicy::MAX_DELAY`].
    pub fn delay_before(&self, restart: u32) -> std::time::Duration {
        let doublings = restart.saturating_sub(1).min(16);
        self.delay
            .saturating_mul(1 << doublings)
            .min(Self::MAX_DELAY.max(self.delay))
    }
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            when: Restart::Never,
            limit: Self::DEFAULT_LIMIT,
            delay: Self::DEFAULT_DELAY,
        }
    }
}

/// A host a device is placed on, as the file names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostRef {
    /// By name: a `[hosts]` entry, an SSH destination or a Slurm node name.
    Name(String),
    /// By position: in the launcher's host list (`--hosts`) or the Slurm allocation's nodes.
    Index(usize),
}

impl fmt::Display for HostRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostRef::Name(name) => f.write_str(name),
            HostRef::Index(index) => write!(f, "host {index}"),
        }
    }
}

/// How a launcher reaches a host named in `[hosts]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSpec {
    /// The SSH destination (`user@machine`, or a `Host` of the user's ssh config); default the
    /// host's name.
    pub ssh: Option<String>,
    /// The address other hosts reach this one at (binders bind on it); default the SSH
    /// destination's machine, or the Slurm node's `NodeAddr`.
    pub address: Option<String>,
    /// The `ferromq` binary on that host; default the launcher's own path.
    pub ferromq: Option<String>,
}

/// Addresses the launcher gives binding channels that have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoAddress {
    /// A unix socket in the launcher's run directory.
    Ipc,
    /// A free port on 127.0.0.1.
    Tcp,
}

/// A checked topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The file it came from.
    pub file: String,
    /// Transport of channels that name none.
    pub transport: String,
    /// How omitted addresses are assigned.
    pub auto_address: AutoAddress,
    /// The devices, in file order.
    pub devices: Vec<DeviceSpec>,
    /// `[hosts]`: how to reach hosts by name.
    pub hosts: BTreeMap<String, HostSpec>,
}

/// One process to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its device id (`worker-2` for the third replica of `worker`).
    pub id: String,
    /// The device it is a replica of.
    pub device: String,
    /// How to start it.
    pub kind: DeviceKind,
    /// Properties.
    pub properties: BTreeMap<String, String>,
    /// `--max-iterations`.
    pub max_iterations: u64,
    /// Which replica this is (0 for a device without replicas).
    pub replica_index: usize,
    /// How many replicas the device has.
    pub replica_count: usize,
    /// Channels; a connecting channel lists the `(instance, socket)` pairs it connects to.
    pub channels: Vec<InstanceChannel>,
    /// Where it runs (`None`: the launcher's host).
    pub host: Option<HostRef>,
    /// Its device's restart policy.
    pub restart: RestartPolicy,
    /// Its device's fewest live replicas for the topology to go on (0: expendable).
    pub min_replicas: usize,
}

/// A channel of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceChannel {
    /// Its configuration.
    pub config: ChannelConfig,
    /// For connecting channels: the binders' `(instance id, socket name)`.
    pub connect_to: Vec<(String, String)>,
}
/// The most replicas one device may have.
pub const MAX_REPLICAS: usize = 1024;

/// The largest host index (`host = 3`: the fourth host of the allocation or `--hosts`).
pub const MAX_HOST_INDEX: usize = 4095;

/// The most instances (processes) a topology may expand to.
pub const MAX_INSTANCES: usize = 4096;

/// The most instance-to-instance connections a topology may expand to: a bound on the work and
/// memory of [`Topology::instances`], whatever the file says.
pub const MAX_CONNECTIONS: u64 = 1_000_000;
/// Parses and checks a topology.
///
/// # Errors
/// [`TopologyErrors`] with every problem found (syntax, unknown keys, duplicates, dangling or
/// incompatible connections, address clashes, unknown kinds or transports, bad sizes).
pub fn load(file: &str, text: &str, known: &Known<'_>) -> Result<Topology, TopologyErrors> {
    check::Loader::new(file, text, known, None).load()
}

/// [`load`] for a run whose channels that name no transport use `transport` instead of the
/// file's `transport` key (`ferromq run --transport`): what depends on their transport (the
/// schemes their addresses take, both ends of a connection on one transport) is checked with
/// the one that will run them, and it is [`Topology::transport`].
///
/// # Errors
/// As [`load`], and `transport` is not one of [`Known::transports`].
pub fn load_with_transport(
    file: &str,
    text: &str,
    known: &Known<'_>,
    transport: &str,
) -> Result<Topology, TopologyErrors> {
    check::Loader::new(file, text, known, Some(transport)).load()
}

/// The process ids of a device `id` of `replicas` replicas: `id` alone, or `id-0`, `id-1`, ...
fn instance_ids(id: &str, replicas: usize) -> Vec<String> {
    if replicas <= 1 {
        return vec![id.to_owned()];
    }
    (0..replicas)
        .map(|replica_idx| format!("{id}-{replica_idx}"))
        .collect()
}

impl Topology {
    fn instance_ids(&self, device: &DeviceSpec) -> Vec<String> {
        instance_ids(&device.id, device.replicas)
    }

    /// The processes to start: replicas expanded, connections resolved to instances.
    pub fn instances(&self) -> Vec<Instance> {
        let ids_of: BTreeMap<&str, Vec<String>> = self
            .devices
            .iter()
            .map(|device| (device.id.as_str(), self.instance_ids(device)))
            .collect();
        let mut instances = Vec::new();
        for device in &self.devices {
            for (replica_index, id) in ids_of[device.id.as_str()].iter().enumerate() {
                let channels = device
                    .channels
                    .iter()
                    .map(|channel| InstanceChannel {
                        config: channel.config.clone(),
                        connect_to: channel
                            .connect
                            .iter()
                            .flat_map(|(target_device, target_channel)| {
                                ids_of
                                    .get(target_device.as_str())
                                    .into_iter()
                                    .flatten()
                                    .map(|target| (target.clone(), target_channel.clone()))
                            })
                            .collect(),
                    })
                    .collect();
                instances.push(Instance {
                    id: id.clone(),
                    device: device.id.clone(),
                    kind: device.kind.clone(),
                    properties: device.properties.clone(),
                    max_iterations: device.max_iterations,
                    replica_index,
                    replica_count: device.replicas,
                    channels,
                    host: (!device.hosts.is_empty())
                        .then(|| device.hosts[replica_index % device.hosts.len()].clone()),
                    restart: device.restart,
                    min_replicas: device.min_replicas,
                });
            }
        }
        instances
    }

    /// Every channel over a transport that reaches one host only (`one_host`, e.g. shmem)
    /// between two instances that `host_of` places on different hosts, as a message naming
    /// both devices, their hosts and the channel. `host_of` gives `None` where it cannot tell
    /// (such pairs are not judged).
    pub fn placement_errors(
        &self,
        one_host: &[&str],
        host_of: &dyn Fn(&Instance) -> Option<String>,
    ) -> Vec<String> {
        let instances = self.instances();
        let by_id: BTreeMap<&str, &Instance> = instances
            .iter()
            .map(|instance| (instance.id.as_str(), instance))
            .collect();
        let mut errors = Vec::new();
        for instance in &instances {
            for channel in &instance.channels {
                let transport = channel
                    .config
                    .transport
                    .as_deref()
                    .unwrap_or(&self.transport);
                if !one_host.contains(&transport) {
                    continue;
                }
                for (target, socket) in &channel.connect_to {
                    let Some(binder) = by_id.get(target.as_str()) else {
                        continue;
                    };
                    let (Some(here), Some(there)) = (host_of(instance), host_of(binder)) else {
                        continue;
                    };
                    if here != there {
                        errors.push(format!(
                            "device {:?} (on {here}) and device {:?} (on {there}) are joined by \
                             channel {:?} -> {target}.{socket} over {transport}, which reaches \
                             only one host: place them on one host or give the channel \
                             transport = \"zeromq\" (tcp) or \"ofi\"",
                            instance.id, binder.id, channel.config.name
                        ));
                    }
                }
            }
        }
        errors
    }

    /// Graphviz DOT: devices as nodes, connections as edges labelled with type and transport.
    /// Ids and labels are quoted DOT strings (a `"` in an id made the file invalid).
    pub fn to_dot(&self) -> String {
        let mut dot = String::from("digraph topology {\n  rankdir=LR;\n  node [shape=box];\n");
        for device in &self.devices {
            let kind = match (&device.kind, device.replicas) {
                (DeviceKind::Builtin(kind), 1) => format!("({kind})"),
                (DeviceKind::Builtin(kind), replicas) => format!("({kind} x{replicas})"),
                (DeviceKind::Exec(command), _) => {
                    format!("(exec {})", command.first().map_or("", String::as_str))
                }
            };
            dot.push_str(&format!(
                "  \"{}\" [label=\"{}\\n{}\"];\n",
                dot_escaped(&device.id),
                dot_escaped(&device.id),
                dot_escaped(&kind)
            ));
        }
        for (from, to, label) in self.edges() {
            dot.push_str(&format!(
                "  \"{}\" -> \"{}\" [label=\"{}\"];\n",
                dot_escaped(&from),
                dot_escaped(&to),
                dot_escaped(&label)
            ));
        }
        dot.push_str("}\n");
        dot
    }

    /// Mermaid flowchart of the same graph. Nodes are named by their device's position (`d0`,
    /// `d1`, ...; ids made of other characters than ASCII letters and digits collided when
    /// their characters were replaced), labelled with the id, `"` and `|` written as entities.
    pub fn to_mermaid(&self) -> String {
        let node = |id: &str| {
            self.devices
                .iter()
                .position(|device| device.id == id)
                .map_or_else(
                    || format!("x_{}", mermaid_text(id)),
                    |index| format!("d{index}"),
                )
        };
        let mut mermaid = String::from("flowchart LR\n");
        for device in &self.devices {
            let kind = match &device.kind {
                DeviceKind::Builtin(kind) => kind.clone(),
                DeviceKind::Exec(_) => "exec".to_owned(),
            };
            mermaid.push_str(&format!(
                "  {}[\"{} ({kind})\"]\n",
                node(&device.id),
                mermaid_text(&device.id)
            ));
        }
        for (from, to, label) in self.edges() {
            mermaid.push_str(&format!(
                "  {} -->|\"{}\"| {}\n",
                node(&from),
                mermaid_text(&label),
                node(&to)
            ));
        }
        mermaid
    }

    /// (sender device, receiver device, label) for every connection, oriented by data flow.
    fn edges(&self) -> Vec<(String, String, String)> {
        let mut edges = Vec::new();
        for device in &self.devices {
            for channel in &device.channels {
                for (target_device, target_channel) in &channel.connect {
                    let transport = channel
                        .config
                        .transport
                        .clone()
                        .unwrap_or_else(|| self.transport.clone());
                    let socket_type = channel.config.socket_type;
                    let label = format!(
                        "{}.{} {socket_type} ({transport})",
                        target_device, target_channel
                    );
                    let (from, to) = if socket_type.can_send() && !socket_type.can_receive() {
                        (device.id.clone(), target_device.clone())
                    } else {
                        (target_device.clone(), device.id.clone())
                    };
                    edges.push((from, to, label));
                }
            }
        }
        edges
    }
}

/// `text` inside a DOT string: `\\` and `"` escaped.
fn dot_escaped(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// `text` inside a Mermaid label: `"` and `|` as entities.
fn mermaid_text(text: &str) -> String {
    text.replace('"', "#quot;").replace('|', "#124;")
}
