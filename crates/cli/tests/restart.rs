//! Restart policies and expendable devices under `ferromq run`: a device SIGKILLed while the
//! topology runs comes back (`restart = "on-failure"`) with every message accounted for (over
//! shmem, whose receivers count what they take, so a sender knows what a dead receiver never
//! took; over zeromq push and pair, whose sender puts back what it did not write and gives it to
//! the replacement), its limit ends the run as before, and an expendable replica killed leaves the run
//! going while the minimum holds (and fails it below).

mod support;

use std::time::Duration;

use support::{ferromq_as_is, finish, sampler_total, sink_summary, top_json_until};

/// A topology file of its own for this test, removed on drop.
struct TopologyFile(std::path::PathBuf);

impl TopologyFile {
    fn new(tag: &str, text: &str) -> TopologyFile {
        let path = std::env::temp_dir().join(format!("ferromq-{tag}-{}.toml", std::process::id()));
        std::fs::write(&path, text).expect("write the topology");
        TopologyFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for TopologyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Device `id` in a `ferromq top --json` snapshot.
fn device<'a>(snapshot: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
    snapshot["devices"]
        .as_array()?
        .iter()
        .find(|device| device["id"] == id)
}

fn messages_in(snapshot: &serde_json::Value, id: &str) -> u64 {
    device(snapshot, id).map_or(0, |device| {
        device["channels"][0]["messages_in"].as_u64().unwrap_or(0)
    })
}

fn pid(snapshot: &serde_json::Value, id: &str) -> i32 {
    device(snapshot, id)
        .and_then(|device| device["pid"].as_i64())
        .and_then(|pid| i32::try_from(pid).ok())
        .unwrap_or_else(|| panic!("no pid of {id}: {snapshot:#}"))
}

fn kill(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
        .unwrap_or_else(|error| panic!("kill -{signal} {pid}: {error}"));
}

/// Waits for a launcher that must fail: exit code 1.
async fn finish_failed(run: tokio::process::Child) -> support::Finished {
    let finished = finish(run).await;
    assert_eq!(
        finished.code,
        Some(1),
        "{}{}",
        finished.stdout,
        finished.stderr
    );
    finished
}

const SAMPLER_TO_SINK: &str = r#"
transport = "TRANSPORT"
[[device]]
id = "sampler"
kind = "sampler"
max-iterations = 1500
properties = { rate = 500, msg-size = 1000 }
[[device.channel]]
name = "data"
type = "SENDER"

[[device]]
id = "sink"
kind = "sink"
restart = "on-failure"
restart-delay = 0.2
RESTARTS
[[device.channel]]
name = "data"
type = "RECEIVER"
connect = "sampler.data"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_device_comes_back_and_every_message_is_accounted_for_over_shmem() {
    a_sigkilled_device_comes_back_and_every_message_is_accounted_for("shmem", "push").await;
}

/// zmq.rs dropped what it had queued for the dead sink (127 of 1 501 here) and the sampler
/// exited 0; ferromq's own push puts what it did not write back in its queue for the next sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_device_comes_back_and_every_message_is_accounted_for_over_zeromq() {
    a_sigkilled_device_comes_back_and_every_message_is_accounted_for("zeromq", "push").await;
}

/// The same over a zeromq pair: its peer's replacement gets what the dead one never took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_pair_peer_comes_back_and_every_message_is_accounted_for_over_zeromq() {
    a_sigkilled_device_comes_back_and_every_message_is_accounted_for("zeromq", "pair").await;
}

/// `pattern`: "push" (the sink pulls) or "pair" (both ends).
async fn a_sigkilled_device_comes_back_and_every_message_is_accounted_for(
    transport: &str,
    pattern: &str,
) {
    let session = format!("restart-{transport}-{pattern}-{}", std::process::id());
    let file = TopologyFile::new(
        &format!("restart-{transport}-{pattern}"),
        &SAMPLER_TO_SINK
            .replace("RESTARTS", "")
            .replace("TRANSPORT", transport)
            .replace("SENDER", pattern)
            .replace("RECEIVER", if pattern == "push" { "pull" } else { "pair" }),
    );
    let run = ferromq_as_is(&["run", file.path(), "--session", &session]);
    let flowing = top_json_until(&session, |snapshot| messages_in(snapshot, "sink") >= 200).await;
    let sampler = pid(&flowing, "sampler");
    let first_sink = pid(&flowing, "sink");
    // The sampler held still, so nothing is in flight when the sink dies: what the first sink
    // had is exactly what it counted.
    kill(sampler, nix::sys::signal::Signal::SIGSTOP);
    // Its count settles once it took what was sent before the stop.
    let mut look = tokio::time::interval(Duration::from_millis(300));
    let mut before = u64::MAX;
    let mut first_count = 0;
    for _ in 0..100 {
        look.tick().await;
        let snapshot =
            top_json_until(&session, |snapshot| device(snapshot, "sink").is_some()).await;
        let now = messages_in(&snapshot, "sink");
        if now == before {
            first_count = now;
            break;
        }
        before = now;
    }
    assert!(first_count >= 200, "the first sink's count never settled");
    kill(first_sink, nix::sys::signal::Signal::SIGKILL);
    top_json_until(&session, |snapshot| {
        device(snapshot, "sink").is_some_and(|sink| {
            sink["state"] == "RUNNING" && sink["pid"].as_i64() != Some(i64::from(first_sink))
        })
    })
    .await;
    kill(sampler, nix::sys::signal::Signal::SIGCONT);
    // The sampler finishes its 1500 (+1) messages; the second sink takes the rest.
    top_json_until(&session, |snapshot| {
        device(snapshot, "sampler").is_some_and(|sampler| sampler["state"] == "READY")
    })
    .await;
    support::signal(&run, "INT");
    let finished = finish(run).await;
    let stdout = &finished.stdout;
    let output = format!("{stdout}{}", finished.stderr);
    assert!(
        stdout.contains("device \"sink\" exited (signal: 9 (SIGKILL)) while RUNNING; restarting it in 0.2 s (restart 1 of at most 5)"),
        "{output}"
    );
    assert!(
        stdout.contains("device \"sink\" is RUNNING again (restart 1)"),
        "{output}"
    );
    assert!(
        stdout.contains("device \"sink\" was restarted 1 time(s)"),
        "{output}"
    );
    let sent = sampler_total(stdout, "");
    let summary = sink_summary(stdout, "");
    let second_count: u64 = summary
        .split_once("received ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no count in {summary:?}"));
    assert_eq!(sent, 1501, "{output}");
    // What the sampler handed to the first sink's socket after it died (the sampler was
    // stopped and could not know) is counted by the sender, never silently gone: over shmem
    // the receivers count what they take, and the sampler reports the rest and exits 1; over
    // zeromq the sampler's push puts back what it did not write and the second sink gets it.
    let lost: u64 = output
        .lines()
        .find_map(|line| {
            let (_, rest) = line.split_once("[sampler] ")?;
            let (count, _) = rest.split_once(" message(s) accepted by send were not delivered")?;
            count.rsplit(": ").next()?.parse().ok()
        })
        .unwrap_or(0);
    assert_eq!(
        first_count + second_count + lost,
        sent,
        "the first sink counted {first_count}, the second {second_count}, the sampler reported {lost} lost of {sent}:\n{output}"
    );
    let expected_code = if lost == 0 { 0 } else { 1 };
    assert_eq!(finished.code, Some(expected_code), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_restart_limit_a_device_fails_the_run_naming_the_limit() {
    let session = format!("restart-limit-{}", std::process::id());
    let file = TopologyFile::new(
        "restart-limit",
        &SAMPLER_TO_SINK
            .replace("RESTARTS", "max-restarts = 1")
            .replace("TRANSPORT", "shmem")
            .replace("SENDER", "push")
            .replace("RECEIVER", "pull"),
    );
    let run = ferromq_as_is(&["run", file.path(), "--session", &session]);
    let first = top_json_until(&session, |snapshot| messages_in(snapshot, "sink") > 0).await;
    let first_sink = pid(&first, "sink");
    kill(first_sink, nix::sys::signal::Signal::SIGKILL);
    let second = top_json_until(&session, |snapshot| {
        device(snapshot, "sink").is_some_and(|sink| {
            sink["state"] == "RUNNING" && sink["pid"].as_i64() != Some(i64::from(first_sink))
        })
    })
    .await;
    kill(pid(&second, "sink"), nix::sys::signal::Signal::SIGKILL);
    let finished = finish_failed(run).await;
    assert!(
        finished
            .stderr
            .contains("not restarted: it was restarted 1 time(s), its limit (max-restarts)"),
        "{}",
        finished.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expendable_replica_killed_leaves_the_run_going_until_too_few_are_left() {
    let session = format!("expendable-{}", std::process::id());
    let file = TopologyFile::new(
        "expendable",
        r#"
[[device]]
id = "sampler"
kind = "sampler"
properties = { rate = 300, msg-size = 100 }
[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "worker"
kind = "sink"
replicas = 3
min-replicas = 2
[[device.channel]]
name = "data"
type = "pull"
connect = "sampler.data"
"#,
    );
    let run = ferromq_as_is(&["run", file.path(), "--session", &session]);
    let running = top_json_until(&session, |snapshot| {
        ["worker-0", "worker-1", "worker-2"]
            .iter()
            .all(|id| messages_in(snapshot, id) > 0)
    })
    .await;
    kill(pid(&running, "worker-1"), nix::sys::signal::Signal::SIGKILL);
    // The others keep receiving what worker-1 no longer takes.
    let worker_0_before = messages_in(&running, "worker-0");
    let going_on = top_json_until(&session, |snapshot| {
        device(snapshot, "worker-1").is_none()
            && messages_in(snapshot, "worker-0") > worker_0_before + 100
    })
    .await;
    assert_eq!(
        device(&going_on, "worker-2").map(|worker| worker["state"].clone()),
        Some(serde_json::json!("RUNNING"))
    );
    // One more: fewer than two left, the run fails naming it.
    kill(
        pid(&going_on, "worker-2"),
        nix::sys::signal::Signal::SIGKILL,
    );
    let finished = finish_failed(run).await;
    assert!(
        finished.stdout.contains(
            "device \"worker-1\" ended (signal: 9 (SIGKILL)); expendable, the topology goes on \
             without it: 2 of 3 replica(s) of \"worker\" still run, at least 2 needed"
        ),
        "{}",
        finished.stdout
    );
    assert!(
        finished
            .stderr
            .contains("device \"worker-2\" exited (signal: 9 (SIGKILL)) while RUNNING"),
        "{}",
        finished.stderr
    );
}
