//! Waking a consumer that has gone to sleep, between two processes: a doorbell frame on a
//! Unix-domain socket (what ferromq's shmem transport does today) or a futex on a shared word.
//! Run alone with `cargo bench -p ferromq-shm --bench doorbell` (10-45 s after the build,
//! with where the processes land); pass variant names to run only those
//! (`cargo bench -p ferromq-shm --bench doorbell -- futex`).
//!
//! # What runs
//! Two processes forked from this one share an anonymous `MAP_SHARED` mapping (made before the
//! forks, so there is no named shm object to leak) and play ping-pong through two mailboxes,
//! one per direction. A mailbox is a ring reduced to its tail (a sequence number) and the
//! consumer's `sleeping` word, used as `ferromq_shm`'s rings use them: the consumer finds
//! nothing, raises the word (SeqCst store, then a SeqCst fence) and looks once more before it
//! sleeps; the producer stores the tail, fences, and wakes the consumer only if it takes a
//! raised word down (load, then swap to 0). A consumer sleeps as soon as it finds its mailbox
//! empty (no spinning first).
//!
//! - `doorbell-frame`: each side is a task on a tokio current-thread runtime; it sleeps in a
//!   read on a `tokio::net::UnixStream` (one end of a socketpair) and the waker writes one
//!   40-byte frame to it.
//! - `futex-direct`: the process's only thread sleeps in `FUTEX_WAIT` on the `sleeping` word
//!   (a shared futex, no `FUTEX_PRIVATE_FLAG`) and the waker calls `FUTEX_WAKE`. No runtime:
//!   the lower bound, what a blocking consumer would get.
//! - `futex-waiter-thread`: what an async consumer needs to sleep on a futex. The consumer is a
//!   task on a tokio current-thread runtime. A waiter thread of its process stays blocked in
//!   `FUTEX_WAIT` on a second shared word, the mailbox's bell; the waker, having taken the
//!   `sleeping` word down, increments the bell and calls `FUTEX_WAKE` on it, and the woken
//!   thread wakes the task through a `tokio::sync::Notify` (which wakes the runtime's thread
//!   through its I/O driver's eventfd). The thread needs no arming before each sleep, which
//!   would cost the sleeper one more thread wake-up.
//!
//! **Each send waits until the peer has raised its word** (a gate that spins up to 1 us, then
//! yields; usually it passes at once). Without it, on two cores the reply often came back
//! before the sender had gone to sleep: a round trip held 1.05 (futex) to 1.26 (doorbell)
//! wake-ups instead of 2, half a round trip was no wake-up, and the variants were not compared
//! on the same thing. With it every round trip holds two wake-ups (`wakes/RT` = 2);
//! `blocked/RT` says how many found the sleeper really blocked (in `FUTEX_WAIT`, or its task
//! parked) rather than about to.
//!
//! A parked task is not yet a sleeping thread, though: the gate opens as soon as the word is
//! raised, and a tokio consumer's thread then still has its way into `epoll_wait` and the idle
//! core into its halt to go. A frame that comes meanwhile is cheap for its writer, one that
//! finds the core halted is not (on the 2-vCPU VM this was written on, the writer then pays
//! ~14 us instead of ~1.5). `FERROMQ_DOORBELL_SETTLE_US` makes each sender stay busy that
//! long after the gate, as a hot producer would, so that every consumer is fully asleep when
//! woken: the case of a consumer that waits longer than a round trip.
//!
//! # What is reported
//! - Latency: the round trip's p50, p99 and p99.9 as the pinger sees it, hence one wake-up ~
//!   RTT/2; and one wake-up measured directly, from the producer's clock reading just before it
//!   publishes to the consumer's after it woke and saw the entry (`CLOCK_MONOTONIC`, the same
//!   clock in both processes), over the wake-ups that found the consumer blocked.
//! - CPU: each process's user + sys time (`getrusage(RUSAGE_SELF)`, all its threads) per round
//!   trip, in which it wakes its peer once and is woken once: waker + sleeper of one wake-up.
//!   The waker's share is measured where it is paid, as the sending thread's CPU time
//!   (`CLOCK_THREAD_CPUTIME_ID`, less the clock's own cost, which is printed) over the send
//!   step: clock reading, publish, fence, take the word down, write the frame or call
//!   `FUTEX_WAKE`. The sleeper's share is the rest: (process CPU - send steps - gate spins) /
//!   sleeps. The send step's wall time is also given: how long the sender was held up, which
//!   grows when the woken process takes the sender's core.
//! - `preempted/RT` (involuntary context switches, `getrusage`) and the load average before
//!   each run tell the regime: on this 2-core machine, other work decides whether the two
//!   processes run on separate cores or share one, and that moves every figure (the ratios
//!   between variants move less).
//!
//! The variants run interleaved (A, B, C, A, B, C, ...); the summary gives each figure's median
//! with min-max over the rounds, and each variant's ratio to `doorbell-frame` taken round by
//! round (`../shared/BENCHMARKS.md`).
//!
//! # Why not criterion
//! A sample here is a round trip between two processes, and the CPU time comes from each
//! process's `getrusage`; criterion times a closure in its own process and has no place for
//! either, nor for percentiles. So this is a plain `main` (`harness = false`). Without
//! `--bench` (under `cargo test --benches`) it runs one short smoke round, as criterion does.
//!
//! # Settings
//! `FERROMQ_DOORBELL_ROUNDS` (default 5), `FERROMQ_DOORBELL_WARMUP` (round trips, default
//! 10 000), `FERROMQ_DOORBELL_ROUND_TRIPS` (measured, default 20 000), `FERROMQ_DOORBELL_CPUS`
//! (`pinger,ponger`: pins each process, waiter thread included, to that CPU: `0,1` for
//! separate cores, `0,0` for a shared one; unset, the scheduler places them as it would
//! ferromq's devices), `FERROMQ_DOORBELL_SETTLE_US` (default 0; see above: counted as gate
//! time and taken off the RTT; 50 is ample).
//!
//! # Cleanup
//! The forked processes die with this one (`PR_SET_PDEATHSIG`); a run that fails or outlives
//! its watchdog has both of them killed and reaped, and the other runs go on (the exit status
//! says that one failed). The mapping is anonymous and goes with the processes.
//!
//! # unsafe
//! A bench is no library crate, but it keeps their rules: the mapping, the futex syscalls and
//! `fork` are the only `unsafe`, each with its `// SAFETY:`.
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    clippy::multiple_unsafe_ops_per_block
)]

use std::fmt::Write as _;
use std::future::Future;
use std::io::{self, Write as _};
use std::num::NonZeroUsize;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::libc;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{Signal, kill};
use nix::sys::time::TimeValLike;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{ForkResult, Pid, fork, getppid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// A doorbell frame's size: a ZMTP frame carrying an empty descriptor, as ferromq sends.
const FRAME_LEN: usize = 40;
/// How long one run (both processes) may take before the watchdog kills it.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the parent looks whether its children have exited.
const REAP_INTERVAL: Duration = Duration::from_millis(20);
/// How long the gate spins on the peer's word before it yields the processor between looks:
/// about what the peer needs to finish its send and raise its word when it runs on the other
/// core; when both share one core the peer can only do that once this one yields.
const GATE_SPIN: Duration = Duration::from_micros(1);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    DoorbellFrame,
    FutexDirect,
    FutexWaiterThread,
}

impl Variant {
    const ALL: [Variant; 3] = [
        Variant::DoorbellFrame,
        Variant::FutexDirect,
        Variant::FutexWaiterThread,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::DoorbellFrame => "doorbell-frame",
            Variant::FutexDirect => "futex-direct",
            Variant::FutexWaiterThread => "futex-waiter-thread",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    /// Sends the ping, times the round trip.
    Pinger,
    /// Answers each ping with a pong.
    Ponger,
}

impl Role {
    fn idx(self) -> usize {
        match self {
            Role::Pinger => 0,
            Role::Ponger => 1,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Settings {
    n_rounds: usize,
    n_warmup: usize,
    n_round_trips: usize,
    /// The CPU each process is pinned to, by `Role::idx`.
    cpus: Option<[usize; 2]>,
    /// How long a sender stays busy after the gate before it publishes.
    settle: Duration,
}

impl Settings {
    fn from_env(smoke: bool) -> Result<Settings, String> {
        let defaults = if smoke {
            Settings {
                n_rounds: 1,
                n_warmup: 100,
                n_round_trips: 500,
                cpus: None,
                settle: Duration::ZERO,
            }
        } else {
            Settings {
                n_rounds: 5,
                n_warmup: 10_000,
                n_round_trips: 20_000,
                cpus: None,
                settle: Duration::ZERO,
            }
        };
        let read = |name: &str, default: usize| match std::env::var(name) {
            Ok(text) => match text.parse::<usize>() {
                Ok(value) if value > 0 => Ok(value),
                _ => Err(format!("{name}={text}: expected a positive integer")),
            },
            Err(_) => Ok(default),
        };
        Ok(Settings {
            n_rounds: read("FERROMQ_DOORBELL_ROUNDS", defaults.n_rounds)?,
            n_warmup: read("FERROMQ_DOORBELL_WARMUP", defaults.n_warmup)?,
            n_round_trips: read("FERROMQ_DOORBELL_ROUND_TRIPS", defaults.n_round_trips)?,
            settle: match std::env::var("FERROMQ_DOORBELL_SETTLE_US") {
                Ok(text) => Duration::from_micros(text.parse().map_err(|_| {
                    format!("FERROMQ_DOORBELL_SETTLE_US={text}: expected microseconds")
                })?),
                Err(_) => Duration::ZERO,
            },
            cpus: match std::env::var("FERROMQ_DOORBELL_CPUS") {
                Ok(text) => Some(parse_cpus(&text).ok_or_else(|| {
                    format!("FERROMQ_DOORBELL_CPUS={text}: expected two CPU numbers, as in 0,1")
                })?),
                Err(_) => None,
            },
        })
    }
}

/// `pinger,ponger` CPU numbers.
fn parse_cpus(text: &str) -> Option<[usize; 2]> {
    let (pinger, ponger) = text.split_once(',')?;
    Some([pinger.trim().parse().ok()?, ponger.trim().parse().ok()?])
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the host.
fn monotonic_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always there");
    u64::try_from(now.num_nanoseconds()).unwrap_or(0)
}

/// The calling thread's CPU time in nanoseconds (a system call, unlike `monotonic_ns`).
fn thread_cpu_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("CLOCK_THREAD_CPUTIME_ID is always there");
    u64::try_from(now.num_nanoseconds()).unwrap_or(0)
}

/// What reading `thread_cpu_ns` twice adds to a figure taken between the two readings
/// (median of back-to-back pairs), nanoseconds.
fn thread_clock_overhead_ns() -> u64 {
    let mut pairs: Vec<u64> = (0..1001)
        .map(|_| {
            let first = thread_cpu_ns();
            thread_cpu_ns().saturating_sub(first)
        })
        .collect();
    pairs.sort_unstable();
    pairs[pairs.len() / 2]
}

/// What the producer writes: the ring's tail and, for the latency figure, when it published.
#[repr(C, align(64))]
struct ProducerLine {
    /// Sequence numbers published so far (the ring's tail).
    tail: AtomicU64,
    /// `monotonic_ns` just before the last publish.
    published_at_ns: AtomicU64,
}

/// The consumer's word, on a cache line of its own as in the ring.
#[repr(C, align(64))]
struct ConsumerLine {
    /// 1: the consumer sleeps (or is about to) and wants to be woken. `futex-direct`'s futex
    /// word.
    sleeping: AtomicU32,
    /// Wake-ups rung so far: `futex-waiter-thread`'s futex word.
    bell: AtomicU32,
}

/// One direction of the ping-pong: a ring reduced to its tail and its consumer's word.
#[repr(C)]
struct Mailbox {
    producer: ProducerLine,
    consumer: ConsumerLine,
}

impl Mailbox {
    fn sleeping(&self) -> &AtomicU32 {
        &self.consumer.sleeping
    }

    fn bell(&self) -> &AtomicU32 {
        &self.consumer.bell
    }

    fn has(&self, seq: u64) -> bool {
        self.producer.tail.load(Ordering::Acquire) >= seq
    }

    /// The producer's side (`RingProducer::publish`): publishes `seq`; true when the consumer
    /// sleeps and must be woken (its word was taken down here).
    fn publish(&self, seq: u64) -> bool {
        self.producer.tail.store(seq, Ordering::Release);
        // Pairs with the fence in `prepare_to_sleep`: either the consumer sees this tail, or
        // this sees its raised word.
        fence(Ordering::SeqCst);
        let sleeping = self.sleeping();
        sleeping.load(Ordering::Relaxed) == 1 && sleeping.swap(0, Ordering::AcqRel) == 1
    }

    /// The consumer's side (`RingConsumer::wait_for_doorbell`): raises the word; false, with
    /// the word down again, when `seq` came meanwhile and there is nothing to sleep for.
    fn prepare_to_sleep(&self, seq: u64) -> bool {
        self.sleeping().store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.has(seq) {
            return true;
        }
        // A producer that took the word down first still wakes us: a spare frame or a
        // `FUTEX_WAKE` with nobody waiting, both harmless.
        self.sleeping().store(0, Ordering::Relaxed);
        false
    }

    /// The gate before a send: waits until the consumer has raised its word, so that the
    /// publish takes the wake-up path, then stays busy for `settle` (a hot producer, and a
    /// consumer that had time to block); the CPU time it spent, nanoseconds.
    fn wait_until_consumer_sleeps(&self, settle: Duration) -> u64 {
        if self.sleeping().load(Ordering::Acquire) == 1 && settle.is_zero() {
            return 0;
        }
        let cpu_at_start = thread_cpu_ns();
        let started = Instant::now();
        while self.sleeping().load(Ordering::Acquire) != 1 {
            if started.elapsed() < GATE_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let raised_at = Instant::now();
        while raised_at.elapsed() < settle {
            std::hint::spin_loop();
        }
        thread_cpu_ns().saturating_sub(cpu_at_start)
    }
}

/// What one process reports about its measured round trips.
#[repr(C)]
#[derive(Default)]
struct ProcessReport {
    /// User + sys time of the whole process (`getrusage`), nanoseconds.
    cpu_ns: AtomicU64,
    /// Times another task took the processor from this process (`getrusage`).
    n_preempted: AtomicU64,
    /// Wake-ups this process sent (frames written, `FUTEX_WAKE` calls).
    n_wakes: AtomicU64,
    /// The send steps that woke the peer, thread CPU nanoseconds in all.
    send_cpu_ns: AtomicU64,
    /// The gate's spinning, thread CPU nanoseconds in all.
    gate_cpu_ns: AtomicU64,
    /// Times this process went to sleep.
    n_sleeps: AtomicU64,
    /// Of those, times it really blocked.
    n_blocked: AtomicU64,
    /// Wake-up latencies recorded (wake-ups that found this process blocked).
    n_latencies: AtomicU64,
    /// 1 once the report is complete.
    done: AtomicU32,
}

impl ProcessReport {
    fn fields(&self) -> [&AtomicU64; 8] {
        [
            &self.cpu_ns,
            &self.n_preempted,
            &self.n_wakes,
            &self.send_cpu_ns,
            &self.gate_cpu_ns,
            &self.n_sleeps,
            &self.n_blocked,
            &self.n_latencies,
        ]
    }
}

#[repr(C)]
struct Header {
    to_ponger: Mailbox,
    to_pinger: Mailbox,
    /// By `Role::idx`.
    reports: [ProcessReport; 2],
}

/// The mapping both processes of a run share. Zero bytes are a valid value of every part
/// (atomics and padding only), which is what a fresh anonymous mapping holds.
struct Shared {
    header: &'static Header,
    /// The pinger's round trips, nanoseconds.
    rtt_ns: &'static [AtomicU64],
    /// Each process's send steps that woke the peer, thread CPU nanoseconds; by `Role::idx`.
    send_cpu_ns: [&'static [AtomicU64]; 2],
    /// The same steps' wall time: how long the sender was held up.
    send_wall_ns: [&'static [AtomicU64]; 2],
    /// Each process's wake-ups as a blocked consumer, publish to seen, nanoseconds.
    wake_latency_ns: [&'static [AtomicU64]; 2],
}

impl Shared {
    /// Maps room for `n_samples` round trips, shared with every process forked afterwards.
    /// The mapping is never unmapped: it lives as long as the process.
    fn map(n_samples: usize) -> io::Result<Shared> {
        const N_ARRAYS: usize = 7;
        let header_len = size_of::<Header>().next_multiple_of(size_of::<AtomicU64>());
        let samples_len = n_samples * size_of::<AtomicU64>();
        let len =
            NonZeroUsize::new(header_len + N_ARRAYS * samples_len).expect("the header has a size");
        // SAFETY: a new anonymous mapping, placed by the kernel, overlaps nothing this process
        // uses.
        let base = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
            )
        }?
        .cast::<u8>();
        // SAFETY: the mapping is page-aligned (enough for `Header`), holds `header_len` bytes
        // of it, is zeroed (a valid `Header`), is only accessed through atomics and is never
        // unmapped, so a shared `'static` reference is sound.
        let header = unsafe { base.cast::<Header>().as_ref() };
        let samples = |idx: usize| -> &'static [AtomicU64] {
            assert!(idx < N_ARRAYS);
            // SAFETY: `header_len + idx * samples_len` with `idx < N_ARRAYS` is inside the
            // mapping.
            let start = unsafe { base.add(header_len + idx * samples_len) };
            // SAFETY: `n_samples` zeroed, 8-aligned (`header_len` is a multiple of 8), mapped
            // `AtomicU64`s from `start`, accessed only as atomics, never unmapped.
            unsafe { std::slice::from_raw_parts(start.cast::<AtomicU64>().as_ptr(), n_samples) }
        };
        Ok(Shared {
            header,
            rtt_ns: samples(0),
            send_cpu_ns: [samples(1), samples(2)],
            send_wall_ns: [samples(3), samples(4)],
            wake_latency_ns: [samples(5), samples(6)],
        })
    }

    /// Zeroes what the previous run left (done by the parent before it forks).
    fn reset(&self) {
        for mailbox in [&self.header.to_ponger, &self.header.to_pinger] {
            mailbox.producer.tail.store(0, Ordering::Relaxed);
            mailbox.producer.published_at_ns.store(0, Ordering::Relaxed);
            mailbox.sleeping().store(0, Ordering::Relaxed);
            mailbox.bell().store(0, Ordering::Relaxed);
        }
        for report in &self.header.reports {
            for field in report.fields() {
                field.store(0, Ordering::Relaxed);
            }
            report.done.store(0, Ordering::Relaxed);
        }
        let arrays = [self.rtt_ns]
            .into_iter()
            .chain(self.send_cpu_ns)
            .chain(self.send_wall_ns)
            .chain(self.wake_latency_ns);
        for samples in arrays {
            for sample in samples {
                sample.store(0, Ordering::Relaxed);
            }
        }
    }

    /// (outbox, inbox) of `role`.
    fn mailboxes(&self, role: Role) -> (&'static Mailbox, &'static Mailbox) {
        match role {
            Role::Pinger => (&self.header.to_ponger, &self.header.to_pinger),
            Role::Ponger => (&self.header.to_pinger, &self.header.to_ponger),
        }
    }
}

/// Sleeps while `word` holds `expected`, on a shared futex (the word lies in a mapping other
/// processes have too). True when it slept and was woken; false when it did not sleep (the
/// word had changed: `EAGAIN`) or a signal came: the caller looks again either way.
fn futex_wait(word: &AtomicU32, expected: u32) -> bool {
    // SAFETY: `word` is a live, aligned u32 for the whole call; FUTEX_WAIT only reads it, the
    // null timeout means none, and the two other arguments are ignored by FUTEX_WAIT.
    let result = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    result == 0
}

/// Wakes one sleeper in `futex_wait` on `word`, in whichever process it is.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE reads no memory through the other
    // arguments.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            1u32,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// Awaits `future`; also whether it had to wait (returned `Pending`): the task was parked.
async fn awaited<F: Future>(future: F) -> (F::Output, bool) {
    let mut future = pin!(future);
    let mut blocked = false;
    let output = std::future::poll_fn(|context| {
        let poll = future.as_mut().poll(context);
        blocked |= poll.is_pending();
        poll
    })
    .await;
    (output, blocked)
}

/// How a variant sleeps and wakes.
trait Wakeup {
    /// Sleeps until woken (or spuriously); the caller has raised `inbox`'s word. Whether it
    /// really blocked.
    async fn sleep(&mut self, inbox: &'static Mailbox) -> io::Result<bool>;
    /// Wakes the peer, whose word in `outbox` this process has just taken down.
    async fn wake(&mut self, outbox: &'static Mailbox) -> io::Result<()>;
}

/// `doorbell-frame`: one frame on a Unix-domain stream socket, read by tokio.
struct DoorbellFrame {
    stream: tokio::net::UnixStream,
    frame: [u8; FRAME_LEN],
    /// Takes whatever frames came, as a buffered frame reader would.
    buffer: Box<[u8; 4096]>,
}

impl Wakeup for DoorbellFrame {
    async fn sleep(&mut self, _inbox: &'static Mailbox) -> io::Result<bool> {
        let (n_read, blocked) = awaited(self.stream.read(&mut self.buffer[..])).await;
        if n_read? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed its socket",
            ));
        }
        Ok(blocked)
    }

    async fn wake(&mut self, _outbox: &'static Mailbox) -> io::Result<()> {
        self.stream.write_all(&self.frame).await
    }
}

/// `futex-direct`: the thread itself sleeps in `FUTEX_WAIT`. Its futures never return
/// `Pending` (they block instead), which is why `run_blocking` can drive them.
struct FutexDirect;

impl Wakeup for FutexDirect {
    async fn sleep(&mut self, inbox: &'static Mailbox) -> io::Result<bool> {
        Ok(futex_wait(inbox.sleeping(), 1))
    }

    async fn wake(&mut self, outbox: &'static Mailbox) -> io::Result<()> {
        futex_wake(outbox.sleeping());
        Ok(())
    }
}

/// What a consumer task and its waiter thread share.
#[derive(Default)]
struct Waiter {
    stop: AtomicBool,
    /// Wakes the task when the bell rang.
    woken: Notify,
}

/// `futex-waiter-thread`: a thread blocked in `FUTEX_WAIT` on the inbox's bell wakes the
/// consumer task. The producer rings the bell (increments it, `FUTEX_WAKE`) only when it took
/// the consumer's `sleeping` word down, so the thread sleeps while the consumer is busy and
/// needs no arming before each sleep (arming would cost the consumer one more thread wake-up).
struct FutexWaiterThread {
    waiter: Arc<Waiter>,
    inbox: &'static Mailbox,
    thread: Option<JoinHandle<()>>,
}

impl FutexWaiterThread {
    fn start(inbox: &'static Mailbox) -> io::Result<FutexWaiterThread> {
        let waiter = Arc::new(Waiter::default());
        // Read here, not in the thread: a ring between this and the thread's first look must
        // not pass unseen.
        let rung = inbox.bell().load(Ordering::Acquire);
        let thread = std::thread::Builder::new()
            .name("futex-waiter".to_owned())
            .spawn({
                let waiter = Arc::clone(&waiter);
                move || wait_for_rings(&waiter, inbox, rung)
            })?;
        Ok(FutexWaiterThread {
            waiter,
            inbox,
            thread: Some(thread),
        })
    }
}

/// The waiter thread: in `FUTEX_WAIT` until the bell moves on from `rung`, then it wakes the
/// task (a ring that comes meanwhile makes the next `FUTEX_WAIT` return at once).
fn wait_for_rings(waiter: &Waiter, inbox: &'static Mailbox, mut rung: u32) {
    loop {
        futex_wait(inbox.bell(), rung);
        if waiter.stop.load(Ordering::Acquire) {
            return;
        }
        let now = inbox.bell().load(Ordering::Acquire);
        if now != rung {
            rung = now;
            waiter.woken.notify_one();
        }
    }
}

impl Wakeup for FutexWaiterThread {
    async fn sleep(&mut self, _inbox: &'static Mailbox) -> io::Result<bool> {
        // `notify_one` leaves a permit when the task is not waiting yet: no wake-up is lost.
        let ((), blocked) = awaited(self.waiter.woken.notified()).await;
        Ok(blocked)
    }

    async fn wake(&mut self, outbox: &'static Mailbox) -> io::Result<()> {
        outbox.bell().fetch_add(1, Ordering::Release);
        futex_wake(outbox.bell());
        Ok(())
    }
}

impl Drop for FutexWaiterThread {
    fn drop(&mut self) {
        self.waiter.stop.store(true, Ordering::Release);
        // Ringing its own bell gets the thread out of `FUTEX_WAIT`.
        self.inbox.bell().fetch_add(1, Ordering::Release);
        futex_wake(self.inbox.bell());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a process counts over its measured round trips.
#[derive(Default)]
struct Counters {
    n_wakes: u64,
    send_cpu_ns: u64,
    gate_cpu_ns: u64,
    n_sleeps: u64,
    n_blocked: u64,
    n_latencies: u64,
}

/// A send step that woke the peer.
struct SendStep {
    /// The sending thread's CPU time, nanoseconds.
    cpu_ns: u64,
    /// Wall time, nanoseconds: more than `cpu_ns` when the woken task took this processor.
    wall_ns: u64,
}

/// Waits until `inbox` holds `seq`, sleeping whenever it finds nothing; the wake-up's latency
/// (publish to seen) when its last sleep found it blocked.
async fn receive<W: Wakeup>(
    wakeup: &mut W,
    inbox: &'static Mailbox,
    seq: u64,
    counters: &mut Counters,
) -> io::Result<Option<u64>> {
    let mut blocked = false;
    while !inbox.has(seq) {
        blocked = false;
        if inbox.prepare_to_sleep(seq) {
            blocked = wakeup.sleep(inbox).await?;
            counters.n_sleeps += 1;
            counters.n_blocked += u64::from(blocked);
        }
    }
    if !blocked {
        return Ok(None);
    }
    let published_at_ns = inbox.producer.published_at_ns.load(Ordering::Relaxed);
    Ok(Some(monotonic_ns().saturating_sub(published_at_ns)))
}

/// Waits for the peer to raise its word, publishes `seq` into `outbox` and wakes the peer;
/// what the step cost when it woke it.
async fn send<W: Wakeup>(
    wakeup: &mut W,
    outbox: &'static Mailbox,
    seq: u64,
    settle: Duration,
    counters: &mut Counters,
) -> io::Result<Option<SendStep>> {
    counters.gate_cpu_ns += outbox.wait_until_consumer_sleeps(settle);
    let cpu_at_start = thread_cpu_ns();
    let started = Instant::now();
    outbox
        .producer
        .published_at_ns
        .store(monotonic_ns(), Ordering::Relaxed);
    if !outbox.publish(seq) {
        return Ok(None);
    }
    wakeup.wake(outbox).await?;
    let wall_ns = nanos(started.elapsed());
    Ok(Some(SendStep {
        cpu_ns: thread_cpu_ns().saturating_sub(cpu_at_start),
        wall_ns,
    }))
}

/// The process's CPU time (user + sys, all threads) and how often it was preempted.
fn process_usage() -> io::Result<(Duration, u64)> {
    let usage = getrusage(UsageWho::RUSAGE_SELF)?;
    let micros = usage.user_time().num_microseconds() + usage.system_time().num_microseconds();
    Ok((
        Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
        u64::try_from(usage.involuntary_context_switches()).unwrap_or(0),
    ))
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Stores `value` at `idx` of `samples` if there is room.
fn record(samples: &[AtomicU64], idx: u64, value: u64) {
    if let Some(sample) = usize::try_from(idx).ok().and_then(|idx| samples.get(idx)) {
        sample.store(value, Ordering::Relaxed);
    }
}

/// One process's part of the ping-pong; writes its report into `shared`.
async fn ping_pong<W: Wakeup>(
    mut wakeup: W,
    role: Role,
    shared: &'static Shared,
    settings: Settings,
) -> io::Result<()> {
    let (outbox, inbox) = shared.mailboxes(role);
    let mut counters = Counters::default();
    let mut usage_at_start = (Duration::ZERO, 0);
    let n_total = settings.n_warmup + settings.n_round_trips;
    for rt_idx in 0..n_total {
        if rt_idx == settings.n_warmup {
            counters = Counters::default();
            usage_at_start = process_usage()?;
        }
        let measured_idx = rt_idx.checked_sub(settings.n_warmup);
        let seq = rt_idx as u64 + 1;
        let (send_step, latency) = match role {
            Role::Pinger => {
                let sent_at = Instant::now();
                let send_step =
                    send(&mut wakeup, outbox, seq, settings.settle, &mut counters).await?;
                let latency = receive(&mut wakeup, inbox, seq, &mut counters).await?;
                if let Some(idx) = measured_idx {
                    record(shared.rtt_ns, idx as u64, nanos(sent_at.elapsed()));
                }
                (send_step, latency)
            }
            Role::Ponger => {
                let latency = receive(&mut wakeup, inbox, seq, &mut counters).await?;
                let send_step =
                    send(&mut wakeup, outbox, seq, settings.settle, &mut counters).await?;
                (send_step, latency)
            }
        };
        if measured_idx.is_none() {
            continue;
        }
        if let Some(send_step) = send_step {
            let idx = counters.n_wakes;
            record(shared.send_cpu_ns[role.idx()], idx, send_step.cpu_ns);
            record(shared.send_wall_ns[role.idx()], idx, send_step.wall_ns);
            counters.n_wakes += 1;
            counters.send_cpu_ns += send_step.cpu_ns;
        }
        if let Some(latency) = latency {
            record(
                shared.wake_latency_ns[role.idx()],
                counters.n_latencies,
                latency,
            );
            counters.n_latencies += 1;
        }
    }
    let (cpu_at_end, n_preempted_at_end) = process_usage()?;
    drop(wakeup);
    let report = &shared.header.reports[role.idx()];
    let figures = [
        (
            &report.cpu_ns,
            nanos(cpu_at_end.saturating_sub(usage_at_start.0)),
        ),
        (
            &report.n_preempted,
            n_preempted_at_end.saturating_sub(usage_at_start.1),
        ),
        (&report.n_wakes, counters.n_wakes),
        (&report.send_cpu_ns, counters.send_cpu_ns),
        (&report.gate_cpu_ns, counters.gate_cpu_ns),
        (&report.n_sleeps, counters.n_sleeps),
        (&report.n_blocked, counters.n_blocked),
        (&report.n_latencies, counters.n_latencies),
    ];
    for (field, value) in figures {
        field.store(value, Ordering::Relaxed);
    }
    report.done.store(1, Ordering::Release);
    Ok(())
}

/// Drives a future whose polls never return `Pending` (`FutexDirect` blocks the thread
/// instead): the blocking consumer, with no runtime at all.
fn run_blocking<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut context) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a blocking variant's future returned Pending"),
    }
}

fn current_thread_runtime() -> io::Result<tokio::runtime::Runtime> {
    // As a ferromq device's: I/O and time drivers on.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// One forked process's work in a run.
fn play(
    variant: Variant,
    role: Role,
    shared: &'static Shared,
    settings: Settings,
    socket: StdUnixStream,
) -> io::Result<()> {
    let join_error = |error: tokio::task::JoinError| io::Error::other(error.to_string());
    match variant {
        Variant::DoorbellFrame => {
            socket.set_nonblocking(true)?;
            current_thread_runtime()?.block_on(async move {
                let wakeup = DoorbellFrame {
                    stream: tokio::net::UnixStream::from_std(socket)?,
                    frame: [0xdb; FRAME_LEN],
                    buffer: Box::new([0; 4096]),
                };
                tokio::spawn(ping_pong(wakeup, role, shared, settings))
                    .await
                    .map_err(join_error)?
            })
        }
        Variant::FutexDirect => run_blocking(ping_pong(FutexDirect, role, shared, settings)),
        Variant::FutexWaiterThread => {
            let (_, inbox) = shared.mailboxes(role);
            let wakeup = FutexWaiterThread::start(inbox)?;
            current_thread_runtime()?.block_on(async move {
                tokio::spawn(ping_pong(wakeup, role, shared, settings))
                    .await
                    .map_err(join_error)?
            })
        }
    }
}

/// The forked process: plays its role and exits, never returning into the parent's code.
fn child_main(
    variant: Variant,
    role: Role,
    parent: Pid,
    shared: &'static Shared,
    settings: Settings,
    socket: StdUnixStream,
) -> ! {
    // Die with the parent; it may have died before this was set.
    if nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err() || getppid() != parent {
        std::process::exit(1);
    }
    if let Some(cpus) = settings.cpus {
        // Before any thread starts: the waiter thread inherits it.
        let mut cpu_set = CpuSet::new();
        let pinned = cpu_set
            .set(cpus[role.idx()])
            .and_then(|()| sched_setaffinity(Pid::from_raw(0), &cpu_set));
        if let Err(error) = pinned {
            eprintln!(
                "doorbell: pinning {role:?} to CPU {}: {error}",
                cpus[role.idx()]
            );
            std::process::exit(1);
        }
    }
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        play(variant, role, shared, settings, socket)
    }));
    let code = match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(error)) => {
            eprintln!("doorbell: {} {role:?}: {error}", variant.name());
            1
        }
        // The panic hook printed the message.
        Err(_) => 101,
    };
    std::process::exit(code)
}

/// The forked processes of a run not reaped yet; dropping it kills and reaps them.
struct Children {
    pids: Vec<Pid>,
}

impl Children {
    /// Reaps every child, failing when one exits other than with status 0 or when `deadline`
    /// passes first.
    fn wait(&mut self, deadline: Instant) -> Result<(), String> {
        while !self.pids.is_empty() {
            let mut problem = None;
            self.pids
                .retain(|&pid| match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => true,
                    Ok(WaitStatus::Exited(_, 0)) => false,
                    Ok(status) => {
                        problem = Some(format!("child {pid} ended: {status:?}"));
                        false
                    }
                    Err(error) => {
                        problem = Some(format!("waitpid {pid}: {error}"));
                        false
                    }
                });
            if let Some(problem) = problem {
                return Err(problem);
            }
            if self.pids.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("timed out after {RUN_TIMEOUT:?}"));
            }
            std::thread::sleep(REAP_INTERVAL);
        }
        Ok(())
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for &pid in &self.pids {
            let _ = kill(pid, Signal::SIGKILL);
        }
        for &pid in &self.pids {
            let _ = waitpid(pid, None);
        }
    }
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |tasks| tasks.count())
}

/// One run's figures; times in microseconds, counts per round trip for both processes
/// together unless said.
#[derive(Clone, Debug)]
struct RunResult {
    /// The first figure of `/proc/loadavg` before the run.
    load: f64,
    rtt_p50: f64,
    rtt_p99: f64,
    rtt_p999: f64,
    /// One wake-up of a blocked consumer, publish to seen.
    wake_latency_p50: f64,
    wake_latency_p99: f64,
    /// Process CPU per round trip, the mean of the two processes.
    cpu_per_rt: f64,
    /// Per process, for the per-run line.
    cpu_per_rt_by_role: [f64; 2],
    /// The waker's send step, thread CPU less the clock's overhead, over both processes.
    waker_cpu_p50: f64,
    waker_cpu_mean: f64,
    /// The same steps' wall time: how long the sender was held up.
    waker_wall_p50: f64,
    waker_wall_p99: f64,
    /// The gate's spinning per round trip, the mean of the two processes.
    gate_per_rt: f64,
    /// (process CPU - send steps - gate) per sleep, both processes.
    sleeper_per_sleep: f64,
    wakes_per_rt: f64,
    sleeps_per_rt: f64,
    blocked_per_rt: f64,
    preempted_per_rt: f64,
}

/// The samples stored in `arrays`, `counts[idx]` of `arrays[idx]`, sorted.
fn sorted_samples(arrays: &[&[AtomicU64]], counts: &[u64]) -> Vec<u64> {
    let mut samples: Vec<u64> = arrays
        .iter()
        .zip(counts)
        .flat_map(|(array, &count)| {
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            array
                .iter()
                .take(count)
                .map(|sample| sample.load(Ordering::Relaxed))
        })
        .collect();
    samples.sort_unstable();
    samples
}

/// In microseconds.
fn percentile(sorted: &[u64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[idx.min(sorted.len() - 1)] as f64 / 1000.0
}

/// In microseconds.
fn mean(samples: &[u64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.iter().sum::<u64>() as f64 / samples.len() as f64 / 1000.0
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn collect(
    shared: &Shared,
    settings: Settings,
    clock_overhead_ns: u64,
    load: f64,
) -> Result<RunResult, String> {
    let reports = &shared.header.reports;
    if reports
        .iter()
        .any(|report| report.done.load(Ordering::Acquire) != 1)
    {
        return Err("a process exited without its report".to_owned());
    }
    let n_round_trips = settings.n_round_trips as f64;
    let load_field = |idx: usize, field: fn(&ProcessReport) -> &AtomicU64| {
        field(&reports[idx]).load(Ordering::Relaxed)
    };
    let both = |field: fn(&ProcessReport) -> &AtomicU64| {
        (load_field(0, field) + load_field(1, field)) as f64
    };
    // Both senders' settling is no part of a wake-up.
    let settle_ns = nanos(settings.settle) * 2;
    let rtt: Vec<u64> = sorted_samples(&[shared.rtt_ns], &[settings.n_round_trips as u64])
        .into_iter()
        .map(|rtt_ns| rtt_ns.saturating_sub(settle_ns))
        .collect();
    let n_wakes = [0, 1].map(|idx| load_field(idx, |report| &report.n_wakes));
    let waker_cpu: Vec<u64> = sorted_samples(&shared.send_cpu_ns, &n_wakes)
        .into_iter()
        .map(|cpu_ns| cpu_ns.saturating_sub(clock_overhead_ns))
        .collect();
    let waker_wall = sorted_samples(&shared.send_wall_ns, &n_wakes);
    let n_latencies = [0, 1].map(|idx| load_field(idx, |report| &report.n_latencies));
    let latencies = sorted_samples(&shared.wake_latency_ns, &n_latencies);
    let cpu_per_rt_by_role =
        [0, 1].map(|idx| load_field(idx, |report| &report.cpu_ns) as f64 / n_round_trips / 1000.0);
    let sleeper_ns = both(|report| &report.cpu_ns)
        - both(|report| &report.send_cpu_ns)
        - both(|report| &report.gate_cpu_ns);
    Ok(RunResult {
        load,
        rtt_p50: percentile(&rtt, 0.50),
        rtt_p99: percentile(&rtt, 0.99),
        rtt_p999: percentile(&rtt, 0.999),
        wake_latency_p50: percentile(&latencies, 0.50),
        wake_latency_p99: percentile(&latencies, 0.99),
        cpu_per_rt: (cpu_per_rt_by_role[0] + cpu_per_rt_by_role[1]) / 2.0,
        cpu_per_rt_by_role,
        waker_cpu_p50: percentile(&waker_cpu, 0.50),
        waker_cpu_mean: mean(&waker_cpu),
        waker_wall_p50: percentile(&waker_wall, 0.50),
        waker_wall_p99: percentile(&waker_wall, 0.99),
        gate_per_rt: both(|report| &report.gate_cpu_ns) / 2.0 / n_round_trips / 1000.0,
        sleeper_per_sleep: sleeper_ns / both(|report| &report.n_sleeps) / 1000.0,
        wakes_per_rt: both(|report| &report.n_wakes) / n_round_trips,
        sleeps_per_rt: both(|report| &report.n_sleeps) / n_round_trips,
        blocked_per_rt: both(|report| &report.n_blocked) / n_round_trips,
        preempted_per_rt: both(|report| &report.n_preempted) / n_round_trips,
    })
}

/// Forks the two processes of one run, waits for them under the watchdog, reads their figures.
fn run_once(
    variant: Variant,
    shared: &'static Shared,
    settings: Settings,
    clock_overhead_ns: u64,
) -> Result<RunResult, String> {
    let load = load_average();
    shared.reset();
    let (pinger_socket, ponger_socket) =
        StdUnixStream::pair().map_err(|error| format!("socketpair: {error}"))?;
    // A forked child may only run arbitrary code (allocate, start a runtime) if this process
    // had one thread; nothing here starts one, this checks it stays so.
    let n_threads = thread_count();
    if n_threads != 1 {
        return Err(format!("{n_threads} threads before fork, need 1"));
    }
    // Whatever sits in the stdio buffers would be written again by each child.
    let _ = io::stdout().flush();
    let _ = io::stderr().flush();
    let parent = Pid::this();
    let mut children = Children { pids: Vec::new() };
    let mut sockets = [Some(pinger_socket), Some(ponger_socket)];
    for role in [Role::Pinger, Role::Ponger] {
        // SAFETY: this process has a single thread (checked above), so the child's copy holds
        // no lock another thread held and may run any code.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                let socket = sockets[role.idx()].take().expect("each role's socket once");
                // The other end is the peer's: closed here, the peer's death reads as end of file.
                drop(sockets);
                child_main(variant, role, parent, shared, settings, socket);
            }
            Ok(ForkResult::Parent { child }) => children.pids.push(child),
            Err(error) => return Err(format!("fork: {error}")),
        }
    }
    drop(sockets);
    children.wait(Instant::now() + RUN_TIMEOUT)?;
    collect(shared, settings, clock_overhead_ns, load)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n_values = values.len();
    if n_values == 0 {
        return f64::NAN;
    }
    if n_values % 2 == 1 {
        values[n_values / 2]
    } else {
        (values[n_values / 2 - 1] + values[n_values / 2]) / 2.0
    }
}

/// `median [min-max]` of the values.
fn spread(mut values: Vec<f64>, decimals: usize) -> String {
    let middle = median(&mut values);
    let (Some(min), Some(max)) = (values.first(), values.last()) else {
        return "-".to_owned();
    };
    format!("{middle:.decimals$} [{min:.decimals$}-{max:.decimals$}]")
}

/// A table column: heading, figure, decimals.
type Column = (&'static str, fn(&RunResult) -> f64, usize);

/// A markdown table, one row per variant, each cell `median [min-max]` of a figure over the
/// rounds.
fn table(
    title: &str,
    columns: &[Column],
    variants: &[Variant],
    results: &[Vec<RunResult>],
) -> String {
    let mut text = format!("\n## {title}: median [min-max] over the rounds\n\n| variant | runs |");
    for (name, _, _) in columns {
        let _ = write!(text, " {name} |");
    }
    text.push_str("\n|---|---|");
    text.push_str(&"---|".repeat(columns.len()));
    for (variant, runs) in variants.iter().zip(results) {
        let _ = write!(text, "\n| {} | {} |", variant.name(), runs.len());
        for &(_, get, decimals) in columns {
            let values = runs.iter().map(get).collect();
            let _ = write!(text, " {} |", spread(values, decimals));
        }
    }
    text.push('\n');
    text
}

fn summary(variants: &[Variant], results: &[Vec<RunResult>]) -> String {
    let mut text = table(
        "Latency, microseconds",
        &[
            ("RTT p50", |run| run.rtt_p50, 1),
            ("RTT p99", |run| run.rtt_p99, 1),
            ("RTT p99.9", |run| run.rtt_p999, 1),
            ("one wake-up ~ RTT p50/2", |run| run.rtt_p50 / 2.0, 1),
            ("one wake-up measured p50", |run| run.wake_latency_p50, 1),
            ("measured p99", |run| run.wake_latency_p99, 1),
            ("blocked/RT (of 2)", |run| run.blocked_per_rt, 2),
        ],
        variants,
        results,
    );
    text += &table(
        "CPU per wake-up, microseconds",
        &[
            (
                "process CPU per RT = waker + sleeper",
                |run| run.cpu_per_rt,
                2,
            ),
            ("waker CPU p50", |run| run.waker_cpu_p50, 2),
            ("waker CPU mean", |run| run.waker_cpu_mean, 2),
            ("sleeper CPU per sleep", |run| run.sleeper_per_sleep, 2),
            ("waker held up (wall) p50", |run| run.waker_wall_p50, 2),
            ("waker held up p99", |run| run.waker_wall_p99, 1),
            ("gate spin per RT", |run| run.gate_per_rt, 2),
            ("wakes/RT", |run| run.wakes_per_rt, 2),
            ("preempted/RT", |run| run.preempted_per_rt, 2),
            ("load", |run| run.load, 2),
        ],
        variants,
        results,
    );
    let Some(baseline) = results.first().filter(|_| variants.len() > 1) else {
        return text;
    };
    let _ = write!(
        text,
        "\n## Ratio to {}, round by round: median [min-max]\n\n\
         | variant | RTT p50 | RTT p99 | one wake-up measured p50 | process CPU per RT \
         | waker CPU p50 | sleeper CPU per sleep |\n\
         |---|---|---|---|---|---|---|",
        variants[0].name()
    );
    for (variant, runs) in variants.iter().zip(results).skip(1) {
        let ratio = |get: fn(&RunResult) -> f64| {
            runs.iter()
                .zip(baseline)
                .map(|(run, base)| get(run) / get(base))
                .collect::<Vec<_>>()
        };
        let _ = write!(
            text,
            "\n| {} | {} | {} | {} | {} | {} | {} |",
            variant.name(),
            spread(ratio(|run| run.rtt_p50), 2),
            spread(ratio(|run| run.rtt_p99), 2),
            spread(ratio(|run| run.wake_latency_p50), 2),
            spread(ratio(|run| run.cpu_per_rt), 2),
            spread(ratio(|run| run.waker_cpu_p50), 2),
            spread(ratio(|run| run.sleeper_per_sleep), 2),
        );
    }
    text.push('\n');
    text
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: a smoke round then.
    let smoke = !args.iter().any(|arg| arg == "--bench");
    let filters: Vec<&String> = args.iter().filter(|arg| !arg.starts_with('-')).collect();
    let variants: Vec<Variant> = Variant::ALL
        .into_iter()
        .filter(|variant| {
            filters.is_empty()
                || filters
                    .iter()
                    .any(|filter| variant.name().contains(*filter))
        })
        .collect();
    if variants.is_empty() {
        eprintln!(
            "doorbell: no variant matches {filters:?} (variants: {:?})",
            Variant::ALL.map(Variant::name)
        );
        return ExitCode::FAILURE;
    }
    let settings = match Settings::from_env(smoke) {
        Ok(settings) => settings,
        Err(problem) => {
            eprintln!("doorbell: {problem}");
            return ExitCode::FAILURE;
        }
    };
    let shared: &'static Shared = match Shared::map(settings.n_round_trips) {
        Ok(shared) => Box::leak(Box::new(shared)),
        Err(error) => {
            eprintln!("doorbell: mmap: {error}");
            return ExitCode::FAILURE;
        }
    };
    let clock_overhead_ns = thread_clock_overhead_ns();
    let mut placement = match settings.cpus {
        Some([pinger, ponger]) => format!("pinger on CPU {pinger}, ponger on CPU {ponger}"),
        None => "not pinned".to_owned(),
    };
    if !settings.settle.is_zero() {
        let _ = write!(
            placement,
            ", senders settle {:?} (taken off the RTT)",
            settings.settle
        );
    }
    println!(
        "doorbell: {} rounds of {:?}, {} warm-up + {} measured round trips each, two processes; \
         {clock_overhead_ns} ns of thread CPU clock taken off each waker CPU figure; {placement}",
        settings.n_rounds,
        variants
            .iter()
            .map(|variant| variant.name())
            .collect::<Vec<_>>(),
        settings.n_warmup,
        settings.n_round_trips,
    );
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); variants.len()];
    let mut n_failed = 0;
    for round_idx in 0..settings.n_rounds {
        for (variant, runs) in variants.iter().zip(&mut results) {
            match run_once(*variant, shared, settings, clock_overhead_ns) {
                Ok(run) => {
                    println!(
                        "round {} {:<19} load {:.2} | RTT p50 {:6.1} p99 {:6.1} | wake-up p50 \
                         {:5.1} | CPU/RT {:5.2} {:5.2} | waker {:4.2} held {:5.2} | sleeper \
                         {:5.2} | gate {:4.2} | sleeps {:.2} blocked {:.2} preempted {:.2}",
                        round_idx + 1,
                        variant.name(),
                        run.load,
                        run.rtt_p50,
                        run.rtt_p99,
                        run.wake_latency_p50,
                        run.cpu_per_rt_by_role[0],
                        run.cpu_per_rt_by_role[1],
                        run.waker_cpu_p50,
                        run.waker_wall_p50,
                        run.sleeper_per_sleep,
                        run.gate_per_rt,
                        run.sleeps_per_rt,
                        run.blocked_per_rt,
                        run.preempted_per_rt,
                    );
                    runs.push(run);
                }
                Err(problem) => {
                    eprintln!(
                        "round {} {}: failed: {problem}",
                        round_idx + 1,
                        variant.name()
                    );
                    n_failed += 1;
                }
            }
        }
    }
    if results.iter().all(|runs| runs.len() == settings.n_rounds) {
        print!("{}", summary(&variants, &results));
    }
    if n_failed > 0 {
        eprintln!("doorbell: {n_failed} runs failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
