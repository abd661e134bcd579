//! The channel keys, once: their names (FairMQ's), what values they take, their defaults and
//! what they mean.
//!
//! A channel can be configured in three forms: FairMQ's `--channel-config` key=value text,
//! FairMQ's `--mq-config` JSON, and ferromq's topology TOML. Each form reads its own syntax and
//! hands every key to [`ChannelConfig::set`], which finds the key in [`CHANNEL_KEYS`], checks
//! the value against the key's [`KeyKind`] and stores it; so a key, its bounds and its error
//! text exist once, and a key added here is accepted by every form. `docs/topology.md` is
//! tested against this table.

use crate::config::{ChannelConfig, ConfigError, MAX_NUM_SOCKETS, Method, SocketType};

/// What values a key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// Free text (a name, an address, a transport).
    Text,
    /// A socket type: `push`, `pull`, ...
    SocketType,
    /// `bind` or `connect`.
    Method,
    /// `true` or `false` (or `1` and `0`).
    Bool,
    /// An integer in `min..=max`.
    Integer {
        /// The smallest value accepted.
        min: i64,
        /// The largest value accepted.
        max: i64,
    },
}

/// One channel key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelKey {
    /// The key as written (FairMQ's spelling).
    pub name: &'static str,
    /// The values it takes.
    pub kind: KeyKind,
    /// Its value when not given, as written in a configuration; empty when there is none.
    pub default: &'static str,
    /// What a value out of range is told it should be.
    pub expected: &'static str,
    /// Whether a channel reads it (`false`: FairMQ's key, checked and then ignored).
    pub used: bool,
}

const fn key(
    name: &'static str,
    kind: KeyKind,
    default: &'static str,
    expected: &'static str,
) -> ChannelKey {
    ChannelKey {
        name,
        kind,
        default,
        expected,
        used: true,
    }
}

const fn count(min: i64, max: i64) -> KeyKind {
    KeyKind::Integer { min, max }
}

/// Every channel key, in the order `--channel-config` text is written.
pub const CHANNEL_KEYS: [ChannelKey; 20] = [
    key(
        "name",
        KeyKind::Text,
        "",
        "a name without '[', ']', '.', ',', '=' or control characters",
    ),
    key(
        "type",
        KeyKind::SocketType,
        "",
        "push, pull, pub, sub, req, rep or pair",
    ),
    key("method", KeyKind::Method, "", "bind or connect"),
    key("address", KeyKind::Text, "", "an address"),
    key("transport", KeyKind::Text, "", "a transport name"),
    key(
        "sndBufSize",
        count(1, i64::MAX),
        "1000",
        "a whole number, at least 1 message",
    ),
    key(
        "rcvBufSize",
        count(1, i64::MAX),
        "1000",
        "a whole number, at least 1 message",
    ),
    key(
        "sndKernelSize",
        count(0, i64::MAX),
        "0",
        "a non-negative integer",
    ),
    key(
        "rcvKernelSize",
        count(0, i64::MAX),
        "0",
        "a non-negative integer",
    ),
    ChannelKey {
        used: false,
        ..key(
            "sndTimeoutMs",
            count(-1, i64::MAX),
            "-1",
            "milliseconds, or -1 for none",
        )
    },
    ChannelKey {
        used: false,
        ..key(
            "rcvTimeoutMs",
            count(-1, i64::MAX),
            "-1",
            "milliseconds, or -1 for none",
        )
    },
    key(
        "linger",
        count(0, i64::MAX),
        "500",
        "a non-negative integer",
    ),
    key(
        "rateLogging",
        count(0, i64::MAX),
        "1",
        "a non-negative integer",
    ),
    key(
        "portRangeMin",
        count(1, 65535),
        "22000",
        "a port from 1 to 65535",
    ),
    key(
        "portRangeMax",
        count(1, 65535),
        "23000",
        "a port from 1 to 65535",
    ),
    key("autoBind", KeyKind::Bool, "true", "true or false"),
    key(
        "numSockets",
        count(0, MAX_NUM_SOCKETS as i64),
        "0",
        "a number of sockets from 0 to 1024",
    ),
    key("busyPoll", KeyKind::Bool, "false", "true or false"),
    key(
        "spinUs",
        count(0, 1_000_000),
        "60",
        "microseconds from 0 (never spin) to 1000000",
    ),
    key("provider", KeyKind::Text, "", "a libfabric provider"),
];

/// The key called `name`, if there is one.
pub fn channel_key(name: &str) -> Option<&'static ChannelKey> {
    CHANNEL_KEYS.iter().find(|key| key.name == name)
}

/// The names of every key, `, `-separated, for error messages.
pub fn known_channel_keys() -> String {
    CHANNEL_KEYS
        .iter()
        .map(|key| key.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A value as a configuration form read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyValue<'a> {
    /// Text: everything in key=value form, and strings in JSON and TOML (FairMQ's JSON writes
    /// numbers as strings too).
    Text(&'a str),
    /// A number written as a number.
    Integer(i64),
    /// A boolean written as a boolean.
    Bool(bool),
}

impl KeyValue<'_> {
    fn to_text(self) -> String {
        match self {
            KeyValue::Text(text) => text.to_owned(),
            KeyValue::Integer(number) => number.to_string(),
            KeyValue::Bool(flag) => flag.to_string(),
        }
    }
}

/// A value converted for its key.
enum Converted {
    Text(String),
    SocketType(SocketType),
    Method(Method),
    Bool(bool),
    Integer(i64),
}

fn convert(key: &ChannelKey, value: KeyValue<'_>) -> Result<Converted, ConfigError> {
    let invalid = || ConfigError::InvalidValue {
        key: key.name.to_owned(),
        value: value.to_text(),
        expected: key.expected,
    };
    match (key.kind, value) {
        (KeyKind::Text, KeyValue::Text(text)) => Ok(Converted::Text(text.to_owned())),
        (KeyKind::SocketType, KeyValue::Text(text)) => text
            .trim()
            .parse()
            .map(Converted::SocketType)
            .map_err(|_| invalid()),
        (KeyKind::Method, KeyValue::Text(text)) => text
            .trim()
            .parse()
            .map(Converted::Method)
            .map_err(|_| invalid()),
        (KeyKind::Bool, KeyValue::Bool(flag)) => Ok(Converted::Bool(flag)),
        (KeyKind::Bool, KeyValue::Integer(1)) => Ok(Converted::Bool(true)),
        (KeyKind::Bool, KeyValue::Integer(0)) => Ok(Converted::Bool(false)),
        (KeyKind::Bool, KeyValue::Text(text)) => match text.trim() {
            "true" | "1" => Ok(Converted::Bool(true)),
            "false" | "0" => Ok(Converted::Bool(false)),
            _ => Err(invalid()),
        },
        (KeyKind::Integer { min, max }, value) => {
            let number = match value {
                KeyValue::Integer(number) => number,
                KeyValue::Text(text) => text.trim().parse().map_err(|_| invalid())?,
                KeyValue::Bool(_) => return Err(invalid()),
            };
            if number < min || number > max {
                return Err(invalid());
            }
            Ok(Converted::Integer(number))
        }
        _ => Err(invalid()),
    }
}

/// A number already checked against its key's bounds, as the field's type (which holds every
/// bounded value on a 64-bit machine).
fn narrow<T: TryFrom<i64>>(key: &ChannelKey, number: i64) -> Result<T, ConfigError> {
    T::try_from(number).map_err(|_| ConfigError::InvalidValue {
        key: key.name.to_owned(),
        value: number.to_string(),
        expected: "a number this machine can hold",
    })
}

impl ChannelConfig {
    /// Sets the key `key` (FairMQ's spelling: `sndBufSize`, `autoBind`, ...) to `value`.
    ///
    /// # Errors
    /// [`ConfigError::UnknownKey`] listing every key; [`ConfigError::InvalidValue`] naming the
    /// key, the value and what the key takes. Nothing changes on error.
    pub fn set(&mut self, key: &str, value: KeyValue<'_>) -> Result<(), ConfigError> {
        let Some(spec) = channel_key(key) else {
            return Err(ConfigError::UnknownKey {
                key: key.to_owned(),
                known: known_channel_keys(),
            });
        };
        match (spec.name, convert(spec, value)?) {
            ("name", Converted::Text(text)) => self.name = text,
            ("address", Converted::Text(text)) => self.address = Some(text),
            ("transport", Converted::Text(text)) => self.transport = Some(text),
            ("provider", Converted::Text(text)) => self.provider = Some(text),
            (_, Converted::SocketType(socket_type)) => self.socket_type = socket_type,
            (_, Converted::Method(method)) => self.method = method,
            ("autoBind", Converted::Bool(flag)) => self.auto_bind = flag,
            ("busyPoll", Converted::Bool(flag)) => self.busy_poll = flag,
            ("spinUs", Converted::Integer(number)) => self.spin_us = narrow(spec, number)?,
            ("sndBufSize", Converted::Integer(number)) => self.snd_buf_size = narrow(spec, number)?,
            ("rcvBufSize", Converted::Integer(number)) => self.rcv_buf_size = narrow(spec, number)?,
            ("sndKernelSize", Converted::Integer(number)) => {
                self.snd_kernel_size = narrow(spec, number)?;
            }
            ("rcvKernelSize", Converted::Integer(number)) => {
                self.rcv_kernel_size = narrow(spec, number)?;
            }
            ("linger", Converted::Integer(number)) => self.linger = narrow(spec, number)?,
            ("rateLogging", Converted::Integer(number)) => {
                self.rate_logging = narrow(spec, number)?
            }
            ("portRangeMin", Converted::Integer(number)) => {
                self.port_range_min = narrow(spec, number)?
            }
            ("portRangeMax", Converted::Integer(number)) => {
                self.port_range_max = narrow(spec, number)?
            }
            ("numSockets", Converted::Integer(number)) => self.num_sockets = narrow(spec, number)?,
            // FairMQ's timeouts: checked above, not used.
            _ => debug_assert!(!spec.used, "key {} is in the table but not set", spec.name),
        }
        Ok(())
    }

    /// The value of key `key` as it would be written in key=value form; `None` for an unknown
    /// key, an unset optional one, and the keys a channel does not use.
    pub fn get(&self, key: &str) -> Option<String> {
        let text = match channel_key(key)?.name {
            "name" => self.name.clone(),
            "type" => self.socket_type.to_string(),
            "method" => self.method.to_string(),
            "address" => self.address.clone()?,
            "transport" => self.transport.clone()?,
            "provider" => self.provider.clone()?,
            "sndBufSize" => self.snd_buf_size.to_string(),
            "rcvBufSize" => self.rcv_buf_size.to_string(),
            "sndKernelSize" => self.snd_kernel_size.to_string(),
            "rcvKernelSize" => self.rcv_kernel_size.to_string(),
            "linger" => self.linger.to_string(),
            "rateLogging" => self.rate_logging.to_string(),
            "portRangeMin" => self.port_range_min.to_string(),
            "portRangeMax" => self.port_range_max.to_string(),
            "autoBind" => self.auto_bind.to_string(),
            "numSockets" => self.num_sockets.to_string(),
            "busyPoll" => self.busy_poll.to_string(),
            "spinUs" => self.spin_us.to_string(),
            _ => return None,
        };
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_used_key_can_be_set_and_read_back() {
        for key in CHANNEL_KEYS.iter().filter(|key| key.used) {
            let value = match key.kind {
                KeyKind::Text => "x-value",
                KeyKind::SocketType => "pair",
                KeyKind::Method => "connect",
                KeyKind::Bool => "false",
                KeyKind::Integer { min, .. } if min <= 7 => "7",
                KeyKind::Integer { .. } => "4242",
            };
            let mut config = ChannelConfig::default();
            config
                .set(key.name, KeyValue::Text(value))
                .unwrap_or_else(|error| panic!("{}: {error}", key.name));
            assert_eq!(config.get(key.name).as_deref(), Some(value), "{}", key.name);
        }
    }

    #[test]
    fn the_defaults_in_the_table_are_the_configs() {
        let config = ChannelConfig::default();
        for key in CHANNEL_KEYS.iter().filter(|key| !key.default.is_empty()) {
            if key.used {
                assert_eq!(
                    config.get(key.name).as_deref(),
                    Some(key.default),
                    "{}",
                    key.name
                );
            }
            let mut parsed = ChannelConfig::default();
            parsed
                .set(key.name, KeyValue::Text(key.default))
                .unwrap_or_else(|error| panic!("{}: {error}", key.name));
        }
    }

    #[test]
    fn bad_values_name_key_value_and_what_was_expected_and_change_nothing() {
        let mut config = ChannelConfig::default();
        let cases = [
            ("sndBufSize", KeyValue::Integer(0), "at least 1 message"),
            // "abc" and "1e3" read "expected at least 1 message" alone (a bad-input sweep).
            (
                "rcvBufSize",
                KeyValue::Text("1e3"),
                "a whole number, at least 1 message",
            ),
            (
                "portRangeMax",
                KeyValue::Text("70000"),
                "a port from 1 to 65535",
            ),
            ("numSockets", KeyValue::Integer(1025), "from 0 to 1024"),
            // "abc" read "expected at most 1024 sockets per channel" (a bad-input sweep).
            (
                "numSockets",
                KeyValue::Text("abc"),
                "a number of sockets from 0 to 1024",
            ),
            ("autoBind", KeyValue::Text("yes"), "true or false"),
            ("busyPoll", KeyValue::Integer(2), "true or false"),
            ("linger", KeyValue::Bool(true), "a non-negative integer"),
            ("address", KeyValue::Integer(5), "an address"),
            ("sndTimeoutMs", KeyValue::Integer(-2), "-1 for none"),
            ("spinUs", KeyValue::Integer(-1), "0 (never spin) to 1000000"),
            (
                "spinUs",
                KeyValue::Text("2000000"),
                "0 (never spin) to 1000000",
            ),
            ("spinUs", KeyValue::Text("fast"), "microseconds"),
        ];
        for (key, value, expected) in cases {
            let error = config.set(key, value).expect_err(key).to_string();
            assert!(
                error.contains(key) && error.contains(&value.to_text()) && error.contains(expected),
                "{error}"
            );
        }
        assert_eq!(config, ChannelConfig::default());
        let error = config
            .set("sndBufsize", KeyValue::Integer(5))
            .expect_err("typo");
        assert!(
            error.to_string().contains("sndBufSize, rcvBufSize"),
            "{error}"
        );
    }
}
