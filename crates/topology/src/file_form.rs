//! The file as written: serde forms of the TOML tables, every value with its span so that a
//! check can point at it. Nothing here is checked beyond the shape; [`crate::check`] does that.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct FileToml {
    pub(crate) transport: Option<Spanned<String>>,
    pub(crate) auto_address: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) device: Vec<Spanned<DeviceToml>>,
    #[serde(default)]
    pub(crate) rpc: Vec<Spanned<RpcToml>>,
    #[serde(default)]
    pub(crate) hosts: BTreeMap<String, Spanned<HostToml>>,
}

/// A `[hosts.NAME]` table: how a launcher reaches a host (see `check::hosts`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct HostToml {
    pub(crate) ssh: Option<Spanned<String>>,
    pub(crate) address: Option<Spanned<String>>,
    pub(crate) ferromq: Option<Spanned<String>>,
}

/// An `[[rpc]]` table: a group of devices that call each other (see `check::rpc_groups`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RpcToml {
    pub(crate) name: Spanned<String>,
    pub(crate) members: Spanned<Vec<String>>,
    pub(crate) transport: Option<Spanned<String>>,
    pub(crate) aggregate: Option<Spanned<String>>,
    pub(crate) aggregate_bytes: Option<Spanned<i64>>,
    pub(crate) aggregate_us: Option<Spanned<i64>>,
    pub(crate) timeout_ms: Option<Spanned<i64>>,
    pub(crate) tree_arity: Option<Spanned<i64>>,
    pub(crate) busy_poll: Option<Spanned<bool>>,
    pub(crate) spin_us: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct DeviceToml {
    pub(crate) id: Spanned<String>,
    pub(crate) kind: Spanned<String>,
    pub(crate) command: Option<Spanned<Vec<String>>>,
    pub(crate) host: Option<Spanned<toml::Value>>,
    pub(crate) replicas: Option<Spanned<i64>>,
    pub(crate) max_iterations: Option<Spanned<i64>>,
    pub(crate) restart: Option<Spanned<String>>,
    pub(crate) max_restarts: Option<Spanned<i64>>,
    pub(crate) restart_delay: Option<Spanned<toml::Value>>,
    pub(crate) expendable: Option<Spanned<bool>>,
    pub(crate) min_replicas: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) properties: BTreeMap<String, Spanned<toml::Value>>,
    #[serde(default)]
    pub(crate) channel: Vec<Spanned<ChannelToml>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A `[[device.channel]]` table: the keys with a topology's own meaning (`name`, `type`,
/// `method`, `address`, `connect`, `transport`) as themselves, every other channel key as
/// written, for the key table (ferromq-core's `CHANNEL_KEYS`) to check; a key in neither is an
/// error naming it.
pub(crate) struct ChannelToml {
    pub(crate) name: Spanned<String>,
    pub(crate) socket_type: Spanned<String>,
    pub(crate) method: Option<Spanned<String>>,
    pub(crate) address: Option<Spanned<String>>,
    pub(crate) connect: Option<Spanned<OneOrMany>>,
    pub(crate) transport: Option<Spanned<String>>,
    pub(crate) keys: Vec<(&'static str, Spanned<toml::Value>)>,
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
