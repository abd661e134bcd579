//! The examples as a device author writes them: `examples/sampler.rs` and `examples/sink.rs` are
//! compiled here from their own files (they use only the `ferromq` crate, which the tidy test in
//! xtask checks) and run as two processes (this test binary re-executed in an example's role),
//! over zeromq ipc and over shared memory, where `ferromq::run_device_main` also starts the
//! session's cleanup watchdog by re-executing the binary once more.

#[path = "../examples/mcts-hex.rs"]
mod mcts_example;
#[path = "../examples/sampler.rs"]
mod sampler_example;
#[path = "../examples/sampler_sink.rs"]
mod sampler_sink_example;
#[path = "../examples/sink.rs"]
mod sink_example;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use libtest_mimic::{Arguments, Failed, Trial};

/// Environment variable that makes this binary run an example's `main`.
const ROLE_VAR: &str = "FERROMQ_EXAMPLE_ROLE";
const N_EVENTS: u64 = 200;
const EXIT_TIMEOUT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    match std::env::var(ROLE_VAR).as_deref() {
        Ok("sampler") => return sampler_example::main(),
        Ok("sink") => return sink_example::main(),
        Ok("mcts-hex") => return mcts_example::main(),
        Ok("sampler_sink") => return sampler_sink_example::main(),
        _ => {}
    }
    // The mcts example's workers are this binary again, started by the example's driver.
    if std::env::var(ferromq::mcts::local::WORKER_VAR).is_ok() {
        return mcts_example::main();
    }
    let tests = vec![
        trial("sampler_and_sink_examples_over_zeromq_ipc", || {
            sampler_to_sink("zeromq")
        }),
        trial("sampler_and_sink_examples_over_shmem", || {
            sampler_to_sink("shmem")
        }),
        trial(
            "sampler_sink_example_measures_for_its_seconds",
            sampler_sink_runs,
        ),
        trial(
            "sampler_sink_example_refuses_bad_arguments_naming_them",
            sampler_sink_refuses,
        ),
        trial(
            "sampler_sink_example_fails_naming_its_sampler_when_the_sampler_dies",
            sampler_sink_sampler_killed,
        ),
        trial(
            "mcts_hex_example_searches_exactly_its_budget_over_shmem_and_zeromq",
            mcts_budget,
        ),
        trial(
            "mcts_hex_example_packs_calls_by_its_trad_settings_and_refuses_them_out_of_range",
            mcts_trad_settings,
        ),
        trial(
            "mcts_hex_example_keeps_steps_below_its_spread_depth_local",
            mcts_spread_depth,
        ),
        trial(
            "mcts_hex_example_warms_up_then_counts_only_the_measured_search",
            mcts_warm_up,
        ),
        trial(
            "mcts_hex_example_plays_games_against_a_random_player",
            mcts_versus_random,
        ),
        trial(
            "mcts_hex_example_searches_for_its_time_when_given_seconds_alone",
            mcts_time_budget,
        ),
        trial(
            "mcts_hex_example_stopped_by_a_signal_leaves_no_file",
            mcts_stopped_by_signal,
        ),
        trial(
            "mcts_hex_example_refuses_options_its_run_would_not_read_or_could_not_do",
            mcts_refuses_unread_and_unbounded_options,
        ),
        trial("killing_an_mcts_worker_fails_the_search_naming_it", || {
            mcts_worker_killed()
        }),
    ];
    libtest_mimic::run(&Arguments::from_args(), tests).exit_code()
}

fn trial(name: &'static str, test: fn() -> Result<()>) -> Trial {
    Trial::test(name, move || {
        test().map_err(|error| Failed::from(format!("{error:#}")))
    })
}

/// An example's process, killed if the test ends before it does; its output read by threads so
/// that a full pipe never blocks it.
struct ExampleProcess {
    child: Child,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl ExampleProcess {
    fn spawn(role: &str, args: &[String]) -> Result<ExampleProcess> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(ROLE_VAR, role)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawn the {role} example"))?;
        let read_all = |mut stream: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stream.read_to_string(&mut text);
                text
            })
        };
        let stdout = child.stdout.take().map(|out| read_all(Box::new(out)));
        let stderr = child.stderr.take().map(|err| read_all(Box::new(err)));
        Ok(ExampleProcess {
            child,
            stdout,
            stderr,
        })
    }

    /// Waits for the exit (polling under a deadline); returns (exit code, stdout, stderr).
    fn finish(mut self, role: &str) -> Result<(i32, String, String)> {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                bail!("the {role} example did not exit within {EXIT_TIMEOUT:?}");
            }
            std::thread::park_timeout(Duration::from_millis(20));
        };
        let stdout = self
            .stdout
            .take()
            .map(|reader| reader.join().unwrap_or_default());
        let stderr = self
            .stderr
            .take()
            .map(|reader| reader.join().unwrap_or_default());
        Ok((
            status.code().unwrap_or(-1),
            stdout.unwrap_or_default(),
            stderr.unwrap_or_default(),
        ))
    }
}

impl Drop for ExampleProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Removes the ipc socket file and the shm session's objects, also when the test fails.
struct Cleanup {
    ipc_path: std::path::PathBuf,
    session: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ipc_path);
        let _ = ferromq::shm::cleanup::clean_session(
            ferromq::shm::names::current_uid(),
            &self.session,
            true,
        );
    }
}

fn sampler_to_sink(transport: &str) -> Result<()> {
    let tag = format!("{}-{transport}", std::process::id());
    let cleanup = Cleanup {
        ipc_path: std::env::temp_dir().join(format!("ferromq-test-examples-{tag}.ipc")),
        session: format!("exampletest{}{transport}", std::process::id()),
    };
    let common = |id: &str, channel: &str| -> Vec<String> {
        [
            "--id",
            id,
            "--control",
            "static",
            "--transport",
            transport,
            "--session",
            &cleanup.session,
            "--max-iterations",
            &N_EVENTS.to_string(),
            "--channel-config",
            &format!("{channel},address=ipc://{}", cleanup.ipc_path.display()),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let sink = ExampleProcess::spawn("sink", &common("sink1", "name=data,type=pull,method=bind"))?;
    let sampler = ExampleProcess::spawn(
        "sampler",
        &common("sampler1", "name=data,type=push,method=connect"),
    )?;
    let (sampler_code, _, sampler_stderr) = sampler.finish("sampler")?;
    ensure!(
        sampler_code == 0,
        "the sampler example exited with {sampler_code}:\n{sampler_stderr}"
    );
    let (sink_code, sink_stdout, sink_stderr) = sink.finish("sink")?;
    ensure!(
        sink_code == 0,
        "the sink example exited with {sink_code}:\n{sink_stdout}\n{sink_stderr}"
    );
    // The sampler sends events 1..=N with energy 1.5 * id; the sink sums them.
    let summary = sink_stdout
        .lines()
        .find(|line| line.starts_with("sink: "))
        .with_context(|| format!("the sink printed no summary:\n{sink_stdout}\n{sink_stderr}"))?;
    let expected_energy: f64 = (1..=N_EVENTS).map(|id| 1.5 * id as f64).sum();
    ensure!(
        summary == format!("sink: {N_EVENTS} events, total energy {expected_energy}"),
        "unexpected sink summary {summary:?}"
    );
    Ok(())
}

/// Runs the sampler_sink example with `args`: (exit code, stdout, stderr).
fn sampler_sink_example(args: &[&str]) -> Result<(i32, String, String)> {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    ExampleProcess::spawn("sampler_sink", &args)?.finish("sampler_sink")
}

fn sampler_sink_runs() -> Result<()> {
    let (code, stdout, stderr) = sampler_sink_example(&["1", "64"])?;
    ensure!(
        code == 0 && stdout.contains("messages received in total"),
        "exit {code}:\n{stdout}\n{stderr}"
    );
    Ok(())
}

fn sampler_sink_refuses() -> Result<()> {
    // Found by a bad-input sweep: a number of seconds no `Instant` can add panicked, a size no
    // memory holds aborted the sampler (and the sink said 0 msg/s and exited 0), a word said only
    // "invalid digit found in string", and a third argument was ignored.
    for (args, named) in [
        (
            &["18446744073709551615"][..],
            "SECONDS 18446744073709551615",
        ),
        (&["1000000001"], "SECONDS 1000000001"),
        (&["0"], "SECONDS 0"),
        (&["abc"], "SECONDS abc"),
        (&["-1"], "SECONDS -1"),
        (&["1", "abc"], "MSG_SIZE abc"),
        (&["2", "100000000000"], "MSG_SIZE 100000000000"),
        (&["1", "1024", "extra"], "unexpected argument \"extra\""),
    ] {
        let (code, _, stderr) = sampler_sink_example(args)?;
        ensure!(
            code == 2 && stderr.contains(named) && stderr.contains("usage:"),
            "{args:?}: exit {code}, {stderr}"
        );
    }
    let (code, stdout, _) = sampler_sink_example(&["--help"])?;
    ensure!(
        code == 0 && stdout.contains("usage: sampler_sink [SECONDS] [MSG_SIZE]"),
        "--help: exit {code}, {stdout}"
    );
    Ok(())
}

fn sampler_sink_sampler_killed() -> Result<()> {
    // The sampler killed mid-run: the sink fails, naming the sampler and how it ended (before,
    // it printed 0 msg/s until its time was up and exited 0).
    let example = ExampleProcess::spawn("sampler_sink", &["30".to_owned()])?;
    let pid = example.child.id();
    let children = format!("/proc/{pid}/task/{pid}/children");
    let deadline = Instant::now() + EXIT_TIMEOUT;
    let sampler_pid = loop {
        let listed = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(child) = listed.split_whitespace().next() {
            break child.to_owned();
        }
        ensure!(Instant::now() < deadline, "the sampler never started");
        std::thread::park_timeout(Duration::from_millis(20));
    };
    let killed = Command::new("kill")
        .args(["-KILL", &sampler_pid])
        .status()?;
    ensure!(killed.success(), "kill -KILL {sampler_pid} failed");
    let (code, stdout, stderr) = example.finish("sampler_sink")?;
    ensure!(
        code == 1
            && stderr.contains(&format!("the sampler (pid {sampler_pid}) ended"))
            && stderr.contains("SIGKILL"),
        "exit {code}:\n{stdout}\n{stderr}"
    );
    let ipc_file = std::env::temp_dir().join(format!("ferromq-example-{pid}.ipc"));
    ensure!(!ipc_file.exists(), "{} was left", ipc_file.display());
    Ok(())
}

/// Runs the mcts example with `args`; its stdout when it exits 0.
fn mcts_example(args: &[&str]) -> Result<String> {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let (code, stdout, stderr) = ExampleProcess::spawn("mcts-hex", &args)?.finish("mcts-hex")?;
    ensure!(
        code == 0,
        "the mcts example exited with {code}:\n{stdout}\n{stderr}"
    );
    Ok(stdout)
}

/// A search of `rollouts` on 5x5 Hex by 2 workers, with `more` options; its JSON.
fn mcts_small_search(rollouts: &str, more: &[&str]) -> Result<String> {
    let mut args = vec![
        "--board",
        "5",
        "--workers",
        "2",
        "--json",
        "--rollouts",
        rollouts,
    ];
    args.extend_from_slice(more);
    mcts_example(&args)
}

fn mcts_budget() -> Result<()> {
    for transport in ["shmem", "zeromq"] {
        let stdout = mcts_small_search("500", &["--transport", transport])?;
        for field in [
            "\"rollouts\":500,",
            "\"workers\":2,",
            "\"best_move\":\"",
            "\"remote_calls\":",
            "\"local_steps\":",
        ] {
            ensure!(
                stdout.contains(field),
                "{transport}: no {field} in {stdout}"
            );
        }
    }
    Ok(())
}

/// A number field of the example's JSON, as `T`.
fn json_number<T: std::str::FromStr>(stdout: &str, field: &str) -> Result<T> {
    stdout
        .split(&format!("\"{field}\":"))
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .and_then(|number| number.parse().ok())
        .with_context(|| format!("no {field} in {stdout}"))
}

/// Runs the example with `args`, which it must refuse (exit 2) with `named` in its error.
fn mcts_refuses(args: &[&str], named: &str) -> Result<()> {
    let owned: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let (code, _, stderr) = ExampleProcess::spawn("mcts-hex", &owned)?.finish("mcts-hex")?;
    ensure!(
        code == 2 && stderr.contains(named),
        "{args:?}: exit {code}, {stderr}"
    );
    Ok(())
}

fn mcts_time_budget() -> Result<()> {
    // A time given alone is the budget: the search runs for it, not for the default 10 000
    // rollouts (which 2 workers finish in ~0.03 s on 5x5: the search ended there before).
    let stdout = mcts_example(&[
        "--board",
        "5",
        "--workers",
        "2",
        "--seconds",
        "0.3",
        "--json",
    ])?;
    let seconds: f64 = json_number(&stdout, "seconds")?;
    ensure!(
        seconds >= 0.3,
        "a search of 0.3 s ended after {seconds} s: {stdout}"
    );
    // Neither the single-process UCT nor a plain opponent searches for a time: refused, named.
    // Nor a time longer than any timer, nor more workers than the example starts.
    for (refused, named) in [
        (&["--plain", "--seconds", "1"][..], "--seconds 1"),
        (&["--versus", "plain", "--seconds", "1"], "--seconds 1"),
        (&["--seconds", "1e300"], "--seconds 1e300"),
        (&["--workers", "100000"], "--workers 100000"),
        (
            &["--rollouts", "99999999999999999999"],
            "--rollouts 99999999999999999999: too large",
        ),
        // Below the least board: too small, not "too large" (as it said before).
        (&["--board", "1"], "--board 1: a whole number from 2 to 19"),
    ] {
        mcts_refuses(refused, named)?;
    }
    // Given its iterations, the plain opponent plays a search that has only a time.
    let stdout = mcts_example(&[
        "--board",
        "4",
        "--workers",
        "2",
        "--versus",
        "plain",
        "--games",
        "1",
        "--seconds",
        "0.02",
        "--plain-iterations",
        "200",
        "--json",
    ])?;
    ensure!(
        stdout.contains("\"games\":1,") && stdout.contains("\"rollouts\":null,"),
        "{stdout}"
    );
    Ok(())
}

fn mcts_refuses_unread_and_unbounded_options() -> Result<()> {
    // Each case a run that ends at once but for its culprit (a later option replaces an earlier
    // one); what the example did before is in the comments.
    let quick = |culprit: &[&'static str]| {
        let mut args = vec!["--board", "2", "--workers", "1", "--rollouts", "1"];
        args.extend_from_slice(culprit);
        args
    };
    let cases: [(Vec<&str>, &str); 13] = [
        // One simulation's playouts are not interrupted: up to u32::MAX were taken, and a
        // billion ran `--seconds 1` for hours.
        (
            quick(&["--playouts", "65537"]),
            "--playouts 65537: a whole number from 1 to 65536",
        ),
        // Started all of them before it looked at the clock: a million ran `--seconds 1` for
        // minutes.
        (
            quick(&["--in-flight", "1000000"]),
            "--in-flight 1000000: a whole number from 1 to 4096",
        ),
        // "attempt to multiply with overflow".
        (
            quick(&["--workers", "2", "--in-flight", "18446744073709551615"]),
            "--in-flight 18446744073709551615: a whole number from 1 to 4096",
        ),
        // The plain search ran; the options of the distributed one were ignored.
        (
            vec![
                "--plain",
                "--board",
                "2",
                "--rollouts",
                "1",
                "--workers",
                "3",
            ],
            "--workers 3 with --plain: --plain times the single-process UCT alone",
        ),
        (
            vec![
                "--board",
                "2",
                "--rollouts",
                "1",
                "--versus",
                "random",
                "--plain",
            ],
            "--versus random with --plain",
        ),
        // The warm-up is one search's; the games ignored it.
        (
            quick(&["--versus", "random", "--games", "1", "--warm-up", "3"]),
            "--warm-up 3 with --versus random: the warm-up goes before a single search",
        ),
        // Games and the plain opponent's iterations, with no games or no plain opponent.
        (quick(&["--games", "5"]), "--games 5 without --versus"),
        (
            quick(&["--plain-iterations", "9"]),
            "--plain-iterations 9 without --versus",
        ),
        (
            quick(&[
                "--versus",
                "random",
                "--games",
                "1",
                "--plain-iterations",
                "9",
            ]),
            "--plain-iterations 9 with --versus random",
        ),
        // A hold only `trad` makes, with the default `ovfl`.
        (
            quick(&["--aggregate-us", "500"]),
            "--aggregate-us 500 with --aggregate ovfl (the default): only trad holds a frame",
        ),
        // The topology's wording, without the option.
        (
            quick(&["--aggregate", "bogus"]),
            "--aggregate bogus: aggregate = \"bogus\" is not an aggregation mode",
        ),
        // "a Hex board is 2x2 to 19x19, not 20x20", and "at least 2" with no upper limit.
        (
            quick(&["--board", "20"]),
            "--board 20: a whole number from 2 to 19",
        ),
        (
            quick(&["--board", "0"]),
            "--board 0: a whole number from 2 to 19",
        ),
    ];
    for (refused, named) in cases {
        mcts_refuses(&refused, named)?;
    }
    Ok(())
}

/// The names in `dir` that contain `part`.
fn names_with(dir: &Path, part: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.contains(part))
                .collect()
        })
        .unwrap_or_default()
}

fn mcts_stopped_by_signal() -> Result<()> {
    // Ctrl-C or a SIGTERM mid-search: the driver stops its workers and removes the group's ipc
    // files and shared memory, and exits with the shell's code for the signal (before, a
    // SIGTERM left every member's ipc file in the temporary directory).
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let args: Vec<String> = [
            "--board",
            "5",
            "--workers",
            "2",
            "--seconds",
            "60",
            "--json",
        ]
        .map(str::to_owned)
        .to_vec();
        let example = ExampleProcess::spawn("mcts-hex", &args)?;
        let pid = example.child.id();
        let ipc_files = || names_with(&std::env::temp_dir(), &format!("ferromq-mcts-{pid}-"));
        // Searching once the driver and both workers have bound their ipc files.
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while ipc_files().len() < 3 {
            ensure!(
                Instant::now() < deadline,
                "the group did not start: {:?}",
                ipc_files()
            );
            std::thread::park_timeout(Duration::from_millis(20));
        }
        let sent = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?;
        ensure!(sent.success(), "kill -{signal} {pid} failed");
        let (exit, _, stderr) = example.finish("mcts-hex")?;
        ensure!(
            exit == code && stderr.contains(&format!("stopped by SIG{signal}")),
            "SIG{signal}: exit {exit}, {stderr}"
        );
        ensure!(ipc_files().is_empty(), "SIG{signal} left {:?}", ipc_files());
        let shared = names_with(Path::new("/dev/shm"), &format!("mcts-{pid}"));
        ensure!(shared.is_empty(), "SIG{signal} left {shared:?} in /dev/shm");
    }
    Ok(())
}

fn mcts_spread_depth() -> Result<()> {
    // Spread depth 0: every node stays with the root's owner; the only calls are the
    // driver's batches and the reports.
    let stdout = mcts_small_search("2000", &["--spread-depth", "0"])?;
    let calls: u64 = json_number(&stdout, "remote_calls")?;
    ensure!(
        stdout.contains("\"spread_depth\":0,") && calls < 2000,
        "--spread-depth 0: {stdout}"
    );
    let everywhere = mcts_small_search("2000", &[])?;
    ensure!(
        everywhere.contains("\"spread_depth\":null,"),
        "no --spread-depth: {everywhere}"
    );
    for value in ["-1", "deep", "99999999999"] {
        mcts_refuses(
            &["--spread-depth", value],
            &format!("--spread-depth {value}"),
        )?;
    }
    Ok(())
}

fn mcts_trad_settings() -> Result<()> {
    // Calls per frame with `trad`: frames of 64 bytes hold a call or two; frames of 64 KiB
    // held up to 2 ms gather many.
    let mut per_frame = Vec::new();
    for (bytes, micros) in [("64", "0"), ("65536", "2000")] {
        let stdout = mcts_small_search(
            "2000",
            &[
                "--aggregate",
                "trad",
                "--aggregate-bytes",
                bytes,
                "--aggregate-us",
                micros,
            ],
        )?;
        let calls: u64 = json_number(&stdout, "remote_calls")?;
        let frames: u64 = json_number(&stdout, "remote_frames")?;
        ensure!(frames > 0 && frames <= calls, "{bytes} bytes: {stdout}");
        per_frame.push(calls as f64 / frames as f64);
    }
    ensure!(
        per_frame[0] <= 3.0 && per_frame[1] > 2.0 * per_frame[0],
        "calls per frame with 64-byte and 64-KiB frames: {per_frame:?}"
    );
    for (flag, value) in [("--aggregate-us", "10000001"), ("--aggregate-bytes", "63")] {
        mcts_refuses(&[flag, value], &format!("{flag} {value}"))?;
    }
    Ok(())
}

fn mcts_warm_up() -> Result<()> {
    // The warm-up runs until its time is up (many more than 300 rollouts on 5x5); the figures
    // are the measured search's alone.
    let cold = mcts_small_search("300", &[])?;
    let warm = mcts_small_search("300", &["--warm-up", "0.3"])?;
    ensure!(
        warm.contains("\"rollouts\":300,") && warm.contains("\"warm_up_s\":0.3}"),
        "{warm}"
    );
    // One worker, every step local: the root's owner, which starts the next simulations by
    // calls to itself, still answers the driver's halt when the warm-up's time is up.
    let alone = mcts_small_search("300", &["--warm-up", "0.3", "--workers", "1"])?;
    ensure!(
        alone.contains("\"rollouts\":300,") && alone.contains("\"workers\":1,"),
        "{alone}"
    );
    ensure!(cold.contains("\"warm_up_s\":0}"), "{cold}");
    // A simulation makes at most a few calls per step down and up a 5x5 tree.
    let calls: u64 = json_number(&warm, "remote_calls")?;
    ensure!(
        calls > 0 && calls < 300 * 25,
        "{calls} remote calls counted for 300 rollouts: {warm}"
    );
    for value in ["0", "-1", "soon", "1e300"] {
        mcts_refuses(&["--warm-up", value], &format!("--warm-up {value}"))?;
    }
    Ok(())
}

fn mcts_versus_random() -> Result<()> {
    let stdout = mcts_example(&[
        "--board",
        "4",
        "--workers",
        "2",
        "--rollouts",
        "300",
        "--versus",
        "random",
        "--games",
        "2",
        "--json",
    ])?;
    let wins: u64 = json_number(&stdout, "wins")?;
    ensure!(stdout.contains("\"games\":2,") && wins <= 2, "{stdout}");
    Ok(())
}

fn mcts_worker_killed() -> Result<()> {
    use ferromq::mcts::hex::Hex;
    use ferromq::mcts::local::{LocalConfig, LocalSearch};
    let config = LocalConfig {
        workers: 2,
        transport: "zeromq".to_owned(),
        session: format!("mctskill{}", std::process::id()),
        aggregation: ferromq::rpc::Aggregation::Ovfl,
        aggregate_bytes: 4096,
        aggregate_delay: Duration::from_micros(100),
        settings: ferromq::mcts::search::SearchSettings::default(),
        timeout: Duration::from_secs(2),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let program = std::env::current_exe()?;
        let search = LocalSearch::<Hex>::start(&program, mcts_example::make_transport, &config)
            .await
            .map_err(anyhow::Error::msg)?;
        let pid = search.worker_pid(1).context("worker 1 runs")?;
        let killed = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()?;
        ensure!(killed.success(), "kill -9 {pid} failed");
        let started = Instant::now();
        let error = search
            .driver
            .search(&Hex::new(7)?, 1_000_000)
            .await
            .err()
            .context("the search went on without a worker")?
            .to_string();
        ensure!(
            error.contains("worker-1"),
            "the error does not name the dead worker: {error}"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(20),
            "the driver took {:?} to notice",
            started.elapsed()
        );
        Ok(())
    })
}
