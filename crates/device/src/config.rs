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
    /// [`DeviceError::MqConfig`] naming the key and the line and column of the problem, or when
    /// the file has no device `id`.
    pub fn add_mq_config(&mut self, path: &str, json: &str) -> Result<()> {
        let mq_error = |problem: String| DeviceError::MqConfig {
            path: path.to_owned(),
            problem,
        };
        let file: MqConfigFile =
            serde_json::from_str(json).map_err(|error| mq_error(error.to_string()))?;
        let Some(device) = file.fair_mq_options.devices.into_iter().find(|device| {
            device.id.as_deref() == Some(&self.id) || device.key.as_deref() == Some(&self.id)
        }) else {
            return Err(mq_error(format!(
                "no device with id (or key) {:?}",
                self.id
            )));
        };
        for channel in device.channels {
            for (socket_idx, config) in channel.expand().map_err(mq_error)?.into_iter().enumerate()
            {
                config.validate().map_err(|error| {
                    mq_error(format!(
                        "channel {:?} socket {socket_idx}: {error}",
                        config.name
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
#[serde(deny_unknown_fields)]
struct MqConfigFile {
    #[serde(rename = "fairMQOptions")]
    fair_mq_options: MqOptions,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MqOptions {
    devices: Vec<MqDevice>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MqDevice {
    id: Option<String>,
    key: Option<String>,
    #[serde(default)]
    channels: Vec<MqChannel>,
}

/// Channel-level keys are shared by its sockets; socket-level keys override them.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct MqSocket {
    name: Option<String>,
    #[serde(rename = "type")]
    socket_type: Option<String>,
    method: Option<String>,
    address: Option<String>,
    transport: Option<String>,
    #[serde(rename = "sndBufSize", default, deserialize_with = "number_or_text")]
    snd_buf_size: Option<u64>,
    #[serde(rename = "rcvBufSize", default, deserialize_with = "number_or_text")]
    rcv_buf_size: Option<u64>,
    #[serde(rename = "sndKernelSize", default, deserialize_with = "number_or_text")]
    snd_kernel_size: Option<u64>,
    #[serde(rename = "rcvKernelSize", default, deserialize_with = "number_or_text")]
    rcv_kernel_size: Option<u64>,
    #[serde(default, deserialize_with = "number_or_text")]
    linger: Option<u64>,
    #[serde(rename = "rateLogging", default, deserialize_with = "number_or_text")]
    rate_logging: Option<u64>,
    #[serde(rename = "portRangeMin", default, deserialize_with = "number_or_text")]
    port_range_min: Option<u64>,
    #[serde(rename = "portRangeMax", default, deserialize_with = "number_or_text")]
    port_range_max: Option<u64>,
    #[serde(rename = "autoBind", default, deserialize_with = "bool_or_text")]
    auto_bind: Option<bool>,
    #[serde(rename = "numSockets", default, deserialize_with = "number_or_text")]
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
    let method = pick_text(socket.method, &common.method)
        .ok_or_else(|| format!("channel {name:?} has no \"method\""))?;
    config.method = method
        .parse()
        .map_err(|error| format!("channel {name:?}: {error}"))?;
    config.address = pick_text(socket.address, &common.address);
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

/// FairMQ's files write numbers both as `1000` and as `"1000"`.
fn number_or_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumberOrText {
        Number(u64),
        Text(String),
    }
    match Option::<NumberOrText>::deserialize(deserializer)? {
        None => Ok(None),
        Some(NumberOrText::Number(number)) => Ok(Some(number)),
        Some(NumberOrText::Text(text)) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| de::Error::custom(format!("{text:?} is not a non-negative integer"))),
    }
}

fn bool_or_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<bool>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum BoolOrText {
        Bool(bool),
        Text(String),
    }
    match Option::<BoolOrText>::deserialize(deserializer)? {
        None => Ok(None),
        Some(BoolOrText::Bool(value)) => Ok(Some(value)),
        Some(BoolOrText::Text(text)) => match text.trim() {
            "true" | "1" => Ok(Some(true)),
            "false" | "0" => Ok(Some(false)),
            _ => Err(de::Error::custom(format!("{text:?} is not true or false"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferromq_core::{Method, SocketType};

    /// The example of FairMQ's configuration documentation, in its own spelling.
    const FAIRMQ_EXAMPLE: &str = r#"{
    "fairMQOptions": {
        "devices": [
            {
                "id": "sampler1",
                "channels": [
                    {
                        "name": "data",
                        "sockets": [
                            {
                                "type": "push",
                                "method": "bind",
                                "address": "tcp://*:5555",
                                "sndBufSize": 1000,
                                "rcvBufSize": 1000,
                                "sndKernelSize" : 0,
                                "rcvKernelSize" : 0,
                                "transport": "zeromq",
                                "linger": "500",
                                "portRangeMin": "22000",
                                "portRangeMax": "23000",
                                "autoBind": false,
                                "numSockets": 0,
                                "rateLogging": 1
                            }
                        ]
                    }
                ]
            },
            {
                "key": "sink",
                "channels": [
                    {
                        "name": "data",
                        "type": "pull",
                        "method": "connect",
                        "sockets": [
                            { "address": "tcp://localhost:5555" },
                            { "address": "tcp://localhost:5556", "rcvBufSize": "10" }
                        ]
                    }
                ]
            }
        ]
    }
}"#;

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

        let mut sink = DeviceConfig::new("sink");
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
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "sndBufSise": 1}]}]}}"#,
            &["bad.json", "sndBufSise", "line 1 column"],
        );
        check_error(
            "{\n  \"fairMQOptions\": {\n    \"devices\": [\n  }",
            &["line 4 column"],
        );
        check_error(
            r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "linger": "soon"}]}]}}"#,
            &["\"soon\" is not a non-negative integer"],
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
