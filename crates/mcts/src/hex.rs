//! Hex on an S×S rhombus: player 0 connects top and bottom, player 1 left and right. A full
//! board always has exactly one winner, so a random playout fills the empty cells at random and
//! then looks once for the winner.

use serde::{Deserialize, Serialize};

use crate::game::{Game, Outcome, Player, Rng, zobrist_key};

/// The largest board.
pub const MAX_SIZE: usize = 19;

/// A Hex position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hex {
    size: u8,
    /// 0 empty, 1 player 0, 2 player 1; row-major.
    cells: Vec<u8>,
    to_move: Player,
    n_empty: u16,
    hash: u64,
    winner: Option<Player>,
}

/// Why a board size is refused.
#[derive(Debug, thiserror::Error)]
#[error("a Hex board is 2x2 to {MAX_SIZE}x{MAX_SIZE}, not {0}x{0}")]
pub struct BadSize(pub usize);

impl Hex {
    /// An empty board.
    ///
    /// # Errors
    /// [`BadSize`] outside 2..=19.
    pub fn new(size: usize) -> Result<Hex, BadSize> {
        if !(2..=MAX_SIZE).contains(&size) {
            return Err(BadSize(size));
        }
        Ok(Hex {
            size: size as u8,
            cells: vec![0; size * size],
            to_move: 0,
            n_empty: (size * size) as u16,
            hash: 0,
            winner: None,
        })
    }

    /// The side length.
    pub fn size(&self) -> usize {
        usize::from(self.size)
    }

    fn neighbours(&self, cell: usize) -> impl Iterator<Item = usize> + use<> {
        let size = self.size() as isize;
        let (row, col) = ((cell as isize) / size, (cell as isize) % size);
        [(-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0)]
            .into_iter()
            .map(move |(dr, dc)| (row + dr, col + dc))
            .filter(move |&(r, c)| r >= 0 && r < size && c >= 0 && c < size)
            .map(move |(r, c)| (r * size + c) as usize)
    }

    /// Whether `player`'s stones connect their two sides.
    fn connects(&self, cells: &[u8], player: Player) -> bool {
        let size = self.size();
        let stone = player + 1;
        let mut seen = vec![false; cells.len()];
        let mut stack: Vec<usize> = (0..size)
            .map(|idx| if player == 0 { idx } else { idx * size })
            .filter(|&cell| cells[cell] == stone)
            .collect();
        for &cell in &stack {
            seen[cell] = true;
        }
        while let Some(cell) = stack.pop() {
            let (row, col) = (cell / size, cell % size);
            if (player == 0 && row == size - 1) || (player == 1 && col == size - 1) {
                return true;
            }
            for next in self.neighbours(cell) {
                if !seen[next] && cells[next] == stone {
                    seen[next] = true;
                    stack.push(next);
                }
            }
        }
        false
    }

    /// The cell of a move as `letter` + row, as Hex players write it (`c4`).
    pub fn move_name(&self, cell: u16) -> String {
        let size = self.size();
        let (row, col) = (usize::from(cell) / size, usize::from(cell) % size);
        format!("{}{}", (b'a' + col as u8) as char, row + 1)
    }
}

impl Game for Hex {
    type Move = u16;

    fn to_move(&self) -> Player {
        self.to_move
    }

    fn legal_moves(&self, moves: &mut Vec<u16>) {
        if self.winner.is_some() {
            return;
        }
        moves.extend(
            self.cells
                .iter()
                .enumerate()
                .filter(|(_, cell)| **cell == 0)
                .map(|(idx, _)| idx as u16),
        );
    }

    fn play(&mut self, mv: u16) {
        let cell = usize::from(mv);
        self.cells[cell] = self.to_move + 1;
        self.hash ^= zobrist_key(cell, self.to_move);
        self.n_empty -= 1;
        if self.connects(&self.cells, self.to_move) {
            self.winner = Some(self.to_move);
        }
        self.to_move ^= 1;
    }

    fn outcome(&self) -> Option<Outcome> {
        self.winner.map(Outcome::Win)
    }

    fn hash(&self) -> u64 {
        // The player to move is part of the position.
        self.hash ^ u64::from(self.to_move)
    }

    fn random_playout(&self, rng: &mut Rng) -> Outcome {
        if let Some(winner) = self.winner {
            return Outcome::Win(winner);
        }
        let mut cells = self.cells.clone();
        let mut empty: Vec<usize> = (0..cells.len()).filter(|&cell| cells[cell] == 0).collect();
        // Fisher-Yates, then alternate: the same as random moves to a full board.
        for idx in (1..empty.len()).rev() {
            empty.swap(idx, rng.below(idx + 1));
        }
        let mut player = self.to_move;
        for cell in empty {
            cells[cell] = player + 1;
            player ^= 1;
        }
        if self.connects(&cells, 0) {
            Outcome::Win(0)
        } else {
            Outcome::Win(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_straight_line_wins_and_hashes_follow_the_position() {
        let mut board = Hex::new(3).unwrap();
        // Player 0 down column 0 (cells 0, 3, 6); player 1 elsewhere.
        for mv in [0, 1, 3, 2, 6] {
            assert_eq!(board.outcome(), None);
            board.play(mv);
        }
        assert_eq!(board.outcome(), Some(Outcome::Win(0)));
        let mut other_order = Hex::new(3).unwrap();
        for mv in [3, 2, 0, 1, 6] {
            other_order.play(mv);
        }
        assert_eq!(board.hash(), other_order.hash());
    }

    #[test]
    fn a_playout_always_has_a_winner_and_sizes_are_checked() {
        let board = Hex::new(11).unwrap();
        let mut rng = Rng::new(7);
        let mut wins = [0; 2];
        for _ in 0..2000 {
            let Outcome::Win(player) = board.random_playout(&mut rng) else {
                panic!("a draw in Hex");
            };
            wins[usize::from(player)] += 1;
        }
        // The first player wins random games a little more often, never all of them.
        assert!(wins[0] > 800 && wins[1] > 600, "{wins:?}");
        assert!(Hex::new(1).is_err() && Hex::new(20).is_err());
    }
}
