//! A plain single-process UCT, the yardstick: the same selection rule and evaluation as the
//! distributed search, in one thread, without virtual loss or calls. Also the `plain` opponent.

use crate::game::{Game, Rng};
use crate::ucb::{Arms, NodeMap};

struct Node<M> {
    /// The legal moves and their edges' statistics; expanded on the first selection.
    edges: Option<(Vec<M>, Arms)>,
}

/// A single-threaded UCT search.
pub struct PlainSearch {
    rng: Rng,
    /// Random games per new node.
    pub playouts: u32,
    /// UCB's exploration constant.
    pub exploration: f64,
}

impl PlainSearch {
    /// A search with `playouts` random games per new node.
    pub fn new(seed: u64, playouts: u32) -> PlainSearch {
        PlainSearch {
            rng: Rng::new(seed),
            playouts: playouts.max(1),
            exploration: 1.0,
        }
    }

    /// The most visited move after `iterations` simulations from `position`.
    pub fn best_move<G: Game>(&mut self, position: &G, iterations: u64) -> Option<G::Move> {
        let mut nodes: NodeMap<Node<G::Move>> = NodeMap::default();
        nodes.insert(position.hash(), Node { edges: None });
        let mut path: Vec<(u64, usize, usize)> = Vec::new();
        for _ in 0..iterations {
            path.clear();
            let mut current = position.clone();
            let mut hash = position.hash();
            // Selection and expansion.
            let (scores, n) = loop {
                if let Some(outcome) = current.outcome() {
                    break ([outcome.score(0), outcome.score(1)], 1);
                }
                let node = nodes.get_mut(&hash).expect("a node on the path exists");
                let (moves, arms) = node.edges.get_or_insert_with(|| {
                    let mut moves = Vec::new();
                    current.legal_moves(&mut moves);
                    let arms = Arms::new(moves.len());
                    (moves, arms)
                });
                let chosen = arms
                    .choose(self.exploration)
                    .expect("a game that goes on has a move");
                let mv = moves[chosen];
                let child = current.hash_after(mv);
                path.push((hash, chosen, usize::from(current.to_move())));
                current.play(mv);
                hash = child;
                if let std::collections::hash_map::Entry::Vacant(vacant) = nodes.entry(child) {
                    vacant.insert(Node { edges: None });
                    let mut scores = [0.0; 2];
                    for _ in 0..self.playouts {
                        let outcome = current.random_playout(&mut self.rng);
                        scores[0] += outcome.score(0);
                        scores[1] += outcome.score(1);
                    }
                    break (scores, u64::from(self.playouts));
                }
            };
            // Backpropagation.
            for &(node_hash, edge_idx, mover) in path.iter().rev() {
                let node = nodes
                    .get_mut(&node_hash)
                    .expect("a node on the path exists");
                let (_, arms) = node.edges.as_mut().expect("expanded");
                arms.add(edge_idx, n, scores[mover]);
            }
        }
        let (moves, arms) = nodes.get(&position.hash())?.edges.as_ref()?;
        // The most visited edge, the last of equals.
        let mut best: Option<(u64, G::Move)> = None;
        for (&mv, arm) in moves.iter().zip(arms.iter()) {
            if best.is_none_or(|(visits, _)| arm.n() >= visits) {
                best = Some((arm.n(), mv));
            }
        }
        best.map(|(_, mv)| mv)
    }
}
