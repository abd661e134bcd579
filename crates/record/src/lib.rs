//! Recordings of a channel: the file `ferromq record` writes and `ferromq replay` (the built-in
//! `replay` device) reads. The format is versioned and documented in `docs/recording.md`:
//!
//! ```text
//! "ferromq-recording\n"  u32 version (1)  u32 n  n bytes of JSON: the Header
//! records: u8 1 (message)  u8 direction (0 in, 1 out)  u64 sequence  u64 nanoseconds since the
//!          start  u32 parts  then per part: u64 length, the bytes
//! end:     u8 2  u32 n  n bytes of JSON: the Summary
//! ```
//! All numbers little-endian. A file without its end record is one whose recorder did not
//! finish (killed, a full disk): [`Reader`] reads its messages and says it has no summary.
//!
//! Reading never trusts the file: every length is checked against [`MAX_PARTS`],
//! [`MAX_PART_SIZE`] and what is left of the file before anything is allocated, and every
//! problem is an error naming the file and the byte offset. A file must also agree with
//! itself: every message has a part, sequence numbers only grow, the summary counts what the
//! file holds, and nothing follows the end record. [`Reader`] checks each as it reaches it, so
//! the messages before a bad record are read (and replayed) before the error.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The first bytes of every recording.
pub const MAGIC: &[u8; 18] = b"ferromq-recording\n";
/// The version this crate writes and reads.
pub const VERSION: u32 = 1;
/// The most parts a recorded message may have.
pub const MAX_PARTS: u32 = 1 << 20;
/// The largest part a reader accepts (16 GiB).
pub const MAX_PART_SIZE: u64 = 16 << 30;
/// The largest header or summary (JSON) a reader accepts.
const MAX_JSON: u32 = 1 << 20;

const TAG_MESSAGE: u8 = 1;
const TAG_END: u8 = 2;

/// What was recorded, written first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The device whose channel was tapped.
    pub device: String,
    /// Its session.
    pub session: String,
    /// The channel (socket) name.
    pub channel: String,
    /// The channel's configuration, `key=value,...` (FairMQ's `--channel-config` form).
    pub channel_config: String,
    /// When the recording started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// The ferromq version that wrote it.
    pub ferromq_version: String,
}

/// How the recording ended, written last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Messages recorded.
    pub messages: u64,
    /// Their bytes, all parts.
    pub bytes: u64,
    /// Messages that passed the channel while recording and are not in the file: the
    /// recorder did not keep up.
    pub missed: u64,
}

/// Which way a recorded message went through its channel (the tap's own type): `In`,
/// received by the tapped device; `Out`, sent by it.
pub use ferromq_core::Direction;

/// One recorded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Which way it went.
    pub direction: Direction,
    /// Its number in the tapped stream (gaps: messages missed).
    pub sequence: u64,
    /// When it passed, since the recording started.
    pub at: Duration,
    /// Its parts, boundaries kept.
    pub parts: Vec<Bytes>,
}

/// What is wrong with a recording or its file.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// The file cannot be read or written.
    ///
    /// The cause is the source only, not also in the message: an error chain printed it twice
    /// (`/x: No such file or directory (os error 2): No such file or directory (os error 2)`).
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        cause: std::io::Error,
    },
    /// The file does not start as a recording does.
    #[error("{path} is not a ferromq recording (it does not start with \"ferromq-recording\")")]
    NotARecording {
        /// The file.
        path: PathBuf,
    },
    /// A version this build cannot read.
    #[error(
        "{path} is a recording of format version {found}; this ferromq reads version {VERSION}"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version it has.
        found: u32,
    },
    /// The content is not what the format says at `offset`.
    #[error("{path} at byte {offset}: {problem}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What.
        problem: String,
    },
}

/// Writes a recording.
pub struct Writer {
    file: BufWriter<std::fs::File>,
    path: PathBuf,
    summary: Summary,
}

impl Writer {
    /// Creates (or truncates) `path` and writes `header`.
    ///
    /// # Errors
    /// [`RecordingError::Io`] naming the file.
    pub fn create(path: &Path, header: &Header) -> Result<Writer, RecordingError> {
        let io = |source| RecordingError::Io {
            path: path.to_owned(),
            cause: source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut writer = Writer {
            file: BufWriter::with_capacity(1 << 20, file),
            path: path.to_owned(),
            summary: Summary {
                messages: 0,
                bytes: 0,
                missed: 0,
            },
        };
        let json = serde_json::to_vec(header).expect("headers serialise");
        writer.put(MAGIC)?;
        writer.put(&VERSION.to_le_bytes())?;
        writer.put(&json_len(&json).to_le_bytes())?;
        writer.put(&json)?;
        Ok(writer)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), RecordingError> {
        self.file
            .write_all(bytes)
            .map_err(|source| RecordingError::Io {
                path: self.path.clone(),
                cause: source,
            })
    }

    /// Appends one message.
    ///
    /// # Errors
    /// [`RecordingError::Io`] naming the file.
    pub fn write(&mut self, record: &Record) -> Result<(), RecordingError> {
        let mut head = [0u8; 22];
        head[0] = TAG_MESSAGE;
        head[1] = match record.direction {
            Direction::In => 0,
            Direction::Out => 1,
        };
        head[2..10].copy_from_slice(&record.sequence.to_le_bytes());
        let nanos = u64::try_from(record.at.as_nanos()).unwrap_or(u64::MAX);
        head[10..18].copy_from_slice(&nanos.to_le_bytes());
        let n_parts = u32::try_from(record.parts.len()).unwrap_or(u32::MAX);
        head[18..22].copy_from_slice(&n_parts.to_le_bytes());
        self.put(&head)?;
        for part in &record.parts {
            self.put(&(part.len() as u64).to_le_bytes())?;
            self.put(part)?;
            self.summary.bytes += part.len() as u64;
        }
        self.summary.messages += 1;
        Ok(())
    }

    /// What was written so far.
    pub fn summary(&self) -> Summary {
        self.summary
    }

    /// Writes the end record (with `missed`) and flushes; the summary written.
    ///
    /// # Errors
    /// [`RecordingError::Io`] naming the file.
    pub fn finish(mut self, missed: u64) -> Result<Summary, RecordingError> {
        self.summary.missed = missed;
        let json = serde_json::to_vec(&self.summary).expect("summaries serialise");
        self.put(&[TAG_END])?;
        self.put(&json_len(&json).to_le_bytes())?;
        self.put(&json)?;
        let path = self.path.clone();
        self.file
            .into_inner()
            .map_err(|error| error.into_error())
            .and_then(|file| file.sync_all())
            .map_err(|source| RecordingError::Io {
                path,
                cause: source,
            })?;
        Ok(self.summary)
    }
}

fn json_len(json: &[u8]) -> u32 {
    u32::try_from(json.len()).expect("headers and summaries are small")
}

/// Reads a recording, message by message, from a file ([`Reader::open`]) or any reader whose
/// length is known ([`Reader::from_reader`]).
pub struct Reader<R = BufReader<std::fs::File>> {
    file: R,
    path: PathBuf,
    offset: u64,
    remaining: u64,
    header: Header,
    summary: Option<Summary>,
    ended: bool,
    /// What was read so far, for the summary to agree with (`missed`: the sequence numbers
    /// skipped).
    read: Summary,
    /// The last message's sequence number: the next one must be above it.
    last_sequence: Option<u64>,
}

impl Reader {
    /// Opens `path` and reads its header.
    ///
    /// # Errors
    /// [`RecordingError`] naming the file and what is wrong.
    pub fn open(path: &Path) -> Result<Reader, RecordingError> {
        let io = |source| RecordingError::Io {
            path: path.to_owned(),
            cause: source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let metadata = file.metadata().map_err(io)?;
        if metadata.is_dir() {
            // Opened (a directory opens for reading) and then read as an empty file: "is not a
            // ferromq recording" (a bad-input sweep).
            return Err(io(std::io::Error::from(std::io::ErrorKind::IsADirectory)));
        }
        let length = metadata.len();
        Reader::from_reader(BufReader::with_capacity(1 << 20, file), length, path)
    }
}

impl<R: Read> Reader<R> {
    /// Reads the header of the `length` bytes `input` holds; `path` names them in errors.
    ///
    /// # Errors
    /// [`RecordingError`] naming `path` and what is wrong.
    pub fn from_reader(input: R, length: u64, path: &Path) -> Result<Reader<R>, RecordingError> {
        let mut reader = Reader {
            file: input,
            path: path.to_owned(),
            offset: 0,
            remaining: length,
            header: Header {
                device: String::new(),
                session: String::new(),
                channel: String::new(),
                channel_config: String::new(),
                started_unix_ms: 0,
                ferromq_version: String::new(),
            },
            summary: None,
            ended: false,
            read: Summary {
                messages: 0,
                bytes: 0,
                missed: 0,
            },
            last_sequence: None,
        };
        let mut magic = [0u8; 18];
        if length < MAGIC.len() as u64 || reader.take(&mut magic).is_err() || &magic != MAGIC {
            return Err(RecordingError::NotARecording {
                path: path.to_owned(),
            });
        }
        let version = reader.u32()?;
        if version != VERSION {
            return Err(RecordingError::Version {
                path: path.to_owned(),
                found: version,
            });
        }
        let json = reader.json_bytes("header")?;
        reader.header = serde_json::from_slice(&json)
            .map_err(|error| reader.corrupt(format!("the header is not valid: {error}")))?;
        Ok(reader)
    }

    /// What was recorded.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The recording's summary, once [`Reader::next_record`] returned `None` (`None` then: the
    /// recorder did not finish the file). It agrees with the messages read: the reader refused
    /// the file otherwise.
    pub fn summary(&self) -> Option<Summary> {
        self.summary
    }

    /// The next message, or `None` at the end.
    ///
    /// # Errors
    /// [`RecordingError::Corrupt`] naming the offset, or [`RecordingError::Io`]. Besides bytes
    /// that are not what the format says, a message without parts, a sequence number not above
    /// the one before, a summary that disagrees with the messages and bytes after the end
    /// record are corrupt: messages are counted from 1 in what it says.
    pub fn next_record(&mut self) -> Result<Option<Record>, RecordingError> {
        if self.ended || self.remaining == 0 {
            self.ended = true;
            return Ok(None);
        }
        let record_at = self.offset;
        let mut tag = [0u8; 1];
        self.take(&mut tag)?;
        match tag[0] {
            TAG_MESSAGE => {}
            TAG_END => {
                let json = self.json_bytes("summary")?;
                let summary = serde_json::from_slice(&json)
                    .map_err(|error| self.corrupt(format!("the summary is not valid: {error}")))?;
                self.check_summary(&summary, record_at)?;
                if self.remaining > 0 {
                    // A file written on after its end, or two recordings joined.
                    return Err(self.corrupt(format!(
                        "{} byte(s) after the end record, where the file should end",
                        self.remaining
                    )));
                }
                self.summary = Some(summary);
                self.ended = true;
                return Ok(None);
            }
            other => return Err(self.corrupt(format!("unknown record tag {other}"))),
        }
        let msg_idx = self.read.messages + 1;
        let mut head = [0u8; 21];
        self.take(&mut head)?;
        let direction = match head[0] {
            0 => Direction::In,
            1 => Direction::Out,
            other => return Err(self.corrupt(format!("unknown direction {other}"))),
        };
        let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
        let sequence = word(1);
        let at = Duration::from_nanos(word(9));
        let n_parts = u32::from_le_bytes(head[17..21].try_into().expect("4 bytes"));
        // The tap numbers a channel's messages, both ways, in the order they pass.
        if let Some(last) = self.last_sequence.filter(|&last| sequence <= last) {
            let previous = msg_idx - 1;
            let problem = if sequence == last {
                format!(
                    "message {msg_idx} has sequence number {sequence}, which channel {:?} already had (message {previous})",
                    self.header.channel
                )
            } else {
                format!(
                    "message {msg_idx} has sequence number {sequence}, below message {previous}'s {last}: channel {:?} numbers its messages upward",
                    self.header.channel
                )
            };
            return Err(self.corrupt_at(record_at, problem));
        }
        if n_parts == 0 {
            return Err(self.corrupt_at(
                record_at,
                format!(
                    "message {msg_idx} (sequence number {sequence}) has 0 parts: a message has at least 1"
                ),
            ));
        }
        if n_parts > MAX_PARTS {
            return Err(self.corrupt_at(
                record_at,
                format!(
                    "message {msg_idx} (sequence number {sequence}) has {n_parts} parts (at most {MAX_PARTS})"
                ),
            ));
        }
        let mut parts = Vec::with_capacity(n_parts as usize);
        for part_idx in 0..n_parts {
            let mut length = [0u8; 8];
            self.take(&mut length)?;
            let length = u64::from_le_bytes(length);
            if length > MAX_PART_SIZE || length > self.remaining {
                return Err(self.corrupt(format!(
                    "part {} of message {msg_idx} (sequence number {sequence}) says {length} bytes, {} are left",
                    part_idx + 1,
                    self.remaining
                )));
            }
            let mut bytes = vec![0u8; usize::try_from(length).expect("checked above")];
            self.take(&mut bytes)?;
            self.read.bytes += length;
            parts.push(Bytes::from(bytes));
        }
        // Numbers the tap gave that are not in the file: missed, as the summary must say.
        self.read.missed += sequence - self.last_sequence.map_or(0, |last| last + 1);
        self.last_sequence = Some(sequence);
        self.read.messages = msg_idx;
        Ok(Some(Record {
            direction,
            sequence,
            at,
            parts,
        }))
    }

    fn corrupt(&self, problem: String) -> RecordingError {
        self.corrupt_at(self.offset, problem)
    }

    /// A problem of the record (or field) that starts at `offset`.
    fn corrupt_at(&self, offset: u64, problem: String) -> RecordingError {
        RecordingError::Corrupt {
            path: self.path.clone(),
            offset,
            problem,
        }
    }

    /// The end record at `offset` says `summary`: it must count what was read (its `missed`
    /// at least the numbers the sequence skips; the tap may have missed more after the last).
    fn check_summary(&self, summary: &Summary, offset: u64) -> Result<(), RecordingError> {
        let read = self.read;
        let mut disagreements = Vec::new();
        if summary.messages != read.messages {
            disagreements.push(format!(
                "{} messages, the file holds {}",
                summary.messages, read.messages
            ));
        }
        if summary.bytes != read.bytes {
            disagreements.push(format!(
                "{} bytes, its messages hold {}",
                summary.bytes, read.bytes
            ));
        }
        if summary.missed < read.missed {
            disagreements.push(format!(
                "{} missed, its sequence numbers skip {}",
                summary.missed, read.missed
            ));
        }
        if disagreements.is_empty() {
            return Ok(());
        }
        Err(self.corrupt_at(
            offset,
            format!("the summary says {}", disagreements.join("; ")),
        ))
    }

    fn take(&mut self, buffer: &mut [u8]) -> Result<(), RecordingError> {
        if (buffer.len() as u64) > self.remaining {
            return Err(self.corrupt(format!(
                "the file ends {} byte(s) into a {}-byte field (cut short?)",
                self.remaining,
                buffer.len()
            )));
        }
        self.file
            .read_exact(buffer)
            .map_err(|source| RecordingError::Io {
                path: self.path.clone(),
                cause: source,
            })?;
        self.offset += buffer.len() as u64;
        self.remaining -= buffer.len() as u64;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, RecordingError> {
        let mut bytes = [0u8; 4];
        self.take(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn json_bytes(&mut self, what: &str) -> Result<Vec<u8>, RecordingError> {
        let length = self.u32()?;
        if length > MAX_JSON {
            return Err(self.corrupt(format!("a {length}-byte {what} (at most {MAX_JSON})")));
        }
        let mut json = vec![0u8; length as usize];
        self.take(&mut json)?;
        Ok(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("ferromq-record-{tag}-{}.rec", std::process::id()))
    }

    fn header() -> Header {
        Header {
            device: "sampler".into(),
            session: "s".into(),
            channel: "data".into(),
            channel_config: "name=data,type=push".into(),
            started_unix_ms: 1,
            ferromq_version: "test".into(),
        }
    }

    fn record(sequence: u64, parts: &[&[u8]]) -> Record {
        Record {
            direction: Direction::Out,
            sequence,
            at: Duration::from_micros(sequence * 10),
            parts: parts
                .iter()
                .map(|part| Bytes::copy_from_slice(part))
                .collect(),
        }
    }

    /// The bytes of a finished recording of `records`, `missed` missed. The writer writes
    /// whatever it is given: records that break the format's rules make a file to refuse.
    fn written(tag: &str, records: &[Record], missed: u64) -> Vec<u8> {
        let path = scratch(tag);
        let mut writer = Writer::create(&path, &header()).unwrap();
        for record in records {
            writer.write(record).unwrap();
        }
        writer.finish(missed).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        bytes
    }

    /// Where the first message record starts.
    fn header_len() -> usize {
        MAGIC.len() + 4 + 4 + serde_json::to_vec(&header()).unwrap().len()
    }

    /// How many bytes `record` takes in a file.
    fn record_len(record: &Record) -> usize {
        22 + record
            .parts
            .iter()
            .map(|part| 8 + part.len())
            .sum::<usize>()
    }

    /// `bytes` read to the end as the file `run.fmqrec`: the sequence numbers read, or the
    /// error.
    fn read_all(bytes: &[u8]) -> Result<Vec<u64>, String> {
        let path = Path::new("run.fmqrec");
        let mut reader =
            Reader::from_reader(bytes, bytes.len() as u64, path).map_err(|e| e.to_string())?;
        let mut sequences = Vec::new();
        while let Some(record) = reader.next_record().map_err(|e| e.to_string())? {
            sequences.push(record.sequence);
        }
        Ok(sequences)
    }

    /// Reading `bytes` fails with `run.fmqrec at byte {offset}: {problem}`.
    fn check_refused(bytes: &[u8], offset: usize, problem: &str) {
        assert_eq!(
            read_all(bytes),
            Err(format!("run.fmqrec at byte {offset}: {problem}"))
        );
    }

    #[test]
    fn bytes_after_the_end_record_are_refused() {
        let finished = written("trailing", &[record(0, &[b"a"])], 0);
        assert_eq!(read_all(&finished), Ok(vec![0]));
        let end = finished.len();
        let mut written_on = finished.clone();
        written_on.push(0);
        check_refused(
            &written_on,
            end,
            "1 byte(s) after the end record, where the file should end",
        );
        let joined = [finished.as_slice(), finished.as_slice()].concat();
        check_refused(
            &joined,
            end,
            &format!("{end} byte(s) after the end record, where the file should end"),
        );
    }

    #[test]
    fn a_summary_that_disagrees_with_the_messages_is_refused() {
        // 2 messages, 4 bytes, sequence number 1 skipped.
        let records = [record(0, &[b"ab", b"c"]), record(2, &[b"d"])];
        let finished = written("summary", &records, 1);
        assert_eq!(read_all(&finished), Ok(vec![0, 2]));
        let end_at = header_len() + records.iter().map(record_len).sum::<usize>();
        let with_summary = |json: &str| {
            let mut bytes = finished[..end_at].to_vec();
            bytes.push(TAG_END);
            bytes.extend_from_slice(&json_len(json.as_bytes()).to_le_bytes());
            bytes.extend_from_slice(json.as_bytes());
            bytes
        };
        for (json, problem) in [
            (
                r#"{"messages":3,"bytes":4,"missed":1}"#,
                "the summary says 3 messages, the file holds 2",
            ),
            (
                r#"{"messages":2,"bytes":5,"missed":1}"#,
                "the summary says 5 bytes, its messages hold 4",
            ),
            (
                r#"{"messages":2,"bytes":4,"missed":0}"#,
                "the summary says 0 missed, its sequence numbers skip 1",
            ),
            (
                r#"{"messages":0,"bytes":0,"missed":0}"#,
                "the summary says 0 messages, the file holds 2; 0 bytes, its messages hold 4; \
                 0 missed, its sequence numbers skip 1",
            ),
        ] {
            check_refused(&with_summary(json), end_at, problem);
        }
        // More missed than skipped: the tap missed messages after the last one recorded.
        let missed_after = with_summary(r#"{"messages":2,"bytes":4,"missed":9}"#);
        assert_eq!(read_all(&missed_after), Ok(vec![0, 2]));
        // The numbers before the first message count too.
        let late_start = written("summary-late", &[record(3, &[b"x"])], 0);
        check_refused(
            &late_start,
            header_len() + record_len(&record(3, &[b"x"])),
            "the summary says 0 missed, its sequence numbers skip 3",
        );
    }

    #[test]
    fn a_sequence_number_not_above_the_one_before_is_refused() {
        let duplicate = [record(0, &[b"a"]), record(1, &[b"b"]), record(1, &[b"c"])];
        let backwards = [record(0, &[b"a"]), record(5, &[b"b"]), record(3, &[b"c"])];
        let third_at = header_len() + record_len(&duplicate[0]) + record_len(&duplicate[1]);
        check_refused(
            &written("duplicate", &duplicate, 0),
            third_at,
            "message 3 has sequence number 1, which channel \"data\" already had (message 2)",
        );
        check_refused(
            &written("backwards", &backwards, 4),
            third_at,
            "message 3 has sequence number 3, below message 2's 5: channel \"data\" numbers its \
             messages upward",
        );
        // Both directions share the numbers.
        let mut received = record(1, &[b"in"]);
        received.direction = Direction::In;
        let both_ways = written("both-ways", &[record(0, &[b"out"]), received], 0);
        assert_eq!(read_all(&both_ways), Ok(vec![0, 1]));
    }

    #[test]
    fn a_message_without_parts_is_refused() {
        let records = [record(0, &[b"a"]), record(1, &[])];
        check_refused(
            &written("no-parts", &records, 0),
            header_len() + record_len(&records[0]),
            "message 2 (sequence number 1) has 0 parts: a message has at least 1",
        );
    }

    #[test]
    fn what_is_written_reads_back_with_boundaries_and_summary() {
        let path = scratch("round-trip");
        let mut writer = Writer::create(&path, &header()).unwrap();
        let records = [record(0, &[b"a", b"", b"ccc"]), record(2, &[b"only"])];
        for record in &records {
            writer.write(record).unwrap();
        }
        let summary = writer.finish(1).unwrap();
        let mut reader = Reader::open(&path).unwrap();
        assert_eq!(reader.header(), &header());
        let mut read = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            read.push(record);
        }
        let _ = std::fs::remove_file(&path);
        assert_eq!(read, records);
        assert_eq!(
            summary,
            Summary {
                messages: 2,
                bytes: 8,
                missed: 1
            }
        );
        assert_eq!(reader.summary(), Some(summary));
    }

    #[test]
    fn a_cut_file_and_a_foreign_file_are_errors_naming_them() {
        let path = scratch("cut");
        let mut writer = Writer::create(&path, &header()).unwrap();
        writer.write(&record(0, &[b"0123456789"])).unwrap();
        writer.finish(0).unwrap();
        let full = std::fs::read(&path).unwrap();
        let summary = Summary {
            messages: 1,
            bytes: 10,
            missed: 0,
        };
        let message_end = full.len() - (1 + 4 + serde_json::to_vec(&summary).unwrap().len());
        // Cut in the middle of the part.
        std::fs::write(&path, &full[..message_end - 5]).unwrap();
        let mut reader = Reader::open(&path).unwrap();
        let error = reader.next_record().unwrap_err().to_string();
        assert!(error.contains("says 10 bytes, 5 are left"), "{error}");
        // Cut right after the message: readable, no summary.
        std::fs::write(&path, &full[..message_end]).unwrap();
        let mut reader = Reader::open(&path).unwrap();
        assert!(reader.next_record().unwrap().is_some());
        assert!(reader.next_record().unwrap().is_none());
        assert_eq!(reader.summary(), None);
        std::fs::write(&path, b"hello, this is not a recording at all").unwrap();
        let error = Reader::open(&path).err().unwrap().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(error.contains("is not a ferromq recording"), "{error}");
        // A directory read "is not a ferromq recording" (a bad-input sweep).
        let dir = std::env::temp_dir();
        let error = Reader::open(&dir).err().unwrap();
        let chain = ferromq_core::error_chain(&error);
        assert!(chain.contains("is a directory"), "{chain}");
    }

    #[test]
    fn a_forged_part_count_or_length_is_refused_before_allocating() {
        let path = scratch("forged");
        let mut writer = Writer::create(&path, &header()).unwrap();
        writer.write(&record(0, &[b"x"])).unwrap();
        writer.finish(0).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let header_len = MAGIC.len() + 8 + serde_json::to_vec(&header()).unwrap().len();
        // The part count of the first message.
        let count_at = header_len + 1 + 1 + 8 + 8;
        bytes[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let error = Reader::open(&path)
            .unwrap()
            .next_record()
            .unwrap_err()
            .to_string();
        let _ = std::fs::remove_file(&path);
        assert!(error.contains("parts (at most"), "{error}");
    }
}
