//! Tree-parallel MCTS over remote invocation: the nodes live on worker members, placed by the
//! position's hash ([`Placement`]); a simulation is a chain of calls.
//!
//! - **Selection** (`select` at the node's owner): the node picks an edge by UCB over its
//!   edges' statistics, counting a *virtual loss* on it so that the simulations in flight spread
//!   over the tree, and calls the child's owner. A node is expanded (its edges made) on its first
//!   selection.
//! - **Expansion** (`create`, a `call_buffer` with the child's position as the buffer): the child
//!   is made at its owner. Simulations that select an edge whose child is being created wait at
//!   the parent (deferred selection) and go on when the creation is backed up.
//! - **Evaluation**: the new node runs `playouts` random games at its owner.
//! - **Backpropagation** (`backup`, up the path the simulation carries): each parent adds the
//!   result to the edge and removes the virtual loss; the root's owner counts the simulation
//!   finished and tells the driver (`finished`, one call for [`REPORT_EVERY`] simulations, or
//!   for the last ones).
//!
//! The driver starts the first `in_flight` simulations in batches (`start`, up to
//! [`START_BATCH`]; no more batches once a search's time is up): the root's owner makes the
//! batch's selections at the root one after the other, each counting its virtual loss, and the
//! steps they lead to follow. The rest of the budget goes with the first batch: the root's
//! owner starts one more for each simulation that finishes (in the handler it finished in, up to
//! `REFILLS_IN_A_HANDLER`; the rest by one [`Refill`] call to itself as the handler ends), so
//! `in_flight` stay in flight without the driver, who is woken only by the reports (and by its
//! clock, to [`Halt`] a search out of time).
//!
//! A step whose next node is owned by the same worker is taken there and then, in the same
//! handler: only moves between owners are calls (with one worker, the calls are the driver's
//! first batches and the reports). The number of local steps is reported beside the calls
//! ([`Driver::traffic`]).
//!
//! Where a node lives is decided once, when its edge is first taken: the edge keeps the member
//! that holds its child, and each step of a path the member that holds its node, so selections
//! follow the edge and results go back up to the step's member without the placement being
//! worked out again. Down to [`SearchSettings::spread_depth`] moves below the root a node goes
//! where its position's hash says ([`Placement`]: the same position, reached by other moves,
//! is the same node); a deeper node stays with its parent's owner, so the steps of a deep
//! search below that depth are taken without calls (a 3-s search on 11x11 Hex, 2 workers,
//! spread depth 2: 2.25 calls per rollout against 4.0 with every node placed by its hash),
//! the subtrees below the depth spread over the workers by their roots' hashes, and a
//! position reached through two of them is two nodes when their owners differ. Every node is
//! placed by its hash by default.
//!
//! Every member runs its handlers one at a time, so a worker's tree needs no lock beyond the
//! short one that makes the handlers `Sync`.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferromq_core::Message;
use ferromq_rpc::{CallError, Handlers, Invocation, Procedure, Rpc};
use serde::{Deserialize, Serialize};

use crate::game::{Game, Outcome, Rng};
use crate::ucb::{Arms, NodeMap};

/// One step of a simulation's path: a node and the edge taken from it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Step {
    node: u64,
    edge: u16,
    /// The member that holds `node` (where the result goes back up to).
    owner: u32,
}

/// Selection continues at `node`.
#[derive(Debug, Serialize, Deserialize)]
pub struct SelectArgs {
    node: u64,
    #[serde(with = "path_wire")]
    path: Vec<Step>,
}

/// `count` new simulations, each starting with a selection at the root, `node`; and `refill`
/// more that the root's owner starts itself, one as each simulation finishes, to keep as many
/// in flight without the driver.
#[derive(Debug, Serialize, Deserialize)]
pub struct StartArgs {
    node: u64,
    count: u32,
    refill: u64,
}

/// `count` simulations of the refill, each starting with a selection at the root, `node`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RefillArgs {
    node: u64,
    count: u32,
}

/// Simulations finished (at the root's owner), with their playouts.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FinishedArgs {
    simulations: u32,
    playouts: u64,
}

/// The result of a simulation going up: at the last node of `path`.
#[derive(Debug, Serialize, Deserialize)]
pub struct BackupArgs {
    #[serde(with = "path_wire")]
    path: Vec<Step>,
    /// Summed scores of the playouts for player 0 and 1.
    scores: [f64; 2],
    playouts: u32,
    /// The first step up from a node just created: its edge becomes present.
    created: bool,
}

/// Statistics of a root edge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EdgeStats<M> {
    /// The move.
    pub mv: M,
    /// Playouts through it.
    pub visits: u64,
    /// Their summed score for the player who makes the move.
    pub score: f64,
}

macro_rules! procedure {
    ($(#[$doc:meta])* $name:ident, $wire:literal, $args:ty, $output:ty) => {
        $(#[$doc])*
        pub struct $name<G>(PhantomData<G>);
        impl<G: Game> Procedure for $name<G> {
            const NAME: &'static str = $wire;
            type Args = $args;
            type Output = $output;
        }
    };
}

procedure!(
    /// Selection at a node.
    Select, "mcts-select", SelectArgs, ()
);
procedure!(
    /// A child made at its owner (the position is the buffer), then evaluated.
    Create, "mcts-create", SelectArgs, ()
);
procedure!(
    /// The root made at its owner (the position is the buffer).
    Plant, "mcts-plant", u64, ()
);
procedure!(
    /// A simulation's result going up.
    Backup, "mcts-backup", BackupArgs, ()
);
procedure!(
    /// New simulations (from the driver, to the root's owner).
    Start, "mcts-start", StartArgs, ()
);
procedure!(
    /// Simulations finished (to the driver), with their playouts.
    Finished, "mcts-finished", FinishedArgs, ()
);
procedure!(
    /// New simulations of the refill (the root's owner to itself).
    Refill, "mcts-refill", RefillArgs, ()
);
procedure!(
    /// The root's owner starts no more simulations of its own (a search out of time): how
    /// many it started in this search.
    Halt, "mcts-halt", (), u64
);
procedure!(
    /// Forget the tree: a new search from the root with this hash.
    Reset, "mcts-reset", u64, ()
);
procedure!(
    /// The root's edges.
    RootStats, "mcts-root-stats", u64, Vec<EdgeStats<G::Move>>
);
procedure!(
    /// Virtual losses still counted and selections still deferred, over the worker's nodes.
    Pending, "mcts-pending", (), (u64, u64)
);
procedure!(
    /// Records sent by the member, how many travelled with others, the steps it took without a
    /// call, and the frames the records travelled in (for the report).
    TrafficOf, "mcts-traffic", (), (u64, u64, u64, u64)
);

/// What a search group's members sent and did ([`Driver::traffic`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Records (calls, returns, confirmations) sent.
    pub records: u64,
    /// Frames they travelled in (records ÷ frames: how well the calls were packed).
    pub frames: u64,
    /// Of those, the ones that travelled in a frame with others.
    pub aggregated: u64,
    /// Simulation steps taken at the worker that owned the next node too, without a call.
    pub local_steps: u64,
}

/// An edge out of a node that selection has taken; its counts are the node's [`Arms`].
struct Edge {
    child: u64,
    /// The member that holds the child.
    owner: u32,
    /// Simulations on their way below it (each counted on its arm as a playout that scored
    /// nothing, until its result comes up).
    virtual_loss: u32,
    state: ChildState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChildState {
    Absent,
    Creating,
    Present,
}

struct Node<G: Game> {
    position: G,
    /// The moves and the statistics of their edges, made on the first selection. Boxed, so
    /// that an entry of the hash map the nodes live in is 64 bytes instead of 144 (rehashing
    /// moves entries; a lookup touches one cache line).
    edges: Option<Box<Expanded<G::Move>>>,
}

/// A node's edges: one per legal move, the `Edge` of each made when selection first takes it
/// (in order, as [`Arms`] hands untried edges out), so that the many nodes a search leaves
/// after a few selections cost their moves and not a hundred edges each.
struct Expanded<M> {
    moves: Vec<M>,
    /// The edges of `moves[..edges.len()]`.
    edges: Vec<Edge>,
    arms: Arms,
}

/// The search settings every worker uses.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SearchSettings {
    /// Random games per new node.
    pub playouts: u32,
    /// UCB's exploration constant.
    pub exploration: f64,
    /// Nodes down to this many moves below the root are placed by their position's hash
    /// ([`Placement`]); a deeper node is held by its parent's owner, so the steps below that
    /// depth are taken without a call. [`SearchSettings::SPREAD_EVERYWHERE`] (the default):
    /// every node by its hash. See the module docs.
    pub spread_depth: u32,
}

impl SearchSettings {
    /// [`SearchSettings::spread_depth`] for "every node placed by its hash".
    pub const SPREAD_EVERYWHERE: u32 = u32::MAX;

    /// The most [`SearchSettings::playouts`] a search takes. A simulation's playouts run in
    /// one handler, which neither a search's time nor a halt interrupts, so they bound how far
    /// a timed search can overrun: this many on the largest Hex board take about 0.09 s in a
    /// release build (performance log, "Distributed MCTS"), where 10^9 would take ~23 minutes.
    pub const MAX_PLAYOUTS: u32 = 1 << 16;
}

impl Default for SearchSettings {
    fn default() -> SearchSettings {
        SearchSettings {
            playouts: 16,
            exploration: 1.0,
            spread_depth: SearchSettings::SPREAD_EVERYWHERE,
        }
    }
}

/// Which member owns the node of a position, by its Zobrist hash: the workers are members
/// 1..=n, and the root's owner, whom every simulation passes twice, holds fewer of the others.
///
/// Every simulation starts and ends at the root's owner (the selection at the root, the
/// backup into it, the report to the driver). On 16 cores (2026-11-27, 8 workers, 16
/// playouts, the time each worker spent in its handlers measured) those handlers cost ~0.8 µs
/// per rollout, and a rollout cost a worker ~3.5 µs plus ~0.7 µs per playout of handler time.
/// With 1 in n of its share (the rule before) the root's owner spent 30-40 % of its time in
/// handlers against 65-80 % at the others. So from 8 workers up the root's owner keeps the
/// share of its nodes that evens the handler loads, `1 - (n - 1) * 0.8 / (3.5 + 0.7 *
/// playouts)`, none when that is below zero (8 workers with 1 playout); the nodes it gives up
/// are spread evenly over the others. Below 8 workers it keeps them all: every node it gives up
/// makes steps that were local calls, and where the processes share cores (2 workers on 2)
/// that cost more than the evened load gained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    n_workers: u64,
    root: u64,
    root_owner: usize,
    /// Of the nodes that hash to the root's owner, those it keeps, in 1024ths.
    root_keeps: u64,
}

impl Placement {
    /// Workers from which the root's owner holds fewer nodes.
    pub const LIGHTER_ROOT_FROM: u64 = 8;

    /// The placement over `n_workers` workers (at least 1) of a search from the position
    /// hashed `root`, each new node evaluated with `playouts` random games.
    pub fn new(n_workers: usize, root: u64, playouts: u32) -> Placement {
        let n_workers = n_workers.max(1) as u64;
        Placement {
            n_workers,
            root,
            root_owner: Self::owner_of_root(n_workers as usize, root),
            root_keeps: Self::root_keeps(n_workers, playouts),
        }
    }

    /// The member that owns the root hashed `root` among `n_workers` workers (at least 1).
    pub fn owner_of_root(n_workers: usize, root: u64) -> usize {
        1 + (root % n_workers.max(1) as u64) as usize
    }

    /// The share of its nodes the root's owner keeps, in 1024ths (see the type's docs).
    fn root_keeps(n_workers: u64, playouts: u32) -> u64 {
        if n_workers < Self::LIGHTER_ROOT_FROM {
            return 1024;
        }
        // In tenths of a microsecond: the root's work per rollout, a rollout's at a worker.
        let root_work = 8 * (n_workers - 1);
        let rollout_work = 35 + 7 * u64::from(playouts.max(1));
        1024 * rollout_work.saturating_sub(root_work) / rollout_work
    }

    /// The same workers and playouts, for a search from the position hashed `root`.
    pub fn rooted_at(&self, root: u64) -> Placement {
        Placement {
            root,
            root_owner: Self::owner_of_root(self.n_workers as usize, root),
            ..*self
        }
    }

    /// The member that owns the root.
    pub fn root_owner(&self) -> usize {
        self.root_owner
    }

    /// The member that owns the node of the position hashed `hash`.
    pub fn owner(&self, hash: u64) -> usize {
        let n = self.n_workers;
        let first = 1 + (hash % n) as usize;
        if first != self.root_owner
            || hash == self.root
            || mixed(hash, 0x9e37_79b9_7f4a_7c15) % 1024 < self.root_keeps
        {
            return first;
        }
        // One of the other workers, by other bits of the hash.
        let other = 1 + (mixed(hash, 0xc2b2_ae3d_27d4_eb4f) % (n - 1)) as usize;
        if other >= self.root_owner {
            other + 1
        } else {
            other
        }
    }
}

/// The high half of `hash` times an odd `factor`: bits that do not follow `hash % n` (a
/// rotation's residues do, for every `n` that divides 2^64 - 1, such as 3 and 5).
fn mixed(hash: u64, factor: u64) -> u64 {
    hash.wrapping_mul(factor) >> 32
}

/// The next step of a simulation, at the member it names: taken at once when that is this
/// worker, else a call made once the handler's lock is released.
enum Outgoing<G> {
    Select(usize, SelectArgs),
    Create(usize, SelectArgs, G),
    Backup(usize, BackupArgs),
    Finished(u32),
}

struct WorkerState<G: Game> {
    nodes: NodeMap<Node<G>>,
    /// Paths of simulations waiting at (node, edge) for the child to be created (rare: kept
    /// apart from the edges, which a node has a hundred of).
    deferred: HashMap<(u64, u16), Vec<Vec<Step>>>,
    settings: SearchSettings,
    /// Where the nodes of the current search live (its root set by `reset`).
    placement: Placement,
    rng: Rng,
    /// Steps taken here without a call, since the worker started.
    local_steps: u64,
    /// This worker's member index (set as each handler starts).
    me: usize,
    /// The steps a handler has yet to take and the calls it will make: kept from one handler
    /// to the next. Two fresh lists grown in every handler (a `start` batch's reach kilobytes)
    /// were a third of the workers' time in the allocator (`perf`, 2 workers, 1 playout: 17 %
    /// of all samples in malloc and free before, 11 % after).
    work: Vec<Outgoing<G>>,
    calls: Vec<Outgoing<G>>,
    /// The largest encoded position so far: a created node's position is encoded into a
    /// buffer this size, not one grown from nothing (six reallocations for 11x11 Hex).
    position_bytes: usize,
    /// At the root's owner, where every simulation starts and finishes: what it keeps going
    /// of the search and has yet to report.
    root_work: RootWork,
}

/// The root's owner's share of a search. The driver starts the first simulations (`start`)
/// and hands the rest of the budget over (`refill`); the root's owner starts one of those for
/// each simulation that finishes and reports the finished ones in batches. A handler starts
/// up to `REFILLS_IN_A_HANDLER` of them itself and owes the rest to a call to itself at its
/// end ([`Refill`]): with every step local (one worker) a handler that started them all would
/// go on until the budget was spent, and answer nothing meanwhile (not the driver's `halt`).
/// Before, every simulation that finished went back to the driver and the driver started the
/// next: with 2 workers on 2 cores (11x11, 16 playouts) the driver was woken ~3 300 times a
/// second, ~9 % of a core taken from the workers, each wake-up a worker preempted.
#[derive(Debug, Default)]
struct RootWork {
    /// Simulations the root's owner may still start itself.
    refill: u64,
    /// Simulations it started itself in this search (for [`Halt`]).
    refilled: u64,
    /// Simulations started or owed and not finished.
    running: u64,
    /// Simulations of the refill owed: started in the handler up to its bound, the rest by the
    /// [`Refill`] call the handler ends with.
    owed: u32,
    /// Finished and not yet reported to the driver.
    unreported: FinishedArgs,
}

/// Finished simulations the root's owner reports in one call at the least, unless none is left
/// running: the driver hears of the search's end at once, of its progress a few hundred times
/// a second.
pub const REPORT_EVERY: u32 = 256;

impl RootWork {
    /// A simulation that used `playouts` finished; another is owed while the refill lasts.
    fn finished(&mut self, playouts: u32) {
        self.running = self.running.saturating_sub(1);
        self.unreported.simulations += 1;
        self.unreported.playouts += u64::from(playouts);
        if self.refill > 0 {
            self.refill -= 1;
            self.refilled += 1;
            self.running += 1;
            self.owed += 1;
        }
    }

    /// One simulation owed, to start here and now: false when none is.
    fn take_one_owed(&mut self) -> bool {
        let owed = self.owed > 0;
        self.owed -= u32::from(owed);
        owed
    }

    /// The simulations owed, to start now.
    fn take_owed(&mut self) -> u32 {
        std::mem::take(&mut self.owed)
    }

    /// The finished simulations to report now, if it is time.
    fn report(&mut self) -> Option<FinishedArgs> {
        let due = self.unreported.simulations >= REPORT_EVERY
            || (self.unreported.simulations > 0 && self.running == 0);
        due.then(|| std::mem::take(&mut self.unreported))
    }
}

/// Simulations of the refill a handler starts itself at the most, as others finish in it; the
/// rest it owes to its [`Refill`] call. A call to itself per finished simulation costs a
/// record and a turn of the dispatcher each; with no bound a handler whose steps are all local
/// (one worker) would run until the budget was spent.
const REFILLS_IN_A_HANDLER: u32 = 32;

/// Paths a worker keeps for reuse at the most.
const MAX_SPARE_PATHS: usize = 1024;

thread_local! {
    /// Emptied paths, for the next simulations to start with and for paths that arrive to be
    /// decoded into: a path per rollout from the allocator, grown as it went down, was a malloc
    /// and a realloc of the ~3 per rollout, and every step between workers freed one at the
    /// caller and made one at the callee. Kept per thread, not in [`WorkerState`]: a path is
    /// decoded before its handler takes the state's lock, on the thread that runs the handler.
    static SPARE_PATHS: std::cell::RefCell<Vec<Vec<Step>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty path, kept from a finished simulation or a call sent when there is one.
fn spare_path() -> Vec<Step> {
    SPARE_PATHS
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| Vec::with_capacity(8))
}

/// Keeps `path` (emptied) for a later [`spare_path`].
fn recycle_path(mut path: Vec<Step>) {
    SPARE_PATHS.with_borrow_mut(|spare| {
        if spare.len() < MAX_SPARE_PATHS {
            path.clear();
            spare.push(path);
        }
    });
}

/// A path travels as one byte string, fourteen bytes a step (the node's hash, the edge and the
/// node's owner, little endian), decoded into a [`spare_path`]: a step between workers carries
/// the path, and decoding element by element (a hash as a 10-byte varint) into fresh lists,
/// with the allocator's share, was ~40 % of the CPU a second worker added per rollout (`perf`,
/// 11x11, 16 playouts, 1 and 2 workers; paths and positions together).
mod path_wire {
    use serde::{Deserializer, Serializer, de};

    use super::{Step, spare_path};

    const STEP_BYTES: usize = 14;
    /// Paths up to this long are encoded on the stack.
    const ON_STACK: usize = 16;

    pub fn serialize<S: Serializer>(path: &[Step], serializer: S) -> Result<S::Ok, S::Error> {
        let encode = |bytes: &mut [u8]| {
            for (step, at) in path.iter().zip(bytes.chunks_exact_mut(STEP_BYTES)) {
                at[..8].copy_from_slice(&step.node.to_le_bytes());
                at[8..10].copy_from_slice(&step.edge.to_le_bytes());
                at[10..].copy_from_slice(&step.owner.to_le_bytes());
            }
        };
        let len = path.len() * STEP_BYTES;
        if path.len() <= ON_STACK {
            let mut bytes = [0u8; ON_STACK * STEP_BYTES];
            encode(&mut bytes[..len]);
            serializer.serialize_bytes(&bytes[..len])
        } else {
            let mut bytes = vec![0u8; len];
            encode(&mut bytes);
            serializer.serialize_bytes(&bytes)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Step>, D::Error> {
        struct Path;
        impl de::Visitor<'_> for Path {
            type Value = Vec<Step>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(formatter, "a simulation's path, {STEP_BYTES} bytes a step")
            }

            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<Step>, E> {
                if !bytes.len().is_multiple_of(STEP_BYTES) {
                    return Err(E::invalid_length(bytes.len(), &self));
                }
                let mut path = spare_path();
                path.extend(bytes.chunks_exact(STEP_BYTES).map(|at| {
                    let (node, rest) = at.split_at(8);
                    let (edge, owner) = rest.split_at(2);
                    Step {
                        node: u64::from_le_bytes(node.try_into().expect("8 bytes")),
                        edge: u16::from_le_bytes(edge.try_into().expect("2 bytes")),
                        owner: u32::from_le_bytes(owner.try_into().expect("4 bytes")),
                    }
                }));
                Ok(path)
            }
        }
        deserializer.deserialize_bytes(Path)
    }
}

impl<G: Game> WorkerState<G> {
    fn new(settings: SearchSettings, placement: Placement, seed: u64) -> WorkerState<G> {
        WorkerState {
            nodes: NodeMap::default(),
            deferred: HashMap::new(),
            settings,
            placement,
            rng: Rng::new(seed),
            local_steps: 0,
            me: 0,
            work: Vec::new(),
            calls: Vec::new(),
            position_bytes: 0,
            root_work: RootWork::default(),
        }
    }

    /// One step of a simulation (`take`) and the steps it leads to at this worker (member
    /// `me`): returns the calls to the others, in the worker's kept list (handed back in
    /// `calls` once they are made).
    fn take_step(
        &mut self,
        me: usize,
        take: impl FnOnce(&mut Self, &mut Vec<Outgoing<G>>),
    ) -> Vec<Outgoing<G>> {
        self.me = me;
        let mut work = std::mem::take(&mut self.work);
        let mut calls = std::mem::take(&mut self.calls);
        take(self, &mut work);
        self.settle(me, &mut work, &mut calls);
        self.work = work;
        calls
    }

    /// Takes the steps of `work` that stay at this worker (member `me`), and those they lead
    /// to, until `work` is empty: the steps elsewhere go to `calls`.
    fn settle(&mut self, me: usize, work: &mut Vec<Outgoing<G>>, calls: &mut Vec<Outgoing<G>>) {
        let mut refills_here = 0;
        while let Some(step) = work.pop() {
            match step {
                Outgoing::Select(dest, args) if dest == me => self.select(args, work),
                Outgoing::Create(dest, args, position) if dest == me => {
                    self.create(args, position, work)
                }
                Outgoing::Backup(dest, args) if dest == me => self.backup(args, work),
                Outgoing::Finished(playouts) => {
                    self.root_work.finished(playouts);
                    if refills_here < REFILLS_IN_A_HANDLER && self.root_work.take_one_owed() {
                        refills_here += 1;
                        let root = self.placement.root;
                        self.start_at(root, 1, work);
                    }
                    continue;
                }
                elsewhere => {
                    calls.push(elsewhere);
                    continue;
                }
            }
            self.local_steps += 1;
        }
    }

    /// `count` new simulations, each a selection at `root` (this worker's), one after the other.
    fn start_at(&mut self, root: u64, count: u32, out: &mut Vec<Outgoing<G>>) {
        for _ in 0..count {
            let args = SelectArgs {
                node: root,
                path: spare_path(),
            };
            self.select(args, out);
        }
    }

    fn select(&mut self, args: SelectArgs, out: &mut Vec<Outgoing<G>>) {
        let SelectArgs {
            node: hash,
            mut path,
        } = args;
        let Some(node) = self.nodes.get_mut(&hash) else {
            tracing::error!(
                node = hash,
                "selection reached a node this worker does not have"
            );
            return;
        };
        if let Some(outcome) = node.position.outcome() {
            // A finished game: its result is exact, no playout needed.
            let scores = [outcome.score(0), outcome.score(1)];
            out.push(self.up(path, scores, 1, false));
            return;
        }
        let position = &node.position;
        let Expanded { moves, edges, arms } = &mut **node.edges.get_or_insert_with(|| {
            let mut moves = Vec::new();
            position.legal_moves(&mut moves);
            let arms = Arms::new(moves.len());
            Box::new(Expanded {
                moves,
                edges: Vec::new(),
                arms,
            })
        });
        let Some(edge_idx) = arms.choose(self.settings.exploration) else {
            // A game that goes on without a legal move (a bug in the game): scored as a draw so
            // that the simulation still ends.
            tracing::error!(node = hash, "a position that is not over has no legal move");
            out.push(self.up(path, [0.5, 0.5], 1, false));
            return;
        };
        // The virtual loss: a playout that scored nothing, until the result comes up.
        arms.add(edge_idx, 1, 0.0);
        let mv = moves[edge_idx];
        if edge_idx == edges.len() {
            // Taken for the first time (untried edges are handed out in order).
            let child = position.hash_after(mv);
            // `path` holds the steps above this node: its depth below the root.
            let owner = if path.len() >= self.settings.spread_depth as usize {
                self.me
            } else {
                self.placement.owner(child)
            };
            edges.push(Edge {
                child,
                owner: owner as u32,
                virtual_loss: 0,
                state: ChildState::Absent,
            });
        }
        let edge = &mut edges[edge_idx];
        edge.virtual_loss += 1;
        path.push(Step {
            node: hash,
            edge: edge_idx as u16,
            owner: self.me as u32,
        });
        let child = edge.child;
        let dest = edge.owner as usize;
        match edge.state {
            ChildState::Present => {
                out.push(Outgoing::Select(dest, SelectArgs { node: child, path }))
            }
            ChildState::Creating => self
                .deferred
                .entry((hash, edge_idx as u16))
                .or_default()
                .push(path),
            ChildState::Absent => {
                edge.state = ChildState::Creating;
                let mut position = node.position.clone();
                position.play(mv);
                out.push(Outgoing::Create(
                    dest,
                    SelectArgs { node: child, path },
                    position,
                ));
            }
        }
    }

    fn create(&mut self, args: SelectArgs, position: G, out: &mut Vec<Outgoing<G>>) {
        let playouts = self.settings.playouts.max(1);
        let mut scores = [0.0; 2];
        for _ in 0..playouts {
            let outcome: Outcome = position.random_playout(&mut self.rng);
            scores[0] += outcome.score(0);
            scores[1] += outcome.score(1);
        }
        self.nodes.entry(args.node).or_insert_with(|| Node {
            position,
            edges: None,
        });
        out.push(self.up(args.path, scores, playouts, true));
    }

    /// The call that takes a result one step up `path`.
    fn up(
        &mut self,
        path: Vec<Step>,
        scores: [f64; 2],
        playouts: u32,
        created: bool,
    ) -> Outgoing<G> {
        match path.last() {
            Some(step) => Outgoing::Backup(
                step.owner as usize,
                BackupArgs {
                    path,
                    scores,
                    playouts,
                    created,
                },
            ),
            None => {
                recycle_path(path);
                Outgoing::Finished(playouts)
            }
        }
    }

    fn backup(&mut self, args: BackupArgs, out: &mut Vec<Outgoing<G>>) {
        let BackupArgs {
            mut path,
            scores,
            playouts,
            created,
        } = args;
        let Some(step) = path.pop() else {
            recycle_path(path);
            out.push(Outgoing::Finished(playouts));
            return;
        };
        let Some(node) = self.nodes.get_mut(&step.node) else {
            tracing::error!(
                node = step.node,
                "a result came up to a node this worker does not have"
            );
            return;
        };
        let mover = node.position.to_move();
        let edge_idx = usize::from(step.edge);
        let Some((edge, arms)) = node
            .edges
            .as_mut()
            .and_then(|expanded| Some((expanded.edges.get_mut(edge_idx)?, &mut expanded.arms)))
        else {
            tracing::error!(
                node = step.node,
                edge = step.edge,
                "a result came up an edge that does not exist"
            );
            return;
        };
        if edge.virtual_loss > 0 {
            edge.virtual_loss -= 1;
            arms.take_back(edge_idx, 1);
        }
        arms.add(edge_idx, u64::from(playouts), scores[usize::from(mover)]);
        if created && edge.state == ChildState::Creating {
            edge.state = ChildState::Present;
            let dest = edge.owner as usize;
            let waiting = self.deferred.remove(&(step.node, step.edge));
            for waiting in waiting.into_iter().flatten() {
                out.push(Outgoing::Select(
                    dest,
                    SelectArgs {
                        node: edge.child,
                        path: waiting,
                    },
                ));
            }
        }
        out.push(self.up(path, scores, playouts, false));
    }
}

/// Makes the calls a handler decided on (`outgoing`, emptied); they queue (a handler never
/// waits for room). At the root's owner, the finished simulations go to the driver in one call
/// when their report is due ([`RootWork::report`]).
fn send<G: Game>(rpc: &Rpc, outgoing: &mut Vec<Outgoing<G>>, state: &mut WorkerState<G>) {
    for call in outgoing.drain(..) {
        let (sent, path) = match call {
            Outgoing::Select(dest, args) => (rpc.queue_call::<Select<G>>(dest, &args), args.path),
            Outgoing::Create(dest, args, position) => {
                match postcard::to_extend(&position, Vec::with_capacity(state.position_bytes)) {
                    Ok(bytes) => {
                        state.position_bytes = state.position_bytes.max(bytes.len());
                        let buffer = Message::from(bytes);
                        (
                            rpc.queue_call_buffer::<Create<G>>(dest, &args, buffer),
                            args.path,
                        )
                    }
                    Err(error) => {
                        tracing::error!(%error, "a new node's position does not encode");
                        continue;
                    }
                }
            }
            Outgoing::Backup(dest, args) => (rpc.queue_call::<Backup<G>>(dest, &args), args.path),
            // Counted where it finished (`settle`), never a call of its own.
            Outgoing::Finished(_) => continue,
        };
        // The path was encoded as the call was queued: the list is kept for another.
        recycle_path(path);
        if let Err(error) = sent {
            not_made(&error, "a search call could not be made");
        }
    }
    let owed = state.root_work.take_owed();
    if owed > 0 {
        let refill = RefillArgs {
            node: state.placement.root,
            count: owed,
        };
        if let Err(error) = rpc.queue_call::<Refill<G>>(rpc.me(), &refill) {
            not_made(&error, "the refill could not be started");
        }
    }
    if let Some(finished) = state.root_work.report()
        && let Err(error) = rpc.queue_call::<Finished<G>>(0, &finished)
    {
        not_made(&error, "finished simulations could not be reported");
    }
}

/// Logs a call a handler could not make. One refused because this member is shutting down is
/// the search being abandoned (a stop of the group: the handlers serve calls already in flight
/// until the member's dispatcher stops), no error.
fn not_made(error: &CallError, what: &str) {
    if matches!(error, CallError::Stopped) {
        tracing::debug!(%error, "{what} (the member is shutting down)");
    } else {
        tracing::error!(%error, "{what}");
    }
}

/// The handlers of a worker member of a group of `n_workers` workers (members 1..=n).
pub fn worker_handlers<G: Game>(n_workers: usize, settings: SearchSettings, seed: u64) -> Handlers {
    let state = Arc::new(Mutex::new(WorkerState::<G>::new(
        settings,
        Placement::new(n_workers, 0, settings.playouts),
        seed,
    )));
    let (on_select, on_start, on_create, on_plant, on_backup, on_reset, on_stats, on_pending) = (
        Arc::clone(&state),
        Arc::clone(&state),
        Arc::clone(&state),
        Arc::clone(&state),
        Arc::clone(&state),
        Arc::clone(&state),
        Arc::clone(&state),
        Arc::clone(&state),
    );
    let on_traffic = Arc::clone(&state);
    let on_halt = Arc::clone(&state);
    let on_refill = Arc::clone(&state);
    fn guard<G: Game>(state: &Mutex<WorkerState<G>>) -> std::sync::MutexGuard<'_, WorkerState<G>> {
        state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    /// One step of a simulation (`take`), the steps it leads to at this worker, then the calls
    /// to the others. The lock is held throughout: a member runs one handler at a time, so
    /// nothing waits for it, and queueing a call never waits.
    fn step<G: Game>(
        state: &Mutex<WorkerState<G>>,
        rpc: &Rpc,
        take: impl FnOnce(&mut WorkerState<G>, &mut Vec<Outgoing<G>>),
    ) {
        let mut state = guard(state);
        let mut calls = state.take_step(rpc.me(), take);
        send::<G>(rpc, &mut calls, &mut state);
        state.calls = calls;
    }
    Handlers::new()
        .on_sync::<Select<G>, _>(move |invocation: &Invocation, args| {
            step(&on_select, invocation.rpc(), |state, out| {
                state.select(args, out)
            });
        })
        .on_sync::<Start<G>, _>(move |invocation: &Invocation, args| {
            step(&on_start, invocation.rpc(), |state, out| {
                state.root_work.running += u64::from(args.count);
                state.root_work.refill = state.root_work.refill.saturating_add(args.refill);
                state.start_at(args.node, args.count, out)
            });
        })
        .on_sync::<Refill<G>, _>(move |invocation: &Invocation, args| {
            step(&on_refill, invocation.rpc(), |state, out| {
                state.start_at(args.node, args.count, out)
            });
        })
        .on_buffer_sync::<Create<G>, _>(move |invocation: &Invocation, args, buffer: Message| {
            match postcard::from_bytes::<G>(buffer.data()) {
                Ok(position) => step(&on_create, invocation.rpc(), |state, out| {
                    state.create(args, position, out)
                }),
                Err(error) => tracing::error!(%error, "a created node's position does not decode"),
            }
        })
        .on_buffer::<Plant<G>, _, _>(move |_, hash, buffer: Message| {
            match postcard::from_bytes::<G>(buffer.data()) {
                Ok(position) => {
                    guard(&on_plant).nodes.entry(hash).or_insert_with(|| Node {
                        position,
                        edges: None,
                    });
                }
                Err(error) => tracing::error!(%error, "the root's position does not decode"),
            }
            std::future::ready(())
        })
        .on_sync::<Backup<G>, _>(move |invocation: &Invocation, args| {
            step(&on_backup, invocation.rpc(), |state, out| {
                state.backup(args, out)
            });
        })
        .on::<Reset<G>, _, _>(move |_, root| {
            let mut state = guard(&on_reset);
            state.nodes.clear();
            state.deferred.clear();
            state.placement = state.placement.rooted_at(root);
            state.root_work = RootWork::default();
            std::future::ready(())
        })
        .on::<Halt<G>, _, _>(move |_, ()| {
            let mut state = guard(&on_halt);
            state.root_work.refill = 0;
            std::future::ready(state.root_work.refilled)
        })
        .on::<RootStats<G>, _, _>(move |_, hash| {
            let state = guard(&on_stats);
            let edges = state
                .nodes
                .get(&hash)
                .and_then(|node| node.edges.as_ref())
                .map(|expanded| {
                    let virtual_loss = |idx| {
                        expanded
                            .edges
                            .get(idx)
                            .map_or(0, |edge: &Edge| edge.virtual_loss)
                    };
                    expanded
                        .moves
                        .iter()
                        .zip(expanded.arms.iter())
                        .enumerate()
                        .map(|(idx, (&mv, arm))| EdgeStats {
                            mv,
                            visits: arm.n() - u64::from(virtual_loss(idx)),
                            score: arm.score(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            std::future::ready(edges)
        })
        .on::<Pending<G>, _, _>(move |_, ()| {
            let state = guard(&on_pending);
            let mut pending = (0, 0);
            for edge in state
                .nodes
                .values()
                .filter_map(|node| node.edges.as_ref())
                .flat_map(|expanded| &expanded.edges)
            {
                pending.0 += u64::from(edge.virtual_loss);
            }
            pending.1 = state
                .deferred
                .values()
                .map(|paths| paths.len() as u64)
                .sum();
            std::future::ready(pending)
        })
        .on::<TrafficOf<G>, _, _>(move |invocation: Invocation, ()| {
            let stats = invocation.rpc().stats();
            let local_steps = guard(&on_traffic).local_steps;
            std::future::ready((
                stats.records,
                stats.aggregated_records,
                local_steps,
                stats.frames,
            ))
        })
}

/// What the driver counts: simulations and playouts finished.
#[derive(Default)]
pub struct DriverCounts {
    simulations: AtomicU64,
    playouts: AtomicU64,
    done: tokio::sync::Notify,
}

/// The handlers of the driver (member 0).
pub fn driver_handlers<G: Game>(counts: &Arc<DriverCounts>) -> Handlers {
    let finished = Arc::clone(counts);
    Handlers::new()
        .on::<Finished<G>, _, _>(move |_, args: FinishedArgs| {
            finished
                .simulations
                .fetch_add(u64::from(args.simulations), Ordering::Relaxed);
            finished
                .playouts
                .fetch_add(args.playouts, Ordering::Relaxed);
            finished.done.notify_one();
            std::future::ready(())
        })
        .on::<TrafficOf<G>, _, _>(|invocation: Invocation, ()| {
            let stats = invocation.rpc().stats();
            std::future::ready((stats.records, stats.aggregated_records, 0, stats.frames))
        })
}

/// One search's result.
#[derive(Debug, Clone)]
pub struct SearchResult<M> {
    /// The most visited root move.
    pub best_move: Option<M>,
    /// The root's edges.
    pub root: Vec<EdgeStats<M>>,
    /// Simulations finished (exactly the budget).
    pub rollouts: u64,
    /// Random games played.
    pub playouts: u64,
    /// Wall time of the search.
    pub seconds: f64,
}

/// Why a search failed.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// A call failed (a worker gone, ...).
    #[error(transparent)]
    Call(#[from] CallError),
    /// No simulation finished for the timeout; the named workers did not answer.
    #[error("the search stalled: no simulation finished for {after:?}; not answering: {silent}")]
    Stalled {
        /// The timeout.
        after: Duration,
        /// The members that did not answer, by name.
        silent: String,
    },
}

/// Simulations the driver keeps in flight per worker unless told otherwise.
///
/// A simulation waits in its worker's queue and in the frames its calls travel in; with too few
/// in flight a worker runs dry. On 11x11 with one worker and one playout per rollout (a
/// rollout ~3 µs of tree and game; measured when the driver still started every simulation),
/// 64 in flight gave 124 k rollouts/s,
/// 128 179 k, 256 213 k, 512 240 k; with two workers and 16 playouts 64 gave 57-63 k and 256
/// 71-77 k. More in flight spread the search wider (each counts a virtual loss), so the default
/// stops at 256. 512 (2026-11-27, 07c202b) made 8 workers on 16 cores 1.06-1.10x as fast
/// (their calls travel in larger frames: 22 a frame instead of 18) but cost strength: the
/// distributed search won 148 of 400 games (37 %) against the single-process one (9x9, 20 000
/// rollouts a move, 2 workers), against 46 % with 256.
pub const IN_FLIGHT_PER_WORKER: usize = 256;

/// Simulations the driver starts with one call at most (the first `in_flight` of a search).
///
/// The root's owner runs a batch's selections at the root in one handler, and with one worker,
/// whose steps are all local, the whole simulations too: smaller batches let the first ones
/// finish, and the root's owner refill, sooner; larger ones cost fewer records.
pub const START_BATCH: u64 = 32;

/// The driver's side of a group: member 0, the workers 1..=n.
pub struct Driver<G: Game> {
    rpc: Rpc,
    counts: Arc<DriverCounts>,
    n_workers: usize,
    /// Simulations kept in flight (default [`IN_FLIGHT_PER_WORKER`] per worker).
    pub in_flight: usize,
    /// How long the search waits for one simulation before asking who is alive.
    pub stall_timeout: Duration,
    game: PhantomData<G>,
}

impl<G: Game> Driver<G> {
    /// The driver of `rpc`'s group (which `driver_handlers` serves), with `counts`.
    pub fn new(rpc: Rpc, counts: Arc<DriverCounts>) -> Driver<G> {
        let n_workers = rpc.members().len().saturating_sub(1).max(1);
        Driver {
            rpc,
            counts,
            n_workers,
            in_flight: IN_FLIGHT_PER_WORKER * n_workers,
            stall_timeout: Duration::from_secs(10),
            game: PhantomData,
        }
    }

    /// The member handle.
    pub fn rpc(&self) -> &Rpc {
        &self.rpc
    }

    /// Searches `position` for `rollouts` simulations.
    ///
    /// # Errors
    /// [`SearchError`] naming a worker that is gone.
    pub async fn search(
        &self,
        position: &G,
        rollouts: u64,
    ) -> Result<SearchResult<G::Move>, SearchError> {
        self.search_within(position, rollouts, None).await
    }

    /// Searches `position` for `rollouts` simulations or until `time` has passed, whichever
    /// comes first (then the simulations in flight finish, and count).
    ///
    /// # Errors
    /// [`SearchError`] naming a worker that is gone.
    pub async fn search_within(
        &self,
        position: &G,
        rollouts: u64,
        time: Option<Duration>,
    ) -> Result<SearchResult<G::Move>, SearchError> {
        let rpc = &self.rpc;
        let root = position.hash();
        for worker in 1..=self.n_workers {
            rpc.to(worker)
                .confirm(ferromq_rpc::Confirm::Consumed)
                .call::<Reset<G>>(&root)
                .await?
                .confirmed()
                .await?;
        }
        let root_owner = Placement::owner_of_root(self.n_workers, root);
        let bytes = postcard::to_allocvec(position).unwrap_or_default();
        rpc.call_buffer::<Plant<G>>(root_owner, &root, Message::from(bytes))
            .await?;
        let started_at = Instant::now();
        let base_simulations = self.counts.simulations.load(Ordering::Relaxed);
        let base_playouts = self.counts.playouts.load(Ordering::Relaxed);
        let finished = || self.counts.simulations.load(Ordering::Relaxed) - base_simulations;
        // The first simulations from here, in batches; the rest of the budget the root's owner
        // starts itself as simulations finish (`RootWork`), handed over with the first batch.
        // Out of time, no more batches start: the halt below counts those that did.
        let first = (self.in_flight.max(1) as u64).min(rollouts);
        let out_of_time = || time.is_some_and(|time| started_at.elapsed() >= time);
        let mut started = 0u64;
        while started < first && !(started > 0 && out_of_time()) {
            let count = (first - started).min(START_BATCH);
            let start = StartArgs {
                node: root,
                count: count as u32,
                refill: if started == 0 { rollouts - first } else { 0 },
            };
            rpc.call::<Start<G>>(root_owner, &start).await?;
            started += count;
        }
        let mut rollouts = rollouts;
        let mut halted = false;
        let mut progress = (finished(), Instant::now());
        loop {
            let done = self.counts.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let now_finished = finished();
            if now_finished >= rollouts {
                break;
            }
            if now_finished != progress.0 {
                progress = (now_finished, Instant::now());
            }
            let mut wait = self.stall_timeout.saturating_sub(progress.1.elapsed());
            if let Some(time) = time.filter(|_| !halted) {
                let left = time.saturating_sub(started_at.elapsed());
                if left.is_zero() {
                    // Out of time: no new simulation; those in flight finish, and count.
                    rollouts = started + rpc.call_return::<Halt<G>>(root_owner, &()).await?;
                    halted = true;
                    continue;
                }
                wait = wait.min(left);
            }
            if tokio::time::timeout(wait, done).await.is_err()
                && finished() == progress.0
                && progress.1.elapsed() >= self.stall_timeout
            {
                return Err(self.stalled().await);
            }
        }
        let seconds = started_at.elapsed().as_secs_f64();
        let root_edges = rpc.call_return::<RootStats<G>>(root_owner, &root).await?;
        let best_move = root_edges
            .iter()
            .max_by_key(|edge| edge.visits)
            .map(|edge| edge.mv);
        Ok(SearchResult {
            best_move,
            root: root_edges,
            rollouts: finished(),
            playouts: self.counts.playouts.load(Ordering::Relaxed) - base_playouts,
            seconds,
        })
    }

    async fn stalled(&self) -> SearchError {
        let mut silent = Vec::new();
        for worker in 1..=self.n_workers {
            if self
                .rpc
                .call_return::<Pending<G>>(worker, &())
                .await
                .is_err()
            {
                silent.push(self.rpc.members()[worker].clone());
            }
        }
        SearchError::Stalled {
            after: self.stall_timeout,
            silent: if silent.is_empty() {
                "none (every worker answers)".to_owned()
            } else {
                silent.join(", ")
            },
        }
    }

    /// Virtual losses and deferred selections left over all workers (both 0 after a search).
    ///
    /// # Errors
    /// A worker that does not answer.
    pub async fn pending(&self) -> Result<(u64, u64), CallError> {
        let mut total = (0, 0);
        for worker in 1..=self.n_workers {
            let (virtual_loss, deferred) = self.rpc.call_return::<Pending<G>>(worker, &()).await?;
            total.0 += virtual_loss;
            total.1 += deferred;
        }
        Ok(total)
    }

    /// What every member sent and did since it started, summed.
    ///
    /// # Errors
    /// A member that does not answer.
    pub async fn traffic(&self) -> Result<Traffic, CallError> {
        let mut total = Traffic::default();
        for member in 0..=self.n_workers {
            let (records, aggregated, local_steps, frames) =
                self.rpc.call_return::<TrafficOf<G>>(member, &()).await?;
            total.records += records;
            total.frames += frames;
            total.aggregated += aggregated;
            total.local_steps += local_steps;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that a handler makes once its member shut down (a group whose members stop
    /// together: the handlers serve calls already in flight) is refused as `Stopped`, the
    /// search being abandoned: no error in the log. Any other refusal is one. A Ctrl-C of the
    /// bundled search logged up to a hundred "could not be made" errors.
    #[tokio::test]
    async fn a_call_refused_by_a_member_shutting_down_is_no_error() {
        let logs = ferromq_log_capture::CapturedLogs::start();
        let transport: Arc<dyn ferromq_core::Transport> =
            Arc::new(ferromq_zmq::ZmqTransport::new());
        let address = ferromq_core::Address::parse(&format!(
            "inproc://refused-while-shutting-down-{}",
            std::process::id()
        ))
        .unwrap();
        let inbound = ferromq_rpc::Inbound::bind(transport.as_ref(), &address)
            .await
            .unwrap();
        let members = [ferromq_rpc::Member {
            name: "worker-1".to_owned(),
            address,
        }];
        let rpc = Rpc::start(
            transport,
            0,
            &members,
            inbound,
            Handlers::new(),
            ferromq_rpc::RpcOptions::default(),
        )
        .await
        .unwrap();
        rpc.shutdown().await.unwrap();
        let refill = RefillArgs { node: 1, count: 1 };
        let refused = rpc
            .queue_call::<Refill<crate::tictactoe::TicTacToe>>(0, &refill)
            .unwrap_err();
        assert!(matches!(refused, CallError::Stopped), "{refused}");
        not_made(&refused, "the refill could not be started");
        let text = logs.text();
        assert!(!text.contains("ERROR"), "{text}");
        let unreachable = CallError::Unreachable {
            destination: "worker-2".to_owned(),
            cause: "its channel failed".to_owned(),
        };
        not_made(&unreachable, "a search call could not be made");
        let text = logs.text();
        assert_eq!(text.matches("ERROR").count(), 1, "{text}");
        assert!(text.contains("worker-2"), "{text}");
    }

    #[test]
    fn the_roots_owner_keeps_the_root_and_from_eight_workers_the_share_that_evens_the_loads() {
        let mut rng = crate::Rng::new(7);
        let hashes: Vec<u64> = (0..200_000)
            .map(|_| (rng.below(1 << 32) as u64) << 32 | rng.below(1 << 32) as u64)
            .collect();
        // The share the root's owner keeps from 8 workers up: 1 - (n - 1) * 0.8 / (3.5 + 0.7 *
        // playouts); below, all.
        let expected = |n: usize, playouts: u32| {
            if (n as u64) < Placement::LIGHTER_ROOT_FROM {
                return 1.0;
            }
            (1.0 - (n - 1) as f64 * 0.8 / (3.5 + 0.7 * f64::from(playouts))).max(0.0)
        };
        assert!((expected(8, 16) - 0.62).abs() < 0.01);
        assert_eq!(expected(8, 1), 0.0);
        for playouts in [1, 16] {
            for n in 1..=12usize {
                let root = hashes[n];
                let placement = Placement::new(n, root, playouts);
                assert_eq!(placement.owner(root), placement.root_owner());
                assert_eq!(placement.rooted_at(root), placement);
                let mut held = vec![0usize; n + 1];
                for &hash in &hashes {
                    let owner = placement.owner(hash);
                    assert!((1..=n).contains(&owner), "{n} workers: member {owner}");
                    held[owner] += 1;
                }
                let even = hashes.len() as f64 / n as f64;
                let root_share = held[placement.root_owner()] as f64 / even;
                let keeps = expected(n, playouts);
                assert!(
                    (root_share - keeps).abs() < 0.03,
                    "{n} workers, {playouts} playouts: {root_share} kept, not {keeps}: {held:?}"
                );
                // The rest spread evenly over the others.
                let others = (hashes.len() as f64 - held[placement.root_owner()] as f64)
                    / (n.max(2) - 1) as f64;
                for (member, &count) in held.iter().enumerate().skip(1) {
                    if member != placement.root_owner() {
                        assert!((count as f64 / others - 1.0).abs() < 0.05, "{n}: {held:?}");
                    }
                }
            }
        }
    }

    /// The state of the only worker of a search of empty 5x5 Hex, holding the root; its hash.
    fn one_worker_at_an_empty_5x5_board() -> (WorkerState<crate::hex::Hex>, u64) {
        use crate::game::Game;
        let root = crate::hex::Hex::new(5).expect("a 5x5 board");
        let root_hash = root.hash();
        let mut state = WorkerState::new(
            SearchSettings::default(),
            Placement::new(1, root_hash, 16),
            1,
        );
        state.nodes.insert(
            root_hash,
            Node {
                position: root,
                edges: None,
            },
        );
        (state, root_hash)
    }

    /// A finished simulation's path is kept, and the next simulation starts with it: no path
    /// from the allocator per rollout; nor lists for a handler's steps and calls.
    #[test]
    fn the_next_simulation_starts_with_a_finished_ones_path_and_lists() {
        let (mut state, root_hash) = one_worker_at_an_empty_5x5_board();
        // One worker: every step is local, and the simulation ends counted for the report.
        let simulate = |state: &mut WorkerState<crate::hex::Hex>| {
            let path = spare_path();
            let allocation = path.as_ptr();
            let mut calls = state.take_step(1, |state, out| {
                state.select(
                    SelectArgs {
                        node: root_hash,
                        path,
                    },
                    out,
                )
            });
            assert!(calls.is_empty(), "no call to make");
            assert_eq!(state.root_work.report().map(|f| f.simulations), Some(1));
            // (An empty list's pointer is the same dangling one every time: a list grown
            // and dropped would pass the comparison below without its capacity.)
            assert!(state.work.capacity() > 0);
            let lists = state.work.as_ptr();
            calls.clear();
            state.calls = calls;
            (allocation, lists)
        };
        let (first_path, first_lists) = simulate(&mut state);
        assert_eq!(
            SPARE_PATHS.with_borrow(Vec::len),
            1,
            "the finished path is kept"
        );
        for _ in 0..20 {
            let (path, lists) = simulate(&mut state);
            assert_eq!(path, first_path, "the kept path is reused");
            assert_eq!(lists, first_lists, "the kept list of steps is reused");
        }
    }

    /// The root's owner starts a simulation of the refill for each one that finishes: in the
    /// handler for the first `REFILLS_IN_A_HANDLER`, the rest owed to the call the handler ends
    /// with (with every step local, a handler would otherwise not end while the refill lasts);
    /// it reports once none is left running.
    #[test]
    fn the_roots_owner_refills_in_a_handler_up_to_a_bound_and_reports_when_nothing_runs() {
        let (mut state, root_hash) = one_worker_at_an_empty_5x5_board();
        state.root_work.running = 2;
        state.root_work.refill = 1;
        let calls = state.take_step(1, |state, out| state.start_at(root_hash, 2, out));
        assert!(calls.is_empty(), "every step local");
        let work = &state.root_work;
        assert_eq!(
            (work.refill, work.refilled, work.owed, work.running),
            (0, 1, 0, 0),
            "one of the two finished was refilled, in the handler"
        );
        let report = state.root_work.report().expect("due: nothing runs");
        assert_eq!((report.simulations, report.playouts), (3, 48));
        assert!(state.root_work.report().is_none(), "reported once");

        // A refill longer than a handler's share: the handler owes the rest.
        let bound = u64::from(REFILLS_IN_A_HANDLER);
        state.root_work.running = 1;
        state.root_work.refill = bound + 5;
        let calls = state.take_step(1, |state, out| state.start_at(root_hash, 1, out));
        assert!(calls.is_empty());
        let work = &state.root_work;
        assert_eq!(
            (work.refill, work.refilled, work.owed, work.running),
            (4, 1 + bound + 1, 1, 1),
            "(one before) {REFILLS_IN_A_HANDLER} started in the handler, the next owed",
        );
        assert!(state.root_work.report().is_none(), "one still runs");
        let owed = state.root_work.take_owed();
        assert_eq!(owed, 1);
        let calls = state.take_step(1, |state, out| state.start_at(root_hash, owed, out));
        assert!(calls.is_empty());
        let report = state.root_work.report().expect("due: nothing runs");
        assert_eq!(
            u64::from(report.simulations),
            1 + bound + 5,
            "the first and the whole refill"
        );
        assert_eq!(state.root_work.take_owed(), 0, "the refill is spent");
        assert_eq!(
            state.root_work.refilled,
            1 + bound + 5,
            "one before, then all"
        );
    }

    #[test]
    fn finished_simulations_are_reported_in_batches() {
        let mut work = RootWork {
            running: u64::from(REPORT_EVERY) + 10,
            ..RootWork::default()
        };
        for _ in 1..REPORT_EVERY {
            work.finished(16);
            assert!(work.report().is_none(), "not due while others run");
        }
        work.finished(16);
        assert_eq!(work.take_owed(), 0, "no refill to start");
        let report = work.report().expect("due at REPORT_EVERY");
        assert_eq!(report.simulations, REPORT_EVERY);
        for _ in 0..10 {
            work.finished(1);
        }
        assert_eq!(
            work.report().map(|r| r.simulations),
            Some(10),
            "the last ones"
        );
    }

    #[test]
    fn a_path_travels_as_fourteen_bytes_a_step_and_a_torn_one_is_refused() {
        let long: Vec<Step> = (0..40u64)
            .map(|idx| Step {
                node: u64::MAX - idx,
                edge: idx as u16 * 1000,
                owner: idx as u32 * 100_000,
            })
            .collect();
        for len in [0, 1, 16, 17, 40] {
            let args = SelectArgs {
                node: 7,
                path: long[..len].to_vec(),
            };
            let bytes = postcard::to_allocvec(&args).unwrap();
            // The node (a 1-byte varint), the string's length (a varint), the steps.
            let length_bytes = if 14 * len < 128 { 1 } else { 2 };
            assert_eq!(bytes.len(), 1 + length_bytes + 14 * len);
            let back: SelectArgs = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back.node, 7);
            let steps = |path: &[Step]| {
                path.iter()
                    .map(|s| (s.node, s.edge, s.owner))
                    .collect::<Vec<_>>()
            };
            assert_eq!(steps(&back.path), steps(&long[..len]));
        }
        // Eleven bytes: not a whole number of steps.
        let torn = postcard::to_allocvec(&(7u8, &[1u8; 11][..])).unwrap();
        assert!(postcard::from_bytes::<SelectArgs>(&torn).is_err());
    }

    #[test]
    fn a_hex_node_and_its_key_fill_one_cache_line() {
        assert!(std::mem::size_of::<(u64, Node<crate::hex::Hex>)>() <= 64);
    }
}
