//! Where the devices running on this host say they are, so that `ferromq top` finds every one,
//! whoever started it.
//!
//! Each device process of this user writes one small JSON file, `<pid>.json`, into
//! `$TMPDIR/ferromq-presence-<uid>` (made mode 0700: only its user reads it or connects to what
//! it names) and serves a read-only control endpoint at `ipc://<that directory>/<pid>.observe`
//! (see [`crate::control::ControlEndpoint::read_only`]). [`Presence`] removes both, and the
//! sockets of the taps it served (`<pid>.tap<n>`), when dropped; a device that was killed leaves
//! them, and [`list`] removes the files of processes that are gone (a pid that lives but belongs
//! to another process is caught when its endpoint does not answer).
//!
//! Nothing here is needed to run a device: a directory that cannot be made, or a path too long
//! for an ipc socket, makes the device unobservable (with a warning), never failing.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The longest ipc socket path the kernel takes (`sun_path`, less its terminating NUL).
const IPC_PATH_LIMIT: usize = 107;

/// One running device, as its presence file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresenceEntry {
    /// The device id.
    pub id: String,
    /// Its session.
    pub session: String,
    /// Its process.
    pub pid: u32,
    /// Its read-only control endpoint.
    pub observe: String,
    /// When it started, in seconds since the Unix epoch.
    pub started_unix: u64,
}

/// The presence directory of this user.
pub fn directory() -> PathBuf {
    directory_in(&std::env::temp_dir())
}

fn directory_in(temp_dir: &Path) -> PathBuf {
    // The owner of /proc/self is this process's user (this crate has no libc binding).
    let uid = std::fs::metadata("/proc/self")
        .map(|metadata| std::os::unix::fs::MetadataExt::uid(&metadata))
        .unwrap_or(0);
    temp_dir.join(format!("ferromq-presence-{uid}"))
}

/// A device's entry while it runs; removed (file and socket) when dropped.
#[derive(Debug)]
pub struct Presence {
    entry: PresenceEntry,
    file: PathBuf,
    socket: PathBuf,
}

/// Why a device cannot be made observable.
#[derive(Debug, thiserror::Error)]
pub enum PresenceError {
    /// The directory or the file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The endpoint's path would pass the kernel's limit for ipc sockets.
    #[error(
        "{path} is longer than the {IPC_PATH_LIMIT} bytes an ipc socket path may have; set TMPDIR to a shorter directory"
    )]
    PathTooLong {
        /// The path.
        path: PathBuf,
    },
}

impl Presence {
    /// Prepares this process's entry for device `id` of `session`: makes the directory and
    /// says where the read-only endpoint goes. Nothing is announced until [`Presence::publish`]
    /// (call it once the endpoint is bound, so that an observer never finds an entry it cannot
    /// reach yet).
    ///
    /// # Errors
    /// [`PresenceError`] naming the path.
    pub fn prepare(id: &str, session: &str) -> Result<Presence, PresenceError> {
        Self::prepare_in(&directory(), id, session)
    }

    fn prepare_in(dir: &Path, id: &str, session: &str) -> Result<Presence, PresenceError> {
        make_private(dir)?;
        let pid = std::process::id();
        let socket = dir.join(format!("{pid}.observe"));
        if socket.as_os_str().len() > IPC_PATH_LIMIT {
            return Err(PresenceError::PathTooLong { path: socket });
        }
        // A socket left by a killed process whose pid this one now has.
        let _ = std::fs::remove_file(&socket);
        let started_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        Ok(Presence {
            entry: PresenceEntry {
                id: id.to_owned(),
                session: session.to_owned(),
                pid,
                observe: format!("ipc://{}", socket.display()),
                started_unix,
            },
            file: dir.join(format!("{pid}.json")),
            socket,
        })
    }

    /// Where the read-only endpoint is to be bound.
    pub fn observe_address(&self) -> &str {
        &self.entry.observe
    }

    /// Writes the entry (atomically: a temporary file renamed), so observers find the device.
    ///
    /// # Errors
    /// [`PresenceError::Write`] naming the file.
    pub fn publish(&self) -> Result<(), PresenceError> {
        let temporary = self.file.with_extension("json.new");
        let text = serde_json::to_vec(&self.entry).expect("entries serialise");
        std::fs::write(&temporary, text)
            .and_then(|()| std::fs::rename(&temporary, &self.file))
            .map_err(|source| PresenceError::Write {
                path: self.file.clone(),
                source,
            })
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_file(&self.socket);
        if let Some(dir) = self.file.parent() {
            remove_taps_of(dir, self.entry.pid);
        }
    }
}

/// Makes `dir` (mode 0700), or narrows one made before with a wider mode (by hand): what it
/// holds names control endpoints.
fn make_private(dir: &Path) -> Result<(), PresenceError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let write_error = |source| PresenceError::Write {
        path: dir.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(write_error)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(write_error)
}

/// A new address for one of this process's tap streams (`ipc://<dir>/<pid>.tap<n>`, removed
/// with the presence entry), the directory made if need be.
///
/// # Errors
/// [`PresenceError`] naming the path.
pub fn tap_address() -> Result<String, PresenceError> {
    static NEXT_TAP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = directory();
    make_private(&dir)?;
    let n = NEXT_TAP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{}.tap{n}", std::process::id()));
    if path.as_os_str().len() > IPC_PATH_LIMIT {
        return Err(PresenceError::PathTooLong { path });
    }
    Ok(format!("ipc://{}", path.display()))
}

/// Removes the tap stream sockets (`<pid>.tap<n>`, see [`tap_address`]) of process `pid`.
fn remove_taps_of(dir: &Path, pid: u32) {
    let prefix = format!("{pid}.tap");
    let Ok(files) = std::fs::read_dir(dir) else {
        return;
    };
    for file in files.flatten() {
        if file.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(file.path());
        }
    }
}

/// Every device of this user running on this host, in the order of their process ids; entries
/// whose process is gone are removed on the way.
pub fn list() -> Vec<PresenceEntry> {
    list_in(&directory())
}

fn list_in(dir: &Path) -> Vec<PresenceEntry> {
    let Ok(files) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut entries = Vec::new();
    for file in files.flatten() {
        let path = file.path();
        if path.extension().is_none_or(|extension| extension != "json") {
            continue;
        }
        let Some(entry) = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<PresenceEntry>(&bytes).ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{}", entry.pid)).exists() {
            entries.push(entry);
        } else {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(dir.join(format!("{}.observe", entry.pid)));
            remove_taps_of(dir, entry.pid);
        }
    }
    entries.sort_by_key(|entry| entry.pid);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "ferromq-presence-test-{tag}-{}",
            std::process::id()
        ))
    }

    #[test]
    fn a_published_entry_is_listed_until_dropped_and_the_directory_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("publish");
        let presence = Presence::prepare_in(&dir, "sink", "s1").unwrap();
        assert!(list_in(&dir).is_empty(), "listed before it was published");
        presence.publish().unwrap();
        let listed = list_in(&dir);
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        drop(presence);
        let after = list_in(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].id.as_str(), listed[0].session.as_str()),
            ("sink", "s1")
        );
        assert_eq!(listed[0].pid, std::process::id());
        assert!(listed[0].observe.ends_with(".observe"));
        assert_eq!(mode, 0o700);
        assert!(after.is_empty(), "still listed after drop: {after:?}");
    }

    #[test]
    fn a_dropped_entry_takes_its_tap_sockets_along() {
        let dir = scratch("taps");
        let presence = Presence::prepare_in(&dir, "sampler", "s").unwrap();
        let pid = std::process::id();
        let tap = dir.join(format!("{pid}.tap0"));
        let other = dir.join(format!("{}.tap0", pid + 1));
        std::fs::write(&tap, b"").unwrap();
        std::fs::write(&other, b"").unwrap();
        drop(presence);
        let (tap_left, other_left) = (tap.exists(), other.exists());
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!tap_left, "the tap socket was left behind");
        assert!(other_left, "another process's tap socket was removed");
    }

    #[test]
    fn an_entry_of_a_dead_process_is_removed_when_listing() {
        let dir = scratch("dead");
        std::fs::create_dir_all(&dir).unwrap();
        // Pids above the kernel's maximum (4194304) never exist.
        let entry = PresenceEntry {
            id: "gone".into(),
            session: "s".into(),
            pid: 999_999_999,
            observe: "ipc:///nowhere".into(),
            started_unix: 0,
        };
        let file = dir.join("999999999.json");
        std::fs::write(&file, serde_json::to_vec(&entry).unwrap()).unwrap();
        std::fs::write(dir.join("junk.json"), b"not json").unwrap();
        let listed = list_in(&dir);
        let removed = !file.exists();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(listed.is_empty());
        assert!(removed, "the dead process's entry was kept");
    }

    #[test]
    fn a_path_too_long_for_an_ipc_socket_is_refused_naming_it() {
        let dir = std::env::temp_dir().join("x".repeat(120));
        let error = Presence::prepare_in(&dir, "d", "s").unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(error.to_string().contains("longer than"), "{error}");
    }
}
