//! A device's configuration: its id, session, default transport, channels and properties, and
//! the FairMQ JSON format (`--mq-config`) that users already have.

use std::collections::BTreeMap;

use ferromq_core::{ChannelConfig, MAX_NUM_SOCKETS};
use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::error::{DeviceError, Result};

/// The default transport when nothing says otherwise (FairMQ's default too).
pub const DEFAULT_TRANSPORT: &str = "zeromq";

/// One socket of a channel: `data` or `data[1]`, with its own configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketConfig {
    /// The socket's name (`data`, `data[0]`).
    pub name: String,
    /// The channel configuration for this socket (its `name` is the channel's base name).
    pub config: ChannelConfig,
}

/// Everything a device is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device id, unique in a topology.
    pub id: String,
    /// Session id: devices of one session share transport resources.
    pub session: String,
    /// Transport of channels that name none.
    pub transport: String,
    /// Every socket of every channel.
    pub sockets: Vec<SocketConfig>,
    /// Device-specific properties (`msg-size`, `rate`, ...), as text.
    pub properties: BTreeMap<String, String>,
    /// Leave RUNNING after this many iterations (0 = never).
    pub max_iterations: u64,
}

impl DeviceConfig {
    /// A device with no channels, the default transport and session `default`.
    pub fn new(id: impl Into<String>) -> DeviceConfig {
        DeviceConfig {
            id: id.into(),
            session: "default".to_owned(),
            transport: DEFAULT_TRANSPORT.to_owned(),
            sockets: Vec::new(),
            properties: BTreeMap::new(),
            max_iterations: 0,
        }
    }

    /// Adds a channel; a channel with `numSockets` > 1 adds one socket per sub-channel.
    ///
    /// # Errors
    /// [`DeviceError::Channel`] when the configuration is invalid or the name is taken.
    pub fn add_channel(&mut self, config: ChannelConfig) -> Result<()> {
        config.validate().map_err(ferromq_core::Error::from)?;
        if self
            .sockets
            .iter()
            .any(|socket| socket.config.name == config.name)
        {
            return Err(DeviceError::Property {
                device: self.id.clone(),
                key: format!("channel {}", config.name),
                problem: "is configured twice".to_owned(),
            });
        }
        for name in config.socket_names() {
            self.sockets.push(SocketConfig {
                name,
                config: config.clone(),
            });
        }
        Ok(())
    }

    /// Builder-style [`DeviceConfig::add_channel`].
    ///
    /// # Errors
    /// As [`DeviceConfig::add_channel`].
    pub fn with_channel(mut self, config: ChannelConfig) -> Result<DeviceConfig> {
        self.add_channel(config)?;
        Ok(self)
    }

    /// Sets a property (builder style).
    pub fn with_property(mut self, key: impl Into<String>, value: impl ToString) -> DeviceConfig {
        self.properties.insert(key.into(), value.to_string());
        self
    }

    /// Reads the channels of device `id` from a FairMQ JSON configuration (`--mq-config`).
    ///
    /// # Errors
    /// As [`DeviceConfig::add_mq_config_for`].
    pub fn add_mq_config(&mut self, path: &str, json: &str) -> Result<()> {
        let key = self.id.clone();
        self.add_mq_config_for(path, json, &key)
    }

    /// Reads the channels of the device whose `id` (or `key`) is `key` from a FairMQ JSON
    /// configuration (`--mq-config` with FairMQ's `--config-key`).
    ///
    /// Like FairMQ's parser, keys it does not know are ignored: each is named in one warning
    /// (FairMQ's `sndTimeoutMs` and `rcvTimeoutMs`, which ferromq has no use for, included). A
    /// channel this configuration already has (from `--channel-config`) keeps its command-line
    /// configuration; the file's is skipped with a warning.
    ///
    /// # Errors
    /// [`DeviceError::MqConfig`] naming the key, the value, and the line and column of the
    /// problem, or when the file has no device `key`.
    pub fn add_mq_config_for(&mut self, path: &str, json: &str, key: &str) -> Result<()> {
        let mq_error = |problem: String| DeviceError::MqConfig {
            path: path.to_owned(),
            problem,
        };
        let file: MqConfigFile =
            serde_json::from_str(json).map_err(|error| mq_error(error.to_string()))?;
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(json) {
            let mut unknown = Vec::new();
            unknown_keys(&value, &mut unknown);
            unknown.sort();
            unknown.dedup();
            if !unknown.is_empty() {
                tracing::warn!(
                    file = path,
                    "ignoring key(s) ferromq does not use: {}",
                    unknown.join(", ")
                );
            }
        }
        let Some(device) =
            file.fair_mq_options.devices.into_iter().find(|device| {
                device.id.as_deref() == Some(key) || device.key.as_deref() == Some(key)
            })
        else {
            return Err(mq_error(format!("no device with id (or key) {key:?}")));
        };
        let from_command_line: Vec<String> = self
            .sockets
            .iter()
            .map(|socket| socket.config.name.clone())
            .collect();
        for channel in device.channels {
            if let Some(name) = channel
                .name
                .as_ref()
                .filter(|name| from_command_line.contains(name))
            {
                tracing::warn!(
                    file = path,
                    channel = %name,
                    "channel configured by --channel-config too: the command line wins"
                );
                continue;
            }
            for (socket_idx, config) in channel.expand().map_err(mq_error)?.into_iter().enumerate()
            {
                config.validate().map_err(|error| {
                    mq_error(format!(
                        "channel {:?} socket {socket_idx}: {}",
                        config.name,
                        crate::error_chain(&error)
                    ))
                })?;
                let n_sockets = config.num_sockets;
                let name = if n_sockets > 1 {
                    format!("{}[{socket_idx}]", config.name)
                } else {
                    config.name.clone()
                };
                self.sockets.push(SocketConfig { name, config });
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct MqConfigFile {
    #[serde(rename = "fairMQOptions")]
    fair_mq_options: MqOptions,
}

#[derive(Deserialize)]
struct MqOptions {
    devices: Vec<MqDevice>,
}

#[derive(Deserialize)]
struct MqDevice {
    id: Option<String>,
    key: Option<String>,
    #[serde(default)]
    channels: Vec<MqChannel>,
}

/// Channel-level keys are shared by its sockets; socket-level keys override them. The keys
/// are FairMQ's: the field names in camelCase; numbers go through `number_key` so that an
/// error names its key.
#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "camelCase")]
struct MqSocket {
    name: Option<String>,
    #[serde(rename = "type")]
    socket_type: Option<String>,
    method: Option<String>,
    address: Option<String>,
    transport: Option<String>,
    #[serde(deserialize_with = "number_key::snd_buf_size")]
    snd_buf_size: Option<u64>,
    #[serde(deserialize_with = "number_key::rcv_buf_size")]
    rcv_buf_size: Option<u64>,
    #[serde(deserialize_with = "number_key::snd_kernel_size")]
    snd_kernel_size: Option<u64>,
    #[serde(deserialize_with = "number_key::rcv_kernel_size")]
    rcv_kernel_size: Option<u64>,
    #[serde(deserialize_with = "number_key::linger")]
    linger: Option<u64>,
    #[serde(deserialize_with = "number_key::rate_logging")]
    rate_logging: Option<u64>,
    #[serde(deserialize_with = "number_key::port_range_min")]
    port_range_min: Option<u64>,
    #[serde(deserialize_with = "number_key::port_range_max")]
    port_range_max: Option<u64>,
    #[serde(deserialize_with = "bool_or_text")]
    auto_bind: Option<bool>,
    /// FairMQ's send timeout: checked, not used (ferromq's sends wait, cancellably).
    #[allow(dead_code)] // Read only to check the value: ferromq has no per-channel timeouts.
    #[serde(deserialize_with = "number_key::timeout")]
    snd_timeout_ms: Option<i64>,
    /// FairMQ's receive timeout: checked, not used.
    #[allow(dead_code)] // Read only to check the value: ferromq has no per-channel timeouts.
    #[serde(deserialize_with = "number_key::timeout")]
    rcv_timeout_ms: Option<i64>,
    #[serde(deserialize_with = "number_key::num_sockets")]
    num_sockets: Option<u64>,
    /// ferromq's own: the libfabric provider of an ofi channel.
    provider: Option<String>,
    /// Only at channel level: one entry per sub-channel.
    sockets: Option<Vec<MqSocket>>,
}

/// A channel entry has the socket keys plus `sockets`.
type MqChannel = MqSocket;

impl MqSocket {
    /// One channel configuration per socket.
    fn expand(mut self) -> Result<Vec<ChannelConfig>, String> {
        let name = self.name.clone().ok_or("a channel has no \"name\"")?;
        let sockets = match self.sockets.take() {
            Some(sockets) if !sockets.is_empty() => sockets,
            _ => {
                let n_sockets = self.num_sockets.unwrap_or(1).max(1);
                // Checked before allocating: a forged count must not exhaust memory.
                if n_sockets > MAX_NUM_SOCKETS as u64 {
                    return Err(format!(
                        "channel {name:?}: numSockets {n_sockets} is more than {MAX_NUM_SOCKETS}"
                    ));
                }
                vec![MqSocket::default(); n_sockets as usize]
            }
        };
        if sockets.iter().any(|socket| socket.sockets.is_some()) {
            return Err(format!(
                "channel {name:?}: a socket entry cannot have \"sockets\" of its own"
            ));
        }
        let n_sockets = sockets.len();
        sockets
            .into_iter()
            .map(|socket| merge(&name, &self, socket, n_sockets))
            .collect()
    }
}

fn merge(
    name: &str,
    common: &MqSocket,
    socket: MqSocket,
    n_sockets: usize,
) -> Result<ChannelConfig, String> {
    let pick_text = |own: Option<String>, shared: &Option<String>| own.or_else(|| shared.clone());
    let pick = |own: Option<u64>, shared: Option<u64>| own.or(shared);
    let mut config = ChannelConfig {
        name: name.to_owned(),
        ..ChannelConfig::default()
    };
    let socket_type = pick_text(socket.socket_type, &common.socket_type)
        .ok_or_else(|| format!("channel {name:?} has no \"type\""))?;
    config.socket_type = socket_type
        .parse()
        .map_err(|error| format!("channel {name:?}: {error}"))?;
    config.address = pick_text(socket.address, &common.address);
    // FairMQ's multi-endpoint addresses (`@tcp://*:5555,+tcp://host:5556`) need no method.
    config.method = match pick_text(socket.method, &common.method) {
        Some(method) => method
            .parse()
            .map_err(|error| format!("channel {name:?}: {error}"))?,
        None => config
            .prefixed_method()
            .ok_or_else(|| format!("channel {name:?} has no \"method\""))?,
    };
    config.transport =
        pick_text(socket.transport, &common.transport).filter(|transport| transport != "default");
    config.provider = pick_text(socket.provider, &common.provider);
    let narrow = |key: &str, value: u64| -> Result<u16, String> {
        u16::try_from(value).map_err(|_| format!("channel {name:?}: {key} {value} is not a port"))
    };
    if let Some(value) = pick(socket.snd_buf_size, common.snd_buf_size) {
        config.snd_buf_size = value as usize;
    }
    if let Some(value) = pick(socket.rcv_buf_size, common.rcv_buf_size) {
        config.rcv_buf_size = value as usize;
    }
    if let Some(value) = pick(socket.snd_kernel_size, common.snd_kernel_size) {
        config.snd_kernel_size = value as usize;
    }
    if let Some(value) = pick(socket.rcv_kernel_size, common.rcv_kernel_size) {
        config.rcv_kernel_size = value as usize;
    }
    if let Some(value) = pick(socket.linger, common.linger) {
        config.linger = value;
    }
    if let Some(value) = pick(socket.rate_logging, common.rate_logging) {
        config.rate_logging = value;
    }
    if let Some(value) = pick(socket.port_range_min, common.port_range_min) {
        config.port_range_min = narrow("portRangeMin", value)?;
    }
    if let Some(value) = pick(socket.port_range_max, common.port_range_max) {
        config.port_range_max = narrow("portRangeMax", value)?;
    }
    if let Some(value) = socket.auto_bind.or(common.auto_bind) {
        config.auto_bind = value;
    }
    config.num_sockets = n_sockets;
    Ok(config)
}

/// The keys of FairMQ's channel entries, plus ferromq's `provider`; others are warned about.
const MQ_CHANNEL_KEYS: [&str; 19] = [
    "name",
    "type",
    "method",
    "address",
    "transport",
    "sndBufSize",
    "rcvBufSize",
    "sndKernelSize",
    "rcvKernelSize",
    "sndTimeoutMs",
    "rcvTimeoutMs",
    "linger",
    "rateLogging",
    "portRangeMin",
    "portRangeMax",
    "autoBind",
    "numSockets",
    "provider",
    "sockets",
];

/// Collects `where: key` for every key of a FairMQ JSON configuration this parser ignores.
fn unknown_keys(file: &serde_json::Value, unknown: &mut Vec<String>) {
    let serde_json::Value::Object(top) = file else {
        return;
    };
    let mut check =
        |object: &serde_json::Map<String, serde_json::Value>, known: &[&str], place: &str| {
            for key in object.keys().filter(|key| !known.contains(&key.as_str())) {
                unknown.push(format!("{place}{key:?}"));
            }
        };
    check(top, &["fairMQOptions"], "");
    let Some(serde_json::Value::Object(options)) = top.get("fairMQOptions") else {
        return;
    };
    check(options, &["devices"], "fairMQOptions.");
    let Some(serde_json::Value::Array(devices)) = options.get("devices") else {
        return;
    };
    for device in devices.iter().filter_map(serde_json::Value::as_object) {
        check(device, &["id", "key", "channels"], "device.");
        let Some(serde_json::Value::Array(channels)) = device.get("channels") else {
            continue;
        };
        for channel in channels.iter().filter_map(serde_json::Value::as_object) {
            check(channel, &MQ_CHANNEL_KEYS, "channel.");
            let Some(serde_json::Value::Array(sockets)) = channel.get("sockets") else {
                continue;
            };
            for socket in sockets.iter().filter_map(serde_json::Value::as_object) {
                // A socket entry has every channel key but `sockets`.
                check(
                    socket,
                    &MQ_CHANNEL_KEYS[..MQ_CHANNEL_KEYS.len() - 1],
                    "socket.",
                );
            }
        }
    }
}

/// An optional value that FairMQ's files write in more than one spelling (`1000` and `"1000"`,
/// `false` and `"0"`): `read` takes what it accepts, anything else is the error `refusal` words
/// (naming the key, the value and what was expected).
fn lenient<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    read: impl FnOnce(&serde_json::Value) -> Option<T>,
    refusal: impl FnOnce(&serde_json::Value) -> String,
) -> Result<Option<T>, D::Error> {
    let Some(value) = Option::<serde_json::Value>::deserialize(deserializer)? else {
        return Ok(None);
    };
    read(&value)
        .map(Some)
        .ok_or_else(|| de::Error::custom(refusal(&value)))
}

/// An integer as a JSON number or as text.
fn number<T: std::str::FromStr>(
    value: &serde_json::Value,
    from_number: impl FnOnce(&serde_json::Number) -> Option<T>,
) -> Option<T> {
    match value {
        serde_json::Value::Number(number) => from_number(number),
        serde_json::Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// FairMQ's files write numbers both as `1000` and as `"1000"`; anything else is an error
/// naming the key, the value and what was expected.
fn number_or_text<'de, D: Deserializer<'de>>(
    deserializer: D,
    key: &str,
) -> Result<Option<u64>, D::Error> {
    lenient(
        deserializer,
        |value| number(value, serde_json::Number::as_u64),
        |value| format!("key {key:?} has invalid value {value}: expected a non-negative integer"),
    )
}

/// Per-key deserializers, so that every error names its key.
mod number_key {
    use serde::Deserializer;

    macro_rules! keys {
        ($($function:ident => $key:literal),* $(,)?) => {$(
            pub(super) fn $function<'de, D: Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Option<u64>, D::Error> {
                super::number_or_text(deserializer, $key)
            }
        )*};
    }

    keys! {
        snd_buf_size => "sndBufSize",
        rcv_buf_size => "rcvBufSize",
        snd_kernel_size => "sndKernelSize",
        rcv_kernel_size => "rcvKernelSize",
        linger => "linger",
        rate_logging => "rateLogging",
        port_range_min => "portRangeMin",
        port_range_max => "portRangeMax",
        num_sockets => "numSockets",
    }

    /// FairMQ's timeouts: milliseconds, -1 for none.
    pub(super) fn timeout<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<i64>, D::Error> {
        super::lenient(
            deserializer,
            |value| {
                super::number(value, serde_json::Number::as_i64)
                    .filter(|&milliseconds| milliseconds >= -1)
            },
            |value| format!("timeout {value} is invalid: expected milliseconds, or -1 for none"),
        )
    }
}

fn bool_or_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<bool>, D::Error> {
    lenient(
        deserializer,
        |value| match value {
            serde_json::Value::Bool(flag) => Some(*flag),
            serde_json::Value::Number(number) => match number.as_u64() {
                Some(1) => Some(true),
                Some(0) => Some(false),
                _ => None,
            },
            serde_json::Value::String(text) => match text.trim() {
                "true" | "1" => Some(true),
                "false" | "0" => Some(false),
                _ => None,
            },
            _ => None,
        },
        |value| format!("key \"autoBind\" has invalid value {value}: expected true or false"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferromq_core::{Method, SocketType};

    /// The example of FairMQ's configuration documentation, in its own spelling (shared with
    /// the fuzz target's seeds).
    const FAIRMQ_EXAMPLE: &str = include_str!("../tests/data/fairmq-example.json");

    #[test]
    fn reads_fairmqs_documented_format() {
        let mut sampler = DeviceConfig::new("sampler1");
        sampler
            .add_mq_config("example.json", FAIRMQ_EXAMPLE)
            .unwrap();
        assert_eq!(sampler.sockets.len(), 1);
        let data = &sampler.sockets[0];
        assert_eq!(data.name, "data");
        assert_eq!(data.config.socket_type, SocketType::Push);
        assert_eq!(data.config.method, Method::Bind);
        assert_eq!(data.config.linger, 500);
        assert!(!data.config.auto_bind);

        let mut sink = DeviceConfig::new("sink1");
        sink.add_mq_config("example.json", FAIRMQ_EXAMPLE).unwrap();
        let names: Vec<&str> = sink
            .sockets
            .iter()
            .map(|socket| socket.name.as_str())
            .collect();
        assert_eq!(names, ["data[0]", "data[1]"]);
        assert_eq!(
            sink.sockets[1].config.address.as_deref(),
            Some("tcp://localhost:5556")
        );
        assert_eq!(sink.sockets[1].config.rcv_buf_size, 10);
        assert_eq!(sink.sockets[0].config.rcv_buf_size, 1000);
        assert_eq!(sink.sockets[0].config.socket_type, SocketType::Pull);
    }

    #[test]
    fn reads_the_ofi_provider_of_a_channel() {
        let mut config = DeviceConfig::new("d");
        config
            .add_mq_config(
                "ofi.json",
                r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "transport": "ofi", "provider": "verbs;ofi_rxm"}]}]}}"#,
            )
            .unwrap();
        assert_eq!(
            config.sockets[0].config.provider.as_deref(),
            Some("verbs;ofi_rxm")
        );
    }

    fn check_error(json: &str, expected: &[&str]) {
        let mut config = DeviceConfig::new("d");
        let error = config
            .add_mq_config("bad.json", json)
            .unwrap_err()
            .to_string();
        for part in expected {
            assert!(error.contains(part), "{error:?} should contain {part:?}");
        }
    }

    #[test]
    fn malformed_files_name_the_key_and_position() {
        check_error(
            "{\n  \"fairMQOptions\": {\n    \"devices\": [\n  }",
            &["line 4 column"],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "linger": "soon"}]}]}}"#,
            &["key \"linger\" has invalid value \"soon\": expected a non-negative integer"],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "sndBufSize": -1}]}]}}"#,
            &[
                "bad.json",
                "key \"sndBufSize\" has invalid value -1: expected a non-negative integer",
                "line 1 column",
            ],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "autoBind": 2}]}]}}"#,
            &["key \"autoBind\" has invalid value 2: expected true or false"],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "address": "@tcp://*:1,+tcp://nowhere"}]}]}}"#,
            &[
                "channel \"x\"",
                "bad address",
                "\"tcp://nowhere\" has no port",
            ],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "other"}]}}"#,
            &["no device with id (or key) \"d\""],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "method": "bind"}]}]}}"#,
            &["channel \"x\" has no \"type\""],
        );
    }

    /// Found by fuzzing (crates/fuzz): `"numSockets": "4294967296"` allocated a socket entry
    /// per count before any check and aborted the process.
    #[test]
    fn a_forged_socket_count_is_an_error_not_an_allocation() {
        let json = |n_sockets: &str| {
            format!(
                r#"{{"fairMQOptions": {{"devices": [{{"id": "d", "channels": [{{"name": "x", "type": "push", "method": "bind", "numSockets": {n_sockets}}}]}}]}}}}"#
            )
        };
        check_error(
            &json("\"4294967296\""),
            &[
                "bad.json",
                "channel \"x\"",
                "numSockets 4294967296 is more than 1024",
            ],
        );
        check_error(
            &json("18446744073709551615"),
            &["numSockets 18446744073709551615 is more than 1024"],
        );
        let mut config = DeviceConfig::new("d");
        config.add_mq_config("ok.json", &json("1024")).unwrap();
        assert_eq!(config.sockets.len(), 1024);
    }

    #[test]
    fn keys_fairmq_ignores_are_ignored_here_too() {
        let mut config = DeviceConfig::new("d");
        config
            .add_mq_config(
                "keys.json",
                r#"{"fairMQOptions": {"devices": [{"id": "d", "color": "red", "channels": [{"name": "x", "type": "push", "method": "bind", "sndTimeoutMs": -1, "rcvTimeoutMs": "100", "sndBufSise": 1}]}]}}"#,
            )
            .unwrap();
        assert_eq!(config.sockets.len(), 1);
        assert_eq!(config.sockets[0].config.snd_buf_size, 1000);
        let mut unknown = Vec::new();
        unknown_keys(
            &serde_json::from_str(
                r#"{"fairMQOptions": {"devices": [{"id": "d", "color": "red", "channels": [{"name": "x", "sndTimeoutMs": 1, "sndBufSise": 1, "sockets": [{"sockets": []}]}]}]}}"#,
            )
            .unwrap(),
            &mut unknown,
        );
        assert_eq!(
            unknown,
            [
                "device.\"color\"",
                "channel.\"sndBufSise\"",
                "socket.\"sockets\""
            ]
        );
    }

    #[test]
    fn config_key_selects_the_entry_and_the_command_line_wins() {
        let json = r#"{"fairMQOptions": {"devices": [{"key": "processor", "channels": [
            {"name": "data", "type": "push", "method": "bind", "address": "ipc:///tmp/from-file"},
            {"name": "other", "type": "pull", "method": "connect", "address": "ipc:///tmp/other"}]}]}}"#;
        let mut config = DeviceConfig::new("processor-7");
        config
            .add_channel(
                ChannelConfig::new("data", SocketType::Push, Method::Bind)
                    .with_address("ipc:///tmp/from-command-line"),
            )
            .unwrap();
        config
            .add_mq_config_for("key.json", json, "processor")
            .unwrap();
        let addresses: Vec<(&str, Option<&str>)> = config
            .sockets
            .iter()
            .map(|socket| (socket.name.as_str(), socket.config.address.as_deref()))
            .collect();
        assert_eq!(
            addresses,
            [
                ("data", Some("ipc:///tmp/from-command-line")),
                ("other", Some("ipc:///tmp/other"))
            ]
        );
        assert!(
            DeviceConfig::new("processor-7")
                .add_mq_config("key.json", json)
                .is_err(),
            "without the key the id is looked up"
        );
    }

    #[test]
    fn multi_endpoint_addresses_need_no_method() {
        let mut config = DeviceConfig::new("d");
        config
            .add_mq_config(
                "multi.json",
                r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "pull", "address": "@tcp://*:5555,+tcp://host:5556"}]}]}}"#,
            )
            .unwrap();
        let channel = &config.sockets[0].config;
        assert!(channel.binds() && channel.connects());
        assert_eq!(channel.endpoints().unwrap().len(), 2);
    }

    #[test]
    fn num_sockets_expands_sub_channels() {
        let mut config = DeviceConfig::new("d");
        let channel = ChannelConfig {
            num_sockets: 3,
            ..ChannelConfig::new("out", SocketType::Push, Method::Bind)
        };
        config.add_channel(channel.clone()).unwrap();
        let names: Vec<&str> = config
            .sockets
            .iter()
            .map(|socket| socket.name.as_str())
            .collect();
        assert_eq!(names, ["out[0]", "out[1]", "out[2]"]);
        assert!(
            config.add_channel(channel).is_err(),
            "a channel name is unique"
        );
    }
}
