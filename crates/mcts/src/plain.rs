//! A plain single-process UCT, the yardstick: the same selection rule and evaluation as the
//! distributed search, in one thread, without virtual loss or calls. Also the `plain` opponent.

use std::collections::HashMap;

use crate::game::{Game, Rng};

struct Node<M> {
    visits: u64,
    /// (move, child hash, visits, score for the mover); expanded on the first selection.
    edges: Option<Vec<(M, u64, u64, f64)>>,
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
        let mut nodes: HashMap<u64, Node<G::Move>> = HashMap::new();
        nodes.insert(
            position.hash(),
            Node {
                visits: 0,
                edges: None,
            },
        );
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
                let edges = node.edges.get_or_insert_with(|| {
                    let mut moves = Vec::new();
                    current.legal_moves(&mut moves);
                    moves
                        .into_iter()
                        .map(|mv| {
                            let mut child = current.clone();
                            child.play(mv);
                            (mv, child.hash(), 0, 0.0)
                        })
                        .collect()
                });
                let log_total = (edges.iter().map(|edge| edge.2).sum::<u64>().max(1) as f64).ln();
                let mut best = (f64::NEG_INFINITY, 0);
                for (idx, edge) in edges.iter().enumerate() {
                    let value = if edge.2 == 0 {
                        f64::INFINITY
                    } else {
                        edge.3 / edge.2 as f64
                            + self.exploration * (log_total / edge.2 as f64).sqrt()
                    };
                    if value > best.0 {
                        best = (value, idx);
                    }
                }
                let (mv, child, _, _) = edges[best.1];
                path.push((hash, best.1, usize::from(current.to_move())));
                current.play(mv);
                hash = child;
                if let std::collections::hash_map::Entry::Vacant(vacant) = nodes.entry(child) {
                    vacant.insert(Node {
                        visits: 0,
                        edges: None,
                    });
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
                node.visits += n;
                let edge = &mut node.edges.as_mut().expect("expanded")[edge_idx];
                edge.2 += n;
                edge.3 += scores[mover];
            }
        }
        let root = nodes.get(&position.hash())?;
        root.edges
            .as_ref()?
            .iter()
            .max_by_key(|edge| edge.2)
            .map(|edge| edge.0)
    }
}
