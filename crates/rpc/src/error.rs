//! What can go wrong with a call, named by destination and handler.

use std::time::Duration;

use ferromq_core::Message;
use thiserror::Error;

use crate::wire::Status;

/// Why a call, its result or its acknowledgement did not come back as hoped.
///
/// Failures at the destination (no such handler, arguments that do not decode, a panicking
/// handler) come back to the caller as [`CallError::Remote`]; the destination keeps serving.
///
/// Non-exhaustive: a new way to fail (as `Lost` was) is not a breaking change; match the
/// variants you act on and keep a catch-all arm.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallError {
    /// The handler did not run, or did not finish, at the destination.
    #[error("device {destination}: handler {handler} {kind}: {cause}")]
    Remote {
        /// The member that failed the call.
        destination: String,
        /// The handler's name.
        handler: String,
        /// What went wrong.
        kind: RemoteFailure,
        /// The destination's words (the panic message, the decoding error, ...).
        cause: String,
    },
    /// No answer (result, acknowledgement, room in the destination's queue) within the timeout.
    #[error("device {destination} did not answer {handler} within {after:?}")]
    Timeout {
        /// The member that did not answer.
        destination: String,
        /// The handler called (or what was waited for).
        handler: String,
        /// The timeout.
        after: Duration,
    },
    /// The destination's queue holds `queued` calls, its bound ([`crate::WhenFull::Fail`]).
    #[error("device {destination} is full ({queued} calls queued): {handler} refused")]
    Full {
        /// The full member.
        destination: String,
        /// The handler called.
        handler: String,
        /// Calls queued for it.
        queued: usize,
    },
    /// The channel to the destination failed; calls to it fail from now on.
    #[error("device {destination} is unreachable: {cause}")]
    Unreachable {
        /// The member.
        destination: String,
        /// Why its channel failed.
        cause: String,
    },
    /// The destination is not a member of the group.
    #[error("no member {destination} in the group (members: {members})")]
    UnknownDestination {
        /// The index asked for.
        destination: String,
        /// The members there are.
        members: String,
    },
    /// The arguments could not be serialised, or the result could not be read.
    #[error("handler {handler}: {cause}")]
    Codec {
        /// The handler called.
        handler: String,
        /// The codec's error.
        cause: String,
    },
    /// The rpc node was shut down.
    #[error("the rpc node is shut down")]
    Stopped,
    /// Calls accepted for the destination that will never leave: its channel failed while
    /// the outlet held them, or a [`crate::CallWriter`] still held them when it could no longer
    /// hand them over. One such error per loss, in [`crate::Rpc::take_failures`]; calls among
    /// them that have a ticket (`call_return`, a confirmation) also fail through it, with
    /// [`CallError::Unreachable`]. Frames the failed channel had taken and its peer never read
    /// are not in it: its close counts them, in the member's shutdown error.
    #[error("device {destination}: {n_calls} accepted call(s) will not leave: {cause}")]
    Lost {
        /// The member the calls were for.
        destination: String,
        /// How many: calls, and answers to the destination's own calls queued among them.
        n_calls: u64,
        /// Why (the channel's failure, or that the node shut down).
        cause: String,
    },
}

/// A boxed error ([`crate::CallWriter::call`]'s) taken out of its box, so that `?` works in a
/// function that returns `Result<_, CallError>`.
impl From<Box<CallError>> for CallError {
    fn from(boxed: Box<CallError>) -> CallError {
        *boxed
    }
}

/// What went wrong at the destination (non-exhaustive, as [`CallError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemoteFailure {
    /// The destination has no handler with this id.
    UnknownHandler,
    /// The arguments did not decode as the handler's argument type.
    BadArguments,
    /// The handler panicked.
    Panicked,
    /// The frame the call came in was malformed.
    BadFrame,
}

impl RemoteFailure {
    pub(crate) fn of(status: Status) -> Option<RemoteFailure> {
        match status {
            Status::Ok => None,
            Status::UnknownHandler => Some(RemoteFailure::UnknownHandler),
            Status::BadArguments => Some(RemoteFailure::BadArguments),
            Status::Panicked => Some(RemoteFailure::Panicked),
            Status::BadFrame => Some(RemoteFailure::BadFrame),
        }
    }
}

impl std::fmt::Display for RemoteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RemoteFailure::UnknownHandler => "is not registered",
            RemoteFailure::BadArguments => "got arguments it cannot decode",
            RemoteFailure::Panicked => "panicked",
            RemoteFailure::BadFrame => "got a malformed frame",
        })
    }
}

/// A call refused at once because its destination's queue was full ([`crate::WhenFull::Fail`]):
/// the arguments and buffer come back untouched.
#[derive(Debug)]
pub struct Refused<A> {
    /// The call's arguments, untouched.
    pub args: A,
    /// The call's buffer, untouched.
    pub buffer: Option<Message>,
    /// Boxed: a refused call is the rare path, and the `Result` stays small.
    pub error: Box<CallError>,
}

impl<A> std::fmt::Display for Refused<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "call refused: {}", self.error)
    }
}

impl<A: std::fmt::Debug> std::error::Error for Refused<A> {}
