//! One conformance suite over [`&dyn Transport`](ferromq_core::Transport), run against every
//! ferromq transport: a transport is done when the suite passes for it.
//!
//! The suite is written once, against the [`Channel`](ferromq_core::Channel) API device code
//! uses, and says what every transport promises: every pattern (push/pull, pair, req/rep,
//! pub/sub), multipart with empty parts, order, sizes from 0 B to 64 MiB, back-pressure (a stalled
//! receiver holds the sender and nothing is lost), timeouts that hand the message back, cancelled
//! receives that lose nothing, reserved sends that never wait and cancelled reservations that
//! lose nothing, a late binder, linger on close, a receiver closing with messages it did not
//! take (it reports them), an address bound twice, a peer of
//! the wrong pattern, and, in separate processes, a sender that exits right after sending, a
//! receiver killed mid-stream and a sender killed mid-stream.
//!
//! Each transport's test target (this crate's `tests/`) is a few lines: a [`Suite`] naming the
//! transport, how to make one for a trial, which addresses it binds and which patterns it refuses
//! by design. [`Suite::run`] turns the scenarios into test trials (one tokio runtime each) and,
//! when the binary was started as a child role, runs that role instead: multi-process scenarios
//! re-execute the test binary, as the other multi-process tests of the workspace do.
//!
//! # Place in the graph
//! Depends on `ferromq-core` only; the transports are dev-dependencies of its test targets, so
//! nothing in the product depends on this crate.
//!
//! # Timing
//! No scenario asserts how fast something happened. Every wait runs under a watchdog
//! ([`WATCHDOG`]) that fails the scenario naming what it waited for, so a hang is a failure with
//! a reason, not a stuck CI job. Short timeouts appear only where the property is the timeout
//! itself (a receive with nothing to receive must end).
//!
//! # Cleanup
//! Each trial gets its own session name and ipc paths; they are removed when the trial ends,
//! passed or failed, and [`Suite::cleanup`] runs the transport's own cleanup (shared memory).
//! Children are killed when their handle drops.
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use ferromq_conformance::{AddressScheme, Suite};
//! // The transport under test: here the zeromq one (what `tests/zeromq_tcp.rs` runs).
//! use ferromq_zmq::ZmqTransport;
//! fn main() {
//!     Suite::new("zeromq-tcp", AddressScheme::Tcp, |_trial| Arc::new(ZmqTransport::new())).run();
//! }
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

/// A scenario entry from an `async fn(Arc<Fixture>) -> Result<(), Failure>` of that name.
macro_rules! scenario {
    ($name:ident) => {
        $crate::Scenario {
            name: stringify!($name),
            check: |fixture| -> $crate::ScenarioFuture { Box::pin($name(fixture)) },
        }
    };
}

mod failure;
mod fixture;
mod payload;
mod processes;
mod scenarios;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferromq_core::{SocketType, Transport};
use libtest_mimic::{Arguments, Trial};

pub use failure::Failure;
pub use fixture::{Fixture, TrialEnv};

/// The longest any single wait of a scenario may take before the scenario fails as stuck.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// Environment variable that puts the test binary into a child role.
const ROLE_VAR: &str = "FERROMQ_CONFORMANCE_ROLE";

/// The addresses a transport under test binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressScheme {
    /// `tcp://127.0.0.1:0`, the port read back after bind.
    Tcp,
    /// `ipc://` paths in the temp directory, one per channel, removed after the trial.
    Ipc,
    /// `inproc://` names; one process only, so the multi-process scenarios do not apply.
    Inproc,
}

type MakeTransport = dyn Fn(&TrialEnv) -> Arc<dyn Transport> + Send + Sync;
type Cleanup = dyn Fn(&TrialEnv) + Send + Sync;

/// A transport under test: how to make it, what it binds, what it refuses by design.
pub struct Suite {
    name: &'static str,
    scheme: AddressScheme,
    make_transport: Arc<MakeTransport>,
    refused: Vec<SocketType>,
    one_peer_per_channel: bool,
    cleanup: Option<Arc<Cleanup>>,
}

impl Suite {
    /// A suite named `name` (the prefix of every trial) over the transport `make_transport`
    /// returns for a trial (called once per trial and once in each child process, with the
    /// trial's session).
    pub fn new(
        name: &'static str,
        scheme: AddressScheme,
        make_transport: impl Fn(&TrialEnv) -> Arc<dyn Transport> + Send + Sync + 'static,
    ) -> Suite {
        Suite {
            name,
            scheme,
            make_transport: Arc::new(make_transport),
            refused: Vec::new(),
            one_peer_per_channel: false,
            cleanup: None,
        }
    }

    /// Socket types the transport refuses by design (ofi has no pub/sub): the suite then checks
    /// that opening one fails with an error naming the channel, instead of using it.
    #[must_use]
    pub fn refusing(mut self, socket_types: &[SocketType]) -> Suite {
        self.refused.extend_from_slice(socket_types);
        self
    }

    /// The transport's channels serve one peer at a time, by design (ofi): scenarios of several
    /// peers on one channel (fan-in) run with one.
    #[must_use]
    pub fn one_peer_per_channel(mut self) -> Suite {
        self.one_peer_per_channel = true;
        self
    }

    /// Runs after every trial, passed or failed (removing the session's shared memory, say).
    #[must_use]
    pub fn cleanup(mut self, cleanup: impl Fn(&TrialEnv) + Send + Sync + 'static) -> Suite {
        self.cleanup = Some(Arc::new(cleanup));
        self
    }

    /// Runs the suite as the test binary's `main` (libtest's command line: filters, `--list`,
    /// `--test-threads`), or the child role the environment names, and exits.
    pub fn run(self) -> ! {
        if let Ok(role) = std::env::var(ROLE_VAR) {
            std::process::exit(processes::run_child(&Arc::new(self), &role));
        }
        let suite = Arc::new(self);
        let mut trials: Vec<Trial> = scenarios::ALL
            .iter()
            .map(|scenario| trial(&suite, scenario))
            .collect();
        if suite.scheme != AddressScheme::Inproc {
            trials.extend(
                processes::ALL
                    .iter()
                    .map(|scenario| trial(&suite, scenario)),
            );
        }
        libtest_mimic::run(&Arguments::from_args(), trials).exit()
    }

    fn is_refused(&self, socket_type: SocketType) -> bool {
        self.refused.contains(&socket_type)
    }
}

/// The future a scenario returns.
type ScenarioFuture = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send>>;

/// One property, checked against one transport.
struct Scenario {
    name: &'static str,
    check: fn(Arc<Fixture>) -> ScenarioFuture,
}

static NEXT_TRIAL: AtomicUsize = AtomicUsize::new(0);

fn trial(suite: &Arc<Suite>, scenario: &'static Scenario) -> Trial {
    let suite = Arc::clone(suite);
    Trial::test(format!("{}::{}", suite.name, scenario.name), move || {
        let env = TrialEnv::new(NEXT_TRIAL.fetch_add(1, Ordering::Relaxed));
        let outcome = run_trial(&suite, &env, scenario);
        if let Some(cleanup) = &suite.cleanup {
            cleanup(&env);
        }
        outcome.map_err(|failure| failure.to_string().into())
    })
}

fn run_trial(suite: &Arc<Suite>, env: &TrialEnv, scenario: &Scenario) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| Failure::expectation(format!("cannot build a runtime: {error}")))?;
    let fixture = Arc::new(Fixture::new(Arc::clone(suite), env.clone()));
    let outcome = runtime.block_on((scenario.check)(Arc::clone(&fixture)));
    // Sockets close and children die before the transport's cleanup runs.
    drop(fixture);
    runtime.shutdown_timeout(Duration::from_secs(5));
    outcome
}
