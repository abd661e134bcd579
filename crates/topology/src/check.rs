//! Checking a parsed file, one phase per function: the file's own settings, each device,
//! each of its channels (type, method, address, keys, connect targets), then the connections
//! between devices once every device is known. Every problem is collected with its position,
//! so one run reports all of them.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use ferromq_core::{ChannelConfig, KeyValue, Method, SocketType};
use toml::Spanned;

use crate::file_form::{ChannelToml, DeviceToml, FileToml, OneOrMany, RpcToml};
use crate::{
    AutoAddress, ChannelSpec, DeviceKind, DeviceSpec, HostRef, HostSpec, Known,
    LAUNCHER_PROPERTIES, MAX_CONNECTIONS, MAX_HOST_INDEX, MAX_INSTANCES, MAX_REPLICAS, Restart,
    RestartPolicy, Topology, TopologyError, TopologyErrors,
};

pub(crate) struct Checker<'a> {
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

/// Host names as SSH, DNS and Slurm write them (`user@machine`, `n[1-4]` is not expanded).
fn valid_host_name(name: &str) -> bool {
    // Not `-...`: the name is the default ssh destination, which ssh would read as an option.
    !name.is_empty()
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_@:[]".contains(c))
}

/// An ssh destination (`[user@]host`, `ssh://...`, an alias of the ssh config): one word that
/// ssh does not take for an option (`-oProxyCommand=...` ran a command of the file's).
fn valid_ssh_destination(destination: &str) -> bool {
    !destination.starts_with('-')
        && !destination
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
}

/// The address other hosts reach a host at: an IP address (IPv6 bracketed or not) or a DNS
/// name, without a port (the launcher adds the ports).
fn valid_host_address(address: &str) -> bool {
    let unbracketed = address
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(address);
    unbracketed.parse::<std::net::IpAddr>().is_ok()
        || (!address.is_empty()
            && !address.starts_with('-')
            && !address.starts_with('.')
            && address
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
}

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

/// A TOML float as a property's text: a whole number that fits a `u64` or `i64` without its
/// `.0` (`board = 11.0` reaches the device as `11`, which integer properties parse), any other
/// in the shortest form that reads back as the same `f64` (`1e300`, not 301 digits; `2.5`;
/// `1e-7`; `inf`).
fn float_text(number: f64) -> String {
    if number.fract() == 0.0 && number.abs() < u64::MAX as f64 {
        format!("{number}")
    } else {
        format!("{number:?}")
    }
}

/// A TOML value as the file could have written it (for error messages).
fn toml_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => format!("{text:?}"),
        toml::Value::Boolean(flag) => flag.to_string(),
        toml::Value::Integer(number) => number.to_string(),
        toml::Value::Float(number) => float_text(*number),
        other => format!("a {}", other.type_str()),
    }
}

/// What is wrong with a property in the `rpc.` namespace that is no `rpc.<group>.<key>` with
/// a key of `group_keys` (the keys an rpc group's member reads, [`Known::rpc_group_keys`]; a
/// mistyped `rpc.g.agregate` was taken and changed nothing), naming the nearest key; `None` for
/// a key outside the namespace or one a member reads. `ferromq device` refuses the same with
/// the same words.
pub fn rpc_property_problem(key: &str, group_keys: &[&str]) -> Option<String> {
    let rest = key.strip_prefix("rpc.")?;
    let (group, name) = rest.split_once('.').unwrap_or((rest, ""));
    if group_keys.contains(&name) {
        return None;
    }
    let hint = group_keys
        .iter()
        .map(|known| (strsim::levenshtein(name, known), *known))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map_or_else(String::new, |(_, known)| {
            format!("did you mean \"rpc.{group}.{known}\"? ")
        });
    Some(format!(
        "is not one an rpc group reads; {hint}it reads rpc.<group>.{}",
        group_keys.join(", ")
    ))
}

/// The table of the file that byte `at` is in, named as the checks name it (`device "sink"`,
/// `device "sink" channel "data"`, `rpc "search"`, `host "n1"`), or empty: toml's errors for a
/// missing or duplicate key said neither which device nor (for a duplicate) which key. The
/// file is read as far as it can be, so a file that does not parse is named too.
fn table_context(text: &str, at: usize) -> String {
    use toml::de::{DeTable, DeValue};
    let text_of = |table: &DeTable<'_>, key: &str| {
        table
            .iter()
            .find_map(|(name, value)| match value.get_ref() {
                DeValue::String(text) if name.get_ref() == key => Some(text.to_string()),
                _ => None,
            })
    };
    let named = |what: &str, name: Option<String>| {
        name.map_or_else(String::new, |name| format!("{what} {name:?}"))
    };
    let (root, _) = DeTable::parse_recoverable(text);
    // Where each table starts (its header), and how it is named; the last one to start at or
    // before `at` holds it.
    let mut tables: Vec<(usize, String)> = Vec::new();
    for (key, value) in root.get_ref() {
        match (&**key.get_ref(), value.get_ref()) {
            (what @ ("device" | "rpc"), DeValue::Array(entries)) => {
                let name_key = if what == "device" { "id" } else { "name" };
                for entry in entries {
                    let DeValue::Table(table) = entry.get_ref() else {
                        continue;
                    };
                    let context = named(what, text_of(table, name_key));
                    tables.push((entry.span().start, context.clone()));
                    let channels = table
                        .iter()
                        .find_map(|(name, value)| match value.get_ref() {
                            DeValue::Array(channels)
                                if what == "device" && name.get_ref() == "channel" =>
                            {
                                Some(channels)
                            }
                            _ => None,
                        });
                    for channel in channels.into_iter().flatten() {
                        let DeValue::Table(channel_table) = channel.get_ref() else {
                            continue;
                        };
                        let name = named("channel", text_of(channel_table, "name"));
                        tables.push((
                            channel.span().start,
                            format!("{context} {name}").trim().to_owned(),
                        ));
                    }
                }
            }
            ("hosts", DeValue::Table(hosts)) => {
                for (name, host) in hosts {
                    tables.push((
                        host.span().start,
                        named("host", Some(name.get_ref().to_string())),
                    ));
                }
            }
            _ => tables.push((value.span().start, String::new())),
        }
    }
    tables
        .into_iter()
        .filter(|(start, _)| *start <= at)
        .max_by_key(|(start, _)| *start)
        .map(|(_, context)| context)
        .unwrap_or_default()
}

/// A `connect = "device.channel"` of one channel, checked once every device is known.
/// What a connect target's check needs of a channel.
#[derive(Clone)]
struct IndexedChannel {
    socket_type: SocketType,
    method: Method,
    /// Its own transport (`None`: the file's default).
    transport: Option<String>,
}

struct Connection {
    device: String,
    channel: String,
    socket_type: SocketType,
    /// The connecting channel's own transport (`None`: the file's default).
    transport: Option<String>,
    target: String,
    span: Range<usize>,
}

/// What the checks learn while walking the devices, for the checks that need the whole file.
pub(crate) struct Loader<'a> {
    known: &'a Known<'a>,
    checker: Checker<'a>,
    /// Device ids and where they are defined.
    seen_ids: BTreeMap<String, Range<usize>>,
    /// Channel types, methods and spans by (device, channel), for the connection checks.
    channel_index: BTreeMap<(String, String), IndexedChannel>,
    connections: Vec<Connection>,
    /// Bind addresses given in the file, and which channel binds each.
    bind_addresses: BTreeMap<String, String>,
    n_instances: usize,
    /// The transport of channels that name none, given instead of the file's (`ferromq run
    /// --transport`).
    given_transport: Option<&'a str>,
    /// The transport of channels that name none: the one given, or the file's `transport`, or
    /// zeromq.
    default_transport: String,
}

impl<'a> Loader<'a> {
    /// `given_transport`: the transport of channels that name none, instead of the file's.
    pub(crate) fn new(
        file: &'a str,
        text: &'a str,
        known: &'a Known<'a>,
        given_transport: Option<&'a str>,
    ) -> Loader<'a> {
        Loader {
            known,
            checker: Checker {
                file,
                text,
                errors: Vec::new(),
            },
            seen_ids: BTreeMap::new(),
            channel_index: BTreeMap::new(),
            connections: Vec::new(),
            bind_addresses: BTreeMap::new(),
            n_instances: 0,
            given_transport,
            default_transport: String::new(),
        }
    }

    /// The whole topology, or every problem found in it.
    pub(crate) fn load(mut self) -> Result<Topology, TopologyErrors> {
        let parsed: FileToml = match toml::from_str(self.checker.text) {
            Ok(parsed) => parsed,
            Err(error) => {
                let span = error.span().unwrap_or(0..0);
                let context = table_context(self.checker.text, span.start);
                // toml's own message names no key here; the key is what the span covers.
                let message = match self.checker.text.get(span.clone()) {
                    Some(key) if error.message() == "duplicate key" && !key.is_empty() => {
                        format!("duplicate key `{key}`")
                    }
                    _ => error.message().to_owned(),
                };
                self.checker.error(span, context, message);
                return Err(TopologyErrors(self.checker.errors));
            }
        };
        let mut parsed = parsed;
        self.rpc_groups(&mut parsed);
        let transport = self.choose_default_transport(&parsed);
        self.default_transport.clone_from(&transport);
        let auto_address = self.auto_address(&parsed);
        if parsed.device.is_empty() {
            self.checker
                .error(0..0, "", "the topology has no [[device]]");
        }
        let devices: Vec<DeviceSpec> = parsed
            .device
            .iter()
            .map(|device| self.device(device.get_ref()))
            .collect();
        self.check_instance_ids(&parsed, &devices);
        self.check_connections(&devices, &transport);
        let hosts = self.hosts(&parsed);
        let mut errors = self.checker.errors;
        if errors.is_empty() {
            return Ok(Topology {
                file: self.checker.file.to_owned(),
                transport,
                auto_address,
                devices,
                hosts,
            });
        }
        errors.sort_by_key(|error| (error.line, error.column));
        Err(TopologyErrors(errors))
    }

    /// Every process's id once replicas are expanded (`sink` with 2 replicas is `sink-0` and
    /// `sink-1`) is unique: a device `sink-0` beside them passed the check of ids as written
    /// and then started two processes of one id, the second of which could not bind its
    /// control endpoint.
    fn check_instance_ids(&mut self, parsed: &FileToml, devices: &[DeviceSpec]) {
        // Each process id with the device it belongs to.
        let mut owners: BTreeMap<String, &DeviceSpec> = BTreeMap::new();
        for (device_idx, device) in devices.iter().enumerate() {
            for instance_id in crate::instance_ids(&device.id, device.replicas) {
                let Some(owner) = owners.get(&instance_id) else {
                    owners.insert(instance_id, device);
                    continue;
                };
                // Same device id twice is reported as a duplicate id already.
                if owner.id == device.id {
                    continue;
                }
                let this = if device.replicas <= 1 {
                    format!("its process id {instance_id:?}")
                } else {
                    format!("its replica {instance_id:?}")
                };
                let other = if owner.replicas <= 1 {
                    format!("the id of device {:?}", owner.id)
                } else {
                    format!(
                        "a replica of device {:?} (replicas = {})",
                        owner.id, owner.replicas
                    )
                };
                let message =
                    format!("{this} is also {other}: every process needs an id of its own");
                let span = parsed.device[device_idx].get_ref().id.span();
                self.checker
                    .error(span, format!("device {:?}", device.id), message);
                break;
            }
        }
    }

    /// Turns every `[[rpc]]` group into channels and properties of its member devices: each
    /// member binds a pull channel named after the group (its inbound) and gets a push channel
    /// `<group>-out` with one socket per member instance, socket i connected to member i's
    /// inbound, in the order of `members` with replicas expanded (`worker-0`, `worker-1`, ...).
    /// The properties `rpc.<group>.members` (instance ids, in that order), `.aggregate`,
    /// `.aggregate-bytes`, `.aggregate-us`, `.timeout-ms` and `.tree-arity` tell each member
    /// the rest (ferromq-rpc's `join` reads them); `busy-poll` and `spin-us` become the
    /// inbound channels' `busyPoll` and `spinUs`. Problems point at the `[[rpc]]` table.
    fn rpc_groups(&mut self, parsed: &mut FileToml) {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for group in std::mem::take(&mut parsed.rpc) {
            let span = group.span();
            let group = group.into_inner();
            let name = group.name.get_ref().clone();
            let context = format!("rpc {name:?}");
            if name.is_empty() || name.contains(['.', ' ', '/', '[', ']']) {
                self.checker.error(
                    group.name.span(),
                    &context,
                    "an rpc group name must be non-empty, without '.', ' ', '/', '[' or ']'",
                );
                continue;
            }
            if !seen.insert(name.clone()) {
                self.checker
                    .error(group.name.span(), &context, "duplicate rpc group name");
                continue;
            }
            // Checked once, at the group: given to every member's two channels, an unknown
            // transport was reported once for each of them.
            let transport = group
                .transport
                .clone()
                .filter(|transport| self.check_transport(transport, &context));
            let Some((instance_ids, member_idxs)) = self.rpc_members(parsed, &group, &context)
            else {
                continue;
            };
            // Values that are no setting are reported and left out; the group is still wired,
            // so its members are not also told they lack its channels.
            let properties = self.rpc_properties(&group, &instance_ids, &context);
            let n_sockets = instance_ids.len() as i64;
            let targets: Vec<String> = group
                .members
                .get_ref()
                .iter()
                .map(|member| format!("{member}.{name}"))
                .collect();
            let num_sockets_key = ferromq_core::channel_key("numSockets")
                .expect("numSockets is a channel key")
                .name;
            let spanned = |value: String| Spanned::new(group.name.span(), value);
            // busy-poll and spin-us: how the members' inbound channels wait (channel keys
            // busyPoll and spinUs).
            let inbound_keys = self.rpc_inbound_keys(&group, &context);
            for device_idx in member_idxs {
                let device = parsed.device[device_idx].get_mut();
                for (key, value) in &properties {
                    if device.properties.contains_key(key) {
                        self.checker.error(
                            span.clone(),
                            &context,
                            format!(
                                "device {:?} sets property {key:?} itself; the rpc group sets it",
                                device.id.get_ref()
                            ),
                        );
                    }
                    device
                        .properties
                        .insert(key.clone(), Spanned::new(span.clone(), value.clone()));
                }
                device.channel.push(Spanned::new(
                    span.clone(),
                    ChannelToml {
                        name: spanned(name.clone()),
                        socket_type: spanned("pull".to_owned()),
                        method: None,
                        address: None,
                        connect: None,
                        transport: transport.clone(),
                        keys: inbound_keys.clone(),
                    },
                ));
                device.channel.push(Spanned::new(
                    span.clone(),
                    ChannelToml {
                        name: spanned(format!("{name}-out")),
                        socket_type: spanned("push".to_owned()),
                        method: None,
                        address: None,
                        connect: Some(Spanned::new(
                            group.members.span(),
                            OneOrMany::Many(targets.clone()),
                        )),
                        transport: transport.clone(),
                        keys: vec![(
                            num_sockets_key,
                            Spanned::new(span.clone(), toml::Value::Integer(n_sockets)),
                        )],
                    },
                ));
            }
        }
    }

    /// The channel keys an rpc group gives its members' inbound channels: `busyPoll` from
    /// `busy-poll`, `spinUs` from `spin-us` (checked against the channel key's bounds here, so
    /// that a bad value points at the `[[rpc]]` table; refused beside `busy-poll = true`);
    /// `None` (with the errors noted) when a value is out of range.
    fn rpc_inbound_keys(
        &mut self,
        group: &RpcToml,
        context: &str,
    ) -> Vec<(&'static str, Spanned<toml::Value>)> {
        let mut keys = Vec::new();
        let key = |name: &str| {
            ferromq_core::channel_key(name).expect("busyPoll and spinUs are channel keys")
        };
        // A busy-polled receive never sleeps, so it never spins before sleeping: a spin-us
        // beside busy-poll = true was taken and changed nothing. The group is still wired, so
        // that its members are not also told they lack its channels, without the spin (whose
        // channel key each member's channel would refuse again).
        let busy_polled = group.busy_poll.as_ref().is_some_and(|busy| *busy.get_ref());
        if let Some(spin) = &group.spin_us
            && busy_polled
        {
            self.checker.error(
                spin.span(),
                context,
                format!(
                    "spin-us = {} does nothing with busy-poll = true (a busy-polled inbound never sleeps, so it never spins before sleeping): give one of the two",
                    spin.get_ref()
                ),
            );
        }
        if let Some(busy) = &group.busy_poll {
            keys.push((
                key("busyPoll").name,
                Spanned::new(busy.span(), toml::Value::Boolean(*busy.get_ref())),
            ));
        }
        if let Some(spin) = &group.spin_us
            && !busy_polled
        {
            let spin_us = key("spinUs");
            let ferromq_core::KeyKind::Integer { min, max } = spin_us.kind else {
                unreachable!("spinUs is an integer key");
            };
            if let Some(micros) = count(spin, &mut self.checker, context, "spin-us", (min, max)) {
                keys.push((
                    spin_us.name,
                    Spanned::new(spin.span(), toml::Value::Integer(micros as i64)),
                ));
            }
        }
        keys
    }

    /// The instance ids of an rpc group's members, in order, and the members' device indices;
    /// `None` (with the errors noted) when a member is no device or is listed twice.
    fn rpc_members(
        &mut self,
        parsed: &FileToml,
        group: &RpcToml,
        context: &str,
    ) -> Option<(Vec<String>, Vec<usize>)> {
        let members = group.members.get_ref();
        if members.is_empty() {
            self.checker
                .error(group.members.span(), context, "an rpc group needs members");
            return None;
        }
        let mut instance_ids = Vec::new();
        let mut device_idxs = Vec::new();
        for member in members {
            let Some(device_idx) = parsed
                .device
                .iter()
                .position(|device| device.get_ref().id.get_ref() == member)
            else {
                self.checker.error(
                    group.members.span(),
                    context,
                    format!("member {member:?} is not a device of this topology"),
                );
                return None;
            };
            if device_idxs.contains(&device_idx) {
                self.checker.error(
                    group.members.span(),
                    context,
                    format!("member {member:?} is listed twice"),
                );
                return None;
            }
            device_idxs.push(device_idx);
            let replicas = parsed.device[device_idx]
                .get_ref()
                .replicas
                .as_ref()
                .map_or(1, |replicas| {
                    (*replicas.get_ref()).clamp(1, MAX_REPLICAS as i64) as usize
                });
            if replicas <= 1 {
                instance_ids.push(member.clone());
            } else {
                instance_ids
                    .extend((0..replicas).map(|replica_idx| format!("{member}-{replica_idx}")));
            }
        }
        Some((instance_ids, device_idxs))
    }

    /// The properties every member of an rpc group gets, each value checked: one that is no
    /// setting is reported and left out.
    fn rpc_properties(
        &mut self,
        group: &RpcToml,
        instance_ids: &[String],
        context: &str,
    ) -> Vec<(String, toml::Value)> {
        let name = group.name.get_ref();
        let mut properties = vec![(
            format!("rpc.{name}.members"),
            toml::Value::String(instance_ids.join(",")),
        )];
        self.check_aggregation_keys(group, context);
        if let Some(aggregate) = &group.aggregate {
            if matches!(aggregate.get_ref().as_str(), "none" | "trad" | "ovfl") {
                properties.push((
                    format!("rpc.{name}.aggregate"),
                    toml::Value::String(aggregate.get_ref().clone()),
                ));
            } else {
                self.checker.error(
                    aggregate.span(),
                    context,
                    format!(
                        "aggregate {:?} is not none, trad or ovfl",
                        aggregate.get_ref()
                    ),
                );
            }
        }
        let numbers = [
            ("aggregate-bytes", &group.aggregate_bytes, (64, 64 << 20)),
            ("aggregate-us", &group.aggregate_us, (0, 10_000_000)),
            ("timeout-ms", &group.timeout_ms, (1, 86_400_000)),
            ("tree-arity", &group.tree_arity, (1, 255)),
        ];
        for (key, value, bounds) in numbers {
            if let Some(value) = value
                && let Some(number) = count(value, &mut self.checker, context, key, bounds)
            {
                properties.push((
                    format!("rpc.{name}.{key}"),
                    toml::Value::Integer(number as i64),
                ));
            }
        }
        properties
    }

    /// Refuses an rpc group's `aggregate-bytes` and `aggregate-us` where its `aggregate` (`ovfl`
    /// when not given) does not use them: `none` sends each call in a frame of its own and
    /// `ovfl` sends at once what the destination takes, so neither holds a frame for
    /// `aggregate-us`, and `none` fills no frame of `aggregate-bytes` (ferromq-rpc's outlet).
    /// Such a key was taken and changed nothing. The values are usable, so the group is still
    /// wired (its members are not also told they lack its channels).
    fn check_aggregation_keys(&mut self, group: &RpcToml, context: &str) {
        let (aggregation, given) = match &group.aggregate {
            Some(aggregate) => (aggregate.get_ref().as_str(), ""),
            None => ("ovfl", ", the default"),
        };
        if let Some(bytes) = &group.aggregate_bytes
            && aggregation == "none"
        {
            self.checker.error(
                bytes.span(),
                context,
                "aggregate-bytes does nothing with aggregate = \"none\" (each call is a frame of its own): give it only with \"trad\" or \"ovfl\"",
            );
        }
        if let Some(micros) = &group.aggregate_us
            && matches!(aggregation, "none" | "ovfl")
        {
            self.checker.error(
                micros.span(),
                context,
                format!(
                    "aggregate-us does nothing with aggregate = \"{aggregation}\"{given} (only \"trad\" holds a frame that is not full): give it only with \"trad\""
                ),
            );
        }
    }

    /// Refuses a transport the binary does not have; whether it has it.
    fn check_transport(&mut self, transport: &Spanned<String>, context: &str) -> bool {
        let known = self
            .known
            .transports
            .contains(&transport.get_ref().as_str());
        if !known {
            self.checker.error(
                transport.span(),
                context,
                format!(
                    "transport {:?} is not built in (built in: {})",
                    transport.get_ref(),
                    self.known.transports.join(", ")
                ),
            );
        }
        known
    }

    /// The transport of channels that name none: the one given instead of the file's, or the
    /// file's, or zeromq. The file's is checked in any case: it is still a line of the file.
    fn choose_default_transport(&mut self, parsed: &FileToml) -> String {
        let file_transport = match &parsed.transport {
            Some(transport) => {
                self.check_transport(transport, "");
                transport.get_ref().clone()
            }
            None => "zeromq".to_owned(),
        };
        let Some(given) = self.given_transport else {
            return file_transport;
        };
        if !self.known.transports.contains(&given) {
            self.checker.error(
                0..0,
                "",
                format!(
                    "transport {given:?}, given instead of the file's, is not built in (built in: {})",
                    self.known.transports.join(", ")
                ),
            );
        }
        given.to_owned()
    }

    fn auto_address(&mut self, parsed: &FileToml) -> AutoAddress {
        match parsed
            .auto_address
            .as_ref()
            .map(|auto| (auto.get_ref().as_str(), auto.span()))
        {
            None | Some(("ipc", _)) => AutoAddress::Ipc,
            Some(("tcp", _)) => AutoAddress::Tcp,
            Some((other, span)) => {
                self.checker.error(
                    span,
                    "",
                    format!("auto-address {other:?} is not ipc or tcp"),
                );
                AutoAddress::Ipc
            }
        }
    }

    /// `[hosts.NAME]`: `ssh`, `address` and `ferromq`, each a non-empty string.
    fn hosts(&mut self, parsed: &FileToml) -> BTreeMap<String, HostSpec> {
        let mut hosts = BTreeMap::new();
        for (name, host) in &parsed.hosts {
            let context = format!("host {name:?}");
            if !valid_host_name(name) {
                self.checker.error(
                    host.span(),
                    &context,
                    "a host name is letters, digits and `.-_@:[]`, not empty, not starting with `-`",
                );
            }
            let host = host.get_ref();
            let mut text = |value: &Option<Spanned<String>>, key: &str| {
                let value = value.as_ref()?;
                if value.get_ref().trim().is_empty() {
                    self.checker
                        .error(value.span(), &context, format!("{key} is empty"));
                    return None;
                }
                Some(value.get_ref().clone())
            };
            let spec = HostSpec {
                ssh: text(&host.ssh, "ssh"),
                address: text(&host.address, "address"),
                ferromq: text(&host.ferromq, "ferromq"),
            };
            if let (Some(ssh), Some(value)) = (&spec.ssh, &host.ssh)
                && !valid_ssh_destination(ssh)
            {
                self.checker.error(
                    value.span(),
                    &context,
                    format!("ssh {ssh:?} is no ssh destination: one word, not starting with `-`"),
                );
            }
            if let (Some(address), Some(value)) = (&spec.address, &host.address)
                && !valid_host_address(address)
            {
                self.checker.error(
                    value.span(),
                    &context,
                    format!(
                        "address {address:?} is neither an IP address nor a host name (no port: the launcher picks them)"
                    ),
                );
            }
            hosts.insert(name.clone(), spec);
        }
        hosts
    }

    fn device(&mut self, device: &DeviceToml) -> DeviceSpec {
        let id = device.id.get_ref().clone();
        let context = format!("device {id:?}");
        self.check_device_id(device, &context);
        let kind = self.device_kind(device, &context);
        let hosts = self.placement(device, &context);
        let replicas = self.replicas(device, &context);
        let max_iterations = device
            .max_iterations
            .as_ref()
            .and_then(|value| {
                count(
                    value,
                    &mut self.checker,
                    &context,
                    "max-iterations",
                    (0, i64::MAX),
                )
            })
            .unwrap_or(0);
        let n_errors = self.checker.errors.len();
        let properties = self.properties(device, &context);
        // What the device would read, only when every value was usable as written.
        if self.checker.errors.len() == n_errors {
            self.check_properties(device, &kind, &properties);
        }
        let restart = self.restart_policy(device, &context);
        let min_replicas = self.min_replicas(device, replicas, &context);
        let mut seen_channels: BTreeSet<String> = BTreeSet::new();
        let channels = device
            .channel
            .iter()
            .filter_map(|channel| {
                let channel = channel.get_ref();
                let context = format!("device {id:?} channel {:?}", channel.name.get_ref());
                if !seen_channels.insert(channel.name.get_ref().clone()) {
                    self.checker.error(
                        channel.name.span(),
                        &context,
                        "duplicate channel name in this device",
                    );
                }
                self.channel(&id, replicas, channel, &context)
            })
            .collect();
        self.check_required_channels(device, &kind, &properties, &seen_channels, &context);
        DeviceSpec {
            id,
            kind,
            replicas,
            properties,
            max_iterations,
            channels,
            hosts,
            restart,
            min_replicas,
        }
    }

    /// A built-in device has every channel it uses ([`Known::required_channels`]): a sampler
    /// whose only channel was `foo` passed `validate` and failed at INIT with "has no channel
    /// \"data\"". Reported at the kind, naming what provides the channel.
    fn check_required_channels(
        &mut self,
        device: &DeviceToml,
        kind: &DeviceKind,
        properties: &BTreeMap<String, String>,
        channels: &BTreeSet<String>,
        context: &str,
    ) {
        let (Some(required), DeviceKind::Builtin(kind)) = (self.known.required_channels, kind)
        else {
            return;
        };
        for (name, how) in required(kind, properties).unwrap_or_default() {
            if !channels.contains(&name) {
                let has = if channels.is_empty() {
                    "none".to_owned()
                } else {
                    channels.iter().cloned().collect::<Vec<_>>().join(", ")
                };
                self.checker.error(
                    device.kind.span(),
                    context,
                    format!("no channel {name:?} ({how}); its channels: {has}"),
                );
            }
        }
    }

    /// `restart = "never" | "on-failure" | "always"`, `max-restarts`, `restart-delay` (seconds).
    fn restart_policy(&mut self, device: &DeviceToml, context: &str) -> RestartPolicy {
        let mut policy = RestartPolicy::default();
        if let Some(when) = &device.restart {
            policy.when = match when.get_ref().as_str() {
                "never" => Restart::Never,
                "on-failure" => Restart::OnFailure,
                "always" => Restart::Always,
                other => {
                    self.checker.error(
                        when.span(),
                        context,
                        format!(
                            "restart must be \"never\", \"on-failure\" or \"always\", not {other:?}"
                        ),
                    );
                    Restart::Never
                }
            };
        }
        if let Some(limit) = &device.max_restarts
            && let Some(limit) = count(
                limit,
                &mut self.checker,
                context,
                "max-restarts",
                (0, i64::from(RestartPolicy::MAX_LIMIT)),
            )
        {
            policy.limit = u32::try_from(limit).unwrap_or(RestartPolicy::MAX_LIMIT);
        }
        if let Some(delay) = &device.restart_delay {
            let seconds = match delay.get_ref() {
                toml::Value::Integer(seconds) => Some(*seconds as f64),
                toml::Value::Float(seconds) => Some(*seconds),
                _ => None,
            };
            match seconds {
                Some(seconds) if seconds.is_finite() && (0.0..=3600.0).contains(&seconds) => {
                    policy.delay = std::time::Duration::from_secs_f64(seconds);
                }
                _ => self.checker.error(
                    delay.span(),
                    context,
                    format!(
                        "restart-delay must be a number of seconds from 0 to 3600, not {}",
                        toml_text(delay.get_ref())
                    ),
                ),
            }
        }
        let tuned = device.max_restarts.is_some() || device.restart_delay.is_some();
        if tuned && policy.when == Restart::Never && device.restart.is_none() {
            let span = device
                .max_restarts
                .as_ref()
                .map(Spanned::span)
                .or_else(|| device.restart_delay.as_ref().map(Spanned::span))
                .unwrap_or_else(|| device.id.span());
            self.checker.error(
                span,
                context,
                "max-restarts and restart-delay need restart = \"on-failure\" or \"always\"",
            );
        }
        policy
    }

    /// `expendable = true` (the topology goes on without any of its replicas) or
    /// `min-replicas = N`; neither: every replica is needed.
    fn min_replicas(&mut self, device: &DeviceToml, replicas: usize, context: &str) -> usize {
        match (&device.expendable, &device.min_replicas) {
            (Some(_), Some(min)) => {
                self.checker.error(
                    min.span(),
                    context,
                    "give expendable or min-replicas, not both (expendable = true is min-replicas = 0)",
                );
                replicas
            }
            (Some(expendable), None) => {
                if *expendable.get_ref() {
                    0
                } else {
                    replicas
                }
            }
            (None, Some(min)) => count(
                min,
                &mut self.checker,
                context,
                "min-replicas",
                (0, replicas as i64),
            )
            .map_or(replicas, |min| min as usize),
            (None, None) => replicas,
        }
    }

    /// `host = "name" | index | [names or indices]`: where the device's replicas run, in turn.
    /// `"localhost"` (alone) is the launcher's host, as no `host` at all.
    fn placement(&mut self, device: &DeviceToml, context: &str) -> Vec<HostRef> {
        let Some(host) = &device.host else {
            return Vec::new();
        };
        let span = host.span();
        let one = |value: &toml::Value, checker: &mut Checker<'_>| -> Option<HostRef> {
            match value {
                toml::Value::String(name) if valid_host_name(name) => {
                    Some(HostRef::Name(name.clone()))
                }
                toml::Value::String(name) => {
                    checker.error(
                        span.clone(),
                        context,
                        format!(
                            "host {name:?}: a host name is letters, digits and `.-_@:[]`, not empty"
                        ),
                    );
                    None
                }
                toml::Value::Integer(index) => match usize::try_from(*index) {
                    Ok(index) if index <= MAX_HOST_INDEX => Some(HostRef::Index(index)),
                    _ => {
                        checker.error(
                            span.clone(),
                            context,
                            format!("host {index}: a host index is 0 to {MAX_HOST_INDEX}"),
                        );
                        None
                    }
                },
                other => {
                    checker.error(
                        span.clone(),
                        context,
                        format!(
                            "host is a {}: expected a host name (\"n1\"), an index (0) or a \
                             list of them",
                            other.type_str()
                        ),
                    );
                    None
                }
            }
        };
        let hosts: Vec<HostRef> = match host.get_ref() {
            toml::Value::Array(values) if values.is_empty() => {
                self.checker
                    .error(span.clone(), context, "host = []: name at least one host");
                Vec::new()
            }
            toml::Value::Array(values) => values
                .iter()
                .filter_map(|value| one(value, &mut self.checker))
                .collect(),
            value => one(value, &mut self.checker).into_iter().collect(),
        };
        if hosts == [HostRef::Name("localhost".to_owned())] {
            return Vec::new();
        }
        hosts
    }

    fn check_device_id(&mut self, device: &DeviceToml, context: &str) {
        let id = device.id.get_ref();
        // Control characters too: a newline split the lines the launcher reads of the device
        // (its control endpoint was never found), a NUL could not be passed as an argument.
        // A leading `-` reads as an option to an exec device.
        if id.is_empty()
            || id.contains(['.', ' ', '/'])
            || id.contains(char::is_control)
            || id.starts_with('-')
        {
            self.checker.error(
                device.id.span(),
                context,
                "a device id must be non-empty, without '.', ' ', '/' or control characters, not starting with '-'",
            );
        }
        if let Some(first) = self.seen_ids.get(id) {
            let (line, _) = self.checker.position(first.clone());
            self.checker.error(
                device.id.span(),
                context,
                format!("duplicate device id (first defined on line {line})"),
            );
        }
        self.seen_ids.insert(id.clone(), device.id.span());
    }

    fn device_kind(&mut self, device: &DeviceToml, context: &str) -> DeviceKind {
        match (device.kind.get_ref().as_str(), &device.command) {
            // A program named "" passed validate and failed to start ("cannot start : ...").
            ("exec", Some(command))
                if command
                    .get_ref()
                    .first()
                    .is_some_and(|program| !program.trim().is_empty()) =>
            {
                DeviceKind::Exec(command.get_ref().clone())
            }
            ("exec", _) => {
                self.checker.error(
                    device.kind.span(),
                    context,
                    "kind \"exec\" needs command = [\"program\", \"args\"...], the program not empty",
                );
                DeviceKind::Exec(Vec::new())
            }
            (kind, command) => {
                if let Some(command) = command {
                    self.checker.error(
                        command.span(),
                        context,
                        "command is only for kind \"exec\"",
                    );
                }
                if !self.known.kinds.contains(&kind) {
                    self.checker.error(
                        device.kind.span(),
                        context,
                        format!(
                            "unknown kind {kind:?}; built in: {}, or exec",
                            self.known.kinds.join(", ")
                        ),
                    );
                }
                DeviceKind::Builtin(kind.to_owned())
            }
        }
    }

    /// The device's replica count, counted against the topology's bound on instances.
    fn replicas(&mut self, device: &DeviceToml, context: &str) -> usize {
        let replicas = device
            .replicas
            .as_ref()
            .and_then(|replicas| {
                count(
                    replicas,
                    &mut self.checker,
                    context,
                    "replicas",
                    (1, MAX_REPLICAS as i64),
                )
            })
            .unwrap_or(1) as usize;
        self.n_instances += replicas;
        if self.n_instances > MAX_INSTANCES && self.n_instances - replicas <= MAX_INSTANCES {
            self.checker.error(
                device
                    .replicas
                    .as_ref()
                    .map_or(device.id.span(), Spanned::span),
                context,
                format!("the topology has more than {MAX_INSTANCES} instances with this device"),
            );
        }
        replicas
    }

    /// A known built-in kind's properties, checked as the device will read them
    /// ([`Known::check_properties`]); reported at the value at fault, or at the kind when the
    /// problem is with no one property (a missing one). Called only when [`Loader::properties`]
    /// found every value usable (of a right form, none the launcher's).
    fn check_properties(
        &mut self,
        device: &DeviceToml,
        kind: &DeviceKind,
        properties: &BTreeMap<String, String>,
    ) {
        let (Some(check), DeviceKind::Builtin(kind)) = (self.known.check_properties, kind) else {
            return;
        };
        if !self.known.kinds.contains(&kind.as_str()) {
            return;
        }
        if let Err(problem) = check(
            kind,
            device.id.get_ref(),
            properties,
            self.known.transport_properties,
        ) {
            let span = problem
                .key
                .as_ref()
                .and_then(|key| device.properties.get(key))
                .map_or_else(|| device.kind.span(), Spanned::span);
            // The message names the device itself.
            self.checker.error(span, "", problem.message);
        }
    }

    fn properties(&mut self, device: &DeviceToml, context: &str) -> BTreeMap<String, String> {
        // A built-in kind's check (`check_properties`) refuses unread `rpc.` keys itself, in
        // the same words: only other devices' are refused here.
        let rpc_keys_checked_by_kind = self.known.check_properties.is_some()
            && self.known.kinds.contains(&device.kind.get_ref().as_str());
        device
            .properties
            .iter()
            .map(|(key, value)| {
                // A device is given `--property=KEY=VALUE`: an empty key, or one with `=`,
                // reached it as another key than the file's.
                if key.is_empty() || key.contains('=') || key.contains(char::is_control) {
                    self.checker.error(
                        value.span(),
                        context,
                        format!(
                            "property {key:?}: a key is not empty, without '=' or control characters"
                        ),
                    );
                }
                if let Some(problem) = rpc_property_problem(key, self.known.rpc_group_keys)
                    .filter(|_| !rpc_keys_checked_by_kind)
                {
                    self.checker.error(
                        value.span(),
                        context,
                        format!(
                            "property {key:?} (= {}) {problem}",
                            toml_text(value.get_ref())
                        ),
                    );
                }
                if LAUNCHER_PROPERTIES.contains(&key.as_str()) {
                    self.checker.error(
                        value.span(),
                        context,
                        format!(
                            "property {key:?} is set by the launcher for each replica; a value here would be overridden"
                        ),
                    );
                }
                let text = match value.get_ref() {
                    toml::Value::String(text) => text.clone(),
                    toml::Value::Integer(number) => number.to_string(),
                    toml::Value::Float(number) => float_text(*number),
                    toml::Value::Boolean(flag) => flag.to_string(),
                    other => {
                        self.checker.error(
                            value.span(),
                            context,
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
            .collect()
    }

    /// One channel of device `id`; `None` when its type is unknown (nothing else about it can
    /// be checked then).
    fn channel(
        &mut self,
        id: &str,
        replicas: usize,
        channel: &ChannelToml,
        context: &str,
    ) -> Option<ChannelSpec> {
        let name = channel.name.get_ref().clone();
        let socket_type: SocketType = match channel.socket_type.get_ref().parse() {
            Ok(socket_type) => socket_type,
            Err(error) => {
                self.checker
                    .error(channel.socket_type.span(), context, error.to_string());
                return None;
            }
        };
        let connect: Vec<String> = match channel.connect.as_ref().map(Spanned::get_ref) {
            None => Vec::new(),
            Some(OneOrMany::One(target)) => vec![target.clone()],
            Some(OneOrMany::Many(targets)) => targets.clone(),
        };
        if let Err(error) = ChannelConfig::check_name(&name) {
            // What the device refuses when it starts: said here, by `validate` too.
            self.checker
                .error(channel.name.span(), context, error.to_string());
        }
        let method = self.method(channel, !connect.is_empty(), context);
        let mut config = ChannelConfig::new(name.clone(), socket_type, method);
        config.rate_logging = 0;
        if let Some(transport) = &channel.transport {
            self.check_transport(transport, context);
            config.transport = Some(transport.get_ref().clone());
        }
        if let Some(address) = &channel.address {
            config.address = Some(address.get_ref().clone());
            let transport = config
                .transport
                .clone()
                .unwrap_or_else(|| self.default_transport.clone());
            self.check_address(address, (method, &transport), replicas, context);
        }
        self.set_keys(&mut config, channel, context);
        // What the device would refuse when it starts (`DeviceConfig::add_channel`); an
        // address that does not parse was said above.
        if let (Some(address), Err(error @ ferromq_core::ConfigError::SharedBind { .. })) =
            (&channel.address, config.check_sub_channels_bind_apart())
        {
            self.checker
                .error(address.span(), context, error.to_string());
        }
        self.channel_index.insert(
            (id.to_owned(), name.clone()),
            IndexedChannel {
                socket_type,
                method,
                transport: config.transport.clone(),
            },
        );
        let connect_span = channel
            .connect
            .as_ref()
            .map_or(channel.name.span(), Spanned::span);
        let mut targets = Vec::new();
        let mut seen_targets: BTreeSet<String> = BTreeSet::new();
        for target in connect {
            // Connected twice to one binder, and drawn as two edges; numSockets = N with the
            // target named once gives N sockets, each connected to it.
            if !seen_targets.insert(target.clone()) {
                self.checker.error(
                    connect_span.clone(),
                    context,
                    format!(
                        "connect lists {target:?} twice: a channel connects to each binder once (for more connections to it, give the channel numSockets)"
                    ),
                );
                continue;
            }
            let Some((device_id, channel_name)) = target.split_once('.') else {
                self.checker.error(
                    connect_span.clone(),
                    context,
                    format!("connect {target:?} is not \"device.channel\""),
                );
                continue;
            };
            targets.push((device_id.to_owned(), channel_name.to_owned()));
            self.connections.push(Connection {
                device: id.to_owned(),
                channel: name.clone(),
                socket_type,
                transport: config.transport.clone(),
                target,
                span: connect_span.clone(),
            });
        }
        Some(ChannelSpec {
            config,
            connect: targets,
        })
    }

    /// The method written, or the one implied: connect when the channel names targets.
    fn method(&mut self, channel: &ChannelToml, has_targets: bool, context: &str) -> Method {
        let method = match (channel.method.as_ref(), has_targets) {
            (Some(method), _) => match method.get_ref().parse::<Method>() {
                Ok(Method::Bind) if has_targets => {
                    self.checker.error(
                        method.span(),
                        context,
                        "a channel with connect = ... cannot have method = \"bind\"",
                    );
                    Method::Connect
                }
                Ok(method) => method,
                Err(error) => {
                    self.checker
                        .error(method.span(), context, error.to_string());
                    Method::Bind
                }
            },
            (None, false) => Method::Bind,
            (None, true) => Method::Connect,
        };
        if method == Method::Connect && !has_targets && channel.address.is_none() {
            self.checker.error(
                channel.name.span(),
                context,
                "a connecting channel needs connect = \"device.channel\" or an address",
            );
        }
        method
    }

    /// An address written in the file: it parses, its channel's transport takes its scheme,
    /// and a bind address is bound once (`channel`: the channel's method and transport).
    fn check_address(
        &mut self,
        address: &Spanned<String>,
        channel: (Method, &str),
        replicas: usize,
        context: &str,
    ) {
        let (method, transport) = channel;
        match ferromq_core::Address::parse(address.get_ref()) {
            Err(error) => self
                .checker
                .error(address.span(), context, error.to_string()),
            // Each device of a topology is a process of its own: an inproc peer would never
            // come (a sampler and a sink over inproc "ran", exit 0, with 0 messages).
            Ok(ferromq_core::Address::Inproc { .. }) => self.checker.error(
                address.span(),
                context,
                format!(
                    "{} reaches only sockets of the same process, and each device of a topology is a process of its own: use ipc:// or tcp://",
                    address.get_ref()
                ),
            ),
            // Refused by the transport only when the device binds or connects.
            Ok(parsed) => {
                // A `verbs://` on a zeromq channel passed and was refused only when the
                // device bound it. The transports say what they take (their registry's
                // traits); inproc, refused above, is left out of what a topology may use.
                if let Some((_, schemes)) = self
                    .known
                    .transport_schemes
                    .iter()
                    .find(|(name, _)| *name == transport)
                    && !schemes.contains(&parsed.scheme())
                {
                    let usable: Vec<String> = schemes
                        .iter()
                        .filter(|scheme| **scheme != "inproc")
                        .map(|scheme| format!("{scheme}://"))
                        .collect();
                    self.checker.error(
                        address.span(),
                        context,
                        format!(
                            "address {}: transport {transport} takes {}, not {}://",
                            address.get_ref(),
                            usable.join(" and "),
                            parsed.scheme()
                        ),
                    );
                }
            }
        }
        if method != Method::Bind {
            return;
        }
        if let Some(other) = self
            .bind_addresses
            .insert(address.get_ref().clone(), context.to_owned())
        {
            self.checker.error(
                address.span(),
                context,
                format!("address {} is already bound by {other}", address.get_ref()),
            );
        }
        if replicas > 1 {
            self.checker.error(
                address.span(),
                context,
                "replicas of a device cannot share one bind address; omit it",
            );
        }
    }

    /// The channel keys of the key table, each set through it (which checks its type and range).
    fn set_keys(&mut self, config: &mut ChannelConfig, channel: &ChannelToml, context: &str) {
        for (key, value) in &channel.keys {
            let set = match value.get_ref() {
                toml::Value::String(text) => config.set(key, KeyValue::Text(text)),
                toml::Value::Integer(number) => config.set(key, KeyValue::Integer(*number)),
                toml::Value::Boolean(flag) => config.set(key, KeyValue::Bool(*flag)),
                other => {
                    self.checker.error(
                        value.span(),
                        context,
                        format!(
                            "{key} must be a number, text or boolean, not {}",
                            other.type_str()
                        ),
                    );
                    continue;
                }
            };
            if let Err(error) = set {
                self.checker.error(value.span(), context, error.to_string());
            }
        }
        if let Err(error) = config.check_spin() {
            let span = channel
                .keys
                .iter()
                .find(|(key, _)| *key == "spinUs")
                .map_or_else(|| channel.name.span(), |(_, value)| value.span());
            self.checker.error(span, context, error.to_string());
        }
        if config.port_range_min > config.port_range_max {
            let span = ["portRangeMax", "portRangeMin"]
                .iter()
                .find_map(|wanted| channel.keys.iter().find(|(key, _)| key == wanted))
                .map_or_else(|| channel.name.span(), |(_, value)| value.span());
            self.checker.error(
                span,
                context,
                format!(
                    "portRangeMin {} is above portRangeMax {}",
                    config.port_range_min, config.port_range_max
                ),
            );
        }
    }

    /// Every `connect` names a binding channel of a compatible type, and the instances'
    /// connections stay within [`MAX_CONNECTIONS`].
    fn check_connections(&mut self, devices: &[DeviceSpec], default_transport: &str) {
        let replicas_of: BTreeMap<&str, u64> = devices
            .iter()
            .map(|device| (device.id.as_str(), device.replicas as u64))
            .collect();
        let mut n_connections = 0_u64;
        for connection in std::mem::take(&mut self.connections) {
            let Connection {
                device: device_id,
                channel: channel_name,
                socket_type,
                transport,
                target,
                span,
            } = connection;
            let transport = transport.as_deref().unwrap_or(default_transport);
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
                self.checker.error(
                    span.clone(),
                    &context,
                    format!(
                        "the topology expands to more than {MAX_CONNECTIONS} connections between instances with connect {target:?}"
                    ),
                );
            }
            self.check_target(
                (socket_type, transport, default_transport),
                &target,
                span,
                &context,
            );
        }
    }

    /// One connect target: an existing, binding channel of a compatible type, on the same
    /// transport (`from`: the connecting channel's type and transport, and the file's default).
    fn check_target(
        &mut self,
        from: (SocketType, &str, &str),
        target: &str,
        span: Range<usize>,
        context: &str,
    ) {
        let (socket_type, transport, default_transport) = from;
        let Some((target_device, target_channel)) = target.split_once('.') else {
            return;
        };
        if !self.seen_ids.contains_key(target_device) {
            self.checker.error(
                span,
                context,
                format!("connect {target:?}: there is no device {target_device:?}"),
            );
            return;
        }
        let Some(IndexedChannel {
            socket_type: target_type,
            method: target_method,
            transport: target_transport,
        }) = self
            .channel_index
            .get(&(target_device.to_owned(), target_channel.to_owned()))
            .cloned()
        else {
            self.checker.error(
                span,
                context,
                format!(
                    "connect {target:?}: device {target_device:?} has no channel {target_channel:?}"
                ),
            );
            return;
        };
        if target_method != Method::Bind {
            self.checker.error(
                span.clone(),
                context,
                format!("connect {target:?}: that channel connects too; one end must bind"),
            );
        }
        let target_transport = target_transport.as_deref().unwrap_or(default_transport);
        if target_transport != transport {
            // Refused by the peers only when they meet ("the peer uses the zeromq transport").
            self.checker.error(
                span.clone(),
                context,
                format!(
                    "connect {target:?}: that channel is on {target_transport}, this one on {transport}; both ends of a connection use one transport"
                ),
            );
        }
        if !socket_type.is_compatible_with(target_type) {
            self.checker.error(
                span,
                context,
                format!("a {socket_type} channel cannot connect to {target:?}, a {target_type} channel (a {socket_type} pairs with a {})", socket_type.peer()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{valid_host_address, valid_host_name, valid_ssh_destination};

    /// Found by a bad-input sweep: `ssh = "-oProxyCommand=..."` went to ssh as an option, and
    /// `address = "10.0.0.1:5555"` became `tcp://10.0.0.1:5555:0`.
    #[test]
    fn hosts_are_words_ssh_takes_for_destinations_and_addresses_without_ports() {
        for good in ["n1", "me@n1", "ssh://me@n1:2222", "node-1.cluster"] {
            assert!(valid_ssh_destination(good), "{good}");
        }
        for bad in ["-oProxyCommand=touch x", "-x", "a b", "a\nb"] {
            assert!(!valid_ssh_destination(bad), "{bad}");
        }
        for good in [
            "10.0.0.1",
            "::1",
            "[fe80::1]",
            "node-1.cluster",
            "localhost",
        ] {
            assert!(valid_host_address(good), "{good}");
        }
        for bad in ["10.0.0.1:5555", "not an address!", "-x", "a_b", "[n1]", ""] {
            assert!(!valid_host_address(bad), "{bad}");
        }
        assert!(valid_host_name("n1") && !valid_host_name("-oX"));
    }
}
