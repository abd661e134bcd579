//! What a thread's `tracing` events say, as text: for the tests that check what is logged when
//! something is lost or stopped (a socket dropped without a close, a member shutting down).
//!
//! ```
//! let logs = ferromq_log_capture::CapturedLogs::start();
//! tracing::error!(n_messages = 3, "lost");
//! assert!(logs.text().contains("ERROR") && logs.text().contains("n_messages=3"));
//! ```
//!
//! The subscriber is the thread's default while the [`CapturedLogs`] lives: it hears what runs
//! on this thread (a current-thread runtime's tasks, `#[tokio::test]`'s default), not a
//! multi-thread runtime's workers. Dropping it restores the previous default.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;

/// The text of this thread's events since [`CapturedLogs::start`] (or the last
/// [`CapturedLogs::clear`]), one line each, without colours.
pub struct CapturedLogs {
    written: Written,
    _default: DefaultGuard,
}

impl CapturedLogs {
    /// Makes a subscriber that writes into memory this thread's default.
    #[must_use]
    pub fn start() -> CapturedLogs {
        let written = Written::default();
        let writer = written.clone();
        let default = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        );
        CapturedLogs {
            written,
            _default: default,
        }
    }

    /// What was logged so far.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.written.bytes()).into_owned()
    }

    /// Forgets what was logged so far.
    pub fn clear(&self) {
        self.written
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// The bytes the subscriber wrote.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<u8>>>);

impl Written {
    fn bytes(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl std::io::Write for Written {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::CapturedLogs;

    #[test]
    fn it_hears_this_threads_events_until_dropped_and_forgets_on_clear() {
        let logs = CapturedLogs::start();
        tracing::error!(channel = "data", n_messages = 2, "lost");
        let text = logs.text();
        assert!(text.contains("ERROR") && text.contains("lost"), "{text}");
        assert!(text.contains("n_messages=2"), "{text}");
        logs.clear();
        assert_eq!(logs.text(), "");
        std::thread::spawn(|| tracing::error!("another thread"))
            .join()
            .unwrap();
        assert_eq!(
            logs.text(),
            "",
            "another thread's events are not this thread's"
        );
        drop(logs);
        let again = CapturedLogs::start();
        tracing::info!("after");
        assert!(again.text().contains("after"));
    }
}
