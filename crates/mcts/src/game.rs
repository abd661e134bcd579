//! What a game gives the search: positions, moves, a winner, a hash.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A player: 0 moves first.
pub type Player = u8;

/// How a finished game ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The player won.
    Win(Player),
    /// Nobody won.
    Draw,
}

impl Outcome {
    /// The score of `player`: 1 for a win, 0.5 for a draw, 0 for a loss.
    pub fn score(self, player: Player) -> f64 {
        match self {
            Outcome::Win(winner) if winner == player => 1.0,
            Outcome::Win(_) => 0.0,
            Outcome::Draw => 0.5,
        }
    }
}

/// A two-player game with perfect information, as the search needs it. Positions travel
/// between processes (postcard), so they are serde types.
pub trait Game:
    Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static
{
    /// A move; it travels in results (postcard).
    type Move: Copy + Eq + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static;

    /// The player to move.
    fn to_move(&self) -> Player;

    /// The legal moves, appended to `moves` (none when the game is over).
    fn legal_moves(&self, moves: &mut Vec<Self::Move>);

    /// Plays `mv` (a legal move).
    fn play(&mut self, mv: Self::Move);

    /// How the game ended, `None` while it goes on.
    fn outcome(&self) -> Option<Outcome>;

    /// A hash of the position (Zobrist): equal positions hash equal, in every process.
    fn hash(&self) -> u64;

    /// The hash of the position after `mv` (a legal move). The default plays it on a copy; a
    /// game with Zobrist hashing answers without one (expanding a node asks once per move).
    fn hash_after(&self, mv: Self::Move) -> u64 {
        let mut next = self.clone();
        next.play(mv);
        next.hash()
    }

    /// Plays uniformly random moves to the end.
    fn random_playout(&self, rng: &mut Rng) -> Outcome {
        let mut position = self.clone();
        let mut moves = Vec::new();
        loop {
            if let Some(outcome) = position.outcome() {
                return outcome;
            }
            moves.clear();
            position.legal_moves(&mut moves);
            let mv = moves[rng.below(moves.len())];
            position.play(mv);
        }
    }
}

/// A small, fast pseudo-random generator (xorshift64*): playouts need speed, not quality.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Zobrist keys: one random 64-bit key per (cell, player), the same in every process.
pub(crate) fn zobrist_key(cell: usize, player: Player) -> u64 {
    // splitmix64 of the index: deterministic, no table to share.
    let mut z = (cell as u64 * 2 + u64::from(player) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
