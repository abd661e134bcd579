//! The descriptor frames that travel over the zeromq metadata channel.
//!
//! One zmq frame carries a batch of records; a record is one (multipart) message; each part is
//! inline bytes (small payloads), a managed block, or a region range:
//!
//! ```text
//! frame  := magic "FMQSHM03" | session hash u64 | delivery | n_records u32 | record*
//! delivery := object | counter u32             (slot in the low 16 bits, its generation in
//!                                                the high 16; slot 0xFFFF: none)
//! record := n_parts u32 | part*
//! part   := 0 u8 | len u32 | bytes                 (inline)
//!         | 1 u8 | object | range                  (a block of a segment, its header before it)
//!         | 3 u8 | object | range | slot u32       (a block whose header is in the segment's
//!                                                    table of large-block headers)
//!         | 2 u8 | object | range | hint u64       (a range of a region)
//! object := creator pid u32 | index u32            (ObjectRef)
//! range  := offset u64 | size u64                  (WireRange: checked before any use)
//! ```
//! `delivery` names the sender's delivery counter (see `delivery.rs`): the receiver adds one to
//! it for every record it hands to its device. All integers little endian. Decoding checks every length against the frame; the offsets are
//! checked against the segment when the part is materialised.

use crate::error::ShmError;
use crate::names::{ObjectKind, ObjectName};

/// First bytes of every descriptor frame.
pub const MAGIC: &[u8; 8] = ferromq_zmq::SHMEM_DESCRIPTOR_MAGIC;

/// A shared-memory object a descriptor names: the process that created it and its index among
/// that process's objects of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// Process that created the object.
    pub creator_pid: u32,
    /// Its index.
    pub index: u32,
}

/// A byte range as a descriptor states it. Nothing in it is trusted: [`WireRange::checked`] is
/// the way from it to memory, and it refuses a range that would wrap or pass the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireRange {
    /// First byte, from the start of the object's data.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

impl WireRange {
    /// `base + offset .. base + offset + size` when every step fits in `usize` and the end is
    /// at most `limit`; `None` otherwise.
    pub fn checked(self, base: usize, limit: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(self.offset).ok()?.checked_add(base)?;
        let end = start.checked_add(usize::try_from(self.size).ok()?)?;
        (end <= limit).then_some(start..end)
    }
}

impl ObjectRef {
    /// The reference to the object called `name`.
    pub fn of(name: &ObjectName) -> ObjectRef {
        ObjectRef {
            creator_pid: name.creator_pid,
            index: name.index,
        }
    }
}

impl std::fmt::Display for WireRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.offset, self.size)
    }
}

/// Where a managed block's header lies (see `managed.rs`, "Block layout").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderAt {
    /// Right before the block's data.
    BeforeData,
    /// In this slot of the segment's table of large-block headers.
    Slot(u32),
}

/// One part of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartRef {
    /// The payload itself.
    Inline(crate::small::InlineBytes),
    /// A block of a managed segment.
    Block {
        /// The segment.
        segment: ObjectRef,
        /// The block's data offset and the bytes used.
        range: WireRange,
        /// Where the block's header is.
        header: HeaderAt,
    },
    /// A range of an unmanaged region.
    Region {
        /// The region.
        region: ObjectRef,
        /// The bytes, from the start of the region's data.
        range: WireRange,
        /// The creator's hint, handed back in its callback.
        hint: u64,
    },
}

/// The sender's delivery counter a frame names: slot `slot` of the header of `segment`, as
/// claimed for the `generation`th time (a receiver's add counts only while the slot's
/// generation is still this one; see `delivery.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeliveryRef {
    /// The sender's segment.
    pub segment: ObjectRef,
    /// Counter slot in the segment's header; [`DeliveryRef::NONE`]'s for a sender that does
    /// not count (publishers, requesters).
    pub slot: u16,
    /// Which claim of the slot the sender holds.
    pub generation: u16,
}

impl DeliveryRef {
    /// No counter: the receiver counts nothing.
    pub const NONE: DeliveryRef = DeliveryRef {
        segment: ObjectRef {
            creator_pid: 0,
            index: 0,
        },
        slot: u16::MAX,
        generation: u16::MAX,
    };

    /// True for a real counter.
    pub fn is_some(&self) -> bool {
        self.slot != u16::MAX
    }

    /// The counter's 4 bytes on the wire: slot in the low 16 bits, generation in the high 16
    /// (`NONE`'s are `u32::MAX`). Every value has one encoding, and every 4 bytes one value.
    fn packed(&self) -> u32 {
        u32::from(self.slot) | (u32::from(self.generation) << 16)
    }

    fn unpacked(segment: ObjectRef, packed: u32) -> DeliveryRef {
        DeliveryRef {
            segment,
            slot: (packed & 0xFFFF) as u16,
            generation: (packed >> 16) as u16,
        }
    }
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Where the receiver counts what it takes.
    pub delivery: DeliveryRef,
    /// The parts of every message, one after the other (one allocation per frame, not one
    /// per message).
    pub parts: Vec<PartRef>,
    /// The number of parts of each message, in order.
    pub record_lens: Vec<u32>,
}

impl Frame {
    /// The shared-memory objects the frame names: its delivery counter's segment and the segment
    /// or region of every part; repeats included.
    pub fn objects(&self) -> impl Iterator<Item = (ObjectKind, ObjectRef)> + '_ {
        let delivery = self
            .delivery
            .is_some()
            .then_some((ObjectKind::Segment, self.delivery.segment));
        let parts = self.parts.iter().filter_map(|part| match *part {
            PartRef::Block { segment, .. } => Some((ObjectKind::Segment, segment)),
            PartRef::Region { region, .. } => Some((ObjectKind::Region, region)),
            PartRef::Inline(_) => None,
        });
        delivery.into_iter().chain(parts)
    }

    /// The messages as separate lists of parts (a copy: for checks and tests).
    pub fn records(&self) -> Vec<Vec<PartRef>> {
        let mut parts = self.parts.iter();
        self.record_lens
            .iter()
            .map(|&n_parts| parts.by_ref().take(n_parts as usize).cloned().collect())
            .collect()
    }
}

/// First bytes of a ring announcement (see `ring.rs`): what a push sends to one pull, once, to
/// hand it the descriptor ring of their connection.
///
/// ```text
/// announce := magic "FMQRING2" | session hash u64 | object | range | delivery
/// ```
/// `object | range`: the ring's block, with a reference for the pull; `delivery`: the
/// sender's counter, which every record in the ring counts at.
pub const RING_MAGIC: &[u8; 8] = b"FMQRING2";
/// Bytes of a ring announcement.
pub const RING_ANNOUNCE_LEN: usize = 16 + BLOCK_REF_LEN + 12;
/// Bytes of a block reference (object and range), as an indirect ring entry holds it.
pub const BLOCK_REF_LEN: usize = 24;

/// A block reference: `object | range`.
pub fn encode_block_ref(object: ObjectRef, range: WireRange) -> [u8; BLOCK_REF_LEN] {
    let mut bytes = [0; BLOCK_REF_LEN];
    bytes[..4].copy_from_slice(&object.creator_pid.to_le_bytes());
    bytes[4..8].copy_from_slice(&object.index.to_le_bytes());
    bytes[8..16].copy_from_slice(&range.offset.to_le_bytes());
    bytes[16..].copy_from_slice(&range.size.to_le_bytes());
    bytes
}

/// Reads a block reference made by [`encode_block_ref`].
///
/// # Errors
/// [`ShmError::BadDescriptor`] when `bytes` is not one.
pub fn decode_block_ref(bytes: &[u8]) -> Result<(ObjectRef, WireRange), ShmError> {
    if bytes.len() != BLOCK_REF_LEN {
        return Err(ShmError::BadDescriptor {
            reason: format!(
                "a block reference has {BLOCK_REF_LEN} bytes, not {}",
                bytes.len()
            ),
        });
    }
    let mut reader = Reader { bytes, at: 0 };
    Ok((reader.object()?, reader.range()?))
}

/// A ring announced by a push: its block and the sender's delivery counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAnnounce {
    /// The segment holding the ring's block.
    pub segment: ObjectRef,
    /// The block.
    pub range: WireRange,
    /// Where the receiver counts the records it takes from the ring.
    pub delivery: DeliveryRef,
}

/// The announcement of `ring`, for `session_hash`.
pub fn encode_ring_announce(session_hash: u64, ring: RingAnnounce) -> Vec<u8> {
    let mut frame = Vec::with_capacity(RING_ANNOUNCE_LEN);
    frame.extend_from_slice(RING_MAGIC);
    frame.extend_from_slice(&session_hash.to_le_bytes());
    frame.extend_from_slice(&encode_block_ref(ring.segment, ring.range));
    frame.extend_from_slice(&ring.delivery.segment.creator_pid.to_le_bytes());
    frame.extend_from_slice(&ring.delivery.segment.index.to_le_bytes());
    frame.extend_from_slice(&ring.delivery.packed().to_le_bytes());
    frame
}

/// The ring a frame announces; `None` when the frame is no announcement.
///
/// # Errors
/// [`ShmError::BadDescriptor`] for an announcement of another session or of the wrong length.
pub fn decode_ring_announce(
    frame: &[u8],
    session_hash: u64,
) -> Option<Result<RingAnnounce, ShmError>> {
    if frame.len() < 8 || &frame[..8] != RING_MAGIC {
        return None;
    }
    if frame.len() != RING_ANNOUNCE_LEN {
        return Some(Err(ShmError::BadDescriptor {
            reason: format!(
                "a ring announcement has {RING_ANNOUNCE_LEN} bytes, not {}",
                frame.len()
            ),
        }));
    }
    let peer_session = u64::from_le_bytes(frame[8..16].try_into().expect("8 bytes"));
    if peer_session != session_hash {
        return Some(Err(ShmError::BadDescriptor {
            reason: "the peer belongs to another shmem session (check --session on both ends)"
                .to_owned(),
        }));
    }
    let decoded = decode_block_ref(&frame[16..16 + BLOCK_REF_LEN]).and_then(|(segment, range)| {
        let mut reader = Reader {
            bytes: &frame[16 + BLOCK_REF_LEN..],
            at: 0,
        };
        let delivery = DeliveryRef::unpacked(reader.object()?, reader.u32()?);
        Ok(RingAnnounce {
            segment,
            range,
            delivery,
        })
    });
    Some(decoded)
}

/// Bytes before the first record.
pub const FRAME_HEADER_LEN: usize = 32;

/// Appends `records` to a new frame for `session_hash`, naming the sender's `delivery` counter.
pub fn encode(session_hash: u64, delivery: DeliveryRef, records: &[Vec<PartRef>]) -> Vec<u8> {
    let mut frame = frame_header(session_hash, delivery, records.len() * 32);
    for record in records {
        append_record(&mut frame, record);
    }
    set_record_count(&mut frame, records.len());
    frame
}

/// A frame with no record yet, with room for `capacity` more bytes: records are appended with
/// [`append_record`], then [`set_record_count`] says how many there are.
pub fn frame_header(session_hash: u64, delivery: DeliveryRef, capacity: usize) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + capacity);
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&session_hash.to_le_bytes());
    frame.extend_from_slice(&delivery.segment.creator_pid.to_le_bytes());
    frame.extend_from_slice(&delivery.segment.index.to_le_bytes());
    frame.extend_from_slice(&delivery.packed().to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame
}

/// Writes the number of records into a frame made by [`frame_header`].
pub fn set_record_count(frame: &mut [u8], n_records: usize) {
    frame[FRAME_HEADER_LEN - 4..FRAME_HEADER_LEN]
        .copy_from_slice(&(n_records as u32).to_le_bytes());
}

/// The longest encoding of a part by reference: its kind, object and range, and a region's hint
/// (a slot takes 4 of those 8).
const MAX_REFERENCE_BYTES: usize = 1 + BLOCK_REF_LEN + 8;

/// One part by reference, encoded on the stack: the frame then grows once per part, not once
/// per field (a capacity check each).
struct ReferenceBytes {
    bytes: [u8; MAX_REFERENCE_BYTES],
    len: usize,
}

impl ReferenceBytes {
    fn new(kind: u8, object: ObjectRef, range: WireRange) -> ReferenceBytes {
        let mut encoded = ReferenceBytes {
            bytes: [0; MAX_REFERENCE_BYTES],
            len: 0,
        };
        encoded.put(&[kind]);
        encoded.put(&encode_block_ref(object, range));
        encoded
    }

    fn put(&mut self, field: &[u8]) {
        self.bytes[self.len..self.len + field.len()].copy_from_slice(field);
        self.len += field.len();
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Appends one record (one multipart message) to a frame.
pub fn append_record(frame: &mut Vec<u8>, record: &[PartRef]) {
    frame.extend_from_slice(&(record.len() as u32).to_le_bytes());
    for part in record {
        let encoded = match part {
            PartRef::Inline(bytes) => {
                let bytes = bytes.as_slice();
                frame.push(0);
                frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                frame.extend_from_slice(bytes);
                continue;
            }
            PartRef::Block {
                segment,
                range,
                header: HeaderAt::BeforeData,
            } => ReferenceBytes::new(1, *segment, *range),
            PartRef::Block {
                segment,
                range,
                header: HeaderAt::Slot(slot),
            } => {
                let mut encoded = ReferenceBytes::new(3, *segment, *range);
                encoded.put(&slot.to_le_bytes());
                encoded
            }
            PartRef::Region {
                region,
                range,
                hint,
            } => {
                let mut encoded = ReferenceBytes::new(2, *region, *range);
                encoded.put(&hint.to_le_bytes());
                encoded
            }
        };
        frame.extend_from_slice(encoded.as_slice());
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ShmError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| ShmError::BadDescriptor {
                reason: format!("frame of {} bytes ends inside a record", self.bytes.len()),
            })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, ShmError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, ShmError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, ShmError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn object(&mut self) -> Result<ObjectRef, ShmError> {
        Ok(ObjectRef {
            creator_pid: self.u32()?,
            index: self.u32()?,
        })
    }

    fn range(&mut self) -> Result<WireRange, ShmError> {
        Ok(WireRange {
            offset: self.u64()?,
            size: self.u64()?,
        })
    }
}

/// Decodes a frame that must belong to `session_hash`.
///
/// # Errors
/// [`ShmError::BadDescriptor`] naming what is wrong: not a ferromq shmem frame (a peer on
/// another transport), another session, or a truncated or malformed record.
pub fn decode(frame: &[u8], session_hash: u64) -> Result<Frame, ShmError> {
    let mut decoded = decode_scratch();
    decode_into(frame, session_hash, &mut decoded)?;
    Ok(decoded)
}

/// An empty [`Frame`] to decode into with [`decode_into`] (allocates nothing).
pub fn decode_scratch() -> Frame {
    Frame {
        delivery: DeliveryRef::NONE,
        parts: Vec::new(),
        record_lens: Vec::new(),
    }
}

/// [`decode`] into `decoded`, whose vectors are cleared and reused: a receiver that keeps one
/// [`Frame`] decodes frame after frame without allocating. On an error `decoded` holds
/// whatever was decoded before it; use none of it.
///
/// # Errors
/// As [`decode`].
pub fn decode_into(frame: &[u8], session_hash: u64, decoded: &mut Frame) -> Result<(), ShmError> {
    decoded.parts.clear();
    decoded.record_lens.clear();
    if frame.len() < FRAME_HEADER_LEN || &frame[..8] != MAGIC {
        return Err(ShmError::BadDescriptor {
            reason: "not a ferromq shmem frame: the peer uses another transport (zeromq?) or another protocol version"
                .to_owned(),
        });
    }
    let mut reader = Reader {
        bytes: frame,
        at: 8,
    };
    let peer_session = reader.u64()?;
    if peer_session != session_hash {
        return Err(ShmError::BadDescriptor {
            reason: "the peer belongs to another shmem session (check --session on both ends)"
                .to_owned(),
        });
    }
    let delivery = DeliveryRef::unpacked(reader.object()?, reader.u32()?);
    let n_records = reader.u32()? as usize;
    // Every record takes at least 4 bytes: a forged count cannot make us allocate wildly.
    if n_records > frame.len() / 4 {
        return Err(ShmError::BadDescriptor {
            reason: format!("{n_records} records cannot fit in {} bytes", frame.len()),
        });
    }
    decoded.delivery = delivery;
    decode_records(&mut reader, n_records, decoded)?;
    if reader.at != frame.len() {
        return Err(ShmError::BadDescriptor {
            reason: format!(
                "{} stray bytes after the last record",
                frame.len() - reader.at
            ),
        });
    }
    Ok(())
}

/// The hash that identifies a session on the wire.
pub fn session_hash(uid: u32, session: &str) -> u64 {
    format!("{uid}/{session}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Decodes `n_records` records from `reader` into `decoded`'s parts.
fn decode_records(
    reader: &mut Reader<'_>,
    n_records: usize,
    decoded: &mut Frame,
) -> Result<(), ShmError> {
    let frame_len = reader.bytes.len();
    let Frame {
        parts, record_lens, ..
    } = decoded;
    record_lens.reserve(n_records);
    parts.reserve(n_records);
    for _ in 0..n_records {
        let n_parts = reader.u32()? as usize;
        if n_parts > frame_len {
            return Err(ShmError::BadDescriptor {
                reason: format!("{n_parts} parts cannot fit in the frame"),
            });
        }
        record_lens.push(n_parts as u32);
        for _ in 0..n_parts {
            let part = match reader.u8()? {
                0 => {
                    let len = reader.u32()? as usize;
                    PartRef::Inline(crate::small::InlineBytes::copy_of(reader.take(len)?))
                }
                1 => PartRef::Block {
                    segment: reader.object()?,
                    range: reader.range()?,
                    header: HeaderAt::BeforeData,
                },
                3 => PartRef::Block {
                    segment: reader.object()?,
                    range: reader.range()?,
                    header: HeaderAt::Slot(reader.u32()?),
                },
                2 => PartRef::Region {
                    region: reader.object()?,
                    range: reader.range()?,
                    hint: reader.u64()?,
                },
                kind => {
                    return Err(ShmError::BadDescriptor {
                        reason: format!("unknown part kind {kind}"),
                    });
                }
            };
            parts.push(part);
        }
    }
    Ok(())
}

/// Decodes one record (as [`append_record`] wrote it, without a frame around it: a ring entry)
/// of the sender counting at `delivery` into `decoded`, whose vectors are cleared and reused.
///
/// # Errors
/// [`ShmError::BadDescriptor`] for a truncated or malformed record, or bytes after it.
pub fn decode_record_into(
    record: &[u8],
    delivery: DeliveryRef,
    decoded: &mut Frame,
) -> Result<(), ShmError> {
    decoded.parts.clear();
    decoded.record_lens.clear();
    decoded.delivery = delivery;
    let mut reader = Reader {
        bytes: record,
        at: 0,
    };
    decode_records(&mut reader, 1, decoded)?;
    if reader.at != record.len() {
        return Err(ShmError::BadDescriptor {
            reason: format!("{} stray bytes after the record", record.len() - reader.at),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_frame_is_as_long_as_zeromq_expects_a_descriptor_frame_to_be_at_least() {
        let empty = encode(1, DeliveryRef::NONE, &[]);
        assert_eq!(empty.len(), ferromq_zmq::SHMEM_DESCRIPTOR_MIN_LEN);
        assert!(empty.starts_with(ferromq_zmq::SHMEM_DESCRIPTOR_MAGIC));
    }

    fn records() -> Vec<Vec<PartRef>> {
        vec![
            vec![
                PartRef::Inline(b"header".into()),
                PartRef::Block {
                    segment: ObjectRef {
                        creator_pid: 7,
                        index: 0,
                    },
                    range: WireRange {
                        offset: 4160,
                        size: 9000,
                    },
                    header: HeaderAt::BeforeData,
                },
                PartRef::Block {
                    segment: ObjectRef {
                        creator_pid: 7,
                        index: 0,
                    },
                    range: WireRange {
                        offset: 1 << 20,
                        size: 1 << 20,
                    },
                    header: HeaderAt::Slot(1023),
                },
            ],
            vec![PartRef::Region {
                region: ObjectRef {
                    creator_pid: 8,
                    index: 1,
                },
                range: WireRange {
                    offset: 0,
                    size: 64,
                },
                hint: 99,
            }],
            vec![],
        ]
    }

    const COUNTER: DeliveryRef = DeliveryRef {
        segment: ObjectRef {
            creator_pid: 7,
            index: 0,
        },
        slot: 3,
        generation: 2,
    };

    #[test]
    fn a_wire_range_past_the_end_or_wrapping_is_refused() {
        let range = |offset, size| WireRange { offset, size };
        assert_eq!(range(10, 5).checked(100, 200), Some(110..115));
        assert_eq!(range(10, 5).checked(0, 15), Some(10..15));
        assert_eq!(range(10, 6).checked(0, 15), None);
        assert_eq!(range(u64::MAX, 1).checked(0, usize::MAX), None);
        assert_eq!(range(1, u64::MAX).checked(0, usize::MAX), None);
        assert_eq!(range(0, 1).checked(usize::MAX, usize::MAX), None);
    }

    #[test]
    fn round_trip() {
        for delivery in [COUNTER, DeliveryRef::NONE] {
            let frame = encode(42, delivery, &records());
            let decoded = decode(&frame, 42).unwrap();
            assert_eq!(decoded.records(), records());
            assert_eq!(decoded.delivery, delivery);
        }
    }

    /// Whatever 4 bytes name the counter decode to a value that encodes to them again (the
    /// fuzz target's check): "none" keeps the object it came with, and a slot of "none" with
    /// another generation stays as it came.
    #[test]
    fn every_counter_word_encodes_back_to_itself() {
        let object = COUNTER.segment;
        for packed in [u32::MAX, 0x00FF_FFFF, 0xFFFF_0003, 0x0002_0003, 0] {
            let delivery = DeliveryRef::unpacked(object, packed);
            assert_eq!(delivery.packed(), packed);
            let frame = encode(42, delivery, &records());
            assert_eq!(
                encode(42, decode(&frame, 42).unwrap().delivery, &records()),
                frame
            );
        }
        assert!(!DeliveryRef::unpacked(object, u32::MAX).is_some());
        assert!(DeliveryRef::unpacked(object, 0x0002_0003).is_some());
    }

    #[test]
    fn every_truncation_and_foreign_frame_is_an_error() {
        let frame = encode(42, COUNTER, &records());
        for len in 0..frame.len() {
            assert!(decode(&frame[..len], 42).is_err(), "truncated at {len}");
        }
        assert!(
            decode(&frame, 43)
                .unwrap_err()
                .to_string()
                .contains("another shmem session")
        );
        assert!(
            decode(b"plain zeromq payload bytes", 42)
                .unwrap_err()
                .to_string()
                .contains("another transport")
        );
        let mut forged = encode(42, COUNTER, &[]);
        forged[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&forged, 42).is_err());
    }
}
