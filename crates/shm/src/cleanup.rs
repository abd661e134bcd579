//! Shared memory outlives processes; this module makes sure it does not outlive its session.
//!
//! Three mechanisms, each enough on its own for its case:
//! - the last device of a session to leave cleanly removes the session's objects (every process
//!   with a shmem socket holds its own segment from the socket's creation, so a receiver that
//!   has mapped nothing of a sender's yet still counts, and the sender's exit leaves its memory);
//! - a watchdog process per session (started by the first device, in its own process group so
//!   a Ctrl-C or a `kill -9` of the devices does not reach it) removes them when every process
//!   attached to them has died, crashes included, and then exits;
//! - `ferromq shm clean --stale` removes every object whose processes are all dead, without the
//!   user knowing any session id.
//!
//! Liveness is by process death (pid plus start time), never by timing, so a slow receiver is
//! never mistaken for a dead one.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::names::{ObjectKind, ObjectName, sanitise_session};
use crate::segment::{ProcessId, Segment};

const WATCHDOG_SESSION_VAR: &str = "FERROMQ_SHM_WATCHDOG_SESSION";
/// The process that started a watchdog, `pid:start_time` (see [`ProcessId`]).
const WATCHDOG_STARTER_VAR: &str = "FERROMQ_SHM_WATCHDOG_STARTER";
const WATCHDOG_POLL: Duration = Duration::from_millis(200);

/// Set by [`run_watchdog_if_requested`]: this binary can act as a watchdog, so devices in it may
/// start one by re-executing it.
static WATCHDOG_ENTRY_POINT: AtomicBool = AtomicBool::new(false);
static WATCHDOGS_STARTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What `ferromq shm list` shows of one object.
#[derive(Debug, Clone)]
pub struct ObjectInfo {
    /// Its name.
    pub name: ObjectName,
    /// Total bytes.
    pub size: usize,
    /// Bytes in allocated blocks (managed segments).
    pub used: u64,
    /// Blocks allocated and not reclaimed.
    pub live_blocks: u64,
    /// Largest free block.
    pub largest_free: u64,
    /// Attached processes that still run.
    pub live_processes: Vec<u32>,
    /// Why its header could not be read, for an object without one (its creator died while
    /// making it, or zeroing it): then `live_processes` is its creator if that still runs.
    pub unreadable: Option<String>,
}

fn shm_dir() -> PathBuf {
    PathBuf::from("/dev/shm")
}

/// Every ferromq object of user `uid`, optionally of one session only (the id the devices
/// were given, `--session`).
pub fn list_objects(uid: u32, session: Option<&str>) -> Vec<ObjectInfo> {
    list_encoded(uid, session.map(sanitise_session).as_deref())
}

/// [`list_objects`] of a session named as it appears in object names and in `ferromq shm
/// list` (encoded by [`sanitise_session`]).
pub fn list_objects_encoded(uid: u32, encoded_session: &str) -> Vec<ObjectInfo> {
    list_encoded(uid, Some(encoded_session))
}

/// The session as it appears in object names that `typed` names: the encoding of the id the
/// devices were given, or, where no object has that, the encoded form itself as `ferromq shm
/// list` shows it (`a.5fb` for `a_b`), when objects of it exist.
pub fn encoded_session_named(uid: u32, typed: &str) -> String {
    let encoded = sanitise_session(typed);
    let has_objects = |session: &str| {
        std::fs::read_dir(shm_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| ObjectName::parse(&entry.file_name().to_string_lossy()))
            .any(|name| name.uid == uid && name.session == session)
    };
    if encoded != typed && !has_objects(&encoded) && has_objects(typed) {
        return typed.to_owned();
    }
    encoded
}

/// The objects of `uid`, of the session `encoded` (as in object names) or of every session.
/// Everything below the public functions works on the encoded session: encoding it twice
/// (`a_b` → `a.5fb` → `a.2e5fb`) named no object, and left a crashed session's memory to
/// nobody.
fn list_encoded(uid: u32, encoded: Option<&str>) -> Vec<ObjectInfo> {
    let Ok(entries) = std::fs::read_dir(shm_dir()) else {
        return Vec::new();
    };
    let mut objects: Vec<ObjectInfo> = entries
        .flatten()
        // A directory or link named like an object is none of ours (shm_open makes files).
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
        .filter_map(|entry| ObjectName::parse(&entry.file_name().to_string_lossy()))
        .filter(|name| name.uid == uid && encoded.is_none_or(|session| name.session == session))
        .filter_map(|name| {
            let segment = match Segment::inspect(name.clone()) {
                Ok(segment) => segment,
                // Gone since the directory was read (only a missing object reads so).
                Err(crate::ShmError::NotFound { .. }) => return None,
                Err(error) => return Some(unreadable(name, &error)),
            };
            let header = segment.header();
            Some(ObjectInfo {
                unreadable: None,
                size: segment.len(),
                used: header.used_bytes.load(Ordering::Relaxed),
                live_blocks: header.live_blocks.load(Ordering::Relaxed),
                largest_free: header.largest_free.load(Ordering::Relaxed),
                live_processes: segment
                    .attached()
                    .into_iter()
                    .filter(ProcessId::is_alive)
                    .map(|process| process.pid)
                    .collect(),
                name,
            })
        })
        .collect();
    objects.sort_by(|a, b| a.name.cmp(&b.name));
    objects
}

/// An object whose header cannot be read: a process killed while it made the object (a large
/// segment being zeroed takes seconds) left it without one. Only its name says who made it;
/// it is in use while that process runs, and stale once it has died, so the watchdog and
/// `ferromq shm clean --stale` remove it with its session (they did not see it at all). The
/// creator started before the object was made: a process with its pid that started after the
/// object's last change (a reused pid) is not it.
fn unreadable(name: ObjectName, error: &crate::ShmError) -> ObjectInfo {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(shm_dir().join(name.to_string())).ok();
    let size = metadata.as_ref().map_or(0, |metadata| {
        usize::try_from(metadata.len()).unwrap_or(usize::MAX)
    });
    let changed = metadata.as_ref().map(|metadata| {
        std::time::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(metadata.ctime()).unwrap_or(0))
            + Duration::from_nanos(u64::try_from(metadata.ctime_nsec()).unwrap_or(0))
    });
    let creator_runs = match changed {
        Some(changed) => crate::segment::alive_since(name.creator_pid, changed),
        None => ProcessId {
            pid: name.creator_pid,
            start_time: 0,
        }
        .is_alive(),
    };
    // Said as a person would: the OS's "invalid argument" for an empty object tells nothing.
    let why = match &metadata {
        Some(metadata) if metadata.len() == 0 => {
            "empty (its creator died before it sized it)".to_owned()
        }
        _ => error.to_string(),
    };
    ObjectInfo {
        size,
        used: 0,
        live_blocks: 0,
        largest_free: 0,
        live_processes: if creator_runs {
            vec![name.creator_pid]
        } else {
            Vec::new()
        },
        unreadable: Some(why),
        name,
    }
}

/// The objects of `uid` grouped by session, as each appears in object names (encoded).
pub fn sessions(uid: u32) -> BTreeMap<String, Vec<ObjectInfo>> {
    let mut sessions: BTreeMap<String, Vec<ObjectInfo>> = BTreeMap::new();
    for object in list_objects(uid, None) {
        sessions
            .entry(object.name.session.clone())
            .or_default()
            .push(object);
    }
    sessions
}

/// The watchdog's lock file of the session `encoded` (as in object names).
fn lock_path(uid: u32, encoded: &str) -> PathBuf {
    shm_dir().join(format!(
        "{}watchdog",
        ObjectName::encoded_session_prefix(uid, encoded)
    ))
}

/// Removes every object of the session `encoded` (and its watchdog lock file); returns what
/// was removed.
fn remove_session(uid: u32, encoded: &str) -> Vec<String> {
    let prefix = ObjectName::encoded_session_prefix(uid, encoded);
    let mut removed = Vec::new();
    for object in list_encoded(uid, Some(encoded)) {
        if Segment::remove(&object.name).is_ok() {
            removed.push(object.name.to_string());
        }
    }
    // Objects whose header could not be read (half-created by a crashed process) go too.
    if let Ok(entries) = std::fs::read_dir(shm_dir()) {
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if file_name.starts_with(&prefix) && std::fs::remove_file(entry.path()).is_ok() {
                removed.push(file_name);
            }
        }
    }
    removed
}

/// Why a session was not cleaned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "session {session:?} is in use by running processes {pids:?}; stop them first, or use --force"
)]
pub struct SessionInUse {
    /// The session.
    pub session: String,
    /// Processes attached to its objects.
    pub pids: Vec<u32>,
}

/// Removes the objects of `session`, refusing while processes use them unless `force`.
///
/// # Errors
/// [`SessionInUse`] naming the processes.
pub fn clean_session(uid: u32, session: &str, force: bool) -> Result<Vec<String>, SessionInUse> {
    clean_session_encoded(uid, &sanitise_session(session), force)
}

/// [`clean_session`] of a session named as it appears in object names (see
/// [`encoded_session_named`]).
///
/// # Errors
/// [`SessionInUse`] naming the processes.
pub fn clean_session_encoded(
    uid: u32,
    encoded_session: &str,
    force: bool,
) -> Result<Vec<String>, SessionInUse> {
    let mut pids: Vec<u32> = list_encoded(uid, Some(encoded_session))
        .into_iter()
        .flat_map(|object| object.live_processes)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    if !pids.is_empty() && !force {
        return Err(SessionInUse {
            session: encoded_session.to_owned(),
            pids,
        });
    }
    Ok(remove_session(uid, encoded_session))
}

/// Removes every session of `uid` whose processes are all dead, and every watchdog lock file
/// no watchdog holds ([`stale_watchdog_locks`]); returns what was removed.
pub fn clean_stale(uid: u32) -> Vec<String> {
    let mut removed = Vec::new();
    for (session, objects) in sessions(uid) {
        if objects
            .iter()
            .all(|object| object.live_processes.is_empty())
        {
            removed.extend(remove_session(uid, &session));
        }
    }
    for lock in stale_watchdog_locks(uid) {
        if std::fs::remove_file(shm_dir().join(&lock)).is_ok() {
            removed.push(lock);
        }
    }
    removed
}

/// The watchdog lock files of `uid` that no watchdog holds and whose session has no object
/// left: a watchdog killed (SIGKILL) after its session's memory went leaves its lock file, which
/// no listing showed and nothing removed. A lock this process can take is one nobody holds; a
/// watchdog that starts meanwhile makes its file again.
pub fn stale_watchdog_locks(uid: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(shm_dir()) else {
        return Vec::new();
    };
    let files: Vec<String> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    // Which sessions have objects, by their names alone: nothing is mapped for this.
    let with_objects: std::collections::BTreeSet<String> = files
        .iter()
        .filter_map(|name| ObjectName::parse(name))
        .filter(|name| name.uid == uid)
        .map(|name| name.session)
        .collect();
    let own_prefix = format!("{}{uid}_", crate::names::PREFIX);
    let mut locks: Vec<String> = files
        .into_iter()
        .filter(|name| {
            let Some(session) = name
                .strip_prefix(&own_prefix)
                .and_then(|rest| rest.strip_suffix("_watchdog"))
            else {
                return false;
            };
            if with_objects.contains(session) {
                return false;
            }
            File::open(shm_dir().join(name)).is_ok_and(|file| {
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
            })
        })
        .collect();
    locks.sort();
    locks
}

/// Removes the session's objects when no process but this one uses them.
pub fn remove_session_if_unused(uid: u32, session: &str) {
    let me = std::process::id();
    let encoded = sanitise_session(session);
    let in_use = list_encoded(uid, Some(&encoded))
        .iter()
        .any(|object| object.live_processes.iter().any(|&pid| pid != me));
    if !in_use {
        let removed = remove_session(uid, &encoded);
        if !removed.is_empty() {
            tracing::debug!(
                session,
                n_objects = removed.len(),
                "last process of the session removed its shared memory"
            );
        }
    }
}

/// Starts the session's watchdog unless one runs (only in binaries that call
/// [`run_watchdog_if_requested`] first thing in `main`).
pub fn ensure_watchdog(uid: u32, session: &str) {
    if !WATCHDOG_ENTRY_POINT.load(Ordering::Relaxed) {
        return;
    }
    let session = sanitise_session(session);
    {
        let mut started = WATCHDOGS_STARTED.lock().expect("watchdog list poisoned");
        if started.contains(&session) {
            return;
        }
        started.push(session.clone());
    }
    if let Ok(file) = File::create(lock_path(uid, &session)) {
        // A lock we can take is a lock nobody holds: no watchdog runs.
        if nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err() {
            return;
        }
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let me = ProcessId::current();
    let spawned = std::process::Command::new(exe)
        .env(WATCHDOG_SESSION_VAR, &session)
        .env(
            WATCHDOG_STARTER_VAR,
            format!("{}:{}", me.pid, me.start_time),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut child) => {
            tracing::debug!(session, pid = child.id(), "shared memory watchdog started");
            // Reap it when it ends, so it never lingers as a zombie of a long-lived device.
            std::thread::spawn(move || {
                let _ = child.wait();
            });
        }
        Err(error) => {
            tracing::warn!(%error, "cannot start the shared memory watchdog; `ferromq shm clean --stale` cleans after crashes")
        }
    }
}

use std::os::unix::process::CommandExt;

/// Whether a watchdog of `session` runs: a process started as one (by [`ensure_watchdog`]),
/// whether or not it has taken its lock yet. A watchdog that starts after its session was
/// cleaned makes its lock file again and removes it once it sees its starter gone (within
/// its 200 ms polls); who cleans up after a session's processes waits for it first.
pub fn watchdog_running(session: &str) -> bool {
    let entry = format!("{WATCHDOG_SESSION_VAR}={}", sanitise_session(session));
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|process| std::fs::read(process.path().join("environ")).ok())
        .any(|environ| {
            environ
                .split(|&byte| byte == 0)
                .any(|variable| variable == entry.as_bytes())
        })
}

/// Call first thing in `main`: when this process was started as a session's watchdog, watches
/// and exits; otherwise returns at once and lets devices of this binary start watchdogs.
pub fn run_watchdog_if_requested() {
    WATCHDOG_ENTRY_POINT.store(true, Ordering::Relaxed);
    let Ok(session) = std::env::var(WATCHDOG_SESSION_VAR) else {
        return;
    };
    watch(crate::names::current_uid(), &session);
    std::process::exit(0);
}

/// Watches the session `session`, encoded as in object names (as [`ensure_watchdog`] passes
/// it).
fn watch(uid: u32, session: &str) {
    let Ok(file) = File::create(lock_path(uid, session)) else {
        return;
    };
    let Ok(_lock) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
    else {
        return; // Another watchdog already watches this session.
    };
    let started = Instant::now();
    let mut seen_objects = false;
    // The process that started this watchdog, where it said: once it is gone and the session
    // has no objects, none will come (a session cleaned before this watchdog ran recreated its
    // lock file just above, which would otherwise stay until the 30 s below).
    let starter = std::env::var(WATCHDOG_STARTER_VAR).ok().and_then(|text| {
        let (pid, start_time) = text.split_once(':')?;
        Some(ProcessId {
            pid: pid.parse().ok()?,
            start_time: start_time.parse().ok()?,
        })
    });
    loop {
        std::thread::sleep(WATCHDOG_POLL);
        let objects = list_encoded(uid, Some(session));
        if objects.is_empty() {
            let starter_gone = starter.is_some_and(|starter| !starter.is_alive());
            if seen_objects || starter_gone || started.elapsed() > Duration::from_secs(30) {
                let _ = std::fs::remove_file(lock_path(uid, session));
                return;
            }
            continue;
        }
        seen_objects = true;
        if objects
            .iter()
            .all(|object| object.live_processes.is_empty())
        {
            remove_session(uid, session);
            return;
        }
    }
}

/// Region created/destroyed events of a session, as seen in `/dev/shm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionEvent {
    /// A region appeared.
    Created(ObjectName),
    /// A region went away.
    Destroyed(ObjectName),
}

/// Polls `/dev/shm` for regions of `session` appearing and disappearing, every `interval`,
/// until the receiver is dropped.
pub fn watch_regions(
    uid: u32,
    session: &str,
    interval: Duration,
) -> tokio::sync::mpsc::UnboundedReceiver<RegionEvent> {
    let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
    let session = sanitise_session(session);
    std::thread::spawn(move || {
        let mut known: Vec<ObjectName> = Vec::new();
        loop {
            let current: Vec<ObjectName> = std::fs::read_dir(shm_dir())
                .map(|entries| {
                    entries
                        .flatten()
                        .filter_map(|entry| ObjectName::parse(&entry.file_name().to_string_lossy()))
                        .filter(|name| {
                            name.uid == uid
                                && name.session == session
                                && name.kind == ObjectKind::Region
                        })
                        .collect()
                })
                .unwrap_or_default();
            for name in current.iter().filter(|name| !known.contains(name)) {
                if events.send(RegionEvent::Created(name.clone())).is_err() {
                    return;
                }
            }
            for name in known.iter().filter(|name| !current.contains(name)) {
                if events.send(RegionEvent::Destroyed(name.clone())).is_err() {
                    return;
                }
            }
            known = current;
            if events.is_closed() {
                return;
            }
            std::thread::sleep(interval);
        }
    });
    receiver
}
