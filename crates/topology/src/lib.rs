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
//! let known = ferromq_topology::Known { kinds: &["sampler", "sink"], transports: &["zeromq"] };
//! let topology = ferromq_topology::load("demo.toml", text, &known).unwrap();
//! assert_eq!(topology.instances().len(), 2);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;

use ferromq_core::{ChannelConfig, KeyValue, Method, SocketType};
use serde::Deserialize;
use toml::Spanned;

/// What the binary that loads the topology has built in.
#[derive(Debug, Clone, Copy)]
pub struct Known<'a> {
    /// Built-in device kinds (`exec` is always known).
    pub kinds: &'a [&'a str],
    /// Transports.
    pub transports: &'a [&'a str],
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileToml {
    transport: Option<Spanned<String>>,
    auto_address: Option<Spanned<String>>,
    #[serde(default)]
    device: Vec<Spanned<DeviceToml>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct DeviceToml {
    id: Spanned<String>,
    kind: Spanned<String>,
    command: Option<Spanned<Vec<String>>>,
    host: Option<Spanned<String>>,
    replicas: Option<Spanned<i64>>,
    max_iterations: Option<Spanned<i64>>,
    #[serde(default)]
    properties: BTreeMap<String, Spanned<toml::Value>>,
    #[serde(default)]
    channel: Vec<Spanned<ChannelToml>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A `[[device.channel]]` table: the keys with a topology's own meaning (`name`, `type`,
/// `method`, `address`, `connect`, `transport`) as themselves, every other channel key as
/// written, for the key table (ferromq-core's `CHANNEL_KEYS`) to check; a key in neither is an
/// error naming it.
struct ChannelToml {
    name: Spanned<String>,
    socket_type: Spanned<String>,
    method: Option<Spanned<String>>,
    address: Option<Spanned<String>>,
    connect: Option<Spanned<OneOrMany>>,
    transport: Option<Spanned<String>>,
    keys: Vec<(&'static str, Spanned<toml::Value>)>,
}

/// Every key a channel table may have: the key table's and `connect`.
fn channel_keys() -> &'static [&'static str] {
    static KEYS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let mut keys: Vec<&'static str> = ferromq_core::CHANNEL_KEYS
            .iter()
            .map(|key| key.name)
            .collect();
        keys.insert(1, "connect");
        keys
    })
}

/// A key of a channel table, refused while it is read (so that the error points at it) unless
/// it is one of [`channel_keys`].
struct ChannelKeyName(&'static str);

impl<'de> Deserialize<'de> for ChannelKeyName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = ChannelKeyName;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a channel key")
            }

            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<ChannelKeyName, E> {
                channel_keys()
                    .iter()
                    .find(|known| **known == key)
                    .map(|known| ChannelKeyName(known))
                    .ok_or_else(|| E::unknown_field(key, channel_keys()))
            }
        }
        deserializer.deserialize_identifier(Name)
    }
}

impl<'de> Deserialize<'de> for ChannelToml {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor};

        struct Table;
        impl<'de> Visitor<'de> for Table {
            type Value = ChannelToml;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a channel table")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ChannelToml, A::Error> {
                let (mut name, mut socket_type) = (None, None);
                let (mut method, mut address, mut connect, mut transport) =
                    (None, None, None, None);
                let mut keys = Vec::new();
                while let Some(ChannelKeyName(key)) = map.next_key()? {
                    match key {
                        "name" => name = Some(map.next_value()?),
                        "type" => socket_type = Some(map.next_value()?),
                        "method" => method = Some(map.next_value()?),
                        "address" => address = Some(map.next_value()?),
                        "connect" => connect = Some(map.next_value()?),
                        "transport" => transport = Some(map.next_value()?),
                        other => keys.push((other, map.next_value()?)),
                    }
                }
                Ok(ChannelToml {
                    name: name.ok_or_else(|| de::Error::missing_field("name"))?,
                    socket_type: socket_type.ok_or_else(|| de::Error::missing_field("type"))?,
                    method,
                    address,
                    connect,
                    transport,
                    keys,
                })
            }
        }
        deserializer.deserialize_map(Table)
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
}

/// A channel of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceChannel {
    /// Its configuration.
    pub config: ChannelConfig,
    /// For connecting channels: the binders' `(instance id, socket name)`.
    pub connect_to: Vec<(String, String)>,
}

struct Checker<'a> {
    file: &'a str,
    text: &'a str,
    errors: Vec<TopologyError>,
}

impl Checker<'_> {
    fn position(&self, span: Range<usize>) -> (usize, usize) {
        let before = &self.text[..span.start.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before
            .rfind('\n')
            .map_or(before.len(), |newline| before.len() - newline - 1)
            + 1;
        (line, column)
    }

    fn error(
        &mut self,
        span: Range<usize>,
        context: impl Into<String>,
        message: impl Into<String>,
    ) {
        let (line, column) = self.position(span);
        self.errors.push(TopologyError {
            file: self.file.to_owned(),
            line,
            column,
            context: context.into(),
            message: message.into(),
        });
    }
}

/// The most replicas one device may have.
pub const MAX_REPLICAS: usize = 1024;

/// The most instances (processes) a topology may expand to.
pub const MAX_INSTANCES: usize = 4096;

/// The most instance-to-instance connections a topology may expand to: a bound on the work and
/// memory of [`Topology::instances`], whatever the file says.
pub const MAX_CONNECTIONS: u64 = 1_000_000;

fn count(
    value: &Spanned<i64>,
    checker: &mut Checker<'_>,
    context: &str,
    key: &str,
    bounds: (i64, i64),
) -> Option<u64> {
    let (minimum, maximum) = bounds;
    if *value.get_ref() < minimum {
        checker.error(
            value.span(),
            context,
            format!("{key} must be at least {minimum}, not {}", value.get_ref()),
        );
        return None;
    }
    if *value.get_ref() > maximum {
        checker.error(
            value.span(),
            context,
            format!("{key} must be at most {maximum}, not {}", value.get_ref()),
        );
        return None;
    }
    Some(*value.get_ref() as u64)
}

/// Parses and checks a topology.
///
/// # Errors
/// [`TopologyErrors`] with every problem found (syntax, unknown keys, duplicates, dangling or
/// incompatible connections, address clashes, unknown kinds or transports, bad sizes).
pub fn load(file: &str, text: &str, known: &Known<'_>) -> Result<Topology, TopologyErrors> {
    let mut checker = Checker {
        file,
        text,
        errors: Vec::new(),
    };
    let parsed: FileToml = match toml::from_str(text) {
        Ok(parsed) => parsed,
        Err(error) => {
            checker.error(error.span().unwrap_or(0..0), "", error.message().to_owned());
            return Err(TopologyErrors(checker.errors));
        }
    };
    let transport = parsed
        .transport
        .as_ref()
        .map_or("zeromq".to_owned(), |transport| transport.get_ref().clone());
    if let Some(spanned) = &parsed.transport
        && !known.transports.contains(&spanned.get_ref().as_str())
    {
        checker.error(
            spanned.span(),
            "",
            format!(
                "transport {:?} is not built in (built in: {})",
                spanned.get_ref(),
                known.transports.join(", ")
            ),
        );
    }
    let auto_address = match parsed
        .auto_address
        .as_ref()
        .map(|auto| (auto.get_ref().as_str(), auto.span()))
    {
        None | Some(("ipc", _)) => AutoAddress::Ipc,
        Some(("tcp", _)) => AutoAddress::Tcp,
        Some((other, span)) => {
            checker.error(
                span,
                "",
                format!("auto-address {other:?} is not ipc or tcp"),
            );
            AutoAddress::Ipc
        }
    };
    if parsed.device.is_empty() {
        checker.error(0..0, "", "the topology has no [[device]]");
    }

    let mut devices = Vec::new();
    let mut seen_ids: BTreeMap<String, Range<usize>> = BTreeMap::new();
    // Channel types, methods and spans by (device, channel), for the connection checks.
    let mut channel_index: BTreeMap<(String, String), (SocketType, Method, Range<usize>)> =
        BTreeMap::new();
    let mut connections: Vec<(String, String, SocketType, String, Range<usize>)> = Vec::new();
    let mut bind_addresses: BTreeMap<String, String> = BTreeMap::new();
    let mut n_instances = 0_usize;

    for device in &parsed.device {
        let device = device.get_ref();
        let id = device.id.get_ref().clone();
        let context = format!("device {id:?}");
        if id.is_empty() || id.contains(['.', ' ', '/']) {
            checker.error(
                device.id.span(),
                &context,
                "a device id must be non-empty, without '.', ' ' or '/'",
            );
        }
        if let Some(first) = seen_ids.get(&id) {
            let (line, _) = checker.position(first.clone());
            checker.error(
                device.id.span(),
                &context,
                format!("duplicate device id (first defined on line {line})"),
            );
        }
        seen_ids.insert(id.clone(), device.id.span());
        let kind = match (device.kind.get_ref().as_str(), &device.command) {
            ("exec", Some(command)) if !command.get_ref().is_empty() => {
                DeviceKind::Exec(command.get_ref().clone())
            }
            ("exec", _) => {
                checker.error(
                    device.kind.span(),
                    &context,
                    "kind \"exec\" needs command = [\"program\", \"args\"...]",
                );
                DeviceKind::Exec(Vec::new())
            }
            (kind, command) => {
                if let Some(command) = command {
                    checker.error(
                        command.span(),
                        &context,
                        "command is only for kind \"exec\"",
                    );
                }
                if !known.kinds.contains(&kind) {
                    checker.error(
                        device.kind.span(),
                        &context,
                        format!(
                            "unknown kind {kind:?}; built in: {}, or exec",
                            known.kinds.join(", ")
                        ),
                    );
                }
                DeviceKind::Builtin(kind.to_owned())
            }
        };
        if let Some(host) = &device.host
            && !matches!(host.get_ref().as_str(), "localhost" | "127.0.0.1" | "::1")
        {
            checker.error(
                host.span(),
                &context,
                format!(
                    "host {:?}: launching on other hosts is not supported yet; use localhost",
                    host.get_ref()
                ),
            );
        }
        let replicas = device
            .replicas
            .as_ref()
            .and_then(|replicas| {
                count(
                    replicas,
                    &mut checker,
                    &context,
                    "replicas",
                    (1, MAX_REPLICAS as i64),
                )
            })
            .unwrap_or(1) as usize;
        n_instances += replicas;
        if n_instances > MAX_INSTANCES && n_instances - replicas <= MAX_INSTANCES {
            checker.error(
                device
                    .replicas
                    .as_ref()
                    .map_or(device.id.span(), Spanned::span),
                &context,
                format!("the topology has more than {MAX_INSTANCES} instances with this device"),
            );
        }
        let max_iterations = device
            .max_iterations
            .as_ref()
            .and_then(|value| {
                count(
                    value,
                    &mut checker,
                    &context,
                    "max-iterations",
                    (0, i64::MAX),
                )
            })
            .unwrap_or(0);
        let properties = device
            .properties
            .iter()
            .map(|(key, value)| {
                let text = match value.get_ref() {
                    toml::Value::String(text) => text.clone(),
                    toml::Value::Integer(number) => number.to_string(),
                    toml::Value::Float(number) => number.to_string(),
                    toml::Value::Boolean(flag) => flag.to_string(),
                    other => {
                        checker.error(
                            value.span(),
                            &context,
                            format!(
                                "property {key:?} must be a string, number or boolean, not {}",
                                other.type_str()
                            ),
                        );
                        String::new()
                    }
                };
                (key.clone(), text)
            })
            .collect();

        let mut channels = Vec::new();
        let mut seen_channels: BTreeSet<String> = BTreeSet::new();
        for channel in &device.channel {
            let channel = channel.get_ref();
            let name = channel.name.get_ref().clone();
            let context = format!("device {id:?} channel {name:?}");
            if !seen_channels.insert(name.clone()) {
                checker.error(
                    channel.name.span(),
                    &context,
                    "duplicate channel name in this device",
                );
            }
            let socket_type: SocketType = match channel.socket_type.get_ref().parse() {
                Ok(socket_type) => socket_type,
                Err(error) => {
                    checker.error(channel.socket_type.span(), &context, error.to_string());
                    continue;
                }
            };
            let connect: Vec<String> = match channel.connect.as_ref().map(Spanned::get_ref) {
                None => Vec::new(),
                Some(OneOrMany::One(target)) => vec![target.clone()],
                Some(OneOrMany::Many(targets)) => targets.clone(),
            };
            let method = match (channel.method.as_ref(), connect.is_empty()) {
                (Some(method), _) => match method.get_ref().parse::<Method>() {
                    Ok(Method::Bind) if !connect.is_empty() => {
                        checker.error(
                            method.span(),
                            &context,
                            "a channel with connect = ... cannot have method = \"bind\"",
                        );
                        Method::Connect
                    }
                    Ok(method) => method,
                    Err(error) => {
                        checker.error(method.span(), &context, error.to_string());
                        Method::Bind
                    }
                },
                (None, true) => Method::Bind,
                (None, false) => Method::Connect,
            };
            if method == Method::Connect && connect.is_empty() && channel.address.is_none() {
                checker.error(
                    channel.name.span(),
                    &context,
                    "a connecting channel needs connect = \"device.channel\" or an address",
                );
            }
            let mut config = ChannelConfig::new(name.clone(), socket_type, method);
            config.rate_logging = 0;
            if let Some(address) = &channel.address {
                config.address = Some(address.get_ref().clone());
                if let Err(error) = ferromq_core::Address::parse(address.get_ref()) {
                    checker.error(address.span(), &context, error.to_string());
                }
                if method == Method::Bind {
                    if let Some(other) =
                        bind_addresses.insert(address.get_ref().clone(), context.clone())
                    {
                        checker.error(
                            address.span(),
                            &context,
                            format!("address {} is already bound by {other}", address.get_ref()),
                        );
                    }
                    if replicas > 1 {
                        checker.error(
                            address.span(),
                            &context,
                            "replicas of a device cannot share one bind address; omit it",
                        );
                    }
                }
            }
            if let Some(transport) = &channel.transport {
                if !known.transports.contains(&transport.get_ref().as_str()) {
                    checker.error(
                        transport.span(),
                        &context,
                        format!(
                            "transport {:?} is not built in (built in: {})",
                            transport.get_ref(),
                            known.transports.join(", ")
                        ),
                    );
                }
                config.transport = Some(transport.get_ref().clone());
            }
            for (key, value) in &channel.keys {
                let set = match value.get_ref() {
                    toml::Value::String(text) => config.set(key, KeyValue::Text(text)),
                    toml::Value::Integer(number) => config.set(key, KeyValue::Integer(*number)),
                    toml::Value::Boolean(flag) => config.set(key, KeyValue::Bool(*flag)),
                    other => {
                        checker.error(
                            value.span(),
                            &context,
                            format!(
                                "{key} must be a number, text or boolean, not {}",
                                other.type_str()
                            ),
                        );
                        continue;
                    }
                };
                if let Err(error) = set {
                    checker.error(value.span(), &context, error.to_string());
                }
            }
            if config.port_range_min > config.port_range_max {
                let span = ["portRangeMax", "portRangeMin"]
                    .iter()
                    .find_map(|wanted| channel.keys.iter().find(|(key, _)| key == wanted))
                    .map_or_else(|| channel.name.span(), |(_, value)| value.span());
                checker.error(
                    span,
                    &context,
                    format!(
                        "portRangeMin {} is above portRangeMax {}",
                        config.port_range_min, config.port_range_max
                    ),
                );
            }
            channel_index.insert(
                (id.clone(), name.clone()),
                (socket_type, method, channel.name.span()),
            );
            let connect_span = channel
                .connect
                .as_ref()
                .map_or(channel.name.span(), Spanned::span);
            let mut targets = Vec::new();
            for target in connect {
                let Some((device_id, channel_name)) = target.split_once('.') else {
                    checker.error(
                        connect_span.clone(),
                        &context,
                        format!("connect {target:?} is not \"device.channel\""),
                    );
                    continue;
                };
                connections.push((
                    id.clone(),
                    name.clone(),
                    socket_type,
                    target.clone(),
                    connect_span.clone(),
                ));
                targets.push((device_id.to_owned(), channel_name.to_owned()));
            }
            channels.push(ChannelSpec {
                config,
                connect: targets,
            });
        }
        devices.push(DeviceSpec {
            id,
            kind,
            replicas,
            properties,
            max_iterations,
            channels,
        });
    }

    let replicas_of: BTreeMap<&str, u64> = devices
        .iter()
        .map(|device: &DeviceSpec| (device.id.as_str(), device.replicas as u64))
        .collect();
    let mut n_connections = 0_u64;
    for (device_id, channel_name, socket_type, target, span) in connections {
        let context = format!("device {device_id:?} channel {channel_name:?}");
        // Each instance of this device connects to each instance of the target device.
        let target_replicas = target
            .split_once('.')
            .and_then(|(target_device, _)| replicas_of.get(target_device))
            .copied()
            .unwrap_or(1);
        let before = n_connections;
        n_connections = n_connections.saturating_add(
            replicas_of
                .get(device_id.as_str())
                .copied()
                .unwrap_or(1)
                .saturating_mul(target_replicas),
        );
        if n_connections > MAX_CONNECTIONS && before <= MAX_CONNECTIONS {
            checker.error(
                span.clone(),
                &context,
                format!(
                    "the topology expands to more than {MAX_CONNECTIONS} connections between instances with connect {target:?}"
                ),
            );
        }
        let Some((target_device, target_channel)) = target.split_once('.') else {
            continue;
        };
        if !seen_ids.contains_key(target_device) {
            checker.error(
                span,
                &context,
                format!("connect {target:?}: there is no device {target_device:?}"),
            );
            continue;
        }
        let Some((target_type, target_method, _)) =
            channel_index.get(&(target_device.to_owned(), target_channel.to_owned()))
        else {
            checker.error(
                span,
                &context,
                format!(
                    "connect {target:?}: device {target_device:?} has no channel {target_channel:?}"
                ),
            );
            continue;
        };
        if *target_method != Method::Bind {
            checker.error(
                span.clone(),
                &context,
                format!("connect {target:?}: that channel connects too; one end must bind"),
            );
        }
        if !socket_type.is_compatible_with(*target_type) {
            checker.error(
                span,
                &context,
                format!("a {socket_type} channel cannot connect to {target:?}, a {target_type} channel (a {socket_type} pairs with a {})", socket_type.peer()),
            );
        }
    }

    if checker.errors.is_empty() {
        return Ok(Topology {
            file: file.to_owned(),
            transport,
            auto_address,
            devices,
        });
    }
    checker
        .errors
        .sort_by_key(|error| (error.line, error.column));
    Err(TopologyErrors(checker.errors))
}

impl Topology {
    fn instance_ids(&self, device: &DeviceSpec) -> Vec<String> {
        if device.replicas <= 1 {
            return vec![device.id.clone()];
        }
        (0..device.replicas)
            .map(|replica_idx| format!("{}-{replica_idx}", device.id))
            .collect()
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
                });
            }
        }
        instances
    }

    /// Graphviz DOT: devices as nodes, connections as edges labelled with type and transport.
    pub fn to_dot(&self) -> String {
        let mut dot = String::from("digraph topology {\n  rankdir=LR;\n  node [shape=box];\n");
        for device in &self.devices {
            let label = match (&device.kind, device.replicas) {
                (DeviceKind::Builtin(kind), 1) => format!("{}\\n({kind})", device.id),
                (DeviceKind::Builtin(kind), replicas) => {
                    format!("{}\\n({kind} x{replicas})", device.id)
                }
                (DeviceKind::Exec(command), _) => format!(
                    "{}\\n(exec {})",
                    device.id,
                    command.first().map_or("", String::as_str)
                ),
            };
            dot.push_str(&format!("  \"{}\" [label=\"{label}\"];\n", device.id));
        }
        for (from, to, label) in self.edges() {
            dot.push_str(&format!("  \"{from}\" -> \"{to}\" [label=\"{label}\"];\n"));
        }
        dot.push_str("}\n");
        dot
    }

    /// Mermaid flowchart of the same graph.
    pub fn to_mermaid(&self) -> String {
        let mut mermaid = String::from("flowchart LR\n");
        for device in &self.devices {
            let kind = match &device.kind {
                DeviceKind::Builtin(kind) => kind.clone(),
                DeviceKind::Exec(_) => "exec".to_owned(),
            };
            mermaid.push_str(&format!(
                "  {}[\"{} ({kind})\"]\n",
                mermaid_id(&device.id),
                device.id
            ));
        }
        for (from, to, label) in self.edges() {
            mermaid.push_str(&format!(
                "  {} -->|{label}| {}\n",
                mermaid_id(&from),
                mermaid_id(&to)
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

fn mermaid_id(id: &str) -> String {
    id.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}
