//! `ferromq run` end to end on the bundled topologies: normal runs, Ctrl-C, and a device killed.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use support::{TempFile, shm_objects_of};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

const STEP: Duration = Duration::from_secs(90);

fn topology(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../topologies")
        .join(name)
}

fn ferromq_run(file: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .arg("run")
        .arg(file)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ferromq run")
}

/// Processes whose parent is `parent`, with their command lines.
fn children_of(parent: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<u32>().ok())
        .filter_map(|pid| {
            let (state, ppid) = state_and_parent(pid)?;
            let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .ok()?
                .replace('\0', " ");
            (ppid == parent && state != "Z").then_some((pid, cmdline))
        })
        .collect()
}

/// Process `pid`'s state letter and its parent (`/proc/<pid>/stat`'s third and fourth fields).
fn state_and_parent(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace();
    let state = fields.next()?.to_owned();
    Some((state, fields.next()?.parse().ok()?))
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "))
}

#[tokio::test]
async fn every_bundled_topology_runs_and_counts_messages() {
    let mut names: Vec<String> = std::fs::read_dir(topology(""))
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".toml"))
        // Topologies with ofi channels need a binary built with `--features ofi`.
        .filter(|name| {
            cfg!(feature = "ofi")
                || !std::fs::read_to_string(topology(name))
                    .unwrap()
                    .contains("transport = \"ofi\"")
        })
        .collect();
    names.sort();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        let session = format!(
            "test-run-{}-{}",
            std::process::id(),
            name.trim_end_matches(".toml")
        );
        // A topology with an rpc group (the mcts search) ends by itself after its moves.
        let ends_by_itself = std::fs::read_to_string(topology(&name))
            .unwrap()
            .contains("[[rpc]]");
        let duration: &[&str] = if ends_by_itself {
            &[]
        } else {
            &["--duration", "2"]
        };
        let support::Finished {
            code,
            stdout,
            stderr,
        } = support::finish(ferromq_run(
            &topology(&name),
            &[duration, &["--session", &session]].concat(),
        ))
        .await;
        assert_eq!(code, Some(0), "{name}: {stderr}\n{stdout}");
        let counted = stdout.lines().any(|line| {
            let received =
                line.contains("sink summary: received ") && !line.contains("received 0 messages");
            let round_trips = line.contains("round trips") && !line.contains(" 0 round trips");
            let built =
                line.contains("builder summary: built ") && !line.contains("built 0 events");
            let searched = line.contains("] move 4: ") && line.contains(" rollouts/s");
            received || round_trips || built || searched
        });
        assert!(counted, "{name}: no messages counted:\n{stdout}");
        assert_eq!(shm_objects_of(&session), 0, "{name} left shared memory");
    }
}

/// sampler -(shmem)-> relay -(ofi)-> relay -(shmem)-> sink: both relays forward every message
/// from shared memory without copying a payload byte, and the sink's checksums hold.
#[cfg(feature = "ofi")]
#[tokio::test]
async fn ofi_chain_relays_copy_nothing() {
    let session = format!("test-ofi-chain-{}", std::process::id());
    let support::Finished {
        code,
        stdout,
        stderr,
    } = support::finish(ferromq_run(
        &topology("ofi-chain.toml"),
        &["--duration", "3", "--session", &session],
    ))
    .await;
    assert_eq!(code, Some(0), "{stderr}\n{stdout}");
    for relay in ["[relay-out]", "[relay-in]"] {
        let summary = stdout
            .lines()
            .find(|line| line.starts_with(relay) && line.contains("processor summary"))
            .unwrap_or_else(|| panic!("no summary of {relay}:\n{stdout}"));
        // "forwarded N messages, B bytes (M arrived in shared memory), copied C payload bytes"
        let numbers: Vec<u64> = summary
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|word| word.parse().ok())
            .collect();
        let [forwarded, bytes, in_shm, copied] = numbers[..] else {
            panic!("unexpected summary {summary}");
        };
        assert!(forwarded > 0 && bytes >= forwarded << 20, "{summary}");
        assert_eq!(
            in_shm, forwarded,
            "every message arrives in shared memory: {summary}"
        );
        assert_eq!(copied, 0, "the relay copied payload bytes: {summary}");
    }
    assert!(
        stdout.lines().any(|line| line.contains("sink summary")
            && line.contains("checksums ok")
            && !line.contains("received 0 messages")),
        "{stdout}"
    );
    assert_eq!(shm_objects_of(&session), 0, "left shared memory");
}

async fn wait_until_running(
    child: &mut Child,
) -> (BufReader<tokio::process::ChildStdout>, Vec<String>) {
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout(STEP, lines.next_line())
            .await
            .expect("output")
            .expect("read")
            .expect("a line before RUNNING");
        let running = line.contains("READY ---> RUNNING") && line.contains("[sink]");
        seen.push(line);
        if running {
            return (lines.into_inner(), seen);
        }
    }
}

#[tokio::test]
async fn sigint_during_running_stops_everything_cleanly() {
    let session = format!("test-sigint-{}", std::process::id());
    let mut run = ferromq_run(&topology("default.toml"), &["--session", &session]);
    let launcher = run.id().expect("pid");
    let (mut stdout, _) = wait_until_running(&mut run).await;
    let devices = children_of(launcher);
    assert_eq!(devices.len(), 3, "{devices:?}");
    // Segments appear with the first allocation, which may follow RUNNING by a moment.
    let segment_seen = tokio::time::timeout(Duration::from_secs(30), async {
        while shm_objects_of(&session) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        segment_seen.is_ok(),
        "the shmem topology uses shared memory"
    );
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &launcher.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let (mut rest, mut errors) = (String::new(), String::new());
    let mut stderr = run.stderr.take().expect("stderr");
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(
            run.wait(),
            stdout.read_to_string(&mut rest),
            stderr.read_to_string(&mut errors)
        )
    })
    .await
    .expect("exit in time");
    assert_eq!(
        status.expect("wait").code(),
        Some(0),
        "stderr:\n{errors}\nstdout:\n{rest}"
    );
    for (pid, cmdline) in devices {
        assert!(
            !alive(pid),
            "device {pid} ({cmdline}) outlived the launcher"
        );
    }
    assert_eq!(shm_objects_of(&session), 0, "shared memory left behind");
}

#[tokio::test]
async fn a_killed_device_stops_the_topology_and_is_named() {
    let session = format!("test-kill-{}", std::process::id());
    let mut run = ferromq_run(&topology("default.toml"), &["--session", &session]);
    let launcher = run.id().expect("pid");
    let (_stdout, _) = wait_until_running(&mut run).await;
    let devices = children_of(launcher);
    let (sink, _) = devices
        .iter()
        .find(|(_, cmdline)| cmdline.contains("--id=sink "))
        .expect("the sink's process")
        .clone();
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &sink.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let mut stderr = String::new();
    let mut err = run.stderr.take().expect("stderr");
    let (status, _) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(run.wait(), err.read_to_string(&mut stderr))
    })
    .await
    .expect("exit in time");
    assert_ne!(status.expect("wait").code(), Some(0));
    assert!(
        stderr.contains("device \"sink\" exited") && stderr.contains("RUNNING"),
        "{stderr}"
    );
    for (pid, cmdline) in devices {
        assert!(!alive(pid), "device {pid} ({cmdline}) outlived the failure");
    }
    assert_eq!(shm_objects_of(&session), 0, "shared memory left behind");
}

#[tokio::test]
async fn validate_and_graph() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .arg("validate")
        .arg(topology("fan-out-fan-in.toml"))
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("valid, 3 device(s), 6 process(es)"));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["graph", "--format", "mermaid"])
        .arg(topology("mixed-transports.toml"))
        .output()
        .unwrap();
    let graph = String::from_utf8_lossy(&output.stdout);
    assert!(
        graph.contains("flowchart LR") && graph.contains("(zeromq)") && graph.contains("(shmem)"),
        "{graph}"
    );
    // An invalid file of the topology crate's tests is a usage error saying `expected`; what
    // a transport's address takes comes from the transports' own registrations.
    for (file, expected) in [
        ("invalid-push-push.toml", "invalid-push-push.toml:14:11:"),
        (
            "invalid-address-scheme.toml",
            "transport zeromq takes tcp:// and ipc://, not verbs://",
        ),
    ] {
        let bad = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../topology/tests/data")
            .join(file);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
            .arg("validate")
            .arg(&bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{file}: {stderr}");
        assert!(stderr.contains(expected), "{file}: {stderr}");
    }
}

#[tokio::test]
async fn a_built_in_devices_bad_property_values_are_refused_with_their_lines_before_anything_runs()
{
    // What each device refuses at INIT: `validate` used to call this file valid, and `run`
    // started every device before the sampler failed.
    let text = r#"transport = "zeromq"

[[device]]
id = "sampler"
kind = "sampler"
properties = { msg-size = -1, rate = 100 }

[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "sink"
kind = "sink"
properties = { verify = "maybe" }

[[device.channel]]
name = "data"
type = "pull"
connect = "sampler.data"

[[device]]
id = "paced"
kind = "bsampler"
properties = { msg-rate = nan }

[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "replay"
kind = "replay"

[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "typo"
kind = "sink"
properties = { verfy = true, shm-segment-size = 1048576 }

[[device.channel]]
name = "data"
type = "pull"

[[device]]
id = "misnamed"
kind = "sampler"

[[device.channel]]
name = "foo"
type = "push"
"#;
    let file = TempFile::holding("bad-properties.toml", text);
    let name = file.path();
    let expected = [
        format!("{name}:6:27: device \"sampler\": property \"msg-size\" has invalid value \"-1\""),
        format!("{name}:15:25: device \"sink\": property \"verify\" has invalid value \"maybe\""),
        format!("{name}:25:27: device \"paced\": property \"msg-rate\" has invalid value NaN"),
        format!("{name}:33:8: device \"replay\": property \"file\" is missing"),
        // A key no sink reads changed nothing, silently (a bad-input sweep).
        format!(
            "{name}:42:24: device \"typo\": property \"verfy\" (= \"true\") is not one a sink reads; did you mean \"verify\"?"
        ),
        // A channel a built-in device does not use, and none it does: failed only at INIT.
        format!(
            "{name}:50:8: device \"misnamed\": no channel \"data\" (a sampler uses it; out-channel renames it); its channels: foo"
        ),
    ];
    for command in ["validate", "run"] {
        let output = tokio::time::timeout(
            STEP,
            Command::new(env!("CARGO_BIN_EXE_ferromq"))
                .arg(command)
                .arg(&file.0)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("ends in time")
        .expect("run ferromq");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
        for line in &expected {
            assert!(
                stderr.contains(line.as_str()),
                "{command}: no {line:?} in {stderr}"
            );
        }
        assert!(
            !stderr.contains("INIT"),
            "{command} started a device: {stderr}"
        );
    }
}

#[tokio::test]
async fn exec_devices_are_started_with_the_device_options() {
    // Any binary that takes FairMQ's device options can be an exec device; ferromq itself does.
    let exe = env!("CARGO_BIN_EXE_ferromq");
    let text = format!(
        r#"
[[device]]
id = "sampler"
kind = "exec"
command = ["{exe}", "device", "sampler"]
max-iterations = 500

[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "sink"
kind = "exec"
command = ["{exe}", "device", "sink"]
max-iterations = 500
properties = {{ verify = true }}

[[device.channel]]
name = "data"
type = "pull"
connect = "sampler.data"
"#
    );
    let file = std::env::temp_dir().join(format!("ferromq-exec-{}.toml", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let finished = support::finish(ferromq_run(&file, &[])).await;
    std::fs::remove_file(&file).unwrap();
    assert_eq!(
        finished.code,
        Some(0),
        "{}\n{}",
        finished.stderr,
        finished.stdout
    );
    assert!(
        // Built-in devices count `max-iterations` as FairMQ does: N + 1.
        finished.stdout.contains("received 501 messages")
            && finished.stdout.contains("501 checksums ok"),
        "{}",
        finished.stdout
    );
    assert!(
        finished.stdout.contains("every device finished its work"),
        "{}",
        finished.stdout
    );
}

/// Waits (within [`STEP`]) for `run` to exit, reading its stderr and the rest of its stdout
/// (into `seen`): its exit status and its stderr.
async fn run_to_its_end(
    run: &mut Child,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: &mut Vec<String>,
) -> (std::process::ExitStatus, String) {
    let mut stderr = run.stderr.take().expect("stderr");
    let mut errors = String::new();
    let (status, _, _) = tokio::time::timeout(STEP, async {
        tokio::join!(
            run.wait(),
            stderr.read_to_string(&mut errors),
            support::wait_for_end(lines, seen)
        )
    })
    .await
    .expect("exit in time");
    (status.expect("wait"), errors)
}

/// Whether process `pid` is gone within [`STEP`]: the kernel may take a moment to end a
/// killed one.
async fn gone_within_step(pid: u32) -> bool {
    let mut look = tokio::time::interval(Duration::from_millis(20));
    tokio::time::timeout(STEP, async {
        while alive(pid) {
            look.tick().await;
        }
    })
    .await
    .is_ok()
}

/// Kills process `pid` on drop, if it still lives: a test that fails leaves nothing running.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// An `exec` device that is a shell running a process of its own, stopped before it opened its
/// control endpoint: by SIGTERM (the launcher's first Ctrl-C), which the shell heeds, or by
/// SIGKILL (the second) when the shell and its child ignore SIGTERM. Before, the launcher
/// signalled the shell alone, and its `sleep` ran on, reparented to init (a bad-input sweep).
/// Returns the launcher's exit code and its output, once the shell's child is gone (the test
/// fails if it outlives the launcher).
async fn exec_shell_with_a_child_interrupted(trap: &str, n_interrupts: usize) -> (i32, String) {
    assert!((1..=2).contains(&n_interrupts));
    let session = format!("test-exec-tree-{}-{n_interrupts}", std::process::id());
    let file = TempFile::holding(
        "exec-tree.toml",
        &format!(
            r#"
[[device]]
id = "shell"
kind = "exec"
command = ["sh", "-c", "{trap}sleep 1000 & echo child $!; wait"]
"#
        ),
    );
    let mut run = ferromq_run(Path::new(&file.path()), &["--session", &session]);
    let mut lines = BufReader::new(run.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    support::wait_for_line(&mut lines, "[shell] child ", &mut seen).await;
    let child: u32 = seen
        .last()
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .expect("the child's pid");
    let _child_killed = KillOnDrop(child);
    assert!(alive(child), "{seen:?}");
    support::signal(&run, "INT");
    if n_interrupts == 2 {
        // Again once the launcher said it heard the first.
        support::wait_for_line(&mut lines, "again to kill", &mut seen).await;
        support::signal(&run, "INT");
    }
    let (status, errors) = run_to_its_end(&mut run, &mut lines, &mut seen).await;
    // Killed before the launcher exits.
    assert!(
        gone_within_step(child).await,
        "the shell's child {child} outlived the launcher:\n{errors}\n{seen:#?}"
    );
    (
        status.code().unwrap_or(-1),
        format!("{errors}\n{}", seen.join("\n")),
    )
}

#[tokio::test]
async fn an_exec_devices_own_processes_are_stopped_with_it() {
    let (code, output) = exec_shell_with_a_child_interrupted("", 1).await;
    assert_ne!(code, 0, "{output}");
    assert!(output.contains("exited with signal: 15"), "{output}");
    assert!(
        output.contains("device \"shell\" exited and left 1 process(es) it started running (")
            && output.contains(" sleep): killed"),
        "{output}"
    );
}

#[tokio::test]
async fn an_exec_devices_own_processes_are_killed_with_it() {
    let (code, output) = exec_shell_with_a_child_interrupted("trap '' TERM; ", 2).await;
    assert_ne!(code, 0, "{output}");
    assert!(output.contains("killing every device"), "{output}");
}

/// A device restarted after it was killed left what it had started (a shell's `sleep`, the
/// shell having become the device) running beside its new process until the whole run ended:
/// it is killed, and named, when the device's exit is handled.
#[tokio::test]
async fn a_restarted_devices_own_processes_are_killed_at_its_restart() {
    let session = format!("test-restart-leftovers-{}", std::process::id());
    let file = TempFile::holding(
        "restart-leftovers.toml",
        &format!(
            r#"
[[device]]
id = "sampler"
kind = "sampler"
properties = {{ rate = 100, msg-size = 100 }}
[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "sink"
kind = "exec"
command = ["sh", "-c", "sleep 1000 & echo child $!; exec \"$0\" device sink \"$@\"", "{}"]
restart = "on-failure"
restart-delay = 0.2
[[device.channel]]
name = "data"
type = "pull"
connect = "sampler.data"
"#,
            env!("CARGO_BIN_EXE_ferromq")
        ),
    );
    let mut run = ferromq_run(Path::new(&file.path()), &["--session", &session]);
    let mut lines = BufReader::new(run.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let child_in = |seen: &[String]| -> u32 {
        seen.last()
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
            .expect("the child's pid")
    };
    support::wait_for_line(&mut lines, "[sink] child ", &mut seen).await;
    let first_child = child_in(&seen);
    let first_killed = KillOnDrop(first_child);
    let (_, device) = state_and_parent(first_child).expect("the first child's parent");
    support::top_json_until(&session, |snapshot| {
        support::ids_in_state(snapshot, "RUNNING").len() == 2
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(device as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the device");
    support::wait_for_line(&mut lines, "[sink] child ", &mut seen).await;
    let second_child = child_in(&seen);
    let _second_killed = KillOnDrop(second_child);
    support::wait_for_line(&mut lines, "is RUNNING again (restart 1)", &mut seen).await;
    // Killed before the new process started.
    assert!(
        gone_within_step(first_child).await,
        "the first process's child {first_child} runs beside the restarted device: {seen:#?}"
    );
    // Gone: its pid may be another process's from now on.
    std::mem::forget(first_killed);
    assert!(alive(second_child), "{seen:#?}");
    support::signal(&run, "INT");
    let (status, errors) = run_to_its_end(&mut run, &mut lines, &mut seen).await;
    let output = format!("{errors}\n{}", seen.join("\n"));
    assert_eq!(status.code(), Some(0), "{output}");
    let named = format!(
        "device \"sink\" exited and left 1 process(es) it started running ({first_child} sleep): killed"
    );
    assert_eq!(errors.matches(&named).count(), 1, "{output}");
    assert!(
        gone_within_step(second_child).await,
        "{second_child} outlived the launcher: {output}"
    );
}

/// A binder of several sockets (`numSockets = 2`) without an address got one ipc path for all
/// of them, and the second failed with "address in use" (a bad-input sweep): each now binds
/// loopback tcp on a port of its own.
#[tokio::test]
async fn a_binder_of_several_sockets_without_an_address_runs() {
    for transport in ["zeromq", "shmem"] {
        let text = format!(
            r#"transport = "{transport}"

[[device]]
id = "s"
kind = "sampler"
max-iterations = 100
properties = {{ msg-size = 100 }}

[[device.channel]]
name = "data"
type = "push"
numSockets = 2

[[device]]
id = "k"
kind = "sink"
max-iterations = 100

[[device.channel]]
name = "data"
type = "pull"
connect = "s.data"
"#
        );
        let file = TempFile::holding(&format!("several-sockets-{transport}.toml"), &text);
        let session = format!("test-several-{}-{transport}", std::process::id());
        let support::Finished {
            code,
            stdout,
            stderr,
        } = support::finish(ferromq_run(&file.0, &["--session", &session])).await;
        assert_eq!(code, Some(0), "{transport}: {stdout}{stderr}");
        assert!(
            stdout.contains("received 101 messages"),
            "{transport}: {stdout}{stderr}"
        );
    }
}

/// An mcts worker in no rpc group said "an mcts worker needs the driver listed first" (a
/// bad-input sweep): a topology now refuses it before it runs, and a worker started by hand
/// with the group's channels but without its members says it is in no group.
#[tokio::test]
async fn an_mcts_worker_in_no_group_is_told_so() {
    let text = "[[device]]\nid = \"w\"\nkind = \"mcts-worker\"\n";
    let file = TempFile::holding("lone-worker.toml", text);
    let session = format!("test-lone-worker-{}", std::process::id());
    let refused = support::finish(ferromq_run(&file.0, &["--session", &session])).await;
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains(
            "device \"w\": no channel \"search\" (an [[rpc]] group named \"search\" gives its members this channel)"
        ),
        "{}",
        refused.stderr
    );
    let ipc = format!("ipc:///tmp/lone-worker-{}", std::process::id());
    let by_hand = support::finish(support::ferromq_as_is(&[
        "device",
        "mcts-worker",
        "--id",
        "w",
        "--control",
        "static",
        "--session",
        &session,
        "--channel-config",
        &format!("name=search,type=pull,method=bind,address={ipc}.in"),
        "--channel-config",
        &format!("name=search-out,type=push,method=connect,address={ipc}.out"),
    ]))
    .await;
    let _ = std::fs::remove_file(format!("/tmp/lone-worker-{}.in", std::process::id()));
    assert_eq!(by_hand.code, Some(1), "{}", by_hand.stderr);
    let all = format!("{}{}", by_hand.stdout, by_hand.stderr);
    assert!(
        all.contains("device \"w\" is in no rpc group \"search\": declare one with [[rpc]]"),
        "{all}"
    );
}

/// A driver and a worker given different games (a bad-input sweep: Hex against tic-tac-toe,
/// or Hex on two boards) searched on, the worker unable to read the driver's positions, and
/// the run ended 0. The driver now asks every worker what it plays first and ends the run with
/// an error naming the worker and both games. Tic-tac-toe with a `board` other than 3 is
/// refused before anything runs.
#[tokio::test]
async fn mcts_members_that_play_different_games_end_the_run_naming_both() {
    let topology = |driver: &str, worker: &str| {
        format!(
            "transport = \"zeromq\"\n[[device]]\nid = \"driver\"\nkind = \"mcts-driver\"\n\
             properties = {{ {driver}, rollouts = 200, moves = 1 }}\n[[device]]\nid = \"worker\"\n\
             kind = \"mcts-worker\"\nproperties = {{ {worker} }}\n[[rpc]]\nname = \"search\"\n\
             members = [\"driver\", \"worker\"]\n"
        )
    };
    let cases = [
        (
            r#"game = "hex", board = 5"#,
            r#"game = "tictactoe""#,
            r#"mcts worker "worker" plays tictactoe, the driver "driver" hex on a 5x5 board"#,
        ),
        (
            r#"game = "hex", board = 5"#,
            r#"game = "hex", board = 7"#,
            r#"mcts worker "worker" plays hex on a 7x7 board, the driver "driver" hex on a 5x5 board"#,
        ),
    ];
    for (idx, (driver, worker, said)) in cases.into_iter().enumerate() {
        let file = TempFile::holding(
            &format!("mcts-mismatch-{idx}.toml"),
            &topology(driver, worker),
        );
        let session = format!("test-mcts-mismatch-{}-{idx}", std::process::id());
        let run = support::finish(ferromq_run(&file.0, &["--session", &session])).await;
        let all = format!("{}{}", run.stdout, run.stderr);
        assert_eq!(run.code, Some(1), "{driver} against {worker}: {all}");
        assert!(all.contains(said), "{driver} against {worker}: {all}");
    }
    let file = TempFile::holding(
        "mcts-tictactoe-board.toml",
        &topology(r#"game = "tictactoe", board = 5"#, r#"game = "tictactoe""#),
    );
    let session = format!("test-mcts-board-{}", std::process::id());
    let refused = support::finish(ferromq_run(&file.0, &["--session", &session])).await;
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("tictactoe is played on a 3x3 board (board is Hex's side)"),
        "{}",
        refused.stderr
    );
}

/// `sampler.data -> sink.data`, the sampler's channel on the transport `own` names, the sink's
/// on the file's `default` (both sent 100 messages).
fn two_transports(default: &str, own: &str) -> String {
    format!(
        r#"transport = "{default}"

[[device]]
id = "sampler"
kind = "sampler"
max-iterations = 100

[[device.channel]]
name = "data"
type = "push"
transport = "{own}"

[[device]]
id = "sink"
kind = "sink"
max-iterations = 100

[[device.channel]]
name = "data"
type = "pull"
connect = "sampler.data"
"#
    )
}

/// `ferromq run FILE --transport NAME` checked the file with the file's own `transport` and
/// only then put the channels that name none on NAME: a connection whose ends NAME puts on two
/// transports passed the check and started every device (which could then never meet), and
/// one whose ends only NAME puts on one transport was refused. The file is now checked as it
/// will run, in `validate`'s words for the file written that way.
#[tokio::test]
async fn run_checks_the_topology_with_the_transport_it_is_given() {
    let session = format!("test-given-transport-{}", std::process::id());
    // Valid as written (both on zeromq); on shmem, the sink's end is not on the sampler's.
    let written = TempFile::holding("given-zeromq.toml", &two_transports("zeromq", "zeromq"));
    let as_run = TempFile::holding("given-as-run.toml", &two_transports("shmem", "zeromq"));
    let validated = Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .arg("validate")
        .arg(&as_run.0)
        .output()
        .await
        .expect("run ferromq validate");
    let validate_says = String::from_utf8_lossy(&validated.stderr).replace(&as_run.path(), "FILE");
    assert_eq!(validated.status.code(), Some(2), "{validate_says}");
    assert!(
        validate_says.contains("FILE:21:11: device \"sink\" channel \"data\": connect \"sampler.data\": that channel is on zeromq, this one on shmem; both ends of a connection use one transport"),
        "{validate_says}"
    );
    let refused = support::finish(ferromq_run(
        &written.0,
        &[
            "--transport",
            "shmem",
            "--duration",
            "5",
            "--session",
            &session,
        ],
    ))
    .await;
    let run_says = refused.stderr.replace(&written.path(), "FILE");
    assert_eq!(refused.code, Some(2), "{run_says}{}", refused.stdout);
    assert!(run_says.starts_with(&validate_says), "{run_says}");
    assert!(
        run_says.contains("checked as it would run: on --transport shmem"),
        "{run_says}"
    );
    assert!(
        !refused.stdout.contains("processes, session") && !refused.stdout.contains("INIT"),
        "started devices: {}",
        refused.stdout
    );
    // Refused as written (shmem against the default zeromq); both on shmem as run.
    let written = TempFile::holding("given-reverse.toml", &two_transports("zeromq", "shmem"));
    let ran = support::finish(ferromq_run(
        &written.0,
        &["--transport", "shmem", "--session", &session],
    ))
    .await;
    assert_eq!(ran.code, Some(0), "{}{}", ran.stderr, ran.stdout);
    assert!(
        ran.stdout.contains("received 101 messages"),
        "{}",
        ran.stdout
    );
    assert_eq!(shm_objects_of(&session), 0, "left shared memory");
}

/// The ofi transport takes `tcp://` and `verbs://`: a file whose channels bind `ipc://` on the
/// file's zeromq passed `ferromq run --transport ofi`'s check and failed once the device bound.
#[cfg(feature = "ofi")]
#[tokio::test]
async fn run_checks_addresses_with_the_transport_it_is_given() {
    let session = format!("test-given-scheme-{}", std::process::id());
    let address = format!("ipc:///tmp/ferromq-given-scheme-{}", std::process::id());
    let text = format!(
        "transport = \"zeromq\"\n\n[[device]]\nid = \"sink\"\nkind = \"sink\"\n\n\
         [[device.channel]]\nname = \"data\"\ntype = \"pull\"\naddress = \"{address}\"\n"
    );
    let written = TempFile::holding("given-scheme.toml", &text);
    let refused = support::finish(ferromq_run(
        &written.0,
        &[
            "--transport",
            "ofi",
            "--duration",
            "5",
            "--session",
            &session,
        ],
    ))
    .await;
    assert_eq!(
        refused.code,
        Some(2),
        "{}{}",
        refused.stderr,
        refused.stdout
    );
    assert!(
        refused.stderr.contains(&format!(
            "{}:10:11: device \"sink\" channel \"data\": address {address}: transport ofi takes tcp:// and verbs://, not ipc://",
            written.path()
        )),
        "{}",
        refused.stderr
    );
    assert!(
        !refused.stdout.contains("INIT"),
        "started devices: {}",
        refused.stdout
    );
}

/// The sbatch script `--print-batch` prints runs what the same command without it would: its
/// `ferromq run` is given the command's transport, duration, session and metrics options. It
/// was given `--launcher slurm` alone, so `--transport shmem --duration 5` printed a job that
/// ran on the file's transport until cancelled.
#[tokio::test]
async fn the_batch_script_passes_on_what_the_run_was_asked() {
    let asked = [
        "--launcher",
        "slurm",
        "--print-batch",
        "--transport",
        "zeromq",
        "--duration",
        "2.5",
        "--session",
        "batch-1",
        "--metrics",
        "127.0.0.1:0",
    ];
    let printed = ferromq_run(&topology("multi-host.toml"), &asked)
        .wait_with_output()
        .await
        .expect("run ferromq");
    let stderr = String::from_utf8_lossy(&printed.stderr);
    assert!(printed.status.success(), "{stderr}");
    let script = String::from_utf8(printed.stdout).expect("UTF-8");
    let exec = script
        .lines()
        .find(|line| line.starts_with("exec "))
        .unwrap_or_else(|| panic!("no exec line: {script}"));
    assert!(
        exec.ends_with(
            " --launcher slurm --transport zeromq --duration 2.5 --session batch-1 --metrics 127.0.0.1:0"
        ),
        "{exec}"
    );
    assert!(!exec.contains("--print-batch"), "{exec}");
}
