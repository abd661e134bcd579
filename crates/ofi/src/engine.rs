//! The engine: one thread per endpoint that posts operations and reads their completions, so
//! that no tokio worker ever blocks in libfabric.
//!
//! Async code hands the engine a whole job (send one message part, or receive one into a
//! buffer) with the [`Message`] that owns the memory; the engine splits it into chunks of at
//! most the provider's maximum message size, posts them, and hands the message back through a
//! channel of the socket's driver when every chunk completed. Because the engine owns the memory while the provider may
//! touch it, no buffer can be freed under an operation in flight: on shutdown the engine cancels
//! what is left and closes the endpoint before it drops the jobs.
//!
//! The thread sleeps in `fi_cq_sread` when idle; a new command wakes it with `fi_cq_signal`.
//!
//! # Registration cache
//! Shared-memory messages are sent from, and received into, their segment; each segment (or
//! unmanaged region) is registered with the domain once, on first use, and stays registered
//! until the engine stops. The cache holds the segment's mapping alive for that long. A message
//! says which mapping holds it through core's `RegistrableMemory`; only an owner of a type known
//! to keep its mapping in place (shm's `Segment`, with the range described) is registered whole,
//! anything else is treated as heap memory. Heap
//! messages need no registration on providers without FI_MR_LOCAL (tcp); on those with it
//! (verbs) each heap buffer is registered for the duration of its job.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferromq_core::Message;
use ferromq_ofi_sys as sys;
use ferromq_shm::segment::Segment;
use tokio::sync::mpsc as async_mpsc;

use crate::fabric::{
    CompletionEntry, Direction, Endpoint, FabricError, MemoryRegion, Polled, Posted,
};

/// Where a message's bytes live, for the registration cache.
pub(crate) enum Memory {
    /// Process heap: registered per job only where the provider demands it.
    Heap,
    /// A shared-memory segment or region: registered once, whole.
    Segment(Arc<Segment>),
}

impl Memory {
    /// The memory of `message`, from what its buffer says holds it: a segment when the owner
    /// is a shmem segment (a type whose mapping stays put while it lives) whose range is the one
    /// described; anything else is registered like heap memory, per transfer.
    pub(crate) fn of(message: &Message) -> Memory {
        let Some(memory) = message.registrable_memory() else {
            return Memory::Heap;
        };
        match memory.owner.downcast::<Segment>() {
            Ok(segment) if segment.mapping_range() == (memory.base as *const u8, memory.len) => {
                Memory::Segment(segment)
            }
            _ => Memory::Heap,
        }
    }
}

/// The result of a job: the message back (receives) or just success (sends).
pub(crate) type JobResult = Result<Message, FabricError>;

/// Which job finished: the driver's peer epoch, the message and the part.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobKey {
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
    pub(crate) part: usize,
    /// A send (a pair sends and receives the same seq numbers).
    pub(crate) is_send: bool,
}

/// A finished job, as the driver receives it.
pub(crate) struct Finished {
    pub(crate) key: JobKey,
    pub(crate) result: JobResult,
}

/// Where a finished job goes: straight to the driver's queue (no task, no oneshot per job).
pub(crate) struct Done {
    pub(crate) to: async_mpsc::UnboundedSender<Finished>,
    pub(crate) key: JobKey,
}

impl Done {
    fn send(self, result: JobResult) {
        let _ = self.to.send(Finished {
            key: self.key,
            result,
        });
    }
}

/// What the async side asks of the engine.
pub(crate) enum Command {
    /// Send `message` to `peer`, chunk `i` with tag `tag_base | i`.
    Send {
        peer: u64,
        tag_base: u64,
        message: Message,
        memory: Memory,
        done: Done,
    },
    /// Receive into `message` from `peer`, chunk `i` with tag `tag_base | i`.
    Receive {
        peer: u64,
        tag_base: u64,
        message: Message,
        memory: Memory,
        done: Done,
    },
    /// Cancel every job of `peer` and forget it (it died or left).
    ForgetPeer { peer: u64 },
}

/// One posted operation's context; libfabric may use the `fi_context2` as scratch space
/// (FI_CONTEXT mode), so it comes first and lives on the heap until the completion is read.
#[repr(C)]
struct OperationContext {
    scratch: sys::fi_context2,
    job: u64,
    expected_len: usize,
    is_send: bool,
}

struct Job {
    peer: u64,
    message: Message,
    /// Contexts of this job's chunks not yet completed.
    outstanding: Vec<usize>,
    /// Chunks not yet posted (the provider said "again").
    unposted: VecDeque<Chunk>,
    error: Option<FabricError>,
    done: Option<Done>,
    /// A per-job registration (heap memory on FI_MR_LOCAL providers).
    _registration: Option<MemoryRegion>,
}

#[derive(Clone, Copy)]
struct Chunk {
    is_send: bool,
    offset: usize,
    len: usize,
    tag: u64,
    desc: usize,
}

/// Counters of an engine, for tests and logs.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Segments or regions registered (the cache's misses).
    pub registrations: AtomicU64,
    /// Bytes those registrations cover.
    pub registered_bytes: AtomicU64,
    /// Bytes sent.
    pub bytes_sent: AtomicU64,
    /// Bytes received.
    pub bytes_received: AtomicU64,
}

/// The async side's handle: submits commands and wakes the thread.
///
/// Dropping it stops the thread and waits for it: libfabric's own teardown at process exit must
/// never run while the thread is still inside the provider (that crashed a device once, in a
/// completion-queue read during exit).
pub(crate) struct EngineHandle {
    /// `None` once dropping: disconnecting the channel tells the thread to stop.
    commands: Option<mpsc::Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
    endpoint: Arc<Endpoint>,
    /// Set while the thread is (about to be) blocked in the completion queue's wait.
    asleep: Arc<AtomicBool>,
    /// The thread's counters (shared with the socket's).
    stats: Arc<EngineStats>,
    /// The endpoint's own address (for the peer).
    pub(crate) address: Arc<[u8]>,
}

impl EngineHandle {
    /// Opens an endpoint and starts its thread.
    pub(crate) fn start(
        provider: &str,
        node: Option<&str>,
        max_chunk: usize,
        name: &str,
        stats: Arc<EngineStats>,
    ) -> Result<EngineHandle, FabricError> {
        let endpoint = Arc::new(Endpoint::open(provider, node)?);
        let address: Arc<[u8]> = endpoint.name()?.into();
        tracing::debug!(
            provider = %endpoint.provider,
            address = %endpoint.address_text(&address),
            max_msg_size = endpoint.max_msg_size,
            mr_local = endpoint.mr_local,
            "ofi endpoint open"
        );
        let chunk_size = max_chunk.min(endpoint.max_msg_size).max(4096);
        let (commands, receiver) = mpsc::channel();
        let asleep = Arc::new(AtomicBool::new(false));
        let engine = Engine {
            endpoint: Arc::clone(&endpoint),
            commands: receiver,
            jobs: HashMap::new(),
            next_job: 0,
            registrations: HashMap::new(),
            retry: VecDeque::new(),
            chunk_size,
            asleep: Arc::clone(&asleep),
            stats: Arc::clone(&stats),
        };
        let thread = std::thread::Builder::new()
            .name(format!("ofi-cq {name}"))
            .spawn(move || engine.run())
            .map_err(|error| FabricError {
                call: "thread spawn",
                code: error.raw_os_error().unwrap_or(0),
                text: error.to_string(),
            })?;
        Ok(EngineHandle {
            commands: Some(commands),
            thread: Some(thread),
            endpoint,
            asleep,
            stats,
            address,
        })
    }

    /// Hands a command to the thread and wakes it.
    pub(crate) fn submit(&self, command: Command) {
        let Some(commands) = &self.commands else {
            return;
        };
        if commands.send(command).is_ok() {
            // Wake the thread only if it sleeps (a signal is a syscall on both sides). Pairs
            // with the fence in Engine::run: either it sees this command, or we see it asleep.
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.asleep.load(Ordering::SeqCst) {
                self.endpoint.signal();
            }
        }
    }

    /// Adds a peer to the address vector.
    pub(crate) fn insert_peer(&self, address: &[u8]) -> Result<u64, FabricError> {
        self.endpoint.insert_peer(address)
    }

    /// A printable form of an address.
    pub(crate) fn address_text(&self, address: &[u8]) -> String {
        self.endpoint.address_text(address)
    }

    /// The provider in use.
    pub(crate) fn provider(&self) -> &str {
        &self.endpoint.provider
    }

    /// Bytes sent so far, counted per completed chunk (at most `ofi-max-chunk-size`): a message
    /// of many chunks shows its progress before it completes.
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.stats.bytes_sent.load(Ordering::Relaxed)
    }

    /// Bytes received so far, counted per completed chunk as [`EngineHandle::bytes_sent`].
    pub(crate) fn bytes_received(&self) -> u64 {
        self.stats.bytes_received.load(Ordering::Relaxed)
    }
}

impl Drop for EngineHandle {
    /// Stops the thread (it cancels what is in flight, at most 2 s) and joins it. Blocking: the
    /// socket's driver drops its handle on a blocking thread; only a socket dropped without
    /// `close` does it where it stands.
    fn drop(&mut self) {
        self.commands = None;
        self.endpoint.signal();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Engine {
    endpoint: Arc<Endpoint>,
    commands: mpsc::Receiver<Command>,
    jobs: HashMap<u64, Job>,
    next_job: u64,
    /// The registration cache: segment name to (mapping kept alive, registration).
    /// Keyed by where the segment is mapped in this process: unique while the entry keeps the
    /// mapping alive, correct even if one segment were mapped twice, and no string per message.
    registrations: HashMap<usize, (Arc<Segment>, MemoryRegion)>,
    /// Jobs with chunks the provider refused for now.
    retry: VecDeque<u64>,
    chunk_size: usize,
    stats: Arc<EngineStats>,
    asleep: Arc<AtomicBool>,
}

impl Engine {
    fn run(mut self) {
        let mut entries = vec![CompletionEntry::default(); 64];
        let mut closing_since: Option<Instant> = None;
        loop {
            loop {
                match self.commands.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if closing_since.is_none() {
                            closing_since = Some(Instant::now());
                            for job in self.jobs.values() {
                                for &context in &job.outstanding {
                                    self.endpoint.cancel(context);
                                }
                            }
                        }
                        break;
                    }
                }
            }
            self.post_retries();
            let progressed = match self.endpoint.poll(&mut entries) {
                Ok(polled) => self.complete(polled, &entries),
                Err(error) => {
                    // The provider reports events of peers already removed this way (rxm:
                    // ENOENT); the queue itself goes on working.
                    tracing::debug!(%error, "ofi completion queue read failed");
                    false
                }
            };
            if let Some(since) = closing_since {
                self.jobs.retain(|_, job| !job.outstanding.is_empty());
                if self.jobs.is_empty() || since.elapsed() > Duration::from_secs(2) {
                    break;
                }
            }
            if progressed || !self.retry.is_empty() {
                continue;
            }
            // Announce the sleep, then look once more: a command submitted meanwhile either
            // is seen here or sees `asleep` and signals the wait (see EngineHandle::submit).
            self.asleep.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            match self.commands.try_recv() {
                Ok(command) => {
                    self.asleep.store(false, Ordering::SeqCst);
                    self.handle(command);
                    continue;
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.asleep.store(false, Ordering::SeqCst);
                    // Handled at the top of the loop.
                    if closing_since.is_none() {
                        continue;
                    }
                }
            }
            let timeout = if closing_since.is_some() { 10 } else { 100 };
            let waited = self.endpoint.wait(&mut entries, timeout);
            self.asleep.store(false, Ordering::SeqCst);
            match waited {
                Ok(polled) => {
                    self.complete(polled, &entries);
                }
                Err(error) => {
                    tracing::debug!(%error, "ofi completion queue wait failed");
                    std::thread::yield_now();
                }
            }
        }
        // Close the endpoint (no operation can touch memory after this) before the jobs and
        // registrations that own the memory go.
        let jobs = std::mem::take(&mut self.jobs);
        let registrations = std::mem::take(&mut self.registrations);
        let Engine { endpoint, .. } = self;
        drop(registrations);
        drop(endpoint);
        for (_, mut job) in jobs {
            for context in job.outstanding.drain(..) {
                // SAFETY-free cleanup: the contexts were leaked boxes of this engine.
                drop(take_context(context));
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Send {
                peer,
                tag_base,
                message,
                memory,
                done,
            } => self.start_job(true, peer, tag_base, message, memory, done),
            Command::Receive {
                peer,
                tag_base,
                message,
                memory,
                done,
            } => self.start_job(false, peer, tag_base, message, memory, done),
            Command::ForgetPeer { peer } => {
                for job in self.jobs.values_mut().filter(|job| job.peer == peer) {
                    job.unposted.clear();
                    if job.error.is_none() {
                        job.error = Some(FabricError {
                            call: "peer",
                            code: sys::FI_ECANCELED as i32,
                            text: "the peer is gone".to_owned(),
                        });
                    }
                    for &context in &job.outstanding {
                        self.endpoint.cancel(context);
                    }
                }
                let finished: Vec<u64> = self
                    .jobs
                    .iter()
                    .filter(|(_, job)| job.peer == peer && job.outstanding.is_empty())
                    .map(|(&id, _)| id)
                    .collect();
                for id in finished {
                    self.finish(id);
                }
                self.endpoint.remove_peer(peer);
            }
        }
    }

    /// The local descriptor for `memory`, registering it on first use.
    fn descriptor(
        &mut self,
        memory: Memory,
        message: &Message,
    ) -> Result<(usize, Option<MemoryRegion>), FabricError> {
        match memory {
            Memory::Segment(segment) => {
                // The whole mapping, header included: every block and region range lies in it.
                let (base, len) = segment.mapping_range();
                let key = base as usize;
                // A buffer outside the memory registered for it would make the card read or
                // write other memory (verbs trusts the registration): refuse rather than send.
                let start = message.data().as_ptr() as usize;
                if start < key || start + message.len() > key + len {
                    return Err(FabricError {
                        call: "fi_mr_reg",
                        code: sys::FI_EINVAL as i32,
                        text: format!(
                            "a buffer of {} bytes is not inside its segment {} ({len} bytes registered)",
                            message.len(),
                            segment.name()
                        ),
                    });
                }
                if let Some((_, region)) = self.registrations.get(&key) {
                    return Ok((region.desc() as usize, None));
                }
                // SAFETY: the cache keeps `segment` (and so its mapping) alive as long as the
                // registration.
                let region = unsafe { self.endpoint.register(base, len)? };
                self.stats.registrations.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .registered_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
                tracing::debug!(segment = %segment.name(), bytes = len, "ofi registered a segment");
                let desc = region.desc() as usize;
                self.registrations.insert(key, (segment, region));
                Ok((desc, None))
            }
            Memory::Heap if self.endpoint.mr_local && !message.is_empty() => {
                // SAFETY: the job owns the message, and drops this registration with it.
                let region = unsafe {
                    self.endpoint
                        .register(message.data().as_ptr(), message.len())?
                };
                Ok((region.desc() as usize, Some(region)))
            }
            Memory::Heap => Ok((0, None)),
        }
    }

    fn start_job(
        &mut self,
        is_send: bool,
        peer: u64,
        tag_base: u64,
        mut message: Message,
        memory: Memory,
        done: Done,
    ) {
        if !is_send {
            // Make the buffer writable now (a no-op for fresh buffers), so that the pointer
            // handed to the provider is the one the message keeps.
            let _ = message.data_mut();
        }
        let (desc, registration) = match self.descriptor(memory, &message) {
            Ok(found) => found,
            Err(error) => {
                done.send(Err(error));
                return;
            }
        };
        let len = message.len();
        let id = self.next_job;
        self.next_job += 1;
        let unposted = (0..len.div_ceil(self.chunk_size))
            .map(|i| Chunk {
                is_send,
                offset: i * self.chunk_size,
                len: self.chunk_size.min(len - i * self.chunk_size),
                tag: tag_base | i as u64,
                desc,
            })
            .collect();
        self.jobs.insert(
            id,
            Job {
                peer,
                message,
                outstanding: Vec::new(),
                unposted,
                error: None,
                done: Some(done),
                _registration: registration,
            },
        );
        self.post(id);
    }

    /// Posts the job's unposted chunks until the provider says "again".
    fn post(&mut self, id: u64) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        while let Some(chunk) = job.unposted.front().copied() {
            let context = Box::into_raw(Box::new(OperationContext {
                scratch: sys::fi_context2::default(),
                job: id,
                expected_len: chunk.len,
                is_send: chunk.is_send,
            }));
            let range = chunk.offset..chunk.offset + chunk.len;
            let (direction, buffer) = if chunk.is_send {
                // The provider only reads a send buffer.
                let data: *const [u8] = &job.message.data()[range];
                (Direction::Send, data.cast_mut())
            } else {
                // The message was made writable in start_job, so data_mut() does not copy.
                let data: *mut [u8] = &mut job.message.data_mut()[range];
                (Direction::Receive, data)
            };
            // SAFETY: the job owns the message until every chunk's completion is read, and
            // nobody reads or writes it meanwhile; the context box lives as long.
            let result = unsafe {
                self.endpoint.post(
                    direction,
                    buffer,
                    chunk.desc as *mut c_void,
                    job.peer,
                    chunk.tag,
                    context.cast(),
                )
            };
            match result {
                Ok(Posted::Accepted) => {
                    job.outstanding.push(context as usize);
                    job.unposted.pop_front();
                }
                Ok(Posted::Again) => {
                    drop(take_context(context as usize));
                    self.retry.push_back(id);
                    return;
                }
                Err(error) => {
                    drop(take_context(context as usize));
                    job.unposted.clear();
                    job.error.get_or_insert(error);
                    break;
                }
            }
        }
        if job.outstanding.is_empty() && job.unposted.is_empty() {
            self.finish(id);
        }
    }

    fn post_retries(&mut self) {
        for _ in 0..self.retry.len() {
            let Some(id) = self.retry.pop_front() else {
                break;
            };
            self.post(id);
            if self.retry.back().is_some_and(|&again| again == id) {
                // Still refused: leave the rest for after the next poll.
                break;
            }
        }
    }

    /// Handles what a poll found; returns whether anything completed.
    fn complete(&mut self, polled: Polled, entries: &[CompletionEntry]) -> bool {
        match polled {
            Polled::Nothing => false,
            Polled::Completed(n) => {
                for entry in &entries[..n] {
                    self.chunk_done(entry.op_context as usize, Ok(entry.len));
                }
                true
            }
            Polled::Failed(failed) => {
                self.chunk_done(failed.context, Err(failed.error));
                true
            }
        }
    }

    fn chunk_done(&mut self, context: usize, outcome: Result<usize, FabricError>) {
        if context == 0 {
            return;
        }
        let operation = take_context(context);
        let Some(job) = self.jobs.get_mut(&operation.job) else {
            return;
        };
        job.outstanding.retain(|&c| c != context);
        match outcome {
            Ok(len) => {
                let counter = if operation.is_send {
                    &self.stats.bytes_sent
                } else {
                    &self.stats.bytes_received
                };
                // Send completions carry no length; a receive's must be what was announced.
                let len = if operation.is_send {
                    operation.expected_len
                } else {
                    len
                };
                counter.fetch_add(len as u64, Ordering::Relaxed);
                if len != operation.expected_len && job.error.is_none() {
                    job.error = Some(FabricError {
                        call: "completion",
                        code: 5,
                        text: format!(
                            "a chunk of {len} bytes arrived where {} were announced",
                            operation.expected_len
                        ),
                    });
                }
            }
            Err(error) => {
                job.error.get_or_insert(error);
            }
        }
        if job.outstanding.is_empty() && (job.unposted.is_empty() || job.error.is_some()) {
            self.finish(operation.job);
        }
    }

    fn finish(&mut self, id: u64) {
        let Some(mut job) = self.jobs.remove(&id) else {
            return;
        };
        if let Some(done) = job.done.take() {
            done.send(match job.error {
                Some(error) => Err(error),
                None => Ok(job.message),
            });
        }
    }
}

fn take_context(context: usize) -> Box<OperationContext> {
    // SAFETY: every context handed to libfabric is a Box<OperationContext> leaked in `post`,
    // and each is taken back exactly once (on its completion, on a refused post, or at exit).
    unsafe { Box::from_raw(context as *mut OperationContext) }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::sync::Arc;

    use ferromq_core::{Message, MessageBuffer, RegistrableMemory};

    use super::Memory;

    /// A buffer that says a mapping holds it whose owner ofi has no reason to trust.
    struct Claiming(Vec<u8>);

    impl MessageBuffer for Claiming {
        fn as_bytes(&self) -> &[u8] {
            &self.0
        }
        fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
            Some(&mut self.0)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
            self
        }
        fn transport_name(&self) -> &'static str {
            "claiming"
        }
        fn registrable_memory(&self) -> Option<RegistrableMemory> {
            Some(RegistrableMemory {
                base: self.0.as_ptr() as usize,
                len: self.0.len(),
                owner: Arc::new(String::from("not a segment")),
            })
        }
    }

    #[test]
    fn memory_whose_owner_is_not_a_segment_is_registered_like_heap_memory() {
        let message = Message::from_buffer(Box::new(Claiming(vec![7; 4096])));
        assert!(message.registrable_memory().is_some());
        assert!(matches!(Memory::of(&message), Memory::Heap));
        assert!(matches!(Memory::of(&Message::new(64)), Memory::Heap));
    }
}
