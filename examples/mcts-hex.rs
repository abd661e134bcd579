//! Distributed Monte-Carlo tree search for Hex on ferromq's remote invocation: this process is
//! the driver, `--workers N` copies of it are the workers that hold the tree.
//!
//! ```text
//! cargo run --release --example mcts-hex -- --board 11 --workers 2 --rollouts 20000 --json
//! cargo run --release --example mcts-hex -- --board 7 --workers 2 --rollouts 2000 --versus random --games 40 --json
//! ```
//!
//! Options: `--board S` (default 11, 2 to 19), `--workers N` (2, at most 256), `--rollouts R`
//! per search or move (10000; no limit where `--seconds` is given alone), `--aggregate
//! none|trad|ovfl` (ovfl), `--aggregate-bytes B` (the frame size of `trad` and `ovfl`: 4096)
//! and `--aggregate-us U` (`trad`'s longest hold: 100), `--playouts P` per new node (16, at
//! most 65536: a simulation's playouts are not interrupted),
//! `--spread-depth D` (nodes down to D moves below the root placed by their hash, deeper ones
//! kept with their parent's owner; none: every node by its hash), `--in-flight K` simulations
//! per worker (256, at most 4096), `--seconds T` per search or move (none: the rollouts alone
//! are the budget), `--warm-up T` (a search of T seconds from the same position before the one
//! measured, its tree then dropped: BENCHMARKS.md's warm-up; not with `--versus`),
//! `--transport shmem|zeromq` (shmem), `--versus random|plain` with `--games G` (10) and, for
//! `plain`, `--plain-iterations I` (the rollouts; needed with `--seconds` alone), `--plain`
//! (time the single-process UCT alone: `--rollouts` iterations, no `--seconds`, and none of the
//! options of the distributed search), `--json`. An option a run would not read is refused, as
//! is every value out of range: a usage error exits with 2.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferromq::mcts::hex::{Hex, MAX_SIZE, MIN_SIZE};
use ferromq::mcts::local::{LocalConfig, LocalSearch, run_worker_if_asked};
use ferromq::mcts::plain::PlainSearch;
use ferromq::mcts::search::SearchSettings;
use ferromq::mcts::{Game, Outcome, Rng};
use ferromq::rpc::Aggregation;
use ferromq::{Transport, TransportOptions};

/// The transports of this build, by name, for the driver and every worker.
pub fn make_transport(name: &str, session: &str) -> Result<Arc<dyn Transport>, String> {
    ferromq::transports()
        .create(name, &TransportOptions::for_session(session))
        .map_err(|error| error.to_string())
}

struct Options {
    board: usize,
    workers: usize,
    /// `--rollouts`, where given: see [`Options::rollout_budget`].
    rollouts: Option<u64>,
    aggregate: Aggregation,
    aggregate_bytes: usize,
    aggregate_us: u64,
    playouts: u32,
    /// Nodes deeper than this below the root stay with their parent's owner.
    spread_depth: u32,
    in_flight: usize,
    transport: String,
    versus: Option<String>,
    games: u32,
    plain_iterations: Option<u64>,
    seconds: Option<f64>,
    warm_up: Option<f64>,
    plain: bool,
    json: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        board: 11,
        workers: 2,
        rollouts: None,
        aggregate: Aggregation::Ovfl,
        aggregate_bytes: ferromq::rpc::RpcOptions::default().aggregate_bytes,
        aggregate_us: ferromq::rpc::RpcOptions::default()
            .aggregate_delay
            .as_micros() as u64,
        playouts: 16,
        spread_depth: SearchSettings::SPREAD_EVERYWHERE,
        in_flight: ferromq::mcts::search::IN_FLIGHT_PER_WORKER,
        transport: "shmem".to_owned(),
        versus: None,
        games: 10,
        plain_iterations: None,
        seconds: None,
        warm_up: None,
        plain: false,
        json: false,
    };
    // Each option given, with its value as typed: what the checks below name.
    let mut given: Vec<(&str, String)> = Vec::new();
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut as_typed = flag.clone();
        let mut value = || {
            let value = args
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))?;
            as_typed = format!("{flag} {value}");
            Ok::<_, String>(value)
        };
        /// `text` as a whole number from `min` (to `max`, when there is one).
        fn within<T>(flag: &str, text: String, min: T, max: Option<T>) -> Result<T, String>
        where
            T: std::str::FromStr + PartialOrd + std::fmt::Display,
        {
            let parsed = text.parse::<T>();
            match parsed {
                Ok(number) if number >= min && max.as_ref().is_none_or(|max| number <= *max) => {
                    Ok(number)
                }
                _ => Err(match max {
                    Some(max) => format!("{flag} {text}: a whole number from {min} to {max}"),
                    // A whole number `T` cannot hold; one it holds below `min` is too small.
                    None if parsed.is_err()
                        && text.parse::<u128>().is_ok_and(|number| number > 0) =>
                    {
                        format!("{flag} {text}: too large a number")
                    }
                    None => format!("{flag} {text}: a whole number of at least {min}"),
                }),
            }
        }
        /// `text` as a positive number of seconds, at most [`ferromq::MAX_SECONDS`] (a longer
        /// one is no `Duration`).
        fn positive_seconds(flag: &str, text: String, what: &str) -> Result<f64, String> {
            match text.parse::<f64>() {
                Ok(seconds) if seconds > 0.0 && seconds <= ferromq::MAX_SECONDS => Ok(seconds),
                _ => Err(format!(
                    "{flag} {text}: a positive number of seconds {what}, at most {:e}",
                    ferromq::MAX_SECONDS
                )),
            }
        }
        fn number<T>(flag: &str, text: String, min: T) -> Result<T, String>
        where
            T: std::str::FromStr + PartialOrd + std::fmt::Display,
        {
            within(flag, text, min, None)
        }
        match flag.as_str() {
            "--board" => options.board = within(flag, value()?, MIN_SIZE, Some(MAX_SIZE))?,
            "--workers" => options.workers = within(flag, value()?, 1, Some(MAX_WORKERS))?,
            "--rollouts" => options.rollouts = Some(number(flag, value()?, 1)?),
            "--aggregate" => {
                let text = value()?;
                options.aggregate = text
                    .parse()
                    .map_err(|error| format!("{flag} {text}: {error}"))?;
            }
            // The ranges a topology's group takes for the same settings.
            "--aggregate-bytes" => {
                let (low, high) = ferromq::rpc::AGGREGATE_BYTES_BOUNDS;
                options.aggregate_bytes = within(flag, value()?, low, Some(high))? as usize;
            }
            "--aggregate-us" => {
                let (low, high) = ferromq::rpc::AGGREGATE_US_BOUNDS;
                options.aggregate_us = within(flag, value()?, low, Some(high))?;
            }
            "--playouts" => {
                options.playouts = within(flag, value()?, 1, Some(SearchSettings::MAX_PLAYOUTS))?;
            }
            "--spread-depth" => options.spread_depth = number(flag, value()?, 0)?,
            "--in-flight" => options.in_flight = within(flag, value()?, 1, Some(MAX_IN_FLIGHT))?,
            "--transport" => match value()?.as_str() {
                name @ ("shmem" | "zeromq") => options.transport = name.to_owned(),
                other => return Err(format!("--transport {other}: shmem or zeromq")),
            },
            "--versus" => match value()?.as_str() {
                name @ ("random" | "plain") => options.versus = Some(name.to_owned()),
                other => return Err(format!("--versus {other}: random or plain")),
            },
            "--games" => options.games = number(flag, value()?, 1)?,
            "--plain-iterations" => options.plain_iterations = Some(number(flag, value()?, 1)?),
            "--seconds" => {
                options.seconds = Some(positive_seconds(flag, value()?, "per search")?);
            }
            "--warm-up" => {
                options.warm_up = Some(positive_seconds(flag, value()?, "to search first")?);
            }
            "--plain" => options.plain = true,
            "--json" => options.json = true,
            other => {
                return Err(format!(
                    "unknown option {other} (see the top of examples/mcts-hex.rs)"
                ));
            }
        }
        given.push((flag.as_str(), as_typed));
    }
    let typed = |flag: &str| {
        given
            .iter()
            .rev()
            .find(|(name, _)| *name == flag)
            .map(|(_, typed)| typed.as_str())
    };
    if let Some(seconds) = options.seconds {
        if options.plain {
            return Err(format!(
                "--seconds {seconds}: --plain times a fixed number of iterations (--rollouts R), \
                 not a time"
            ));
        }
        let plain_opponent = options.versus.as_deref() == Some("plain");
        if plain_opponent && options.rollouts.is_none() && options.plain_iterations.is_none() {
            return Err(format!(
                "--versus plain --seconds {seconds}: the plain player searches a number of \
                 iterations, not a time; give it --plain-iterations I (or both players \
                 --rollouts R)"
            ));
        }
    }
    if options.plain
        && let Some(other) = DISTRIBUTED_ONLY.iter().find_map(|flag| typed(flag))
    {
        return Err(format!(
            "{other} with --plain: --plain times the single-process UCT alone, which reads \
             only --board, --rollouts, --playouts and --json"
        ));
    }
    match options.versus.as_deref() {
        None => {
            if let Some(games) = ["--games", "--plain-iterations"]
                .iter()
                .find_map(|flag| typed(flag))
            {
                return Err(format!(
                    "{games} without --versus: there are games only against an opponent \
                     (--versus random|plain)"
                ));
            }
        }
        Some(opponent) => {
            if let Some(warm_up) = typed("--warm-up") {
                return Err(format!(
                    "{warm_up} with --versus {opponent}: the warm-up goes before a single \
                     search (no --versus), not before the moves of games"
                ));
            }
            if let Some(iterations) = typed("--plain-iterations").filter(|_| opponent != "plain") {
                return Err(format!(
                    "{iterations} with --versus {opponent}: they are the plain opponent's \
                     (--versus plain)"
                ));
            }
        }
    }
    // As a topology's rpc group refuses them (ferromq-topology): a frame size `none` never
    // fills, a hold only `trad` makes.
    if let Some(bytes) =
        typed("--aggregate-bytes").filter(|_| options.aggregate == Aggregation::None)
    {
        return Err(format!(
            "{bytes} with --aggregate none: each call is a frame of its own; give it only with \
             --aggregate trad or ovfl"
        ));
    }
    if let Some(micros) = typed("--aggregate-us").filter(|_| options.aggregate != Aggregation::Trad)
    {
        let default = if typed("--aggregate").is_none() {
            " (the default)"
        } else {
            ""
        };
        return Err(format!(
            "{micros} with --aggregate {}{default}: only trad holds a frame that is not full; \
             give it only with --aggregate trad",
            options.aggregate
        ));
    }
    Ok(options)
}

/// The most workers `--workers` starts: each is a process of its own, connected to every other
/// member (256 make ~33 000 connections).
const MAX_WORKERS: usize = 256;

/// The most simulations `--in-flight` keeps in flight per worker (16 times the default; the
/// benchmarks gain nothing past 1024). More only pile virtual losses on the same few nodes, and
/// a search with a time ends only once those in flight have finished: a million ran a 1-s
/// search for minutes.
const MAX_IN_FLIGHT: usize = 4096;

/// The options that only the distributed search reads, which `--plain` therefore refuses.
const DISTRIBUTED_ONLY: [&str; 11] = [
    "--workers",
    "--transport",
    "--aggregate",
    "--aggregate-bytes",
    "--aggregate-us",
    "--spread-depth",
    "--in-flight",
    "--warm-up",
    "--versus",
    "--games",
    "--plain-iterations",
];

/// Rollouts per search or move when `--rollouts` is not given.
const DEFAULT_ROLLOUTS: u64 = 10_000;

impl Options {
    /// The rollouts that end a search: `--rollouts`; without it, none where `--seconds` bounds
    /// the search (a time budget given alone is the budget), else [`DEFAULT_ROLLOUTS`].
    fn rollout_budget(&self) -> u64 {
        match (self.rollouts, self.seconds) {
            (Some(rollouts), _) => rollouts,
            (None, Some(_)) => u64::MAX,
            (None, None) => DEFAULT_ROLLOUTS,
        }
    }
}

pub fn main() -> ExitCode {
    ferromq::run_watchdog_if_requested();
    if let Some(code) = run_worker_if_asked::<Hex>(make_transport) {
        return code;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("mcts-hex: {error}");
            return ExitCode::from(2);
        }
    };
    if options.plain {
        plain_alone(&options);
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let driven = runtime.block_on(async move {
        let mut driving = tokio::spawn(async move { drive(&options).await });
        tokio::select! {
            joined = &mut driving => joined
                .unwrap_or_else(|error| Err(format!("the driver task failed: {error}")))
                .map(|()| None),
            signal = stop_signal() => {
                // The driver's future dropped kills the workers and removes the group's ipc
                // files; the session's shared memory goes here, as after a search.
                driving.abort();
                let _ = driving.await;
                clean_shared_memory();
                Ok(Some(signal))
            }
        }
    });
    match driven {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(name)) => {
            eprintln!("mcts-hex: stopped by {name}; the workers and their files are gone");
            ExitCode::from(ferromq::Signals::exit_code(name))
        }
        Err(error) => {
            eprintln!("mcts-hex: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The session of this driver's group: its ipc files' and shared memory's names.
fn session() -> String {
    format!("mcts-{}", std::process::id())
}

/// Removes the session's shared memory (every member's), whoever made it.
fn clean_shared_memory() {
    let _ =
        ferromq::shm::cleanup::clean_session(ferromq::shm::names::current_uid(), &session(), true);
}

/// The first SIGINT or SIGTERM (never, where neither can be caught): the driver then stops the
/// workers and removes what the group made before it exits, as a search that ends does.
async fn stop_signal() -> &'static str {
    match ferromq::Signals::install() {
        Ok(mut signals) => signals.next().await,
        Err(_) => std::future::pending().await,
    }
}

/// The single-process UCT alone on the empty board: the yardstick for rollouts/s.
fn plain_alone(options: &Options) {
    let position = Hex::new(options.board).expect("checked");
    let started = Instant::now();
    // `parse` refuses `--seconds` here, so the budget is a number of iterations.
    let rollouts = options.rollout_budget();
    let best = PlainSearch::new(1, options.playouts).best_move(&position, rollouts);
    let seconds = started.elapsed().as_secs_f64();
    let rate = rollouts as f64 / seconds;
    let best = best.map(|mv| position.move_name(mv)).unwrap_or_default();
    if options.json {
        println!(
            "{{\"plain\":true,\"board\":{},\"rollouts\":{},\"rollouts_per_s\":{rate:.0},\"playouts\":{},\"best_move\":\"{best}\",\"seconds\":{seconds:.3}}}",
            options.board, rollouts, options.playouts
        );
    } else {
        println!(
            "plain UCT, {}x{}: {} rollouts in {seconds:.2} s ({rate:.0}/s), best {best}",
            options.board, options.board, rollouts
        );
    }
}

async fn drive(options: &Options) -> Result<(), String> {
    let config = LocalConfig {
        workers: options.workers,
        transport: options.transport.clone(),
        session: session(),
        aggregation: options.aggregate,
        aggregate_bytes: options.aggregate_bytes,
        aggregate_delay: Duration::from_micros(options.aggregate_us),
        settings: SearchSettings {
            playouts: options.playouts,
            spread_depth: options.spread_depth,
            ..SearchSettings::default()
        },
        timeout: Duration::from_secs(30),
    };
    let program = std::env::current_exe().map_err(|error| error.to_string())?;
    let mut search = LocalSearch::<Hex>::start(&program, make_transport, &config).await?;
    // `parse` bounds both (at most 4096 x 256); saturating all the same.
    search.driver.in_flight = options.in_flight.saturating_mul(options.workers);
    let outcome = match &options.versus {
        None => one_search(options, &search).await,
        Some(opponent) => play_games(options, &search, opponent).await,
    };
    let stopped = search.stop().await;
    clean_shared_memory();
    outcome.and(stopped)
}

async fn one_search(options: &Options, search: &LocalSearch<Hex>) -> Result<(), String> {
    let position = Hex::new(options.board).map_err(|error| error.to_string())?;
    if let Some(warm_up) = options.warm_up {
        // Its tree goes with the next search's reset; the processes and their memory stay.
        search
            .driver
            .search_within(&position, u64::MAX, Some(Duration::from_secs_f64(warm_up)))
            .await
            .map_err(|error| error.to_string())?;
    }
    // The counts are the members' since they started: the warm-up's are taken off.
    let before = match options.warm_up {
        Some(_) => search
            .driver
            .traffic()
            .await
            .map_err(|error| error.to_string())?,
        None => Default::default(),
    };
    let result = search
        .driver
        .search_within(
            &position,
            options.rollout_budget(),
            options.seconds.map(Duration::from_secs_f64),
        )
        .await
        .map_err(|error| error.to_string())?;
    let traffic = search
        .driver
        .traffic()
        .await
        .map_err(|error| error.to_string())?;
    let rate = result.rollouts as f64 / result.seconds;
    let best = result
        .best_move
        .map(|mv| position.move_name(mv))
        .unwrap_or_default();
    let mut root = result.root.clone();
    root.sort_by_key(|edge| std::cmp::Reverse(edge.visits));
    let top: Vec<String> = root
        .iter()
        .take(5)
        .map(|edge| format!("[\"{}\",{}]", position.move_name(edge.mv), edge.visits))
        .collect();
    let (records, frames, local_steps) = (
        traffic.records.saturating_sub(before.records),
        traffic.frames.saturating_sub(before.frames),
        traffic.local_steps.saturating_sub(before.local_steps),
    );
    let share = traffic.aggregated.saturating_sub(before.aggregated) as f64 / records.max(1) as f64;
    let spread_depth = match options.spread_depth {
        SearchSettings::SPREAD_EVERYWHERE => "null".to_owned(),
        depth => depth.to_string(),
    };
    if options.json {
        println!(
            "{{\"board\":{},\"workers\":{},\"aggregate\":\"{}\",\"transport\":\"{}\",\"rollouts\":{},\"rollouts_per_s\":{rate:.0},\"playouts\":{},\"playouts_per_s\":{:.0},\"best_move\":\"{best}\",\"root_visits\":[{}],\"remote_calls\":{records},\"remote_frames\":{frames},\"aggregated_share\":{share:.3},\"local_steps\":{local_steps},\"spread_depth\":{spread_depth},\"seconds\":{:.3},\"warm_up_s\":{}}}",
            options.board,
            options.workers,
            options.aggregate,
            options.transport,
            result.rollouts,
            result.playouts,
            result.playouts as f64 / result.seconds,
            top.join(","),
            result.seconds,
            options.warm_up.unwrap_or(0.0)
        );
    } else {
        println!(
            "{}x{} Hex, {} workers ({}, {}): {} rollouts in {:.2} s ({rate:.0}/s); best move {best}; most visited {}; {records} remote calls in {frames} frames, {:.0}% aggregated; {local_steps} steps without a call",
            options.board,
            options.board,
            options.workers,
            options.transport,
            options.aggregate,
            result.rollouts,
            result.seconds,
            top.join(" "),
            share * 100.0
        );
    }
    Ok(())
}

async fn play_games(
    options: &Options,
    search: &LocalSearch<Hex>,
    opponent: &str,
) -> Result<(), String> {
    let mut rng = Rng::new(0x5eed);
    let mut plain = PlainSearch::new(0x5eed, options.playouts);
    // `parse` refuses a plain opponent without a number of iterations.
    let plain_iterations = options
        .plain_iterations
        .unwrap_or_else(|| options.rollout_budget());
    let (mut wins, mut losses) = (0u32, 0u32);
    for game in 0..options.games {
        let ours = (game % 2) as u8;
        let mut position = Hex::new(options.board).map_err(|error| error.to_string())?;
        let outcome = loop {
            if let Some(outcome) = position.outcome() {
                break outcome;
            }
            let mv = if position.to_move() == ours {
                search
                    .driver
                    .search_within(
                        &position,
                        options.rollout_budget(),
                        options.seconds.map(Duration::from_secs_f64),
                    )
                    .await
                    .map_err(|error| error.to_string())?
                    .best_move
            } else if opponent == "plain" {
                plain.best_move(&position, plain_iterations)
            } else {
                let mut moves = Vec::new();
                position.legal_moves(&mut moves);
                moves.get(rng.below(moves.len().max(1))).copied()
            };
            position.play(mv.ok_or("no move in a game that goes on")?);
        };
        if outcome == Outcome::Win(ours) {
            wins += 1;
        } else {
            losses += 1;
        }
        if !options.json {
            println!(
                "game {}: {}",
                game + 1,
                if outcome == Outcome::Win(ours) {
                    "won"
                } else {
                    "lost"
                }
            );
        }
    }
    if options.json {
        println!(
            "{{\"board\":{},\"workers\":{},\"versus\":\"{opponent}\",\"games\":{},\"rollouts\":{},\"wins\":{wins},\"losses\":{losses}}}",
            options.board,
            options.workers,
            options.games,
            // No number where the time alone bounded each move.
            match options.rollout_budget() {
                u64::MAX => "null".to_owned(),
                rollouts => rollouts.to_string(),
            }
        );
    } else {
        println!("against {opponent}: {wins} won, {losses} lost");
    }
    Ok(())
}
