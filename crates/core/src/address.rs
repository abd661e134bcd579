//! Channel addresses: `tcp://host:port`, `tcp://*:port`, `ipc://path`, `inproc://name`, and
//! `verbs://host:port` (the ofi transport over RDMA).
//!
//! An [`Address`] is parsed once, when a channel is configured, so that every transport sees
//! the same validated value and every malformed address is reported with its own
//! [`AddressError`] before any socket exists.
//!
//! Port `0` means "pick a free port": the transport binds an ephemeral port and reports the
//! address actually bound, which is how tests and the topology launcher avoid fixed ports.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The longest ipc path: Linux's `sun_path` has 108 bytes, one of them the terminating NUL.
pub const MAX_IPC_PATH: usize = 107;

/// Why an address string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// The string is empty.
    #[error("address is empty")]
    Empty,
    /// No `scheme://` prefix.
    #[error("address {0:?} has no scheme: expected tcp://, ipc://, inproc:// or verbs://")]
    MissingScheme(String),
    /// A scheme no transport knows.
    #[error(
        "address {address:?} has unknown scheme {scheme:?}: expected tcp, ipc, inproc or verbs"
    )]
    UnknownScheme {
        /// The whole address.
        address: String,
        /// The scheme found.
        scheme: String,
    },
    /// `tcp://host` without `:port`.
    #[error("address {0:?} has no port: expected tcp://host:port")]
    MissingPort(String),
    /// The port is not a number in 0..=65535.
    #[error("address {address:?} has invalid port {port:?}: expected a number from 0 to 65535")]
    InvalidPort {
        /// The whole address.
        address: String,
        /// The port text found.
        port: String,
    },
    /// `tcp://:5555`.
    #[error("address {0:?} has an empty host: use * to bind every interface")]
    EmptyHost(String),
    /// `ipc://` with nothing after it.
    #[error("address {0:?} has an empty path")]
    EmptyPath(String),
    /// An ipc path longer than a unix socket's address holds (`sun_path`: 108 bytes with its
    /// terminating NUL), which every bind and connect would refuse.
    #[error(
        "address {address:?} has a path of {len} bytes: a unix socket's path holds at most {MAX_IPC_PATH}"
    )]
    IpcPathTooLong {
        /// The whole address.
        address: String,
        /// The path's length in bytes.
        len: usize,
    },
    /// `inproc://` with nothing after it.
    #[error("address {0:?} has an empty name")]
    EmptyName(String),
    /// A host with characters no host name or IP literal has.
    #[error("address {address:?} has invalid host {host:?}")]
    InvalidHost {
        /// The whole address.
        address: String,
        /// The host text found.
        host: String,
    },
}

/// The host part of a tcp address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TcpHost {
    /// `*`: every interface (bind only).
    Any,
    /// A host name or an IP literal (IPv6 without brackets).
    Name(String),
}

/// A parsed channel address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Address {
    /// `tcp://host:port`; port 0 asks the transport to pick a free one.
    Tcp {
        /// Host to bind or connect to.
        host: TcpHost,
        /// Port, 0 for "any free port".
        port: u16,
    },
    /// `ipc://path`: a unix-domain socket at `path`.
    Ipc {
        /// Socket file path.
        path: PathBuf,
    },
    /// `inproc://name`: devices in the same process.
    Inproc {
        /// Name shared by the binder and its connectors.
        name: String,
    },
    /// `verbs://host:port`: the ofi transport over RDMA (libfabric's verbs provider); the
    /// host names the InfiniBand or RoCE interface.
    Verbs {
        /// Interface to bind or host to connect to.
        host: TcpHost,
        /// Port of the side channel, 0 for "any free port".
        port: u16,
    },
}

impl Address {
    /// Parses an address string.
    ///
    /// # Errors
    /// Each malformed form has its own [`AddressError`] variant naming the culprit.
    ///
    /// # Examples
    /// ```
    /// use ferromq_core::Address;
    /// let address: Address = "tcp://127.0.0.1:0".parse().unwrap();
    /// assert!(address.wants_free_port());
    /// assert!("udp://x:1".parse::<Address>().is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Address, AddressError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(AddressError::Empty);
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(AddressError::MissingScheme(text.to_owned()));
        };
        match scheme {
            "tcp" => parse_tcp(text, rest),
            "verbs" => match parse_tcp(text, rest)? {
                Address::Tcp { host, port } => Ok(Address::Verbs { host, port }),
                _ => unreachable!("parse_tcp gives tcp addresses"),
            },
            "ipc" => {
                if rest.is_empty() {
                    return Err(AddressError::EmptyPath(text.to_owned()));
                }
                if rest.len() > MAX_IPC_PATH {
                    return Err(AddressError::IpcPathTooLong {
                        address: text.to_owned(),
                        len: rest.len(),
                    });
                }
                Ok(Address::Ipc {
                    path: PathBuf::from(rest),
                })
            }
            "inproc" => {
                if rest.is_empty() {
                    return Err(AddressError::EmptyName(text.to_owned()));
                }
                Ok(Address::Inproc {
                    name: rest.to_owned(),
                })
            }
            other => Err(AddressError::UnknownScheme {
                address: text.to_owned(),
                scheme: other.to_owned(),
            }),
        }
    }

    /// True for a tcp address with port 0, which the transport replaces by a free port.
    pub fn wants_free_port(&self) -> bool {
        matches!(
            self,
            Address::Tcp { port: 0, .. } | Address::Verbs { port: 0, .. }
        )
    }

    /// The scheme, as written in the address (`tcp`, `ipc`, `inproc`, `verbs`).
    pub fn scheme(&self) -> &'static str {
        match self {
            Address::Tcp { .. } => "tcp",
            Address::Verbs { .. } => "verbs",
            Address::Ipc { .. } => "ipc",
            Address::Inproc { .. } => "inproc",
        }
    }

    /// The address a peer on this host should connect to: a `*` host becomes `127.0.0.1`.
    pub fn for_local_connect(&self) -> Address {
        match self {
            Address::Tcp {
                host: TcpHost::Any,
                port,
            } => Address::Tcp {
                host: TcpHost::Name("127.0.0.1".to_owned()),
                port: *port,
            },
            Address::Verbs {
                host: TcpHost::Any,
                port,
            } => Address::Verbs {
                host: TcpHost::Name("127.0.0.1".to_owned()),
                port: *port,
            },
            other => other.clone(),
        }
    }
}

fn parse_tcp(text: &str, rest: &str) -> Result<Address, AddressError> {
    // IPv6 literals may be written in brackets: tcp://[::1]:5555.
    let (host, port) = if let Some(after_bracket) = rest.strip_prefix('[') {
        let Some((host, after)) = after_bracket.split_once(']') else {
            return Err(AddressError::InvalidHost {
                address: text.to_owned(),
                host: rest.to_owned(),
            });
        };
        let Some(port) = after.strip_prefix(':') else {
            return Err(AddressError::MissingPort(text.to_owned()));
        };
        (host, port)
    } else {
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err(AddressError::MissingPort(text.to_owned()));
        };
        (host, port)
    };
    if host.is_empty() {
        return Err(AddressError::EmptyHost(text.to_owned()));
    }
    let valid_host_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    if host != "*" && !host.chars().all(valid_host_char) {
        return Err(AddressError::InvalidHost {
            address: text.to_owned(),
            host: host.to_owned(),
        });
    }
    if port.is_empty() {
        return Err(AddressError::MissingPort(text.to_owned()));
    }
    let port: u16 = port.parse().map_err(|_| AddressError::InvalidPort {
        address: text.to_owned(),
        port: port.to_owned(),
    })?;
    let host = if host == "*" {
        TcpHost::Any
    } else {
        TcpHost::Name(host.to_owned())
    };
    Ok(Address::Tcp { host, port })
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Address::parse(text)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp {
                host: TcpHost::Any,
                port,
            } => write!(f, "tcp://*:{port}"),
            Address::Tcp {
                host: TcpHost::Name(host),
                port,
            } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            Address::Tcp {
                host: TcpHost::Name(host),
                port,
            } => write!(f, "tcp://{host}:{port}"),
            Address::Ipc { path } => write!(f, "ipc://{}", path.display()),
            Address::Inproc { name } => write!(f, "inproc://{name}"),
            Address::Verbs { host, port } => {
                let tcp = Address::Tcp {
                    host: host.clone(),
                    port: *port,
                }
                .to_string();
                write!(f, "verbs{}", &tcp[3..])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_ok(text: &str, expected: Address) {
        let parsed = Address::parse(text).unwrap();
        assert_eq!(parsed, expected, "{text}");
        // Display gives back something that parses to the same value.
        assert_eq!(Address::parse(&parsed.to_string()).unwrap(), expected);
    }

    fn check_err(text: &str, expected: AddressError) {
        assert_eq!(Address::parse(text).unwrap_err(), expected, "{text}");
    }

    fn name(host: &str) -> TcpHost {
        TcpHost::Name(host.to_owned())
    }

    #[test]
    fn verbs_addresses_parse_like_tcp() {
        check_ok(
            "verbs://10.0.0.1:5555",
            Address::Verbs {
                host: name("10.0.0.1"),
                port: 5555,
            },
        );
        check_ok(
            "verbs://*:0",
            Address::Verbs {
                host: TcpHost::Any,
                port: 0,
            },
        );
        assert!(Address::parse("verbs://*:0").unwrap().wants_free_port());
        assert_eq!(
            Address::parse("verbs://*:7")
                .unwrap()
                .for_local_connect()
                .to_string(),
            "verbs://127.0.0.1:7"
        );
        check_err(
            "verbs://host",
            AddressError::MissingPort("verbs://host".to_owned()),
        );
    }

    #[test]
    fn valid_addresses() {
        check_ok(
            "tcp://127.0.0.1:5555",
            Address::Tcp {
                host: name("127.0.0.1"),
                port: 5555,
            },
        );
        check_ok(
            "tcp://*:5555",
            Address::Tcp {
                host: TcpHost::Any,
                port: 5555,
            },
        );
        check_ok(
            "tcp://localhost:0",
            Address::Tcp {
                host: name("localhost"),
                port: 0,
            },
        );
        check_ok(
            "tcp://[::1]:7",
            Address::Tcp {
                host: name("::1"),
                port: 7,
            },
        );
        check_ok(
            "ipc:///tmp/ferromq-x",
            Address::Ipc {
                path: "/tmp/ferromq-x".into(),
            },
        );
        check_ok(
            "ipc://@abstract",
            Address::Ipc {
                path: "@abstract".into(),
            },
        );
        check_ok(
            "inproc://data",
            Address::Inproc {
                name: "data".into(),
            },
        );
    }

    #[test]
    fn every_malformed_address_has_its_own_error() {
        check_err("", AddressError::Empty);
        check_err(
            "localhost:5555",
            AddressError::MissingScheme("localhost:5555".into()),
        );
        check_err(
            "udp://h:1",
            AddressError::UnknownScheme {
                address: "udp://h:1".into(),
                scheme: "udp".into(),
            },
        );
        check_err(
            "tcp://localhost",
            AddressError::MissingPort("tcp://localhost".into()),
        );
        check_err(
            "tcp://localhost:",
            AddressError::MissingPort("tcp://localhost:".into()),
        );
        check_err(
            "tcp://localhost:70000",
            AddressError::InvalidPort {
                address: "tcp://localhost:70000".into(),
                port: "70000".into(),
            },
        );
        check_err(
            "tcp://localhost:http",
            AddressError::InvalidPort {
                address: "tcp://localhost:http".into(),
                port: "http".into(),
            },
        );
        check_err("tcp://:5555", AddressError::EmptyHost("tcp://:5555".into()));
        check_err(
            "tcp://ho st:1",
            AddressError::InvalidHost {
                address: "tcp://ho st:1".into(),
                host: "ho st".into(),
            },
        );
        check_err("ipc://", AddressError::EmptyPath("ipc://".into()));
        check_err("inproc://", AddressError::EmptyName("inproc://".into()));
        // Bound only at BINDING, and refused there by the kernel, before this check.
        let longest = format!("ipc:///{}", "p".repeat(MAX_IPC_PATH - 1));
        assert!(Address::parse(&longest).is_ok());
        let too_long = format!("{longest}p");
        check_err(
            &too_long,
            AddressError::IpcPathTooLong {
                address: too_long.clone(),
                len: MAX_IPC_PATH + 1,
            },
        );
    }

    #[test]
    fn free_port_and_local_connect() {
        let any = Address::parse("tcp://*:0").unwrap();
        assert!(any.wants_free_port());
        assert_eq!(any.for_local_connect().to_string(), "tcp://127.0.0.1:0");
        assert!(!Address::parse("ipc:///x").unwrap().wants_free_port());
    }
}
