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
            .contains("received 1000 messages, 4096000 bytes")
            && sink.stdout.contains("1000 checksums ok"),
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
        sink.stdout.contains("received 500 messages") && sink.stdout.contains("500 checksums ok"),
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
        summary.contains("received 1000 messages") && summary.contains("1000 checksums ok"),
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
        sink.stdout.contains("received 200 messages"),
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
        MQ_CONFIG.replace("\"sndBufSize\"", "\"sndBuffSize\""),
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
        sampler.stderr.contains("sndBuffSize")
            && sampler.stderr.contains("line 7 column 58")
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
