//! [`MctsDriver`] and [`MctsWorker`]: distributed Monte-Carlo tree search (ferromq-mcts) as
//! built-in devices, members of an rpc group of the topology (`[[rpc]]`, the driver listed
//! first). The workers hold the tree; the driver plays `moves` moves from the empty board,
//! searching `rollouts` simulations per move and logging each move with its rollouts/s, then
//! tells the workers to finish, so that the run ends by itself.
//!
//! Properties (both): `game` (`hex` or `tictactoe`), `board` (Hex side, 11), `rpc-group`
//! (`search`); worker: `playouts` (random games per new node, 16); driver: `rollouts` (10000),
//! `seconds` (a time per move, 0 for none: the move is played when either budget is spent),
//! `moves` (1; 0 plays to the end), `in-flight` (simulations per worker, 256:
//! [`ferromq_mcts::search::IN_FLIGHT_PER_WORKER`]).

use std::sync::Arc;

use ferromq_core::BoxError;
use ferromq_device::{Device, DeviceContext, DeviceError};
use ferromq_mcts::hex::Hex;
use ferromq_mcts::search::{
    Driver, DriverCounts, IN_FLIGHT_PER_WORKER, SearchSettings, driver_handlers, worker_handlers,
};
use ferromq_mcts::tictactoe::TicTacToe;
use ferromq_mcts::{Game, Outcome};
use ferromq_rpc::{Procedure, Rpc};

/// The driver says the search is over: every member leaves RUNNING.
struct Finish;
impl Procedure for Finish {
    const NAME: &'static str = "mcts-device-finish";
    type Args = ();
    type Output = ();
}

/// The game a device plays, from its properties.
enum Which {
    Hex(usize),
    TicTacToe,
}

fn which(ctx: &DeviceContext) -> Result<Which, DeviceError> {
    let game: String = ctx.property_or("game", "hex".to_owned())?;
    let bad = |key: &str, problem: String| DeviceError::Property {
        device: ctx.id().to_owned(),
        key: key.to_owned(),
        problem,
    };
    match game.as_str() {
        "hex" => {
            let board: usize = ctx.property_or("board", 11)?;
            Hex::new(board).map_err(|error| bad("board", error.to_string()))?;
            Ok(Which::Hex(board))
        }
        "tictactoe" => Ok(Which::TicTacToe),
        other => Err(bad(
            "game",
            format!("has invalid value {other:?}: hex or tictactoe"),
        )),
    }
}

fn group(ctx: &DeviceContext) -> Result<String, DeviceError> {
    ctx.property_or("rpc-group", "search".to_owned())
}

/// Holds part of the search tree (see the module docs).
#[derive(Debug, Default)]
pub struct MctsWorker;

#[async_trait::async_trait]
impl Device for MctsWorker {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        match which(ctx)? {
            Which::Hex(_) => work::<Hex>(ctx).await,
            Which::TicTacToe => work::<TicTacToe>(ctx).await,
        }
    }
}

async fn work<G: Game>(ctx: &mut DeviceContext) -> Result<(), BoxError> {
    let group = group(ctx)?;
    let members = ctx
        .property_text(&format!("rpc.{group}.members"))
        .unwrap_or_default();
    let n_workers = members.split(',').count().saturating_sub(1);
    if members.split(',').next() == Some(ctx.id()) || n_workers == 0 {
        return Err(format!(
            "rpc group {group:?} ({members}): an mcts worker needs the driver listed first and itself after it"
        )
        .into());
    }
    let settings = SearchSettings {
        playouts: ctx.property_or("playouts", 16)?,
        ..SearchSettings::default()
    };
    let seed: u64 = ctx.property_or("replica-index", 0)?;
    let finished = Arc::new(tokio::sync::Notify::new());
    let finish = Arc::clone(&finished);
    let handlers = worker_handlers::<G>(n_workers, settings, seed.wrapping_add(0x9e37_79b9))
        .on::<Finish, _, _>(move |_, ()| {
            finish.notify_one();
            std::future::ready(())
        });
    let rpc = ferromq_rpc::join(ctx, &group, handlers).await?;
    tokio::select! {
        () = finished.notified() => {}
        () = ctx.stopped() => {}
    }
    leave(&rpc).await
}

/// Shuts the member down; calls that could not reach members already gone are no failure of
/// this device (the group is ending, each member within half a second).
async fn leave(rpc: &Rpc) -> Result<(), BoxError> {
    match rpc
        .shutdown_within(std::time::Duration::from_millis(500))
        .await
    {
        Ok(()) | Err(ferromq_core::Error::Undelivered { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Plays moves by distributed search (see the module docs).
#[derive(Debug, Default)]
pub struct MctsDriver;

#[async_trait::async_trait]
impl Device for MctsDriver {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        match which(ctx)? {
            Which::Hex(board) => {
                drive(ctx, Hex::new(board)?, |position: &Hex, mv| {
                    position.move_name(mv)
                })
                .await
            }
            Which::TicTacToe => {
                drive(ctx, TicTacToe::default(), |_: &TicTacToe, mv| {
                    format!("cell {mv}")
                })
                .await
            }
        }
    }
}

async fn drive<G: Game>(
    ctx: &mut DeviceContext,
    start: G,
    name: fn(&G, G::Move) -> String,
) -> Result<(), BoxError> {
    let group = group(ctx)?;
    let rollouts: u64 = ctx.property_or("rollouts", 10_000)?;
    let moves: u64 = ctx.property_or("moves", 1)?;
    let in_flight: usize = ctx.property_or("in-flight", IN_FLIGHT_PER_WORKER)?;
    let seconds: f64 = ctx.property_or("seconds", 0.0)?;
    if !(seconds >= 0.0 && seconds.is_finite()) {
        return Err(
            format!("property seconds {seconds}: a time per move in seconds, 0 for none").into(),
        );
    }
    let time = (seconds > 0.0).then(|| std::time::Duration::from_secs_f64(seconds));
    if rollouts == 0 || in_flight == 0 {
        return Err("properties rollouts and in-flight must be at least 1".into());
    }
    let counts = Arc::new(DriverCounts::default());
    let handlers = driver_handlers::<G>(&counts).on::<Finish, _, _>(|_, ()| std::future::ready(()));
    let rpc = ferromq_rpc::join(ctx, &group, handlers).await?;
    if rpc.me() != 0 {
        return Err(format!("the mcts driver must be listed first in rpc group {group:?}").into());
    }
    let mut driver = Driver::<G>::new(rpc.clone(), counts);
    driver.in_flight = in_flight * rpc.members().len().saturating_sub(1).max(1);
    let mut position = start;
    let mut n_played = 0;
    let outcome = loop {
        if position.outcome().is_some() || (moves > 0 && n_played == moves) || ctx.stop_requested()
        {
            break Ok(());
        }
        let result = tokio::select! {
            result = driver.search_within(&position, rollouts, time) => result,
            () = ctx.stopped() => break Ok(()),
        };
        let result = match result {
            Ok(result) => result,
            Err(error) => break Err(BoxError::from(error)),
        };
        let Some(best) = result.best_move else {
            break Ok(());
        };
        n_played += 1;
        let visits = result
            .root
            .iter()
            .find(|edge| edge.mv == best)
            .map_or(0, |edge| edge.visits);
        tracing::info!(
            "move {n_played}: {} ({visits} playouts through it); {} rollouts in {:.2} s, {:.0} rollouts/s",
            name(&position, best),
            result.rollouts,
            result.seconds,
            result.rollouts as f64 / result.seconds
        );
        position.play(best);
    };
    if let Some(result) = position.outcome() {
        let text = match result {
            Outcome::Win(player) => format!("player {} wins", player + 1),
            Outcome::Draw => "a draw".to_owned(),
        };
        tracing::info!("game over after {n_played} moves: {text}");
    }
    // Every member, this one too, leaves RUNNING (after a STOP they leave by themselves).
    if outcome.is_ok() && !ctx.stop_requested() {
        rpc.broadcast::<Finish>(&()).await?.confirmed().await?;
    }
    let left = leave(&rpc).await;
    outcome.and(left)
}
