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
//! What it does, by the destination's aggregation mode:
//! - `trad`: calls go into the writer's frame (lent shared memory on shmem, as the outlet's
//!   own frames: serialised where the destination reads them). The frame is handed to the
//!   outlet when it holds `aggregate-bytes`, when a call finds `aggregate-us` passed since the
//!   frame's first call (the clock is read about every quarter of `aggregate-us` at the calls'
//!   pace, at most every [`LOOK_EVERY_MAX`] calls), on [`CallWriter::flush`], and on drop. A
//!   writer that stops calling holds what it wrote until one of these: flush it, or drop it,
//!   when a pause begins.
//! - `none` and `ovfl`: these send a call as soon as the destination is free to take it, which
//!   a frame held by the caller would not; a writer's call is [`Rpc::call`].
//!
//! Order: a writer's calls run at the destination in the order they were written. It is a
//! sender of its own: calls made meanwhile through the [`Rpc`] (or another writer) to the same
//! destination may run before the ones it still holds, as calls of two threads do in Seriema.
//!
//! A full destination: `max-queued-calls` is looked at when a frame is handed over, so up to
//! one frame of calls more may be queued. With [`crate::WhenFull::Wait`] a call that finds the
//! frame full and the outlet full waits for room, at most the timeout; with
//! [`crate::WhenFull::Queue`] frames are handed over unbounded.
//!
//! Cancellation and drop: a `call` or `flush` cancelled while it waits for room has written
//! nothing new and keeps its frame. Dropping a writer hands its frame over at once,
//! unbounded. A channel that failed, or a node shut down, refuses it: its calls are then
//! reported as lost, in [`Rpc::take_failures`] and the log, with their number, as calls the
//! outlet had queued are when its channel fails.

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
    /// The destination aggregates `trad`: calls are held here.
    holds: bool,
    frame: Option<OwnFrame>,
    /// Calls between two looks at the clock, set from the calls' pace so that a look comes
    /// about every quarter of `aggregate-us` (at most doubling per look, as the dispatcher's
    /// looks do, so a slowing caller is looked at again soon).
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
            holds: outlet.config().aggregation == Aggregation::Trad,
            frame: None,
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
    /// --call-size 8`) showed its loop waiting on the copy of a [`CallError`]-sized result.
    ///
    /// # Errors
    /// [`CallError::Timeout`] when the frame was full and the destination had no room for the
    /// whole timeout; [`CallError::Unreachable`] or [`CallError::Stopped`] once the channel
    /// failed or the node shut down; [`CallError::Codec`] for arguments that do not
    /// serialise. On an error this call was not written.
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
        if !self.holds || self.outlet.refusing() {
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
        if !self.holds {
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
        Ok(())
    }

    /// After a call was written: the frame leaves when full, or when `aggregate-us` passed
    /// since its first call (looked at the calls' pace).
    #[inline]
    fn written(&mut self) {
        let outlet = self.outlet;
        let config = outlet.config();
        let Some(frame) = &self.frame else {
            return;
        };
        let mut leave = frame.is_full();
        if !leave {
            self.until_look -= 1;
            if self.until_look == 0 {
                leave = self.look(frame.since(), config.max_delay);
            }
        }
        if leave {
            // Without waiting: a frame the outlet has no room for stays, and the next call
            // (or flush) waits for room before it writes.
            if let Some(frame) = self.frame.take()
                && let Err(refused) = outlet.hand_over(frame, self.bounded())
            {
                self.frame = Some(refused.1);
            }
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
            let Some(frame) = self.frame.take() else {
                return Ok(());
            };
            match self
                .outlet
                .hand_over(frame, self.bounded())
                .map_err(|refused| *refused)
            {
                Ok(()) => return Ok(()),
                Err((Rejection::NoRoom { queued, .. }, frame)) => {
                    self.frame = Some(frame);
                    let timeout = self.rpc.timeout();
                    let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
                    if !self.outlet.wait_for_room(deadline).await {
                        return Err(CallError::Timeout {
                            destination: self.rpc.members()[self.dest].clone(),
                            handler: format!("{handler} (waiting for room: {queued} calls queued)"),
                            after: timeout,
                        });
                    }
                }
                Err((rejection, frame)) => {
                    let error = self.rpc.refused(self.dest, handler, rejection);
                    self.lost(&frame, &error);
                    return Err(error);
                }
            }
        }
    }

    /// `frame`'s calls will not leave: said in the log and kept for [`Rpc::take_failures`].
    fn lost(&self, frame: &OwnFrame, error: &CallError) {
        tracing::warn!(
            destination = %self.rpc.members()[self.dest],
            lost = frame.n_records(),
            %error,
            "calls written through a CallWriter will not leave"
        );
        self.rpc.keep_failure(error.clone());
    }
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
