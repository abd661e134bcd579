//! `ferromq run`'s stop: ordered and lossless when clean, prompt and failing when forced, and
//! bad numbers refused. Real launchers, real devices, real signals.

mod support;

use std::time::Duration;

use support::{finish, signal, wait_for_line};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use support::{bundled as topology, processes_of_session};

fn launcher(args: &[&str]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ferromq"));
    command.arg("run").args(args);
    support::spawn_piped(command)
}

/// The number in `... <word> N messages` on the first line that has it.
fn count_after(log: &str, word: &str) -> u64 {
    let needle = format!("{word} ");
    log.lines()
        .filter_map(|line| {
            let rest = &line[line.find(&needle)? + needle.len()..];
            let (number, after) = rest.split_once(' ')?;
            after.starts_with("messages").then(|| number.parse().ok())?
        })
        .next()
        .unwrap_or_else(|| panic!("no \"{word} N messages\" in:\n{log}"))
}

/// Waits (within a bound) for a launcher whose stdout was taken; its exit code and stderr.
async fn exit_and_stderr(mut run: Child) -> (Option<i32>, String) {
    let mut stderr = String::new();
    let mut err = run.stderr.take().expect("stderr");
    let (read, exit) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(
            tokio::io::AsyncReadExt::read_to_string(&mut err, &mut stderr),
            run.wait()
        )
    })
    .await
    .expect("the launcher did not exit in time");
    read.expect("read stderr");
    (exit.expect("wait").code(), stderr)
}

fn assert_nothing_lost(log: &str) {
    let sent = count_after(log, "sent");
    let received = count_after(log, "received");
    assert!(sent > 0, "{log}");
    assert_eq!(sent, received, "sent and received differ:\n{log}");
    for word in ["lost", "not delivered", "killing"] {
        assert!(!log.contains(word), "{word:?} on a clean stop:\n{log}");
    }
}

#[tokio::test]
async fn bad_durations_are_usage_errors_naming_the_value() {
    // 1e-320 was taken, and became no time at all.
    for value in ["-1", "nan", "inf", "1e300", "0", "1e-320", "1e-10"] {
        let run = finish(launcher(&[&topology("default.toml"), "--duration", value])).await;
        assert_eq!(run.code, Some(2), "--duration {value}: {}", run.stderr);
        assert!(
            run.stderr.contains("--duration") && run.stderr.contains(value),
            "{}",
            run.stderr
        );
    }
}

/// A stop at the end of `--duration` stops the sources first and lets the rest drain: every
/// message sent is received, and nothing is reported lost.
#[tokio::test]
async fn a_duration_stop_drains_every_stage_default_and_mixed_transports() {
    for file in ["default.toml", "mixed-transports.toml"] {
        let run = finish(launcher(&[&topology(file), "--duration", "2"])).await;
        let log = format!("{}{}", run.stdout, run.stderr);
        assert_eq!(run.code, Some(0), "{file}:\n{log}");
        assert_nothing_lost(&log);
    }
}

/// The same for Ctrl-C.
#[tokio::test]
async fn a_sigint_stop_drains_every_stage() {
    let run = launcher(&[&topology("default.toml")]);
    let (code, log) = interrupted_once(run, "[sink] READY ---> RUNNING").await;
    assert_eq!(code, Some(0), "{log}");
    assert_nothing_lost(&log);
}

/// Sends SIGINT to a launcher once its stdout has a line with `needle`; its exit code and all
/// it printed (stdout, then stderr).
async fn interrupted_once(mut run: Child, needle: &str) -> (Option<i32>, String) {
    let mut lines = BufReader::new(run.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, needle, &mut seen).await;
    signal(&run, "INT");
    while let Ok(Some(line)) = lines.next_line().await {
        seen.push(line);
    }
    let (code, stderr) = exit_and_stderr(run).await;
    (code, format!("{}\n{stderr}", seen.join("\n")))
}

/// Ctrl-C in the middle of the bundled distributed search (an rpc group, whose members stop
/// together while calls fly between them): the run exits 0 and logs no error. A member whose
/// shutdown ran out of time dropped its channels unclosed, which logged their loss as an error
/// (over zeromq in every run); what the ending group did not take is now one line per member.
/// (The errors logged for calls refused by a member shutting down, seen in release builds, are
/// `ferromq-mcts`'s `a_call_refused_by_a_member_shutting_down_is_no_error`.)
#[tokio::test]
async fn a_sigint_stops_a_searching_rpc_group_without_errors() {
    let bundled = std::fs::read_to_string(topology("mcts-hex.toml")).unwrap();
    assert!(bundled.contains("rollouts = 10000, moves = 4"), "{bundled}");
    for transport in ["zeromq", "shmem"] {
        let text = bundled
            .replace(
                "transport = \"shmem\"",
                &format!("transport = \"{transport}\""),
            )
            // Moves until the game is over: the search is running whenever the stop comes.
            .replace("rollouts = 10000, moves = 4", "rollouts = 2000, moves = 0");
        let file = support::TempFile::holding("searching-group.toml", &text);
        let session = format!("sigint-group-{transport}-{}", std::process::id());
        let run = launcher(&[&file.path(), "--session", &session]);
        let (code, log) = interrupted_once(run, "[driver] move 2: ").await;
        assert_eq!(code, Some(0), "{transport}:\n{log}");
        for word in ["ERROR", "could not be made", "without a close", "killing"] {
            assert!(
                !log.contains(word),
                "{transport}: {word:?} on a clean stop:\n{log}"
            );
        }
        assert_eq!(
            support::shm_objects_of(&session),
            0,
            "{transport} left shared memory"
        );
    }
}

/// The pid of the launcher's child that runs device `id`.
fn device_pid(launcher_pid: u32, id: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let parent: u32 = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&byte| byte == 0).collect();
            // The launcher passes `--id=ID`; by hand it is two words.
            let joined = format!("--id={id}");
            let is_device = args.contains(&joined.as_bytes())
                || args
                    .windows(2)
                    .any(|pair| pair[0] == b"--id" && pair[1] == id.as_bytes());
            (parent == launcher_pid && is_device).then_some(pid)
        })
}

/// One device hangs (SIGSTOP): Ctrl-C is still acted on, the hung device is killed after the stop
/// timeout, and the run fails naming it instead of exiting 0.
#[tokio::test]
async fn a_stop_that_needs_force_fails_and_names_the_device() {
    let mut run = launcher(&[&topology("default.toml")]);
    let mut lines = BufReader::new(run.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "[sink] READY ---> RUNNING", &mut seen).await;
    let launcher_pid = run.id().expect("launcher pid");
    let processor = device_pid(launcher_pid, "processor").expect("the processor's pid");
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &processor.to_string()])
        .status()
        .expect("kill -STOP");
    assert!(stopped.success());
    signal(&run, "INT");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let exit = tokio::time::timeout(Duration::from_secs(60), run.wait())
        .await
        .expect("the launcher did not act on SIGINT")
        .expect("wait");
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(run.stderr.as_mut().expect("stderr"), &mut stderr)
        .await
        .expect("read stderr");
    assert_eq!(exit.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("stopped by force") && stderr.contains("\"processor\""),
        "{stderr}"
    );
}

/// A second Ctrl-C kills every device at once; that is a failure too.
#[tokio::test]
async fn a_second_sigint_kills_at_once_and_fails() {
    let mut run = launcher(&[&topology("default.toml")]);
    let mut lines = BufReader::new(run.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "[sink] READY ---> RUNNING", &mut seen).await;
    let launcher_pid = run.id().expect("launcher pid");
    let processor = device_pid(launcher_pid, "processor").expect("the processor's pid");
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &processor.to_string()])
        .status()
        .expect("kill -STOP");
    assert!(stopped.success());
    signal(&run, "INT");
    wait_for_line(&mut lines, "stopping every device", &mut seen).await;
    signal(&run, "INT");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let (code, stderr) = exit_and_stderr(run).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("second signal"), "{stderr}");
}

/// A second launcher of a live session is refused and leaves the first one alone.
#[tokio::test]
async fn a_second_run_of_a_live_session_is_refused() {
    let session = format!("live{}", std::process::id());
    let mut first = launcher(&[&topology("default.toml"), "--session", &session]);
    let mut lines = BufReader::new(first.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "[sink] READY ---> RUNNING", &mut seen).await;
    let second = finish(launcher(&[
        &topology("default.toml"),
        "--session",
        &session,
        "--duration",
        "1",
    ]))
    .await;
    assert_eq!(second.code, Some(1), "{}", second.stderr);
    assert!(
        second.stderr.contains("is in use by another `ferromq run`")
            && second
                .stderr
                .contains(&first.id().expect("pid").to_string()),
        "{}",
        second.stderr
    );
    signal(&first, "INT");
    while let Ok(Some(line)) = lines.next_line().await {
        seen.push(line);
    }
    let (code, stderr) = exit_and_stderr(first).await;
    assert_eq!(code, Some(0), "{stderr}\n{seen:#?}");
}

/// The objects in /dev/shm of `session` that process `pid` made.
fn objects_made_by(session: &str, pid: u32) -> Vec<String> {
    ferromq_shm::cleanup::list_objects(ferromq_shm::names::current_uid(), Some(session))
        .into_iter()
        .filter(|object| object.name.creator_pid == pid)
        .map(|object| object.name.to_string())
        .collect()
}

/// A device started by hand into the session of a `ferromq run` (a FairMQ user's monitoring
/// device, say) keeps its shared memory when the run ends, and stays usable: the run's end used
/// to remove every object of the session by force, the live device's segment and the session
/// watchdog's lock among them, and a sink that attached to the device afterwards failed
/// ("shared memory ... does not exist"). The run's own devices' memory then goes with the last
/// process of the session.
#[tokio::test]
async fn a_run_leaves_the_shared_memory_of_a_live_device_it_did_not_start() {
    let session = support::ShmSession::new("hand");
    let _kill = KillLeftovers(session.0.clone());
    let ipc = support::Ipc::new("hand");
    let shmem = [
        "--transport",
        "shmem",
        "--session",
        session.0.as_str(),
        "--shm-segment-size",
        "16777216",
    ];
    let mut sampler = support::Device::new("sampler", "hand")
        .args(&shmem)
        .args(&["--rate", "1000"])
        .channel("pub", "bind", &ipc.address())
        .spawn();
    let hand = sampler.id().expect("the sampler runs");
    let mut lines = BufReader::new(sampler.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "READY ---> RUNNING", &mut seen).await;
    // Its segment exists from its socket's creation.
    let ours = objects_made_by(&session.0, hand);
    assert!(!ours.is_empty(), "no object of the sampler {hand}");

    let run = finish(launcher(&[
        &topology("default.toml"),
        "--session",
        &session.0,
        "--duration",
        "1",
    ]))
    .await;
    run.assert_exited_0();
    let kept = objects_made_by(&session.0, hand);
    assert_eq!(
        kept, ours,
        "the run removed the live sampler's shared memory:\n{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains(&format!("of session {} in use by pid {hand}", session.0)),
        "the run does not say what it left and why:\n{}",
        run.stdout
    );

    // A sink attaches to the sampler now, and gets its messages.
    let sink = support::Device::new("sink", "late")
        .args(&shmem)
        .args(&["--max-iterations", "10"])
        .channel("sub", "connect", &ipc.address())
        .finish()
        .await;
    sink.assert_exited_0();
    assert!(
        sink.stdout.contains("sink summary: received ")
            && !sink.stdout.contains("received 0 messages"),
        "{}",
        sink.stdout
    );
    signal(&sampler, "TERM");
    support::finish_rest(sampler, lines).await.assert_exited_0();

    // The last process of the session removed everything, the run's devices' memory too.
    let mut look = tokio::time::interval(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while support::shm_objects_of(&session.0) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "shared memory of session {} left 10 s after its last process",
            session.0
        );
        look.tick().await;
    }
}

/// The session directories of this test's launchers (`ferromq-run-*` whose lock names `pid`).
fn session_dirs_of(pid: u32) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("ferromq-run-")
        })
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("lock"))
                .is_ok_and(|holder| holder.trim() == pid.to_string())
        })
        .map(|entry| entry.path())
        .collect()
}

/// Kills what is left of a session's processes however the test ends.
struct KillLeftovers(String);

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        for pid in processes_of_session(&self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Waits until no process names `session`; false after `within`.
async fn session_processes_end(session: &str, within: Duration) -> bool {
    let mut look = tokio::time::interval(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        look.tick().await;
        if processes_of_session(session).is_empty() {
            return true;
        }
    }
    false
}

/// A device that `ferromq run` started and whose launcher is gone before it could look (the
/// launcher's pid in its environment is not its parent) goes down at once instead of living on
/// without anybody to stop it.
#[tokio::test]
async fn a_device_whose_launcher_is_already_gone_goes_down() {
    let dir = std::env::temp_dir().join(format!("ferromq-orphan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let _remove = RemoveDir(dir.clone());
    let device = Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["device", "sink", "--id", "orphan", "--control", "external"])
        .arg("--control-address")
        .arg(format!("ipc://{}", dir.join("control").display()))
        .args(["--color", "false", "--channel-config"])
        .arg(format!(
            "name=data,type=pull,method=bind,address=ipc://{}",
            dir.join("data").display()
        ))
        .env("FERROMQ_LAUNCHER_PID", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ferromq device");
    let done = finish(device).await;
    assert!(
        format!("{}{}", done.stdout, done.stderr).contains("the launcher is gone"),
        "{}{}",
        done.stdout,
        done.stderr
    );
    assert!(done.code.is_some(), "it exited, not killed");
}

struct RemoveDir(std::path::PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A launcher killed with SIGKILL leaves its directory; the next launcher removes it. Its
/// devices go down by themselves (one used to spin at 100% of a core forever: its control
/// endpoint's receive failed at once, again and again, on the launcher's broken connection).
#[tokio::test]
async fn a_killed_launchers_directory_is_removed_by_the_next_run() {
    let session = format!("killed{}", std::process::id());
    let _leftovers = KillLeftovers(session.clone());
    let mut killed = launcher(&[&topology("zeromq-ipc.toml"), "--session", &session]);
    let mut lines = BufReader::new(killed.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "READY ---> RUNNING", &mut seen).await;
    let pid = killed.id().expect("pid");
    assert_eq!(
        session_dirs_of(pid).len(),
        1,
        "the live launcher's directory"
    );
    signal(&killed, "KILL");
    let _ = killed.wait().await;
    assert_eq!(
        session_dirs_of(pid).len(),
        1,
        "SIGKILL leaves the directory"
    );
    assert!(
        session_processes_end(&session, Duration::from_secs(30)).await,
        "the killed launcher's devices live on: {:?}",
        processes_of_session(&session)
    );
    let next = finish(launcher(&[&topology("zeromq-ipc.toml"), "--duration", "1"])).await;
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    assert!(
        session_dirs_of(pid).is_empty(),
        "the stale directory is gone"
    );
}

/// Sessions `a_b` and `a-b` used to share shared-memory names; now both run side by side.
#[tokio::test]
async fn sessions_differing_only_in_punctuation_run_side_by_side() {
    let pid = std::process::id();
    let (underscore, dash) = (format!("a_b{pid}"), format!("a-b{pid}"));
    let first = launcher(&[
        &topology("default.toml"),
        "--session",
        &underscore,
        "--duration",
        "2",
    ]);
    let second = launcher(&[
        &topology("default.toml"),
        "--session",
        &dash,
        "--duration",
        "3",
    ]);
    let (first, second) = tokio::join!(finish(first), finish(second));
    for run in [first, second] {
        let log = format!("{}{}", run.stdout, run.stderr);
        assert_eq!(run.code, Some(0), "{log}");
        assert_nothing_lost(&log);
    }
}
