//! Descriptor rings: how a shmem push hands descriptors to a pull on the same host without a
//! socket operation per message.
//!
//! A push makes one ring per connection, in a block of its own segment, and announces it to
//! that peer alone over the zeromq metadata connection (ferromq's own ZMTP push writes a frame
//! to one connection: `ferromq_zmq::PeerLink`). From then on every record for that peer is a
//! descriptor frame written into the ring: single producer (the push, under its outbox lock),
//! single consumer (the pull that adopted the announcement). Nothing else travels over zeromq
//! for it but a **doorbell**: a consumer with nothing to take raises its `sleeping` word before
//! it waits on its socket; a producer that finds the word raised after publishing takes it down
//! and rings the consumer's bell (a datagram, `bell.rs`), or where it has none sends one empty
//! descriptor frame to that peer. A consumer that keeps up or spins is never
//! woken by a syscall, and a busy-polled one never raises the word.
//!
//! # Layout (in the block's data, offsets from its start)
//! ```text
//! 0    tail u64      bytes ever written (producer; release)
//! 64   head u64      bytes ever taken (consumer; release)
//! 128  sleeping u32  1: the consumer waits on its socket and wants a doorbell
//! 132  closed u32    1: the producer writes nothing more
//! 136  consumer u32  pid of the process that adopted the ring (0 before)
//! 140  hungry u32    1: the consumer looked and found nothing (it wants entries published);
//!                    a busy-polled consumer clears it only while it takes a stream
//! 144  rung_at u64   when the producer last rang the doorbell (CLOCK_MONOTONIC, ns)
//! 152  finished u32  which end finished with the ring first: 1 the producer, 2 the consumer;
//!                    3 once the last end released what was left
//! 160  bell u64      the consumer's bell (`bell.rs`) that a doorbell rings; 0: none, the
//!                    doorbell is a frame
//! 168  consumer_start u64
//!                    start time of the process that adopted the ring (clock ticks since
//!                    boot, from /proc), written before `consumer`; 0: unknown (the pid alone
//!                    counts then)
//! 176  handed_over u32
//!                    1: the producer's close left what the consumer had not taken to it
//!                    (reported handed over, not lost), written before its `finished` mark
//! 180  taken_at_finish u32
//!                    messages the consumer had taken from the ring and not handed out when
//!                    it finished, written before its `finished` mark
//! 256  data          RING_DATA bytes: entries at offsets that are multiples of 8
//! entry := len u32 | kind u32 | len bytes | padding to 8      (kind 0: a record;
//!          len u32::MAX: the rest up to the end is skipped    kind 1: a block holding one;
//!          kind's top bit is set in every header written)
//! ```
//! Head and tail each have a cache line, so the producer's writes and the consumer's never
//! share one; each side reads the other's counter only when its own copy says full or empty
//! (a consumer that reads headers reads no tail: below).
//!
//! # Headers as readiness
//! The producer commits an entry by storing its header word last (release), after its bytes
//! and after clearing the header slot just past it; a skip is stored after the entry it skips
//! to. So the header slot at any position a consumer can reach next is 0 until an entry is
//! committed there (the first one is cleared when the ring is made), and a consumer can find
//! entries by their headers instead of by the tail. A busy-polled consumer does: waiting for
//! a tail it must read the tail's line and then the entry's, one transfer between cores after
//! the other, where the header comes with the entry's first line (interleaved on a 2-core
//! machine: busy-polled `ferromq bench --latency` p50 3-5 % lower, p99 14 %; busy
//! `call_return` p50 8 %; streaming unchanged). Its head may then pass the published tail,
//! which nobody else minds (the producer compares it with its own tail; what a finished ring
//! still holds is read up to the tail its close published). Other consumers keep reading the
//! tail: a consumer that keeps up with a stream takes runs of entries the producer has finished
//! with instead of each line while it is written. A header slot costs the producer 8 bytes of
//! room beyond each entry. Any header written has `kind`'s top bit set, so no committed header
//! is 0 (an empty record's would be otherwise; the property test found that).
//!
//! # Trust
//! A ring's memory can be written by a broken peer at any time. The consumer copies an entry
//! out (`Segment::copy_out`, no reference to shared bytes) before decoding it, checks every
//! length against the ring, and refuses counters that would put more than the ring in flight
//! (a consumer that reads headers has no tail to check: an entry must end within the ring, and
//! a head that is not a multiple of 8 is refused when the ring is adopted); the frame inside is
//! decoded and checked like one from a socket.
//!
//! # Peer death and drop
//! The ring's block holds two references, the producer's and the consumer's, each dropped by
//! its side's handle; the owner reclaims it when both are gone. A consumer that dies leaves its
//! reference, which its producer gives back once it finds the consumer gone (below), and the
//! records in the ring are counted as not taken by the sender (`delivery.rs`), lost, out of its
//! window once it dropped the ring (`socket.rs`'s `ConnectionRing::finish_gone`). A producer that
//! exits leaves the ring readable: its segment outlives it while a process of the session lives
//! (`cleanup.rs`), so a stalled consumer still takes everything after it resumes.
//!
//! The entries nobody takes hold references to their messages' blocks. When both sides are
//! done, exactly one of them releases those: each side, done with the ring, marks `finished`
//! by compare-and-swap from 0 ([`RingProducer::finish`], after its last write;
//! [`RingConsumer::finish`], after its last take). The side that finds the other's mark is
//! the last one at the ring, alone with it: it releases what the ring still holds. A consumer
//! that leaves first thus leaves its untaken entries to the producer (which may still write
//! some before it sees the connection gone); a producer that finishes first leaves them to its
//! consumer, which may still take them all. The last end then marks the ring settled (3). A
//! producer whose close reported what its consumer had not taken as handed over (the consumer
//! lives) says so in `handed_over` before it marks `finished` ([`RingProducer::hand_over`]): a
//! consumer that then finishes last with entries left, or taken and not handed out, reports
//! them lost (its close's `Undelivered`), since no one else will; without the word the
//! producer's close reported them already. A consumer that finished before the word never
//! reads it: it writes how many messages it took and did not hand out (`taken_at_finish`)
//! before its mark, and the producer, then last, releases what is left and counts both
//! ([`crate::session::Session::finish_producing`]), for its close to report. A
//! consumer that dies never marks: its producer, finishing while the consumer (`consumer`, and
//! `consumer_start` so that a pid reused by another process is not mistaken for it) still
//! runs, keeps an [`OrphanRing`] and looks again whenever an allocation finds its segment
//! full; once that process is gone it releases what the consumer left and the consumer's
//! reference to the block. A ring no consumer adopted yet (its receiver never read the
//! announcement, which it does at its first receive or at its close, or could not adopt it:
//! [`RingConsumer::adopt_announced`] then keeps the announcement's reference) is watched the
//! same way through the process it was announced to, which the peer named in its handshake, by
//! its pid alone (a reused pid keeps the ring): only that process could still adopt it.
//! Publishers do not know that process, nor does a ring whose peer is in its own process: such
//! a ring never adopted stays until the session ends. A push lets the ring of a connection that
//! ended go (and so finishes it) at its next write into a ring, a publisher the ring of a
//! subscriber that left at its next send, a pair the ring of its gone peer at its next send
//! (which then waits for a next peer), a req or rep the ring of a connection that ended at its
//! next send, or any of them when an allocation of its process finds the segment full
//! ([`crate::session::RingHolder`]), whichever comes first: a sender that never writes again
//! still gets that memory back. What the consumer left is everything from the published head:
//! the consumer reads ahead of it (a run of entries at a look), but moves the head past an
//! entry only when it hands the entry's message to its device ([`RingConsumer::take_peeked`],
//! [`RingConsumer::release_to`]), so a consumer killed with a run taken and not handed out
//! leaves all of it to its producer; it releases nothing of an entry before the head passed it,
//! so nothing is released twice. A producer that dies never marks either: what it leaves to a
//! consumer that leaves without taking it stays until the session's memory is removed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::ShmError;
use crate::managed::ShmBuffer;
use crate::protocol::{EntryHeaders, RingEnd, RingFinish};
use crate::segment::{ProcessId, Segment};
use crate::wire::DeliveryRef;

/// Bytes of entries one ring holds.
pub(crate) const RING_DATA: usize = 256 << 10;
/// Bytes before the entries.
const CONTROL: usize = 256;
/// The size of a ring's block.
pub(crate) const RING_BLOCK: usize = CONTROL + RING_DATA;
/// The largest record written into the ring itself; a larger one goes into a block of its
/// own, which the entry names.
pub(crate) const MAX_INLINE_ENTRY: usize = RING_DATA / 8;

const TAIL: usize = 0;
const HEAD: usize = 64;
const SLEEPING: usize = 128;
const CLOSED: usize = 132;
const CONSUMER: usize = 136;
const HUNGRY: usize = 140;
const RUNG_AT: usize = 144;
const FINISHED: usize = 152;
const BELL: usize = 160;
const CONSUMER_START: usize = 168;
const HANDED_OVER: usize = 176;
const TAKEN_AT_FINISH: usize = 180;
const _: () = assert!(TAKEN_AT_FINISH + 4 <= CONTROL);
/// Entries a producer writes at most before it publishes them to a consumer that is busy.
const PUBLISH_EVERY: u32 = 32;
/// Empty looks in a row after which a consumer asks for every entry at once. A busy-polled
/// consumer (it spins for latency, and reads headers, not the tail) asks at its first empty
/// look, and stops asking only once it finds [`BUSY_STREAM_AFTER`] entries in a row: a round
/// trip's entries, found one at a time, leave the word as it is. Written at each entry found
/// and at the empty look after it, as it was, the word's line (which the producer reads at
/// every entry) crossed between the cores twice per round trip; never written at all, a
/// busy-polled stream paid the producer's fence at every entry. Busy-polled req/rep p50,
/// `ferromq bench --transport shmem --latency --busy-poll`, 2026-12-07, this project's
/// machine, the word never written, runs alternating with the build before: at 13:46-13:49 UTC
/// (`--msg-size 64 --duration 0.3`, eight rounds of four runs) 1.5 us against 1.7-1.9 in the
/// machine's slower state, 1.0 against 1.0-1.2 in its faster one; at 14:08-14:09
/// (`--msg-size 64,1048576 --duration 0.5`, ten rounds of four) medians of twenty runs 1.33
/// against 1.45 us at 64 B (no run over 2 us against six) and 1.50 against 1.52 at 1 MiB
/// (unchanged), each build's runs spread over 0.96-2.66 us; four runs each of `--duration 1` at
/// 14:06-14:08 had that build's worst higher (1.39 against 1.26 us at 64 B, 1.83 against 1.49
/// at 1 MiB). Busy-polled streaming at 64 B (`--busy-poll --msg-size 64 --duration 1`, eight
/// rounds of four, ~14:56) 4.23 M msg/s against 4.46 M by the median with the word never
/// written: hence the runs. With them, rounds alternating the build before / never written /
/// runs: req/rep at 64 B 1.22 / 1.17 / 1.14 us by the median of sixteen runs each, at 1 MiB
/// 1.24 / 1.23 / 1.43 (each spread over ~1.1-2.3 us; 14:58-15:00 UTC); streaming 3.37 / 3.38 /
/// 3.38 M msg/s by the median of twenty (spread 2.3-4.5 M; 15:00-15:02): no difference this
/// machine shows.
const HUNGRY_AFTER: u32 = 32;
/// Entries a busy-polled consumer finds in a row before it lets the producer publish them in
/// runs ([`HUNGRY_AFTER`]): more than a round trip brings at a time.
const BUSY_STREAM_AFTER: u32 = 4;
const ENTRY_HEADER: usize = 8;
const SKIP: u32 = u32::MAX;

/// Nanoseconds of CLOCK_MONOTONIC: the same clock in every process of the host, so a time
/// one process writes into a ring (or a message) another can compare with its own. 0 if the
/// clock cannot be read (Linux always can).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |now| {
        (now.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(now.tv_nsec() as u64)
    })
}

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// A record (`wire::append_record`): one message of the ring's sender.
    Record = 0,
    /// A block's reference and range (`wire::encode_block_ref`) holding a record.
    Indirect = 1,
}

fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// The ring's words and bytes in its block.
struct RingMemory {
    segment: Arc<Segment>,
    /// Offset of the block's data in the segment.
    base: usize,
}

impl RingMemory {
    /// The process that adopted the ring (its start time 0 when it wrote none), `None` before
    /// one did.
    fn consumer(&self) -> Option<ProcessId> {
        let pid = self.u32_at(CONSUMER).load(Ordering::Acquire);
        (pid != 0).then(|| ProcessId {
            pid,
            start_time: self.u64_at(CONSUMER_START).load(Ordering::Relaxed),
        })
    }

    fn u64_at(&self, at: usize) -> &AtomicU64 {
        self.segment
            .atomic_u64(self.base + at)
            .expect("a ring's block lies inside its segment")
    }

    fn u32_at(&self, at: usize) -> &AtomicU32 {
        self.segment
            .atomic_u32(self.base + at)
            .expect("a ring's block lies inside its segment")
    }

    fn data(&self, position: u64) -> usize {
        self.base + CONTROL + (position % RING_DATA as u64) as usize
    }

    /// The header word of the entry at `position` (a multiple of 8): `len | kind << 32`, 0 while
    /// no entry is committed there (see "Headers as readiness").
    fn header(&self, position: u64) -> &AtomicU64 {
        self.segment
            .atomic_u64(self.data(position))
            .expect("a ring's block lies inside its segment")
    }

    /// The error for something impossible a peer wrote into this ring.
    fn corrupt(&self, what: String) -> ShmError {
        ShmError::BadDescriptor {
            reason: format!(
                "descriptor ring in {} at {}: {what}",
                self.segment.name(),
                self.base
            ),
        }
    }
}

/// Set in the `kind` half of every committed header, so that no header is 0 (an empty record
/// would be `len` 0, kind 0).
const COMMITTED: u32 = 1 << 31;

/// An entry's header as one word: its bytes are `len` then `kind` (with [`COMMITTED`]), both
/// little-endian.
fn header_word(len: u32, kind: u32) -> u64 {
    u64::from(len) | u64::from(kind | COMMITTED) << 32
}

/// The writing end, held by the push under its outbox lock.
pub(crate) struct RingProducer {
    memory: RingMemory,
    /// The producer's reference to the block.
    block: ShmBuffer,
    tail: u64,
    /// The consumer's head as last read: the ring is full only if it is full by this.
    known_head: u64,
    /// Entries written since the tail was last published.
    n_unpublished: u32,
}

/// What [`RingProducer::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// No room now.
    Full,
    /// Written and published.
    Published(Wake),
    /// Written, not yet published: the first such entry since the last publication (the
    /// producer must see that `publish` runs soon) or a later one.
    Unpublished { first: bool },
}

/// Whether the consumer must get a doorbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wake(pub(crate) bool);

impl RingProducer {
    /// A ring in `block` (at least [`RING_BLOCK`] bytes, this process's own), empty.
    pub(crate) fn new(block: ShmBuffer) -> RingProducer {
        assert!(
            block.block_capacity() >= RING_BLOCK,
            "a ring's block holds the ring"
        );
        let memory = RingMemory {
            segment: Arc::clone(block.segment()),
            base: block.data_offset(),
        };
        memory.u64_at(HEAD).store(0, Ordering::Relaxed);
        memory.u32_at(SLEEPING).store(0, Ordering::Relaxed);
        memory.u32_at(CLOSED).store(0, Ordering::Relaxed);
        memory.u32_at(CONSUMER).store(0, Ordering::Relaxed);
        memory.u32_at(HUNGRY).store(1, Ordering::Relaxed);
        memory.u64_at(RUNG_AT).store(0, Ordering::Relaxed);
        memory.u32_at(FINISHED).store(0, Ordering::Relaxed);
        memory.u64_at(BELL).store(0, Ordering::Relaxed);
        memory.u64_at(CONSUMER_START).store(0, Ordering::Relaxed);
        memory.u32_at(HANDED_OVER).store(0, Ordering::Relaxed);
        memory.u32_at(TAKEN_AT_FINISH).store(0, Ordering::Relaxed);
        // The first entry's header slot: the block may have held anything before.
        memory.header(0).store(0, Ordering::Relaxed);
        // Release: whoever reads the announcement (sent after this) sees the ring initialised.
        memory.u64_at(TAIL).store(0, Ordering::Release);
        RingProducer {
            memory,
            block,
            tail: 0,
            known_head: 0,
            n_unpublished: 0,
        }
    }

    /// The block, to announce (with a reference added for the consumer).
    pub(crate) fn block(&self) -> &ShmBuffer {
        &self.block
    }

    /// Writes one entry of `kind` holding `bytes`, or says the ring is full. An entry of more
    /// than [`MAX_INLINE_ENTRY`] bytes is refused as full forever: the caller puts it in a block.
    pub(crate) fn push(&mut self, kind: EntryKind, bytes: &[u8]) -> Pushed {
        debug_assert!(bytes.len() <= MAX_INLINE_ENTRY);
        let need = (ENTRY_HEADER + padded(bytes.len())) as u64;
        let to_end = RING_DATA as u64 - self.tail % RING_DATA as u64;
        let skip = if to_end < need { to_end } else { 0 };
        let room = |head: u64, tail: u64| RING_DATA as u64 - (tail - head);
        // The entry, and the header slot after it, which is cleared before the entry commits.
        let want = skip + need + ENTRY_HEADER as u64;
        if room(self.known_head, self.tail) < want {
            self.known_head = self.memory.u64_at(HEAD).load(Ordering::Acquire);
            if room(self.known_head, self.tail) < want {
                return Pushed::Full;
            }
        }
        let at = self.tail + skip;
        self.write(at + ENTRY_HEADER as u64, bytes);
        EntryHeaders::commit(
            self.memory.header(at),
            Some(self.memory.header(at + need)),
            header_word(bytes.len() as u32, kind as u32),
        );
        if skip > 0 {
            // Last: a consumer that follows the skip finds the entry committed.
            EntryHeaders::commit(self.memory.header(self.tail), None, header_word(SKIP, 0));
        }
        self.tail = at + need;
        self.n_unpublished += 1;
        // A consumer that looked and found nothing gets it at once; a busy one a run of
        // entries at a time (see the module docs).
        if self.n_unpublished >= PUBLISH_EVERY
            || self.memory.u32_at(HUNGRY).load(Ordering::Relaxed) == 1
        {
            return Pushed::Published(self.publish());
        }
        Pushed::Unpublished {
            first: self.n_unpublished == 1,
        }
    }

    /// Makes every entry written so far visible to the consumer; whether it must get a
    /// doorbell (it waits on its socket).
    pub(crate) fn publish(&mut self) -> Wake {
        if self.n_unpublished == 0 {
            return Wake(false);
        }
        self.n_unpublished = 0;
        self.memory.u64_at(TAIL).store(self.tail, Ordering::Release);
        // Pairs with the consumer's fence in `RingConsumer::wait_for_doorbell`: either it sees
        // this tail, or this sees its raised word.
        std::sync::atomic::fence(Ordering::SeqCst);
        let sleeping = self.memory.u32_at(SLEEPING);
        let wake = sleeping.load(Ordering::Relaxed) == 1 && sleeping.swap(0, Ordering::AcqRel) == 1;
        if wake {
            // For the consumer's measure of how long its peer took (`RingConsumer::rung_at`):
            // only with a doorbell, which costs a syscall anyway.
            self.memory
                .u64_at(RUNG_AT)
                .store(monotonic_ns(), Ordering::Relaxed);
        }
        Wake(wake)
    }

    /// Wakes the consumer when `wake` says it waits: rings its bell where it gave one; true when
    /// the doorbell must go as a frame instead (no bell, or one that cannot be reached).
    pub(crate) fn ring_bell_or_need_frame(&self, wake: Wake) -> bool {
        if !wake.0 {
            return false;
        }
        // The consumer wrote it before it first raised `sleeping`, which `publish` took down
        // (acquire).
        let bell = self.memory.u64_at(BELL).load(Ordering::Relaxed);
        bell == 0 || !crate::bell::ring(bell)
    }

    fn write(&self, position: u64, bytes: &[u8]) {
        // SAFETY: `position .. + len` lies between the tail and the head plus the ring's size
        // (checked by `push`), which only the producer writes, and it is never split by the
        // end (an entry that would be is preceded by a skip). No slice over the ring's bytes
        // exists in this process: the block's handle is never read as bytes.
        unsafe {
            self.memory
                .segment
                .copy_in(self.memory.data(position), bytes)
        }
        .expect("a ring's block lies inside its segment");
    }

    /// Whether an entry of `entry_len` bytes would fit now, wherever the ring's end falls.
    pub(crate) fn has_room(&self, entry_len: usize) -> bool {
        let need = (ENTRY_HEADER + padded(entry_len)) as u64;
        let head = self.memory.u64_at(HEAD).load(Ordering::Acquire);
        RING_DATA as u64 - (self.tail - head) >= 2 * need
    }

    /// Publishes what is written and tells the consumer nothing more comes; what is in the
    /// ring is still taken. Whether the consumer must get a doorbell.
    pub(crate) fn close(&mut self) -> Wake {
        let wake = self.publish();
        self.memory.u32_at(CLOSED).store(1, Ordering::Release);
        wake
    }

    /// Closes the ring and marks the producer finished with it (see "Peer death and drop"):
    /// whether the consumer finished first, which leaves what it did not take to the producer
    /// ([`RingProducer::orphan`]), and whether it must get a doorbell.
    pub(crate) fn finish(&mut self) -> (Wake, bool) {
        let wake = self.close();
        let consumer_left = RingFinish {
            finished: self.memory.u32_at(FINISHED),
        }
        .finish(RingEnd::Producer);
        (wake, consumer_left)
    }

    /// Says that what the consumer has not taken is handed over to it: the producer's close
    /// reports it delivered, so a consumer that leaves it untaken must report it lost
    /// ([`RingConsumer::finish`]). Before [`RingProducer::finish`], whose mark publishes it.
    pub(crate) fn hand_over(&self) {
        self.memory.u32_at(HANDED_OVER).store(1, Ordering::Relaxed);
    }

    /// How many messages a consumer that finished first had taken from the ring and not
    /// handed out (it drops them): with what the ring still holds, what it left. A peer's word,
    /// only counted.
    pub(crate) fn taken_at_consumers_finish(&self) -> u64 {
        // The consumer's mark (read by `finish`'s compare-and-swap, acquire) came after it.
        u64::from(self.memory.u32_at(TAKEN_AT_FINISH).load(Ordering::Relaxed))
    }

    /// How many messages the consumer has not moved its head past: those it did not take, and
    /// those it took and has not handed out. Counted from the head it published, over the
    /// headers this producer wrote; what the consumer hands out meanwhile may still be
    /// counted. A head outside what this producer wrote (a broken consumer) counts nothing,
    /// and a header that was never committed ends the count; every read stays in the ring.
    pub(crate) fn n_not_taken(&self) -> u64 {
        let head = self.memory.u64_at(HEAD).load(Ordering::Acquire);
        if head > self.tail || self.tail - head > RING_DATA as u64 || !head.is_multiple_of(8) {
            return 0;
        }
        let mut at = head;
        let mut n_entries = 0;
        while at < self.tail {
            let word = self.memory.header(at).load(Ordering::Relaxed);
            let (len, kind) = (word as u32, (word >> 32) as u32);
            if kind & COMMITTED == 0 {
                break;
            }
            if len == SKIP {
                at += RING_DATA as u64 - at % RING_DATA as u64;
                continue;
            }
            n_entries += 1;
            at += (ENTRY_HEADER + padded(len as usize)) as u64;
        }
        n_entries
    }

    /// The pid of the process that adopted the ring, 0 before one did.
    pub(crate) fn consumer_pid(&self) -> u32 {
        self.memory.u32_at(CONSUMER).load(Ordering::Acquire)
    }

    /// Whether the process that adopted the ring is gone (none has its pid, only a zombie, or
    /// one started at another time than it wrote; see [`OrphanRing::fate`]); false before one
    /// adopted it. Reads `/proc`: for a segment found full, or a connection that ended, not
    /// for every send.
    pub(crate) fn consumer_died(&self) -> bool {
        self.memory
            .consumer()
            .is_some_and(|consumer| !consumer.is_alive())
    }

    /// A handle of the producer's on the ring after it finished, with a reference of its own
    /// to the block: a reader of what the consumer left when the consumer finished first
    /// ([`OrphanRing::reader`]), or a watch on a consumer still at the ring ([`OrphanRing::fate`]).
    pub(crate) fn orphan(&self) -> Result<OrphanRing, ShmError> {
        self.block.add_references(1);
        let block = ShmBuffer::adopt_referenced_block(
            Arc::clone(self.block.segment()),
            crate::wire::WireRange {
                offset: self.block.data_offset() as u64,
                size: RING_BLOCK as u64,
            },
        )?
        .0;
        let memory = RingMemory {
            segment: Arc::clone(block.segment()),
            base: block.data_offset(),
        };
        Ok(OrphanRing {
            block,
            memory,
            expected_consumer: None,
        })
    }
}

/// A ring its producer finished with (see [`RingProducer::orphan`]).
pub(crate) struct OrphanRing {
    /// The producer's extra reference to the block.
    block: ShmBuffer,
    memory: RingMemory,
    /// The process the ring was announced to, which alone can adopt it: while no consumer
    /// adopted the ring, its death means nobody will ([`OrphanRing::fate`]).
    expected_consumer: Option<u32>,
}

/// What became of the consumer of an [`OrphanRing`].
pub(crate) enum OrphanFate {
    /// It finished and released what was left: nothing more to do.
    Settled,
    /// It died without finishing: what it left is the producer's to release, with this reader
    /// (its reference to the block was given back already).
    Dead(RingConsumer),
    /// It lives, or it never adopted the ring and the process it was announced to lives (or is
    /// not known): the announcement may still be read. Look again later.
    Waiting(OrphanRing),
}

impl OrphanRing {
    /// The orphan of a ring announced to process `pid` (`None`: not known), for a ring that no
    /// consumer adopted yet.
    pub(crate) fn announced_to(mut self, pid: Option<u32>) -> OrphanRing {
        self.expected_consumer = pid;
        self
    }

    fn finished(&self) -> RingFinish<'_, AtomicU32> {
        RingFinish {
            finished: self.memory.u32_at(FINISHED),
        }
    }

    /// A reader of what the consumer left, for a producer whose [`RingProducer::finish`] found
    /// it finished first (nobody else reads the ring then).
    pub(crate) fn reader(self) -> Result<RingConsumer, ShmError> {
        RingConsumer::adopt(self.block, DeliveryRef::NONE, false)
    }

    /// Looks at the consumer (see [`OrphanFate`]). A consumer is dead when no process has its
    /// pid, only a zombie, or one that started at another time than the consumer wrote
    /// (`consumer_start`): processes of a session share a pid namespace, as its cleanup
    /// assumes, and a pid reused since is another process. A consumer that wrote no start time
    /// (a ferromq from before the word, or one that could not read /proc) is judged by its pid
    /// alone.
    pub(crate) fn fate(self) -> OrphanFate {
        if self.finished().is_settled() {
            return OrphanFate::Settled;
        }
        let lives = match self.memory.consumer() {
            Some(consumer) => consumer.is_alive(),
            // Never adopted: only the process the ring was announced to could still adopt it
            // (its pid without a start time: a reused pid keeps the ring, never the reverse).
            None => self
                .expected_consumer
                .is_none_or(|pid| ProcessId { pid, start_time: 0 }.is_alive()),
        };
        if lives {
            return OrphanFate::Waiting(self);
        }
        // A process that is gone writes nothing more, but it may have finished and settled the
        // ring (and given its reference back) between the first look and the /proc read.
        if self.finished().is_settled() {
            return OrphanFate::Settled;
        }
        // The dead consumer's reference: ours keeps the block while the reader reads it.
        self.block.release_references(1);
        match RingConsumer::adopt(self.block, DeliveryRef::NONE, false) {
            Ok(reader) => OrphanFate::Dead(reader),
            Err(_) => OrphanFate::Settled,
        }
    }
}

impl Drop for RingProducer {
    fn drop(&mut self) {
        // The owner rang the doorbell of whatever its close published (`ConnectionRing`).
        let _ = self.close();
    }
}

/// The reading end, held by the pull that adopted the ring.
pub(crate) struct RingConsumer {
    memory: RingMemory,
    /// The consumer's reference to the block, released when the ring is dropped.
    _block: ShmBuffer,
    /// Where the next entry starts: entries before it were taken out of the ring by this
    /// consumer ([`RingConsumer::take_peeked`]).
    next: u64,
    /// The head as published (`head`): entries before it are this consumer's; those between
    /// it and `next` were taken but not yet handed out ([`RingConsumer::release_to`]), and
    /// are still the producer's to release if this consumer dies.
    released: u64,
    /// The producer's tail as last read.
    known_tail: u64,
    /// Where the entry returned by the last `peek` ends.
    peeked_end: Option<u64>,
    /// The sender's counter, which every record of the ring counts at.
    delivery: DeliveryRef,
    /// The `hungry` word as this consumer last wrote it.
    hungry: bool,
    /// Looks in a row that found the ring empty.
    n_empty_looks: u32,
    /// A consumer that reads headers: entries found in a row (each counted once, however
    /// often it is looked at), and where the last one counted starts (`u64::MAX`: none).
    n_found_in_a_row: u32,
    found_at: u64,
    /// Whether this consumer finds entries by their headers instead of the producer's tail
    /// (a busy-polled one; see "Headers as readiness").
    reads_headers: bool,
}

impl RingConsumer {
    /// Adopts the ring in `block` (its reference came with the announcement).
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] for a block too small to be a ring, or a head no producer
    /// writes; the block's reference is given back.
    pub(crate) fn adopt(
        block: ShmBuffer,
        delivery: DeliveryRef,
        busy_polled: bool,
    ) -> Result<RingConsumer, ShmError> {
        RingConsumer::adopt_or_refuse(block, delivery, busy_polled).map_err(|refused| refused.0)
    }

    /// [`RingConsumer::adopt`] for a receiver that read the ring's announcement: a ring it
    /// cannot adopt keeps the reference the announcement carried, for its producer, which
    /// releases it (and what the ring holds) once this process is gone (see "Peer death and
    /// drop"); given back here too, it would be given back twice.
    ///
    /// # Errors
    /// As [`RingConsumer::adopt`].
    pub(crate) fn adopt_announced(
        block: ShmBuffer,
        delivery: DeliveryRef,
        busy_polled: bool,
    ) -> Result<RingConsumer, ShmError> {
        RingConsumer::adopt_or_refuse(block, delivery, busy_polled).map_err(|refused| {
            let (error, block) = *refused;
            block.disarm();
            error
        })
    }

    /// Adopts the ring in `block`, or says why not and hands the block back.
    fn adopt_or_refuse(
        block: ShmBuffer,
        delivery: DeliveryRef,
        busy_polled: bool,
    ) -> Result<RingConsumer, Box<(ShmError, ShmBuffer)>> {
        if block.block_capacity() < RING_BLOCK {
            let error = ShmError::BadDescriptor {
                reason: format!(
                    "a descriptor ring needs {RING_BLOCK} bytes, the announced block has {}",
                    block.block_capacity()
                ),
            };
            return Err(Box::new((error, block)));
        }
        let memory = RingMemory {
            segment: Arc::clone(block.segment()),
            base: block.data_offset(),
        };
        let head = memory.u64_at(HEAD).load(Ordering::Acquire);
        // Entries start at multiples of 8 (a header is one aligned word): a head that is not
        // one was written by a broken peer.
        if !head.is_multiple_of(8) {
            let error = memory.corrupt(format!("head {head} is not a multiple of 8"));
            return Err(Box::new((error, block)));
        }
        // The start time first: whoever reads the pid (acquire) reads the start time it goes
        // with. The segment's record of this process: no /proc read here.
        let me = memory.segment.me();
        memory
            .u64_at(CONSUMER_START)
            .store(me.start_time, Ordering::Relaxed);
        memory.u32_at(CONSUMER).store(me.pid, Ordering::Release);
        Ok(RingConsumer {
            memory,
            _block: block,
            next: head,
            released: head,
            known_tail: head,
            peeked_end: None,
            delivery,
            // As the producer starts the word: a new consumer wants its first entry at once.
            hungry: true,
            n_empty_looks: 0,
            n_found_in_a_row: 0,
            found_at: u64::MAX,
            reads_headers: busy_polled,
        })
    }

    /// The sender's counter the ring's records count at.
    pub(crate) fn delivery(&self) -> DeliveryRef {
        self.delivery
    }

    fn corrupt(&self, what: String) -> ShmError {
        self.memory.corrupt(what)
    }

    /// Whether an entry waits: the header at `next` for a consumer that reads headers, else the
    /// producer's tail, read only when the last one read says the ring is empty.
    pub(crate) fn has_entries(&mut self) -> bool {
        let empty = if self.reads_headers {
            EntryHeaders::committed(self.memory.header(self.next)).is_none()
        } else {
            if self.next == self.known_tail {
                self.known_tail = self.memory.u64_at(TAIL).load(Ordering::Acquire);
            }
            self.next == self.known_tail
        };
        if self.reads_headers {
            // Hungry except while it takes a stream (see `HUNGRY_AFTER`): a round trip's
            // entries, one at a time, change nothing on the word's line.
            if empty {
                self.n_found_in_a_row = 0;
                self.set_hungry(true);
            } else if self.found_at != self.next {
                self.found_at = self.next;
                self.n_found_in_a_row += 1;
                if self.n_found_in_a_row >= BUSY_STREAM_AFTER {
                    self.set_hungry(false);
                }
            }
            return !empty;
        }
        self.n_empty_looks = if empty { self.n_empty_looks + 1 } else { 0 };
        // Hungry only after a few empty looks: a consumer that keeps up with a stream takes
        // runs of entries the producer has finished with, instead of reading each line while
        // the producer still writes it.
        if !empty {
            self.set_hungry(false);
        } else if self.n_empty_looks >= HUNGRY_AFTER {
            self.set_hungry(true);
        }
        !empty
    }

    /// Writes the `hungry` word, only when it changes: the producer reads it with every entry.
    fn set_hungry(&mut self, hungry: bool) {
        if hungry != self.hungry {
            self.hungry = hungry;
            self.memory
                .u32_at(HUNGRY)
                .store(u32::from(hungry), Ordering::Relaxed);
        }
    }

    /// Copies the next entry into `into` (replacing its contents) and says what it holds;
    /// `None` when the ring is empty. The entry stays in the ring until [`RingConsumer::consume`].
    ///
    /// # Errors
    /// [`ShmError::BadDescriptor`] when the ring's counters or the entry's length are impossible.
    pub(crate) fn peek(&mut self, into: &mut Vec<u8>) -> Result<Option<EntryKind>, ShmError> {
        loop {
            if !self.has_entries() {
                return Ok(None);
            }
            // How far entries may reach: to the published tail, or, for a consumer that reads
            // headers (the tail may lag behind them), to the ring's end.
            let in_flight = if self.reads_headers {
                RING_DATA as u64
            } else {
                self.known_tail.wrapping_sub(self.next)
            };
            if in_flight > RING_DATA as u64 || !in_flight.is_multiple_of(8) {
                return Err(self.corrupt(format!(
                    "head {} and tail {} are impossible",
                    self.next, self.known_tail
                )));
            }
            let mut header = [0u8; ENTRY_HEADER];
            self.read(self.next, &mut header);
            let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
            let to_end = RING_DATA as u64 - self.next % RING_DATA as u64;
            if len == SKIP {
                if to_end > in_flight {
                    return Err(self.corrupt("a skip passes the tail".to_owned()));
                }
                // Released with the entry before it when nothing taken waits to be handed
                // out; otherwise with the next entry handed out after it.
                let all_released = self.released == self.next;
                self.next += to_end;
                if all_released {
                    self.release_to(self.next);
                }
                continue;
            }
            let need = (ENTRY_HEADER + padded(len as usize)) as u64;
            if need > to_end || need > in_flight {
                return Err(self.corrupt(format!("an entry of {len} bytes does not fit")));
            }
            let kind_word = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
            let kind = match kind_word & !COMMITTED {
                0 => EntryKind::Record,
                1 => EntryKind::Indirect,
                other => return Err(self.corrupt(format!("unknown entry kind {other}"))),
            };
            into.clear();
            into.resize(len as usize, 0);
            self.read(self.next + ENTRY_HEADER as u64, into);
            self.peeked_end = Some(self.next + need);
            return Ok(Some(kind));
        }
    }

    /// Takes the entry the last [`RingConsumer::peek`] returned out of the ring and frees its
    /// room: what it holds is this process's from now on.
    pub(crate) fn consume(&mut self) {
        if let Some(end) = self.take_peeked() {
            self.release_to(end);
        }
    }

    /// Moves past the entry the last [`RingConsumer::peek`] returned without giving it up:
    /// until [`RingConsumer::release_to`] its end, the entry stays in the ring, and a producer
    /// that finds this consumer dead releases what it holds (see "Peer death and drop").
    /// Where the entry ends; `None` when nothing was peeked.
    pub(crate) fn take_peeked(&mut self) -> Option<u64> {
        let end = self.peeked_end.take()?;
        self.next = end;
        Some(end)
    }

    /// Gives up the entries that end at or before `end` (returned by
    /// [`RingConsumer::take_peeked`]): their room is the producer's again, and what they hold
    /// is this process's to release.
    pub(crate) fn release_to(&mut self, end: u64) {
        if end > self.released && end <= self.next {
            self.released = end;
            self.memory.u64_at(HEAD).store(end, Ordering::Release);
        }
    }

    fn read(&self, position: u64, into: &mut [u8]) {
        self.memory
            .segment
            .copy_out(self.memory.data(position), into)
            .expect("a ring's block lies inside its segment");
    }

    /// Raises the `sleeping` word before the consumer waits on its socket; false (and nothing
    /// to wait for) when an entry came meanwhile. With the word raised, the producer's next
    /// entry sends a doorbell.
    pub(crate) fn wait_for_doorbell(&mut self) -> bool {
        self.set_hungry(true);
        self.memory.u32_at(SLEEPING).store(1, Ordering::SeqCst);
        // Pairs with the producer's fence after publishing its tail.
        std::sync::atomic::fence(Ordering::SeqCst);
        !self.has_entries()
    }

    /// Whether the consumer has asked for a doorbell (its `sleeping` word), for tests.
    #[cfg(test)]
    pub(crate) fn wants_doorbell(&self) -> bool {
        self.memory.u32_at(SLEEPING).load(Ordering::SeqCst) == 1
    }

    /// Gives the producer the consumer's bell to ring (`bell.rs`) instead of sending doorbell
    /// frames; before the consumer first waits.
    pub(crate) fn set_bell(&mut self, bell: u64) {
        self.memory.u64_at(BELL).store(bell, Ordering::Release);
    }

    /// When the producer last rang this ring's doorbell ([`monotonic_ns`]; 0 before it ever
    /// did). A peer's word: used only to judge how soon entries come, never trusted further.
    pub(crate) fn rung_at(&self) -> u64 {
        self.memory.u64_at(RUNG_AT).load(Ordering::Relaxed)
    }

    /// The producer closed the ring and everything in it was taken.
    pub(crate) fn is_finished(&mut self) -> bool {
        self.memory.u32_at(CLOSED).load(Ordering::Acquire) == 1 && !self.has_entries()
    }

    /// Marks the consumer finished with the ring (see "Peer death and drop"), having taken
    /// `n_taken` messages from it that it did not hand out: `None` when the producer has not
    /// finished yet (what is left, those included, is its to count), else whether the producer
    /// handed what is left over ([`RingProducer::hand_over`]): it is this consumer's to
    /// release, and, handed over, to report as lost.
    pub(crate) fn finish(&mut self, n_taken: u64) -> Option<bool> {
        // What was taken and not handed out is this process's, released by its handles.
        self.release_to(self.next);
        // Before the mark, which publishes it.
        self.memory.u32_at(TAKEN_AT_FINISH).store(
            u32::try_from(n_taken).unwrap_or(u32::MAX),
            Ordering::Relaxed,
        );
        let last = RingFinish {
            finished: self.memory.u32_at(FINISHED),
        }
        .finish(RingEnd::Consumer);
        // The producer's mark (read by the compare-and-swap, acquire) comes after its word.
        last.then(|| self.memory.u32_at(HANDED_OVER).load(Ordering::Relaxed) == 1)
    }

    /// Marks what was left released, by the last end at the ring (see "Peer death and drop").
    pub(crate) fn settle(&self) {
        RingFinish {
            finished: self.memory.u32_at(FINISHED),
        }
        .settle();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::managed::OwnedSegment;
    use crate::segment::TestObject;
    use crate::wire::{ObjectRef, WireRange};

    /// The next state of a xorshift generator: the tests' sizes and interleavings, reproducible.
    fn mix(mut state: u64) -> u64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }

    /// A segment of 4 MiB of this test's own (`tag`), owned by this process, with no ring in it;
    /// removed when the returned name drops.
    fn own_segment(tag: &str) -> (TestObject, Arc<OwnedSegment>) {
        let object = TestObject::segment(&format!("ring-{tag}"));
        let segment = Segment::create(object.0.clone(), 4 << 20).unwrap();
        (object, Arc::new(OwnedSegment::new(segment)))
    }

    /// A segment of this test's own with a ring in it, and the consumer's end adopted as a
    /// pull would from the announcement (also for the session's tests).
    pub(crate) struct Fixture {
        _object: TestObject,
        _owned: Arc<OwnedSegment>,
        pub(crate) producer: RingProducer,
        pub(crate) consumer: RingConsumer,
    }

    impl Fixture {
        /// `tag` tells the tests' segments apart (each test its own).
        pub(crate) fn new(tag: u32) -> Fixture {
            Fixture::adopted(tag, false)
        }

        /// A ring whose consumer is busy-polled (`busy`: it finds entries by their headers)
        /// or not (by the tail).
        fn adopted(tag: u32, busy: bool) -> Fixture {
            let (object, owned) = own_segment(&tag.to_string());
            let producer = RingProducer::new(owned.allocate_long_lived(RING_BLOCK).unwrap());
            producer.block().add_references(1);
            let (block, _) = ShmBuffer::adopt_referenced_block(
                Arc::clone(owned.segment()),
                WireRange {
                    offset: producer.block().data_offset() as u64,
                    size: RING_BLOCK as u64,
                },
            )
            .unwrap();
            let delivery = DeliveryRef {
                segment: ObjectRef::of(&object.0),
                slot: 3,
                generation: 1,
            };
            let consumer = RingConsumer::adopt(block, delivery, busy).unwrap();
            Fixture {
                _object: object,
                _owned: owned,
                producer,
                consumer,
            }
        }
    }

    fn entry_bytes(seq: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|byte_idx| (seq.wrapping_mul(131).wrapping_add(byte_idx as u64) % 253) as u8)
            .collect()
    }

    /// Issue 13 §2's property: whatever the sizes of the entries (empty to the largest one a
    /// ring holds) and however the producer and consumer interleave, every entry arrives once,
    /// whole and in order, across many wraps of the ring; a full ring refuses and never
    /// overwrites; the producer counts the entries not taken right at every step. Several
    /// seeds, each with its own size mix and run length, for a consumer that reads the tail and
    /// one that reads headers (it also takes unpublished entries).
    #[test]
    fn entries_of_every_size_wrap_around_whole_and_in_order() {
        for (seed, busy) in (1..=4u64).flat_map(|seed| [(seed, false), (seed, true)]) {
            let mut fixture = Fixture::adopted(seed as u32 + 50 * u32::from(busy), busy);
            let Fixture {
                producer, consumer, ..
            } = &mut fixture;
            let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut next = move || {
                state = mix(state);
                state
            };
            let n_entries = 20_000u64;
            let mut sizes = Vec::new();
            let mut written = 0u64;
            let mut taken = 0u64;
            let mut entry = Vec::new();
            let mut n_bytes = 0usize;
            while taken < n_entries {
                // The producer writes a run, publishing now and then; the consumer takes a run.
                for _ in 0..next() % 64 {
                    if written == n_entries {
                        break;
                    }
                    let len = match next() % 16 {
                        0 => MAX_INLINE_ENTRY,
                        1 => 0,
                        2..=4 => (next() % 4096) as usize,
                        _ => (next() % 120) as usize,
                    };
                    let bytes = entry_bytes(written, len);
                    match producer.push(EntryKind::Record, &bytes) {
                        Pushed::Full => {
                            let _ = producer.publish();
                            break;
                        }
                        Pushed::Published(_) | Pushed::Unpublished { .. } => {
                            sizes.push(len);
                            n_bytes += len;
                            written += 1;
                        }
                    }
                }
                if next() % 3 == 0 || written == n_entries {
                    let _ = producer.publish();
                }
                for _ in 0..next() % 64 {
                    match consumer.peek(&mut entry).unwrap() {
                        None => break,
                        Some(kind) => {
                            assert_eq!(kind, EntryKind::Record);
                            let expected = entry_bytes(taken, sizes[taken as usize]);
                            assert!(
                                entry == expected,
                                "seed {seed}, busy {busy}: entry {taken} differs"
                            );
                            consumer.consume();
                            taken += 1;
                        }
                    }
                }
                // What a producer's close hands over: every entry not consumed, across skips.
                assert_eq!(
                    producer.n_not_taken(),
                    written - taken,
                    "seed {seed}, busy {busy}: entries not taken"
                );
            }
            assert!(consumer.peek(&mut entry).unwrap().is_none());
            assert!(
                n_bytes > 8 * RING_DATA,
                "seed {seed}, busy {busy}: only {n_bytes} bytes went through the ring"
            );
        }
    }

    /// Several producers at once (issue 13: "ring wrap-around and several producers under a
    /// property test"): three threads each fill a ring of their own with entries of sizes drawn
    /// per entry, publishing at random moments, while one consumer takes runs from the rings in
    /// turn, as a pull does; every producer's entries arrive once, whole and in its order,
    /// across many wraps, with producers and consumer really running at once. Once with
    /// consumers that read tails, once with consumers that read headers (they race with the
    /// producers' writes entry by entry).
    #[test]
    fn several_producers_at_once_each_keep_their_order() {
        several_producers_at_once(false);
        several_producers_at_once(true);
    }

    fn several_producers_at_once(busy: bool) {
        const N_PRODUCERS: u64 = 3;
        const N_EACH: u64 = 20_000;
        /// Entry `seq` of producer `producer`: its length and bytes, known to both sides.
        fn entry_of(producer: u64, seq: u64) -> Vec<u8> {
            let draw = mix(mix((producer << 40) ^ seq ^ 0x9e37_79b9));
            let len = match draw % 16 {
                0 => MAX_INLINE_ENTRY,
                1 => 0,
                2..=4 => ((draw >> 8) % 4096) as usize,
                _ => ((draw >> 8) % 120) as usize,
            };
            entry_bytes(producer * 1_000_000 + seq, len)
        }
        let mut fixtures: Vec<Fixture> = (0..N_PRODUCERS)
            .map(|producer| Fixture::adopted(100 + producer as u32 + 10 * u32::from(busy), busy))
            .collect();
        let (producers, mut consumers): (Vec<_>, Vec<_>) = fixtures
            .iter_mut()
            .map(|fixture| (&mut fixture.producer, &mut fixture.consumer))
            .unzip();
        std::thread::scope(|scope| {
            for (producer_idx, producer) in producers.into_iter().enumerate() {
                scope.spawn(move || {
                    let producer_idx = producer_idx as u64;
                    let mut state = mix(producer_idx + 7);
                    for seq in 0..N_EACH {
                        let bytes = entry_of(producer_idx, seq);
                        while producer.push(EntryKind::Record, &bytes) == Pushed::Full {
                            let _ = producer.publish();
                            std::thread::yield_now();
                        }
                        state = mix(state);
                        if state.is_multiple_of(5) {
                            let _ = producer.publish();
                        }
                    }
                    let _ = producer.publish();
                });
            }
            let mut next_seq = vec![0u64; N_PRODUCERS as usize];
            let mut entry = Vec::new();
            let mut state = mix(99);
            let started = std::time::Instant::now();
            while next_seq.iter().any(|&seq| seq < N_EACH) {
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(60),
                    "busy {busy}: stuck at {next_seq:?}"
                );
                for (producer_idx, consumer) in consumers.iter_mut().enumerate() {
                    state = mix(state);
                    for _ in 0..state % 64 {
                        match consumer.peek(&mut entry).unwrap() {
                            None => break,
                            Some(kind) => {
                                assert_eq!(kind, EntryKind::Record);
                                let seq = &mut next_seq[producer_idx];
                                assert!(
                                    entry == entry_of(producer_idx as u64, *seq),
                                    "busy {busy}, producer {producer_idx}: entry {seq} differs or is out of order"
                                );
                                consumer.consume();
                                *seq += 1;
                            }
                        }
                    }
                }
            }
        });
        for consumer in consumers {
            assert!(consumer.peek(&mut Vec::new()).unwrap().is_none());
        }
    }

    /// Another consumer's end of `fixture`'s ring, adopted now with a reference of its own (as
    /// a producer's reader of what a dead consumer left is); `busy`: it reads headers.
    fn adopt_again(fixture: &Fixture, busy: bool) -> Result<RingConsumer, ShmError> {
        fixture.producer.block().add_references(1);
        let (block, _) = ShmBuffer::adopt_referenced_block(
            Arc::clone(fixture.producer.block().segment()),
            WireRange {
                offset: fixture.producer.block().data_offset() as u64,
                size: RING_BLOCK as u64,
            },
        )
        .unwrap();
        RingConsumer::adopt(block, DeliveryRef::NONE, busy)
    }

    /// A reader adopting the ring now (as a producer does for a consumer it found dead) starts
    /// at the published head: the length and first byte of each entry it finds.
    fn what_a_reader_of_the_rest_finds(fixture: &Fixture) -> Vec<(usize, u8)> {
        let mut reader = adopt_again(fixture, false).unwrap();
        let mut found = Vec::new();
        let mut entry = Vec::new();
        while reader.peek(&mut entry).unwrap().is_some() {
            found.push((entry.len(), entry[0]));
            reader.take_peeked();
        }
        found
    }

    /// Entries a consumer took but did not release stay in the ring for whoever reads what it
    /// left (a consumer killed with a run of entries taken and not handed out loses its
    /// producer nothing); released ones, and at `finish` all taken ones, leave it. A skip at
    /// the ring's end after unreleased entries does not release them. The producer's own count
    /// of what is not taken ([`RingProducer::n_not_taken`]) agrees at every step.
    #[test]
    fn entries_taken_and_not_released_stay_for_a_reader_of_what_is_left() {
        let mut fixture = Fixture::new(12);
        let mut entry = Vec::new();
        // Up to less than a large entry before the end, so that the second entry wraps
        // behind a skip.
        let big = vec![7u8; MAX_INLINE_ENTRY];
        let mut written = 0;
        while written + ENTRY_HEADER + MAX_INLINE_ENTRY <= RING_DATA {
            fixture.producer.push(EntryKind::Record, &big);
            written += ENTRY_HEADER + MAX_INLINE_ENTRY;
        }
        fixture.producer.publish();
        while fixture.consumer.peek(&mut entry).unwrap().is_some() {
            fixture.consumer.consume();
        }
        let entries: [&[u8]; 3] = [b"first", &[1u8; MAX_INLINE_ENTRY], b"third"];
        let summary = |entries: &[&[u8]]| -> Vec<(usize, u8)> {
            entries
                .iter()
                .map(|bytes| (bytes.len(), bytes[0]))
                .collect()
        };
        for bytes in entries {
            assert_ne!(
                fixture.producer.push(EntryKind::Record, bytes),
                Pushed::Full
            );
        }
        fixture.producer.publish();
        let mut ends = Vec::new();
        for bytes in entries {
            assert_eq!(
                fixture.consumer.peek(&mut entry).unwrap(),
                Some(EntryKind::Record)
            );
            assert_eq!(entry, bytes);
            ends.push(fixture.consumer.take_peeked().unwrap());
        }
        assert!(fixture.consumer.peek(&mut entry).unwrap().is_none());
        assert_eq!(
            ends[1],
            (RING_DATA + ENTRY_HEADER + MAX_INLINE_ENTRY) as u64,
            "the second entry starts the ring's next lap, behind a skip"
        );
        assert_eq!(what_a_reader_of_the_rest_finds(&fixture), summary(&entries));
        // The producer's count of what its close hands over agrees, across the skip.
        assert_eq!(fixture.producer.n_not_taken(), 3);
        fixture.consumer.release_to(ends[0]);
        assert_eq!(
            what_a_reader_of_the_rest_finds(&fixture),
            summary(&entries[1..])
        );
        assert_eq!(fixture.producer.n_not_taken(), 2);
        fixture.consumer.release_to(ends[2]);
        assert!(what_a_reader_of_the_rest_finds(&fixture).is_empty());
        assert_eq!(fixture.producer.n_not_taken(), 0);
        // A release out of order (an end already passed) changes nothing.
        fixture.consumer.release_to(ends[1]);
        assert!(what_a_reader_of_the_rest_finds(&fixture).is_empty());

        assert_ne!(
            fixture.producer.push(EntryKind::Record, b"left"),
            Pushed::Full
        );
        fixture.producer.publish();
        assert!(fixture.consumer.peek(&mut entry).unwrap().is_some());
        fixture.consumer.take_peeked();
        assert_eq!(what_a_reader_of_the_rest_finds(&fixture), vec![(4, b'l')]);
        assert_eq!(fixture.producer.n_not_taken(), 1);
        fixture.consumer.finish(1);
        assert!(what_a_reader_of_the_rest_finds(&fixture).is_empty());
    }

    /// A busy-polled consumer taking entries one at a time (a round trip's pace) never writes
    /// the `hungry` word, however often it looks at each (see `HUNGRY_AFTER`); one that finds
    /// a stream (`BUSY_STREAM_AFTER` entries in a row) lets the producer publish in runs, and
    /// asks for every entry again at its next empty look.
    #[test]
    fn a_busy_polled_consumer_writes_hungry_only_around_a_stream() {
        let mut fixture = Fixture::adopted(11, true);
        let Fixture {
            producer, consumer, ..
        } = &mut fixture;
        let word = |consumer: &RingConsumer| consumer.memory.u32_at(HUNGRY).load(Ordering::Relaxed);
        let mut entry = Vec::new();
        // Round trips: a word set to something else stays as it is through entries found,
        // looked at again, taken, and looked for after them.
        consumer.memory.u32_at(HUNGRY).store(2, Ordering::Relaxed);
        for n in 0..3 * BUSY_STREAM_AFTER as u8 {
            let _ = producer.push(EntryKind::Record, &[n]);
            assert!(consumer.has_entries());
            assert!(consumer.has_entries());
            assert_eq!(consumer.peek(&mut entry).unwrap(), Some(EntryKind::Record));
            assert_eq!(entry, [n]);
            consumer.consume();
            assert!(!consumer.has_entries());
        }
        assert_eq!(word(consumer), 2, "a round trip's look wrote the word");
        // A stream: published at once while the consumer asks, in runs once it took enough in
        // a row, at once again after its next empty look.
        consumer.memory.u32_at(HUNGRY).store(1, Ordering::Relaxed);
        let _ = producer.publish();
        for n in 0..2 * BUSY_STREAM_AFTER as u8 {
            assert_eq!(
                producer.push(EntryKind::Record, &[n]),
                Pushed::Published(Wake(false)),
                "entry {n} of the stream"
            );
        }
        for _ in 0..BUSY_STREAM_AFTER {
            assert!(consumer.peek(&mut entry).unwrap().is_some());
            consumer.consume();
        }
        assert_eq!(
            word(consumer),
            0,
            "a stream's consumer still asks for every entry"
        );
        assert!(matches!(
            producer.push(EntryKind::Record, b"r"),
            Pushed::Unpublished { .. }
        ));
        while consumer.peek(&mut entry).unwrap().is_some() {
            consumer.consume();
        }
        assert!(!consumer.has_entries());
        assert_eq!(word(consumer), 1);
        assert_eq!(
            producer.push(EntryKind::Record, b"z"),
            Pushed::Published(Wake(false))
        );
    }

    /// The doorbell protocol: a consumer about to wait gets exactly one doorbell from the next
    /// publication, none while it is busy, and never waits with an entry published.
    #[test]
    fn a_waiting_consumer_is_rung_once_and_a_busy_one_never() {
        let mut fixture = Fixture::new(10);
        let Fixture {
            producer, consumer, ..
        } = &mut fixture;
        let mut entry = Vec::new();
        // A new ring's consumer is hungry: the first entry is published at once.
        assert_eq!(
            producer.push(EntryKind::Record, b"w"),
            Pushed::Published(Wake(false))
        );
        assert_eq!(consumer.peek(&mut entry).unwrap(), Some(EntryKind::Record));
        consumer.consume();
        // Busy (it found an entry and has not looked again): published in runs, no doorbell.
        for _ in 0..3 {
            assert!(matches!(
                producer.push(EntryKind::Record, b"x"),
                Pushed::Unpublished { .. }
            ));
        }
        assert_eq!(producer.publish(), Wake(false));
        while consumer.peek(&mut entry).unwrap().is_some() {
            consumer.consume();
        }
        // It waits: the next entry is published at once and rings it, once.
        assert!(consumer.wait_for_doorbell());
        assert_eq!(
            producer.push(EntryKind::Record, b"y"),
            Pushed::Published(Wake(true))
        );
        assert_eq!(
            producer.push(EntryKind::Record, b"z"),
            Pushed::Published(Wake(false))
        );
        // An entry published before it asks: it does not wait.
        assert!(!consumer.wait_for_doorbell());
        assert_eq!(consumer.peek(&mut entry).unwrap(), Some(EntryKind::Record));
        assert_eq!(entry, b"y");
        // A closed ring is finished only once it is empty.
        assert_eq!(producer.close(), Wake(false));
        consumer.consume();
        assert!(!consumer.is_finished());
        assert!(consumer.peek(&mut entry).unwrap().is_some());
        consumer.consume();
        assert!(consumer.is_finished());
    }

    /// A consumer that gave its bell is woken through it, not by a doorbell frame; one without
    /// a bell, or whose bell is gone (it left, or cannot be reached), gets the frame; a
    /// publication to a consumer that is not asleep rings nothing.
    #[tokio::test]
    async fn a_consumer_with_a_bell_is_rung_through_it_and_others_get_the_frame() {
        let mut fixture = Fixture::new(40);
        let Fixture {
            producer, consumer, ..
        } = &mut fixture;
        let mut entry = Vec::new();
        assert!(
            producer.ring_bell_or_need_frame(Wake(true)),
            "a consumer that waits without a bell gets the frame"
        );
        let bell = crate::bell::Bell::bind().expect("a bell can be bound here");
        consumer.set_bell(bell.id());
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(!producer.ring_bell_or_need_frame(Wake(false)), "not asleep");
        assert!(bell.poll_rung(&mut cx).is_pending(), "nothing rang");

        assert_eq!(
            producer.push(EntryKind::Record, b"a"),
            Pushed::Published(Wake(false))
        );
        assert!(consumer.peek(&mut entry).unwrap().is_some());
        consumer.consume();
        assert!(consumer.wait_for_doorbell());
        let Pushed::Published(wake) = producer.push(EntryKind::Record, b"b") else {
            panic!("a waiting consumer's entry is published at once");
        };
        assert_eq!(wake, Wake(true));
        assert!(
            !producer.ring_bell_or_need_frame(wake),
            "the bell rang instead"
        );
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            std::future::poll_fn(|cx| bell.poll_rung(cx)),
        )
        .await
        .expect("the bell woke the consumer");

        // The consumer's bell is gone: the producer falls back to the frame.
        drop(bell);
        assert!(producer.ring_bell_or_need_frame(Wake(true)));
    }

    /// A broken producer cannot make the consumer read past the ring: impossible counters and
    /// entry lengths are errors naming the ring.
    #[test]
    fn impossible_counters_and_lengths_are_errors() {
        let mut entry = Vec::new();
        let mut fixture = Fixture::new(20);
        let memory = RingMemory {
            segment: Arc::clone(fixture.producer.block().segment()),
            base: fixture.producer.block().data_offset(),
        };
        memory
            .u64_at(TAIL)
            .store(RING_DATA as u64 + 8, Ordering::Release);
        let error = fixture.consumer.peek(&mut entry).unwrap_err().to_string();
        assert!(error.contains("impossible"), "{error}");
        // An entry whose length passes the tail, forged through the ring's own writer.
        let mut fixture = Fixture::new(21);
        assert_ne!(
            fixture.producer.push(EntryKind::Record, &[1; 16]),
            Pushed::Full
        );
        let mut header = [0u8; ENTRY_HEADER];
        header[..4].copy_from_slice(&4096u32.to_le_bytes());
        fixture.producer.write(0, &header);
        let _ = fixture.producer.publish();
        let error = fixture.consumer.peek(&mut entry).unwrap_err().to_string();
        assert!(error.contains("does not fit"), "{error}");
        // The same entry for a consumer that reads headers (it reads no tail).
        let mut fixture = Fixture::adopted(22, true);
        assert_ne!(
            fixture.producer.push(EntryKind::Record, &[1; 16]),
            Pushed::Full
        );
        let header = header_word(RING_DATA as u32, EntryKind::Record as u32);
        fixture.producer.write(0, &header.to_le_bytes());
        let error = fixture.consumer.peek(&mut entry).unwrap_err().to_string();
        assert!(error.contains("does not fit"), "{error}");
        // A head no entry can start at: refused at adoption, not a panic at the first look.
        let fixture = Fixture::new(23);
        let memory = RingMemory {
            segment: Arc::clone(fixture.producer.block().segment()),
            base: fixture.producer.block().data_offset(),
        };
        memory.u64_at(HEAD).store(12, Ordering::Release);
        let error = adopt_again(&fixture, true)
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains("head 12 is not a multiple of 8"), "{error}");
    }

    /// A producer that finished while its consumer was still at the ring watches the consumer:
    /// while it lives the producer waits; a process under the consumer's pid that started at
    /// another time (the pid reused after the consumer died) is not the consumer, and what the
    /// consumer left is then the producer's to release. When the ring held the pid alone, a
    /// reused pid kept it for as long as that other process ran.
    #[test]
    fn a_consumers_pid_reused_by_another_process_does_not_keep_what_it_left() {
        let mut fixture = Fixture::new(14);
        assert_ne!(
            fixture.producer.push(EntryKind::Record, b"left"),
            Pushed::Full
        );
        fixture.producer.publish();
        let (_, consumer_left) = fixture.producer.finish();
        assert!(!consumer_left, "the consumer is still at the ring");
        assert!(!fixture.producer.consumer_died());
        let OrphanFate::Waiting(orphan) = fixture.producer.orphan().unwrap().fate() else {
            panic!("a consumer that lives is waited for");
        };
        // This process is the consumer: its pid with another start time is what the pid
        // looks like once another process has it.
        let start = fixture.consumer.memory.u64_at(CONSUMER_START);
        assert_ne!(
            start.load(Ordering::Relaxed),
            0,
            "the consumer wrote its start time"
        );
        start.fetch_add(1, Ordering::Relaxed);
        assert!(fixture.producer.consumer_died());
        // `fate` gives back the dead consumer's reference, which the fixture's consumer (alive
        // in truth) still gives back when dropped: one more keeps the count right.
        fixture.producer.block().add_references(1);
        let OrphanFate::Dead(mut reader) = orphan.fate() else {
            panic!("a pid reused by another process kept what the consumer left");
        };
        let mut entry = Vec::new();
        assert_eq!(reader.peek(&mut entry).unwrap(), Some(EntryKind::Record));
        assert_eq!(entry, b"left");
        // The producer's, the fixture's consumer's (given back by `fate`, added again above) and
        // the reader's (the orphan's): nothing was given back twice, nothing kept.
        assert_eq!(fixture.producer.block().block_references(), Some(3));
        drop(reader);
        assert_eq!(fixture.producer.block().block_references(), Some(2));
    }

    /// A ring no consumer adopted (its receiver never read the announcement): while the
    /// process it was announced to lives, or when that process is not known, the producer
    /// waits (the announcement may still be read); once that process is gone nobody can adopt
    /// the ring, and what it holds is the producer's to release, with the reference the
    /// announcement carried.
    #[test]
    fn a_ring_never_adopted_is_released_once_the_process_it_was_announced_to_is_gone() {
        let (_removed, owned) = own_segment("unadopted");
        let mut producer = RingProducer::new(owned.allocate_long_lived(RING_BLOCK).unwrap());
        // The announcement's reference, which no consumer took.
        producer.block().add_references(1);
        assert_ne!(producer.push(EntryKind::Record, b"left"), Pushed::Full);
        producer.publish();
        let (_, consumer_left) = producer.finish();
        assert!(!consumer_left);
        assert_eq!(producer.consumer_pid(), 0, "never adopted");
        for announced_to in [None, Some(std::process::id())] {
            let orphan = producer.orphan().unwrap().announced_to(announced_to);
            let OrphanFate::Waiting(orphan) = orphan.fate() else {
                panic!("a ring announced to {announced_to:?} was let go");
            };
            drop(orphan);
        }
        // No process has this pid (Linux's pid_max is at most 2^22).
        let gone = i32::MAX as u32;
        let orphan = producer.orphan().unwrap().announced_to(Some(gone));
        let OrphanFate::Dead(mut reader) = orphan.fate() else {
            panic!("a ring announced to a process that is gone was kept");
        };
        let mut entry = Vec::new();
        assert_eq!(reader.peek(&mut entry).unwrap(), Some(EntryKind::Record));
        assert_eq!(entry, b"left");
        // The producer's and the reader's: the announcement's reference was given back once.
        assert_eq!(producer.block().block_references(), Some(2));
        drop(reader);
        assert_eq!(producer.block().block_references(), Some(1));
    }

    /// A receiver that cannot adopt an announced ring (here a block too small to be one)
    /// keeps the reference the announcement carried, which the producer gives back once the
    /// receiver's process is gone; `adopt` (the producer's own reader) gives it back at once.
    #[test]
    fn a_ring_that_cannot_be_adopted_keeps_the_announcements_reference_for_its_producer() {
        let (_removed, owned) = own_segment("refused");
        let block = owned.allocate(4096).unwrap();
        let announced = || {
            block.add_references(1);
            ShmBuffer::adopt_referenced_block(
                Arc::clone(owned.segment()),
                WireRange {
                    offset: block.data_offset() as u64,
                    size: 4096,
                },
            )
            .unwrap()
            .0
        };
        assert!(RingConsumer::adopt_announced(announced(), DeliveryRef::NONE, false).is_err());
        assert_eq!(
            block.block_references(),
            Some(2),
            "the announcement's reference stays for the producer"
        );
        block.release_references(1);
        assert!(RingConsumer::adopt(announced(), DeliveryRef::NONE, false).is_err());
        assert_eq!(block.block_references(), Some(1), "given back at once");
    }

    /// A producer that rings a sleeping consumer's doorbell says when, on the clock the
    /// consumer reads (how a sleeping receive tells how soon its peer answered); publishing to
    /// a consumer that is not asleep rings nothing and leaves the time as it was.
    #[test]
    fn a_rung_doorbell_says_when() {
        let mut fixture = Fixture::new(30);
        assert_eq!(fixture.consumer.rung_at(), 0, "never rung");
        assert_ne!(
            fixture.producer.push(EntryKind::Record, &[1; 8]),
            Pushed::Full
        );
        assert!(!fixture.producer.publish().0, "the consumer was not asleep");
        assert_eq!(fixture.consumer.rung_at(), 0);
        let mut entry = Vec::new();
        assert!(
            fixture
                .consumer
                .peek(&mut entry)
                .expect("an entry")
                .is_some()
        );
        fixture.consumer.consume();

        let before = monotonic_ns();
        assert!(
            fixture.consumer.wait_for_doorbell(),
            "nothing came meanwhile"
        );
        // `push` publishes at once to a consumer that asked for entries (it is hungry).
        let pushed = fixture.producer.push(EntryKind::Record, &[2; 8]);
        let rang = match pushed {
            Pushed::Published(wake) => wake.0,
            _ => fixture.producer.publish().0,
        };
        assert!(rang, "a sleeping consumer gets a doorbell");
        let rung = fixture.consumer.rung_at();
        assert!(before <= rung && rung <= monotonic_ns(), "{before} {rung}");
    }
}
