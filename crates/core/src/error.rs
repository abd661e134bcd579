//! Errors of channels and transports.
//!
//! Every error names its culprit first, the way a user reads a log:
//! `channel "data[0]" (push, tcp://127.0.0.1:5555): address in use`. A failed send hands the
//! message back inside [`SendError`], so nothing the caller still owns is ever lost silently.

use std::fmt;
use std::time::Duration;

use crate::address::AddressError;
use crate::config::{ConfigError, SocketType};

/// Identifies a channel in an error: its name, type and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelLabel {
    /// Channel name (`data`, `data[1]`).
    pub name: String,
    /// Its socket type.
    pub socket_type: SocketType,
    /// Its address, when it has one yet.
    pub address: Option<String>,
}

impl ChannelLabel {
    /// A label without an address.
    pub fn new(name: impl Into<String>, socket_type: SocketType) -> Self {
        ChannelLabel {
            name: name.into(),
            socket_type,
            address: None,
        }
    }

    /// The same label with an address.
    pub fn with_address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }
}

impl fmt::Display for ChannelLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.address {
            Some(address) => write!(
                f,
                "channel {:?} ({}, {address})",
                self.name, self.socket_type
            ),
            None => write!(f, "channel {:?} ({})", self.name, self.socket_type),
        }
    }
}

/// Boxed lower-level error kept as a `#[source]`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong on a channel or in a transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No message arrived or left within the timeout.
    #[error("{channel}: timed out after {after:?}")]
    Timeout {
        /// The channel.
        channel: ChannelLabel,
        /// The timeout that ran out.
        after: Duration,
    },
    /// Messages that `send` had accepted were not delivered when the channel closed: the peer
    /// took none of them for `linger` (or refused them). A device that ends with this error has
    /// failed, whatever else went well.
    #[error("{channel}: {n_messages} message(s) accepted by send were not delivered ({reason})")]
    Undelivered {
        /// The channel.
        channel: ChannelLabel,
        /// How many accepted messages were lost.
        n_messages: u64,
        /// Why: no progress for `linger`, refused by the peer, ...
        reason: String,
    },
    /// The channel was closed (device shutdown) while the call waited.
    #[error("{channel}: interrupted, the channel is closed")]
    Interrupted {
        /// The channel.
        channel: ChannelLabel,
    },
    /// The peer went away and the pattern cannot go on without it.
    #[error("{channel}: peer gone: {reason}")]
    PeerGone {
        /// The channel.
        channel: ChannelLabel,
        /// What was observed.
        reason: String,
    },
    /// A message larger than the transport or the peer accepts.
    #[error("{channel}: message of {size} bytes is larger than the limit of {limit} bytes")]
    MessageTooLarge {
        /// The channel.
        channel: ChannelLabel,
        /// Size of the message.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The address did not parse.
    #[error("{channel}: bad address")]
    BadAddress {
        /// The channel.
        channel: ChannelLabel,
        /// Why the address was refused.
        #[source]
        source: AddressError,
    },
    /// The address is valid but cannot be used by this transport or this operation.
    #[error("{channel}: address {address} cannot be used: {reason}")]
    UnsupportedAddress {
        /// The channel.
        channel: ChannelLabel,
        /// The address.
        address: String,
        /// Why.
        reason: &'static str,
    },
    /// Another socket already binds the address.
    #[error("{channel}: address in use")]
    AddressInUse {
        /// The channel, with the address.
        channel: ChannelLabel,
    },
    /// Binding failed for another reason.
    #[error("{channel}: bind failed")]
    Bind {
        /// The channel, with the address.
        channel: ChannelLabel,
        /// The transport's error.
        #[source]
        source: BoxError,
    },
    /// Connecting failed.
    #[error("{channel}: connect failed")]
    Connect {
        /// The channel, with the address.
        channel: ChannelLabel,
        /// The transport's error.
        #[source]
        source: BoxError,
    },
    /// The operation does not exist for this socket type (a receive on a push channel).
    #[error("{channel}: cannot {operation} on a {} socket", channel.socket_type)]
    WrongSocketType {
        /// The channel.
        channel: ChannelLabel,
        /// The operation tried.
        operation: &'static str,
    },
    /// A send of a message without parts: there is nothing to deliver (FairMQ's sockets refuse
    /// an empty vector of parts too), and taking it would count a message nobody receives.
    #[error("{channel}: cannot send a message of no parts (a message has at least one)")]
    EmptyMessage {
        /// The channel.
        channel: ChannelLabel,
    },
    /// The channel's transport cannot do this for its socket type (a send reserved ahead on a
    /// channel whose transport cannot promise room before the send).
    #[error("{channel}: cannot {operation}: {reason}")]
    Unsupported {
        /// The channel.
        channel: ChannelLabel,
        /// The operation tried.
        operation: &'static str,
        /// Why not, and what to do instead.
        reason: &'static str,
    },
    /// Encoding or decoding a typed payload failed.
    #[error("{channel}: payload codec failed")]
    Codec {
        /// The channel.
        channel: ChannelLabel,
        /// Why.
        #[source]
        source: CodecError,
    },
    /// The channel configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No transport of this name is built in.
    #[error("unknown transport {name:?}; built in: {available}")]
    UnknownTransport {
        /// The name asked for.
        name: String,
        /// The names that exist in this build.
        available: String,
    },
    /// The two ends of the channel use different transports (one shmem, one zeromq, say).
    #[error(
        "{channel}: the peer uses the {peer_transport} transport; configure the same transport on both ends"
    )]
    TransportMismatch {
        /// The channel.
        channel: ChannelLabel,
        /// What the peer uses.
        peer_transport: &'static str,
    },
    /// The peer uses the same shared-memory transport but belongs to another session.
    #[error(
        "{channel}: the peer belongs to another shmem session; use the same --session on both ends"
    )]
    SessionMismatch {
        /// The channel.
        channel: ChannelLabel,
    },
    /// A transport could not provide memory for a message (a full shared-memory segment).
    #[error("{transport} transport: cannot allocate a message")]
    Allocation {
        /// The transport's name.
        transport: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The transport failed in a way the variants above do not describe.
    #[error("{channel}: transport error")]
    Transport {
        /// The channel.
        channel: ChannelLabel,
        /// The transport's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// The channel the error is about, when there is one.
    pub fn channel(&self) -> Option<&ChannelLabel> {
        match self {
            Error::Timeout { channel, .. }
            | Error::Interrupted { channel }
            | Error::Undelivered { channel, .. }
            | Error::PeerGone { channel, .. }
            | Error::MessageTooLarge { channel, .. }
            | Error::BadAddress { channel, .. }
            | Error::UnsupportedAddress { channel, .. }
            | Error::AddressInUse { channel }
            | Error::Bind { channel, .. }
            | Error::Connect { channel, .. }
            | Error::WrongSocketType { channel, .. }
            | Error::Unsupported { channel, .. }
            | Error::EmptyMessage { channel }
            | Error::Codec { channel, .. }
            | Error::TransportMismatch { channel, .. }
            | Error::SessionMismatch { channel }
            | Error::Transport { channel, .. } => Some(channel),
            Error::Config(_) | Error::UnknownTransport { .. } | Error::Allocation { .. } => None,
        }
    }

    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True for [`Error::Interrupted`].
    pub fn is_interrupted(&self) -> bool {
        matches!(self, Error::Interrupted { .. })
    }
}

/// What a receiving socket's `close` returns: `sent`, the result of closing its sending side,
/// with `n_unread` messages that reached it and that it closed before taking (`why` says how
/// they reached it). Both losses make one [`Error::Undelivered`] with their sum (a pair loses
/// both ways); `Ok` when there are none. Another error of `sent` is returned as it is: a caller
/// whose sending side can fail otherwise says the unread loss itself.
pub fn with_unread_at_close(
    sent: Result<()>,
    channel: &ChannelLabel,
    n_unread: u64,
    why: &str,
) -> Result<()> {
    if n_unread == 0 {
        return sent;
    }
    match sent {
        Ok(()) => Err(Error::Undelivered {
            channel: channel.clone(),
            n_messages: n_unread,
            reason: why.to_owned(),
        }),
        Err(Error::Undelivered {
            channel,
            n_messages,
            reason,
        }) => Err(Error::Undelivered {
            channel,
            n_messages: n_messages + n_unread,
            reason: format!("{n_messages} sent: {reason}; {n_unread} received: {why}"),
        }),
        Err(error) => Err(error),
    }
}

/// A typed payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// serde_json failed.
    #[error("json codec")]
    Json(#[source] serde_json::Error),
    /// postcard failed.
    #[error("postcard codec")]
    Postcard(#[source] postcard::Error),
    /// A plain-old-data payload of the wrong size.
    #[error("payload of {actual} bytes cannot be a {type_name} of {expected} bytes")]
    PodSize {
        /// Name of the Rust type.
        type_name: &'static str,
        /// Its size.
        expected: usize,
        /// Size of the message.
        actual: usize,
    },
    /// A text payload that is not UTF-8.
    #[error("payload is not valid UTF-8")]
    Utf8(#[source] std::str::Utf8Error),
}

/// A send that failed, with the message it did not send.
///
/// Like tokio's `SendError<T>`: the caller gets its message back and decides whether to retry,
/// reroute or drop it.
#[derive(Debug)]
pub struct SendError<T> {
    /// Why the send failed.
    pub error: Error,
    /// The message that was not sent.
    pub message: T,
}

impl<T> SendError<T> {
    /// Pairs an error with the unsent message.
    pub fn new(error: Error, message: T) -> Self {
        SendError { error, message }
    }

    /// Converts the carried message.
    pub fn map<U>(self, convert: impl FnOnce(T) -> U) -> SendError<U> {
        SendError {
            error: self.error,
            message: convert(self.message),
        }
    }

    /// The error without the message (the message is dropped).
    pub fn into_error(self) -> Error {
        self.error
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "send failed: {}", self.error)
    }
}

impl<T: fmt::Debug> std::error::Error for SendError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Result of channel and transport calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its sources, `: `-separated on one line: how a log line or an exit message
/// shows a chain of causes.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_culprit_first() {
        let channel =
            ChannelLabel::new("data[0]", SocketType::Push).with_address("tcp://127.0.0.1:5555");
        let error = Error::AddressInUse { channel };
        assert_eq!(
            error.to_string(),
            r#"channel "data[0]" (push, tcp://127.0.0.1:5555): address in use"#
        );
        let timeout = Error::Timeout {
            channel: ChannelLabel::new("data", SocketType::Pull),
            after: Duration::from_millis(5),
        };
        assert!(timeout.is_timeout());
        assert_eq!(
            timeout.to_string(),
            r#"channel "data" (pull): timed out after 5ms"#
        );
    }

    /// A receiving socket's close: what it lost receiving joins what it lost sending (a pair's
    /// two ways) into one count; with nothing unread the sending side's result stands.
    #[test]
    fn unread_messages_at_close_join_the_sending_sides_loss() {
        let channel = ChannelLabel::new("data", SocketType::Pair);
        let unsent = || Error::Undelivered {
            channel: channel.clone(),
            n_messages: 2,
            reason: "no peer".to_owned(),
        };
        assert!(with_unread_at_close(Ok(()), &channel, 0, "unread").is_ok());
        match with_unread_at_close(Err(unsent()), &channel, 0, "unread") {
            Err(Error::Undelivered { n_messages: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
        match with_unread_at_close(Ok(()), &channel, 3, "unread") {
            Err(Error::Undelivered {
                n_messages: 3,
                reason,
                ..
            }) => assert_eq!(reason, "unread"),
            other => panic!("{other:?}"),
        }
        match with_unread_at_close(Err(unsent()), &channel, 3, "unread") {
            Err(Error::Undelivered {
                n_messages: 5,
                reason,
                ..
            }) => assert_eq!(reason, "2 sent: no peer; 3 received: unread"),
            other => panic!("{other:?}"),
        }
        let interrupted = Error::Interrupted {
            channel: channel.clone(),
        };
        assert!(
            with_unread_at_close(Err(interrupted), &channel, 3, "unread")
                .is_err_and(|error| error.is_interrupted())
        );
    }

    #[test]
    fn send_error_returns_the_message() {
        let error = SendError::new(
            Error::Interrupted {
                channel: ChannelLabel::new("d", SocketType::Push),
            },
            vec![1u8, 2, 3],
        );
        let mapped = error.map(|message| message.len());
        assert_eq!(mapped.message, 3);
        assert!(mapped.error.is_interrupted());
    }
}
