//! UCB1 selection over a node's edges, shared by the distributed and the plain search.
//!
//! Choosing an edge is the innermost loop of a search (a rollout chooses at every node on its
//! way down, over every legal move: 121 on an empty 11×11 board). [`Arms`] keeps each edge's
//! mean and `1/√n` ready, updated when its count changes, and the sum of the counts, so a
//! choice is one multiply-add per edge instead of a sum, a division and a square root. The arms
//! lie in chunks of [`LANES`], each field an array over the chunk's arms, so that the means and
//! the `1/√n` a choice reads sit together, apart from the counts, and the choice scans them in
//! [`LANES`] interleaved runs: half the memory to read, and a loop the compiler turns into
//! vector instructions (in a profile of a one-playout worker the choice went from 16 % to 11 %
//! of its time, most of the rest the first look at the node's arms, a cache miss). One vector
//! of chunks is one allocation where an array per field was one each.
//! Edges never chosen (an infinite bound) are handed out first, in order, and only then get an
//! arm: most nodes of a big tree are left after a few choices, and an arm for each of their
//! hundred edges made up and faulted in most of a search's memory (a quarter of its time in
//! the kernel clearing pages).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// One edge's count and score.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Arm {
    /// Playouts counted through the edge (with the distributed search's virtual losses).
    n: u64,
    /// Their summed score for the player who makes the move.
    score: f64,
}

impl Arm {
    /// Playouts counted.
    pub(crate) fn n(&self) -> u64 {
        self.n
    }

    /// Their summed score.
    pub(crate) fn score(&self) -> f64 {
        self.score
    }
}

/// How many arms a [`Chunk`] holds, and how many runs a choice scans at once.
const LANES: usize = 4;

/// [`LANES`] arms, each field an array over them: what a choice reads (`mean`, `rsqrt`)
/// together, apart from what it does not.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    /// `score / n` (0 while `n` is 0; -∞ in a lane without an arm, which no choice takes).
    mean: [f64; LANES],
    /// `1 / √n` (0 while `n` is 0).
    rsqrt: [f64; LANES],
    n: [u64; LANES],
    score: [f64; LANES],
}

/// A chunk whose lanes hold no arm yet.
const EMPTY_CHUNK: Chunk = Chunk {
    mean: [f64::NEG_INFINITY; LANES],
    rsqrt: [0.0; LANES],
    n: [0; LANES],
    score: [0.0; LANES],
};

/// The edges of one node as selection sees them.
#[derive(Debug, Clone)]
pub(crate) struct Arms {
    /// The arms of the edges chosen so far, `LANES` to a chunk (arm `i` in lane `i % LANES`
    /// of chunk `i / LANES`); the other edges count nothing.
    chunks: Vec<Chunk>,
    /// How many edges have an arm.
    n_arms: usize,
    /// The number of edges.
    len: usize,
    /// The sum of the arms' counts.
    total: u64,
}

impl Arms {
    /// `len` arms that count nothing yet.
    pub(crate) fn new(len: usize) -> Arms {
        Arms {
            chunks: Vec::new(),
            n_arms: 0,
            len,
            total: 0,
        }
    }

    /// Every arm, in order (`len` of them).
    pub(crate) fn iter(&self) -> impl Iterator<Item = Arm> + '_ {
        (0..self.len).map(|idx| self.arm(idx))
    }

    /// The arm at `idx` (one not chosen yet counts nothing).
    fn arm(&self, idx: usize) -> Arm {
        if idx >= self.n_arms {
            return Arm::default();
        }
        let chunk = &self.chunks[idx / LANES];
        let lane = idx % LANES;
        Arm {
            n: chunk.n[lane],
            score: chunk.score[lane],
        }
    }

    /// The arm with the highest upper bound `mean + exploration·√(ln total / n)`, an arm never
    /// chosen first (the lowest index of those), `None` without arms. The caller counts
    /// something on the arm it gets (a virtual loss, the playouts) before it chooses again.
    pub(crate) fn choose(&mut self, exploration: f64) -> Option<usize> {
        if self.n_arms < self.len {
            self.new_arm();
            return Some(self.n_arms - 1);
        }
        if self.n_arms == 0 {
            return None;
        }
        let weight = exploration * (self.total.max(1) as f64).ln().sqrt();
        // Lane `l` keeps the best of the arms `l`, `l + LANES`, ... (the first of equals);
        // then the best lane, the lowest index of equals: the first arm with the highest
        // bound, as a plain scan finds it. A lane without an arm bounds at -∞ and never wins.
        let mut best = [f64::NEG_INFINITY; LANES];
        let mut best_idx = [usize::MAX; LANES];
        for (chunk_idx, chunk) in self.chunks.iter().enumerate() {
            for lane in 0..LANES {
                let bound = chunk.mean[lane] + weight * chunk.rsqrt[lane];
                if bound > best[lane] {
                    best[lane] = bound;
                    best_idx[lane] = chunk_idx * LANES + lane;
                }
            }
        }
        let mut chosen = (f64::NEG_INFINITY, usize::MAX);
        for (bound, idx) in best.into_iter().zip(best_idx) {
            if bound > chosen.0 || (bound == chosen.0 && idx < chosen.1) {
                chosen = (bound, idx);
            }
        }
        // A bound that is NaN everywhere (an exploration of NaN) chooses the first arm.
        Some(if chosen.1 < self.n_arms { chosen.1 } else { 0 })
    }

    /// Gives the next edge its arm, counting nothing. The chunks grow one allocation at a
    /// time, doubling: most nodes of a big tree keep one or two chunks.
    fn new_arm(&mut self) {
        let lane = self.n_arms % LANES;
        if lane == 0 {
            if self.chunks.len() == self.chunks.capacity() {
                self.chunks.reserve_exact(self.chunks.len().max(1));
            }
            self.chunks.push(EMPTY_CHUNK);
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.mean[lane] = 0.0;
        }
        self.n_arms += 1;
    }

    /// Counts `n` more playouts scoring `score` through the arm at `idx` (one not chosen yet:
    /// none).
    pub(crate) fn add(&mut self, idx: usize, n: u64, score: f64) {
        if idx >= self.n_arms {
            return;
        }
        let (chunk, lane) = (&mut self.chunks[idx / LANES], idx % LANES);
        chunk.n[lane] += n;
        chunk.score[lane] += score;
        Self::refresh(chunk, lane);
        self.total += n;
    }

    /// Takes back `n` counts that scored nothing (a virtual loss), never below zero.
    pub(crate) fn take_back(&mut self, idx: usize, n: u64) {
        if idx >= self.n_arms {
            return;
        }
        let (chunk, lane) = (&mut self.chunks[idx / LANES], idx % LANES);
        let n = n.min(chunk.n[lane]);
        chunk.n[lane] -= n;
        Self::refresh(chunk, lane);
        self.total -= n;
    }

    /// Keeps what selection reads of an arm up to date with its counts.
    fn refresh(chunk: &mut Chunk, lane: usize) {
        (chunk.mean[lane], chunk.rsqrt[lane]) = if chunk.n[lane] == 0 {
            (0.0, 0.0)
        } else {
            let n = chunk.n[lane] as f64;
            (chunk.score[lane] / n, n.sqrt().recip())
        };
    }
}

/// A hasher for keys that are Zobrist hashes already: the key is its own hash (SipHash over a
/// random 64-bit key buys nothing and costs a tenth of a lookup).
#[derive(Default)]
pub(crate) struct KeyIsHash(u64);

impl Hasher for KeyIsHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; other writes fold in (correct, if slower).
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 ^= key;
    }
}

/// Nodes by the Zobrist hash of their position.
pub(crate) type NodeMap<V> = HashMap<u64, V, BuildHasherDefault<KeyIsHash>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound computed the long way, as UCB1 writes it.
    fn slow_choice(counts: &[(u64, f64)], exploration: f64) -> usize {
        let total: u64 = counts.iter().map(|&(n, _)| n).sum();
        let log_total = (total.max(1) as f64).ln();
        let mut best = (f64::NEG_INFINITY, 0);
        for (idx, &(n, score)) in counts.iter().enumerate() {
            let value = if n == 0 {
                f64::INFINITY
            } else {
                score / n as f64 + exploration * (log_total / n as f64).sqrt()
            };
            if value > best.0 {
                best = (value, idx);
            }
        }
        best.1
    }

    #[test]
    fn choices_match_ucb1_written_out_with_counts_added_and_taken_back() {
        let mut rng = crate::Rng::new(3);
        for len in [1, 2, 7, 121] {
            let mut arms = Arms::new(len);
            let mut counts = vec![(0u64, 0.0f64); len];
            for round in 0..2000 {
                let chosen = arms.choose(1.0).unwrap();
                assert_eq!(
                    chosen,
                    slow_choice(&counts, 1.0),
                    "{len} arms, round {round}"
                );
                // A virtual loss, then (usually) the playouts with it taken back.
                arms.add(chosen, 1, 0.0);
                counts[chosen].0 += 1;
                if rng.below(4) > 0 {
                    let playouts = 1 + rng.below(16) as u64;
                    let score = rng.below(playouts as usize + 1) as f64;
                    arms.take_back(chosen, 1);
                    arms.add(chosen, playouts, score);
                    counts[chosen].0 += playouts - 1;
                    counts[chosen].1 += score;
                }
                assert_eq!(arms.total, counts.iter().map(|c| c.0).sum::<u64>());
            }
        }
        assert_eq!(Arms::new(0).choose(1.0), None);
    }

    #[test]
    fn an_edge_gets_its_arm_when_first_chosen_and_untried_ones_count_nothing() {
        let mut arms = Arms::new(121);
        assert_eq!(arms.n_arms, 0);
        for round in 0..3 {
            let chosen = arms.choose(1.0).unwrap();
            assert_eq!(chosen, round);
            arms.add(chosen, 2, 1.0);
        }
        assert_eq!(arms.n_arms, 3, "only the chosen edges hold an arm");
        assert_eq!(arms.chunks.len(), 1);
        let counts: Vec<u64> = arms.iter().map(|arm| arm.n()).collect();
        assert_eq!(counts.len(), 121, "every edge is listed");
        assert_eq!(&counts[..4], &[2, 2, 2, 0]);
        assert!(
            arms.iter()
                .skip(3)
                .all(|arm| arm.n() == 0 && arm.score() == 0.0)
        );
        assert_eq!(arms.total, 6);
    }

    #[test]
    fn a_node_map_finds_what_it_holds() {
        let mut map = NodeMap::default();
        for key in 0..1000u64 {
            map.insert(key.wrapping_mul(0x9e37_79b9_7f4a_7c15), key);
        }
        assert!((0..1000u64).all(|key| map[&key.wrapping_mul(0x9e37_79b9_7f4a_7c15)] == key));
    }
}
