//! `ferromq device` end to end: real processes, real sockets, real signals.

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::finish;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const STEP: Duration = Duration::from_secs(60);
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A unique ipc address, its socket file removed on drop.
struct Ipc(PathBuf);

impl Ipc {
    fn new(tag: &str) -> Ipc {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Ipc(std::env::temp_dir().join(format!("ferromq-cli-{tag}-{}-{n}.ipc", std::process::id())))
    }

    fn address(&self) -> String {
        format!("ipc://{}", self.0.display())
    }
}

impl Drop for Ipc {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn ferromq(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(args)
        .args(["--color", "false"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ferromq")
}

fn channel(kind: &str, method: &str, address: &str) -> String {
    format!("name=data,type={kind},method={method},address={address},rateLogging=0")
}

#[tokio::test]
async fn sampler_to_sink_static_1000_checksummed() {
    let ipc = Ipc::new("pair");
    let sink = ferromq(&[
        "device",
        "sink",
        "--id",
        "sink1",
        "--control",
        "static",
        "--max-iterations",
        "1000",
        "--verify",
        "--channel-config",
        &channel("pull", "bind", &ipc.address()),
    ]);
    let sampler = ferromq(&[
        "device",
        "sampler",
        "--id",
        "sampler1",
        "--control",
        "static",
        "--max-iterations",
        "1000",
        "--msg-size",
        "4096",
        "--channel-config",
        &channel("push", "connect", &ipc.address()),
    ]);
    let (sink, sampler) = tokio::join!(finish(sink), finish(sampler));
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
        "--control",
        "static",
        "--max-iterations",
        "500",
        "--transport",
        "shmem",
        "--session",
        session.as_str(),
        "--shm-segment-size",
        "67108864",
    ];
    let sink = ferromq(
        &[
            &[
                "device",
                "sink",
                "--id",
                "sink1",
                "--verify",
                "--channel-config",
                &channel("pull", "bind", &ipc.address()),
            ][..],
            &common,
        ]
        .concat(),
    );
    let sampler = ferromq(
        &[
            &[
                "device",
                "sampler",
                "--id",
                "sampler1",
                "--msg-size",
                "100000",
                "--channel-config",
                &channel("push", "connect", &ipc.address()),
            ][..],
            &common,
        ]
        .concat(),
    );
    let (sink, sampler) = tokio::join!(finish(sink), finish(sampler));
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
        list.contains("no ferromq shared memory"),
        "the last device removed the session's memory: {list}"
    );
}

#[tokio::test]
async fn sink_connects_first_and_the_sampler_binds_later() {
    let ipc = Ipc::new("reverse");
    let sink = ferromq(&[
        "device",
        "sink",
        "--id",
        "sink1",
        "--control",
        "static",
        "--max-iterations",
        "1000",
        "--verify",
        "--channel-config",
        &channel("pull", "connect", &ipc.address()),
    ]);
    let mut sink_lines = BufReader::new(sink_stdout_tee(sink)).lines();
    // The sink is waiting in CONNECTING before the sampler exists.
    loop {
        let line = tokio::time::timeout(STEP, sink_lines.next_line())
            .await
            .expect("sink log")
            .expect("read")
            .expect("line");
        if line.contains("BOUND ---> CONNECTING") {
            break;
        }
    }
    let sampler = ferromq(&[
        "device",
        "sampler",
        "--id",
        "sampler1",
        "--control",
        "static",
        "--max-iterations",
        "1000",
        "--channel-config",
        &channel("push", "bind", &ipc.address()),
    ]);
    let sampler = finish(sampler).await;
    assert_eq!(sampler.code, Some(0), "sampler: {}", sampler.stderr);
    let mut summary = None;
    while let Ok(Some(line)) = tokio::time::timeout(STEP, sink_lines.next_line())
        .await
        .expect("sink log")
    {
        if line.contains("sink summary") {
            summary = Some(line);
        }
    }
    let summary = summary.expect("the sink printed a summary");
    assert!(
        summary.contains("received 1001 messages") && summary.contains("1001 checksums ok"),
        "{summary}"
    );
}

/// The sink's stdout as a reader; the child is killed if the reader is dropped early.
fn sink_stdout_tee(mut child: Child) -> impl tokio::io::AsyncRead + Unpin {
    let stdout = child.stdout.take().expect("stdout");
    tokio::spawn(async move {
        let _ = tokio::time::timeout(STEP, child.wait()).await;
    });
    stdout
}

#[tokio::test]
async fn failing_init_task_ends_in_error_with_the_cause_on_stderr() {
    let ipc = Ipc::new("broken");
    let sampler = ferromq(&[
        "device",
        "sampler",
        "--id",
        "broken1",
        "--control",
        "static",
        "--payload-file",
        "/nonexistent/payload",
        "--channel-config",
        &channel("push", "bind", &ipc.address()),
    ]);
    let sampler = finish(sampler).await;
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

#[tokio::test]
async fn sigint_in_running_goes_down_through_every_reset_state_and_exits_0() {
    let ipc = Ipc::new("sigint");
    let mut sink = ferromq(&[
        "device",
        "sink",
        "--id",
        "sink1",
        "--control",
        "static",
        "--channel-config",
        &channel("pull", "bind", &ipc.address()),
    ]);
    let pid = sink.id().expect("pid").to_string();
    let mut lines = BufReader::new(sink.stdout.take().expect("stdout")).lines();
    let mut log = Vec::new();
    loop {
        let line = tokio::time::timeout(STEP, lines.next_line())
            .await
            .expect("log")
            .expect("read")
            .expect("line");
        let running = line.contains("READY ---> RUNNING");
        log.push(line);
        if running {
            break;
        }
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    while let Some(line) = tokio::time::timeout(STEP, lines.next_line())
        .await
        .expect("log")
        .expect("read")
    {
        log.push(line);
    }
    let exit = tokio::time::timeout(STEP, sink.wait())
        .await
        .expect("exit")
        .expect("wait");
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

const MQ_CONFIG: &str = r#"{
    "fairMQOptions": {
        "devices": [
            { "id": "sampler1",
              "channels": [ { "name": "data",
                              "sockets": [ { "type": "push", "method": "bind", "address": "ADDRESS",
                                             "sndBufSize": "1000", "linger": "500", "rateLogging": 0 } ] } ] },
            { "id": "sink1",
              "channels": [ { "name": "data", "type": "pull", "method": "connect",
                              "sockets": [ { "address": "ADDRESS", "rateLogging": "0" } ] } ] }
        ]
    }
}"#;

#[tokio::test]
async fn mq_config_in_fairmqs_format_is_accepted() {
    let ipc = Ipc::new("mqconfig");
    let dir = std::env::temp_dir().join(format!("ferromq-cli-mq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("topology.json");
    std::fs::write(&file, MQ_CONFIG.replace("ADDRESS", &ipc.address())).unwrap();
    let file = file.display().to_string();
    let common = [
        "--control",
        "static",
        "--max-iterations",
        "200",
        "--mq-config",
        file.as_str(),
    ];
    let sink = ferromq(
        &[
            &["device", "sink", "--id", "sink1", "--verify"][..],
            &common,
        ]
        .concat(),
    );
    let sampler = ferromq(&[&["device", "sampler", "--id", "sampler1"][..], &common].concat());
    let (sink, sampler) = tokio::join!(finish(sink), finish(sampler));
    std::fs::remove_dir_all(&dir).unwrap();
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
    let dir = std::env::temp_dir().join(format!("ferromq-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.json");
    std::fs::write(
        &file,
        MQ_CONFIG.replace("\"sndBufSize\": \"1000\"", "\"sndBufSize\": -1"),
    )
    .unwrap();
    let file = file.display().to_string();
    let sampler = finish(ferromq(&[
        "device",
        "sampler",
        "--id",
        "sampler1",
        "--control",
        "static",
        "--mq-config",
        &file,
    ]))
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(sampler.code, Some(2));
    assert!(
        sampler
            .stderr
            .contains("key \"sndBufSize\" has invalid value -1: expected a non-negative integer")
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
    let device = ferromq(&[
        "device",
        "sink",
        "--id",
        "sink1",
        "--control",
        "external",
        "--control-address",
        &control.address(),
        "--channel-config",
        &channel("pull", "bind", &data.address()),
    ]);
    let transport = ferromq_device::transport_by_name("zeromq").unwrap();
    let mut client = ControlClient::connect(transport.as_ref(), &control.address())
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

/// Runs `ferromq ARGS` to the end.
async fn ferromq_finished(args: &[&str]) -> support::Finished {
    finish(ferromq(args)).await
}

/// A unique shm session whose objects are removed when the guard drops, failed test included.
struct ShmSession(String);

impl ShmSession {
    fn new(tag: &str) -> ShmSession {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        ShmSession(format!("cli-{tag}-{}-{n}", std::process::id()))
    }
}

impl Drop for ShmSession {
    fn drop(&mut self) {
        let _ = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
            .args(["shm", "clean", "--session", &self.0, "--force"])
            .output();
    }
}

/// A unique temporary file, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> TempFile {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!("ferromq-cli-{tag}-{}-{n}", std::process::id())))
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn bad_values_are_usage_errors_naming_the_option_and_the_value() {
    let ipc = Ipc::new("bad-values");
    let push = channel("push", "bind", &ipc.address());
    let cases: [(&[&str], &str); 10] = [
        (&["sampler", "--rate", "1e-300"], "--rate 1e-300"),
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
    ];
    for (args, expected) in cases {
        let finished = ferromq_finished(
            &[
                &["device"][..],
                args,
                &[
                    "--id",
                    "bad",
                    "--control",
                    "static",
                    "--channel-config",
                    &push,
                ],
            ]
            .concat(),
        )
        .await;
        assert_eq!(finished.code, Some(2), "{args:?}: {}", finished.stderr);
        assert!(
            finished.stderr.contains(expected),
            "{args:?}: {}",
            finished.stderr
        );
    }
}

#[tokio::test]
async fn an_impossible_message_size_is_an_error_naming_the_size_not_an_abort() {
    let ipc = Ipc::new("huge");
    for kind in ["sampler", "bsampler"] {
        let finished = ferromq_finished(&[
            "device",
            kind,
            "--id",
            "huge",
            "--control",
            "static",
            "--msg-size",
            "100000000000000",
            "--channel-config",
            &channel("push", "bind", &ipc.address()),
        ])
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
        let finished = ferromq_finished(&[
            "device",
            kind,
            "--id",
            "small-segment",
            "--control",
            "static",
            "--transport",
            "shmem",
            "--session",
            &session.0,
            "--shm-segment-size",
            "1048576",
            "--msg-size",
            "8388608",
            "--channel-config",
            &channel("push", "bind", &ipc.address()),
        ])
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
        "--control",
        "static",
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
    let sink = ferromq(
        &[
            &[
                "device",
                "sink",
                "--id",
                "sink1",
                "--in-channel",
                "data",
                "--out-filename",
                &output.path(),
                "--channel-config",
                &channel("pull", "bind", &ipc.address()),
            ][..],
            &common,
        ]
        .concat(),
    );
    let sampler = ferromq(
        &[
            &[
                "device",
                "bsampler",
                "--id",
                "bsampler1",
                "--out-channel",
                "data",
                "--memset",
                "true",
                "--num-parts",
                "2",
                "--msg-size",
                "1000",
                "--msg-rate",
                "0",
                "--channel-config",
                &channel("push", "connect", &ipc.address()),
            ][..],
            &common,
        ]
        .concat(),
    );
    let (sink, sampler) = tokio::join!(finish(sink), finish(sampler));
    assert_eq!(sampler.code, Some(0), "bsampler: {}", sampler.stderr);
    assert_eq!(sink.code, Some(0), "sink: {}", sink.stderr);
    assert!(
        sampler
            .stdout
            .contains("--io-threads, --shm-monitor have no effect"),
        "{}",
        sampler.stdout
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
    let sampler = ferromq(&[
        "device",
        "bsampler",
        "--id",
        "bsampler1",
        "--control",
        "static",
        "--max-iterations",
        "4",
        "--msg-size",
        "100",
        "--channel-config",
        &channel("push", "connect", &address),
    ]);
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
    let sink = ferromq(&[
        "device",
        "sink",
        "--id",
        "sink1",
        "--control",
        "static",
        "--max-iterations",
        "4",
        "--channel-config",
        &channel("pull", "connect", &address),
    ]);
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
            let finished = ferromq_finished(&[
                "device",
                "sink",
                "--id",
                "s",
                option,
                value,
                "--print-channels",
            ])
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
    let finished = ferromq_finished(&[
        "device",
        "sampler",
        "--id",
        "lonely",
        "--control",
        "static",
        "--verbosity",
        "verylow",
        "--severity",
        "state",
    ])
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
    let finished = ferromq_finished(&[
        "device",
        "splitter",
        "--id",
        "s",
        "--out-channel",
        "out",
        "--print-channels",
    ])
    .await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    assert_eq!(finished.stdout, "data-in:1:1\nout:1:2147483647\n");
}

#[tokio::test]
async fn log_to_file_takes_the_log_lines_off_the_console() {
    let log = TempFile::new("log");
    let finished = ferromq_finished(&[
        "device",
        "sampler",
        "--id",
        "lonely",
        "--control",
        "static",
        "--log-to-file",
        &log.path(),
        "--file-severity",
        "debug",
    ])
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
    let sink = ferromq(&[
        "device",
        "sink",
        "--id",
        "sink1",
        "--control",
        "static",
        "--network-interface",
        "lo",
        "--channel-config",
        "name=data,type=pull,method=bind,rateLogging=0",
    ]);
    let mut lines = BufReader::new(sink_stdout_tee(sink)).lines();
    loop {
        let line = tokio::time::timeout(STEP, lines.next_line())
            .await
            .expect("sink log")
            .expect("read")
            .expect("the sink logs the address it bound");
        if line.contains("bound") {
            assert!(line.contains("tcp://127.0.0.1:"), "{line}");
            break;
        }
    }
}

#[tokio::test]
async fn unknown_options_stay_errors_with_a_suggestion() {
    let finished = ferromq_finished(&["device", "sink", "--id", "s", "--io-thread", "2"]).await;
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
        "--control",
        "static",
        "--transport",
        transport,
        "--session",
        session.0.as_str(),
        "--shm-segment-size",
        "16777216",
    ];
    let sink = ferromq(
        &[
            &[
                "device",
                "sink",
                "--id",
                "sink1",
                "--max-iterations",
                "9",
                "--verify",
                "--channel-config",
                &format!(
                    "name=data,type=pull,address=@{},@{},rateLogging=0",
                    first.address(),
                    second.address()
                ),
            ][..],
            &common,
        ]
        .concat(),
    );
    let samplers = [&first, &second].map(|ipc| {
        ferromq(
            &[
                &[
                    "device",
                    "sampler",
                    "--id",
                    "sampler",
                    "--max-iterations",
                    "4",
                    "--channel-config",
                    &format!(
                        "name=data,type=push,address=+{},rateLogging=0",
                        ipc.address()
                    ),
                ][..],
                &common,
            ]
            .concat(),
        )
    });
    let [a, b] = samplers;
    let (sink, a, b) = tokio::join!(finish(sink), finish(a), finish(b));
    assert_eq!(a.code, Some(0), "{transport}: {}", a.stderr);
    assert_eq!(b.code, Some(0), "{transport}: {}", b.stderr);
    assert_eq!(sink.code, Some(0), "{transport}: {}", sink.stderr);
    assert!(
        sink.stdout.contains("received 10 messages") && sink.stdout.contains("10 checksums ok"),
        "{transport}: {}",
        sink.stdout
    );
}
