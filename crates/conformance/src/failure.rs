//! Why a scenario failed, in words that name the transport's error and what was expected.

use std::error::Error as StdError;
use std::time::Duration;

use ferromq_core::{Error, SendError};

/// A scenario that did not hold.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// A call the scenario needed failed.
    #[error("{during}: {detail}")]
    Call {
        /// What the scenario was doing.
        during: String,
        /// The error with its chain of causes.
        detail: String,
    },
    /// Something happened that the contract excludes.
    #[error("{0}")]
    Expectation(String),
    /// A wait ran past the watchdog.
    #[error("stuck for {after:?} waiting for {what}")]
    Stuck {
        /// What it waited for.
        what: String,
        /// The watchdog's limit.
        after: Duration,
    },
}

impl Failure {
    /// Something the contract excludes happened.
    pub fn expectation(text: impl Into<String>) -> Failure {
        Failure::Expectation(text.into())
    }

    pub(crate) fn call(during: &str, error: &(dyn StdError + 'static)) -> Failure {
        Failure::Call {
            during: during.to_owned(),
            detail: ferromq_core::error_chain(error),
        }
    }
}

/// `.during("what")` on the results of channel calls.
pub(crate) trait During<T> {
    fn during(self, what: &str) -> Result<T, Failure>;
}

impl<T> During<T> for Result<T, Error> {
    fn during(self, what: &str) -> Result<T, Failure> {
        self.map_err(|error| Failure::call(what, &error))
    }
}

impl<T, M> During<T> for Result<T, SendError<M>> {
    fn during(self, what: &str) -> Result<T, Failure> {
        self.map_err(|failed| Failure::call(what, &failed.error))
    }
}
