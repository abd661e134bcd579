//! Hex on an S×S rhombus: player 0 connects top and bottom, player 1 left and right. A full
//! board always has exactly one winner, so a random playout fills the empty cells at random and
//! then looks once for the winner.
//!
//! Speed matters here (a rollout is a few moves and playouts): nothing below allocates but the
//! clone of a position. A move looks for a win only in the group of the stone just placed, and
//! a playout works on a bit per cell on the stack: player 0's stones, grown from the top row a
//! ring of neighbours at a time with shifts (`Cells`) until they reach the bottom row or stop
//! growing. Boards of up to 128 cells (11x11) take two words, larger ones six.

use serde::{Deserialize, Serialize};

use crate::game::{Game, Outcome, Player, Rng, zobrist_key};

/// The smallest board.
pub const MIN_SIZE: usize = 2;

/// The largest board.
pub const MAX_SIZE: usize = 19;

/// Cells of the largest board.
const MAX_CELLS: usize = MAX_SIZE * MAX_SIZE;

/// One bit per cell of the largest board: the cells a flood fill has reached.
#[derive(Default)]
struct Seen([u64; WIDE]);

impl Seen {
    /// Marks `cell`; whether it was unmarked.
    fn insert(&mut self, cell: usize) -> bool {
        let (word, bit) = (cell / 64, 1u64 << (cell % 64));
        let fresh = self.0[word] & bit == 0;
        self.0[word] |= bit;
        fresh
    }
}

/// A set of cells of a board of up to `64 * W` cells, cell `i` in bit `i % 64` of word `i / 64`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Cells<const W: usize>([u64; W]);

impl<const W: usize> Cells<W> {
    const EMPTY: Cells<W> = Cells([0; W]);

    /// The first `W` words of a set of the largest board's cells.
    fn from_words(words: &[u64; WIDE]) -> Cells<W> {
        Cells(std::array::from_fn(|word| words[word]))
    }

    fn insert(&mut self, cell: usize) {
        self.0[cell / 64] |= 1 << (cell % 64);
    }

    /// Every cell moved `by` (1..64) cells up the numbering; what passes the last word is lost.
    #[inline(always)]
    fn up(self, by: u32) -> Cells<W> {
        Cells(std::array::from_fn(|word| {
            let carried = if word == 0 {
                0
            } else {
                self.0[word - 1] >> (64 - by)
            };
            self.0[word] << by | carried
        }))
    }

    /// Every cell moved `by` (1..64) cells down the numbering; what passes cell 0 is lost.
    #[inline(always)]
    fn down(self, by: u32) -> Cells<W> {
        Cells(std::array::from_fn(|word| {
            let carried = if word + 1 == W {
                0
            } else {
                self.0[word + 1] << (64 - by)
            };
            self.0[word] >> by | carried
        }))
    }

    #[inline(always)]
    fn and(self, other: Cells<W>) -> Cells<W> {
        Cells(std::array::from_fn(|word| self.0[word] & other.0[word]))
    }

    #[inline(always)]
    fn or(self, other: Cells<W>) -> Cells<W> {
        Cells(std::array::from_fn(|word| self.0[word] | other.0[word]))
    }

    fn is_empty(self) -> bool {
        self.0.iter().all(|&word| word == 0)
    }

    /// Whether the cells of `self` (stones of player 0 on a board of side `size`) connect the
    /// top row to the bottom one: the stones reached from the top row grow by their neighbours
    /// among `self` until the bottom row is reached or nothing is added.
    fn connect_top_to_bottom(self, size: usize) -> bool {
        let lines = &LINES[size];
        let (top, bottom) = (
            Cells::from_words(&lines.top),
            Cells::from_words(&lines.bottom),
        );
        let not_first = Cells::from_words(&lines.not_first_column);
        let not_last = Cells::from_words(&lines.not_last_column);
        let (side, diagonal) = (size as u32, size as u32 - 1);
        let mut reached = self.and(top);
        loop {
            if !reached.and(bottom).is_empty() {
                return true;
            }
            // The six neighbours: right and left in the row, the cells above and below, and
            // the two diagonals (up-right, down-left); a move along a row or a diagonal must
            // not wrap around to the other edge of the board.
            let sideways = reached.up(1).or(reached.down(diagonal)).and(not_first);
            let back = reached.down(1).or(reached.up(diagonal)).and(not_last);
            let grown = reached
                .or(sideways)
                .or(back)
                .or(reached.up(side))
                .or(reached.down(side))
                .and(self);
            if grown == reached {
                return false;
            }
            reached = grown;
        }
    }
}

/// Words of a set of the largest board's cells.
const WIDE: usize = MAX_CELLS.div_ceil(64);

/// The cells of a board of one side that [`Cells::connect_top_to_bottom`] needs, as words of
/// the largest board.
struct Lines {
    top: [u64; WIDE],
    bottom: [u64; WIDE],
    not_first_column: [u64; WIDE],
    not_last_column: [u64; WIDE],
}

impl Lines {
    /// No cells.
    const NONE: Lines = Lines {
        top: [0; WIDE],
        bottom: [0; WIDE],
        not_first_column: [0; WIDE],
        not_last_column: [0; WIDE],
    };

    const fn of(size: usize) -> Lines {
        let mut lines = Lines::NONE;
        let mut cell = 0;
        while cell < size * size {
            let (row, col, word, bit) = (cell / size, cell % size, cell / 64, 1 << (cell % 64));
            if row == 0 {
                lines.top[word] |= bit;
            }
            if row + 1 == size {
                lines.bottom[word] |= bit;
            }
            if col != 0 {
                lines.not_first_column[word] |= bit;
            }
            if col + 1 != size {
                lines.not_last_column[word] |= bit;
            }
            cell += 1;
        }
        lines
    }
}

/// [`Lines`] of every side up to [`MAX_SIZE`] (sizes 0 and 1 unused), made by the compiler.
static LINES: [Lines; MAX_SIZE + 1] = {
    let mut all = [Lines::NONE; MAX_SIZE + 1];
    let mut size = 2;
    while size <= MAX_SIZE {
        all[size] = Lines::of(size);
        size += 1;
    }
    all
};

/// Calls `visit` with each cell next to `cell` on a board of side `size`.
#[inline]
fn for_each_neighbour(size: usize, cell: usize, mut visit: impl FnMut(usize)) {
    let (row, col) = (cell / size, cell % size);
    if row > 0 {
        visit(cell - size);
        if col + 1 < size {
            visit(cell - size + 1);
        }
    }
    if col > 0 {
        visit(cell - 1);
    }
    if col + 1 < size {
        visit(cell + 1);
    }
    if row + 1 < size {
        if col > 0 {
            visit(cell + size - 1);
        }
        visit(cell + size);
    }
}

/// The line of `cell` that `player` must cross: its row for player 0, its column for player 1.
#[inline]
fn line(size: usize, cell: usize, player: Player) -> usize {
    if player == 0 {
        cell / size
    } else {
        cell % size
    }
}

/// Whether the stones of `player` reachable from `starts` (cells holding them) touch `player`'s
/// far side, and with `need_near`, also the near one (line 0).
fn flood(
    cells: &[u8],
    size: usize,
    player: Player,
    starts: impl Iterator<Item = usize>,
    need_near: bool,
) -> bool {
    let stone = player + 1;
    let mut seen = Seen::default();
    let mut stack = [0u16; MAX_CELLS];
    let mut top = 0;
    for cell in starts {
        if seen.insert(cell) {
            stack[top] = cell as u16;
            top += 1;
        }
    }
    let (mut near, mut far) = (!need_near, false);
    while top > 0 {
        top -= 1;
        let cell = usize::from(stack[top]);
        let at = line(size, cell, player);
        near |= at == 0;
        far |= at == size - 1;
        if near && far {
            return true;
        }
        for_each_neighbour(size, cell, |next| {
            if cells[next] == stone && seen.insert(next) {
                stack[top] = next as u16;
                top += 1;
            }
        });
    }
    false
}

/// A Hex position. One that arrives from another process is checked as it is decoded (a side
/// of 2..=19, a cell per square, each empty or a player's), since moves and playouts index the
/// board by its side.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "HexFields")]
pub struct Hex {
    size: u8,
    /// 0 empty, 1 player 0, 2 player 1; row-major.
    #[serde(with = "cells_wire")]
    cells: Vec<u8>,
    to_move: Player,
    n_empty: u16,
    hash: u64,
    winner: Option<Player>,
}

/// [`Hex`]'s fields as they travel, before they are checked.
#[derive(Deserialize)]
struct HexFields {
    size: u8,
    #[serde(with = "cells_wire")]
    cells: Vec<u8>,
    to_move: Player,
    n_empty: u16,
    hash: u64,
    winner: Option<Player>,
}

impl TryFrom<HexFields> for Hex {
    type Error = String;

    fn try_from(fields: HexFields) -> Result<Hex, String> {
        let size = usize::from(fields.size);
        if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
            return Err(BadSize(size).to_string());
        }
        if fields.cells.len() != size * size {
            return Err(format!(
                "a {size}x{size} Hex board has {} cells, not {}",
                size * size,
                fields.cells.len()
            ));
        }
        if let Some(cell) = fields.cells.iter().position(|&stone| stone > 2) {
            return Err(format!(
                "Hex cell {cell} holds {}, not 0 (empty), 1 or 2",
                fields.cells[cell]
            ));
        }
        if fields.to_move > 1 || fields.winner.is_some_and(|winner| winner > 1) {
            return Err(format!(
                "Hex players are 0 and 1, not {} to move and {:?} the winner",
                fields.to_move, fields.winner
            ));
        }
        let n_empty = fields.cells.iter().filter(|&&stone| stone == 0).count();
        if usize::from(fields.n_empty) != n_empty {
            return Err(format!(
                "a Hex position says {} empty cells and has {n_empty}",
                fields.n_empty
            ));
        }
        Ok(Hex {
            size: fields.size,
            n_empty: fields.n_empty,
            cells: fields.cells,
            to_move: fields.to_move,
            hash: fields.hash,
            winner: fields.winner,
        })
    }
}

/// A board's cells travel as one byte string, not as a sequence of bytes: a new node's
/// position crosses between workers in every `create` call, and decoding 121 cells one element
/// at a time was most of the decoding.
mod cells_wire {
    use serde::{Deserializer, Serializer, de};

    pub fn serialize<S: Serializer>(cells: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(cells)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        struct Cells;
        impl de::Visitor<'_> for Cells {
            type Value = Vec<u8>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a Hex board's cells as a byte string")
            }

            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
                Ok(bytes.to_vec())
            }

            fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(bytes)
            }
        }
        deserializer.deserialize_bytes(Cells)
    }
}

/// Why a board size is refused.
#[derive(Debug, thiserror::Error)]
#[error("a Hex board is {MIN_SIZE}x{MIN_SIZE} to {MAX_SIZE}x{MAX_SIZE}, not {0}x{0}")]
pub struct BadSize(pub usize);

impl Hex {
    /// An empty board.
    ///
    /// # Errors
    /// [`BadSize`] outside [`MIN_SIZE`]..=[`MAX_SIZE`].
    pub fn new(size: usize) -> Result<Hex, BadSize> {
        if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
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

    /// Whether `player`'s stones connect their two sides (the search a stone's group uses, from
    /// the whole near side: what the playouts' shifts are checked against).
    #[cfg(test)]
    fn connects(&self, cells: &[u8], player: Player) -> bool {
        let size = self.size();
        let stone = player + 1;
        let near_side = (0..size)
            .map(|idx| if player == 0 { idx } else { idx * size })
            .filter(|&cell| cells[cell] == stone);
        flood(cells, size, player, near_side, false)
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
        // One allocation for all of them, not one per doubling (six for an empty 11x11 board).
        moves.reserve(usize::from(self.n_empty));
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
        // Only the group of the new stone can have become a winning chain.
        if flood(
            &self.cells,
            self.size(),
            self.to_move,
            std::iter::once(cell),
            true,
        ) {
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

    fn hash_after(&self, mv: u16) -> u64 {
        self.hash ^ zobrist_key(usize::from(mv), self.to_move) ^ u64::from(self.to_move ^ 1)
    }

    fn random_playout(&self, rng: &mut Rng) -> Outcome {
        if let Some(winner) = self.winner {
            return Outcome::Win(winner);
        }
        if self.cells.len() <= 128 {
            self.fill_and_score::<2>(rng)
        } else {
            self.fill_and_score::<WIDE>(rng)
        }
    }
}

impl Hex {
    /// A random playout on `W` words a set (see [`Game::random_playout`]).
    fn fill_and_score<const W: usize>(&self, rng: &mut Rng) -> Outcome {
        // Random moves to a full board give the player to move ceil(n/2) of the n empty cells,
        // a uniformly random set of them, and the other player the rest: the first ceil(n/2)
        // steps of a Fisher-Yates shuffle pick the mover's (half the shuffle, and no pass to
        // alternate). Only player 0's stones are needed to say who won.
        let mut zeros = Cells::<W>::EMPTY;
        let mut empty = [0u16; MAX_CELLS];
        let mut n_empty = 0;
        for (cell, &stone) in self.cells.iter().enumerate() {
            // No branch on the stone: which cells are empty is as random as the playouts.
            empty[n_empty] = cell as u16;
            n_empty += usize::from(stone == 0);
            zeros.0[cell / 64] |= u64::from(stone == 1) << (cell % 64);
        }
        let empty = &mut empty[..n_empty];
        let n_mover = n_empty.div_ceil(2);
        for idx in 0..n_mover {
            empty.swap(idx, idx + rng.below(n_empty - idx));
        }
        let (mover, other) = empty.split_at(n_mover);
        for &cell in if self.to_move == 0 { mover } else { other } {
            zeros.insert(usize::from(cell));
        }
        if zeros.connect_top_to_bottom(self.size()) {
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
    fn a_move_finds_a_win_as_a_whole_board_search_does_and_hash_after_agrees() {
        let mut rng = Rng::new(11);
        for size in [2, 3, 5, 11, MAX_SIZE] {
            for _ in 0..40 {
                let mut board = Hex::new(size).unwrap();
                let mut moves = Vec::new();
                loop {
                    moves.clear();
                    board.legal_moves(&mut moves);
                    let Some(&mv) = moves.get(rng.below(moves.len().max(1))) else {
                        break;
                    };
                    let (mover, expected_hash) = (board.to_move(), board.hash_after(mv));
                    board.play(mv);
                    assert_eq!(board.hash(), expected_hash, "{size}x{size}");
                    // Only the mover can have won, and the group search agrees with a search
                    // from the whole near side.
                    assert_eq!(
                        board.outcome() == Some(Outcome::Win(mover)),
                        board.connects(&board.cells, mover),
                        "{size}x{size}: {:?}",
                        board.cells
                    );
                    assert!(!board.connects(&board.cells, mover ^ 1));
                }
                assert!(
                    board.outcome().is_some(),
                    "{size}x{size} ended without a winner"
                );
            }
        }
    }

    #[test]
    fn stones_grown_by_shifts_connect_exactly_when_a_search_of_their_group_says_so() {
        fn grown<const W: usize>(cells: &[u8], size: usize) -> bool {
            let mut zeros = Cells::<W>::EMPTY;
            for (cell, _) in cells.iter().enumerate().filter(|(_, stone)| **stone == 1) {
                zeros.insert(cell);
            }
            zeros.connect_top_to_bottom(size)
        }
        let mut rng = Rng::new(5);
        let mut connected = [0; 2];
        for size in 2..=MAX_SIZE {
            let board = Hex::new(size).unwrap();
            for round in 0..400 {
                // Full boards, and boards a third empty, with player 0's share from 30 % to
                // 70 %: chains that wind across columns and wrap-around candidates at the edges.
                let share = 30 + round % 41;
                let cells: Vec<u8> = (0..size * size)
                    .map(|_| match rng.below(100) {
                        n if round % 2 == 1 && n < 33 => 0,
                        n if n < share => 1,
                        _ => 2,
                    })
                    .collect();
                let expected = board.connects(&cells, 0);
                connected[usize::from(expected)] += 1;
                assert_eq!(
                    grown::<WIDE>(&cells, size),
                    expected,
                    "{size}x{size}: {cells:?}"
                );
                if size * size <= 128 {
                    assert_eq!(
                        grown::<2>(&cells, size),
                        expected,
                        "{size}x{size}: {cells:?}"
                    );
                }
            }
        }
        assert!(connected[0] > 1000 && connected[1] > 1000, "{connected:?}");
    }

    #[test]
    fn a_position_from_another_process_is_checked_as_it_is_decoded() {
        let mut board = Hex::new(5).unwrap();
        board.play(12);
        let bytes = postcard::to_allocvec(&board).unwrap();
        let decoded: Hex = postcard::from_bytes(&bytes).unwrap();
        assert_eq!((decoded.hash(), decoded.n_empty), (board.hash(), 24));
        // What the check says (postcard keeps only that decoding failed).
        let refused = |(size, cells, to_move, winner): (u8, Vec<u8>, u8, Option<u8>)| {
            let bytes =
                postcard::to_allocvec(&(size, &cells, to_move, 0u16, 0u64, winner)).unwrap();
            assert!(postcard::from_bytes::<Hex>(&bytes).is_err());
            let fields = HexFields {
                size,
                cells,
                to_move,
                n_empty: 0,
                hash: 0,
                winner,
            };
            Hex::try_from(fields).unwrap_err()
        };
        assert!(refused((5, vec![0; 400], 0, None)).contains("has 25 cells, not 400"));
        assert!(refused((40, vec![0; 1600], 0, None)).contains("not 40x40"));
        assert!(refused((2, vec![0, 3, 0, 0], 0, None)).contains("cell 1 holds 3"));
        assert!(refused((2, vec![0; 4], 2, None)).contains("players are 0 and 1"));
        assert!(refused((2, vec![0; 4], 0, Some(5))).contains("players are 0 and 1"));
        assert!(refused((2, vec![0; 4], 0, None)).contains("says 0 empty cells and has 4"));
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

    #[test]
    fn a_playout_wins_as_often_as_random_moves_played_one_by_one() {
        // The playout fills the board at once; random moves played until someone wins must
        // give each player the same chance, from any position and whoever is to move.
        let moves_one_by_one = |start: &Hex, rng: &mut Rng| {
            let mut position = start.clone();
            let mut moves = Vec::new();
            loop {
                if let Some(Outcome::Win(winner)) = position.outcome() {
                    return winner;
                }
                moves.clear();
                position.legal_moves(&mut moves);
                position.play(moves[rng.below(moves.len())]);
            }
        };
        let mut started = Hex::new(4).unwrap();
        for mv in [5, 6, 9] {
            started.play(mv);
        }
        for start in [Hex::new(3).unwrap(), Hex::new(4).unwrap(), started] {
            let (mut rng, n) = (Rng::new(11), 40_000);
            let (mut by_playout, mut by_moves) = (0, 0);
            for _ in 0..n {
                by_playout += u32::from(start.random_playout(&mut rng) == Outcome::Win(0));
                by_moves += u32::from(moves_one_by_one(&start, &mut rng) == 0);
            }
            let (p, q) = (
                f64::from(by_playout) / n as f64,
                f64::from(by_moves) / n as f64,
            );
            // Two estimates of one probability from 40 000 games each differ by less than
            // 0.0036 (one standard deviation) in two cases of three; 0.02 is over five.
            assert!(
                (p - q).abs() < 0.02,
                "{start:?}: playout {p}, one by one {q}"
            );
        }
    }
}
