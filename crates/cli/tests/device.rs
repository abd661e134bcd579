//! `ferromq device` end to end: real processes, real sockets, real signals.

mod support;

use std::time::Duration;

use support::{
    Device, Ipc, ShmSession, TempFile, assert_each_fails_at_init, finish, signal, wait_for_end,
    wait_for_line,
};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

const STEP: Duration = Duration::from_secs(60);

#[tokio::test]
async fn sampler_to_sink_static_1000_checksummed() {
    let ipc = Ipc::new("pair");
    let sink = Device::new("sink", "sink1")
        .args(&["--max-iterations", "1000", "--verify"])
        .channel("pull", "bind", &ipc.address());
    let sampler = Device::new("sampler", "sampler1")
        .args(&["--max-iterations", "1000", "--msg-size", "4096"])
        .channel("push", "connect", &ipc.address());
    let (sink, sampler) = tokio::join!(sink.finish(), sampler.finish());
    assert_eq!(sampler.code, Some(0), "sampler: {}", sampler.stderr);
    assert_eq!(sink.code, Some(0), "sink: {}", sink.stderr);
    assert!(
        sink.stdout
            .contains("received 1001 messages, 4100096 bytes")
            && sink.stdout.contains("1001 checksums ok"),
        "{}",
        sink.stdout
    );
}

#[tokio::test]
async fn sampler_to_sink_over_shared_memory_leaves_nothing_behind() {
    let ipc = Ipc::new("shm");
    let session = format!("cli-test-{}", std::process::id());
    let common = [
        "--max-iterations",
        "500",
        "--transport",
        "shmem",
        "--session",
        session.as_str(),
        "--shm-segment-size",
        "67108864",
    ];
    let sink = Device::new("sink", "sink1")
        .args(&common)
        .args(&["--verify"])
        .channel("pull", "bind", &ipc.address());
    let sampler = Device::new("sampler", "sampler1")
        .args(&common)
        .args(&["--msg-size", "100000"])
        .channel("push", "connect", &ipc.address());
    let (sink, sampler) = tokio::join!(sink.finish(), sampler.finish());
    assert_eq!(sampler.code, Some(0), "sampler: {}", sampler.stderr);
    assert_eq!(sink.code, Some(0), "sink: {}", sink.stderr);
    assert!(
        sink.stdout.contains("received 501 messages") && sink.stdout.contains("501 checksums ok"),
        "{}",
        sink.stdout
    );
    let list = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["shm", "list", "--session", &session])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.contains(&format!("no ferromq shared memory of session {session}")),
        "the last device removed the session's memory (and the list says which): {list}"
    );
}

#[tokio::test]
async fn sink_connects_first_and_the_sampler_binds_later() {
    let ipc = Ipc::new("reverse");
    let sink = Device::new("sink", "sink1")
        .args(&["--max-iterations", "1000", "--verify"])
        .channel("pull", "connect", &ipc.address())
        .spawn();
    let mut sink_lines = detached_stdout(sink);
    let mut sink_log = Vec::new();
    // The sink is waiting in CONNECTING before the sampler exists.
    wait_for_line(&mut sink_lines, "BOUND ---> CONNECTING", &mut sink_log).await;
    let sampler = Device::new("sampler", "sampler1")
        .args(&["--max-iterations", "1000"])
        .channel("push", "bind", &ipc.address())
        .finish()
        .await;
    assert_eq!(sampler.code, Some(0), "sampler: {}", sampler.stderr);
    wait_for_end(&mut sink_lines, &mut sink_log).await;
    let summary = sink_log
        .iter()
        .rfind(|line| line.contains("sink summary"))
        .expect("the sink printed a summary");
    assert!(
        summary.contains("received 1001 messages") && summary.contains("1001 checksums ok"),
        "{summary}"
    );
}

/// `child`'s stdout as lines; a task owns the child meanwhile, and kills it if it is still
/// running after `STEP` or when the test ends.
fn detached_stdout(mut child: Child) -> Lines<BufReader<ChildStdout>> {
    let stdout = child.stdout.take().expect("stdout");
    tokio::spawn(async move {
        let _ = tokio::time::timeout(STEP, child.wait()).await;
    });
    BufReader::new(stdout).lines()
}

#[tokio::test]
async fn failing_init_task_ends_in_error_with_the_cause_on_stderr() {
    let ipc = Ipc::new("broken");
    let sampler = Device::new("sampler", "broken1")
        .args(&["--payload-file", "/nonexistent/payload"])
        .channel("push", "bind", &ipc.address())
        .finish()
        .await;
    assert_eq!(sampler.code, Some(1));
    assert!(
        sampler.stdout.contains("INITIALIZING TASK ---> ERROR"),
        "{}",
        sampler.stdout
    );
    assert!(
        sampler.stdout.contains("ERROR ---> EXITING"),
        "{}",
        sampler.stdout
    );
    assert!(
        sampler.stderr.contains("init_task failed")
            && sampler.stderr.contains("/nonexistent/payload"),
        "{}",
        sampler.stderr
    );
}

/// Sends SIGINT to `device` as soon as it logs RUNNING; how it exited, and its log.
async fn interrupted_when_running(mut device: Child) -> (std::process::ExitStatus, Vec<String>) {
    let mut lines = BufReader::new(device.stdout.take().expect("stdout")).lines();
    let mut log = Vec::new();
    wait_for_line(&mut lines, "READY ---> RUNNING", &mut log).await;
    signal(&device, "INT");
    wait_for_end(&mut lines, &mut log).await;
    let exit = tokio::time::timeout(STEP, device.wait())
        .await
        .expect("exit")
        .expect("wait");
    (exit, log)
}

#[tokio::test]
async fn sigint_in_running_goes_down_through_every_reset_state_and_exits_0() {
    let ipc = Ipc::new("sigint");
    let sink = Device::new("sink", "sink1")
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let (exit, log) = interrupted_when_running(sink).await;
    assert_eq!(exit.code(), Some(0), "{log:#?}");
    let transitions: Vec<&str> = log
        .iter()
        .filter_map(|line| line.split("] ").nth(1))
        .filter(|text| text.contains("--->"))
        .collect();
    let after_running = transitions
        .iter()
        .position(|text| *text == "READY ---> RUNNING")
        .expect("running");
    assert_eq!(
        transitions[after_running + 1..],
        [
            "RUNNING ---> READY",
            "READY ---> RESETTING TASK",
            "RESETTING TASK ---> DEVICE READY",
            "DEVICE READY ---> RESETTING DEVICE",
            "RESETTING DEVICE ---> IDLE",
            "IDLE ---> EXITING",
        ]
    );
}

/// SIGINT while a sampler builds a large payload (4 GiB): it was built, then copied into the
/// first message, in one go on the runtime's thread, and a signal went unheard for ~20 s (a
/// bad-input sweep). Now the build looks at STOP every 16 MiB: the sampler goes down with
/// nothing sent, having touched a few chunks of the payload.
#[tokio::test]
async fn a_signal_while_a_large_payload_is_built_stops_the_build() {
    let ipc = Ipc::new("large-payload");
    let sampler = Device::new("sampler", "large1")
        .args(&["--msg-size", "4294967296"])
        .channel("push", "bind", &ipc.address())
        .spawn();
    let (exit, log) = interrupted_when_running(sampler).await;
    assert_eq!(exit.code(), Some(0), "{log:#?}");
    let stopped_building = "STOP while the 4294967296-byte payload was being built: nothing sent";
    assert!(
        log.iter().any(|line| line.contains(stopped_building)),
        "{log:#?}"
    );
}

/// The same for a bsampler that zeroes (`--memset`) a 4 GiB message: zeroed in one go, the
/// signal went unheard until the whole message was written. Now it looks at STOP every 16 MiB
/// and goes down without sending the message.
#[tokio::test]
async fn a_signal_while_a_large_message_is_zeroed_stops_the_fill() {
    let ipc = Ipc::new("large-memset");
    let bsampler = Device::new("bsampler", "memset1")
        .args(&["--msg-size", "4294967296", "--memset"])
        .channel("push", "bind", &ipc.address())
        .spawn();
    let (exit, log) = interrupted_when_running(bsampler).await;
    assert_eq!(exit.code(), Some(0), "{log:#?}");
    let stopped_zeroing =
        "STOP while a 4294967296-byte message was being zeroed (memset): it was not sent";
    assert!(
        log.iter().any(|line| line.contains(stopped_zeroing)),
        "{log:#?}"
    );
}

/// A sampler and a sink, both at address `ADDRESS`, in FairMQ's format.
const MQ_CONFIG: &str = include_str!("../../device/tests/data/sampler-sink.json");

#[tokio::test]
async fn mq_config_in_fairmqs_format_is_accepted() {
    let ipc = Ipc::new("mqconfig");
    let file = TempFile::holding(
        "topology.json",
        &MQ_CONFIG.replace("ADDRESS", &ipc.address()),
    );
    let common = ["--max-iterations", "200", "--mq-config", &file.path()];
    let sink = Device::new("sink", "sink1")
        .args(&common)
        .args(&["--verify"]);
    let sampler = Device::new("sampler", "sampler1").args(&common);
    let (sink, sampler) = tokio::join!(sink.finish(), sampler.finish());
    assert_eq!(sampler.code, Some(0), "{}", sampler.stderr);
    assert_eq!(sink.code, Some(0), "{}", sink.stderr);
    assert!(
        sink.stdout.contains("received 201 messages"),
        "{}",
        sink.stdout
    );
}

#[tokio::test]
async fn malformed_mq_config_is_rejected_naming_key_and_position() {
    let file = TempFile::holding(
        "bad.json",
        &MQ_CONFIG.replace("\"sndBufSize\": \"1000\"", "\"sndBufSize\": -1"),
    );
    let sampler = Device::new("sampler", "sampler1")
        .args(&["--mq-config", &file.path()])
        .finish()
        .await;
    assert_eq!(sampler.code, Some(2));
    assert!(
        sampler
            .stderr
            .contains("key \"sndBufSize\" has invalid value \"-1\": expected a whole number, at least 1 message")
            && sampler.stderr.contains("line 7 column")
            && sampler.stderr.contains("bad.json"),
        "{}",
        sampler.stderr
    );
}

#[tokio::test]
async fn external_control_drives_the_state_machine() {
    use ferromq_device::control::{ControlClient, LauncherToDevice};
    use ferromq_device::{State, Transition};

    let control = Ipc::new("control");
    let data = Ipc::new("data");
    let device = Device::plain("sink", "sink1")
        .args(&[
            "--control",
            "external",
            "--control-address",
            &control.address(),
        ])
        .channel("pull", "bind", &data.address())
        .spawn();
    let transport = ferromq_zmq::ZmqTransport::new();
    let mut client = ControlClient::connect(&transport, &control.address())
        .await
        .unwrap();
    let refused = client
        .request(
            &LauncherToDevice::Transition {
                transition: Transition::Run,
            },
            STEP,
        )
        .await
        .unwrap();
    assert!(!refused.ok);
    assert_eq!(
        refused.error.as_deref(),
        Some("transition RUN is not allowed in state IDLE")
    );
    for (transition, state) in [
        (Transition::InitDevice, State::InitializingDevice),
        (Transition::CompleteInit, State::Initialized),
        (Transition::Bind, State::Bound),
    ] {
        client
            .expect_ok(&LauncherToDevice::Transition { transition }, STEP)
            .await
            .unwrap();
        client
            .expect_ok(
                &LauncherToDevice::WaitForState {
                    state,
                    timeout_ms: Some(20_000),
                },
                STEP,
            )
            .await
            .unwrap();
    }
    let channels = client
        .expect_ok(&LauncherToDevice::Channels, STEP)
        .await
        .unwrap();
    assert_eq!(
        channels.value.unwrap()["data"],
        serde_json::json!(data.address())
    );
    client
        .expect_ok(
            &LauncherToDevice::SetProperty {
                key: "verify".into(),
                value: "true".into(),
            },
            STEP,
        )
        .await
        .unwrap();
    let property = client
        .expect_ok(
            &LauncherToDevice::GetProperty {
                key: "verify".into(),
            },
            STEP,
        )
        .await
        .unwrap();
    assert_eq!(property.value, Some(serde_json::json!("true")));
    client
        .expect_ok(&LauncherToDevice::Shutdown, STEP)
        .await
        .unwrap();
    let device = finish(device).await;
    assert_eq!(device.code, Some(0), "{}", device.stderr);
    assert!(
        device.stdout.contains("IDLE ---> EXITING"),
        "{}",
        device.stdout
    );
}

#[tokio::test]
async fn bad_values_are_usage_errors_naming_the_option_and_the_value() {
    let ipc = Ipc::new("bad-values");
    let cases: [(&[&str], &str); 19] = [
        (&["sampler", "--rate", "1e-300"], "--rate 1e-300"),
        (
            &["bsampler", "--rate-burst-ms", "5000"],
            "'5000' for '--rate-burst-ms <MS>': 5000: expected 0 to 1000 ms",
        ),
        // Taken, then refused at INIT naming the object but not the option.
        (
            &["sampler", "--shm-segment-size", "1"],
            "--shm-segment-size 1: expected at least 8192 bytes",
        ),
        (&["sampler", "--rate", "-1"], "--rate -1.0"),
        (&["sampler", "--rate", "nan"], "--rate NaN"),
        (&["sampler", "--rate", "inf"], "--rate inf"),
        (&["bsampler", "--msg-rate", "-5"], "--msg-rate -5.0"),
        (&["bsampler", "--num-parts", "0"], "--num-parts 0"),
        (
            &["sampler", "--shm-segment-size", "0"],
            "--shm-segment-size 0",
        ),
        (
            &["sampler", "--bad-alloc-max-attempts", "-2"],
            "--bad-alloc-max-attempts -2",
        ),
        (&["sampler", "--msg-size", "-1"], "-1"),
        (&["sampler", "--max-iterations", "many"], "many"),
        // A property as the device reads it at INIT, refused before it binds.
        (
            &["sampler", "--property", "num-parts=0"],
            "property \"num-parts\" has invalid value \"0\"",
        ),
        (
            &["bsampler", "--property", "same-msg=maybe"],
            "property \"same-msg\" has invalid value \"maybe\"",
        ),
        // Options and properties the kind does not read were taken and changed nothing; a
        // sampler given two sources of bytes sent one of them (a bad-input sweep).
        (
            &["sink", "--msg-size", "100"],
            "property \"msg-size\" (= \"100\") is not one a sink reads; it reads in-channel",
        ),
        (
            &["sampler", "--property", "msg-sise=10"],
            "property \"msg-sise\" (= \"10\") is not one a sampler reads; did you mean \"msg-size\"?",
        ),
        // `--session=` ran in a session called "default"; a newline in an id split the
        // launcher's lines (a bad-input sweep).
        (
            &["sink", "--session", ""],
            "expected a session id (not empty",
        ),
        (
            &["sink", "--session", "a\nb"],
            "expected a session id (not empty",
        ),
        (
            &["sampler", "--text", "hello", "--msg-size", "100"],
            "property \"msg-size\" is given with \"text\": a sampler sends one of payload-file, text and msg-size",
        ),
    ];
    for (args, expected) in cases {
        let (kind, options) = args.split_first().expect("a kind");
        let finished = Device::new(kind, "bad")
            .args(options)
            .channel("push", "bind", &ipc.address())
            .finish()
            .await;
        assert_eq!(finished.code, Some(2), "{args:?}: {}", finished.stderr);
        assert!(
            finished.stderr.contains(expected),
            "{args:?}: {}",
            finished.stderr
        );
    }
    // An empty id (a topology refuses one too), and an ipc path longer than a unix socket's
    // (refused by the kernel only at BINDING): both found by a bad-input sweep.
    let long_path = format!("ipc:///tmp/{}", "x".repeat(120));
    let more: [(Device, &str); 3] = [
        (
            Device::new("sink", "").channel("pull", "bind", &ipc.address()),
            "--id \"\": expected the device's id",
        ),
        (
            Device::new("sink", "a\nb").channel("pull", "bind", &ipc.address()),
            "--id \"a\\nb\": expected an id without control characters",
        ),
        (
            Device::new("sink", "d").channel("pull", "bind", &long_path),
            "a unix socket's path holds at most 107",
        ),
    ];
    for (device, expected) in more {
        let finished = device.finish().await;
        assert_eq!(finished.code, Some(2), "{expected}: {}", finished.stderr);
        assert!(
            finished.stderr.contains(expected),
            "{expected}: {}",
            finished.stderr
        );
    }
    // A transport's property is a property, not a "channel key".
    let property = Device::new("sink", "d")
        .args(&["--transport", "shmem", "--property", "shm-segment-size=abc"])
        .channel("pull", "bind", &ipc.address())
        .finish()
        .await;
    assert_eq!(property.code, Some(1), "{}", property.stderr);
    assert!(
        property
            .stderr
            .contains("property \"shm-segment-size\" has invalid value \"abc\""),
        "{}",
        property.stderr
    );
    // A libfabric provider on a channel of another transport ran without it (a bad-input
    // sweep): refused when the socket is made, naming the key and the value.
    for transport in ["zeromq", "shmem"] {
        let with_provider = format!(
            "name=data,type=pull,method=bind,address={},provider=verbs;ofi_rxm",
            ipc.address()
        );
        let refused = Device::new("sink", "d")
            .args(&["--transport", transport, "--channel-config", &with_provider])
            .finish()
            .await;
        assert_eq!(refused.code, Some(1), "{transport}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(
                "channel key \"provider\" has invalid value \"verbs;ofi_rxm\": expected none on this transport"
            ),
            "{transport}: {}",
            refused.stderr
        );
    }
    // A directory as an ipc path read "address in use" (a bad-input sweep).
    let directory = Device::new("sink", "d")
        .channel("pull", "bind", "ipc:///tmp")
        .finish()
        .await;
    assert_eq!(directory.code, Some(1), "{}", directory.stderr);
    assert!(
        directory
            .stderr
            .contains("bind failed: /tmp is a directory"),
        "{}",
        directory.stderr
    );
    // No channel at all read "its channels: " and nothing (a bad-input sweep).
    let bare = Device::new("sink", "d").finish().await;
    assert_eq!(bare.code, Some(1), "{}", bare.stderr);
    assert!(
        bare.stderr
            .contains("has no channel \"data\"; its channels: none (give it one with"),
        "{}",
        bare.stderr
    );
    // `--hosts a,,b` reached ssh as the host "".
    let topology = concat!(env!("CARGO_MANIFEST_DIR"), "/../../topologies/default.toml");
    let hosts = finish(support::ferromq_as_is(&[
        "run",
        topology,
        "--launcher",
        "ssh",
        "--hosts",
        "a,,b",
    ]))
    .await;
    assert_eq!(hosts.code, Some(2), "{}", hosts.stderr);
    assert!(
        hosts.stderr.contains("expected a host name"),
        "{}",
        hosts.stderr
    );
}

#[tokio::test]
async fn an_impossible_message_size_is_an_error_naming_the_size_not_an_abort() {
    let ipc = Ipc::new("huge");
    for kind in ["sampler", "bsampler"] {
        let finished = Device::new(kind, "huge")
            .args(&["--msg-size", "100000000000000"])
            .channel("push", "bind", &ipc.address())
            .finish()
            .await;
        assert_eq!(finished.code, Some(1), "{kind}: {}", finished.stderr);
        assert!(
            finished
                .stderr
                .contains("msg-size 100000000000000: cannot allocate"),
            "{kind}: {}",
            finished.stderr
        );
    }
}

#[tokio::test]
async fn shm_segment_size_is_the_size_of_the_segment() {
    let ipc = Ipc::new("segment");
    let session = ShmSession::new("segment");
    for kind in ["sampler", "bsampler"] {
        let finished = Device::new(kind, "small-segment")
            .args(&["--transport", "shmem", "--session", &session.0])
            .args(&["--shm-segment-size", "1048576", "--msg-size", "8388608"])
            .channel("push", "bind", &ipc.address())
            .finish()
            .await;
        assert_eq!(finished.code, Some(1), "{kind}: {}", finished.stderr);
        assert!(
            finished.stderr.contains(
                "a message of 8388608 bytes cannot fit in a shared memory segment of 1048576 bytes"
            ),
            "{kind}: {}",
            finished.stderr
        );
    }
}

#[tokio::test]
async fn fairmqs_benchmark_recipe_runs_unchanged() {
    let ipc = Ipc::new("recipe");
    let session = ShmSession::new("recipe");
    let output = TempFile::new("recipe-out");
    // FairMQ's own benchmark script, option for option (plus ferromq's unique addresses).
    let common = [
        "--transport",
        "shmem",
        "--session",
        session.0.as_str(),
        "--shm-segment-size",
        "67108864",
        "--shm-throw-bad-alloc",
        "false",
        "--bad-alloc-attempt-interval",
        "5",
        "--io-threads",
        "2",
        "--shm-monitor",
        "false",
        "--severity",
        "info",
        "--verbosity",
        "medium",
        "--max-iterations",
        "9",
        "--multipart",
        "true",
    ];
    let sink = Device::new("sink", "sink1")
        .args(&common)
        .args(&["--in-channel", "data", "--out-filename", &output.path()])
        .args(&["--file-severity", "trace"])
        .channel("pull", "bind", &ipc.address());
    let sampler = Device::new("bsampler", "bsampler1")
        .args(&common)
        .args(&[
            "--out-channel",
            "data",
            "--memset",
            "true",
            "--num-parts",
            "2",
        ])
        .args(&["--msg-size", "1000", "--msg-rate", "0"])
        .channel("push", "connect", &ipc.address());
    let (sink, sampler) = tokio::join!(sink.finish(), sampler.finish());
    assert_eq!(sampler.code, Some(0), "bsampler: {}", sampler.stderr);
    assert_eq!(sink.code, Some(0), "sink: {}", sink.stderr);
    assert!(
        sampler
            .stdout
            .contains("--io-threads, --shm-monitor have no effect"),
        "{}",
        sampler.stdout
    );
    // Taken, as FairMQ takes it, and said to do nothing without a log file.
    assert!(
        sink.stdout
            .contains("--file-severity trace has no effect without --log-to-file"),
        "{}",
        sink.stdout
    );
    // --max-iterations 9 is ten messages for FairMQ's pair; two parts of 1000 zeroed bytes each.
    assert!(
        sink.stdout.contains("received 10 messages, 20000 bytes"),
        "{}",
        sink.stdout
    );
    let written = std::fs::read(&output.0).unwrap();
    assert_eq!(written.len(), 20000);
    assert!(written.iter().all(|&byte| byte == 0));
}

#[tokio::test]
async fn max_iterations_counts_as_fairmqs_bsampler_and_sink_do() {
    // A FairMQ sink (here libzmq, counting) waits for N + 1 messages from a bsampler run with N.
    let context = zmq::Context::new();
    let pull = context.socket(zmq::PULL).unwrap();
    pull.bind("tcp://127.0.0.1:*").unwrap();
    let address = pull.get_last_endpoint().unwrap().unwrap();
    let sampler = Device::new("bsampler", "bsampler1")
        .args(&["--max-iterations", "4", "--msg-size", "100"])
        .channel("push", "connect", &address)
        .spawn();
    let n_received = tokio::task::spawn_blocking(move || {
        pull.set_rcvtimeo(60_000).unwrap();
        for _ in 0..5 {
            assert_eq!(pull.recv_bytes(0).unwrap().len(), 100);
        }
        pull
    })
    .await
    .unwrap();
    let sampler = finish(sampler).await;
    assert_eq!(sampler.code, Some(0), "{}", sampler.stderr);
    // The sampler is gone: nothing more was sent than the five.
    assert_eq!(
        n_received.recv_bytes(zmq::DONTWAIT),
        Err(zmq::Error::EAGAIN)
    );

    // A FairMQ bsampler (here libzmq) sends N + 1 messages; a ferromq sink with N takes them all.
    let push = context.socket(zmq::PUSH).unwrap();
    push.set_linger(10_000).unwrap();
    push.bind("tcp://127.0.0.1:*").unwrap();
    let address = push.get_last_endpoint().unwrap().unwrap();
    let sink = Device::new("sink", "sink1")
        .args(&["--max-iterations", "4"])
        .channel("pull", "connect", &address)
        .spawn();
    let push = tokio::task::spawn_blocking(move || {
        for _ in 0..5 {
            push.send(&[7u8; 100][..], 0).unwrap();
        }
        push
    })
    .await
    .unwrap();
    let sink = finish(sink).await;
    drop(push);
    assert_eq!(sink.code, Some(0), "{}", sink.stderr);
    assert!(
        sink.stdout.contains("received 5 messages, 500 bytes"),
        "{}",
        sink.stdout
    );
}

#[tokio::test]
async fn severities_and_verbosities_take_fairloggers_names() {
    let severities = [
        "nolog",
        "fatal",
        "error",
        "alarm",
        "important",
        "warn",
        "warning",
        "state",
        "info",
        "detail",
        "debug",
        "debug1",
        "debug2",
        "debug3",
        "debug4",
        "trace",
    ];
    let verbosities = [
        "verylow", "low", "medium", "high", "veryhigh", "user1", "user2", "user3", "user4",
    ];
    for (option, values) in [
        ("--severity", &severities[..]),
        ("--verbosity", &verbosities[..]),
    ] {
        for value in values {
            let finished = Device::plain("sink", "s")
                .args(&[option, value, "--print-channels"])
                .finish()
                .await;
            assert_eq!(
                finished.code,
                Some(0),
                "{option} {value}: {}",
                finished.stderr
            );
        }
    }
    // verylow: the message alone.
    let finished = Device::new("sampler", "lonely")
        .args(&["--verbosity", "verylow", "--severity", "state"])
        .finish()
        .await;
    assert_eq!(finished.code, Some(1), "{}", finished.stderr);
    assert!(
        finished
            .stdout
            .lines()
            .any(|line| line == "IDLE ---> INITIALIZING DEVICE"),
        "{}",
        finished.stdout
    );
}

#[tokio::test]
async fn print_channels_lists_the_endpoints_in_fairmqs_format() {
    let finished = Device::plain("splitter", "s")
        .args(&["--out-channel", "out", "--print-channels"])
        .finish()
        .await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    assert_eq!(finished.stdout, "data-in:1:1\nout:1:2147483647\n");
}

#[tokio::test]
async fn log_to_file_takes_the_log_lines_off_the_console() {
    let log = TempFile::new("log");
    let finished = Device::new("sampler", "lonely")
        .args(&["--log-to-file", &log.path(), "--file-severity", "debug"])
        .finish()
        .await;
    assert_eq!(finished.code, Some(1), "{}", finished.stderr);
    let written = std::fs::read_to_string(&log.0).unwrap();
    assert!(
        written.contains("IDLE ---> INITIALIZING DEVICE"),
        "{written}"
    );
    assert!(
        !finished.stdout.contains("INITIALIZING DEVICE"),
        "{}",
        finished.stdout
    );
}

#[tokio::test]
async fn network_interface_is_where_tcp_channels_without_an_address_bind() {
    let sink = Device::new("sink", "sink1")
        .args(&["--network-interface", "lo"])
        .args(&[
            "--channel-config",
            "name=data,type=pull,method=bind,rateLogging=0",
        ])
        .spawn();
    let mut lines = detached_stdout(sink);
    let mut log = Vec::new();
    // The sink logs the address it bound.
    wait_for_line(&mut lines, "bound", &mut log).await;
    let line = log.last().expect("the line with \"bound\"");
    assert!(line.contains("tcp://127.0.0.1:"), "{line}");
}

#[tokio::test]
async fn unknown_options_stay_errors_with_a_suggestion() {
    let finished = Device::plain("sink", "s")
        .args(&["--io-thread", "2"])
        .finish()
        .await;
    assert_eq!(finished.code, Some(2));
    assert!(
        finished.stderr.contains("'--io-threads'"),
        "{}",
        finished.stderr
    );
}

#[tokio::test]
async fn one_channel_binds_and_connects_fairmqs_multiple_endpoints() {
    for transport in ["zeromq", "shmem"] {
        multiple_endpoints_over(transport).await;
    }
}

/// The sink binds two addresses on one channel; a sampler connects to each.
async fn multiple_endpoints_over(transport: &str) {
    let (first, second) = (Ipc::new("multi-a"), Ipc::new("multi-b"));
    let session = ShmSession::new("multi");
    let common = [
        "--transport",
        transport,
        "--session",
        session.0.as_str(),
        "--shm-segment-size",
        "16777216",
    ];
    let sink = Device::new("sink", "sink1")
        .args(&common)
        .args(&["--max-iterations", "9", "--verify"])
        .args(&[
            "--channel-config",
            &format!(
                "name=data,type=pull,address=@{},@{},rateLogging=0",
                first.address(),
                second.address()
            ),
        ]);
    let [a, b] = [&first, &second].map(|ipc| {
        Device::new("sampler", "sampler")
            .args(&common)
            .args(&["--max-iterations", "4"])
            .args(&[
                "--channel-config",
                &format!(
                    "name=data,type=push,address=+{},rateLogging=0",
                    ipc.address()
                ),
            ])
    });
    let (sink, a, b) = tokio::join!(sink.finish(), a.finish(), b.finish());
    assert_eq!(a.code, Some(0), "{transport}: {}", a.stderr);
    assert_eq!(b.code, Some(0), "{transport}: {}", b.stderr);
    assert_eq!(sink.code, Some(0), "{transport}: {}", sink.stderr);
    assert!(
        sink.stdout.contains("received 10 messages") && sink.stdout.contains("10 checksums ok"),
        "{transport}: {}",
        sink.stdout
    );
}

/// `ferromq shm ARGS`: its exit code and stdout.
fn shm(args: &[&str]) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .arg("shm")
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A session id with characters outside `[A-Za-z0-9-]` appears encoded in object names and in
/// `ferromq shm list` (`_` as `.5f`, `.` as `.2e`). Its watchdog used to encode it a second
/// time and find no objects, so a device killed with -9 left its 2 GiB segment in /dev/shm;
/// `shm list --session` and `shm clean --session` did not know the name the list showed.
#[tokio::test]
async fn a_session_named_with_underscores_and_dots_is_listed_cleaned_and_watched() {
    let session = ShmSession::new("under_score.dot");
    let encoded = ferromq_shm::names::sanitise_session(&session.0);
    assert!(
        encoded.contains(".5f") && encoded.contains(".2e"),
        "{encoded}"
    );
    let ipc = Ipc::new("encoded-session");
    let mut sampler = Device::new("bsampler", "sampler1")
        .args(&[
            "--transport",
            "shmem",
            "--session",
            &session.0,
            "--shm-segment-size",
            "16777216",
            "--msg-size",
            "1024",
        ])
        .channel("push", "bind", &ipc.address())
        .spawn();
    // No receiver: the sampler allocates its first message (its segment) and waits for a peer.
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let (_, listed, _) = shm(&["list"]);
        if listed.contains(&format!("session {encoded} ")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no session {encoded} in `shm list`: {listed}"
        );
        tokio::task::yield_now().await;
    }
    for name in [session.0.as_str(), encoded.as_str()] {
        let (code, listed, _) = shm(&["list", "--session", name]);
        assert_eq!(code, Some(0));
        assert!(
            listed.contains(&format!("session {encoded} (in use)")),
            "`shm list --session {name}`: {listed}"
        );
        let (code, _, refused) = shm(&["clean", "--session", name]);
        assert_eq!(
            code,
            Some(1),
            "`shm clean --session {name}` of a session in use"
        );
        assert!(
            refused.contains(&encoded) && refused.contains("in use by running processes"),
            "{refused}"
        );
    }
    sampler.start_kill().unwrap();
    sampler.wait().await.unwrap();
    let prefix = ferromq_shm::names::ObjectName::session_prefix(
        ferromq_shm::names::current_uid(),
        &session.0,
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(&prefix))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still in /dev/shm 10 s after kill -9: {left:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// A control address that is no address is a usage error naming the option; one that parses
/// but cannot be bound (its directory does not exist) ends the device at once with the cause.
/// Both used to leave the device in IDLE, silent, until a signal came.
#[tokio::test]
async fn a_control_endpoint_that_cannot_be_bound_ends_the_device() {
    let data = Ipc::new("control-refused");
    let external = |address: &str| {
        Device::plain("sink", "sink1")
            .args(&["--control", "external", "--control-address", address])
            .channel("pull", "bind", &data.address())
    };
    for bad in ["bogus", "ipc://", "udp://x:1"] {
        let refused = external(bad).finish().await;
        assert_eq!(refused.code, Some(2), "{bad}: {}", refused.stderr);
        assert!(
            refused
                .stderr
                .contains(&format!("--control-address {bad:?}")),
            "{bad}: {}",
            refused.stderr
        );
    }
    // An address no endpoint would bind is refused rather than ignored.
    for mode in ["static", "interactive"] {
        let ignored = Device::plain("sink", "sink1")
            .args(&["--control", mode, "--control-address", "ipc:///tmp/x"])
            .channel("pull", "bind", &data.address())
            .finish()
            .await;
        assert_eq!(ignored.code, Some(2), "{mode}: {}", ignored.stderr);
        assert!(
            ignored.stderr.contains(&format!(
                "--control-address \"ipc:///tmp/x\": only --control external reads it (this device has --control {mode})"
            )),
            "{mode}: {}",
            ignored.stderr
        );
    }
    let unbindable = format!("ipc:///nonexistent-ferromq-{}/control", std::process::id());
    let ended = external(&unbindable).finish().await;
    assert_eq!(ended.code, Some(1), "{}", ended.stderr);
    assert!(
        ended.stderr.contains(&unbindable) && ended.stderr.contains("No such file"),
        "{}",
        ended.stderr
    );
}

/// Files without an end (`/dev/zero`) were read until memory ran out: a sampler's
/// `--payload-file`, a device's `--mq-config`, a topology for `validate`, `graph` or `run`.
/// Each read now stops past its bound and names the file.
#[tokio::test]
async fn endless_input_files_are_refused_naming_them() {
    let ipc = Ipc::new("endless");
    let sampler = Device::new("sampler", "sampler1")
        .args(&["--payload-file", "/dev/zero", "--max-iterations", "1"])
        .channel("push", "bind", &ipc.address())
        .finish()
        .await;
    assert_eq!(sampler.code, Some(1), "{}", sampler.stderr);
    assert!(
        sampler
            .stderr
            .contains("payload-file \"/dev/zero\": longer than 1 GiB"),
        "{}",
        sampler.stderr
    );
    let mq_config = Device::new("sink", "sink1")
        .args(&["--mq-config", "/dev/zero"])
        .finish()
        .await;
    assert_eq!(mq_config.code, Some(2), "{}", mq_config.stderr);
    assert!(
        mq_config
            .stderr
            .contains("--mq-config /dev/zero: longer than 16 MiB"),
        "{}",
        mq_config.stderr
    );
    for command in ["validate", "graph", "run"] {
        let topology = finish(support::ferromq_as_is(&[command, "/dev/zero"])).await;
        assert_ne!(topology.code, Some(0), "{command}: {}", topology.stderr);
        assert!(
            topology
                .stderr
                .contains("topology /dev/zero: longer than 16 MiB"),
            "{command}: {}",
            topology.stderr
        );
    }
}

/// FairMQ reads each `address=` of a `--channel-config` as a socket of its own: the channel
/// `data` of two addresses is `data[0]` and `data[1]`, and `data` alone means `data[0]`. Only
/// the last address was kept. Any other key given twice was also taken silently (last wins);
/// a `type` that said two things failed only once running: now refused naming both values.
#[tokio::test]
async fn each_address_of_a_channel_config_is_a_socket_and_other_keys_come_once() {
    let (first, second) = (Ipc::new("socket-0"), Ipc::new("socket-1"));
    let both = format!(
        "name=data,type=push,method=bind,address={},address={},rateLogging=0",
        first.address(),
        second.address()
    );
    let sampler = Device::new("sampler", "sampler1")
        .args(&["--max-iterations", "100", "--verbosity", "high"])
        .args(&["--channel-config", &both]);
    let sink = Device::new("sink", "sink1")
        .args(&["--max-iterations", "100"])
        .channel("pull", "connect", &first.address());
    let (sampler, sink) = tokio::join!(sampler.finish(), sink.finish());
    sampler.assert_exited(0);
    sink.assert_exited(0);
    for (socket, ipc) in [("data[0]", &first), ("data[1]", &second)] {
        let bound = format!("bound channel={socket} address={}", ipc.address());
        assert!(
            sampler.stdout.contains(&bound) || sampler.stderr.contains(&bound),
            "no {bound:?} in {}{}",
            sampler.stdout,
            sampler.stderr
        );
    }
    assert!(
        sink.stdout.contains("received 101 messages"),
        "{}",
        sink.stdout
    );

    let cases = [
        (
            "name=data,type=pull,type=push,method=bind,address=ipc:///tmp/x",
            "channel key \"type\" is given twice (\"pull\", then \"push\")",
        ),
        (
            "name=data,name=data2,type=pull,method=bind,address=ipc:///tmp/x",
            "channel key \"name\" is given twice (\"data\", then \"data2\")",
        ),
        (
            "name=data,type=pull,method=bind,address=ipc:///tmp/x,address=ipc:///tmp/y,numSockets=3",
            "channel \"data\" has 2 addresses and numSockets 3",
        ),
        // Accepted, then the second socket failed at bind with "address in use" (exit 1).
        (
            "name=data,type=pull,method=bind,address=ipc:///tmp/x,numSockets=4",
            "channel \"data\": its 4 sockets (numSockets) would each bind ipc:///tmp/x, which \
             one socket can hold",
        ),
    ];
    for (config, problem) in cases {
        let refused = Device::new("sink", "sink1")
            .args(&["--channel-config", config])
            .finish()
            .await;
        assert_eq!(refused.code, Some(2), "{config}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(problem),
            "{config}: {}",
            refused.stderr
        );
    }
    // One name in two options: said as such, not as a property named "channel data".
    let twice = Device::new("sink", "sink1")
        .channel("pull", "bind", "ipc:///tmp/x")
        .channel("pull", "bind", "ipc:///tmp/y")
        .finish()
        .await;
    assert_eq!(twice.code, Some(2), "{}", twice.stderr);
    assert!(
        twice
            .stderr
            .contains("device \"sink1\": channel \"data\" is configured twice"),
        "{}",
        twice.stderr
    );
}

/// A built-in device whose channel cannot do what the device does on it (a sampler's `data`
/// as pull, a sink's as push, a processor reading its push output) used to reach RUNNING and
/// fail at its first send or receive; now INIT fails, naming the channel and its type.
#[tokio::test]
async fn a_channel_of_the_wrong_direction_fails_the_device_at_init() {
    let ipc = Ipc::new("direction");
    let out = Ipc::new("direction-out");
    let output = format!(
        "name=data-out,type=push,method=bind,address={}",
        out.address()
    );
    let cases = [
        (
            Device::new("sampler", "s").channel("pull", "bind", &ipc.address()),
            "channel \"data\" is a pull socket, which cannot send, and the device sends on it",
        ),
        (
            Device::new("sink", "s").channel("push", "bind", &ipc.address()),
            "channel \"data\" is a push socket, which cannot receive, and the device receives on it",
        ),
        (
            Device::new("processor", "s").args(&[
                "--channel-config",
                &format!(
                    "name=data-in,type=pub,method=bind,address={}",
                    ipc.address()
                ),
                "--channel-config",
                &output,
            ]),
            "channel \"data-in\" is a pub socket, which cannot receive",
        ),
    ];
    assert_each_fails_at_init(cases.into()).await;
}

/// SIGTERM while a device zeroes its segment (FairMQ's `--shm-zero-segment`): the signal was
/// not acted on in INITIALIZING DEVICE, and the zeroing ran on to the last page (23 s for
/// 8 GiB on this project's machine) before the device went down through INITIALIZED. Now it
/// is interrupted there, the zeroing stops within a chunk, and the segment is removed.
#[tokio::test]
async fn a_signal_while_the_segment_is_zeroed_interrupts_the_zeroing() {
    let session = ShmSession::new("zeroing");
    let prefix = ferromq_shm::names::ObjectName::session_prefix(
        ferromq_shm::names::current_uid(),
        &session.0,
    );
    let objects = || -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(&prefix) && name.contains("_seg_"))
            .collect()
    };
    let ipc = Ipc::new("zeroing");
    // 4 GiB: long enough to zero on any machine that the signal comes first (pages are
    // touched only until it does).
    let sink = Device::new("sink", "sink1")
        .args(&["--transport", "shmem", "--session", &session.0])
        .args(&["--shm-segment-size", "4294967296", "--shm-zero-segment"])
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let deadline = tokio::time::Instant::now() + STEP;
    while objects().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no segment of {prefix}"
        );
        tokio::task::yield_now().await;
    }
    signal(&sink, "TERM");
    let finished = finish(sink).await;
    let interrupted = "interrupted in INITIALIZING DEVICE: SIGTERM received";
    assert!(finished.stderr.contains(interrupted), "{}", finished.stderr);
    assert!(
        !finished.stderr.contains("---> INITIALIZED"),
        "{}",
        finished.stderr
    );
    finished.assert_exited(1);
    // Removed by the device itself, not left for the watchdog.
    assert_eq!(objects(), Vec::<String>::new());
}

/// A log file that takes no line (`/dev/full`, a full disk): every line used to add an error of
/// the logging library's own to standard error, and the lines were lost. Now the device says so
/// once and logs to standard error.
#[tokio::test]
async fn a_log_file_that_takes_no_line_is_named_once_and_the_lines_go_to_stderr() {
    let ipc = Ipc::new("log-full");
    // A sink on a push channel fails at INITIALIZING TASK: a short run with a few lines.
    let finished = Device::new("sink", "sink1")
        .args(&["--log-to-file", "/dev/full"])
        .channel("push", "bind", &ipc.address())
        .finish()
        .await;
    finished.assert_exited(1);
    let stderr = &finished.stderr;
    assert_eq!(
        stderr
            .matches("ferromq: cannot write the log to /dev/full: ")
            .count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("Unable to write an event"), "{stderr}");
    assert!(stderr.contains("IDLE ---> INITIALIZING DEVICE"), "{stderr}");
}

/// `shm clean --stale --force` ran as `--stale`, the force taken and ignored (a bad-input
/// sweep): --stale removes only what nobody uses, so the two are refused together.
#[test]
fn shm_clean_refuses_force_with_stale() {
    let (code, _, stderr) = shm(&["clean", "--stale", "--force"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("'--stale' cannot be used with '--force'"),
        "{stderr}"
    );
}
