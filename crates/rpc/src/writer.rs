//! [`CallWriter`]: one caller's calls to one destination, written into a frame of its own.
//!
//! Why: [`Rpc::call`] writes every call into the destination's shared open frame under the
//! outlet's lock, because any task of the member may call at any time. For a caller that
//! streams small calls, that lock and the checks around it are most of a call's cost (perf,
//! `ferromq bench rpc --mode trad --call-size 8`: the caller at a whole core, the destination
//! idling a quarter of its time). Seriema gives each thread an aggregation buffer of its own
//! for that reason. A `CallWriter` is that buffer: `&mut self` makes it one caller's, so its
//! calls are written without a lock or an atomic read-modify-write, and the outlet's lock is
//! taken once per frame, to hand the whole frame over.
//!
//! # Ownership
//! In `trad`, calls go into the writer's frame (lent shared memory on shmem, as the outlet's
//! own frames: serialised where the destination reads them) until it hands the frame to the
//! outlet: when the frame holds `aggregate-bytes`, when a call finds `aggregate-us` passed
//! since the frame's first call, on [`CallWriter::flush`], and on drop. `aggregate-us` is
//! looked at only when a call is made (the clock read about every quarter of `aggregate-us`
//! at the pace of the calls so far, at most every [`LOOK_EVERY_MAX`] calls): a writer that
//! stops calling, or slows down after a fast run, holds what it wrote past `aggregate-us`
//! until one of the others. Flush it, or drop it, when a pause begins; a caller that waits for
//! something its held calls lead to waits for ever. In `ovfl`, which sends as soon as the
//! destination is free to take a call and packs the calls that come while it is not, a writer
//! holds calls only while the outlet has calls queued or not yet handed to the transport
//! (looked at per call, one relaxed load): a call that finds it idle hands over what the
//! writer held with itself last, or, when the writer holds nothing, is sent as [`Rpc::call`]
//! sends it; held calls leave as in `trad` otherwise. In `none` a writer's call is
//! [`Rpc::call`].
//!
//! Order: a writer's calls run at the destination in the order they were written. It is a
//! sender of its own: calls made meanwhile through the [`Rpc`] (or another writer) to the same
//! destination may run before the ones it still holds, as calls of two threads do in Seriema.
//!
//! # Backpressure
//! A writer starts a frame only while the outlet holds fewer than `max-queued-calls`, and
//! hands a full frame over only then too; with [`crate::WhenFull::Wait`] it waits for room, at
//! most the timeout, and the call then fails unwritten. So the outlet holds at most one frame
//! (`aggregate-bytes` of calls) more per live writer, and a writer's own frame is bounded by
//! `aggregate-bytes` (a first call larger than that still goes in). With
//! [`crate::WhenFull::Queue`] frames are handed over unbounded.
//!
//! # Disconnection
//! A channel that failed makes the next call fail with [`CallError::Unreachable`]; the calls
//! the writer held are reported lost, in the log and as one [`CallError::Lost`] with their
//! number in [`Rpc::take_failures`], as calls the outlet had queued are when its channel fails.
//!
//! # Shutdown
//! A shutdown closes the outlets, which then refuse a writer's frame: calls a writer still
//! holds at that moment make [`Rpc::shutdown`] fail with how many, and are reported lost again
//! when the writer is dropped. [`Rpc::flush`] does not reach into writers. Dropping a writer
//! hands its frame over at once, unbounded.
//!
//! # Copies and allocation
//! A frame is one block of the transport's memory per `aggregate-bytes` of calls (the heap
//! for a member's own outlet and for transports that lend none). A short call after a call to
//! the same handler is put together on the stack (a stage of 64 or 320 bytes, by the size of
//! the arguments' type) and stored into the frame in one copy; longer ones are serialised in
//! place. Nothing is allocated per call.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::CallError;
use crate::handlers::Procedure;
use crate::node::{AtOnce, Rpc, WhenFull};
use crate::outlet::{Aggregation, Outlet, OwnFrame, Rejection};

/// The most calls written between two looks at the clock for `aggregate-us`. A clock read
/// costs what five 8-byte calls cost here (perf, `ferromq bench rpc --mode trad`: every 64
/// calls it was 3 % of the caller's time); 1024 such calls take ~30 µs, and the pace keeps the
/// looks a quarter of `aggregate-us` apart below that.
const LOOK_EVERY_MAX: u32 = 1024;

/// Calls to one destination written by one caller into a frame of its own (see the module
/// docs); made by [`Rpc::writer`].
///
/// ```no_run
/// # async fn example(rpc: ferromq_rpc::Rpc) -> Result<(), ferromq_rpc::CallError> {
/// # struct Add;
/// # impl ferromq_rpc::Procedure for Add {
/// #     const NAME: &'static str = "add";
/// #     type Args = (u64, u64);
/// #     type Output = u64;
/// # }
/// let mut to_one = rpc.writer(1)?;
/// for n in 0..1_000_000u64 {
///     to_one.call::<Add>(&(n, 1)).await?;
/// }
/// to_one.flush().await?;
/// # Ok(()) }
/// ```
pub struct CallWriter<'a> {
    rpc: &'a Rpc,
    dest: usize,
    outlet: &'a Outlet,
    /// When calls are held here, as the destination's aggregation says.
    holds: Holds,
    frame: Option<OwnFrame>,
    /// How many calls `frame` holds, for `Rpc::stats` and a shutdown to count (the outlet
    /// keeps a weak reference; only this writer stores to it).
    held_here: Arc<AtomicU32>,
    /// Calls between two looks at the clock, set from the calls' pace so that a look comes
    /// about every quarter of `aggregate-us`. It at most doubles per look (as the dispatcher's
    /// looks do), which limits how fast it grows; nothing shortens it before the next look, so
    /// a caller that slows down after a fast run is looked at late (see the module docs).
    look_every: u32,
    until_look: u32,
    looked_at: Option<Instant>,
}

impl<'a> CallWriter<'a> {
    pub(crate) fn new(rpc: &'a Rpc, dest: usize, outlet: &'a Outlet) -> CallWriter<'a> {
        CallWriter {
            rpc,
            dest,
            outlet,
            holds: match outlet.config().aggregation {
                Aggregation::Trad => Holds::Always,
                Aggregation::Ovfl => Holds::WhileBusy,
                Aggregation::None => Holds::Never,
            },
            frame: None,
            held_here: outlet.writer_slot(),
            look_every: 1,
            until_look: 1,
            looked_at: None,
        }
    }

    /// The destination's member index.
    pub fn destination(&self) -> usize {
        self.dest
    }

    /// Calls written and not yet handed to the outlet.
    pub fn held(&self) -> usize {
        self.frame
            .as_ref()
            .map_or(0, |frame| frame.n_records() as usize)
    }

    /// Runs `P` at the destination; fire and forget: returns once the call is written (see
    /// the module docs for when it leaves). The error is boxed, so that a written call's
    /// result is one word: perf of a streaming caller (`ferromq bench rpc --mode trad
    /// --call-size 8`) showed its loop waiting on the copy of a [`CallError`]-sized result
    /// (alternating runs then showed no clear change in calls/s either way).
    ///
    /// # Errors
    /// [`CallError::Timeout`] when the outlet had no room for the frame for the whole timeout;
    /// [`CallError::Unreachable`] or [`CallError::Stopped`] once the channel failed or the
    /// node shut down; [`CallError::Codec`] for arguments that do not serialise. On an error
    /// this call was not written.
    ///
    /// # Cancel safety
    /// Cancelled while it waits for room, the call was not written and the writer keeps what
    /// it held; cancelled once written (it returns at once then), nothing is undone.
    pub async fn call<P: Procedure>(&mut self, args: &P::Args) -> Result<(), Box<CallError>> {
        if self.write_at_once::<P>(args) {
            return Ok(());
        }
        self.call_slowly::<P>(args).await.map_err(Box::new)
    }

    /// The common case of [`CallWriter::call`], without a future: the writer holds calls, the
    /// outlet does not refuse, and the frame has room. False when the call was not written
    /// (an encoding error is met again on the slow path, which reports it).
    #[inline]
    fn write_at_once<P: Procedure>(&mut self, args: &P::Args) -> bool {
        if !self.holding_now() || self.outlet.refusing() {
            return false;
        }
        let Some(frame) = &mut self.frame else {
            return false;
        };
        if frame.append_call(P::id().0, args, self.outlet.me()) != Ok(true) {
            return false;
        }
        self.written();
        true
    }

    /// [`CallWriter::call`] for every case.
    async fn call_slowly<P: Procedure>(&mut self, args: &P::Args) -> Result<(), CallError> {
        // Holding nothing, and not holding now (`none`, or `ovfl` to an idle destination): sent
        // at once.
        if self.frame.is_none() && !self.holding_now() {
            return match self.rpc.call_at_once::<P>(self.dest, args) {
                AtOnce::Taken => Ok(()),
                AtOnce::Refused(error) => Err(*error),
                AtOnce::Wait => self.rpc.to(self.dest).call::<P>(args).await.map(drop),
            };
        }
        if self.outlet.refusing()
            && let Some(refusal) = self.outlet.refusal()
        {
            let error = self.rpc.refused(self.dest, P::NAME, refusal);
            if let Some(frame) = self.frame.take() {
                self.lost(&frame, &error);
            }
            return Err(error);
        }
        let outlet = self.outlet;
        loop {
            if self.frame.is_none() && self.bounded() {
                self.wait_for_room(P::NAME).await?;
            }
            let frame = self.frame.get_or_insert_with(|| outlet.own_frame());
            match frame.append_call(P::id().0, args, outlet.me()) {
                Ok(true) => break,
                Ok(false) => self.hand_over_waiting(P::NAME).await?,
                Err(cause) => {
                    return Err(CallError::Codec {
                        handler: P::NAME.to_owned(),
                        cause: format!("the arguments could not be serialised: {cause}"),
                    });
                }
            }
        }
        self.written();
        // `ovfl`, and the outlet has handed everything it queued to the transport: what the
        // writer held leaves now, with this call last (refused, it stays, as in `written`).
        if !self.holding_now() {
            let _ = self.try_hand_over();
        }
        Ok(())
    }

    /// Whether a call now goes into the writer's frame ([`Holds`]): always in `trad`, in
    /// `ovfl` while the outlet is busy, never in `none`.
    #[inline]
    fn holding_now(&self) -> bool {
        match self.holds {
            Holds::Always => true,
            Holds::WhileBusy => self.outlet.busy(),
            Holds::Never => false,
        }
    }

    /// After a call was written: the frame leaves when full, or when `aggregate-us` passed
    /// since its first call (looked at the calls' pace).
    #[inline]
    fn written(&mut self) {
        let config = self.outlet.config();
        let Some(frame) = &self.frame else {
            return;
        };
        self.held_here.store(frame.n_records(), Ordering::Relaxed);
        let mut leave = frame.is_full();
        if !leave {
            self.until_look -= 1;
            if self.until_look == 0 {
                leave = self.look(frame.since(), config.max_delay);
            }
        }
        if leave {
            // Without waiting: a frame the outlet refuses stays, and the next call (or flush)
            // waits for room, or reports the refusal, before it writes.
            let _ = self.try_hand_over();
        }
    }

    /// Reads the clock: true when `max_delay` passed `since`; sets when to look next from the
    /// calls' pace since the last look.
    #[cold]
    fn look(&mut self, since: Option<Instant>, max_delay: Duration) -> bool {
        let now = Instant::now();
        if let Some(looked_at) = self.looked_at {
            let per_call = now.duration_since(looked_at) / self.look_every;
            let paced = (max_delay / 4)
                .as_nanos()
                .checked_div(per_call.as_nanos())
                .map_or(LOOK_EVERY_MAX, |n| {
                    u32::try_from(n).unwrap_or(LOOK_EVERY_MAX)
                });
            self.look_every = paced.clamp(1, (self.look_every * 2).min(LOOK_EVERY_MAX));
        }
        self.until_look = self.look_every;
        self.looked_at = Some(now);
        since.is_some_and(|since| now.duration_since(since) >= max_delay)
    }

    /// Hands what the writer holds to the outlet (waiting for room as its policy says) and
    /// waits until everything queued for the destination was handed to the transport.
    ///
    /// # Errors
    /// As [`Rpc::flush`], for this destination.
    ///
    /// # Cancel safety
    /// Cancelled while it waits for room, the writer keeps its frame; cancelled after the
    /// hand-over, the frame is the outlet's and leaves as it would have.
    pub async fn flush(&mut self) -> Result<(), CallError> {
        self.hand_over_waiting("flush").await?;
        self.rpc.flush_one(self.dest).await
    }

    fn bounded(&self) -> bool {
        self.rpc.when_full() != WhenFull::Queue
    }

    /// Hands the frame over, waiting for room while the outlet is full (bounded), at most
    /// the timeout. Cancelled, the frame stays with the writer.
    async fn hand_over_waiting(&mut self, handler: &str) -> Result<(), CallError> {
        let mut deadline = None;
        loop {
            match self.try_hand_over() {
                Ok(()) => return Ok(()),
                Err(Rejection::NoRoom { queued, .. }) => {
                    let deadline =
                        *deadline.get_or_insert_with(|| Instant::now() + self.rpc.timeout());
                    if !self.outlet.wait_for_room(deadline).await {
                        return Err(self.rpc.no_room(self.dest, handler, queued));
                    }
                }
                Err(rejection) => {
                    let error = self.rpc.refused(self.dest, handler, rejection);
                    if let Some(frame) = self.frame.take() {
                        self.lost(&frame, &error);
                    }
                    return Err(error);
                }
            }
        }
    }

    /// Hands the frame (if any) to the outlet without waiting, bounded as the policy says;
    /// refused, the frame stays with the writer and the refusal comes back.
    fn try_hand_over(&mut self) -> Result<(), Rejection> {
        let Some(frame) = self.frame.take() else {
            return Ok(());
        };
        match self.outlet.hand_over(frame, self.bounded()) {
            Ok(()) => {
                self.held_here.store(0, Ordering::Relaxed);
                Ok(())
            }
            Err(refused) => {
                let (rejection, frame) = *refused;
                self.frame = Some(frame);
                Err(rejection)
            }
        }
    }

    /// Waits, at most the timeout, until the outlet has room (bounded): a writer starts a
    /// frame only then. Frames are handed over when full or when the writer is dropped, so
    /// without this a writer used for a call or two and dropped, again and again, queued a
    /// frame each time however full the destination was.
    async fn wait_for_room(&self, handler: &str) -> Result<(), CallError> {
        if self
            .outlet
            .wait_for_room(Instant::now() + self.rpc.timeout())
            .await
        {
            return Ok(());
        }
        Err(self.rpc.no_room(self.dest, handler, self.outlet.queued()))
    }

    /// `frame`'s calls will not leave: said in the log, and kept for [`Rpc::take_failures`] as
    /// one [`CallError::Lost`], with their number.
    fn lost(&self, frame: &OwnFrame, error: &CallError) {
        self.held_here.store(0, Ordering::Relaxed);
        tracing::warn!(
            destination = %self.rpc.members()[self.dest],
            lost = frame.n_records(),
            %error,
            "calls written through a CallWriter will not leave"
        );
        let cause = match error {
            CallError::Unreachable { cause, .. } => cause.clone(),
            other => other.to_string(),
        };
        self.rpc
            .keep_lost(self.dest, u64::from(frame.n_records()), cause);
    }
}

/// When a [`CallWriter`] holds calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// `trad`: every call, until a frame is full or `aggregate-us` passed.
    Always,
    /// `ovfl`: while the outlet has calls queued or not yet handed to the transport (the
    /// destination lags), as `ovfl` packs the calls that come meanwhile; a call that finds it
    /// idle leaves at once, last in what the writer held, or as [`Rpc::call`] sends it when
    /// the writer holds nothing.
    WhileBusy,
    /// `none`: never; every call is [`Rpc::call`]'s.
    Never,
}

impl Drop for CallWriter<'_> {
    fn drop(&mut self) {
        if let Some(frame) = self.frame.take()
            && let Err(refused) = self.outlet.hand_over(frame, false)
        {
            let (rejection, frame) = *refused;
            let error = self
                .rpc
                .refused(self.dest, "a CallWriter's calls", rejection);
            self.lost(&frame, &error);
        }
    }
}
