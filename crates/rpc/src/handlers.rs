//! Procedures, their ids, and the table of handlers a member serves.
//!
//! A [`Procedure`] names a remote function and its types once, for both sides; its id is a
//! 64-bit FNV-1a hash of its name, stable across builds and processes (unlike `TypeId`). A
//! handler is stored type-erased: it decodes its arguments from the frame (postcard) and
//! returns a boxed future whose output is already encoded, or, a synchronous one, encodes its
//! output into a buffer the dispatcher lends it (the same buffer call after call: no allocation
//! per call). Only a result the caller waits for is encoded. A panic in the handler,
//! synchronous or in its future, is caught and becomes [`Status::Panicked`] for the caller.
//! A synchronous handler also runs the short calls of a frame that follow a plain call to it
//! in a loop of its own (`ShortCalls`), where a call that panics or does not decode fails
//! alone and the run goes on.

use rustc_hash::FxHashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use ferromq_core::Message;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::node::Rpc;
use crate::wire::{FrameReader, Status};

/// A remote function: its name (the id is derived from it) and its argument and result types.
///
/// ```
/// use ferromq_rpc::Procedure;
/// struct Add;
/// impl Procedure for Add {
///     const NAME: &'static str = "add";
///     type Args = (u64, u64);
///     type Output = u64;
/// }
/// assert_eq!(Add::id(), ferromq_rpc::HandlerId::named("add"));
/// ```
pub trait Procedure: 'static {
    /// Unique within a group; the id is derived from it unless [`Procedure::id`] is overridden.
    const NAME: &'static str;
    /// The arguments, serialised with postcard.
    type Args: Serialize + DeserializeOwned + Send + 'static;
    /// The result (`()` for calls that return nothing), serialised with postcard.
    type Output: Serialize + DeserializeOwned + Send + 'static;

    /// The id callers put on the wire.
    fn id() -> HandlerId {
        HandlerId::named(Self::NAME)
    }
}

/// Declares procedures, a unit struct and its [`Procedure`] each, one line apiece:
/// `Name = "name": Args => Output;`, with the struct's docs, attributes and visibility before it.
///
/// ```
/// ferromq_rpc::procedures! {
///     /// Adds two numbers.
///     pub Add = "add": (u64, u64) => u64;
///     Ping = "ping": () => ();
/// }
/// use ferromq_rpc::Procedure as _;
/// assert_eq!(Add::id(), ferromq_rpc::HandlerId::named("add"));
/// assert_eq!(Ping::NAME, "ping");
/// ```
#[macro_export]
macro_rules! procedures {
    ($($(#[$meta:meta])* $vis:vis $name:ident = $id:literal: $args:ty => $output:ty;)*) => {$(
        $(#[$meta])*
        $vis struct $name;
        impl $crate::Procedure for $name {
            const NAME: &'static str = $id;
            type Args = $args;
            type Output = $output;
        }
    )*};
}

/// The id of a handler on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerId(pub u64);

impl HandlerId {
    /// The FNV-1a hash of `name`: the same in every build and process.
    pub const fn named(name: &str) -> HandlerId {
        let bytes = name.as_bytes();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut idx = 0;
        while idx < bytes.len() {
            hash ^= bytes[idx] as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            idx += 1;
        }
        HandlerId(hash)
    }
}

impl std::fmt::Display for HandlerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

/// Where a handler runs: who called, and the local node to make calls of its own.
///
/// A handler runs on its member's dispatcher, one at a time in arrival order (that is what
/// keeps calls from one sender in order). It may make calls; it must not wait for the result
/// of a call whose handler calls back into this member, which would wait for itself. Calls
/// made through [`Invocation::rpc`] queue when their destination is full instead of waiting
/// ([`crate::WhenFull::Queue`]), so two members calling each other from handlers cannot
/// deadlock on full queues.
#[derive(Clone)]
pub struct Invocation {
    pub(crate) caller: usize,
    pub(crate) rpc: Rpc,
}

impl Invocation {
    /// The member index of the caller (for a broadcast, of the member that started it).
    pub fn caller(&self) -> usize {
        self.caller
    }

    /// The local node, for calls made by the handler.
    pub fn rpc(&self) -> &Rpc {
        &self.rpc
    }
}

/// What a handler's run produced: the encoded result, or why there is none.
pub(crate) type Outcome = Result<Vec<u8>, (Status, String)>;

/// A handler started: finished already (a synchronous one; its result is encoded in the
/// buffer [`Handlers::start`] was given), or a future to run.
pub(crate) enum Started {
    Done,
    Running(BoxFuture<'static, Outcome>),
}

/// A type-erased handler. The call's buffer is lent (`&mut`: a handler that takes one takes it
/// out) rather than moved in: moved by value through the dispatcher's calls, the 48-byte
/// `Option<Message>` of every plain call was copied 16 bytes at a time right after its `None`
/// was stored 8 bytes wide, a load the core cannot serve from the store and waits on (perf,
/// `ferromq bench rpc --mode trad --call-size 8`: two fifths of the dispatcher's own samples
/// on that one load).
type Erased = dyn Fn(
        &Invocation,
        &[u8],
        &mut Option<Message>,
        Option<&mut Vec<u8>>,
    ) -> Result<Started, (Status, String)>
    + Send
    + Sync;

/// A synchronous handler's run of a frame's short calls to it ([`crate::wire::KIND_CALL_REPEAT`]:
/// plain, fire and forget, no buffer), read from the frame while they last, at most `most` of
/// them: how many it took, and the failure of the last one taken if that one failed (the run
/// stops there). Why: through [`Erased`], each 8-byte call of a stream was a dynamic call, an
/// answer looked at and the dispatcher's bookkeeping, more than half of the destination's time
/// (perf, `ferromq bench rpc --mode trad --call-size 8`); here the handler's own code loops
/// over them, with one `catch_unwind` for the run.
type ShortCalls =
    dyn Fn(&Invocation, &mut FrameReader<'_>, u32) -> (u32, Option<(Status, String)>) + Send + Sync;

struct Entry {
    name: &'static str,
    wants_buffer: bool,
    run: Arc<Erased>,
    /// Only for synchronous handlers without a buffer ([`Handlers::on_sync`]).
    short_calls: Option<Arc<ShortCalls>>,
}

/// The handlers one member serves, by id. Built before the node starts.
#[derive(Default)]
pub struct Handlers {
    entries: FxHashMap<u64, Entry>,
    /// Two procedures whose names hash alike, or one registered twice: reported at start.
    pub(crate) conflicts: Vec<String>,
}

impl Handlers {
    /// An empty table.
    pub fn new() -> Handlers {
        Handlers::default()
    }

    /// Serves `P` with `handler(invocation, args)`.
    #[must_use]
    pub fn on<P, F, Fut>(self, handler: F) -> Handlers
    where
        P: Procedure,
        F: Fn(Invocation, P::Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = P::Output> + Send + 'static,
    {
        let run = move |invocation: &Invocation,
                        payload: &[u8],
                        _buffer: &mut Option<Message>,
                        output: Option<&mut Vec<u8>>| {
            let args = decode_args::<P>(payload)?;
            let future = catch_panic(|| handler(invocation.clone(), args))?;
            Ok(Started::Running(encode_output::<P, _>(
                future,
                output.is_some(),
            )))
        };
        self.insert::<P>(false, Arc::new(run), None)
    }

    /// Serves `P` with a synchronous `handler(invocation, args)`: it runs at once on the
    /// dispatcher, with no future to allocate, which is the fast path for small handlers. It
    /// makes calls of its own with [`Rpc::queue_call`].
    #[must_use]
    pub fn on_sync<P, F>(self, handler: F) -> Handlers
    where
        P: Procedure,
        F: Fn(&Invocation, P::Args) -> P::Output + Send + Sync + 'static,
    {
        let handler = Arc::new(handler);
        let for_short_calls = Arc::clone(&handler);
        let run = move |invocation: &Invocation,
                        payload: &[u8],
                        _buffer: &mut Option<Message>,
                        into: Option<&mut Vec<u8>>| {
            let args = decode_args::<P>(payload)?;
            let output = catch_panic(|| handler(invocation, args))?;
            encode_into::<P>(&output, into)?;
            Ok(Started::Done)
        };
        let short_calls =
            move |invocation: &Invocation, reader: &mut FrameReader<'_>, most: u32| {
                let id = P::id().0;
                let mut taken = 0;
                let run = std::panic::catch_unwind(AssertUnwindSafe(|| -> Result<(), _> {
                    while taken < most {
                        let Some(payload) = reader.next_short_call_to(id) else {
                            break;
                        };
                        taken += 1;
                        // Nobody waits for the result of a short call: it is not encoded.
                        let _ = for_short_calls(invocation, decode_args::<P>(payload)?);
                    }
                    Ok(())
                }));
                let failure = match run {
                    Ok(Ok(())) => None,
                    Ok(Err(failure)) => Some(failure),
                    Err(panic) => Some((Status::Panicked, panic_message(panic.as_ref()))),
                };
                (taken, failure)
            };
        self.insert::<P>(false, Arc::new(run), Some(Arc::new(short_calls)))
    }

    /// As [`Handlers::on_sync`], for calls with a buffer.
    #[must_use]
    pub fn on_buffer_sync<P, F>(self, handler: F) -> Handlers
    where
        P: Procedure,
        F: Fn(&Invocation, P::Args, Message) -> P::Output + Send + Sync + 'static,
    {
        let run = move |invocation: &Invocation,
                        payload: &[u8],
                        buffer: &mut Option<Message>,
                        into: Option<&mut Vec<u8>>| {
            let buffer = buffer.take().ok_or_else(|| no_buffer::<P>())?;
            let args = decode_args::<P>(payload)?;
            let output = catch_panic(|| handler(invocation, args, buffer))?;
            encode_into::<P>(&output, into)?;
            Ok(Started::Done)
        };
        self.insert::<P>(true, Arc::new(run), None)
    }

    /// Serves `P` with `handler(invocation, args, buffer)`: the handler runs once the buffer is
    /// here in full. (A call of `P` without a buffer is refused as [`Status::BadFrame`].)
    #[must_use]
    pub fn on_buffer<P, F, Fut>(self, handler: F) -> Handlers
    where
        P: Procedure,
        F: Fn(Invocation, P::Args, Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = P::Output> + Send + 'static,
    {
        let run = move |invocation: &Invocation,
                        payload: &[u8],
                        buffer: &mut Option<Message>,
                        output: Option<&mut Vec<u8>>| {
            let buffer = buffer.take().ok_or_else(|| no_buffer::<P>())?;
            let args = decode_args::<P>(payload)?;
            let future = catch_panic(|| handler(invocation.clone(), args, buffer))?;
            Ok(Started::Running(encode_output::<P, _>(
                future,
                output.is_some(),
            )))
        };
        self.insert::<P>(true, Arc::new(run), None)
    }

    fn insert<P: Procedure>(
        mut self,
        wants_buffer: bool,
        run: Arc<Erased>,
        short_calls: Option<Arc<ShortCalls>>,
    ) -> Handlers {
        let id = P::id().0;
        if let Some(known) = self.entries.get(&id) {
            self.conflicts.push(format!(
                "{} and {} have the same handler id {}",
                known.name,
                P::NAME,
                P::id()
            ));
            return self;
        }
        self.entries.insert(
            id,
            Entry {
                name: P::NAME,
                wants_buffer,
                run,
                short_calls,
            },
        );
        self
    }

    /// The name of the handler with `id`, if there is one.
    pub(crate) fn name(&self, id: u64) -> Option<&'static str> {
        self.entries.get(&id).map(|entry| entry.name)
    }

    /// Starts the handler `id` on `payload`: a synchronous one runs and leaves its encoded
    /// result in `output` (replacing what it held); otherwise the future runs it to its outcome.
    /// Without `output` (the caller waits for no result) the result is not encoded: the handler
    /// still runs, and its outcome is an empty result.
    pub(crate) fn start(
        &self,
        id: u64,
        invocation: &Invocation,
        payload: &[u8],
        buffer: &mut Option<Message>,
        output: Option<&mut Vec<u8>>,
    ) -> Result<Started, (Status, String)> {
        self.resolve(id)?.start(invocation, payload, buffer, output)
    }

    /// The handler with `id`, to start calls of it ([`Resolved::start`]); the error a call
    /// of an unknown id ends with.
    pub(crate) fn resolve(&self, id: u64) -> Result<Resolved<'_>, (Status, String)> {
        match self.entries.get(&id) {
            Some(entry) => Ok(Resolved { id, entry }),
            None => Err((
                Status::UnknownHandler,
                format!("no handler with id {}", HandlerId(id)),
            )),
        }
    }
}

/// A handler looked up by id. The dispatcher keeps the one of a frame's last plain call for
/// the calls after it to the same handler: looked up per call, the table's probe was two
/// fifths of the dispatcher's time for 8-byte calls (perf, `ferromq bench rpc --mode trad`
/// through a `CallWriter`).
#[derive(Clone, Copy)]
pub(crate) struct Resolved<'a> {
    id: u64,
    entry: &'a Entry,
}

impl Resolved<'_> {
    /// The id it was looked up by.
    pub(crate) fn id(self) -> u64 {
        self.id
    }

    /// As [`Handlers::start`], for this handler.
    pub(crate) fn start(
        self,
        invocation: &Invocation,
        payload: &[u8],
        buffer: &mut Option<Message>,
        output: Option<&mut Vec<u8>>,
    ) -> Result<Started, (Status, String)> {
        let entry = self.entry;
        if !entry.wants_buffer && buffer.is_some() {
            tracing::debug!(
                handler = entry.name,
                "a buffer came with a call that takes none; dropped"
            );
        }
        (entry.run)(invocation, payload, buffer, output)
    }

    /// Runs the short calls to this handler that come next in `reader`, at most `most`: how
    /// many ran (the failure of the last if it failed, see [`ShortCalls`]); `None` for a
    /// handler that takes them one by one ([`Resolved::start`]).
    #[inline]
    pub(crate) fn run_short_calls(
        self,
        invocation: &Invocation,
        reader: &mut FrameReader<'_>,
        most: u32,
    ) -> Option<(u32, Option<(Status, String)>)> {
        let short_calls = self.entry.short_calls.as_deref()?;
        Some(short_calls(invocation, reader, most))
    }
}

fn no_buffer<P: Procedure>() -> (Status, String) {
    (
        Status::BadFrame,
        format!("{} takes a buffer and the call carried none", P::NAME),
    )
}

fn encode<P: Procedure>(output: &P::Output) -> Outcome {
    postcard::to_allocvec(output).map_err(unencodable)
}

/// Encodes `output` into `into`, replacing what it held and keeping its memory: postcard's own
/// vector starts empty and grows (a 64-byte result took a `malloc` and three `realloc`s).
/// Without `into` (nobody waits for the result) nothing is encoded.
fn encode_into<P: Procedure>(
    output: &P::Output,
    into: Option<&mut Vec<u8>>,
) -> Result<(), (Status, String)> {
    let Some(into) = into else {
        return Ok(());
    };
    let mut reused = std::mem::take(into);
    reused.clear();
    *into = postcard::to_extend(output, reused).map_err(unencodable)?;
    Ok(())
}

fn unencodable(error: postcard::Error) -> (Status, String) {
    (
        Status::Panicked,
        format!("its result could not be serialised: {error}"),
    )
}

fn decode_args<P: Procedure>(payload: &[u8]) -> Result<P::Args, (Status, String)> {
    postcard::from_bytes::<P::Args>(payload).map_err(|error| {
        (
            Status::BadArguments,
            format!(
                "{} bytes are no {}: {error}",
                payload.len(),
                std::any::type_name::<P::Args>()
            ),
        )
    })
}

fn catch_panic<T>(run: impl FnOnce() -> T) -> Result<T, (Status, String)> {
    std::panic::catch_unwind(AssertUnwindSafe(run))
        .map_err(|panic| (Status::Panicked, panic_message(panic.as_ref())))
}

/// `future` run to its outcome: its output encoded when `wanted`, an empty result otherwise.
fn encode_output<P, Fut>(future: Fut, wanted: bool) -> BoxFuture<'static, Outcome>
where
    P: Procedure,
    Fut: Future<Output = P::Output> + Send + 'static,
{
    async move {
        let output = AssertUnwindSafe(future)
            .catch_unwind()
            .await
            .map_err(|panic| (Status::Panicked, panic_message(panic.as_ref())))?;
        if wanted {
            encode::<P>(&output)
        } else {
            Ok(Vec::new())
        }
    }
    .boxed()
}

/// The text a panic was raised with.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
