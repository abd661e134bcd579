//! Channel configuration with FairMQ's key names and defaults.
//!
//! The serde names are FairMQ's (`sndBufSize`, `rateLogging`, ...) so that a user's existing
//! `--channel-config` strings and `--mq-config` JSON files keep working; the Rust field names are
//! snake_case. All defaults live in one place, [`ChannelConfig::default`], and equal FairMQ's.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::address::{Address, AddressError};
use crate::keys::{CHANNEL_KEYS, KeyValue};

/// The messaging pattern of one end of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketType {
    /// Sends to one of its peers, round robin; never drops.
    Push,
    /// Receives from all its peers, fair-queued.
    Pull,
    /// Sends to every matching subscriber; drops for slow subscribers.
    Pub,
    /// Receives what matches its topic filters.
    Sub,
    /// Sends a request, then receives its reply.
    Req,
    /// Receives a request, then sends its reply.
    Rep,
    /// Exclusive two-way link to one peer.
    Pair,
}

impl SocketType {
    /// Every socket type, for tables and tests.
    pub const ALL: [SocketType; 7] = [
        SocketType::Push,
        SocketType::Pull,
        SocketType::Pub,
        SocketType::Sub,
        SocketType::Req,
        SocketType::Rep,
        SocketType::Pair,
    ];

    /// The lowercase name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            SocketType::Push => "push",
            SocketType::Pull => "pull",
            SocketType::Pub => "pub",
            SocketType::Sub => "sub",
            SocketType::Req => "req",
            SocketType::Rep => "rep",
            SocketType::Pair => "pair",
        }
    }

    /// The socket type the other end of a channel must have.
    pub fn peer(self) -> SocketType {
        match self {
            SocketType::Push => SocketType::Pull,
            SocketType::Pull => SocketType::Push,
            SocketType::Pub => SocketType::Sub,
            SocketType::Sub => SocketType::Pub,
            SocketType::Req => SocketType::Rep,
            SocketType::Rep => SocketType::Req,
            SocketType::Pair => SocketType::Pair,
        }
    }

    /// True when `self` and `other` can be the two ends of one channel.
    pub fn is_compatible_with(self, other: SocketType) -> bool {
        self.peer() == other
    }

    /// True for the types that send (push, pub, req, rep, pair).
    pub fn can_send(self) -> bool {
        !matches!(self, SocketType::Pull | SocketType::Sub)
    }

    /// True for the types that receive (pull, sub, req, rep, pair).
    pub fn can_receive(self) -> bool {
        !matches!(self, SocketType::Push | SocketType::Pub)
    }

    /// True for the types whose close reports, as `Error::Undelivered`, the messages that
    /// reached them and that they did not take (pull, pair): a sub's are not counted (ZeroMQ's
    /// PUB semantics), nor are req's or rep's (a reply is the acknowledgement).
    pub fn counts_unread_at_close(self) -> bool {
        matches!(self, SocketType::Pull | SocketType::Pair)
    }
}

impl fmt::Display for SocketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SocketType {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        SocketType::ALL
            .into_iter()
            .find(|socket_type| socket_type.as_str() == text)
            .ok_or_else(|| ConfigError::InvalidValue {
                key: "type".to_owned(),
                value: text.to_owned(),
                expected: "push, pull, pub, sub, req, rep or pair",
            })
    }
}

/// Whether a channel binds its address or connects to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Listen on the address; peers connect to it.
    Bind,
    /// Connect to a peer that binds the address.
    Connect,
}

impl Method {
    /// The lowercase name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Bind => "bind",
            Method::Connect => "connect",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Method {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "bind" => Ok(Method::Bind),
            "connect" => Ok(Method::Connect),
            other => Err(ConfigError::InvalidValue {
                key: "method".to_owned(),
                value: other.to_owned(),
                expected: "bind or connect",
            }),
        }
    }
}

/// A configuration that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key the channel configuration does not have.
    #[error("unknown channel key {key:?}; known keys: {known}")]
    UnknownKey {
        /// The key found.
        key: String,
        /// The keys that exist.
        known: String,
    },
    /// A value of the wrong form.
    #[error("channel key {key:?} has invalid value {value:?}: expected {expected}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value found.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A device property a transport reads (`shm-segment-size`, ...), of the wrong form.
    #[error("property {key:?} has invalid value {value:?}: expected {expected}")]
    InvalidProperty {
        /// The property.
        key: String,
        /// The value found.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// `key` without `=value`.
    #[error("channel option {0:?} is not of the form key=value")]
    NotKeyValue(String),
    /// A key given twice in one `--channel-config` (only `address` repeats: one socket each).
    #[error("channel key {key:?} is given twice ({first:?}, then {second:?})")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Its first value.
        first: String,
        /// Its second value.
        second: String,
    },
    /// As many addresses as sockets, or `numSockets` left out.
    #[error("channel {channel:?} has {n_addresses} addresses and numSockets {num_sockets}")]
    SocketCount {
        /// The channel.
        channel: String,
        /// How many `address=` keys it has.
        n_addresses: usize,
        /// Its `numSockets`.
        num_sockets: usize,
    },
    /// A key every channel needs.
    #[error("channel {channel:?} has no {key:?}")]
    MissingKey {
        /// The channel (empty when it has no name either).
        channel: String,
        /// The missing key.
        key: &'static str,
    },
    /// The address did not parse.
    #[error("channel {channel:?}: bad address")]
    Address {
        /// The channel.
        channel: String,
        /// Why.
        #[source]
        source: AddressError,
    },
    /// Two sockets of one channel bind the same address (`address=` given twice).
    #[error("channel {channel:?}: sockets {first} and {second} both bind {address}")]
    BoundTwice {
        /// The channel.
        channel: String,
        /// The address.
        address: String,
        /// The first socket that binds it.
        first: usize,
        /// The second.
        second: usize,
    },
    /// A channel of `numSockets` sub-channels with one address that each would bind
    /// ([`ChannelConfig::check_sub_channels_bind_apart`]).
    #[error(
        "channel {channel:?}: its {num_sockets} sockets (numSockets) would each bind {address}, \
         which one socket can hold: give each socket its own address (address= once per \
         socket, or a JSON channel's sockets), connect instead, or for tcp bind port 0 or turn \
         autoBind on"
    )]
    SharedBind {
        /// The channel.
        channel: String,
        /// The address.
        address: String,
        /// Its `numSockets`.
        num_sockets: usize,
    },
    /// One endpoint of a several-endpoint address (`@tcp://*:5555,+tcp://host:5556`) is
    /// empty, as in `tcp://a:1,,tcp://b:2`.
    #[error(
        "channel {channel:?}: address {address:?} has an empty endpoint (endpoint {position} of {count})"
    )]
    EmptyEndpoint {
        /// The channel.
        channel: String,
        /// The whole address.
        address: String,
        /// Which endpoint is empty, counted from 1.
        position: usize,
        /// How many endpoints the address has.
        count: usize,
    },
}

/// The most sockets one channel may have (`numSockets`): each is a real socket with its own
/// file descriptors, and a forged count must not make a device allocate without bound.
pub const MAX_NUM_SOCKETS: usize = 1024;

/// A `--channel-config` list read: the configuration (with the last address), every address
/// given, and whether `method` and `numSockets` were given rather than left to their defaults.
struct Parsed {
    config: ChannelConfig,
    addresses: Vec<String>,
    method_given: bool,
    num_sockets_given: bool,
}

/// The longest duration, in seconds, that an option or property takes: about 31 years. A longer
/// one is no `Duration` (converting it panics) and no timer could wait for it; the CLI, the
/// built-in devices and the examples refuse it by name.
pub const MAX_SECONDS: f64 = 1e9;

/// One endpoint of a channel: where it binds or connects.
///
/// A channel has several when its address is FairMQ's multi-endpoint form,
/// `@tcp://*:5555,+tcp://host:5556`: comma-separated, `@` binds, `+` (or `>`) connects, and an
/// endpoint without a prefix follows the channel's `method`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Bind or connect.
    pub method: Method,
    /// Where.
    pub address: Address,
}

/// The configuration of one channel (or of every sub-channel when `numSockets` > 1).
///
/// # Examples
/// ```
/// use ferromq_core::{ChannelConfig, Method, SocketType};
/// let config = ChannelConfig::parse_key_values(
///     "name=data,type=push,method=bind,address=tcp://*:0,rateLogging=0",
/// )
/// .unwrap();
/// assert_eq!(config.socket_type, SocketType::Push);
/// assert_eq!(config.method, Method::Bind);
/// assert_eq!(config.snd_buf_size, 1000); // FairMQ's default
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChannelConfig {
    /// Channel name, unique within a device.
    pub name: String,
    /// Messaging pattern.
    #[serde(rename = "type")]
    pub socket_type: SocketType,
    /// Bind or connect.
    pub method: Method,
    /// Address as written; parsed by [`ChannelConfig::parsed_address`]. `None` lets a launcher
    /// or `autoBind` choose.
    pub address: Option<String>,
    /// Transport name (`zeromq`, `shmem`, ...); `None` takes the device's default.
    pub transport: Option<String>,
    /// Send queue bound in messages (high-water mark): a full queue makes `send` wait.
    #[serde(rename = "sndBufSize")]
    pub snd_buf_size: usize,
    /// Receive queue bound in messages.
    #[serde(rename = "rcvBufSize")]
    pub rcv_buf_size: usize,
    /// Kernel send buffer in bytes, 0 = the OS default.
    #[serde(rename = "sndKernelSize")]
    pub snd_kernel_size: usize,
    /// Kernel receive buffer in bytes, 0 = the OS default.
    #[serde(rename = "rcvKernelSize")]
    pub rcv_kernel_size: usize,
    /// How long closing waits without progress for accepted messages to leave, in milliseconds
    /// (a bound on silence, not on the whole drain); also how long a forwarder's send of a
    /// message it took may still wait after STOP (`DeviceContext::forward_parts`).
    pub linger: u64,
    /// Seconds between rate log lines, 0 = off.
    #[serde(rename = "rateLogging")]
    pub rate_logging: u64,
    /// Lowest port `autoBind` tries.
    #[serde(rename = "portRangeMin")]
    pub port_range_min: u16,
    /// Highest port `autoBind` tries.
    #[serde(rename = "portRangeMax")]
    pub port_range_max: u16,
    /// Whether a binding channel may pick another address when its own is taken.
    #[serde(rename = "autoBind")]
    pub auto_bind: bool,
    /// Number of sub-channels (`data[0]`, `data[1]`, ...); 0 or 1 = a single channel.
    #[serde(rename = "numSockets")]
    pub num_sockets: usize,
    /// Receives spin instead of sleeping until data arrives: lower latency for a whole core.
    #[serde(rename = "busyPoll")]
    pub busy_poll: bool,
    /// Without `busyPoll`: how long (µs) a receive whose last wait was short spins before it
    /// sleeps (see `spin.rs`); 0 never spins.
    #[serde(rename = "spinUs")]
    pub spin_us: u32,
    /// The libfabric provider of an ofi channel (`tcp;ofi_rxm`, `verbs;ofi_rxm`, ...); `None`
    /// follows the address: tcp:// takes `tcp;ofi_rxm`, verbs:// `verbs;ofi_rxm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

impl Default for ChannelConfig {
    /// FairMQ's channel defaults.
    fn default() -> Self {
        ChannelConfig {
            name: String::new(),
            socket_type: SocketType::Push,
            method: Method::Bind,
            address: None,
            transport: None,
            snd_buf_size: 1000,
            rcv_buf_size: 1000,
            snd_kernel_size: 0,
            rcv_kernel_size: 0,
            linger: 500,
            rate_logging: 1,
            port_range_min: 22000,
            port_range_max: 23000,
            auto_bind: true,
            num_sockets: 0,
            busy_poll: false,
            spin_us: crate::spin::DEFAULT_SPIN_US,
            provider: None,
        }
    }
}

impl ChannelConfig {
    /// A channel with the given name, type and method and FairMQ defaults otherwise.
    pub fn new(name: impl Into<String>, socket_type: SocketType, method: Method) -> Self {
        ChannelConfig {
            name: name.into(),
            socket_type,
            method,
            ..ChannelConfig::default()
        }
    }

    /// Sets the address (builder style).
    pub fn with_address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// Sets the transport (builder style).
    pub fn with_transport(mut self, transport: impl Into<String>) -> Self {
        self.transport = Some(transport.into());
        self
    }

    /// Parses FairMQ's `--channel-config` form:
    /// `name=data,type=push,method=bind,address=tcp://*:5555,rateLogging=1`.
    ///
    /// `name`, `type` and `method` are required (`method` may be left out when every endpoint of
    /// the address says `@` or `+`); everything else takes FairMQ's default. FairMQ's
    /// multi-endpoint addresses keep their commas: `address=@tcp://*:5555,+tcp://host:5556`.
    /// FairMQ's `sndTimeoutMs` and `rcvTimeoutMs` are checked and ignored: sends and receives
    /// here wait until done or cancelled.
    ///
    /// A key given twice is an error ([`ConfigError::DuplicateKey`]), `address` included:
    /// several addresses are several sockets ([`ChannelConfig::parse_key_values_sockets`]).
    ///
    /// # Errors
    /// [`ConfigError`] naming the key and the value that is wrong.
    pub fn parse_key_values(text: &str) -> Result<ChannelConfig, ConfigError> {
        let Parsed {
            config, addresses, ..
        } = ChannelConfig::parse_pairs(text)?;
        if let [first, second, ..] = addresses.as_slice() {
            return Err(ConfigError::DuplicateKey {
                key: "address".to_owned(),
                first: first.clone(),
                second: second.clone(),
            });
        }
        Ok(config)
    }

    /// [`ChannelConfig::parse_key_values`] as FairMQ reads `--channel-config`: each `address=`
    /// is a socket of the channel, so `name=data,...,address=tcp://a:1,address=tcp://b:2` is
    /// the channel `data` of two sockets, `data[0]` and `data[1]` (as a JSON channel with two
    /// `sockets`). With one address or none, the one configuration.
    ///
    /// # Errors
    /// As [`ChannelConfig::parse_key_values`]; [`ConfigError::SocketCount`] where `numSockets`
    /// is given and is not the number of addresses.
    pub fn parse_key_values_sockets(text: &str) -> Result<Vec<ChannelConfig>, ConfigError> {
        let Parsed {
            config,
            addresses,
            method_given,
            num_sockets_given,
        } = ChannelConfig::parse_pairs(text)?;
        if addresses.len() <= 1 {
            return Ok(vec![config]);
        }
        if num_sockets_given && config.num_sockets != addresses.len() {
            return Err(ConfigError::SocketCount {
                channel: config.name,
                n_addresses: addresses.len(),
                num_sockets: config.num_sockets,
            });
        }
        let n_sockets = addresses.len();
        let sockets: Vec<ChannelConfig> = addresses
            .into_iter()
            .map(|address| {
                let mut socket = config.clone();
                socket.set("address", KeyValue::Text(&address))?;
                // Without `method`, each socket's own address says it (`@` bind, `+` connect),
                // as each socket of a JSON channel does.
                if !method_given {
                    socket.method = socket.prefixed_method().ok_or(ConfigError::MissingKey {
                        channel: config.name.clone(),
                        key: "method",
                    })?;
                }
                socket.num_sockets = n_sockets;
                socket.validate()?;
                Ok(socket)
            })
            .collect::<Result<_, ConfigError>>()?;
        ChannelConfig::check_binds_once(&sockets)?;
        Ok(sockets)
    }

    /// Refuses a channel of `numSockets` > 1 sub-channels, all with this configuration, that
    /// would each bind one address only one socket can hold (an ipc path, an inproc name, a
    /// tcp port): the first bound it and the second failed at bind, "address in use", after the
    /// device had started. A tcp port 0 (a free port each) and connecting are fine; so is a tcp
    /// port with `autoBind` (an address of one endpoint), whose later sockets take ports of the
    /// range, as FairMQ's do; a verbs side channel on port 0 too.
    ///
    /// # Errors
    /// [`ConfigError::SharedBind`] naming the channel, the address and `numSockets`.
    pub fn check_sub_channels_bind_apart(&self) -> Result<(), ConfigError> {
        if self.num_sockets <= 1 {
            return Ok(());
        }
        let endpoints = self.endpoints()?;
        // The runner's autoBind takes a single tcp endpoint to a port of the range (which
        // `validate` checks is one).
        let auto_binds = self.auto_bind && endpoints.len() == 1;
        for endpoint in endpoints {
            let apart = endpoint.address.wants_free_port()
                || (auto_binds && matches!(endpoint.address, Address::Tcp { .. }));
            if endpoint.method == Method::Bind && !apart {
                return Err(ConfigError::SharedBind {
                    channel: self.name.clone(),
                    address: endpoint.address.to_string(),
                    num_sockets: self.num_sockets,
                });
            }
        }
        Ok(())
    }

    /// Whether this configuration binds a tcp (or verbs) port 0 and nothing else: each socket
    /// gets a free port of its own, so several may share the address.
    fn binds_any_port(&self) -> bool {
        self.endpoints().is_ok_and(|endpoints| {
            !endpoints.is_empty()
                && endpoints
                    .iter()
                    .all(|endpoint| endpoint.address.wants_free_port())
        })
    }

    /// Refuses two of a channel's `sockets` that bind the same address: the second failed
    /// with "address in use" once the first had bound, after a refused-peer warning.
    ///
    /// # Errors
    /// [`ConfigError::BoundTwice`] naming the channel, the address and both sockets.
    pub fn check_binds_once(sockets: &[ChannelConfig]) -> Result<(), ConfigError> {
        for (idx, socket) in sockets.iter().enumerate() {
            if socket.method != Method::Bind || socket.address.is_none() || socket.binds_any_port()
            {
                continue;
            }
            if let Some(first) = sockets[..idx].iter().position(|earlier| {
                earlier.method == Method::Bind && earlier.address == socket.address
            }) {
                return Err(ConfigError::BoundTwice {
                    channel: socket.name.clone(),
                    address: socket.address.clone().unwrap_or_default(),
                    first,
                    second: idx,
                });
            }
        }
        Ok(())
    }

    /// The configuration, every `address=` value in order, and which keys were given.
    fn parse_pairs(text: &str) -> Result<Parsed, ConfigError> {
        let mut config = ChannelConfig::default();
        let (mut has_name, mut has_type, mut has_method) = (false, false, false);
        let mut pairs: Vec<String> = Vec::new();
        for piece in text
            .split(',')
            .map(str::trim)
            .filter(|piece| !piece.is_empty())
        {
            // `+tcp://host:5556` after `address=@tcp://*:5555`: another endpoint of the address.
            let continues_address = !piece.contains('=')
                || piece.starts_with(['@', '+', '>'])
                || piece
                    .split_once('=')
                    .is_some_and(|(key, _)| key.contains("://"));
            match pairs.last_mut() {
                Some(last) if continues_address && last.starts_with("address=") => {
                    last.push(',');
                    last.push_str(piece);
                }
                _ => pairs.push(piece.to_owned()),
            }
        }
        let mut seen: Vec<(&str, &str)> = Vec::new();
        let mut addresses = Vec::new();
        for pair in &pairs {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(ConfigError::NotKeyValue(pair.clone()));
            };
            let key = key.trim();
            config.set(key, KeyValue::Text(value))?;
            if key == "address" {
                addresses.push(value.to_owned());
            } else if let Some((_, first)) = seen.iter().find(|(seen_key, _)| *seen_key == key) {
                // FairMQ takes the last silently; a channel whose `type` said two things failed
                // only once running, and one renamed by a second `name` only at INIT.
                return Err(ConfigError::DuplicateKey {
                    key: key.to_owned(),
                    first: (*first).to_owned(),
                    second: value.to_owned(),
                });
            } else {
                seen.push((key, value));
            }
            match key {
                "name" => has_name = true,
                "type" => has_type = true,
                "method" => has_method = true,
                _ => {}
            }
        }
        let method_given = has_method;
        let num_sockets_given = seen.iter().any(|(key, _)| *key == "numSockets");
        if !has_method && addresses.len() > 1 {
            // Each socket's own address says its method: parse_key_values_sockets refuses a
            // socket whose address does not (parse_key_values refuses a second address).
            has_method = true;
        } else if !has_method && let Some(method) = config.prefixed_method() {
            config.method = method;
            has_method = true;
        }
        let missing = [
            (has_name, "name"),
            (has_type, "type"),
            (has_method, "method"),
        ]
        .into_iter()
        .find(|(present, _)| !present);
        if let Some((_, key)) = missing {
            return Err(ConfigError::MissingKey {
                channel: config.name,
                key,
            });
        }
        config.validate()?;
        Ok(Parsed {
            config,
            addresses,
            method_given,
            num_sockets_given,
        })
    }

    /// The configuration in `--channel-config` form (the inverse of
    /// [`ChannelConfig::parse_key_values`]; keys at their default are left out).
    pub fn to_key_values(&self) -> String {
        let defaults = ChannelConfig::default();
        let mut pairs = Vec::new();
        for key in &CHANNEL_KEYS {
            let Some(value) = self.get(key.name) else {
                continue;
            };
            let required = matches!(key.name, "name" | "type" | "method");
            if required || defaults.get(key.name).as_ref() != Some(&value) {
                pairs.push(format!("{}={value}", key.name));
            }
        }
        pairs.join(",")
    }

    /// Refuses a libfabric `provider` on a channel whose transport (`zeromq`, `shmem`) takes
    /// none: a channel moved off ofi with its provider left in place would otherwise run
    /// without it, silently.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`] naming the key and the provider.
    pub fn refuse_provider(&self) -> Result<(), ConfigError> {
        match &self.provider {
            None => Ok(()),
            Some(provider) => Err(ConfigError::InvalidValue {
                key: "provider".to_owned(),
                value: provider.clone(),
                expected: "none on this transport: a libfabric provider is for ofi channels",
            }),
        }
    }

    /// Checks what can be checked without a transport: the name, the address and the buffers.
    ///
    /// # Errors
    /// The first problem found, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        ChannelConfig::check_name(&self.name)?;
        if self.snd_buf_size == 0 || self.rcv_buf_size == 0 {
            return Err(ConfigError::InvalidValue {
                key: if self.snd_buf_size == 0 {
                    "sndBufSize"
                } else {
                    "rcvBufSize"
                }
                .to_owned(),
                value: "0".to_owned(),
                expected: "a whole number, at least 1 message",
            });
        }
        if self.num_sockets > MAX_NUM_SOCKETS {
            return Err(ConfigError::InvalidValue {
                key: "numSockets".to_owned(),
                value: self.num_sockets.to_string(),
                expected: "a number of sockets from 0 to 1024",
            });
        }
        self.check_spin()?;
        if self.port_range_min > self.port_range_max {
            return Err(ConfigError::InvalidValue {
                key: "portRangeMin".to_owned(),
                value: self.port_range_min.to_string(),
                expected: "a port not above portRangeMax",
            });
        }
        self.endpoints()?;
        Ok(())
    }

    /// Refuses a `spinUs` beside `busyPoll = true`: a busy-polled receive never sleeps, so it
    /// never spins before sleeping, and the value would be taken and change nothing. 0 (never
    /// spin) says the same as `busyPoll`, and the default cannot be told from a value left out.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`] naming `spinUs` and its value.
    pub fn check_spin(&self) -> Result<(), ConfigError> {
        if self.busy_poll && self.spin_us != 0 && self.spin_us != crate::spin::DEFAULT_SPIN_US {
            return Err(ConfigError::InvalidValue {
                key: "spinUs".to_owned(),
                value: self.spin_us.to_string(),
                expected: "no spinUs beside busyPoll=true (a busy-polled receive never sleeps, \
                           so it never spins before sleeping): give one of the two",
            });
        }
        Ok(())
    }

    /// A channel's name is not empty and has none of the characters that sub-channels (`[`,
    /// `]`), topology connections (`.`) and `--channel-config` lists (`,`, `=`) give meaning.
    ///
    /// # Errors
    /// [`ConfigError::MissingKey`] for an empty name, [`ConfigError::InvalidValue`] naming it.
    pub fn check_name(name: &str) -> Result<(), ConfigError> {
        if name.is_empty() {
            return Err(ConfigError::MissingKey {
                channel: String::new(),
                key: "name",
            });
        }
        if name.contains(['[', ']', '.', ',', '=']) || name.contains(char::is_control) {
            return Err(ConfigError::InvalidValue {
                key: "name".to_owned(),
                value: name.to_owned(),
                expected: "a name without '[', ']', '.', ',', '=' or control characters",
            });
        }
        Ok(())
    }

    /// The parsed address, `None` when none is configured; with several endpoints, the first.
    ///
    /// # Errors
    /// [`ConfigError::Address`] naming this channel.
    pub fn parsed_address(&self) -> Result<Option<Address>, ConfigError> {
        Ok(self
            .endpoints()?
            .into_iter()
            .next()
            .map(|endpoint| endpoint.address))
    }

    /// Every endpoint of the address (FairMQ's `@bind,+connect` form); empty without an
    /// address.
    ///
    /// # Errors
    /// [`ConfigError::Address`] naming this channel and the endpoint that does not parse.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        let Some(text) = self.address.as_deref() else {
            return Ok(Vec::new());
        };
        let count = text.split(',').count();
        text.split(',')
            .map(str::trim)
            .enumerate()
            .map(|(idx, piece)| {
                if count > 1 && piece.is_empty() {
                    return Err(ConfigError::EmptyEndpoint {
                        channel: self.name.clone(),
                        address: text.to_owned(),
                        position: idx + 1,
                        count,
                    });
                }
                let (method, address) = match piece.chars().next() {
                    Some('@') => (Method::Bind, &piece[1..]),
                    Some('+' | '>') => (Method::Connect, &piece[1..]),
                    _ => (self.method, piece),
                };
                let address = Address::parse(address).map_err(|source| ConfigError::Address {
                    channel: self.name.clone(),
                    source,
                })?;
                Ok(Endpoint { method, address })
            })
            .collect()
    }

    /// The method of the first endpoint when every endpoint of the address has a prefix (`@`
    /// or `+`), so that the channel needs no `method` of its own.
    pub fn prefixed_method(&self) -> Option<Method> {
        let text = self.address.as_deref()?;
        // An empty endpoint is not a missing method: `endpoints` names it.
        let mut methods = text
            .split(',')
            .map(str::trim)
            .filter(|piece| !piece.is_empty())
            .map(|piece| match piece.chars().next() {
                Some('@') => Some(Method::Bind),
                Some('+' | '>') => Some(Method::Connect),
                _ => None,
            });
        let first = methods.next()??;
        methods.all(|method| method.is_some()).then_some(first)
    }

    /// True when this channel binds something in BINDING: an endpoint with `@` or without a
    /// prefix on a binding channel, or no address on a binding channel (the transport picks).
    pub fn binds(&self) -> bool {
        self.has_endpoints(Method::Bind)
    }

    /// True when this channel connects something in CONNECTING.
    pub fn connects(&self) -> bool {
        self.has_endpoints(Method::Connect)
    }

    fn has_endpoints(&self, method: Method) -> bool {
        match self.endpoints() {
            Ok(endpoints) if !endpoints.is_empty() => {
                endpoints.iter().any(|endpoint| endpoint.method == method)
            }
            _ => self.method == method,
        }
    }

    /// The names of this channel's sockets: `["data"]`, or `["data[0]", "data[1]"]` when
    /// `numSockets` is 2.
    pub fn socket_names(&self) -> Vec<String> {
        if self.num_sockets <= 1 {
            return vec![self.name.clone()];
        }
        (0..self.num_sockets)
            .map(|socket_idx| format!("{}[{socket_idx}]", self.name))
            .collect()
    }

    /// The linger period.
    pub fn linger_duration(&self) -> Duration {
        Duration::from_millis(self.linger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_is_a_socket_and_other_keys_come_once() {
        let sockets = ChannelConfig::parse_key_values_sockets(
            "name=data,type=push,method=bind,address=tcp://*:5555,address=ipc:///tmp/b,linger=7",
        )
        .unwrap();
        assert_eq!(sockets.len(), 2);
        for (socket, address) in sockets.iter().zip(["tcp://*:5555", "ipc:///tmp/b"]) {
            assert_eq!(socket.address.as_deref(), Some(address));
            assert_eq!((socket.num_sockets, socket.linger), (2, 7));
            assert_eq!(socket.name, "data");
        }
        // numSockets may say the same number, not another.
        assert_eq!(
            ChannelConfig::parse_key_values_sockets(
                "name=d,type=pull,method=bind,address=ipc:///a,address=ipc:///b,numSockets=2",
            )
            .unwrap()
            .len(),
            2
        );
        assert!(matches!(
            ChannelConfig::parse_key_values_sockets(
                "name=d,type=pull,method=bind,address=ipc:///a,address=ipc:///b,numSockets=3",
            ),
            Err(ConfigError::SocketCount {
                n_addresses: 2,
                num_sockets: 3,
                ..
            })
        ));
        assert!(matches!(
            ChannelConfig::parse_key_values_sockets(
                "name=d,type=pull,method=bind,address=ipc:///a,address=ipc:///b,numSockets=1",
            ),
            Err(ConfigError::SocketCount {
                n_addresses: 2,
                num_sockets: 1,
                ..
            })
        ));
        // Without `method`, each socket's address says its own, or the list is refused.
        let prefixed = ChannelConfig::parse_key_values_sockets(
            "name=d,type=pair,address=@tcp://*:5555,address=+tcp://h:5556",
        )
        .unwrap();
        assert_eq!(
            prefixed
                .iter()
                .map(|socket| socket.method)
                .collect::<Vec<_>>(),
            vec![Method::Bind, Method::Connect]
        );
        assert!(matches!(
            ChannelConfig::parse_key_values_sockets(
                "name=d,type=pair,address=+tcp://h:5556,address=tcp://h:5557",
            ),
            Err(ConfigError::MissingKey { key: "method", .. })
        ));
        // One address: the one configuration, as parse_key_values gives it.
        let one = "name=d,type=pull,method=bind,address=ipc:///a";
        assert_eq!(
            ChannelConfig::parse_key_values_sockets(one).unwrap(),
            vec![ChannelConfig::parse_key_values(one).unwrap()]
        );
        // parse_key_values has one configuration to give: a second address is refused.
        let error = ChannelConfig::parse_key_values(
            "name=d,type=pull,method=bind,address=ipc:///a,address=ipc:///b",
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "channel key \"address\" is given twice (\"ipc:///a\", then \"ipc:///b\")"
        );
        for (text, key) in [
            ("name=d,type=pull,type=push,method=bind", "type"),
            ("name=d,name=e,type=pull,method=bind", "name"),
            ("name=d,type=pull,method=bind,linger=1,linger=1", "linger"),
        ] {
            let error = ChannelConfig::parse_key_values_sockets(text).unwrap_err();
            assert!(
                matches!(&error, ConfigError::DuplicateKey { key: found, .. } if found == key),
                "{text}: {error}"
            );
        }
    }

    #[test]
    fn defaults_are_fairmqs() {
        let config = ChannelConfig::default();
        assert_eq!(config.snd_buf_size, 1000);
        assert_eq!(config.rcv_buf_size, 1000);
        assert_eq!(config.snd_kernel_size, 0);
        assert_eq!(config.rcv_kernel_size, 0);
        assert_eq!(config.linger, 500);
        assert_eq!(config.rate_logging, 1);
        assert_eq!(
            (config.port_range_min, config.port_range_max),
            (22000, 23000)
        );
        assert!(config.auto_bind);
        assert_eq!(config.num_sockets, 0);
        assert_eq!(config.address, None);
        assert_eq!(config.transport, None);
    }

    #[test]
    fn json_uses_fairmq_key_names_and_fills_defaults() {
        let config: ChannelConfig = serde_json::from_str(
            r#"{"name":"data","type":"pull","method":"connect","address":"ipc:///tmp/x","sndBufSize":5,"rateLogging":0}"#,
        )
        .unwrap();
        assert_eq!(config.socket_type, SocketType::Pull);
        assert_eq!(config.method, Method::Connect);
        assert_eq!(config.snd_buf_size, 5);
        assert_eq!(config.rcv_buf_size, 1000);
        assert_eq!(config.rate_logging, 0);
        let unknown = serde_json::from_str::<ChannelConfig>(r#"{"name":"d","sndbufsize":5}"#);
        assert!(unknown.unwrap_err().to_string().contains("sndbufsize"));
    }

    fn check_key_values_err(text: &str, expected: ConfigError) {
        assert_eq!(
            ChannelConfig::parse_key_values(text).unwrap_err(),
            expected,
            "{text}"
        );
    }

    #[test]
    fn key_values() {
        let config = ChannelConfig::parse_key_values(
            "name=data,type=sub,method=connect,address=tcp://localhost:5,numSockets=2,autoBind=false,linger=10",
        )
        .unwrap();
        assert_eq!(config.socket_names(), vec!["data[0]", "data[1]"]);
        assert!(!config.auto_bind);
        assert_eq!(config.linger_duration(), Duration::from_millis(10));
        check_key_values_err(
            "name=d,type=push,method=bind,color=red",
            ConfigError::UnknownKey {
                key: "color".into(),
                known: crate::keys::known_channel_keys(),
            },
        );
        check_key_values_err(
            "name=d,type=shove,method=bind",
            ConfigError::InvalidValue {
                key: "type".into(),
                value: "shove".into(),
                expected: "push, pull, pub, sub, req, rep or pair",
            },
        );
        check_key_values_err(
            "name=d,type=push",
            ConfigError::MissingKey {
                channel: "d".into(),
                key: "method",
            },
        );
        check_key_values_err("name=d,type", ConfigError::NotKeyValue("type".into()));
        check_key_values_err(
            "name=d,type=push,method=bind,sndBufSize=-1",
            ConfigError::InvalidValue {
                key: "sndBufSize".into(),
                value: "-1".into(),
                expected: "a whole number, at least 1 message",
            },
        );
        check_key_values_err(
            "name=d,type=push,method=bind,address=tcp://x",
            ConfigError::Address {
                channel: "d".into(),
                source: AddressError::MissingPort("tcp://x".into()),
            },
        );
    }

    /// Found by fuzzing (crates/fuzz): `numSockets=4294967296` made `socket_names` allocate
    /// hundreds of GiB and abort the process.
    #[test]
    fn a_forged_socket_count_is_refused_before_anything_is_allocated() {
        let text = |n_sockets: u64| format!("name=d,type=push,method=bind,numSockets={n_sockets}");
        let accepted = ChannelConfig::parse_key_values(&text(MAX_NUM_SOCKETS as u64)).unwrap();
        assert_eq!(accepted.socket_names().len(), MAX_NUM_SOCKETS);
        for n_sockets in [MAX_NUM_SOCKETS as u64 + 1, 1 << 32, u64::MAX] {
            check_key_values_err(
                &text(n_sockets),
                ConfigError::InvalidValue {
                    key: "numSockets".into(),
                    value: n_sockets.to_string(),
                    expected: "a number of sockets from 0 to 1024",
                },
            );
        }
    }

    #[test]
    fn sub_channels_that_would_share_one_bound_address_are_refused() {
        let parse = |text: &str| ChannelConfig::parse_key_values(text).unwrap();
        for (text, address) in [
            (
                "name=data,type=pull,method=bind,address=ipc:///tmp/x,numSockets=4",
                "ipc:///tmp/x",
            ),
            (
                "name=data,type=pull,method=bind,address=inproc://x,numSockets=2",
                "inproc://x",
            ),
            (
                "name=data,type=pull,method=bind,address=tcp://127.0.0.1:5555,numSockets=2,autoBind=false",
                "tcp://127.0.0.1:5555",
            ),
            (
                "name=data,type=pull,address=+ipc:///tmp/y,@ipc:///tmp/x,numSockets=2",
                "ipc:///tmp/x",
            ),
            // The runner's autoBind takes a single tcp endpoint.
            (
                "name=data,type=pull,address=@tcp://*:5555,+tcp://h:1,numSockets=2",
                "tcp://*:5555",
            ),
        ] {
            let config = parse(text);
            assert_eq!(
                config.check_sub_channels_bind_apart(),
                Err(ConfigError::SharedBind {
                    channel: "data".into(),
                    address: address.into(),
                    num_sockets: config.num_sockets,
                }),
                "{text}"
            );
        }
        // A free port each, autoBind's range, connecting, or one socket: each binds its own.
        for text in [
            "name=data,type=pull,method=bind,address=tcp://127.0.0.1:0,numSockets=4",
            "name=data,type=pull,method=bind,address=verbs://127.0.0.1:0,numSockets=2",
            "name=data,type=pull,method=bind,address=tcp://127.0.0.1:5555,numSockets=2",
            "name=data,type=push,method=connect,address=ipc:///tmp/x,numSockets=4",
            "name=data,type=pull,method=bind,address=ipc:///tmp/x,numSockets=1",
            "name=data,type=pull,method=bind,numSockets=3",
        ] {
            assert_eq!(
                parse(text).check_sub_channels_bind_apart(),
                Ok(()),
                "{text}"
            );
        }
    }

    #[test]
    fn two_sockets_may_each_bind_a_free_tcp_port() {
        let sockets = ChannelConfig::parse_key_values_sockets(
            "name=data,type=pull,method=bind,address=tcp://127.0.0.1:0,address=tcp://127.0.0.1:0",
        )
        .unwrap();
        assert_eq!(sockets.len(), 2);
    }

    #[test]
    fn one_address_bound_by_two_sockets_is_refused_connected_twice_is_not() {
        assert_eq!(
            ChannelConfig::parse_key_values_sockets(
                "name=data,type=pull,method=bind,address=ipc:///tmp/c,address=ipc:///tmp/c"
            )
            .unwrap_err(),
            ConfigError::BoundTwice {
                channel: "data".into(),
                address: "ipc:///tmp/c".into(),
                first: 0,
                second: 1,
            }
        );
        let twice = ChannelConfig::parse_key_values_sockets(
            "name=data,type=push,method=connect,address=ipc:///tmp/c,address=ipc:///tmp/c",
        )
        .unwrap();
        assert_eq!(twice.len(), 2);
    }

    #[test]
    fn multi_endpoint_addresses_bind_and_connect_on_one_channel() {
        let config = ChannelConfig::parse_key_values(
            "name=data,type=pull,address=@tcp://*:5555,+tcp://host:5556,>ipc:///tmp/x,rateLogging=0",
        )
        .unwrap();
        assert_eq!(config.rate_logging, 0);
        assert_eq!(config.method, Method::Bind);
        let endpoints = config.endpoints().unwrap();
        let methods: Vec<Method> = endpoints.iter().map(|endpoint| endpoint.method).collect();
        assert_eq!(methods, [Method::Bind, Method::Connect, Method::Connect]);
        assert_eq!(endpoints[1].address.to_string(), "tcp://host:5556");
        assert!(config.binds() && config.connects());
        // Without a prefix an endpoint follows the channel's method.
        let plain = ChannelConfig::parse_key_values(
            "name=d,type=push,method=connect,address=tcp://a:1,@tcp://*:2",
        )
        .unwrap();
        let methods: Vec<Method> = plain
            .endpoints()
            .unwrap()
            .iter()
            .map(|e| e.method)
            .collect();
        assert_eq!(methods, [Method::Connect, Method::Bind]);
        // A bad endpoint is named.
        check_key_values_err(
            "name=d,type=push,address=@tcp://*:1,+tcp://x",
            ConfigError::Address {
                channel: "d".into(),
                source: AddressError::MissingPort("tcp://x".into()),
            },
        );
        // An empty endpoint (from a JSON file, which keeps the commas) is named by position,
        // not reported as the whole address being empty.
        let gap = ChannelConfig {
            name: "d".into(),
            address: Some("@tcp://*:1,,+tcp://h:2".into()),
            ..ChannelConfig::default()
        };
        assert_eq!(
            gap.endpoints().unwrap_err(),
            ConfigError::EmptyEndpoint {
                channel: "d".into(),
                address: "@tcp://*:1,,+tcp://h:2".into(),
                position: 2,
                count: 3,
            }
        );
        // A spin before sleeping does nothing for a receive that never sleeps, in either
        // order; 0 says the same as busyPoll.
        for text in [
            "name=d,type=pull,method=bind,busyPoll=true,spinUs=250",
            "name=d,type=pull,method=bind,spinUs=250,busyPoll=1",
        ] {
            check_key_values_err(
                text,
                ConfigError::InvalidValue {
                    key: "spinUs".into(),
                    value: "250".into(),
                    expected: "no spinUs beside busyPoll=true (a busy-polled receive never \
                               sleeps, so it never spins before sleeping): give one of the two",
                },
            );
        }
        ChannelConfig::parse_key_values("name=d,type=pull,method=bind,busyPoll=true,spinUs=0")
            .unwrap();
        ChannelConfig::parse_key_values("name=d,type=pull,method=bind,spinUs=250").unwrap();
        // FairMQ's timeouts are taken and checked.
        ChannelConfig::parse_key_values(
            "name=d,type=push,method=bind,sndTimeoutMs=-1,rcvTimeoutMs=100",
        )
        .unwrap();
        check_key_values_err(
            "name=d,type=push,method=bind,sndTimeoutMs=-5",
            ConfigError::InvalidValue {
                key: "sndTimeoutMs".into(),
                value: "-5".into(),
                expected: "milliseconds, or -1 for none",
            },
        );
    }

    #[test]
    fn key_values_round_trip() {
        let config = ChannelConfig {
            snd_buf_size: 7,
            linger: 0,
            auto_bind: false,
            num_sockets: 2,
            busy_poll: true,
            spin_us: 0,
            provider: Some("tcp;ofi_rxm".to_owned()),
            ..ChannelConfig::new("out", SocketType::Push, Method::Connect)
                .with_address("ipc:///tmp/x")
                .with_transport("shmem")
        };
        assert_eq!(
            ChannelConfig::parse_key_values(&config.to_key_values()).unwrap(),
            config
        );
    }

    #[test]
    fn compatibility() {
        for socket_type in SocketType::ALL {
            assert!(socket_type.is_compatible_with(socket_type.peer()));
            assert_eq!(socket_type.peer().peer(), socket_type);
        }
        assert!(!SocketType::Push.is_compatible_with(SocketType::Push));
        assert!(!SocketType::Pub.is_compatible_with(SocketType::Push));
        assert!(!SocketType::Req.is_compatible_with(SocketType::Pull));
    }
}
