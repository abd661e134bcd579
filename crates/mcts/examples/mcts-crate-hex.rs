//! The yardstick a Rust user would reach for: the `mcts` crate (crates.io, lock-free
//! tree-parallel UCT in threads of one process) searching ferromq's own Hex, with the same
//! random playouts, so its rollouts/s stand beside the distributed search's and the plain
//! UCT's (`examples/mcts-hex.rs`) on the same machine.
//!
//! ```text
//! cargo run --release -p ferromq-mcts --example mcts-crate-hex -- --board 11 --rollouts 100000 --playouts 1 --threads 1
//! ```
//!
//! Options: `--board S` (11), `--rollouts R` (100000), `--playouts P` per new node (1),
//! `--threads T` (1). Prints one JSON object: `rollouts`, `rollouts_per_s`, `best_move`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ferromq_mcts::hex::Hex;
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

fn parse(args: &[String]) -> Result<(usize, u64, u32, usize), String> {
    let (mut board, mut rollouts, mut playouts, mut threads) = (11usize, 100_000u64, 1u32, 1usize);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |min: u64| match value.parse::<u64>() {
            Ok(number) if number >= min => Ok(number),
            _ => Err(format!("{flag} {value}: a whole number of at least {min}")),
        };
        match flag.as_str() {
            "--board" => board = number(2)? as usize,
            "--rollouts" => rollouts = number(1)?,
            "--playouts" => {
                playouts =
                    u32::try_from(number(1)?).map_err(|_| format!("{flag} {value}: too many"))?
            }
            "--threads" => threads = number(1)? as usize,
            other => {
                return Err(format!(
                    "unknown option {other} (see the top of this example)"
                ));
            }
        }
    }
    Hex::new(board).map_err(|error| error.to_string())?;
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
        manager.playout_n_parallel(u32::try_from(rollouts).unwrap_or(u32::MAX), threads);
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
