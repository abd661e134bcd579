//! Distributed Monte-Carlo tree search on ferromq's remote invocation: the example that proves
//! the API (after Seriema's MCTS case study).
//!
//! A user supplies a [`Game`] (positions, legal moves, play, outcome, a Zobrist hash) and gets
//! a tree-parallel search whose nodes are spread over worker members of an rpc group, with no
//! communication code of their own: [`search::worker_handlers`] on each worker,
//! [`search::Driver`] on member 0. [`hex::Hex`] (any size up to 19×19) and
//! [`tictactoe::TicTacToe`] (whose exact value is known) are the games;
//! [`plain::PlainSearch`] is the single-process UCT it is measured against.
//!
//! How a simulation travels (selection with virtual loss, expansion by `call_buffer`, deferred
//! selection, evaluation by random playouts, backpropagation by `call`) is in `search.rs`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod game;
pub mod hex;
pub mod local;
pub mod plain;
pub mod search;
pub mod tictactoe;
mod ucb;

pub use game::{Game, Outcome, Player, Rng};
