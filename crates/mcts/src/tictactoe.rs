//! Tic-tac-toe: small enough that its exact value is known (a draw), so the search can be
//! checked against perfect play.

use serde::{Deserialize, Serialize};

use crate::game::{Game, Outcome, Player, zobrist_key};

/// A tic-tac-toe position: cells 0..9 row-major, 0 empty, 1 player 0 (X), 2 player 1 (O).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TicTacToe {
    cells: [u8; 9],
    to_move: Player,
    hash: u64,
}

const LINES: [[usize; 3]; 8] = [
    [0, 1, 2],
    [3, 4, 5],
    [6, 7, 8],
    [0, 3, 6],
    [1, 4, 7],
    [2, 5, 8],
    [0, 4, 8],
    [2, 4, 6],
];

impl TicTacToe {
    /// The position after `moves` from the empty board.
    pub fn after(moves: &[u8]) -> TicTacToe {
        let mut position = TicTacToe::default();
        for &mv in moves {
            position.play(mv);
        }
        position
    }

    /// The exact value for the player to move (1 win, 0.5 draw, 0 loss) and a best move.
    pub fn solve(&self) -> (f64, Option<u8>) {
        if let Some(outcome) = self.outcome() {
            return (outcome.score(self.to_move), None);
        }
        let mut moves = Vec::new();
        self.legal_moves(&mut moves);
        let mut best = (-1.0, None);
        for mv in moves {
            let mut next = self.clone();
            next.play(mv);
            let value = 1.0 - next.solve().0;
            if value > best.0 {
                best = (value, Some(mv));
            }
        }
        best
    }
}

impl Game for TicTacToe {
    type Move = u8;

    fn to_move(&self) -> Player {
        self.to_move
    }

    fn legal_moves(&self, moves: &mut Vec<u8>) {
        if self.outcome().is_some() {
            return;
        }
        moves.extend((0..9u8).filter(|&cell| self.cells[usize::from(cell)] == 0));
    }

    fn play(&mut self, mv: u8) {
        self.cells[usize::from(mv)] = self.to_move + 1;
        self.hash ^= zobrist_key(usize::from(mv), self.to_move);
        self.to_move ^= 1;
    }

    fn outcome(&self) -> Option<Outcome> {
        for line in LINES {
            let stone = self.cells[line[0]];
            if stone != 0 && line.iter().all(|&cell| self.cells[cell] == stone) {
                return Some(Outcome::Win(stone - 1));
            }
        }
        self.cells
            .iter()
            .all(|&cell| cell != 0)
            .then_some(Outcome::Draw)
    }

    fn hash(&self) -> u64 {
        self.hash ^ u64::from(self.to_move)
    }
}
