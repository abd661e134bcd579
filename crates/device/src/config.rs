//! A device's configuration: its id, session, default transport, channels and properties, and
//! the FairMQ JSON format (`--mq-config`) that users already have.

use std::collections::BTreeMap;

use ferromq_core::{ChannelConfig, KeyValue, MAX_NUM_SOCKETS};
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
    /// [`DeviceError::Channel`] when the configuration is invalid, the name is taken, or the
    /// sub-channels would each bind one address only one can hold
    /// ([`ChannelConfig::check_sub_channels_bind_apart`]).
    pub fn add_channel(&mut self, config: ChannelConfig) -> Result<()> {
        config.validate().map_err(ferromq_core::Error::from)?;
        config
            .check_sub_channels_bind_apart()
            .map_err(ferromq_core::Error::from)?;
        self.refuse_if_configured(&config.name)?;
        for name in config.socket_names() {
            self.sockets.push(SocketConfig {
                name,
                config: config.clone(),
            });
        }
        Ok(())
    }

    /// Adds a channel whose sockets each have their own configuration (their own address):
    /// what [`ChannelConfig::parse_key_values_sockets`] gives for FairMQ's repeated `address=`.
    /// One configuration is [`DeviceConfig::add_channel`]; several are the sockets
    /// `name[0]`, `name[1]`, ... of one channel, as a JSON channel's `sockets` are.
    ///
    /// # Errors
    /// As [`DeviceConfig::add_channel`].
    pub fn add_channel_sockets(&mut self, sockets: Vec<ChannelConfig>) -> Result<()> {
        let Some(first) = sockets.first() else {
            return Ok(());
        };
        if sockets.len() == 1 {
            return self.add_channel(first.clone());
        }
        let name = first.name.clone();
        self.refuse_if_configured(&name)?;
        // Every socket checked before any is added: a refusal adds nothing.
        for config in &sockets {
            config.validate().map_err(ferromq_core::Error::from)?;
        }
        self.sockets
            .extend(
                sockets
                    .into_iter()
                    .enumerate()
                    .map(|(socket_idx, config)| SocketConfig {
                        name: format!("{name}[{socket_idx}]"),
                        config,
                    }),
            );
        Ok(())
    }

    /// [`DeviceError::DuplicateChannel`] when a channel `name` is configured already.
    fn refuse_if_configured(&self, name: &str) -> Result<()> {
        if self.sockets.iter().any(|socket| socket.config.name == name) {
            return Err(DeviceError::DuplicateChannel {
                device: self.id.clone(),
                name: name.to_owned(),
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
        // Boost's JSON parser, FairMQ's, skips a UTF-8 byte order mark (as editors on Windows
        // write one), so a file FairMQ reads is read here too.
        let json = json.strip_prefix('\u{feff}').unwrap_or(json);
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
        let mut matching = file.fair_mq_options.devices.into_iter().filter(|device| {
            device.id.as_deref() == Some(key) || device.key.as_deref() == Some(key)
        });
        let Some(device) = matching.next() else {
            return Err(mq_error(format!("no device with id (or key) {key:?}")));
        };
        // Which of two entries was meant is the user's to say: the first used to win silently.
        let n_more = matching.count();
        if n_more > 0 {
            return Err(mq_error(format!(
                "{} devices have the id (or key) {key:?}; expected one",
                n_more + 1
            )));
        }
        let mut names: Vec<&str> = Vec::new();
        for name in device
            .channels
            .iter()
            .filter_map(|channel| channel.name.as_deref())
        {
            if names.contains(&name) {
                // Both were bound as one name, and `data` reached the first only.
                return Err(mq_error(format!(
                    "device {key:?} has two channels named {name:?}"
                )));
            }
            names.push(name);
        }
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
            let listed = channel
                .sockets
                .as_ref()
                .is_some_and(|sockets| !sockets.is_empty());
            let configs = channel.expand().map_err(mq_error)?;
            // `numSockets` copies of one configuration bind as `--channel-config`'s do (a tcp
            // port with autoBind gives the later ones ports of the range, as FairMQ's); the
            // sockets a channel lists each bind their own address.
            if !listed && configs.len() > 1 {
                configs[0].check_sub_channels_bind_apart()
            } else {
                ChannelConfig::check_binds_once(&configs)
            }
            .map_err(|error| mq_error(error.to_string()))?;
            let n_entries = configs.len();
            for (socket_idx, config) in configs.into_iter().enumerate() {
                config.validate().map_err(|error| {
                    let chain = crate::error_chain(&error);
                    let channel = format!("channel {:?}", config.name);
                    // "socket N" only where the channel has several to tell apart, and the
                    // channel named once.
                    mq_error(if n_entries > 1 {
                        format!("{channel} socket {socket_idx}: {chain}")
                    } else if chain.starts_with(&channel) {
                        chain
                    } else {
                        format!("{channel}: {chain}")
                    })
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

/// One channel entry (or one entry of its `sockets`): its name, its sub-entries, and every
/// channel key it sets, each already checked against the key table (ferromq-core's
/// `CHANNEL_KEYS`) while the file is read, so that an error names the key, the value and the
/// line and column. Keys the table does not have are skipped (and warned about, see
/// [`unknown_keys`]), as FairMQ's parser does.
#[derive(Default, Clone)]
struct MqSocket {
    name: Option<String>,
    /// Only at channel level: one entry per sub-channel.
    sockets: Option<Vec<MqSocket>>,
    keys: Vec<(&'static str, serde_json::Value)>,
}

/// A channel entry has the socket keys plus `sockets`.
type MqChannel = MqSocket;

impl<'de> Deserialize<'de> for MqSocket {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Entry;
        impl<'de> de::Visitor<'de> for Entry {
            type Value = MqSocket;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a channel entry (an object of channel keys)")
            }

            fn visit_map<A: de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<MqSocket, A::Error> {
                let mut entry = MqSocket::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => entry.name = Some(map.next_value()?),
                        "sockets" => entry.sockets = Some(map.next_value()?),
                        _ => match ferromq_core::channel_key(&key) {
                            Some(spec) => {
                                let value: serde_json::Value = map.next_value()?;
                                // Checked now, so that the error has the position.
                                set_json(&mut ChannelConfig::default(), spec.name, &value)
                                    .map_err(de::Error::custom)?;
                                entry.keys.push((spec.name, value));
                            }
                            None => {
                                map.next_value::<de::IgnoredAny>()?;
                            }
                        },
                    }
                }
                Ok(entry)
            }
        }
        deserializer.deserialize_map(Entry)
    }
}

/// Sets `key` from a JSON value: FairMQ's files write numbers and booleans both as themselves
/// and as text.
fn set_json(
    config: &mut ChannelConfig,
    key: &str,
    value: &serde_json::Value,
) -> std::result::Result<(), ferromq_core::ConfigError> {
    let text;
    let value = match value {
        serde_json::Value::String(text) => KeyValue::Text(text),
        serde_json::Value::Bool(flag) => KeyValue::Bool(*flag),
        serde_json::Value::Number(number) => match number.as_i64() {
            Some(number) => KeyValue::Integer(number),
            // Too big for any key, or not an integer: refused by the key, naming the value.
            None => {
                text = number.to_string();
                KeyValue::Text(&text)
            }
        },
        other => {
            return Err(ferromq_core::ConfigError::InvalidValue {
                key: key.to_owned(),
                value: other.to_string(),
                expected: "a number, text or boolean",
            });
        }
    };
    config.set(key, value)
}

impl MqSocket {
    fn key(&self, key: &str) -> Option<&serde_json::Value> {
        self.keys
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, value)| value)
    }

    /// One channel configuration per socket.
    fn expand(mut self) -> std::result::Result<Vec<ChannelConfig>, String> {
        let name = self.name.clone().ok_or("a channel has no \"name\"")?;
        let sockets = match self.sockets.take() {
            Some(sockets) if !sockets.is_empty() => sockets,
            _ => {
                // Checked by the key table when read: at most MAX_NUM_SOCKETS.
                let mut probe = ChannelConfig::default();
                if let Some(value) = self.key("numSockets") {
                    set_json(&mut probe, "numSockets", value)
                        .map_err(|error| format!("channel {name:?}: {error}"))?;
                }
                vec![MqSocket::default(); probe.num_sockets.clamp(1, MAX_NUM_SOCKETS)]
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
            .map(|socket| merge(&name, &self, &socket, n_sockets))
            .collect()
    }
}

/// The channel's keys, then the socket's (which override them), through the key table.
fn merge(
    name: &str,
    common: &MqSocket,
    socket: &MqSocket,
    n_sockets: usize,
) -> std::result::Result<ChannelConfig, String> {
    let mut config = ChannelConfig {
        name: name.to_owned(),
        ..ChannelConfig::default()
    };
    let (mut has_type, mut has_method) = (false, false);
    for (key, value) in common.keys.iter().chain(&socket.keys) {
        // FairMQ's "default" transport is the device's.
        if *key == "transport" && value.as_str() == Some("default") {
            config.transport = None;
            continue;
        }
        set_json(&mut config, key, value).map_err(|error| format!("channel {name:?}: {error}"))?;
        has_type |= *key == "type";
        has_method |= *key == "method";
    }
    if !has_type {
        return Err(format!("channel {name:?} has no \"type\""));
    }
    // FairMQ's multi-endpoint addresses (`@tcp://*:5555,+tcp://host:5556`) need no method.
    if !has_method {
        config.method = config
            .prefixed_method()
            .ok_or_else(|| format!("channel {name:?} has no \"method\""))?;
    }
    config.num_sockets = n_sockets;
    Ok(config)
}

/// Collects `where: key` for every key of a FairMQ JSON configuration this parser ignores.
fn unknown_keys(file: &serde_json::Value, unknown: &mut Vec<String>) {
    let serde_json::Value::Object(top) = file else {
        return;
    };
    let is_channel_key = |key: &str| ferromq_core::channel_key(key).is_some();
    let mut check = |object: &serde_json::Map<String, serde_json::Value>,
                     known: &dyn Fn(&str) -> bool,
                     place: &str| {
        for key in object.keys().filter(|key| !known(key)) {
            unknown.push(format!("{place}{key:?}"));
        }
    };
    check(top, &|key| key == "fairMQOptions", "");
    let Some(serde_json::Value::Object(options)) = top.get("fairMQOptions") else {
        return;
    };
    check(options, &|key| key == "devices", "fairMQOptions.");
    let Some(serde_json::Value::Array(devices)) = options.get("devices") else {
        return;
    };
    for device in devices.iter().filter_map(serde_json::Value::as_object) {
        check(
            device,
            &|key| matches!(key, "id" | "key" | "channels"),
            "device.",
        );
        let Some(serde_json::Value::Array(channels)) = device.get("channels") else {
            continue;
        };
        for channel in channels.iter().filter_map(serde_json::Value::as_object) {
            check(
                channel,
                &|key| key == "sockets" || is_channel_key(key),
                "channel.",
            );
            let Some(serde_json::Value::Array(sockets)) = channel.get("sockets") else {
                continue;
            };
            for socket in sockets.iter().filter_map(serde_json::Value::as_object) {
                // A socket entry has every channel key but `sockets`.
                check(socket, &is_channel_key, "socket.");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferromq_core::{Method, SocketType};

    /// The example of FairMQ's configuration documentation, in its own spelling (shared with
    /// the fuzz target's seeds).
    const FAIRMQ_EXAMPLE: &str = include_str!("../tests/data/fairmq-example.json");

    /// Two entries of one id: the first was taken silently. Two channels of one name: both
    /// were bound as that name, and the device's `data` reached the first only.
    #[test]
    fn an_id_or_a_channel_name_given_twice_is_refused() {
        let twice = r#"{"fairMQOptions": {"devices": [
            {"id": "d", "channels": [{"name": "a", "type": "push", "method": "bind", "address": "ipc:///tmp/a"}]},
            {"key": "d", "channels": [{"name": "b", "type": "push", "method": "bind", "address": "ipc:///tmp/b"}]}
        ]}}"#;
        let error = DeviceConfig::new("d")
            .add_mq_config("twice.json", twice)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("twice.json") && error.contains("2 devices have the id (or key) \"d\""),
            "{error}"
        );
        let two_data = r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [
            {"name": "data", "type": "push", "method": "bind", "address": "ipc:///tmp/a"},
            {"name": "data", "type": "push", "method": "bind", "address": "ipc:///tmp/b"}
        ]}]}}"#;
        let mut config = DeviceConfig::new("d");
        let error = config
            .add_mq_config("two-data.json", two_data)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("device \"d\" has two channels named \"data\""),
            "{error}"
        );
        assert!(
            config.sockets.is_empty(),
            "nothing added: {:?}",
            config.sockets.len()
        );
    }

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
                "key \"sndBufSize\" has invalid value \"-1\": expected a whole number, at least 1 message",
                "line 1 column",
            ],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "autoBind": 2}]}]}}"#,
            &["key \"autoBind\" has invalid value \"2\": expected true or false"],
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
                "key \"numSockets\" has invalid value \"4294967296\": expected a number of sockets from 0 to 1024",
                "line 1 column",
            ],
        );
        check_error(
            &json("18446744073709551615"),
            &["key \"numSockets\" has invalid value \"18446744073709551615\""],
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
    fn an_empty_endpoint_is_named_by_position_and_the_channel_once() {
        let mut config = DeviceConfig::new("d");
        let error = config
            .add_mq_config(
                "gap.json",
                r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "pull", "address": "@tcp://*:5555,,+tcp://host:5556"}]}]}}"#,
            )
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "gap.json: channel \"x\": address \"@tcp://*:5555,,+tcp://host:5556\" \
             has an empty endpoint (endpoint 2 of 3)"
        );
        // With several sockets, which one is said.
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "pull", "method": "bind", "sockets": [{"address": "tcp://*:1"}, {"address": "tcp://*:2,,tcp://*:3"}]}]}]}}"#,
            &["channel \"x\" socket 1: ", "(endpoint 2 of 3)"],
        );
    }

    #[test]
    fn two_sockets_binding_one_address_are_refused() {
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "pull", "method": "bind", "sockets": [{"address": "tcp://*:1"}, {"address": "tcp://*:1"}]}]}]}}"#,
            &["bad.json: channel \"x\": sockets 0 and 1 both bind tcp://*:1"],
        );
    }

    /// `numSockets` copies of one bound address: refused where one socket holds it (an ipc
    /// path), taken where each gets a port of its own (a tcp port with autoBind, FairMQ's
    /// default, or port 0), as on the command line.
    #[test]
    fn numsockets_copies_of_one_bound_address_bind_as_on_the_command_line() {
        let json = |address: &str| {
            format!(
                r#"{{"fairMQOptions": {{"devices": [{{"id": "d", "channels": [{{"name": "x", "type": "pull", "method": "bind", "numSockets": 2, "address": "{address}"}}]}}]}}}}"#
            )
        };
        check_error(
            &json("ipc:///tmp/one"),
            &["bad.json: channel \"x\": its 2 sockets (numSockets) would each bind ipc:///tmp/one"],
        );
        for address in ["tcp://*:5555", "tcp://*:0"] {
            let mut config = DeviceConfig::new("d");
            config.add_mq_config("ok.json", &json(address)).unwrap();
            assert_eq!(config.sockets.len(), 2, "{address}");
        }
    }

    #[test]
    fn a_utf8_byte_order_mark_is_skipped_as_fairmq_does() {
        let mut config = DeviceConfig::new("d");
        config
            .add_mq_config(
                "bom.json",
                "\u{feff}{\"fairMQOptions\": {\"devices\": [{\"id\": \"d\", \"channels\": [{\"name\": \"x\", \"type\": \"pull\", \"method\": \"bind\"}]}]}}",
            )
            .unwrap();
        assert_eq!(config.sockets[0].name, "x");
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
