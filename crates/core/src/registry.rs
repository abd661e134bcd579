//! Which transports a program has, under which names: the registry the binary fills and hands
//! to the code that opens channels.
//!
//! A configuration names a channel's transport (`"zeromq"`, `"shmem"`, `"ofi"`); the device
//! runner turns the name into a [`Transport`] through a [`TransportRegistry`]. The registry is
//! made by the binary (the `ferromq` CLI, `run_device_main`, a test) from the transports it was
//! built with, each of which registers itself (`ferromq_zmq::register`, ...), so the crates that
//! use transports compile none of them, as ripgrep's binary picks its search engines.
//!
//! What a transport can do is said by its [`TransportTraits`], not by its name: the runner asks
//! "does this transport want memory to receive into?", not "is this ofi?".
//!
//! Transport-specific settings travel as the device's properties (`shm-segment-size`, ...);
//! each transport reads its own keys with [`TransportOptions::number`], so a malformed value is
//! an error naming the key and the value.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::ConfigError;
use crate::error::{Error, Result};
use crate::transport::Transport;

/// What a transport may need from the device that uses it.
#[derive(Debug, Clone, Default)]
pub struct TransportOptions {
    /// The device's session.
    pub session: String,
    /// The device's properties (`shm-segment-size`, ...).
    pub properties: BTreeMap<String, String>,
    /// Where a transport that receives into memory of its own choosing (ofi) allocates: the
    /// device's transport that lends shared memory, when it has channels on it, so that
    /// forwarding copies nothing. `None`: the transport allocates its own.
    pub receive_memory: Option<Arc<dyn Transport>>,
}

impl TransportOptions {
    /// Options for a device of `session` with no properties.
    pub fn for_session(session: impl Into<String>) -> TransportOptions {
        TransportOptions {
            session: session.into(),
            ..TransportOptions::default()
        }
    }

    /// The property `key` as a non-negative integer; `None` when it is not set.
    ///
    /// # Errors
    /// [`Error::Config`] naming the key and the value when the value is not such a number.
    pub fn number(&self, key: &str) -> Result<Option<u64>> {
        let Some(text) = self.properties.get(key) else {
            return Ok(None);
        };
        text.trim().parse().map(Some).map_err(|_| {
            Error::Config(ConfigError::InvalidProperty {
                key: key.to_owned(),
                value: text.clone(),
                expected: "a non-negative integer",
            })
        })
    }

    /// The property `key` as a size in bytes this machine can address; `None` when not set.
    ///
    /// # Errors
    /// As [`TransportOptions::number`], and for a size beyond `usize`.
    pub fn size(&self, key: &str) -> Result<Option<usize>> {
        let Some(number) = self.number(key)? else {
            return Ok(None);
        };
        usize::try_from(number).map(Some).map_err(|_| {
            Error::Config(ConfigError::InvalidProperty {
                key: key.to_owned(),
                value: number.to_string(),
                expected: "a size this machine can address",
            })
        })
    }

    /// The property `key` as a flag (`true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, as FairMQ's
    /// boolean options take); `None` when not set.
    ///
    /// # Errors
    /// [`Error::Config`] naming the key and the value when the value is none of those.
    pub fn flag(&self, key: &str) -> Result<Option<bool>> {
        let Some(text) = self.properties.get(key) else {
            return Ok(None);
        };
        match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(Some(true)),
            "false" | "0" | "no" | "off" => Ok(Some(false)),
            _ => Err(Error::Config(ConfigError::InvalidProperty {
                key: key.to_owned(),
                value: text.clone(),
                expected: "true or false",
            })),
        }
    }

    /// The property `key` as a number of milliseconds; `None` when not set.
    ///
    /// # Errors
    /// As [`TransportOptions::number`].
    pub fn millis(&self, key: &str) -> Result<Option<Duration>> {
        Ok(self.number(key)?.map(Duration::from_millis))
    }
}

/// What a transport can do, as far as the code that picks transports needs to know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportTraits {
    /// Its messages can live in memory another process maps (shmem): a transport that wants
    /// receive memory is given this one when the device has channels on it.
    pub lends_shared_memory: bool,
    /// It receives into memory it is given ([`TransportOptions::receive_memory`]) when there is
    /// some (ofi), so that what it receives goes on without a copy.
    pub wants_receive_memory: bool,
    /// It binds `ipc://` paths (zeromq, shmem); one that does not (ofi, whose peers may be on
    /// other hosts) is given a tcp address when a launcher picks one for it.
    pub binds_ipc: bool,
    /// It reaches only processes on its own host (shmem): a launcher refuses a channel over it
    /// between devices it places on different hosts.
    pub one_host: bool,
    /// The device properties it reads (`shm-segment-size`, ...): with the device's own, the
    /// keys a device of a built-in kind takes; any other is refused as a typo, naming it.
    pub properties: &'static [&'static str],
    /// The address schemes its channels bind and connect (`tcp`, `ipc`, ...): a topology
    /// whose channel over it has another is refused before anything runs.
    pub schemes: &'static [&'static str],
}

impl TransportTraits {
    /// A transport that binds ipc paths and needs nothing from its neighbours, over zeromq's
    /// schemes (tcp, ipc, inproc).
    pub const PLAIN: TransportTraits = TransportTraits {
        lends_shared_memory: false,
        wants_receive_memory: false,
        binds_ipc: true,
        one_host: false,
        properties: &[],
        schemes: &["tcp", "ipc", "inproc"],
    };

    /// Taking the address schemes `schemes` ([`TransportTraits::schemes`]).
    #[must_use]
    pub const fn taking_schemes(mut self, schemes: &'static [&'static str]) -> TransportTraits {
        self.schemes = schemes;
        self
    }

    /// Reading the device properties `keys` ([`TransportTraits::properties`]).
    #[must_use]
    pub const fn reading(mut self, keys: &'static [&'static str]) -> TransportTraits {
        self.properties = keys;
        self
    }

    /// With [`TransportTraits::lends_shared_memory`] set.
    #[must_use]
    pub const fn lending_shared_memory(mut self) -> TransportTraits {
        self.lends_shared_memory = true;
        self
    }

    /// With [`TransportTraits::wants_receive_memory`] set.
    #[must_use]
    pub const fn wanting_receive_memory(mut self) -> TransportTraits {
        self.wants_receive_memory = true;
        self
    }

    /// With [`TransportTraits::one_host`] set.
    #[must_use]
    pub const fn on_one_host(mut self) -> TransportTraits {
        self.one_host = true;
        self
    }

    /// With [`TransportTraits::binds_ipc`] cleared.
    #[must_use]
    pub const fn without_ipc(mut self) -> TransportTraits {
        self.binds_ipc = false;
        self
    }
}

/// Makes a transport for a device from its options.
pub type MakeTransport = dyn Fn(&TransportOptions) -> Result<Arc<dyn Transport>> + Send + Sync;

struct Entry {
    traits: TransportTraits,
    make: Arc<MakeTransport>,
}

/// The transports a program has, by name.
#[derive(Default, Clone)]
pub struct TransportRegistry {
    entries: BTreeMap<&'static str, Arc<Entry>>,
}

impl fmt::Debug for TransportRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.entries.keys()).finish()
    }
}

impl TransportRegistry {
    /// A registry with no transport.
    pub fn new() -> TransportRegistry {
        TransportRegistry::default()
    }

    /// Adds (or replaces) the transport `name`.
    pub fn register(
        &mut self,
        name: &'static str,
        traits: TransportTraits,
        make: impl Fn(&TransportOptions) -> Result<Arc<dyn Transport>> + Send + Sync + 'static,
    ) -> &mut TransportRegistry {
        self.entries.insert(
            name,
            Arc::new(Entry {
                traits,
                make: Arc::new(make),
            }),
        );
        self
    }

    /// The transport `name`, configured for a device with `options`.
    ///
    /// # Errors
    /// [`Error::UnknownTransport`] for a name not registered, listing those that are; what the
    /// transport's own constructor returns (a malformed property).
    pub fn create(&self, name: &str, options: &TransportOptions) -> Result<Arc<dyn Transport>> {
        let entry = self.entry(name)?;
        (entry.make)(options)
    }

    /// The transport `name` with default options for `session`.
    ///
    /// # Errors
    /// As [`TransportRegistry::create`].
    pub fn create_default(&self, name: &str, session: &str) -> Result<Arc<dyn Transport>> {
        self.create(name, &TransportOptions::for_session(session))
    }

    /// What the transport `name` can do.
    ///
    /// # Errors
    /// [`Error::UnknownTransport`] for a name not registered.
    pub fn traits(&self, name: &str) -> Result<TransportTraits> {
        Ok(self.entry(name)?.traits)
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Each registered transport with the address schemes it takes
    /// ([`TransportTraits::schemes`]), by name.
    pub fn schemes(&self) -> Vec<(&'static str, &'static [&'static str])> {
        self.entries
            .iter()
            .map(|(name, entry)| (*name, entry.traits.schemes))
            .collect()
    }

    /// The device properties the registered transports read, sorted
    /// ([`TransportTraits::properties`]).
    pub fn property_keys(&self) -> Vec<&'static str> {
        let mut keys: Vec<&'static str> = self
            .entries
            .values()
            .flat_map(|entry| entry.traits.properties.iter().copied())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.keys().copied().collect()
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries
            .get(name)
            .map(Arc::as_ref)
            .ok_or_else(|| Error::UnknownTransport {
                name: name.to_owned(),
                available: if self.entries.is_empty() {
                    "none".to_owned()
                } else {
                    self.names().join(", ")
                },
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Nothing;

    #[async_trait::async_trait]
    impl Transport for Nothing {
        fn name(&self) -> &'static str {
            "nothing"
        }
        async fn create_socket(
            &self,
            config: &crate::ChannelConfig,
            _socket_name: &str,
        ) -> Result<Box<dyn crate::Socket>> {
            Err(Error::UnknownTransport {
                name: config.name.clone(),
                available: String::new(),
            })
        }
    }

    #[test]
    fn flags_read_fairmq_booleans_and_refuse_anything_else_naming_key_and_value() {
        let mut options = TransportOptions::for_session("s");
        for (text, flag) in [("true", true), ("1", true), ("Yes", true), ("on", true)] {
            options.properties.insert("k".to_owned(), text.to_owned());
            assert_eq!(options.flag("k").unwrap(), Some(flag), "{text}");
        }
        for text in ["false", "0", "no", "OFF"] {
            options.properties.insert("k".to_owned(), text.to_owned());
            assert_eq!(options.flag("k").unwrap(), Some(false), "{text}");
        }
        assert_eq!(options.flag("unset").unwrap(), None);
        options
            .properties
            .insert("k".to_owned(), "maybe".to_owned());
        let error = options.flag("k").expect_err("not a flag").to_string();
        assert!(
            error.contains('k') && error.contains("maybe") && error.contains("true or false"),
            "{error}"
        );
    }

    #[test]
    fn an_unknown_name_is_refused_naming_what_exists() {
        let mut registry = TransportRegistry::new();
        let error = registry
            .create_default("zeromq", "s")
            .expect_err("empty registry");
        assert_eq!(
            error.to_string(),
            "unknown transport \"zeromq\"; built in: none"
        );
        registry.register("b", TransportTraits::PLAIN, |_| Ok(Arc::new(Nothing)));
        registry.register("a", TransportTraits::PLAIN.lending_shared_memory(), |_| {
            Ok(Arc::new(Nothing))
        });
        let error = registry.create_default("c", "s").expect_err("not there");
        assert_eq!(error.to_string(), "unknown transport \"c\"; built in: a, b");
        assert_eq!(registry.names(), ["a", "b"]);
        assert!(registry.traits("a").expect("a").lends_shared_memory);
        assert!(!registry.traits("b").expect("b").lends_shared_memory);
        assert_eq!(
            registry.create_default("b", "s").expect("b").name(),
            "nothing"
        );
    }

    #[test]
    fn the_property_keys_are_every_transports_once_sorted() {
        let mut registry = TransportRegistry::new();
        assert!(registry.property_keys().is_empty());
        registry.register(
            "a",
            TransportTraits::PLAIN.reading(&["a-size", "b-x"]),
            |_| Ok(Arc::new(Nothing)),
        );
        registry.register(
            "b",
            TransportTraits::PLAIN.reading(&["b-x", "a-flag"]),
            |_| Ok(Arc::new(Nothing)),
        );
        registry.register("c", TransportTraits::PLAIN, |_| Ok(Arc::new(Nothing)));
        assert_eq!(registry.property_keys(), ["a-flag", "a-size", "b-x"]);
    }

    #[test]
    fn a_number_property_names_key_and_value_when_malformed() {
        let mut options = TransportOptions::for_session("s");
        assert_eq!(options.number("k").expect("absent"), None);
        options.properties.insert("k".to_owned(), " 42 ".to_owned());
        assert_eq!(options.number("k").expect("number"), Some(42));
        options.properties.insert("k".to_owned(), "-1".to_owned());
        let error = options.number("k").expect_err("negative").to_string();
        assert!(error.contains("k") && error.contains("-1"), "{error}");
    }
}
