//! Errors of devices and their control.

use std::time::Duration;

use ferromq_core::BoxError;

use crate::state::{State, Transition};

/// What went wrong in a device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The state machine has no such edge.
    #[error("transition {transition} is not allowed in state {state}")]
    InvalidTransition {
        /// The state the device was in.
        state: State,
        /// The transition refused.
        transition: Transition,
    },
    /// A device hook (`init`, `run`, ...) failed; the device is in ERROR.
    #[error("device {device:?}: {hook} failed in state {state}")]
    Hook {
        /// Device id.
        device: String,
        /// Hook name.
        hook: &'static str,
        /// State it ran in.
        state: State,
        /// The hook's error.
        #[source]
        source: BoxError,
    },
    /// The launcher on another host fell silent (see `control::ControlEndpoint::heartbeat`):
    /// the device went down without being asked, its work cut short.
    #[error("device {device:?}: the launcher fell silent for {silent_for:?}; the device went down")]
    LauncherSilent {
        /// Device id.
        device: String,
        /// How long it waited.
        silent_for: Duration,
    },
    /// The launcher on another host fell silent (see `control::ControlEndpoint::heartbeat`)
    /// and the device did not get down to EXITING within the same time again: the caller
    /// ends the process, since nobody is left to stop it, and what its channels still hold
    /// goes with it unclosed: `unsent` says how much, channel by channel.
    #[error(
        "device {device:?}: the launcher fell silent for {silent_for:?} and the device did not go down within {silent_for:?} more{}",
        unsent_at_end(unsent)
    )]
    LauncherGone {
        /// Device id.
        device: String,
        /// The heartbeat limit.
        silent_for: Duration,
        /// Channels whose sends had accepted messages not handed on yet, with how many (their
        /// counters' `queued`, as recent as each transport keeps it): what may be lost when
        /// the process ends.
        unsent: Vec<(String, u64)>,
    },
    /// A channel operation failed.
    #[error(transparent)]
    Channel(#[from] ferromq_core::Error),
    /// A [`ChannelId`](crate::ChannelId) resolved before the device's channels were made
    /// again.
    #[error(
        "device {device:?}: a channel handle from before its channels were made again (RESET DEVICE); resolve it again with channel_id in init_task"
    )]
    StaleChannel {
        /// Device id.
        device: String,
    },
    /// No channel of that name.
    #[error("device {device:?} has no channel {name:?}; its channels: {available}")]
    UnknownChannel {
        /// Device id.
        device: String,
        /// The name asked for.
        name: String,
        /// The names it has.
        available: String,
    },
    /// A socket of a type that cannot do what the device does on its channel (a sampler's
    /// `data` configured as pull, or as rep, which sends only replies).
    #[error(
        "device {device:?}: channel {channel:?} is a {socket_type} socket, {}",
        role_mismatch(*socket_type, action)
    )]
    ChannelRole {
        /// Device id.
        device: String,
        /// The socket's name.
        channel: String,
        /// Its type.
        socket_type: ferromq_core::SocketType,
        /// `send` or `receive`.
        action: &'static str,
    },
    /// Two channels of one name.
    #[error("device {device:?}: channel {name:?} is configured twice")]
    DuplicateChannel {
        /// Device id.
        device: String,
        /// The channel's name.
        name: String,
    },
    /// A property is missing or of the wrong form.
    #[error("device {device:?}: property {key:?} {problem}")]
    Property {
        /// Device id.
        device: String,
        /// Property key.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// A FairMQ JSON configuration could not be read.
    #[error("{path}: {problem}")]
    MqConfig {
        /// The file.
        path: String,
        /// What is wrong, with the line and column where known.
        problem: String,
    },
    /// The device task ended; its controller cannot reach it any more.
    #[error("device {device:?} is gone")]
    DeviceGone {
        /// Device id.
        device: String,
    },
    /// Waiting for a state took too long.
    #[error("device {device:?} did not reach {wanted} within {timeout_ms} ms (it is {current})")]
    WaitTimeout {
        /// Device id.
        device: String,
        /// State waited for.
        wanted: State,
        /// State it is in.
        current: State,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The device stopped without reaching the awaited state (it ended or failed first).
    #[error("device {device:?} ended in {current} before reaching {wanted}")]
    StateUnreachable {
        /// Device id.
        device: String,
        /// State waited for.
        wanted: State,
        /// Where it ended.
        current: State,
    },
    /// The device's work was interrupted (a signal or a controller asked it to abort).
    #[error("device {device:?} interrupted in {state}: {reason}")]
    Interrupted {
        /// Device id.
        device: String,
        /// State it was in.
        state: State,
        /// Why.
        reason: String,
    },
    /// The device failed (`failure`), and closing the channels the failure left open lost
    /// messages too: what `send` had accepted and could not deliver within `linger`, or what
    /// reached a receiver and was not taken, each with its channel and count. The text is the
    /// failure's whole chain, then the losses (no `source`: a chain walker would put the
    /// losses first).
    #[error(
        "{}; then, closing its channels: {}",
        ferromq_core::error_chain(.failure.as_ref()),
        joined(.losses)
    )]
    FailedThenLost {
        /// What moved the device to ERROR.
        failure: Box<DeviceError>,
        /// Each channel's close error, [`ferromq_core::Error::Undelivered`] mostly.
        losses: Vec<ferromq_core::Error>,
    },
    /// The external control endpoint failed.
    #[error("control endpoint {address}: {problem}")]
    Control {
        /// Its address.
        address: String,
        /// What failed.
        problem: String,
    },
}

/// Errors in one line, `; ` between them.
fn joined(errors: &[ferromq_core::Error]) -> String {
    errors
        .iter()
        .map(|error| ferromq_core::error_chain(error))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a socket of `socket_type` cannot do of `action` (`send`, `receive`, `request`,
/// `answer`), and what the device does: a req or rep socket sends and receives, but only in
/// turn, so "cannot send" would be wrong of it.
fn role_mismatch(socket_type: ferromq_core::SocketType, action: &str) -> String {
    use ferromq_core::SocketType::{Rep, Req};
    match (socket_type, action) {
        (Rep, "send") => "which sends only replies, one per request it received, and the device \
                          sends unasked on it"
            .to_owned(),
        (Req, "send") => "which sends a request only once the last one's reply came, and the \
                          device sends one message after another on it"
            .to_owned(),
        (Req, "receive") => "which receives only the replies to its own requests, and the \
                             device receives without asking on it"
            .to_owned(),
        (Rep, "receive") => "which takes a request only once it answered the last, and the \
                             device receives without answering on it"
            .to_owned(),
        _ => format!("which cannot {action}, and the device {action}s on it"),
    }
}

/// Result of device operations.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// What [`DeviceError::LauncherGone`] says of the messages its process ends with: nothing when
/// no channel held any.
fn unsent_at_end(unsent: &[(String, u64)]) -> String {
    if unsent.is_empty() {
        return String::new();
    }
    let total: u64 = unsent.iter().map(|(_, n)| n).sum();
    let channels: Vec<String> = unsent
        .iter()
        .map(|(channel, n)| format!("{channel:?}: {n}"))
        .collect();
    format!(
        "; its channels had accepted about {total} messages not handed on yet ({}), which may be \
         lost with the process",
        channels.join(", ")
    )
}
