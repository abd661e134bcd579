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
//!   result to the edge and removes the virtual loss; the root's owner tells the driver
//!   (`finished`, one call for the simulations a handler finished).
//!
//! The driver starts simulations in batches (`start`, up to [`START_BATCH`]): the root's owner
//! makes the batch's selections at the root one after the other, each counting its virtual
//! loss, and the steps they lead to follow.
//!
//! A step whose next node is owned by the same worker is taken there and then, in the same
//! handler: only moves between owners are calls (with one worker, the calls are the driver's
//! start and the report of the end, each shared by a batch of simulations). The number of
//! local steps is reported beside the calls ([`Driver::traffic`]).
//!
//! Every member runs its handlers one at a time, so a worker's tree needs no lock beyond the
//! short one that makes the handlers `Sync`. The driver keeps `in_flight` simulations going.

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
}

/// Selection continues at `node`.
#[derive(Debug, Serialize, Deserialize)]
pub struct SelectArgs {
    node: u64,
    path: Vec<Step>,
}

/// `count` new simulations, each starting with a selection at the root, `node`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StartArgs {
    node: u64,
    count: u32,
}

/// Simulations finished (at the root's owner), with their playouts.
#[derive(Debug, Serialize, Deserialize)]
pub struct FinishedArgs {
    simulations: u32,
    playouts: u64,
}

/// The result of a simulation going up: at the last node of `path`.
#[derive(Debug, Serialize, Deserialize)]
pub struct BackupArgs {
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
}

impl Default for SearchSettings {
    fn default() -> SearchSettings {
        SearchSettings {
            playouts: 16,
            exploration: 1.0,
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
    /// Paths of finished simulations, emptied, for the next ones to start with: a path per
    /// rollout from the allocator, grown as it went down, was a malloc and a realloc of the
    /// ~3 per rollout.
    spare_paths: Vec<Vec<Step>>,
    /// The steps a handler has yet to take and the calls it will make: kept from one handler
    /// to the next. Two fresh lists grown in every handler (a `start` batch's reach kilobytes)
    /// were a third of the workers' time in the allocator (`perf`, 2 workers, 1 playout: 17 %
    /// of all samples in malloc and free before, 11 % after).
    work: Vec<Outgoing<G>>,
    calls: Vec<Outgoing<G>>,
    /// The largest encoded position so far: a created node's position is encoded into a
    /// buffer this size, not one grown from nothing (six reallocations for 11x11 Hex).
    position_bytes: usize,
}

/// Paths a worker keeps for reuse at the most.
const MAX_SPARE_PATHS: usize = 1024;

impl<G: Game> WorkerState<G> {
    fn new(settings: SearchSettings, placement: Placement, seed: u64) -> WorkerState<G> {
        WorkerState {
            nodes: NodeMap::default(),
            deferred: HashMap::new(),
            settings,
            placement,
            rng: Rng::new(seed),
            local_steps: 0,
            spare_paths: Vec::new(),
            work: Vec::new(),
            calls: Vec::new(),
            position_bytes: 0,
        }
    }

    /// An empty path for a new simulation.
    fn new_path(&mut self) -> Vec<Step> {
        self.spare_paths
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(8))
    }

    /// Keeps the path of a finished simulation for a later one.
    fn recycle(&mut self, mut path: Vec<Step>) {
        if self.spare_paths.len() < MAX_SPARE_PATHS {
            path.clear();
            self.spare_paths.push(path);
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
        while let Some(step) = work.pop() {
            match step {
                Outgoing::Select(dest, args) if dest == me => self.select(args, work),
                Outgoing::Create(dest, args, position) if dest == me => {
                    self.create(args, position, work)
                }
                Outgoing::Backup(dest, args) if dest == me => self.backup(args, work),
                elsewhere => {
                    calls.push(elsewhere);
                    continue;
                }
            }
            self.local_steps += 1;
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
            edges.push(Edge {
                child: position.hash_after(mv),
                virtual_loss: 0,
                state: ChildState::Absent,
            });
        }
        let edge = &mut edges[edge_idx];
        edge.virtual_loss += 1;
        path.push(Step {
            node: hash,
            edge: edge_idx as u16,
        });
        let child = edge.child;
        let dest = self.placement.owner(child);
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
                self.placement.owner(step.node),
                BackupArgs {
                    path,
                    scores,
                    playouts,
                    created,
                },
            ),
            None => {
                self.recycle(path);
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
            self.recycle(path);
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
            let dest = self.placement.owner(edge.child);
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
/// waits for room). The simulations it finished are reported to the driver in one call.
fn send<G: Game>(rpc: &Rpc, outgoing: &mut Vec<Outgoing<G>>, state: &mut WorkerState<G>) {
    let mut finished = FinishedArgs {
        simulations: 0,
        playouts: 0,
    };
    for call in outgoing.drain(..) {
        let sent = match call {
            Outgoing::Select(dest, args) => rpc.queue_call::<Select<G>>(dest, &args),
            Outgoing::Create(dest, args, position) => {
                match postcard::to_extend(&position, Vec::with_capacity(state.position_bytes)) {
                    Ok(bytes) => {
                        state.position_bytes = state.position_bytes.max(bytes.len());
                        rpc.queue_call_buffer::<Create<G>>(dest, &args, Message::from(bytes))
                    }
                    Err(error) => {
                        tracing::error!(%error, "a new node's position does not encode");
                        continue;
                    }
                }
            }
            Outgoing::Backup(dest, args) => rpc.queue_call::<Backup<G>>(dest, &args),
            Outgoing::Finished(playouts) => {
                finished.simulations += 1;
                finished.playouts += u64::from(playouts);
                continue;
            }
        };
        if let Err(error) = sent {
            tracing::error!(%error, "a search call could not be made");
        }
    }
    if finished.simulations > 0
        && let Err(error) = rpc.queue_call::<Finished<G>>(0, &finished)
    {
        tracing::error!(%error, "finished simulations could not be reported");
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
                for _ in 0..args.count {
                    let root = SelectArgs {
                        node: args.node,
                        path: state.new_path(),
                    };
                    state.select(root, out);
                }
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
            std::future::ready(())
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
/// in flight a worker runs dry between the driver's refills. On 11x11 with one worker and one
/// playout per rollout (a rollout ~3 µs of tree and game), 64 in flight gave 124 k rollouts/s,
/// 128 179 k, 256 213 k, 512 240 k; with two workers and 16 playouts 64 gave 57-63 k and 256
/// 71-77 k. More in flight spread the search wider (each counts a virtual loss), so the default
/// stops at 256. 512 (2026-11-27, 07c202b) made 8 workers on 16 cores 1.06-1.10x as fast
/// (their calls travel in larger frames: 22 a frame instead of 18) but cost strength: the
/// distributed search won 148 of 400 games (37 %) against the single-process one (9x9, 20 000
/// rollouts a move, 2 workers), against 46 % with 256.
pub const IN_FLIGHT_PER_WORKER: usize = 256;

/// Simulations the driver starts with one call at most.
///
/// The root's owner runs a batch's selections at the root in one handler and reports the
/// simulations that handler finished in one call: with one worker, whose steps are all local, a
/// batch is a run of whole simulations between two records. Smaller batches leave the worker
/// idle between refills less often; larger ones cost fewer records.
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
        let mut started = 0u64;
        let mut rollouts = rollouts;
        while finished() < rollouts {
            if time.is_some_and(|time| started_at.elapsed() >= time) {
                // Out of time: no new simulation; those in flight finish.
                rollouts = started;
                if finished() >= rollouts {
                    break;
                }
            }
            let done = self.counts.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            loop {
                let room = (self.in_flight as u64)
                    .saturating_sub(started - finished())
                    .min(rollouts - started)
                    .min(START_BATCH);
                if room == 0 {
                    break;
                }
                let start = StartArgs {
                    node: root,
                    count: room as u32,
                };
                rpc.call::<Start<G>>(root_owner, &start).await?;
                started += room;
            }
            if finished() >= rollouts {
                break;
            }
            if tokio::time::timeout(self.stall_timeout, done)
                .await
                .is_err()
                && finished() < rollouts
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

    /// A finished simulation's path is kept, and the next simulation starts with it: no path
    /// from the allocator per rollout; nor lists for a handler's steps and calls.
    #[test]
    fn the_next_simulation_starts_with_a_finished_ones_path_and_lists() {
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
        // One worker: every step is local, and the simulation ends in a report.
        let simulate = |state: &mut WorkerState<crate::hex::Hex>| {
            let path = state.new_path();
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
            assert!(matches!(calls.as_slice(), [Outgoing::Finished(_)]));
            // (An empty list's pointer is the same dangling one every time: a list grown
            // and dropped would pass the comparison below without its capacity.)
            assert!(state.work.capacity() > 0 && calls.capacity() > 0);
            let lists = (state.work.as_ptr(), calls.as_ptr());
            calls.clear();
            state.calls = calls;
            (allocation, lists)
        };
        let (first_path, first_lists) = simulate(&mut state);
        assert_eq!(state.spare_paths.len(), 1, "the finished path is kept");
        for _ in 0..20 {
            let (path, lists) = simulate(&mut state);
            assert_eq!(path, first_path, "the kept path is reused");
            assert_eq!(
                lists, first_lists,
                "the kept step and call lists are reused"
            );
        }
    }

    #[test]
    fn a_hex_node_and_its_key_fill_one_cache_line() {
        assert!(std::mem::size_of::<(u64, Node<crate::hex::Hex>)>() <= 64);
    }
}
