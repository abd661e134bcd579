//! The distributed search in one process (members over zeromq inproc): it finds the known
//! values of tic-tac-toe positions, and leaves no virtual loss behind on Hex.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferromq_core::{Address, Transport};
use ferromq_mcts::hex::Hex;
use ferromq_mcts::search::{
    Driver, DriverCounts, START_BATCH, SearchSettings, driver_handlers, worker_handlers,
};
use ferromq_mcts::tictactoe::TicTacToe;
use ferromq_mcts::{Game, Outcome};
use ferromq_rpc::{Aggregation, Inbound, Member, Rpc, RpcOptions};

static NEXT: AtomicUsize = AtomicUsize::new(0);

async fn group<G: Game>(n_workers: usize, aggregation: Aggregation) -> (Driver<G>, Vec<Rpc>) {
    group_with(n_workers, aggregation, SearchSettings::default()).await
}

async fn group_with<G: Game>(
    n_workers: usize,
    aggregation: Aggregation,
    settings: SearchSettings,
) -> (Driver<G>, Vec<Rpc>) {
    let transport: Arc<dyn Transport> = Arc::new(ferromq_zmq::ZmqTransport::new());
    let tag = NEXT.fetch_add(1, Ordering::Relaxed);
    let members: Vec<Member> = (0..=n_workers)
        .map(|idx| Member {
            name: if idx == 0 {
                "driver".to_owned()
            } else {
                format!("worker-{}", idx - 1)
            },
            address: Address::parse(&format!("inproc://mcts-{}-{tag}-{idx}", std::process::id()))
                .unwrap(),
        })
        .collect();
    let mut inbounds = Vec::new();
    for member in &members {
        inbounds.push(
            Inbound::bind(transport.as_ref(), &member.address)
                .await
                .unwrap(),
        );
    }
    let options = RpcOptions {
        aggregation,
        timeout: Duration::from_secs(20),
        ..RpcOptions::default()
    };
    let counts = Arc::new(DriverCounts::default());
    let mut workers = Vec::new();
    let mut driver = None;
    for (idx, inbound) in inbounds.into_iter().enumerate() {
        let handlers = if idx == 0 {
            driver_handlers::<G>(&counts)
        } else {
            worker_handlers::<G>(n_workers, settings, idx as u64)
        };
        let rpc = Rpc::start(
            Arc::clone(&transport),
            idx,
            &members,
            inbound,
            handlers,
            options.clone(),
        )
        .await
        .unwrap();
        if idx == 0 {
            driver = Some(Driver::new(rpc, Arc::clone(&counts)));
        } else {
            workers.push(rpc);
        }
    }
    (driver.unwrap(), workers)
}

/// Stops the group: the workers, then the driver.
async fn stop<G: Game>(driver: Driver<G>, workers: Vec<Rpc>) {
    for worker in workers {
        worker.shutdown().await.unwrap();
    }
    driver.rpc().shutdown().await.unwrap();
}

/// A search of 3000 rollouts after `moves` plays a move that keeps the position's value.
async fn keeps_the_value(driver: &Driver<TicTacToe>, moves: &[u8], case: &str) {
    let position = TicTacToe::after(moves);
    let (value, _) = position.solve();
    let result = driver.search(&position, 3000).await.unwrap();
    let best = result.best_move.expect("a move");
    assert_eq!(result.rollouts, 3000, "{case}after {moves:?}");
    assert_eq!(
        value_after(&position, best),
        value,
        "{case}after {moves:?} the search played {best}, which does not keep the value {value}"
    );
}

fn value_after(position: &TicTacToe, mv: u8) -> f64 {
    let mut next = position.clone();
    next.play(mv);
    // The value for the player who moved.
    1.0 - next.solve().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tic_tac_toe_finds_the_forced_win_and_keeps_the_draw() {
    let (driver, workers) = group::<TicTacToe>(2, Aggregation::Ovfl).await;
    // X to move wins at once; O to move must block; X to move with a fork; the empty board.
    for moves in [
        &[0, 3, 1, 4][..],
        &[0, 4, 1],
        &[0, 4, 8, 2],
        &[4, 1, 0, 8, 6],
        &[],
    ] {
        keeps_the_value(&driver, moves, "").await;
    }
    assert_eq!(driver.pending().await.unwrap(), (0, 0));
    stop(driver, workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hex_5x5_with_2_and_8_workers_ends_with_no_virtual_loss_in_every_mode() {
    // With 8 workers the root's owner holds fewer nodes than the others (`Placement`).
    for n_workers in [2, 8] {
        for aggregation in [Aggregation::None, Aggregation::Trad, Aggregation::Ovfl] {
            let case = format!("{n_workers} workers, {aggregation}");
            let (driver, workers) = group::<Hex>(n_workers, aggregation).await;
            let position = Hex::new(5).unwrap();
            let result = driver.search(&position, 2000).await.unwrap();
            assert_eq!(result.rollouts, 2000, "{case}");
            let visits: u64 = result.root.iter().map(|edge| edge.visits).sum();
            assert!(
                visits > 0 && result.root.len() == 25,
                "{case}: {:?}",
                result.root.len()
            );
            assert_eq!(
                driver.pending().await.unwrap(),
                (0, 0),
                "{case}: virtual losses or deferred selections left"
            );
            let traffic = driver.traffic().await.unwrap();
            // The driver starts the simulations in batches and the root's owner reports them
            // in batches; their steps from node to node are calls between the workers or
            // taken where the next node lives.
            let batches = 2000u64.div_ceil(START_BATCH);
            assert!(
                traffic.records >= 2 * batches && traffic.local_steps > 0,
                "{case}: {traffic:?} for 2000 simulations"
            );
            assert!(
                traffic.records + traffic.local_steps > 2000 * 3,
                "{case}: {traffic:?}: fewer than 3 steps per simulation"
            );
            stop(driver, workers).await;
        }
    }
}

#[test]
fn a_random_playout_of_tic_tac_toe_ends() {
    let mut rng = ferromq_mcts::Rng::new(3);
    let outcome = TicTacToe::default().random_playout(&mut rng);
    assert!(matches!(outcome, Outcome::Win(_) | Outcome::Draw));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tic_tac_toe_never_loses_against_perfect_play() {
    let (driver, workers) = group::<TicTacToe>(2, Aggregation::Ovfl).await;
    for ours in [0u8, 1] {
        let mut position = TicTacToe::default();
        while position.outcome().is_none() {
            let mv = if position.to_move() == ours {
                driver.search(&position, 3000).await.unwrap().best_move
            } else {
                position.solve().1
            };
            position.play(mv.expect("a move in a game that goes on"));
        }
        let outcome = position.outcome().unwrap();
        assert_ne!(
            outcome,
            Outcome::Win(ours ^ 1),
            "lost as player {ours}: {position:?}"
        );
    }
    stop(driver, workers).await;
}

/// One worker too: every step there is local, and the root's owner, which keeps the search
/// going, must still answer the driver's halt when the time is up. (A handler that never ends
/// holds a thread of the runtime the whole group shares, so the search runs on a thread of its
/// own and the test gives up on it after a minute.)
#[test]
fn a_time_budget_ends_the_search_with_every_simulation_finished() {
    for n_workers in [2, 1] {
        let (ended, end) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(time_budget(n_workers));
            let _ = ended.send(());
        });
        match end.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("{n_workers} workers: the search did not end")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                panic!("{n_workers} workers: the search failed (its panic is above)")
            }
        }
    }
}

async fn time_budget(n_workers: usize) {
    let (driver, workers) = group::<Hex>(n_workers, Aggregation::Ovfl).await;
    let position = Hex::new(7).unwrap();
    let result = driver
        .search_within(&position, u64::MAX, Some(Duration::from_millis(300)))
        .await
        .unwrap_or_else(|error| panic!("{n_workers} workers: {error}"));
    assert!(result.rollouts > 0 && result.rollouts < u64::MAX);
    assert!(result.best_move.is_some());
    assert_eq!(
        driver.pending().await.unwrap(),
        (0, 0),
        "{n_workers} workers: simulations left in flight"
    );
    stop(driver, workers).await;
}

/// With a spread depth, the nodes below it stay with their parent's owner: at depth 0 every
/// node is the root's owner's and no simulation makes a call between the workers; at depth 1
/// the search still spreads (and, with 8 workers, still finds tic-tac-toe's values and leaves
/// nothing in flight: a selection that waited for a child's creation goes where the edge says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_spread_depth_nodes_stay_with_their_parents_owner() {
    let settings = |spread_depth| SearchSettings {
        spread_depth,
        ..SearchSettings::default()
    };
    let position = Hex::new(5).unwrap();
    let mut calls_per_simulation = Vec::new();
    for spread_depth in [0, 1, SearchSettings::SPREAD_EVERYWHERE] {
        let (driver, workers) =
            group_with::<Hex>(2, Aggregation::Ovfl, settings(spread_depth)).await;
        let result = driver.search(&position, 2000).await.unwrap();
        assert_eq!(result.rollouts, 2000, "spread depth {spread_depth}");
        assert_eq!(
            driver.pending().await.unwrap(),
            (0, 0),
            "spread depth {spread_depth}"
        );
        let traffic = driver.traffic().await.unwrap();
        calls_per_simulation.push(traffic.records as f64 / 2000.0);
        if spread_depth == 0 {
            // The driver's batches and the reports: fewer calls than simulations.
            assert!(
                traffic.records < 2000 && traffic.local_steps > 2000 * 3,
                "spread depth 0: {traffic:?}"
            );
        }
        stop(driver, workers).await;
    }
    assert!(
        calls_per_simulation[0] < calls_per_simulation[1]
            && calls_per_simulation[1] < calls_per_simulation[2],
        "calls per simulation at spread depth 0, 1 and everywhere: {calls_per_simulation:?}"
    );

    let (mut driver, workers) = group_with::<TicTacToe>(8, Aggregation::Ovfl, settings(1)).await;
    // 256 in flight per worker would be most of the budget: few results to choose by.
    driver.in_flight = 64;
    for moves in [&[0, 3, 1, 4][..], &[0, 4, 1], &[]] {
        keeps_the_value(&driver, moves, "spread depth 1, ").await;
    }
    assert_eq!(driver.pending().await.unwrap(), (0, 0));
    stop(driver, workers).await;
}

/// A search whose time is up while the driver still starts its first simulations starts no
/// more of them: before, it started every one of `in_flight` first (a million in flight ran
/// `mcts-hex --seconds 1` for minutes), and they all had to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_out_of_time_starts_no_more_first_simulations() {
    let (mut driver, workers) = group::<TicTacToe>(2, Aggregation::Ovfl).await;
    let in_flight = 50 * START_BATCH;
    driver.in_flight = in_flight as usize;
    // Up before the first batch has gone: that one starts, the driver halts the search.
    let result = driver
        .search_within(
            &TicTacToe::default(),
            u64::MAX,
            Some(Duration::from_nanos(1)),
        )
        .await
        .unwrap();
    assert!(
        result.rollouts >= START_BATCH && result.rollouts < in_flight,
        "{} simulations for a search out of time before its first {in_flight} started",
        result.rollouts
    );
    assert_eq!(driver.pending().await.unwrap(), (0, 0));
    stop(driver, workers).await;
}
