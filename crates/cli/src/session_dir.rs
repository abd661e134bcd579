//! The launcher's directory for one session (ipc sockets of control and auto-bound channels),
//! and the lock that makes a session belong to one `ferromq run` at a time.
//!
//! The directory is `$TMPDIR/ferromq-run-<hash>`, the hash of the user id and the session id
//! (short, whatever the session is called, so that ipc paths stay under the kernel's 108-byte
//! limit and no session id can name a path outside it). Inside, `lock` is held with `flock` for
//! the life of the launcher: a second launcher of the same session fails to take it and is
//! refused; the kernel releases it when the holder dies in any way, SIGKILL included, so a
//! directory whose lock nobody holds is stale and the next launcher removes it, once its lock
//! file names the launcher that made it (a directory being created right now has an empty one:
//! left alone for a minute, so that two launchers starting together never remove each other's).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};

const DIR_PREFIX: &str = "ferromq-run-";

/// How long a directory whose lock file names no launcher counts as being created.
const CREATION_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// A session's directory, locked; removed when dropped.
pub struct SessionDir {
    path: PathBuf,
    _lock: Flock<File>,
}

impl SessionDir {
    /// Creates and locks the directory of `session`, after removing stale ones of this user.
    ///
    /// # Errors
    /// The session is in use by a live launcher (its pid is named), or the directory cannot be
    /// made.
    pub fn acquire(session: &str) -> Result<SessionDir> {
        let uid = ferromq_shm::names::current_uid();
        remove_stale(&std::env::temp_dir());
        let path = std::env::temp_dir().join(format!("{DIR_PREFIX}{:016x}", key(uid, session)));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let lock_path = path.join("lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("cannot open {}", lock_path.display()))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, errno)) if errno == nix::errno::Errno::EWOULDBLOCK => {
                let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
                bail!(
                    "session {session:?} is in use by another `ferromq run` (pid {}); stop it or \
                     choose another --session",
                    holder.trim()
                );
            }
            Err((_, errno)) => {
                bail!("cannot lock {}: {errno}", lock_path.display());
            }
        };
        lock.set_len(0)?;
        write!(lock, "{}", std::process::id())?;
        Ok(SessionDir { path, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// FNV-1a of the user id and session: stable across runs, unlike std's hasher.
fn key(uid: u32, session: &str) -> u64 {
    uid.to_le_bytes()
        .iter()
        .chain(session.as_bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Removes this user's session directories whose lock nobody holds (their launcher died).
fn remove_stale(temp_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(temp_dir) else {
        return;
    };
    let uid = ferromq_shm::names::current_uid();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let owned = std::os::unix::fs::MetadataExt::uid(&match entry.metadata() {
            Ok(metadata) => metadata,
            Err(_) => continue,
        }) == uid;
        // A directory without a lock file, or whose lock file does not name its launcher yet,
        // may be one a launcher is creating right now (it writes its pid once it holds the
        // lock): left alone unless it is old, so that no launcher loses its directory between
        // creating it and locking it.
        let lock_path = entry.path().join("lock");
        let Ok(file) = File::open(&lock_path) else {
            continue;
        };
        let being_created = std::fs::metadata(&lock_path).is_ok_and(|metadata| {
            metadata.len() == 0
                && metadata
                    .modified()
                    .ok()
                    .and_then(|modified| modified.elapsed().ok())
                    .is_none_or(|age| age < CREATION_GRACE)
        });
        if owned && !being_created && Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the CLI tests: a launcher removed the directory another one had just created
    /// and not yet locked, whose devices then failed to bind their control endpoints.
    #[test]
    fn a_directory_being_created_is_not_removed_and_a_stale_one_is() {
        let temp = std::env::temp_dir().join(format!("ferromq-stale-test-{}", std::process::id()));
        let fresh = temp.join(format!("{DIR_PREFIX}fresh"));
        let stale = temp.join(format!("{DIR_PREFIX}stale"));
        for dir in [&fresh, &stale] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(fresh.join("lock"), "").unwrap();
        std::fs::write(stale.join("lock"), "4242").unwrap();
        remove_stale(&temp);
        let (fresh_kept, stale_kept) = (fresh.exists(), stale.exists());
        let _ = std::fs::remove_dir_all(&temp);
        assert!(
            fresh_kept,
            "a directory whose launcher is locking it was removed"
        );
        assert!(!stale_kept, "a directory nobody holds was kept");
    }
}
