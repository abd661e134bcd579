//! The rpc frame: what travels between two members, as the first part of a multipart message.
//!
//! ```text
//! frame   = header record*            (part 0; buffers of calls that carry one are parts 1..)
//! header  = "FRPC" version:u8 0:u8 from:u32 n_records:u32           (14 bytes, little endian)
//! record  = kind:u8 flags:u8 status:u8 arity:u8 root:u32 handler:u64 seq:u64
//!           payload_len:u32 0:u32 payload                           (32 + payload_len bytes)
//!         | 7:u8 payload_len:u16 payload                             (3 + payload_len bytes)
//! ```
//!
//! The second form ([`KIND_CALL_REPEAT`]) is a fire-and-forget call without a buffer to the
//! handler of the call record before it in the same frame: what a stream of small calls to one
//! handler is made of. For 8-byte arguments it is 11 bytes instead of 40, so a frame carries
//! three and a half times the calls and a copying transport (zeromq) moves a quarter of the
//! bytes. It stands only for a call that is plain in every field (no status, root or arity).
//!
//! A call's payload is its arguments, serialised by postcard straight into the frame (which is
//! shared memory on shmem, see `outlet.rs`); a reply's is the result, or for a failure the
//! handler's name and the cause. Records that carry a buffer (flag [`BUFFER`]) take the next
//! unused part, in record order (a fetched buffer too). A pull call (flag [`PULL`]) leaves its
//! buffer with the caller until the destination fetches it ([`KIND_FETCH`], [`KIND_FETCHED`]). Everything read from a frame is bounds-checked: a truncated or
//! forged frame is an error, never a panic.

use thiserror::Error;

pub(crate) const MAGIC: &[u8; 4] = b"FRPC";
pub(crate) const VERSION: u8 = 2;
pub(crate) const HEADER_LEN: usize = 14;
pub(crate) const RECORD_HEAD_LEN: usize = 32;
/// The head of a [`KIND_CALL_REPEAT`] record.
pub(crate) const REPEAT_HEAD_LEN: usize = 3;
const N_RECORDS_AT: usize = 10;
const PAYLOAD_LEN_AT: usize = 24;

/// A call: run `handler` with the payload as arguments.
pub(crate) const KIND_CALL: u8 = 1;
/// The result of a call that asked for one (`seq` names the call).
pub(crate) const KIND_REPLY: u8 = 2;
/// A call was consumed (its handler ran), or failed (`status`).
pub(crate) const KIND_ACK: u8 = 3;
/// A broadcast: run `handler` and pass the record on to the children in the tree of `root`.
pub(crate) const KIND_BROADCAST: u8 = 4;
/// The destination of a pull call asks its caller for the buffer `seq` names.
pub(crate) const KIND_FETCH: u8 = 5;
/// The caller answers a fetch: the buffer (flag [`BUFFER`]), or a status saying it has none.
pub(crate) const KIND_FETCHED: u8 = 6;
/// A fire-and-forget call without a buffer to the handler of the frame's call record before it,
/// in the short form (`kind payload_len:u16 payload`). Read, it is a [`KIND_CALL`] record.
pub(crate) const KIND_CALL_REPEAT: u8 = 7;

/// The record carries a buffer: the next unused part of the message.
pub(crate) const BUFFER: u8 = 1;
/// The caller waits for the result (a [`KIND_REPLY`] record).
pub(crate) const WANTS_RESULT: u8 = 2;
/// The caller waits until the call was consumed (a [`KIND_ACK`] record).
pub(crate) const WANTS_ACK: u8 = 4;
/// The caller holds the buffer: the destination fetches it ([`KIND_FETCH`]) before the handler.
pub(crate) const PULL: u8 = 8;

/// How a call ended at its destination, as a reply or acknowledgement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// The handler ran; the payload is its result.
    Ok = 0,
    /// The destination has no handler with the id.
    UnknownHandler = 1,
    /// The arguments did not decode as the handler's argument type.
    BadArguments = 2,
    /// The handler panicked.
    Panicked = 3,
    /// The frame was malformed (a record announced a buffer the message did not have).
    BadFrame = 4,
}

impl Status {
    fn from_byte(byte: u8) -> Result<Status, WireError> {
        Ok(match byte {
            0 => Status::Ok,
            1 => Status::UnknownHandler,
            2 => Status::BadArguments,
            3 => Status::Panicked,
            4 => Status::BadFrame,
            other => return Err(WireError::Status(other)),
        })
    }
}

/// A frame that cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// The message does not start with an rpc frame header.
    #[error("not an rpc frame (it does not start with FRPC, or is shorter than its header)")]
    NotRpc,
    /// A frame of another version of this protocol.
    #[error("rpc frame version {0} (this build speaks {VERSION})")]
    Version(u8),
    /// A record longer than what is left of the frame.
    #[error("record {record} is cut off: it needs {needed} bytes, {left} are left")]
    Truncated {
        /// The record's index in the frame.
        record: u32,
        /// The bytes it needs.
        needed: usize,
        /// The bytes the frame has left.
        left: usize,
    },
    /// A record of a kind this build does not know.
    #[error("record kind {0} is unknown")]
    Kind(u8),
    /// A short call record with no call record before it in the frame to take the handler of.
    #[error("record {0} repeats the handler of the call before it, and no call came before it")]
    RepeatWithoutCall(u32),
    /// A status this build does not know.
    #[error("status {0} is unknown")]
    Status(u8),
    /// Bytes after the records the header announced.
    #[error("{0} bytes follow the last record")]
    Trailing(usize),
}

/// The fixed part of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHead {
    pub kind: u8,
    pub flags: u8,
    pub status: Status,
    /// Broadcast only: the fan-out of the tree.
    pub arity: u8,
    /// Broadcast only: the member that started it.
    pub root: u32,
    pub handler: u64,
    /// The caller's number for the call (0: the caller waits for nothing).
    pub seq: u64,
}

impl RecordHead {
    pub(crate) fn call(handler: u64, seq: u64, flags: u8) -> RecordHead {
        RecordHead {
            kind: KIND_CALL,
            flags,
            status: Status::Ok,
            arity: 0,
            root: 0,
            handler,
            seq,
        }
    }

    pub(crate) fn answer(kind: u8, handler: u64, seq: u64, status: Status) -> RecordHead {
        RecordHead {
            kind,
            flags: 0,
            status,
            arity: 0,
            root: 0,
            handler,
            seq,
        }
    }

    /// The record head with the payload length still 0 (patched by [`set_payload_len`]).
    pub(crate) fn encode(&self) -> [u8; RECORD_HEAD_LEN] {
        let mut head = [0u8; RECORD_HEAD_LEN];
        head[0] = self.kind;
        head[1] = self.flags;
        head[2] = self.status as u8;
        head[3] = self.arity;
        head[4..8].copy_from_slice(&self.root.to_le_bytes());
        head[8..16].copy_from_slice(&self.handler.to_le_bytes());
        head[16..24].copy_from_slice(&self.seq.to_le_bytes());
        head
    }
}

/// The header of a frame from member `from`, with no records yet.
pub(crate) fn frame_header(from: u32) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(MAGIC);
    header[4] = VERSION;
    header[6..10].copy_from_slice(&from.to_le_bytes());
    header
}

/// Writes the number of records into a frame's header.
pub(crate) fn set_record_count(frame: &mut [u8], n_records: u32) {
    frame[N_RECORDS_AT..N_RECORDS_AT + 4].copy_from_slice(&n_records.to_le_bytes());
}

/// Writes the payload length into the record head that starts at `head_at`.
pub(crate) fn set_payload_len(frame: &mut [u8], head_at: usize, len: u32) {
    let at = head_at + PAYLOAD_LEN_AT;
    frame[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// What a short call record ([`KIND_CALL_REPEAT`]) stands for: a plain call to the handler of
/// the frame's last call record. The writers (an outlet's frame, [`write_frame`]) and the
/// reader each keep one per frame, so both ends apply the same rule.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LastCall(Option<u64>);

impl LastCall {
    /// Whether `head` may be written short after the records so far: fire and forget, no
    /// buffer, to the same handler, and nothing else set that the short form would lose (found
    /// by the `rpc-frame` fuzz target: a forged call with a status, written again, read back
    /// without it).
    pub(crate) fn repeated_by(self, head: &RecordHead) -> bool {
        self.0 == Some(head.handler) && *head == RecordHead::call(head.handler, 0, 0)
    }

    /// Whether a plain call (see [`RecordHead::call`] with no seq or flags) to `handler` may be
    /// written short: [`LastCall::repeated_by`] for a caller that knows its call is plain.
    pub(crate) fn repeated_by_plain_call_to(self, handler: u64) -> bool {
        self.0 == Some(handler)
    }

    /// Notes a record written or read.
    pub(crate) fn saw(&mut self, head: &RecordHead) {
        if head.kind == KIND_CALL {
            self.0 = Some(head.handler);
        }
    }
}

/// A frame from member `from` holding `records`, written as an outlet writes them: a plain call
/// to the handler of the frame's previous call record takes the short form when its payload's
/// length fits one. What the tests and the fuzzer's seeds are made of (the outlet writes into
/// lent memory as it serialises, see `outlet.rs`).
pub(crate) fn write_frame(from: u32, records: &[Record<'_>]) -> Vec<u8> {
    let mut frame = frame_header(from).to_vec();
    let mut last_call = LastCall::default();
    for record in records {
        let head = record.head;
        let repeat = last_call.repeated_by(&head);
        match u16::try_from(record.payload.len()) {
            Ok(short_len) if repeat => {
                frame.push(KIND_CALL_REPEAT);
                frame.extend_from_slice(&short_len.to_le_bytes());
            }
            _ => {
                let head_at = frame.len();
                frame.extend_from_slice(&head.encode());
                let len = u32::try_from(record.payload.len()).unwrap_or(u32::MAX);
                set_payload_len(&mut frame, head_at, len);
            }
        }
        frame.extend_from_slice(record.payload);
        last_call.saw(&head);
    }
    set_record_count(&mut frame, u32::try_from(records.len()).unwrap_or(u32::MAX));
    frame
}

/// One record read from a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub head: RecordHead,
    pub payload: &'a [u8],
}

/// The payload length a short record's head at the start of `record` gives, and the bytes
/// after the head; `None` when the head is cut off.
#[inline]
fn short_head(record: &[u8]) -> Option<(usize, &[u8])> {
    let [_, len_0, len_1, rest @ ..] = record else {
        return None;
    };
    Some((usize::from(u16::from_le_bytes([*len_0, *len_1])), rest))
}

/// A frame whose header was checked; its records are read one by one.
pub(crate) struct FrameReader<'a> {
    pub from: u32,
    n_records: u32,
    next: u32,
    rest: &'a [u8],
    /// What a [`KIND_CALL_REPEAT`] record stands for.
    last_call: LastCall,
}

impl<'a> FrameReader<'a> {
    pub(crate) fn new(frame: &'a [u8]) -> Result<FrameReader<'a>, WireError> {
        if frame.len() < HEADER_LEN || &frame[..4] != MAGIC {
            return Err(WireError::NotRpc);
        }
        if frame[4] != VERSION {
            return Err(WireError::Version(frame[4]));
        }
        let from = u32::from_le_bytes(frame[6..10].try_into().expect("4 bytes"));
        let n_records = u32::from_le_bytes(frame[10..14].try_into().expect("4 bytes"));
        Ok(FrameReader {
            from,
            n_records,
            next: 0,
            rest: &frame[HEADER_LEN..],
            last_call: LastCall::default(),
        })
    }

    /// The payload of the next record when it is a well-formed short call
    /// ([`KIND_CALL_REPEAT`]) to `handler` (the frame's last call record's): the reader moves
    /// past it. `None`, the reader staying where it is, for anything else, which
    /// [`FrameReader::next_record`] then reads or reports. What a handler's run of a frame's
    /// short calls reads them with ([`crate::handlers`]).
    #[inline]
    pub(crate) fn next_short_call_to(&mut self, handler: u64) -> Option<&'a [u8]> {
        if !self.at_short_call_to(handler) {
            return None;
        }
        let (payload_len, rest) = short_head(self.rest)?;
        let (payload, rest) = rest.split_at_checked(payload_len)?;
        self.rest = rest;
        self.next += 1;
        Some(payload)
    }

    /// Whether the next record is a short call to `handler` (well-formed or not: see
    /// [`FrameReader::next_short_call_to`]).
    #[inline]
    pub(crate) fn at_short_call_to(&self, handler: u64) -> bool {
        self.next < self.n_records
            && self.rest.first() == Some(&KIND_CALL_REPEAT)
            && self.last_call.0 == Some(handler)
    }

    /// The next record; `None` after the last, an error for a malformed one (and then `None`).
    /// Inlined into the dispatcher's loop: called there, the head came back through memory and
    /// was read again field by field, stalls that were a fifth of the dispatcher's time for
    /// 8-byte calls (perf annotate, `ferromq bench rpc --mode trad`).
    #[inline]
    pub(crate) fn next_record(&mut self) -> Option<Result<Record<'a>, WireError>> {
        if self.next == self.n_records {
            if self.rest.is_empty() {
                return None;
            }
            let trailing = self.rest.len();
            self.rest = &[];
            return Some(Err(WireError::Trailing(trailing)));
        }
        let record = self.read_record();
        if record.is_err() {
            self.next = self.n_records;
            self.rest = &[];
        } else {
            self.next += 1;
        }
        Some(record)
    }

    #[inline]
    fn read_record(&mut self) -> Result<Record<'a>, WireError> {
        let truncated = |needed: usize, left: usize| WireError::Truncated {
            record: self.next,
            needed,
            left,
        };
        if self.rest.first() == Some(&KIND_CALL_REPEAT) {
            let Some((payload_len, rest)) = short_head(self.rest) else {
                return Err(truncated(REPEAT_HEAD_LEN, self.rest.len()));
            };
            let handler = self
                .last_call
                .0
                .ok_or(WireError::RepeatWithoutCall(self.next))?;
            if rest.len() < payload_len {
                return Err(truncated(REPEAT_HEAD_LEN + payload_len, self.rest.len()));
            }
            let (payload, rest) = rest.split_at(payload_len);
            self.rest = rest;
            let head = RecordHead::call(handler, 0, 0);
            return Ok(Record { head, payload });
        }
        if self.rest.len() < RECORD_HEAD_LEN {
            return Err(truncated(RECORD_HEAD_LEN, self.rest.len()));
        }
        let (head, rest) = self.rest.split_at(RECORD_HEAD_LEN);
        let kind = head[0];
        if !(KIND_CALL..=KIND_FETCHED).contains(&kind) {
            return Err(WireError::Kind(kind));
        }
        let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
        let payload_len = u32::from_le_bytes(
            head[PAYLOAD_LEN_AT..PAYLOAD_LEN_AT + 4]
                .try_into()
                .expect("4 bytes"),
        ) as usize;
        if rest.len() < payload_len {
            return Err(truncated(RECORD_HEAD_LEN + payload_len, self.rest.len()));
        }
        let head = RecordHead {
            kind,
            flags: head[1],
            status: Status::from_byte(head[2])?,
            arity: head[3],
            root: u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")),
            handler: word(8),
            seq: word(16),
        };
        let (payload, rest) = rest.split_at(payload_len);
        self.rest = rest;
        self.last_call.saw(&head);
        Ok(Record { head, payload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_of(records: &[(RecordHead, &[u8])]) -> Vec<u8> {
        let records: Vec<Record<'_>> = records
            .iter()
            .map(|&(head, payload)| Record { head, payload })
            .collect();
        write_frame(7, &records)
    }

    /// A plain call to `handler` with the first payload, then short records with the rest.
    fn frame_with_repeats(handler: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let call = RecordHead::call(handler, 0, 0);
        let records: Vec<_> = payloads.iter().map(|&payload| (call, payload)).collect();
        frame_of(&records)
    }

    #[test]
    fn short_records_are_calls_to_the_handler_of_the_call_before_them() {
        let frame = frame_with_repeats(0xbeef, &[b"first", b"", b"third"]);
        assert_eq!(
            frame.len(),
            HEADER_LEN + RECORD_HEAD_LEN + 5 + 2 * REPEAT_HEAD_LEN + 5
        );
        let mut reader = FrameReader::new(&frame).unwrap();
        let mut read = Vec::new();
        while let Some(record) = reader.next_record() {
            let record = record.unwrap();
            read.push((record.head, record.payload));
        }
        let call = RecordHead::call(0xbeef, 0, 0);
        assert_eq!(
            read,
            vec![
                (call, &b"first"[..]),
                (call, &b""[..]),
                (call, &b"third"[..])
            ]
        );

        // A reply between them does not change whose handler they repeat.
        let mut frame = frame_of(&[
            (RecordHead::call(5, 0, 0), b"a"),
            (RecordHead::answer(KIND_REPLY, 9, 1, Status::Ok), b"r"),
        ]);
        frame.extend_from_slice(&[KIND_CALL_REPEAT, 1, 0, b'b']);
        set_record_count(&mut frame, 3);
        let mut reader = FrameReader::new(&frame).unwrap();
        let handlers: Vec<u64> = std::iter::from_fn(|| reader.next_record())
            .map(|record| record.unwrap().head.handler)
            .collect();
        assert_eq!(handlers, vec![5, 9, 5]);
    }

    #[test]
    fn a_run_of_short_calls_is_read_while_it_lasts_and_only_for_its_handler() {
        // A whole call, two short ones, a whole call to another handler, a short one to it.
        let mut frame = frame_with_repeats(5, &[b"a", b"bc", b""]);
        let tail = frame_with_repeats(6, &[b"x", b"y"]);
        frame.extend_from_slice(&tail[HEADER_LEN..]);
        set_record_count(&mut frame, 5);
        let mut reader = FrameReader::new(&frame).unwrap();
        // Not before the call they repeat.
        assert!(!reader.at_short_call_to(5));
        assert_eq!(reader.next_short_call_to(5), None);
        assert_eq!(reader.next_record().unwrap().unwrap().payload, b"a");
        // Not for another handler, which leaves the reader where it was.
        assert!(reader.at_short_call_to(5) && !reader.at_short_call_to(6));
        assert_eq!(reader.next_short_call_to(6), None);
        assert_eq!(reader.next_short_call_to(5), Some(&b"bc"[..]));
        assert_eq!(reader.next_short_call_to(5), Some(&b""[..]));
        // A whole record ends the run; the reader reads it as before.
        assert_eq!(reader.next_short_call_to(5), None);
        let record = reader.next_record().unwrap().unwrap();
        assert_eq!((record.head.handler, record.payload), (6, &b"x"[..]));
        assert_eq!(reader.next_short_call_to(6), Some(&b"y"[..]));
        assert_eq!(reader.next_short_call_to(6), None);
        assert_eq!(reader.next_record(), None);

        // A truncated short record is left for `next_record` to report; so is one past the
        // frame's count.
        let whole = frame_with_repeats(5, &[b"a", b"bcd"]);
        let mut reader = FrameReader::new(&whole[..whole.len() - 1]).unwrap();
        reader.next_record().unwrap().unwrap();
        assert_eq!(reader.next_short_call_to(5), None);
        assert!(matches!(
            reader.next_record(),
            Some(Err(WireError::Truncated { record: 1, .. }))
        ));
        let mut counted_one = whole.clone();
        set_record_count(&mut counted_one, 1);
        let mut reader = FrameReader::new(&counted_one).unwrap();
        reader.next_record().unwrap().unwrap();
        assert_eq!(reader.next_short_call_to(5), None);
        assert!(matches!(
            reader.next_record(),
            Some(Err(WireError::Trailing(_)))
        ));
    }

    /// The `rpc-frame` fuzz target's first finding (seed 2, input 1 866 328): a call to the
    /// same handler with a status set was written short and read back without it.
    #[test]
    fn a_call_with_anything_the_short_form_would_lose_is_written_whole() {
        let plain = RecordHead::call(5, 0, 0);
        let mut with_status = plain;
        with_status.status = Status::UnknownHandler;
        let mut with_root = plain;
        with_root.root = 3;
        let mut with_arity = plain;
        with_arity.arity = 2;
        let heads = [plain, with_status, with_root, with_arity, plain];
        let frame = frame_of(&heads.map(|head| (head, &b"x"[..])));
        assert_eq!(
            frame.len(),
            HEADER_LEN + 4 * (RECORD_HEAD_LEN + 1) + REPEAT_HEAD_LEN + 1
        );
        let mut reader = FrameReader::new(&frame).unwrap();
        let read: Vec<RecordHead> = std::iter::from_fn(|| reader.next_record())
            .map(|record| record.unwrap().head)
            .collect();
        assert_eq!(read, heads);
    }

    #[test]
    fn a_short_record_with_no_call_before_it_is_named() {
        let mut frame = frame_header(7).to_vec();
        frame.extend_from_slice(&[KIND_CALL_REPEAT, 0, 0]);
        set_record_count(&mut frame, 1);
        let mut reader = FrameReader::new(&frame).unwrap();
        assert_eq!(
            reader.next_record(),
            Some(Err(WireError::RepeatWithoutCall(0)))
        );
        assert_eq!(reader.next_record(), None);
        assert_eq!(
            WireError::RepeatWithoutCall(0).to_string(),
            "record 0 repeats the handler of the call before it, and no call came before it"
        );
    }

    #[test]
    fn records_come_back_as_written() {
        let call = RecordHead::call(0xfeed, 3, BUFFER | WANTS_RESULT);
        let reply = RecordHead::answer(KIND_REPLY, 0xfeed, 3, Status::Panicked);
        let frame = frame_of(&[(call, b"args"), (reply, b"")]);
        let mut reader = FrameReader::new(&frame).unwrap();
        assert_eq!(reader.from, 7);
        let first = reader.next_record().unwrap().unwrap();
        assert_eq!((first.head, first.payload), (call, &b"args"[..]));
        let second = reader.next_record().unwrap().unwrap();
        assert_eq!((second.head, second.payload), (reply, &b""[..]));
        assert!(reader.next_record().is_none());
    }

    #[test]
    fn every_cut_of_a_frame_is_an_error_not_a_panic() {
        let call = RecordHead::call(1, 1, 0);
        let long = frame_of(&[(call, b"0123456789"), (call, b"x")]);
        let short = frame_with_repeats(1, &[b"0123456789", b"x"]);
        for (frame, cut) in [&long, &short]
            .into_iter()
            .flat_map(|frame| (0..frame.len()).map(move |cut| (frame, cut)))
        {
            let outcome = FrameReader::new(&frame[..cut]).map(|mut reader| {
                let mut n_ok = 0;
                while let Some(record) = reader.next_record() {
                    if record.is_err() {
                        return Err(());
                    }
                    n_ok += 1;
                }
                Ok(n_ok)
            });
            assert!(
                !matches!(outcome, Ok(Ok(2))),
                "a frame cut at {cut} read as whole"
            );
        }
    }

    #[test]
    fn forged_fields_are_named() {
        let mut frame = frame_of(&[(RecordHead::call(1, 1, 0), b"")]);
        frame[HEADER_LEN] = 99;
        let mut reader = FrameReader::new(&frame).unwrap();
        assert_eq!(reader.next_record(), Some(Err(WireError::Kind(99))));
        let mut frame = frame_of(&[(RecordHead::call(1, 1, 0), b"")]);
        set_payload_len(&mut frame, HEADER_LEN, u32::MAX);
        let mut reader = FrameReader::new(&frame).unwrap();
        assert!(matches!(
            reader.next_record(),
            Some(Err(WireError::Truncated { record: 0, .. }))
        ));
        let mut frame = frame_of(&[]);
        frame[4] = 9;
        assert_eq!(FrameReader::new(&frame).err(), Some(WireError::Version(9)));
        assert_eq!(FrameReader::new(b"ZMTP").err(), Some(WireError::NotRpc));
    }
}
