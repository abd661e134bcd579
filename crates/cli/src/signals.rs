//! [`Signals`]: SIGINT and SIGTERM caught for an orderly stop, the one way every ferromq binary
//! (the launcher, `bench`, a device, the examples) takes them.
//!
//! Installing takes the signals back from libraries that grabbed them at load time first
//! ([`crate::transports::prepare_termination_signals`]): with libfabric linked, a library's
//! handler would otherwise get the signal through tokio's and end the process before its
//! stop ran. Once installed, a signal no longer ends the process by itself until the
//! [`Signals`] is dropped (tokio keeps its handler; a later signal is then only recorded), so
//! the holder decides what a signal does: stop, and end at once on a second one where it wants.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM, installed before anything starts so that no signal finds the process
/// without a handler.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    /// Installs the handlers (within a tokio runtime).
    ///
    /// # Errors
    /// The handlers cannot be installed (no runtime with signals enabled).
    pub fn install() -> std::io::Result<Signals> {
        crate::transports::prepare_termination_signals();
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The next SIGINT or SIGTERM, by name. Cancel-safe.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }

    /// The shell's exit code for a process ended by `signal` (a name [`Signals::next`] gives):
    /// 128 plus its number, 130 for SIGINT, 143 for SIGTERM.
    pub fn exit_code(signal: &str) -> u8 {
        if signal == "SIGINT" { 130 } else { 143 }
    }
}
