//! `ferromq run --launcher ssh`: a topology over two simulated hosts (network namespaces made by
//! the test, each with its own sshd), and what happens when a host is lost or the launcher dies.
//! Traffic goes only to addresses inside the namespaces the test made.

mod support;

use std::time::{Duration, Instant};

use support::hosts::NamespaceHosts;
use support::{bundled, finish, signal, wait_for_line};
use tokio::io::AsyncBufReadExt;

fn run_over(hosts: &NamespaceHosts, file: &str, extra: &[&str]) -> tokio::process::Child {
    let host_list = hosts.destinations.join(",");
    let mut args = vec!["run", file, "--launcher", "ssh", "--hosts", &host_list];
    args.extend_from_slice(extra);
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferromq"));
    command
        .args(&args)
        .env("FERROMQ_SSH_COMMAND", hosts.ssh_command());
    support::spawn_piped(command)
}

/// Waits until no ferromq process runs on any host, at most `limit`.
async fn nothing_left_on(hosts: &NamespaceHosts, limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    // Processes on other "hosts" are nobody's children here: look at them every 100 ms.
    let mut look = tokio::time::interval(Duration::from_millis(100));
    loop {
        look.tick().await;
        let left: Vec<u32> = (0..hosts.namespaces.len())
            .flat_map(|idx| hosts.ferromq_processes(idx))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_building_topology_runs_over_two_ssh_hosts_and_a_lost_host_stops_it() {
    let hosts = NamespaceHosts::new(2);
    let file = bundled("multi-host.toml");

    // 1. A clean run: every device on its host, data across and within hosts, nothing lost.
    let run = finish(run_over(&hosts, &file, &["--duration", "3"])).await;
    run.assert_exited_0();
    let (host_a, host_b) = (&hosts.destinations[0], &hosts.destinations[1]);
    assert!(
        run.stdout
            .contains(&format!("7 processes on {host_a}, {host_b}")),
        "{}",
        run.stdout
    );
    for device in ["source-0", "source-1", "sampler", "processor"] {
        let row = format!("{host_a} {device}");
        assert!(
            run.stdout.contains(&row),
            "no table row {row:?}:\n{}",
            run.stdout
        );
    }
    for device in ["builder-0", "builder-1", "sink"] {
        let row = format!("{host_b} {device}");
        assert!(
            run.stdout.contains(&row),
            "no table row {row:?}:\n{}",
            run.stdout
        );
    }
    // Logs from every host reach the launcher, prefixed with host and device.
    let sink_summary = support::sink_summary(&run.stdout, &format!("{host_b}: "));
    let sent = support::sampler_total(&run.stdout, &format!("{host_a}: "));
    assert!(sent > 0);
    assert!(
        sink_summary.contains(&format!("received {sent} messages"))
            && sink_summary.contains(&format!("{sent} checksums ok")),
        "the sink did not get all {sent}: {sink_summary}"
    );
    assert!(
        run.stdout.contains("arrived in shared memory"),
        "{}",
        run.stdout
    );
    assert!(
        nothing_left_on(&hosts, Duration::from_secs(5))
            .await
            .is_empty()
    );

    // 2. Host b is cut off mid-run: the topology stops, naming the host and its devices.
    let mut child = run_over(&hosts, &file, &[]);
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "[sink] READY ---> RUNNING", &mut seen).await;
    hosts.cut_off(1);
    let cut_at = Instant::now();
    let ended = support::finish_rest(child, lines).await;
    assert_eq!(ended.code, Some(1), "{}", ended.stderr);
    assert!(
        ended
            .stderr
            .contains(&format!("host \"{host_b}\" is unreachable or was lost"))
            && ended
                .stderr
                .contains("devices on it: \"builder-0\", \"builder-1\", \"sink\""),
        "{}",
        ended.stderr
    );
    assert!(
        cut_at.elapsed() < Duration::from_secs(30),
        "the lost host took {:?} to stop the topology:\n{}\n{}",
        cut_at.elapsed(),
        ended.stdout,
        ended.stderr
    );
    // Devices on the lost host hear no heartbeat and go down by themselves; those on host a
    // were stopped.
    let left = nothing_left_on(&hosts, Duration::from_secs(15)).await;
    let left: Vec<String> = left
        .iter()
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            format!(
                "{pid}: {}",
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            )
        })
        .collect();
    assert!(
        left.is_empty(),
        "still running: {left:#?}\n{}",
        ended.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_on_other_hosts_go_down_when_their_launcher_is_killed() {
    let hosts = NamespaceHosts::new(2);
    let mut child = run_over(&hosts, &bundled("multi-host.toml"), &[]);
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "[sink] READY ---> RUNNING", &mut seen).await;
    assert!(!hosts.ferromq_processes(0).is_empty() && !hosts.ferromq_processes(1).is_empty());
    signal(&child, "KILL");
    let _ = child.wait().await;
    // No shared parent process across hosts: the heartbeat's silence (5 s) takes them down.
    let left = nothing_left_on(&hosts, Duration::from_secs(20)).await;
    assert!(
        left.is_empty(),
        "still running 20 s after the launcher died: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_devices_on_every_host_and_leaves_no_shared_memory() {
    let hosts = NamespaceHosts::new(2);
    let session = format!("mh-int-{}", std::process::id());
    let mut child = run_over(
        &hosts,
        &bundled("multi-host.toml"),
        &["--session", &session],
    );
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    wait_for_line(&mut lines, "[sink] READY ---> RUNNING", &mut seen).await;
    // The shmem channel between sampler and processor on host a holds memory by now.
    assert!(support::shm_objects_of(&session) > 0);
    signal(&child, "INT");
    let ended = support::finish_rest(child, lines).await;
    ended.assert_exited_0();
    for device in ["sink", "builder-0", "builder-1", "processor"] {
        assert!(
            ended
                .stdout
                .contains(&format!("[{device}] IDLE ---> EXITING")),
            "{device} did not go down cleanly:\n{}",
            ended.stdout
        );
    }
    let left = nothing_left_on(&hosts, Duration::from_secs(5)).await;
    assert!(left.is_empty(), "still running: {left:?}");
    assert_eq!(support::shm_objects_of(&session), 0, "shared memory left");
}

/// A topology file (in a new temporary directory, returned too) of a sampler on host 0 sending
/// over `transport` to a sink on host 1, each with the properties given (`key = value, ...`).
fn sampler_on_0_sink_on_1(
    tag: &str,
    transport: &str,
    sampler_properties: &str,
    sink_properties: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("ferromq-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pair.toml");
    std::fs::write(
        &file,
        format!(
            "transport = \"{transport}\"\n\
             [[device]]\nid = \"sampler\"\nkind = \"sampler\"\nhost = 0\n\
             properties = {{ {sampler_properties} }}\n\
             [[device.channel]]\nname = \"data\"\ntype = \"push\"\n\
             [[device]]\nid = \"sink\"\nkind = \"sink\"\nhost = 1\n\
             properties = {{ {sink_properties} }}\n\
             [[device.channel]]\nname = \"data\"\ntype = \"pull\"\nconnect = \"sampler.data\"\n"
        ),
    )
    .unwrap();
    (dir, file)
}

#[tokio::test]
async fn shmem_between_devices_on_different_hosts_is_refused_naming_both() {
    let (dir, file) = sampler_on_0_sink_on_1("placement", "shmem", "", "");
    let file = file.display().to_string();
    // Refused before anything starts, so the hosts need not exist.
    let over_ssh = |hosts: &str| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferromq"));
        command.args(["run", &file, "--launcher", "ssh", "--hosts", hosts]);
        finish(support::spawn_piped(command))
    };
    let ended = over_ssh("a.invalid,b.invalid").await;
    assert_eq!(ended.code, Some(2), "{}{}", ended.stdout, ended.stderr);
    assert!(
        ended.stderr.contains(
            "device \"sink\" (on b.invalid) and device \"sampler\" (on a.invalid) are joined by \
             channel \"data\" -> sampler.data over shmem, which reaches only one host"
        ),
        "{}",
        ended.stderr
    );
    // An index beyond --hosts names the device and the list.
    let ended = over_ssh("a.invalid").await;
    assert_eq!(ended.code, Some(2));
    assert!(
        ended.stderr.contains(
            "device \"sink\" is placed on host 1, but --hosts names 1 host(s): a.invalid"
        ),
        "{}",
        ended.stderr
    );
    // Slurm outside an allocation says what is missing.
    let ended = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["run", &file, "--launcher", "slurm"])
        .env_remove("SLURM_JOB_ID")
        .output()
        .await
        .unwrap();
    assert_eq!(ended.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&ended.stderr).contains("SLURM_JOB_ID is not set"),
        "{}",
        String::from_utf8_lossy(&ended.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ofi transport (libfabric's tcp provider) between devices on two hosts: each binder binds
/// on its host's address, nothing is lost.
#[cfg(feature = "ofi")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ofi_channel_carries_messages_between_two_hosts() {
    let hosts = NamespaceHosts::new(2);
    let (dir, file) = sampler_on_0_sink_on_1(
        "ofi-hosts",
        "ofi",
        "msg-size = 65536, rate = 500",
        "verify = true",
    );
    let run = finish(run_over(
        &hosts,
        &file.display().to_string(),
        &["--duration", "2"],
    ))
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    run.assert_exited_0();
    let (host_a, host_b) = (&hosts.destinations[0], &hosts.destinations[1]);
    let sent = support::sampler_total(&run.stdout, &format!("{host_a}: "));
    let summary = support::sink_summary(&run.stdout, &format!("{host_b}: "));
    assert!(
        sent > 0 && summary.contains(&format!("received {sent} messages")),
        "sent {sent}: {summary}"
    );
    // The binder bound on its own host's address, over libfabric.
    let address_a = host_a.rsplit('@').next().unwrap_or(host_a);
    let bound = format!("[sampler] bound channel=data address=tcp://{address_a}:");
    assert!(run.stdout.contains(&bound), "no {bound:?}:\n{}", run.stdout);
}
