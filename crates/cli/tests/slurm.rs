//! `ferromq run --launcher slurm` inside a real Slurm allocation: a private cluster of two
//! simulated nodes on this host (`support/slurm-cluster.sh`: munged, slurmctld and two slurmd,
//! n1 and n2, all under a temporary directory and stopped on drop, whatever happened).
//! Needs root, slurm-wlm and munge (`.ci/run` installs them); the last test, of `ferromq
//! slurm-task` alone, none of them.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::{bundled, finish, wait_for_line};
use tokio::io::AsyncBufReadExt;

/// The private cluster; stopped on drop.
struct SlurmCluster {
    dir: PathBuf,
    conf: String,
}

fn script() -> String {
    format!(
        "{}/tests/support/slurm-cluster.sh",
        env!("CARGO_MANIFEST_DIR")
    )
}

impl SlurmCluster {
    fn start(tag: &str) -> SlurmCluster {
        for program in ["slurmctld", "slurmd", "munged", "salloc"] {
            assert!(
                std::process::Command::new("sh")
                    .args(["-c", &format!("command -v {program}")])
                    .output()
                    .is_ok_and(|output| output.status.success()),
                "{program} is missing: apt-get install slurm-wlm munge"
            );
        }
        let dir = std::env::temp_dir().join(format!("ferromq-slurm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let output = std::process::Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .output()
            .expect("run slurm-cluster.sh");
        let mut cluster = SlurmCluster {
            dir,
            conf: String::new(),
        };
        assert!(
            output.status.success(),
            "the Slurm cluster did not start: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        cluster.conf = stdout
            .lines()
            .find_map(|line| line.strip_prefix("export SLURM_CONF="))
            .expect("slurm-cluster.sh names its slurm.conf")
            .to_owned();
        cluster
    }

    /// `salloc -N 2 ferromq ARGS` against this cluster.
    fn salloc(&self, args: &[&str]) -> tokio::process::Child {
        let mut salloc = tokio::process::Command::new("salloc");
        salloc
            .args(["--nodes=2", "--quiet", env!("CARGO_BIN_EXE_ferromq")])
            .args(args)
            .env("SLURM_CONF", &self.conf);
        support::spawn_piped(salloc)
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Processes of session `session` (devices carry `--session SESSION`).
fn devices_of(session: &str) -> Vec<u32> {
    support::processes_of_session(session)
        .into_iter()
        .map(|pid| pid as u32)
        .collect()
}

fn device_pid(session: &str, id: &str) -> Option<u32> {
    // The launcher passes `--id=ID`; by hand it is two words.
    let needles = [format!("\0--id={id}\0"), format!("--id\0{id}\0")];
    devices_of(session).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            let cmdline = String::from_utf8_lossy(&cmdline);
            needles
                .iter()
                .any(|needle| cmdline.contains(needle.as_str()))
        })
    })
}

async fn nothing_left_of(session: &str, limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    // Tasks of another process tree: look every 100 ms.
    let mut look = tokio::time::interval(Duration::from_millis(100));
    loop {
        look.tick().await;
        let left = devices_of(session);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_building_topology_runs_as_slurm_tasks_on_two_nodes_and_a_killed_task_stops_it() {
    let cluster = SlurmCluster::start("run");
    let file = bundled("multi-host.toml");
    let session = format!("slurm-ok-{}", std::process::id());

    // 1. A clean run: host 0 is n1, host 1 is n2; the table and the logs name each node.
    let run = finish(cluster.salloc(&[
        "run",
        &file,
        "--launcher",
        "slurm",
        "--duration",
        "3",
        "--session",
        &session,
    ]))
    .await;
    run.assert_exited_0();
    assert!(
        run.stdout.contains("7 processes on n1, n2"),
        "{}",
        run.stdout
    );
    for (node, device) in [
        ("n1", "source-0"),
        ("n1", "source-1"),
        ("n1", "sampler"),
        ("n1", "processor"),
        ("n2", "builder-0"),
        ("n2", "builder-1"),
        ("n2", "sink"),
    ] {
        let row = run.stdout.lines().any(|line| {
            let mut words = line.split_whitespace();
            words.next() == Some(node) && words.next() == Some(device)
        });
        assert!(row, "no table row of {device} on {node}:\n{}", run.stdout);
    }
    let sent = support::sampler_total(&run.stdout, "n1: ");
    let summary = support::sink_summary(&run.stdout, "n2: ");
    assert!(
        sent > 0 && summary.contains(&format!("received {sent} messages, ")),
        "sent {sent}: {summary}"
    );
    assert!(
        nothing_left_of(&session, Duration::from_secs(5))
            .await
            .is_empty()
    );

    // 2. A task killed with SIGKILL stops the topology, non-zero, naming it and its node.
    let session = format!("slurm-kill-{}", std::process::id());
    let mut child = cluster.salloc(&["run", &file, "--launcher", "slurm", "--session", &session]);
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "[sink] READY ---> RUNNING", &mut seen).await;
    let builder = device_pid(&session, "builder-0").expect("builder-0 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(builder as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill builder-0");
    let ended = support::finish_rest(child, lines).await;
    assert_eq!(ended.code, Some(1), "{}\n{}", ended.stdout, ended.stderr);
    assert!(
        ended
            .stderr
            .contains("device \"builder-0\" on n2 exited (signal: 9 (SIGKILL))"),
        "{}",
        ended.stderr
    );
    let left = nothing_left_of(&session, Duration::from_secs(10)).await;
    assert!(left.is_empty(), "still running: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_batch_script_runs_the_topology_under_sbatch() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args([
            "run",
            &bundled("multi-host.toml"),
            "--launcher",
            "slurm",
            "--print-batch",
        ])
        .output()
        .await
        .expect("run ferromq");
    assert!(output.status.success());
    let script = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(script.starts_with("#!/bin/bash\n"), "{script}");
    assert!(script.contains("#SBATCH --nodes=2\n"), "{script}");
    assert!(script.contains("#SBATCH --ntasks=7\n"), "{script}");
    assert!(script.contains("--launcher slurm\n"), "{script}");

    let cluster = SlurmCluster::start("batch");
    // The script runs until stopped: a duration makes it end by itself.
    let script = script.replace("--launcher slurm\n", "--launcher slurm --duration 2\n");
    let path = cluster.dir.join("multi-host.sbatch");
    std::fs::write(&path, &script).expect("write the script");
    let log = cluster.dir.join("job.out");
    let submitted = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("sbatch")
            .arg("--wait")
            .arg(format!("--output={}", log.display()))
            .arg(&path)
            .env("SLURM_CONF", &cluster.conf)
            .output(),
    )
    .await
    .expect("the batch job did not end in time")
    .expect("run sbatch");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        submitted.status.success(),
        "{}\n{log}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    assert!(log.contains("n2: [sink] sink summary"), "{log}");
}

/// Kills a process on drop (a test's child that outlived a failed assertion).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// A SIGTERM that reaches `ferromq slurm-task` itself (Slurm signals the task's whole process
/// group) is the device's to handle: the task stays, and reports the device's exit when it
/// comes. With libfabric linked (`--features ofi`) a library's load-time handler used to get the
/// signal through the task's own and end it, losing the device's exit. No cluster needed: the
/// launcher's command exchange is served here.
#[test]
fn a_slurm_task_survives_sigterm_and_reports_its_devices_exit() {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("an address").port();
    let launcher = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("the task's request");
        let mut request = String::new();
        BufReader::new(&stream)
            .read_line(&mut request)
            .expect("a request line");
        let device = r#"trap "exit 7" TERM; echo ready $$; while :; do sleep 0.05; done"#;
        let command = serde_json::json!({"program": "sh", "args": ["-c", device], "env": []});
        writeln!(&stream, "{command}").expect("the answer");
        request
    });
    let mut task = std::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .arg("slurm-task")
        .env("SLURM_PROCID", "0")
        .env("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
        .env("FERROMQ_SLURM_COMMANDS", format!("{port} secret"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("ferromq slurm-task starts");
    let _task_guard = KillOnDrop(task.id() as i32);
    assert_eq!(launcher.join().expect("the launcher").trim(), "secret 0");
    let mut lines = BufReader::new(task.stdout.take().expect("stdout")).lines();
    let ready = lines.next().expect("a first line").expect("text");
    let device: i32 = ready
        .strip_prefix("ready ")
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("the device's first line, got {ready:?}"));
    let _device_guard = KillOnDrop(device);
    let signal = |pid: i32| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("kill")
    };
    signal(task.id() as i32);
    signal(device);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = task.wait().expect("the task's exit");
    assert_eq!(
        (status.code(), rest.last().map(String::as_str)),
        (Some(7), Some("ferromq-task-exit: code 7")),
        "the task after SIGTERM: {status:?}, its lines after the device's first: {rest:?}"
    );
}
