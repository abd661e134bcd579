//! `ferromq shm list` and `ferromq shm clean`: see and remove shared memory.

use std::process::ExitCode;

use clap::Subcommand;
use ferromq_shm::cleanup::{self, ObjectInfo};
use ferromq_shm::names::current_uid;

/// What to do with shared memory.
#[derive(Debug, Subcommand)]
pub enum ShmCommand {
    /// Sessions, segments and regions of this user: size, use, free space, live messages, processes.
    List {
        /// Only this session: the id the devices were given, or its name as this list shows
        /// it (ids with characters other than letters, digits and `-` are shown encoded:
        /// `run_1` as `run.5f1`).
        #[arg(long, value_parser = crate::options::session_id)]
        session: Option<String>,
    },
    /// Remove shared memory: one session, or every session whose processes are all dead.
    Clean {
        /// The session to remove: the id the devices were given, or its name as `ferromq shm
        /// list` shows it.
        #[arg(long, conflicts_with = "stale", required_unless_present = "stale", value_parser = crate::options::session_id)]
        session: Option<String>,
        /// Remove every session none of whose processes runs any more (no session id needed).
        #[arg(long)]
        stale: bool,
        /// Remove the session even while processes use it (not with --stale, which removes
        /// only sessions nobody uses).
        #[arg(long, conflicts_with = "stale")]
        force: bool,
    },
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn print_objects(objects: &[ObjectInfo]) {
    println!(
        "  {:<52} {:>10} {:>10} {:>12} {:>8}  processes",
        "object", "size", "used", "largest free", "messages"
    );
    for object in objects {
        let processes = if object.live_processes.is_empty() {
            "none alive".to_owned()
        } else {
            object
                .live_processes
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        if let Some(problem) = &object.unreadable {
            // Made by a process that died before it wrote the header (or still writes it).
            println!(
                "  {:<52} {:>10} {:>10} {:>12} {:>8}  {processes} (no header: {problem})",
                object.name.to_string(),
                human(object.size as u64),
                "-",
                "-",
                "-"
            );
            continue;
        }
        println!(
            "  {:<52} {:>10} {:>10} {:>12} {:>8}  {processes}",
            object.name.to_string(),
            human(object.size as u64),
            human(object.used),
            human(object.largest_free),
            object.live_blocks
        );
    }
}

/// Runs an `ferromq shm` command.
pub fn run(command: &ShmCommand) -> ExitCode {
    let uid = current_uid();
    match command {
        ShmCommand::List { session } => {
            let (sessions, locks) = match session {
                Some(session) => {
                    // The id the devices were given, or the session as this list shows it.
                    let encoded = cleanup::encoded_session_named(uid, session);
                    let objects = cleanup::list_objects_encoded(uid, &encoded);
                    let sessions: std::collections::BTreeMap<_, _> =
                        std::iter::once((encoded, objects))
                            .filter(|(_, objects)| !objects.is_empty())
                            .collect();
                    if sessions.is_empty() {
                        println!("no ferromq shared memory of session {session} for user {uid}");
                    }
                    (sessions, Vec::new())
                }
                None => {
                    let sessions = cleanup::sessions(uid);
                    let locks = cleanup::stale_watchdog_locks(uid);
                    if sessions.is_empty() && locks.is_empty() {
                        println!("no ferromq shared memory for user {uid}");
                    }
                    (sessions, locks)
                }
            };
            for lock in locks {
                println!(
                    "{lock}: a watchdog's lock file that no watchdog holds (stale; `ferromq shm clean --stale` removes it)"
                );
            }
            for (session, objects) in sessions {
                let alive = objects
                    .iter()
                    .any(|object| !object.live_processes.is_empty());
                println!(
                    "session {session} ({})",
                    if alive {
                        "in use"
                    } else {
                        "stale: every process is dead"
                    }
                );
                print_objects(&objects);
            }
            ExitCode::SUCCESS
        }
        ShmCommand::Clean {
            session: Some(session),
            force,
            ..
        } => {
            // Said as object names spell it: `--session a.5fb` may name the id `a_b`.
            let encoded = cleanup::encoded_session_named(uid, session);
            match cleanup::clean_session_encoded(uid, &encoded, *force) {
                Ok(removed) => {
                    println!("removed {} object(s) of session {encoded}", removed.len());
                    ExitCode::SUCCESS
                }
                Err(in_use) => {
                    eprintln!("ferromq: {in_use}");
                    ExitCode::FAILURE
                }
            }
        }
        ShmCommand::Clean { .. } => {
            let removed = cleanup::clean_stale(uid);
            println!("removed {} stale object(s)", removed.len());
            for name in removed {
                println!("  {name}");
            }
            ExitCode::SUCCESS
        }
    }
}
