//! What rpc's test binaries share: a session of their own whose shared memory and ipc socket
//! files are removed when the test ends, passed or failed.

use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT_SESSION: AtomicUsize = AtomicUsize::new(0);

/// A session of its own, force-cleaned when the test ends however it ends: its shared-memory
/// objects, and every file in the temporary directory named `ferromq-<session>-*` (the ipc
/// addresses members bind there).
pub struct Session(pub String);

impl Session {
    /// Session `rpc-<tag>-<pid>-<n>`, unique within the test binary.
    pub fn new(tag: &str) -> Session {
        Session(format!(
            "rpc-{tag}-{}-{}",
            std::process::id(),
            NEXT_SESSION.fetch_add(1, Ordering::Relaxed)
        ))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let uid = ferromq_shm::names::current_uid();
        let _ = ferromq_shm::cleanup::clean_session(uid, &self.0, true);
        let prefix = format!("ferromq-{}-", self.0);
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}
