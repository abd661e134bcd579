//! [`MctsDriver`] and [`MctsWorker`]: distributed Monte-Carlo tree search (ferromq-mcts) as
//! built-in devices, members of an rpc group of the topology (`[[rpc]]`, the driver listed
//! first). The workers hold the tree; the driver plays `moves` moves from the empty board,
//! searching `rollouts` simulations per move and logging each move with its rollouts/s, then
//! tells the workers to finish, so that the run ends by itself. Before it searches it asks
//! every worker what it plays: a worker given another `game` or `board` ends the run with an
//! error naming it and both games (the driver played on, each worker reading positions of
//! another game as garbage, and the run ended 0).
//!
//! Properties (both): `game` (`hex` or `tictactoe`), `board` (Hex side, 11; tictactoe takes
//! none but 3), `rpc-group`
//! (`search`); worker: `playouts` (random games per new node, 16), `spread-depth` (nodes down
//! to this many moves below the root placed by their hash, deeper ones kept with their parent's
//! owner: [`SearchSettings::spread_depth`]; every node by its hash when not set); driver:
//! `rollouts` (10000; no limit where `seconds` is set and `rollouts` is not), `seconds` (a
//! time per move, 0 for none: the move is played when either budget is spent), `moves` (1; 0
//! plays to the end), `in-flight` (simulations per worker, 256:
//! [`ferromq_mcts::search::IN_FLIGHT_PER_WORKER`]).

use std::sync::Arc;

use ferromq_core::{BoxError, MAX_SECONDS};
use ferromq_device::{Device, DeviceContext, DeviceError};
use ferromq_mcts::hex::Hex;
use ferromq_mcts::search::{
    Driver, DriverCounts, IN_FLIGHT_PER_WORKER, SearchSettings, driver_handlers, worker_handlers,
};
use ferromq_mcts::tictactoe::TicTacToe;
use ferromq_mcts::{Game, Outcome};
use ferromq_rpc::{Procedure, Rpc};

use crate::Properties;

/// The driver says the search is over: every member leaves RUNNING.
struct Finish;
impl Procedure for Finish {
    const NAME: &'static str = "mcts-device-finish";
    type Args = ();
    type Output = ();
}

/// A worker's game, as [`Which::describe`] says it: the driver asks every worker before it
/// searches, so that members that play different games (or Hex on different boards) stop with
/// an error naming both instead of searching positions some of them cannot read.
struct GameOf;
impl Procedure for GameOf {
    const NAME: &'static str = "mcts-device-game";
    type Args = ();
    type Output = String;
}

/// The game a device plays, from its properties.
#[derive(Clone, Copy)]
enum Which {
    Hex(usize),
    TicTacToe,
}

impl Which {
    /// The game as its properties say it: `game = "hex", board = 11` is "hex on an 11x11 board".
    fn describe(self) -> String {
        match self {
            Which::Hex(side) => format!("hex on a {side}x{side} board"),
            Which::TicTacToe => "tictactoe".to_owned(),
        }
    }
}

fn which(props: &impl Properties) -> Result<Which, DeviceError> {
    let game: String = props.parse_or("game", "hex".to_owned())?;
    match game.as_str() {
        "hex" => {
            let board: usize = props.parse_or("board", 11)?;
            Hex::new(board).map_err(|error| props.invalid("board", error.to_string()))?;
            Ok(Which::Hex(board))
        }
        "tictactoe" => {
            // `board` is Hex's side: tic-tac-toe's board is 3x3 whatever it says.
            let board: usize = props.parse_or("board", 3)?;
            if board != 3 {
                return Err(props.invalid(
                    "board",
                    format!(
                        "has invalid value \"{board}\": tictactoe is played on a 3x3 board \
                         (board is Hex's side)"
                    ),
                ));
            }
            Ok(Which::TicTacToe)
        }
        other => Err(props.invalid(
            "game",
            format!("has invalid value {other:?}: hex or tictactoe"),
        )),
    }
}

fn group(props: &impl Properties) -> Result<String, DeviceError> {
    props.parse_or("rpc-group", "search".to_owned())
}

/// Random games per new node: at least one, at most [`SearchSettings::MAX_PLAYOUTS`] (a
/// simulation's playouts are not interrupted, so more would let a search overrun its time).
fn playouts(props: &impl Properties) -> Result<u32, DeviceError> {
    let playouts = props.parse_or("playouts", SearchSettings::default().playouts)?;
    if !(1..=SearchSettings::MAX_PLAYOUTS).contains(&playouts) {
        return Err(props.invalid(
            "playouts",
            format!(
                "has invalid value \"{playouts}\": expected 1 to {} random games per new node",
                SearchSettings::MAX_PLAYOUTS
            ),
        ));
    }
    Ok(playouts)
}

/// A worker's properties (what [`crate::Builtin::check_properties`] checks).
pub(crate) struct WorkerSettings {
    which: Which,
    group: String,
    search: SearchSettings,
    seed: u64,
}

pub(crate) fn worker_settings(props: &impl Properties) -> Result<WorkerSettings, DeviceError> {
    Ok(WorkerSettings {
        which: which(props)?,
        group: group(props)?,
        search: SearchSettings {
            playouts: playouts(props)?,
            spread_depth: props.parse_or("spread-depth", SearchSettings::SPREAD_EVERYWHERE)?,
            ..SearchSettings::default()
        },
        seed: props.parse_or("replica-index", 0)?,
    })
}

/// Holds part of the search tree (see the module docs).
#[derive(Debug, Default)]
pub struct MctsWorker;

#[async_trait::async_trait]
impl Device for MctsWorker {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let settings = worker_settings(ctx)?;
        match settings.which {
            Which::Hex(_) => work::<Hex>(ctx, settings).await,
            Which::TicTacToe => work::<TicTacToe>(ctx, settings).await,
        }
    }
}

async fn work<G: Game>(ctx: &mut DeviceContext, settings: WorkerSettings) -> Result<(), BoxError> {
    let group = settings.group;
    // Not a member at all read "needs the driver listed first" (a bad-input sweep).
    let Some(members) = ctx.property_text(&format!("rpc.{group}.members")) else {
        return Err(format!(
            "device {:?} is in no rpc group {group:?}: declare one with [[rpc]] (name = {group:?}, members = the driver, then the workers) in a topology and start it with `ferromq run`: a device started alone is in no group",
            ctx.id()
        )
        .into());
    };
    let n_workers = members.split(',').count().saturating_sub(1);
    if members.split(',').next() == Some(ctx.id()) || n_workers == 0 {
        return Err(format!(
            "rpc group {group:?} ({members}): an mcts worker needs the driver listed first and itself after it"
        )
        .into());
    }
    let finished = Arc::new(tokio::sync::Notify::new());
    let finish = Arc::clone(&finished);
    let game = settings.which.describe();
    let handlers = worker_handlers::<G>(
        n_workers,
        settings.search,
        settings.seed.wrapping_add(0x9e37_79b9),
    )
    .on::<Finish, _, _>(move |_, ()| {
        finish.notify_one();
        std::future::ready(())
    })
    .on::<GameOf, _, _>(move |_, ()| std::future::ready(game.clone()));
    let rpc = ferromq_rpc::join(ctx, &group, handlers).await?;
    tokio::select! {
        () = finished.notified() => {}
        () = ctx.stopped() => {}
    }
    leave(&rpc).await
}

/// Every worker of the group plays `which`, the driver's game; otherwise an error naming the
/// first that does not, with both games.
async fn same_game(rpc: &Rpc, driver: &str, which: Which, group: &str) -> Result<(), BoxError> {
    let ours = which.describe();
    for idx in 1..rpc.members().len() {
        let theirs = rpc.call_return::<GameOf>(idx, &()).await?;
        if theirs != ours {
            return Err(format!(
                "mcts worker {:?} plays {theirs}, the driver {driver:?} {ours}: give every \
                 member of rpc group {group:?} the same `game` and `board`",
                rpc.members()[idx]
            )
            .into());
        }
    }
    Ok(())
}

/// Shuts the member down; calls that could not reach members already gone are no failure of
/// this device (the group is ending, each member within half a second: the search they were
/// part of is over), and one line says how many.
async fn leave(rpc: &Rpc) -> Result<(), BoxError> {
    match rpc
        .shutdown_within(std::time::Duration::from_millis(500))
        .await
    {
        Ok(()) => Ok(()),
        Err(error @ ferromq_core::Error::Undelivered { .. }) => {
            tracing::info!(%error, "left the search group with calls its members did not take: the group is ending");
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// A driver's properties (what [`crate::Builtin::check_properties`] checks).
pub(crate) struct DriverSettings {
    which: Which,
    group: String,
    rollouts: u64,
    moves: u64,
    in_flight: usize,
    time: Option<std::time::Duration>,
}

pub(crate) fn driver_settings(props: &impl Properties) -> Result<DriverSettings, DeviceError> {
    let at_least_one = |key: &str, value: u64| {
        if value == 0 {
            Err(props.invalid(
                key,
                "has invalid value \"0\": expected at least 1".to_owned(),
            ))
        } else {
            Ok(value)
        }
    };
    let seconds: f64 = props.parse_or("seconds", 0.0)?;
    if !(0.0..=MAX_SECONDS).contains(&seconds) {
        return Err(props.invalid(
            "seconds",
            format!(
                "has invalid value \"{}\": a time per move in seconds, 0 for none, at most \
                 {MAX_SECONDS:e}",
                props.text("seconds").unwrap_or_default()
            ),
        ));
    }
    // A time set without `rollouts` is the move's budget alone, as users of a time budget expect.
    let default_rollouts = if seconds > 0.0 { u64::MAX } else { 10_000 };
    let in_flight: usize = props.parse_or("in-flight", IN_FLIGHT_PER_WORKER)?;
    at_least_one("in-flight", in_flight as u64)?;
    Ok(DriverSettings {
        which: which(props)?,
        group: group(props)?,
        rollouts: at_least_one("rollouts", props.parse_or("rollouts", default_rollouts)?)?,
        moves: props.parse_or("moves", 1)?,
        in_flight,
        time: (seconds > 0.0).then(|| std::time::Duration::from_secs_f64(seconds)),
    })
}

/// Plays moves by distributed search (see the module docs).
#[derive(Debug, Default)]
pub struct MctsDriver;

#[async_trait::async_trait]
impl Device for MctsDriver {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let settings = driver_settings(ctx)?;
        match settings.which {
            Which::Hex(board) => {
                drive(ctx, Hex::new(board)?, settings, |position: &Hex, mv| {
                    position.move_name(mv)
                })
                .await
            }
            Which::TicTacToe => {
                drive(ctx, TicTacToe::default(), settings, |_: &TicTacToe, mv| {
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
    settings: DriverSettings,
    name: fn(&G, G::Move) -> String,
) -> Result<(), BoxError> {
    let DriverSettings {
        which,
        group,
        rollouts,
        moves,
        in_flight,
        time,
    } = settings;
    let counts = Arc::new(DriverCounts::default());
    let handlers = driver_handlers::<G>(&counts).on::<Finish, _, _>(|_, ()| std::future::ready(()));
    let rpc = ferromq_rpc::join(ctx, &group, handlers).await?;
    if rpc.me() != 0 {
        return Err(format!("the mcts driver must be listed first in rpc group {group:?}").into());
    }
    if let Err(error) = same_game(&rpc, ctx.id(), which, &group).await {
        // The workers wait for the search; tell them it will not come.
        if let Ok(ticket) = rpc.broadcast::<Finish>(&()).await {
            let _ = ticket.confirmed().await;
        }
        let _ = leave(&rpc).await;
        return Err(error);
    }
    let mut driver = Driver::<G>::new(rpc.clone(), counts);
    driver.in_flight = in_flight.saturating_mul(rpc.members().len().saturating_sub(1).max(1));
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A driver's properties, for [`driver_settings`].
    struct Table(BTreeMap<String, String>);

    impl Properties for Table {
        fn device_id(&self) -> &str {
            "driver"
        }

        fn text(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
    }

    fn settings(pairs: &[(&str, &str)]) -> Result<DriverSettings, DeviceError> {
        let table = pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        driver_settings(&Table(table))
    }

    #[test]
    fn a_time_set_alone_is_the_budget_of_a_move() {
        let timed = settings(&[("seconds", "2")]).unwrap();
        assert_eq!(timed.rollouts, u64::MAX);
        assert_eq!(timed.time, Some(std::time::Duration::from_secs(2)));
        let both = settings(&[("seconds", "2"), ("rollouts", "500")]).unwrap();
        assert_eq!(both.rollouts, 500);
        let neither = settings(&[]).unwrap();
        assert_eq!((neither.rollouts, neither.time), (10_000, None));
        let Err(error) = settings(&[("seconds", "-1")]) else {
            panic!("seconds = -1 was taken");
        };
        let error = error.to_string();
        assert!(error.contains("seconds") && error.contains("-1"), "{error}");
        // Too long for a `Duration`: refused, not a panic when the move starts.
        for huge in ["1e300", "inf", "NaN"] {
            let Err(error) = settings(&[("seconds", huge)]) else {
                panic!("seconds = {huge} was taken");
            };
            assert!(error.to_string().contains("seconds"), "{error}");
        }
    }

    #[test]
    fn a_worker_reads_its_spread_depth_and_refuses_a_bad_one_by_name() {
        let worker = |pairs: &[(&str, &str)]| {
            let table = pairs
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect();
            worker_settings(&Table(table)).map(|settings| settings.search.spread_depth)
        };
        assert_eq!(worker(&[]).unwrap(), SearchSettings::SPREAD_EVERYWHERE);
        assert_eq!(worker(&[("spread-depth", "2")]).unwrap(), 2);
        for bad in ["-1", "two", "99999999999"] {
            let Err(error) = worker(&[("spread-depth", bad)]) else {
                panic!("spread-depth = {bad} was taken");
            };
            let error = error.to_string();
            assert!(
                error.contains("spread-depth") && error.contains(bad),
                "{error}"
            );
        }
    }
}
