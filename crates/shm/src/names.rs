//! Names of ferromq's shared-memory objects.
//!
//! Every object is `/dev/shm/ferromq_<uid>_<session>_<kind>_<pid>_<index>`: the user id keeps two
//! users apart, the session keeps two workflows apart, the creating process and an index make it
//! unique. `ferromq shm list` and `clean` find everything of a user or a session from the name
//! alone, without any registry that could itself be lost in a crash.

use std::fmt;

/// The prefix of every ferromq shared-memory object.
pub const PREFIX: &str = "ferromq_";

/// What an object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// A managed segment (messages allocated by the framework).
    Segment,
    /// An unmanaged region (memory the user fills).
    Region,
}

impl ObjectKind {
    fn tag(self) -> &'static str {
        match self {
            ObjectKind::Segment => "seg",
            ObjectKind::Region => "reg",
        }
    }
}

/// The parts of an object's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectName {
    /// Owner's user id.
    pub uid: u32,
    /// Session, encoded by [`sanitise_session`].
    pub session: String,
    /// Segment or region.
    pub kind: ObjectKind,
    /// Process that created it.
    pub creator_pid: u32,
    /// Index among that process's objects of this kind.
    pub index: u32,
}

/// The longest encoded session kept whole in a name; longer ones end in a hash of the whole id
/// (POSIX names have at most 255 bytes).
const MAX_ENCODED_SESSION: usize = 160;

/// Encodes a session id for object names, one to one: ASCII letters, digits and `-` stay as
/// they are, every other byte becomes `.` and two hex digits (`a_b` is `a.5fb`, `a-b` stays
/// `a-b`), so two different sessions never share a name and names never contain `_`, which
/// separates their fields. The empty id is `default`. An id whose encoding is longer than 160
/// characters keeps its first 140 and adds `.` and a 64-bit hash of the whole id.
pub fn sanitise_session(session: &str) -> String {
    if session.is_empty() {
        return "default".to_owned();
    }
    let mut encoded = String::with_capacity(session.len());
    for byte in session.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!(".{byte:02x}"));
        }
    }
    if encoded.len() > MAX_ENCODED_SESSION {
        // FNV-1a: stable across processes and versions, unlike std's hasher.
        let hash = session
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        encoded.truncate(140);
        encoded.push_str(&format!(".{hash:016x}"));
    }
    encoded
}

impl ObjectName {
    /// The name of object `index` of `kind` created by `creator_pid` in `session`.
    pub fn new(
        uid: u32,
        session: &str,
        kind: ObjectKind,
        creator_pid: u32,
        index: u32,
    ) -> ObjectName {
        ObjectName {
            uid,
            session: sanitise_session(session),
            kind,
            creator_pid,
            index,
        }
    }

    /// Reads a name back; `None` for anything that is not a ferromq object name.
    pub fn parse(name: &str) -> Option<ObjectName> {
        let rest = name
            .strip_prefix('/')
            .unwrap_or(name)
            .strip_prefix(PREFIX)?;
        let mut fields = rest.rsplitn(4, '_');
        let index = fields.next()?.parse().ok()?;
        let creator_pid = fields.next()?.parse().ok()?;
        let kind = match fields.next()? {
            "seg" => ObjectKind::Segment,
            "reg" => ObjectKind::Region,
            _ => return None,
        };
        let (uid, session) = fields.next()?.split_once('_')?;
        Some(ObjectName {
            uid: uid.parse().ok()?,
            session: session.to_owned(),
            kind,
            creator_pid,
            index,
        })
    }

    /// The prefix shared by every object of `session` of user `uid`.
    pub fn session_prefix(uid: u32, session: &str) -> String {
        ObjectName::encoded_session_prefix(uid, &sanitise_session(session))
    }

    /// [`ObjectName::session_prefix`] of a session already encoded (as in
    /// [`ObjectName::session`]).
    pub fn encoded_session_prefix(uid: u32, encoded_session: &str) -> String {
        format!("{PREFIX}{uid}_{encoded_session}_")
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}_{}_{}_{}_{}",
            self.uid,
            self.session,
            self.kind.tag(),
            self.creator_pid,
            self.index
        )
    }
}

/// This process's effective user id.
pub fn current_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sessions_are_encoded() {
        let name = ObjectName::new(1000, "run 42/a_b", ObjectKind::Segment, 4242, 3);
        assert_eq!(name.to_string(), "ferromq_1000_run.2042.2fa.5fb_seg_4242_3");
        assert_eq!(ObjectName::parse(&name.to_string()), Some(name.clone()));
        assert_eq!(
            ObjectName::parse("/ferromq_1000_run.2042.2fa.5fb_seg_4242_3"),
            Some(name)
        );
        assert!(
            ObjectName::session_prefix(1000, "run 42/a_b")
                .starts_with("ferromq_1000_run.2042.2fa.5fb_")
        );
        assert_eq!(ObjectName::parse("ferromq_x_s_seg_1_2"), None);
        assert_eq!(ObjectName::parse("other_1_s_seg_1_2"), None);
        assert_eq!(sanitise_session(""), "default");
    }

    #[test]
    fn different_sessions_never_share_names() {
        let sessions = [
            "a_b", "a-b", "a b", "a.b", "a.5fb", "a", "run-1", "run_1", "ü",
        ];
        let encoded: std::collections::BTreeSet<String> = sessions
            .iter()
            .map(|session| sanitise_session(session))
            .collect();
        assert_eq!(encoded.len(), sessions.len(), "{encoded:?}");
        assert!(
            encoded
                .iter()
                .all(|name| !name.contains('_') && !name.contains('/'))
        );
        let long_a = "x".repeat(300) + "a";
        let long_b = "x".repeat(300) + "b";
        assert_ne!(sanitise_session(&long_a), sanitise_session(&long_b));
        assert!(sanitise_session(&long_a).len() <= 160);
    }
}
