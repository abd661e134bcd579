//! The yardstick a Rust user would reach for: the `mcts` crate (crates.io, lock-free
//! tree-parallel UCT in threads of one process) searching ferromq's own Hex, with the same
//! random playouts, so its rollouts/s stand beside the distributed search's and the plain
//! UCT's (`examples/mcts-hex.rs`) on the same machine.
//!
//! ```text
//! cargo run --release -p ferromq-mcts --example mcts-crate-hex -- --board 11 --rollouts 100000 --playouts 1 --threads 1
//! ```
//!
//! Options: `--board S` (11, 2 to 19), `--rollouts R` (100000; at most 4294967295 with more
//! than one thread, which the crate counts in a `u32`), `--playouts P` per new node (1, at most
//! 65536),
//! `--threads T` (1, at most 1024). Prints one JSON object: `rollouts`, `rollouts_per_s`,
//! `best_move`. A value out of range is refused, naming the option (exit 2).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ferromq_mcts::hex::{Hex, MAX_SIZE, MIN_SIZE};
use ferromq_mcts::{Game, Outcome, Rng};
use mcts::transposition_table::{ApproxTable, TranspositionHash};
use mcts::tree_policy::UCTPolicy;
use mcts::{Evaluator, GameState, MCTS, MCTSManager, MoveList, SearchHandle};

/// ferromq's Hex as the crate's game.
#[derive(Clone)]
struct Position(Hex);

impl GameState for Position {
    type Move = u16;
    type Player = u8;
    type MoveList = Vec<u16>;

    fn current_player(&self) -> u8 {
        self.0.to_move()
    }

    fn available_moves(&self) -> Vec<u16> {
        let mut moves = Vec::new();
        self.0.legal_moves(&mut moves);
        moves
    }

    fn make_move(&mut self, mv: &u16) {
        self.0.play(*mv);
    }
}

impl TranspositionHash for Position {
    fn hash(&self) -> u64 {
        self.0.hash()
    }
}

/// `playouts` random games per new node; the evaluation is player 0's wins.
struct Playouts {
    playouts: u32,
    seed: AtomicU64,
}

impl Evaluator<Search> for Playouts {
    type StateEvaluation = i64;

    fn evaluate_new_state(
        &self,
        state: &Position,
        moves: &MoveList<Search>,
        _: Option<SearchHandle<Search>>,
    ) -> (Vec<()>, i64) {
        // One generator per evaluation, seeded apart: threads share the evaluator.
        let mut rng = Rng::new(self.seed.fetch_add(0x9e37_79b9, Ordering::Relaxed));
        let wins = (0..self.playouts)
            .filter(|_| state.0.random_playout(&mut rng) == Outcome::Win(0))
            .count();
        (vec![(); moves.len()], wins as i64)
    }

    fn evaluate_existing_state(
        &self,
        _: &Position,
        evaluation: &i64,
        _: SearchHandle<Search>,
    ) -> i64 {
        *evaluation
    }

    fn interpret_evaluation_for_player(&self, wins: &i64, player: &u8) -> i64 {
        if *player == 0 {
            *wins
        } else {
            i64::from(self.playouts) - *wins
        }
    }
}

#[derive(Default)]
struct Search;

impl MCTS for Search {
    type State = Position;
    type Eval = Playouts;
    type NodeData = ();
    type ExtraThreadData = ();
    type TreePolicy = UCTPolicy;
    type TranspositionTable = ApproxTable<Self>;

    fn virtual_loss(&self) -> i64 {
        1
    }
}

/// The most threads `--threads` starts. The crate spawns them all at once and aborts the
/// process when one cannot be spawned; 1024 threads reserve 2 GiB of address space for their
/// stacks, which Linux's default limits allow, and are more than the cores of any machine the
/// comparison runs on (more threads than cores only take turns).
const MAX_THREADS: u64 = 1024;

/// The most rollouts of a search in more than one thread: the crate counts them in a `u32`.
const MAX_PARALLEL_ROLLOUTS: u64 = u32::MAX as u64;

/// Board size, rollouts, playouts and threads from the command line.
fn parse(args: &[String]) -> Result<(usize, u64, u32, usize), String> {
    let (mut board, mut rollouts, mut playouts, mut threads) = (11usize, 100_000u64, 1u32, 1usize);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let (min, max) = match flag.as_str() {
            "--board" => (MIN_SIZE as u64, MAX_SIZE as u64),
            "--rollouts" => (1, u64::MAX),
            "--playouts" => (
                1,
                u64::from(ferromq_mcts::search::SearchSettings::MAX_PLAYOUTS),
            ),
            "--threads" => (1, MAX_THREADS),
            other => {
                return Err(format!(
                    "unknown option {other} (see the top of this example)"
                ));
            }
        };
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = value
            .parse::<u64>()
            .ok()
            .filter(|number| (min..=max).contains(number))
            .ok_or_else(|| format!("{flag} {value}: a whole number from {min} to {max}"))?;
        match flag.as_str() {
            "--board" => board = number as usize,
            "--rollouts" => rollouts = number,
            "--playouts" => {
                playouts = u32::try_from(number).expect("at most MAX_PLAYOUTS above");
            }
            _ => threads = number as usize,
        }
    }
    if threads > 1 && rollouts > MAX_PARALLEL_ROLLOUTS {
        return Err(format!(
            "--rollouts {rollouts} with --threads {threads}: at most {MAX_PARALLEL_ROLLOUTS} \
             (the mcts crate counts a parallel search's rollouts in a u32; --threads 1 has no \
             such limit)"
        ));
    }
    Ok((board, rollouts, playouts, threads))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (board, rollouts, playouts, threads) = match parse(&args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("mcts-crate-hex: {error}");
            return ExitCode::from(2);
        }
    };
    let position = Hex::new(board).expect("checked");
    let evaluator = Playouts {
        playouts,
        seed: AtomicU64::new(1),
    };
    // The same exploration as ferromq's searches (1.0 on a score in 0..=1 per playout; the
    // crate's UCT doubles its exploration term and scores a visit 0..=playouts).
    let policy = UCTPolicy::new(0.5 * f64::from(playouts));
    let mut manager = MCTSManager::new(
        Position(position.clone()),
        Search,
        evaluator,
        policy,
        ApproxTable::new(1 << 20),
    );
    let started = Instant::now();
    if threads == 1 {
        manager.playout_n(rollouts);
    } else {
        let rollouts = u32::try_from(rollouts).expect("parse bounds the rollouts of threads");
        manager.playout_n_parallel(rollouts, threads);
    }
    let seconds = started.elapsed().as_secs_f64();
    let best = manager
        .best_move()
        .map(|mv| position.move_name(mv))
        .unwrap_or_default();
    println!(
        "{{\"library\":\"mcts 0.3\",\"board\":{board},\"threads\":{threads},\"rollouts\":{rollouts},\"playouts\":{playouts},\"rollouts_per_s\":{:.0},\"best_move\":\"{best}\",\"seconds\":{seconds:.3}}}",
        rollouts as f64 / seconds
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `parse` makes of `args`.
    fn parsed(args: &[&str]) -> Result<(usize, u64, u32, usize), String> {
        parse(&args.iter().map(|arg| (*arg).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn every_value_it_cannot_use_is_refused_naming_the_option_and_its_range() {
        for (args, error) in [
            // crossbeam could not spawn them: the process aborted (exit 134).
            (
                &["--threads", "100000"][..],
                "--threads 100000: a whole number from 1 to 1024",
            ),
            // "at least 2" before, for a board too large.
            (
                &["--board", "99999999999999999999"],
                "--board 99999999999999999999: a whole number from 2 to 19",
            ),
            (
                &["--board", "20"],
                "--board 20: a whole number from 2 to 19",
            ),
            // One simulation's playouts are not interrupted: up to u32::MAX were taken.
            (
                &["--playouts", "65537"],
                "--playouts 65537: a whole number from 1 to 65536",
            ),
            (&["--board", "1"], "--board 1: a whole number from 2 to 19"),
            // "--json needs a value" before.
            (
                &["--json"],
                "unknown option --json (see the top of this example)",
            ),
            // Capped at u32::MAX before, while the JSON reported the number asked for.
            (
                &["--rollouts", "4294967297", "--threads", "2"],
                "--rollouts 4294967297 with --threads 2: at most 4294967295 (the mcts crate \
                 counts a parallel search's rollouts in a u32; --threads 1 has no such limit)",
            ),
            (
                &["--threads", "2", "--rollouts", "4294967296"],
                "--rollouts 4294967296 with --threads 2: at most 4294967295 (the mcts crate \
                 counts a parallel search's rollouts in a u32; --threads 1 has no such limit)",
            ),
            (
                &["--playouts", "4294967296"],
                "--playouts 4294967296: a whole number from 1 to 65536",
            ),
            (
                &["--rollouts", "0"],
                "--rollouts 0: a whole number from 1 to 18446744073709551615",
            ),
            (&["--threads"], "--threads needs a value"),
        ] {
            assert_eq!(parsed(args).err().as_deref(), Some(error), "{args:?}");
        }
    }

    #[test]
    fn values_at_the_limits_are_taken() {
        assert_eq!(parsed(&[]), Ok((11, 100_000, 1, 1)));
        assert_eq!(
            parsed(&[
                "--board",
                "19",
                "--threads",
                "1024",
                "--rollouts",
                "4294967295"
            ]),
            Ok((19, 4_294_967_295, 1, 1024))
        );
        // One thread counts in a u64.
        assert_eq!(
            parsed(&[
                "--board",
                "2",
                "--rollouts",
                "4294967297",
                "--playouts",
                "65536"
            ]),
            Ok((2, 4_294_967_297, 65_536, 1))
        );
    }
}
