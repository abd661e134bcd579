//! The per-device state of the shmem transport: its own segment, the segments and regions of
//! other processes it has mapped, and its regions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferromq_core::Message;
use tokio::time::Instant;

use crate::delivery::{DeliverySlots, SentCounter, TakenCounter};
use crate::error::ShmError;
use crate::managed::{OwnedSegment, ShmBuffer};
use crate::names::{ObjectKind, ObjectName, current_uid};
use crate::region::{
    ACK_FLUSH_LIMIT, AckProducer, Acknowledge, REGION_DATA_START, RegionCallback, UnmanagedRegion,
    remote_acknowledger,
};
use crate::ring::{EntryKind, OrphanFate, OrphanRing, RingConsumer, RingProducer, Wake};
use crate::segment::Segment;
use crate::wire::{DeliveryRef, ObjectRef, PartRef, WireRange, session_hash};

/// Options of the shmem transport.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// Session id; devices of one session exchange shared memory.
    pub session: String,
    /// Size of this process's managed segment (FairMQ's default: 2 GiB; pages are used only when
    /// touched).
    pub segment_size: usize,
    /// How long an allocation waits for room in a full segment before failing
    /// (`Duration::MAX`: as long as it takes, FairMQ's `--shm-throw-bad-alloc false`).
    pub allocation_timeout: Duration,
    /// The pause between allocation attempts while the segment is full (FairMQ's
    /// `--bad-alloc-attempt-interval`); `None`: from 100 µs, doubling up to 10 ms.
    pub retry_interval: Option<Duration>,
    /// Payloads up to this size travel inside the descriptor instead of a segment block; the
    /// transport makes messages up to this size (at most `small::SMALL_MESSAGE_MAX`) in process
    /// memory for that (`shm-inline-max`; 0: every message is a block).
    pub inline_max: usize,
    /// Lock this process's segment into memory when it is created (`mlock`: every page
    /// allocated and mapped then, never faulted in at first use nor swapped out). FairMQ's
    /// `shm-mlock-segment-on-creation`; its `shm-mlock-segment` sets this and `mlock_peers`.
    pub mlock_own: bool,
    /// Lock every peer's segment into memory when this process maps it (FairMQ's
    /// `shm-mlock-segment`): a first look at a block there costs no page fault.
    pub mlock_peers: bool,
    /// Write zeros over this process's segment when it is created (FairMQ's
    /// `shm-zero-segment[-on-creation]`): its pages are allocated then, not at first use. A
    /// peer's segment is never written: its free ranges are its creator's to know.
    pub zero_own: bool,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            session: "default".to_owned(),
            segment_size: 2 << 30,
            allocation_timeout: Duration::from_secs(10),
            retry_interval: None,
            inline_max: 256,
            mlock_own: false,
            mlock_peers: false,
            zero_own: false,
        }
    }
}

// The smallest size `ShmOptions::from_device` names in its error.
const _: () = assert!(crate::segment::MIN_SEGMENT_SIZE == 8192);

impl ShmOptions {
    /// The device properties [`ShmOptions::from_device`] reads (FairMQ's `--shm-*` options as
    /// `ferromq device` passes them on, and `shm-inline-max`).
    pub const PROPERTIES: [&'static str; 8] = [
        "shm-segment-size",
        "shm-allocation-timeout-ms",
        "shm-allocation-retry-ms",
        "shm-inline-max",
        "shm-mlock-segment",
        "shm-mlock-segment-on-creation",
        "shm-zero-segment",
        "shm-zero-segment-on-creation",
    ];

    /// The options for a device: its session, and the defaults overridden by the properties
    /// [`ShmOptions::PROPERTIES`] names.
    ///
    /// # Errors
    /// [`ferromq_core::Error::Config`] naming a property whose value is not a number of the
    /// right kind.
    pub fn from_device(
        device: &ferromq_core::TransportOptions,
    ) -> ferromq_core::Result<ShmOptions> {
        let defaults = ShmOptions::default();
        let flag = |key| device.flag(key).map(|flag| flag.unwrap_or(false));
        // Each read, so that a bad value is refused even beside a flag that decides alone.
        let mlock_everything = flag("shm-mlock-segment")?;
        let mlock_on_creation = flag("shm-mlock-segment-on-creation")?;
        let zero = flag("shm-zero-segment")? | flag("shm-zero-segment-on-creation")?;
        let segment_size = device
            .size("shm-segment-size")?
            .unwrap_or(defaults.segment_size);
        if segment_size < crate::segment::MIN_SEGMENT_SIZE {
            // Named as the property it is (`--property`, a topology), before any object.
            return Err(ferromq_core::Error::Config(
                ferromq_core::ConfigError::InvalidProperty {
                    key: "shm-segment-size".to_owned(),
                    value: segment_size.to_string(),
                    expected: "at least 8192 bytes, a segment's smallest size",
                },
            ));
        }
        Ok(ShmOptions {
            session: device.session.clone(),
            segment_size,
            allocation_timeout: device
                .millis("shm-allocation-timeout-ms")?
                .unwrap_or(defaults.allocation_timeout),
            retry_interval: device
                .millis("shm-allocation-retry-ms")?
                .or(defaults.retry_interval),
            inline_max: device
                .size("shm-inline-max")?
                .unwrap_or(defaults.inline_max),
            mlock_own: mlock_everything || mlock_on_creation,
            mlock_peers: mlock_everything,
            zero_own: zero,
        })
    }
}

/// Another process's region as this one maps it: its memory, and the way its releases go back
/// to its creator.
struct RemoteRegion {
    segment: Arc<Segment>,
    /// Flushed when the session is dropped (see `Drop for Session`).
    producer: Arc<AckProducer>,
    acknowledge: Acknowledge,
}

impl RemoteRegion {
    fn new(segment: Arc<Segment>) -> RemoteRegion {
        let (producer, acknowledge) = remote_acknowledger(Arc::clone(&segment));
        RemoteRegion {
            segment,
            producer,
            acknowledge,
        }
    }
}

/// Opens a peer's object, locked into memory when `lock` (see [`ShmOptions::mlock_peers`]);
/// a managed segment's table of large-block headers mapped (`managed.rs`, "Block layout").
fn open_peer(name: ObjectName, lock: bool) -> Result<Segment, ShmError> {
    let managed = name.kind == ObjectKind::Segment;
    let segment = Segment::open(name)?;
    if lock {
        segment.lock_in_memory()?;
    }
    if managed {
        crate::managed::map_header_table(&segment);
    }
    Ok(segment)
}

/// Segment indices are unique per process, whatever the number of transports in it.
static NEXT_SEGMENT_INDEX: AtomicU32 = AtomicU32::new(0);
static NEXT_REGION_INDEX: AtomicU32 = AtomicU32::new(0);

pub(crate) struct Session {
    pub(crate) options: ShmOptions,
    pub(crate) uid: u32,
    pub(crate) hash: u64,
    /// The session as it appears in object names (see `names::sanitise_session`).
    encoded_session: String,
    own: tokio::sync::OnceCell<Arc<OwnedSegment>>,
    segments: Mutex<HashMap<ObjectRef, Arc<Segment>>>,
    regions: Mutex<HashMap<ObjectRef, RemoteRegion>>,
    /// The lent ranges of the regions this process created (gone once a region is dropped).
    own_regions: Mutex<Vec<std::sync::Weak<crate::region::LentRanges>>>,
    /// The delivery counter slots of this process's segment.
    delivery_slots: Arc<DeliverySlots>,
    /// Whether an allocation that finds the segment full looks again at once for a while
    /// before sleeping (see `allocate`).
    spin_on_full: AtomicBool,
    /// Rings this process produced and finished with while their consumers were still at
    /// them, or before any consumer adopted them: if a consumer (or the process a ring was
    /// announced to) dies without finishing, what it left is released here (see
    /// [`Session::settle_orphans`]).
    orphans: Mutex<Vec<OrphanRing>>,
    /// The sockets of this process that produce into rings, looked at when an allocation finds
    /// the segment full ([`Session::settle_full`]).
    producers: Mutex<Vec<std::sync::Weak<dyn RingHolder>>>,
}

/// A socket (push, pub) or a connection's ring (pair, req, rep) that keeps a ring until the
/// socket next writes: when its connection ends (a receiver killed), the ring stays with the
/// socket until then, and what the receiver left in it with the ring. An allocation that finds
/// the segment full has the socket let such rings go ([`Session::settle_full`]), so their
/// backlog is released even when the socket never writes again (no receiver left, a sender
/// waiting for room).
pub(crate) trait RingHolder: Send + Sync {
    /// Drops the rings of connections that ended (each one's drop finishes it: see
    /// [`Session::finish_producing`]). Never called with the holder's own lock held: the
    /// allocation that calls it takes no socket lock.
    fn drop_rings_of_gone_connections(&self);
}

/// A message of `size` bytes in a block allocated for at least that many.
fn message_of(buffer: ShmBuffer, size: usize) -> Message {
    let mut message = Message::from_buffer(buffer.boxed());
    message
        .set_used_size(size)
        .expect("blocks are at least as large as asked");
    message
}

/// How long a full segment is looked at again, yielding between looks, before sleeping.
const SPIN_ON_FULL: Duration = Duration::from_micros(200);

impl Session {
    pub(crate) fn new(options: ShmOptions) -> Session {
        let uid = current_uid();
        let encoded_session = crate::names::sanitise_session(&options.session);
        let hash = session_hash(uid, &encoded_session);
        Session {
            options,
            uid,
            hash,
            encoded_session,
            own: tokio::sync::OnceCell::new(),
            segments: Mutex::default(),
            regions: Mutex::default(),
            own_regions: Mutex::default(),
            delivery_slots: Arc::default(),
            spin_on_full: AtomicBool::new(true),
            orphans: Mutex::default(),
            producers: Mutex::default(),
        }
    }

    /// Has an allocation that finds the segment full look at `holder`'s rings, for as long as
    /// the holder lives (the session keeps a weak reference).
    pub(crate) fn watch_producer<H: RingHolder + 'static>(&self, holder: &Arc<H>) {
        let holder: Arc<dyn RingHolder> = Arc::clone(holder) as _;
        let mut producers = self.producers.lock().expect("producers poisoned");
        producers.retain(|known| known.strong_count() > 0);
        producers.push(Arc::downgrade(&holder));
    }

    /// The segment is full: the rings of connections that ended go (their consumers' backlog
    /// becomes orphaned, or is released at once), then what dead consumers left is released.
    fn settle_full(&self) {
        let producers: Vec<_> = self
            .producers
            .lock()
            .expect("producers poisoned")
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for producer in producers {
            producer.drop_rings_of_gone_connections();
        }
        self.settle_orphans();
    }

    fn object_name(&self, kind: ObjectKind, creator_pid: u32, index: u32) -> ObjectName {
        ObjectName::new(self.uid, &self.options.session, kind, creator_pid, index)
    }

    /// This process's managed segment, created on first use (off the async workers).
    pub(crate) async fn own_segment(&self) -> Result<&Arc<OwnedSegment>, ShmError> {
        self.own
            .get_or_try_init(|| async {
                let index = NEXT_SEGMENT_INDEX.fetch_add(1, Ordering::Relaxed);
                let name = self.object_name(ObjectKind::Segment, std::process::id(), index);
                let size = self.options.segment_size;
                let session = self.options.session.clone();
                let (zero, lock) = (self.options.zero_own, self.options.mlock_own);
                // The watchdog first: a process killed while it makes (and zeroes, for
                // seconds) its segment leaves an object without a header, which the watchdog
                // removes once its creator is gone (`cleanup::unreadable`); started after,
                // there was none to do it.
                crate::cleanup::ensure_watchdog(self.uid, &session);
                // Set when this future is dropped (a device taken down while it makes its
                // segment): the blocking work stops within a chunk instead of holding the
                // runtime's shutdown until the last page is zeroed or locked.
                let given_up = Arc::new(AtomicBool::new(false));
                let _give_up = GiveUpOnDrop(Arc::clone(&given_up));
                let owned = tokio::task::spawn_blocking(move || {
                    let segment = Segment::create_zeroed(name, size, zero, &given_up)?;
                    if lock && let Err(refused) = segment.lock_in_memory_unless(&given_up) {
                        // Nobody knows the object yet: it goes now rather than stay in
                        // /dev/shm until the watchdog sees this process gone.
                        let _ = Segment::remove(segment.name());
                        return Err(refused);
                    }
                    Ok(Arc::new(OwnedSegment::new(segment)))
                })
                .await
                .map_err(|error| ShmError::Os { name: "segment".to_owned(), operation: "create", reason: error.to_string() })??;
                tracing::debug!(segment = %owned.segment().name(), size, "shared memory segment created");
                self.segments
                    .lock()
                    .expect("segment map poisoned")
                    .insert(ObjectRef::of(owned.segment().name()), Arc::clone(owned.segment()));
                Ok(owned)
            })
            .await
    }

    /// A delivery counter for a new sending socket (creating this process's segment if need
    /// be); `None` when every slot is taken.
    pub(crate) async fn sent_counter(&self) -> Result<Option<SentCounter>, ShmError> {
        let owned = self.own_segment().await?;
        Ok(SentCounter::claim(owned, &self.delivery_slots))
    }

    /// The counter a received frame names, `None` when it names none.
    pub(crate) fn taken_counter(
        &self,
        delivery: DeliveryRef,
    ) -> Result<Option<TakenCounter>, ShmError> {
        if !delivery.is_some() {
            return Ok(None);
        }
        let segment = self.segment(delivery.segment)?;
        TakenCounter::new(segment, delivery).map(Some)
    }

    /// A block of `size` bytes in this process's segment if there is room now: a send through
    /// a reservation copies a heap part into it and must not wait.
    pub(crate) fn allocate_now(&self, size: usize) -> Result<ShmBuffer, ShmError> {
        self.allocate_now_with(size, OwnedSegment::allocate)
    }

    /// [`Session::allocate_now`] for a block that a ring entry names by a block reference
    /// (`wire::encode_block_ref`): its header before its data.
    pub(crate) fn allocate_referenced_now(&self, size: usize) -> Result<ShmBuffer, ShmError> {
        self.allocate_now_with(size, OwnedSegment::allocate_with_header_before_data)
    }

    fn allocate_now_with(
        &self,
        size: usize,
        allocate: impl FnOnce(&OwnedSegment, usize) -> Option<ShmBuffer>,
    ) -> Result<ShmBuffer, ShmError> {
        // Every shmem socket creates it before it exists, so a socket always finds it.
        let Some(owned) = self.own.get() else {
            return Err(ShmError::NotFound {
                name: "this process's own segment (not created yet)".to_owned(),
            });
        };
        if size > owned.max_message_size() {
            return Err(ShmError::LargerThanSegment {
                requested: size,
                segment_size: self.options.segment_size,
            });
        }
        allocate(owned, size).ok_or_else(|| owned.full_error(size, 0))
    }

    /// A block of `size` bytes that lives as long as a socket (a descriptor ring), if this
    /// process's segment has room now.
    pub(crate) fn allocate_long_lived(&self, size: usize) -> Result<ShmBuffer, ShmError> {
        let Some(owned) = self.own.get() else {
            return Err(ShmError::NotFound {
                name: "this process's own segment (not created yet)".to_owned(),
            });
        };
        owned
            .allocate_long_lived(size)
            .ok_or_else(|| owned.full_error(size, 0))
    }

    /// A message of `size` bytes in this process's segment, waiting up to the allocation timeout
    /// while the segment is full.
    pub(crate) async fn allocate(&self, size: usize) -> Result<ShmBuffer, ShmError> {
        let owned = self.own_segment().await?;
        if size > owned.max_message_size() {
            // The size the user configured (`--shm-segment-size`), which the error tells them
            // to raise; the segment's header takes a little of it.
            return Err(ShmError::LargerThanSegment {
                requested: size,
                segment_size: self.options.segment_size,
            });
        }
        if let Some(buffer) = owned.allocate(size) {
            return Ok(buffer);
        }
        // Full: only now is the clock read. A receiver killed with a backlog may hold room.
        self.settle_full();
        let mut wait = self.room_wait();
        // While the receivers keep releasing blocks (the usual case for large messages: the
        // segment holds only so many), room comes back within microseconds: look again after
        // yielding (which also lets this process's own socket tasks send on) before sleeping a
        // timer tick. A look that found nothing for SPIN_ON_FULL turns this off until an
        // allocation succeeds again, so a stalled receiver costs no CPU.
        let spin_for = SPIN_ON_FULL.min(self.options.allocation_timeout);
        if self.spin_on_full.load(Ordering::Relaxed) && !spin_for.is_zero() {
            while wait.started.elapsed() < spin_for {
                crate::delivery::give_way(wait.started.elapsed());
                tokio::task::yield_now().await;
                if let Some(buffer) = owned.allocate(size) {
                    return Ok(buffer);
                }
            }
            self.spin_on_full.store(false, Ordering::Relaxed);
        }
        loop {
            // No deadline but the allocation timeout: it pauses or fails.
            wait.pause(size, None).await?;
            if let Some(buffer) = owned.allocate(size) {
                self.spin_on_full.store(true, Ordering::Relaxed);
                return Ok(buffer);
            }
        }
    }

    /// Closes `ring`, which this process produced, for good (see `ring.rs`, "Peer death and
    /// drop"): releases what its consumer left if the consumer finished first, or keeps an
    /// eye on a consumer still at the ring in case it dies, or, for a ring no consumer adopted
    /// yet, on the process it was `announced_to` (the peer's handshake names it): only that
    /// process can adopt it, so once it is gone what the ring holds is released. Whether the
    /// consumer must get a doorbell, and how many messages the consumer had left when it
    /// finished first (those the ring still held, released here, and those it had taken and
    /// not handed out, which it dropped; 0 when it had not finished). A producer that
    /// [handed them over](RingProducer::hand_over) counts those lost: its close reported them
    /// delivered, and a consumer that finished first never read the word.
    pub(crate) fn finish_producing(
        &self,
        ring: &mut RingProducer,
        announced_to: Option<u32>,
    ) -> (Wake, u64) {
        let (wake, consumer_left) = ring.finish();
        if !consumer_left && ring.consumer_pid() == 0 && announced_to.is_none() {
            // Never adopted, and nothing is known of a consumer to watch.
            return (wake, 0);
        }
        let mut n_released = 0;
        match ring
            .orphan()
            .map(|orphan| orphan.announced_to(announced_to))
        {
            Ok(orphan) if consumer_left => {
                n_released = ring.taken_at_consumers_finish();
                match orphan.reader() {
                    Ok(mut reader) => n_released += self.release_untaken(&mut reader),
                    Err(error) => Self::left_in_ring(&error),
                }
            }
            Ok(orphan) => {
                self.orphans.lock().expect("orphans poisoned").push(orphan);
                self.settle_orphans();
            }
            Err(error) => Self::left_in_ring(&error),
        }
        (wake, n_released)
    }

    /// Closes `ring`, which this process consumed, for good: releases what is left in it if
    /// its producer finished first (a producer in this process then stops watching it at
    /// once; one in another process at its next look). The `n_taken` messages taken from the
    /// ring and not handed out are this process's to release. `Some` when that producer handed
    /// what was left over to this consumer ([`RingProducer::hand_over`]), with how many
    /// messages were lost: those the ring still held and the `n_taken`, which the producer
    /// reported delivered. A producer that finishes last counts them all itself.
    pub(crate) fn finish_consuming(&self, ring: &mut RingConsumer, n_taken: u64) -> Option<u64> {
        let handed_over = ring.finish(n_taken)?;
        let n_released = self.release_untaken(ring);
        self.settle_orphans();
        handed_over.then_some(n_released + n_taken)
    }

    /// Looks at the consumers of the rings this process finished with while they were still at
    /// them (or at the processes that never adopted theirs): what one that died left is
    /// released, one that finished is forgotten. Done when such a ring is finished and whenever
    /// an allocation finds the segment full, so a receiver killed with a backlog does not hold
    /// its sender's memory for ever.
    pub(crate) fn settle_orphans(&self) {
        let watched = std::mem::take(&mut *self.orphans.lock().expect("orphans poisoned"));
        if watched.is_empty() {
            return;
        }
        let mut waiting = Vec::new();
        for orphan in watched {
            match orphan.fate() {
                OrphanFate::Settled => {}
                OrphanFate::Dead(mut reader) => {
                    self.release_untaken(&mut reader);
                }
                OrphanFate::Waiting(orphan) => waiting.push(orphan),
            }
        }
        self.orphans
            .lock()
            .expect("orphans poisoned")
            .extend(waiting);
    }

    fn left_in_ring(error: &ShmError) {
        tracing::warn!(%error, "the entries a receiver left in its ring stay until the session ends");
    }

    /// Releases the references held by the entries left in `ring`, whose reader is the last one
    /// at it (see `ring.rs`, "Peer death and drop"), and marks the ring settled: their messages
    /// are materialised and dropped (the sender counted them as not taken; if it handed them
    /// over to a consumer instead, that consumer's close reports them, see `socket.rs`).
    /// Each entry leaves the ring before its messages are dropped (a reader killed in between
    /// leaks them rather than have them released twice). Stops at an entry it cannot read:
    /// what follows stays until the session's memory is removed. Returns how many messages
    /// it released.
    pub(crate) fn release_untaken(&self, ring: &mut RingConsumer) -> u64 {
        let mut entry = Vec::new();
        let mut decoded = crate::wire::decode_scratch();
        let mut last_segment = None;
        let mut n_released = 0u64;
        let mut part_lost = None;
        let mut released = || -> Result<(), ShmError> {
            while let Some(kind) = ring.peek(&mut entry)? {
                let indirect = match kind {
                    EntryKind::Record => None,
                    EntryKind::Indirect => Some(self.read_indirect_entry(&mut entry)?),
                };
                crate::wire::decode_record_into(&entry, ring.delivery(), &mut decoded)?;
                // Every part the entry names, then the entry out of the ring, then the
                // releases: a part that cannot be materialised is left (its reference stays),
                // never tried again by anyone.
                let parts = decoded
                    .parts
                    .drain(..)
                    .map(|part| self.materialise(part, &mut last_segment))
                    .collect::<Vec<_>>();
                n_released += decoded.record_lens.len() as u64;
                ring.consume();
                for part in parts {
                    if let Err(error) = part {
                        part_lost.get_or_insert(error);
                    }
                }
                if let Some((mapped, range)) = indirect {
                    drop(ShmBuffer::adopt_referenced_block(mapped, range));
                }
            }
            Ok(())
        };
        match released() {
            Ok(()) => ring.settle(),
            Err(error) => Self::left_in_ring(&error),
        }
        if let Some(error) = part_lost {
            Self::left_in_ring(&error);
        }
        if n_released > 0 {
            tracing::debug!(
                n_messages = n_released,
                "released the messages a receiver left untaken in its ring"
            );
        }
        n_released
    }

    /// Replaces `entry`, a ring entry naming a block that holds a record too large for the
    /// ring, by a copy of that record (read in place: the entry's reference keeps the block),
    /// and returns the block's segment and range, whose reference the caller gives back once
    /// the entry left the ring and the record's messages hold theirs.
    pub(crate) fn read_indirect_entry(
        &self,
        entry: &mut Vec<u8>,
    ) -> Result<(Arc<Segment>, WireRange), ShmError> {
        let (segment, range) = crate::wire::decode_block_ref(entry)?;
        let mapped = self.segment(segment)?;
        let outside = |what: &str| ShmError::BadDescriptor {
            reason: format!("a ring entry's block {range} is outside its {what}"),
        };
        let bytes = range
            .checked(0, mapped.len())
            .ok_or_else(|| outside("segment"))?;
        entry.clear();
        entry.resize(bytes.len(), 0);
        mapped
            .copy_out(bytes.start, entry)
            .ok_or_else(|| outside("data"))?;
        Ok((mapped, range))
    }

    /// The wait of something that needs room in this process's segment and found none (a
    /// message's block, a connection's descriptor ring), starting now, up to the allocation
    /// timeout.
    pub(crate) fn room_wait(&self) -> RoomWait<'_> {
        RoomWait {
            session: self,
            started: Instant::now(),
            pause: self
                .options
                .retry_interval
                .unwrap_or(Duration::from_micros(100)),
        }
    }

    /// How this process's own segment is used, as its header says (the owner publishes the
    /// figures as it allocates and reclaims), and its regions' buffers lent; `None` before it
    /// has either.
    pub(crate) fn memory_figures(&self) -> Option<ferromq_core::MemoryFigures> {
        let (mut regions, mut lent) = (0, 0);
        for ranges in self
            .own_regions
            .lock()
            .expect("own regions poisoned")
            .iter()
            .filter_map(std::sync::Weak::upgrade)
        {
            regions += 1;
            lent += ranges.lock().expect("lent ranges poisoned").len() as u64;
        }
        let mut figures = ferromq_core::MemoryFigures {
            regions,
            region_buffers_lent: lent,
            ..ferromq_core::MemoryFigures::default()
        };
        match self.own.get() {
            Some(own) => {
                let header = own.segment().header();
                figures.size = own.capacity() as u64;
                figures.used = header.used_bytes.load(Ordering::Relaxed);
                figures.largest_free = header.largest_free.load(Ordering::Relaxed);
                figures.live_blocks = header.live_blocks.load(Ordering::Relaxed);
            }
            None if regions == 0 => return None,
            None => {}
        }
        Some(figures)
    }

    /// Whether a message of `size` bytes is made in process memory, to travel inside its
    /// descriptor (`small.rs`).
    fn makes_small(&self, size: usize) -> bool {
        size <= self.options.inline_max.min(crate::small::SMALL_MESSAGE_MAX)
    }

    /// A message of `size` bytes if this process's segment exists and has room now (a small
    /// one in process memory).
    pub(crate) fn try_new_message(&self, size: usize) -> Option<Message> {
        if self.makes_small(size) {
            return Some(crate::small::small_message(size));
        }
        let owned = self.own.get()?;
        if size > owned.max_message_size() {
            return None;
        }
        Some(message_of(owned.allocate(size)?, size))
    }

    pub(crate) async fn new_message(&self, size: usize) -> Result<Message, ShmError> {
        if self.makes_small(size) {
            return Ok(crate::small::small_message(size));
        }
        Ok(message_of(self.allocate(size).await?, size))
    }

    /// Maps, off the async threads, the segments and regions among `objects` that this process
    /// has not mapped yet. Opening one is `shm_open` + `mmap` and
    /// may wait up to 2 s for a brand-new object's header, which must not stall a runtime
    /// thread; afterwards [`Session::materialise`] finds them mapped.
    pub(crate) async fn map_objects(
        &self,
        objects: &[(ObjectKind, ObjectRef)],
    ) -> Result<(), ShmError> {
        for &(kind, object) in objects {
            let mapped = match kind {
                ObjectKind::Segment => self
                    .segments
                    .lock()
                    .expect("segment map poisoned")
                    .contains_key(&object),
                ObjectKind::Region => self
                    .regions
                    .lock()
                    .expect("region map poisoned")
                    .contains_key(&object),
            };
            if mapped {
                continue;
            }
            let name = self.object_name(kind, object.creator_pid, object.index);
            let display = name.to_string();
            let lock = kind == ObjectKind::Segment && self.options.mlock_peers;
            let opened = tokio::task::spawn_blocking(move || open_peer(name, lock))
                .await
                .map_err(|error| ShmError::Os {
                    name: display,
                    operation: "open",
                    reason: error.to_string(),
                })??;
            let segment = Arc::new(opened);
            match kind {
                ObjectKind::Segment => {
                    self.segments
                        .lock()
                        .expect("segment map poisoned")
                        .entry(object)
                        .or_insert(segment);
                }
                ObjectKind::Region => {
                    self.regions
                        .lock()
                        .expect("region map poisoned")
                        .entry(object)
                        .or_insert_with(|| RemoteRegion::new(segment));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn segment(&self, object: ObjectRef) -> Result<Arc<Segment>, ShmError> {
        let mut segments = self.segments.lock().expect("segment map poisoned");
        if let Some(segment) = segments.get(&object) {
            return Ok(Arc::clone(segment));
        }
        let segment = Arc::new(open_peer(
            self.object_name(ObjectKind::Segment, object.creator_pid, object.index),
            self.options.mlock_peers,
        )?);
        segments.insert(object, Arc::clone(&segment));
        Ok(segment)
    }

    /// A peer's region (mapped on first sight) and the acknowledgement its buffers call.
    fn region(&self, object: ObjectRef) -> Result<(Arc<Segment>, Acknowledge), ShmError> {
        let mut regions = self.regions.lock().expect("region map poisoned");
        if let Some(region) = regions.get(&object) {
            return Ok((Arc::clone(&region.segment), Arc::clone(&region.acknowledge)));
        }
        let segment = Arc::new(Segment::open(self.object_name(
            ObjectKind::Region,
            object.creator_pid,
            object.index,
        ))?);
        let region = RemoteRegion::new(segment);
        let found = (Arc::clone(&region.segment), Arc::clone(&region.acknowledge));
        regions.insert(object, region);
        Ok(found)
    }

    /// The message a descriptor part names, after checking it. `last_segment` is the caller's
    /// cache of the segment its previous block lay in: a run of blocks from one sender (the
    /// usual case) takes no lock.
    pub(crate) fn materialise(
        &self,
        part: PartRef,
        last_segment: &mut Option<(ObjectRef, Arc<Segment>)>,
    ) -> Result<Message, ShmError> {
        match part {
            PartRef::Inline(bytes) => Ok(bytes.into_message()),
            PartRef::Block {
                segment,
                range,
                header,
            } => {
                let segment = match last_segment {
                    Some((key, mapped)) if *key == segment => Arc::clone(mapped),
                    _ => {
                        let mapped = self.segment(segment)?;
                        *last_segment = Some((segment, Arc::clone(&mapped)));
                        mapped
                    }
                };
                let (buffer, used) = ShmBuffer::adopt_block(segment, range, header)?;
                let mut message = Message::from_buffer(buffer.boxed());
                message
                    .set_used_size(used)
                    .expect("adopt_block checked the size");
                Ok(message)
            }
            PartRef::Region {
                region,
                range,
                hint,
            } => {
                let (segment, acknowledge) = self.region(region)?;
                let Some(bytes) = range.checked(REGION_DATA_START, segment.len()) else {
                    return Err(ShmError::BadDescriptor {
                        reason: format!("{}: range {range} is outside the region", segment.name()),
                    });
                };
                let buffer =
                    ShmBuffer::new_region(segment, bytes.start, bytes.len(), acknowledge, hint);
                Ok(Message::from_buffer(buffer.boxed()))
            }
        }
    }

    /// The descriptor of a message that already lives in this session's shared memory.
    pub(crate) fn describe(&self, message: &Message) -> Option<PartRef> {
        let buffer = message.buffer()?.as_any().downcast_ref::<ShmBuffer>()?;
        self.describe_buffer(buffer, message.len())
    }

    /// [`Session::describe`] of a message's handle the caller has already found, `size` bytes
    /// of it in use.
    pub(crate) fn describe_buffer(&self, buffer: &ShmBuffer, size: usize) -> Option<PartRef> {
        let segment = buffer.segment();
        let name = segment.name();
        // This process's own segment (every message a sender made) is this session's without
        // comparing names: the comparison was 2 % of a streaming sender, twice per message.
        let own = self
            .own
            .get()
            .is_some_and(|own| Arc::ptr_eq(own.segment(), segment));
        if !own && (name.uid != self.uid || name.session != self.encoded_session) {
            return None;
        }
        let size = size as u64;
        let object = ObjectRef::of(name);
        Some(if buffer.is_region() {
            PartRef::Region {
                region: object,
                range: WireRange {
                    offset: (buffer.data_offset() - REGION_DATA_START) as u64,
                    size,
                },
                hint: buffer.hint(),
            }
        } else {
            PartRef::Block {
                segment: object,
                range: WireRange {
                    offset: buffer.data_offset() as u64,
                    size,
                },
                header: buffer.header_at(),
            }
        })
    }

    /// Creates a region of `size` usable bytes.
    pub(crate) async fn create_region(
        &self,
        size: usize,
        callback: RegionCallback,
    ) -> Result<UnmanagedRegion, ShmError> {
        let index = NEXT_REGION_INDEX.fetch_add(1, Ordering::Relaxed);
        let name = self.object_name(ObjectKind::Region, std::process::id(), index);
        let total = REGION_DATA_START + size;
        // The watchdog first, as for the segment (`own_segment`).
        crate::cleanup::ensure_watchdog(self.uid, &self.options.session);
        let segment = tokio::task::spawn_blocking(move || Segment::create(name, total))
            .await
            .map_err(|error| ShmError::Os {
                name: "region".to_owned(),
                operation: "create",
                reason: error.to_string(),
            })??;
        let region = UnmanagedRegion::create(segment, index, callback);
        let mut own = self.own_regions.lock().expect("own regions poisoned");
        own.retain(|lent| lent.strong_count() > 0);
        own.push(region.lent_ranges());
        drop(own);
        Ok(region)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Releases of other processes' region buffers that found their ring full wait in this
        // process (`region::AckProducer`): they go into their rings before it leaves, or its
        // exit would lose them while their creators wait for those ranges.
        let producers: Vec<Arc<AckProducer>> = self
            .regions
            .lock()
            .map(|map| {
                map.values()
                    .map(|region| Arc::clone(&region.producer))
                    .collect()
            })
            .unwrap_or_default();
        let deadline = std::time::Instant::now() + ACK_FLUSH_LIMIT;
        for producer in producers {
            let left = producer.flush(deadline);
            if left > 0 {
                tracing::warn!(
                    region = %producer.region_name(),
                    n_acknowledgements = left,
                    "the region's creator made no room for these acknowledgements within {ACK_FLUSH_LIMIT:?}: they are lost"
                );
            }
        }
        // The last process of a session to leave takes the session's shared memory with it.
        let mut mapped: Vec<Arc<Segment>> = self
            .segments
            .lock()
            .map(|map| map.values().cloned().collect())
            .unwrap_or_default();
        mapped.extend(
            self.regions
                .lock()
                .map(|map| {
                    map.values()
                        .map(|region| Arc::clone(&region.segment))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
        );
        if let Some(owned) = self.own.get() {
            mapped.push(Arc::clone(owned.segment()));
        }
        // This process leaves every object before it looks whether another process still
        // uses one: of two processes that leave at the same instant, the one that looks last
        // sees the other gone and removes the session's memory (looking first, both saw the
        // other and neither removed it). The fence orders this process's leaving before its
        // look, as the other's orders its own.
        for segment in &mapped {
            segment.detach();
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        drop(mapped);
        crate::cleanup::remove_session_if_unused(self.uid, &self.options.session);
    }
}

/// See [`Session::room_wait`].
pub(crate) struct RoomWait<'a> {
    session: &'a Session,
    started: Instant,
    /// The next pause: the retry interval, or from 100 µs doubling up to 10 ms.
    pause: Duration,
}

impl RoomWait<'_> {
    /// Pauses before the next look for room for `size` bytes: `Ok(true)` to look again,
    /// `Ok(false)` once `deadline` (the caller's own timeout) has passed. Cancel-safe.
    ///
    /// # Errors
    /// [`ShmError::SegmentFull`] (naming the segment, its use and `size`) once the allocation
    /// timeout has passed since the wait began.
    pub(crate) async fn pause(
        &mut self,
        size: usize,
        deadline: Option<Instant>,
    ) -> Result<bool, ShmError> {
        let options = &self.session.options;
        let waited = self.started.elapsed();
        if waited >= options.allocation_timeout {
            return Err(match self.session.own.get() {
                Some(owned) => owned.full_error(size, waited.as_millis() as u64),
                None => ShmError::NotFound {
                    name: "this process's own segment (not created yet)".to_owned(),
                },
            });
        }
        let mut wake = Instant::now() + self.pause.min(options.allocation_timeout - waited);
        if let Some(deadline) = deadline {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            wake = wake.min(deadline);
        }
        tokio::time::sleep_until(wake).await;
        if options.retry_interval.is_none() {
            self.pause = (self.pause * 2).min(Duration::from_millis(10));
        }
        self.session.settle_full();
        Ok(true)
    }
}

/// Sets its flag when dropped: tells blocking work that nobody waits for it any more.
struct GiveUpOnDrop(Arc<AtomicBool>);

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::{Session, ShmOptions};
    use crate::ring::tests::Fixture;
    use crate::ring::{EntryKind, Pushed};
    use crate::wire::PartRef;

    fn from(properties: &[(&str, &str)]) -> ferromq_core::Result<ShmOptions> {
        let mut device = ferromq_core::TransportOptions::for_session("s");
        for (key, value) in properties {
            device
                .properties
                .insert((*key).to_owned(), (*value).to_owned());
        }
        ShmOptions::from_device(&device)
    }

    /// Each key the transport says it reads (the keys a built-in device takes for it) is read:
    /// a malformed value under it is refused, naming it.
    #[test]
    fn every_listed_property_is_read() {
        for key in ShmOptions::PROPERTIES {
            let error = from(&[(key, "abc")]).expect_err(key);
            assert!(
                error.to_string().contains(&format!("{key:?}")),
                "{key}: {error}"
            );
        }
    }

    /// A ring in a segment of the test's own (`tag`), its consumer adopted, and `n_messages`
    /// one-part records written and published into it.
    fn ring_with_records(tag: u32, n_messages: u64) -> Fixture {
        let mut fixture = Fixture::new(tag);
        for seq in 0..n_messages {
            let mut entry = Vec::new();
            let part = crate::small::InlineBytes::copy_of(&seq.to_le_bytes());
            crate::wire::append_record(&mut entry, &[PartRef::Inline(part)]);
            assert!(!matches!(
                fixture.producer.push(EntryKind::Record, &entry),
                Pushed::Full
            ));
        }
        let _ = fixture.producer.publish();
        fixture
    }

    /// The hand-over race of a sender's close: it finds its receiver alive and hands over what
    /// was not taken (its close reports it delivered), but the receiver had already finished
    /// with the ring, so it never reads the word. The producer, last at the ring, releases
    /// what is left and must say how many messages the consumer left, those it had taken and
    /// dropped included, for its close to report them lost.
    #[test]
    fn a_producer_finishing_after_its_consumer_says_how_many_it_released() {
        let session = Session::new(from(&[]).unwrap());
        let mut first = ring_with_records(9000, 3);
        let mut entry = Vec::new();
        assert!(first.consumer.peek(&mut entry).unwrap().is_some());
        first.consumer.take_peeked();
        assert_eq!(
            session.finish_consuming(&mut first.consumer, 1),
            None,
            "the consumer, with one message taken and not handed out, finished first"
        );
        first.producer.hand_over();
        let (_, n_lost) = session.finish_producing(&mut first.producer, None);
        assert_eq!(
            n_lost, 3,
            "two left in the ring, one dropped by the consumer"
        );

        // The other order: the consumer, last, reads the word and reports them itself; the
        // producer released nothing.
        let mut last = ring_with_records(9001, 3);
        last.producer.hand_over();
        let (_, n_lost) = session.finish_producing(&mut last.producer, None);
        assert_eq!(n_lost, 0);
        assert_eq!(session.finish_consuming(&mut last.consumer, 0), Some(3));
    }

    #[test]
    fn fairmqs_mlock_and_zero_properties_choose_what_is_locked_and_zeroed() {
        let none = from(&[]).unwrap();
        assert!(!none.mlock_own && !none.mlock_peers && !none.zero_own);
        let every = from(&[("shm-mlock-segment", "true")]).unwrap();
        assert!(every.mlock_own && every.mlock_peers && !every.zero_own);
        let own = from(&[("shm-mlock-segment-on-creation", "1")]).unwrap();
        assert!(own.mlock_own && !own.mlock_peers);
        for key in ["shm-zero-segment", "shm-zero-segment-on-creation"] {
            let zeroed = from(&[(key, "yes")]).unwrap();
            assert!(zeroed.zero_own && !zeroed.mlock_own, "{key}");
        }
        let error = from(&[("shm-zero-segment", "sure")])
            .expect_err("not a flag")
            .to_string();
        assert!(
            error.contains("shm-zero-segment") && error.contains("sure"),
            "{error}"
        );
    }
}
