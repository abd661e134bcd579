//! `cargo xtask launch-scale`: how long `ferromq run --launcher slurm` takes to bring topologies
//! of N trivial devices to RUNNING over two simulated Slurm nodes, and what a device costs in
//! memory.
//!
//! It starts the private two-node cluster of the Slurm tests
//! (`crates/cli/tests/support/slurm-cluster.sh`: munged, slurmctld and two slurmd, n1 and n2, on
//! this host; needs root, slurm-wlm and munge) and stops it at the end, whatever happened. For
//! each N it writes a topology of N/2 independent pairs (a sampler sending one 8-byte message a
//! second to its sink over zeromq tcp), pair *i* on node *i mod 2*, and runs it under
//! `salloc -N 2 ferromq run FILE --launcher slurm --duration 3`, `--rounds` times. Measured per
//! run: the launcher's own figure (`N devices RUNNING X s after the launch began`: from starting
//! the srun step to every device RUNNING, all transitions stepped together), the wall time from
//! `salloc` to that line, and every device's RSS and private memory (anonymous resident pages) while
//! all are RUNNING. The report, `target/launch-scale/report.md`, gives medians and min-max.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::bench::{Spread, median};
use crate::soak::{LauncherGuard, ProcessMemory};

/// How long one run may take beyond its duration before it counts as hung.
const RUN_ALLOWANCE: Duration = Duration::from_secs(300);

/// What to measure.
pub struct Options {
    /// Topology sizes (devices), each even.
    pub devices: Vec<usize>,
    /// Runs per size.
    pub rounds: usize,
}

/// The private cluster, stopped on drop.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    conf: String,
}

impl Cluster {
    fn start(workspace: &Path, dir: PathBuf) -> Result<Cluster, String> {
        let script = workspace.join("crates/cli/tests/support/slurm-cluster.sh");
        let _ = std::fs::remove_dir_all(&dir);
        let output = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .output()
            .map_err(|error| format!("cannot run {}: {error}", script.display()))?;
        let mut cluster = Cluster {
            script,
            dir,
            conf: String::new(),
        };
        if !output.status.success() {
            return Err(format!(
                "the Slurm cluster did not start: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        cluster.conf = String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|line| line.strip_prefix("export SLURM_CONF="))
            .ok_or("slurm-cluster.sh did not name its slurm.conf")?
            .to_owned();
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

/// A topology of `devices` trivial devices: independent sampler -> sink pairs, pair i on node
/// i mod 2.
fn topology(devices: usize) -> String {
    let mut text = String::from("# Written by cargo xtask launch-scale.\ntransport = \"zeromq\"\n");
    for pair in 0..devices / 2 {
        let host = pair % 2;
        let _ = write!(
            text,
            "\n[[device]]\nid = \"sampler-{pair}\"\nkind = \"sampler\"\nhost = {host}\n\
             properties = {{ msg-size = 8, rate = 1 }}\n\n\
             [[device.channel]]\nname = \"data\"\ntype = \"push\"\n\n\
             [[device]]\nid = \"sink-{pair}\"\nkind = \"sink\"\nhost = {host}\n\n\
             [[device.channel]]\nname = \"data\"\ntype = \"pull\"\nconnect = \"sampler-{pair}.data\"\n"
        );
    }
    text
}

/// The launcher's line `N devices RUNNING X s after the launch began`: X.
fn running_after(line: &str) -> Option<f64> {
    let rest = line.strip_prefix("ferromq: ")?;
    let (_, rest) = rest.split_once(" devices RUNNING ")?;
    rest.strip_suffix(" s after the launch began")?.parse().ok()
}

/// Memory of every device process (`ferromq device ... --session SESSION`).
fn session_memory(session: &str) -> Vec<ProcessMemory> {
    // The launcher passes `--session=SESSION` (a value may start with `-`); by hand it is two
    // words.
    let needles = [
        format!("--session={session}\0"),
        format!("--session\0{session}\0"),
    ];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let cmdline = String::from_utf8_lossy(&cmdline);
                needles
                    .iter()
                    .any(|needle| cmdline.contains(needle.as_str()))
                    && cmdline.contains("\0device\0")
            })
        })
        .filter_map(|pid| {
            ProcessMemory::parse(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
        })
        .collect()
}

/// One run's figures.
struct Measured {
    running_after: f64,
    wall_to_running: f64,
    rss: Vec<f64>,
    private: Vec<f64>,
}

/// Waits (at most a minute) until both nodes are idle: a job just ended leaves its nodes
/// COMPLETING for a moment, which would count in the next run's time from `salloc`.
fn wait_idle(conf: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let idle = Command::new("sinfo")
            .args(["--noheader", "--format=%T"])
            .env("SLURM_CONF", conf)
            .output()
            .is_ok_and(|output| {
                let states = String::from_utf8_lossy(&output.stdout).to_string();
                !states.trim().is_empty() && states.lines().all(|state| state.trim() == "idle")
            });
        if idle {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_once(ferromq: &Path, conf: &str, file: &Path, session: &str) -> Result<Measured, String> {
    wait_idle(conf);
    let started = Instant::now();
    let mut guard = LauncherGuard(
        Command::new("salloc")
            .args(["--nodes=2", "--quiet"])
            .arg(ferromq)
            .arg("run")
            .arg(file)
            .args([
                "--launcher",
                "slurm",
                "--duration",
                "3",
                "--session",
                session,
            ])
            .env("SLURM_CONF", conf)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| format!("cannot run salloc: {error}"))?,
    );
    let stdout = guard.0.stdout.take().ok_or("no stdout")?;
    let stderr = guard.0.stderr.take().ok_or("no stderr")?;
    let (lines, received) = mpsc::channel::<String>();
    let out_lines = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = out_lines.send(line);
        }
    });
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    drop(lines);
    let deadline = started + RUN_ALLOWANCE;
    let mut measured = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => {
                if let Some(after) = running_after(&line) {
                    let wall = started.elapsed().as_secs_f64();
                    let memory = session_memory(session);
                    measured = Some(Measured {
                        running_after: after,
                        wall_to_running: wall,
                        rss: memory.iter().map(|m| m.rss as f64).collect(),
                        private: memory.iter().map(|m| m.rss_anon as f64).collect(),
                    });
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "session {session} did not end in {RUN_ALLOWANCE:?}"
                ));
            }
        }
    }
    let status = guard
        .0
        .wait()
        .map_err(|error| format!("wait for salloc: {error}"))?;
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("session {session} ended with {status}:\n{errors}"));
    }
    measured.ok_or_else(|| format!("session {session} never reported its devices RUNNING"))
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn spread(values: &[f64]) -> String {
    let Spread { median, min, max } = Spread::of(values);
    format!("{median:.2} ({min:.2}-{max:.2})")
}

/// Where the topology crate says how many instances a topology may have.
const TOPOLOGY_LIB: &str = "crates/topology/src/lib.rs";

/// `ferromq_topology::MAX_INSTANCES`, read from its source: xtask stays free of the product
/// crates (std, clap and the report's few), and a topology larger than that is refused by
/// `ferromq run` only after the release build and the cluster's start.
fn max_instances(workspace: &Path) -> Result<usize, String> {
    let path = workspace.join(TOPOLOGY_LIB);
    let text = std::fs::read_to_string(&path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("pub const MAX_INSTANCES: usize = "))
        .and_then(|rest| rest.strip_suffix(';')?.replace('_', "").parse().ok())
        .ok_or_else(|| format!("{} defines no MAX_INSTANCES", path.display()))
}

/// Every `--devices` size: even (pairs), at least 2, at most `max_devices` (what a topology may
/// expand to).
fn check_devices(devices: &[usize], max_devices: usize) -> Result<(), String> {
    match devices
        .iter()
        .find(|&&n| n < 2 || n % 2 == 1 || n > max_devices)
    {
        Some(bad) => Err(format!(
            "--devices {bad}: expected an even number from 2 to {max_devices} (the most \
             instances a topology may have)"
        )),
        None => Ok(()),
    }
}

/// Runs every size and writes the report; false when a run failed.
pub fn run(cargo: &str, workspace: &Path, options: &Options) -> bool {
    let checked = max_instances(workspace)
        .and_then(|max_devices| check_devices(&options.devices, max_devices));
    if let Err(error) = checked {
        eprintln!("xtask launch-scale: {error}");
        return false;
    }
    let Some(ferromq) = crate::build_release_ferromq(cargo, workspace, &[]) else {
        return false;
    };
    let out_dir = workspace.join("target/launch-scale");
    if let Err(error) = std::fs::create_dir_all(&out_dir) {
        eprintln!(
            "xtask launch-scale: cannot create {}: {error}",
            out_dir.display()
        );
        return false;
    }
    let cluster = match Cluster::start(workspace, out_dir.join("cluster")) {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("xtask launch-scale: {error}");
            return false;
        }
    };
    let mut report = format!(
        "# Launch time over two simulated Slurm nodes\n\n{} on {}, `cargo xtask launch-scale`; \
         {} run(s) per size, medians (min-max). *RUNNING after*: the launcher's figure, from the \
         srun step's start to every device RUNNING; *from salloc*: the wall time from `salloc` to \
         that line; memory per device while all run (private: its anonymous resident pages, `RssAnon`, which no other process shares).\n\n\
         | devices | RUNNING after (s) | from salloc (s) | RSS per device (MiB) | private per device (MiB) | private, all devices (MiB) |\n\
         |---|---|---|---|---|---|\n",
        crate::bench::utc_now("%Y-%m-%d"),
        crate::bench::machine(),
        options.rounds
    );
    let mut all_passed = true;
    for &devices in &options.devices {
        let file = out_dir.join(format!("trivial-{devices}.toml"));
        if let Err(error) = std::fs::write(&file, topology(devices)) {
            eprintln!(
                "xtask launch-scale: cannot write {}: {error}",
                file.display()
            );
            return false;
        }
        let mut runs = Vec::new();
        for round in 0..options.rounds {
            let session = format!("scale-{devices}-{round}");
            eprintln!("xtask launch-scale: {devices} devices, round {}", round + 1);
            match run_once(&ferromq, &cluster.conf, &file, &session) {
                Ok(measured) => {
                    eprintln!(
                        "xtask launch-scale: {devices} devices RUNNING after {:.2} s ({} processes seen)",
                        measured.running_after,
                        measured.rss.len()
                    );
                    runs.push(measured);
                }
                Err(error) => {
                    eprintln!("xtask launch-scale: {error}");
                    all_passed = false;
                }
            }
        }
        if runs.is_empty() {
            let _ = writeln!(report, "| {devices} | failed | | | | |");
            continue;
        }
        let of = |pick: fn(&Measured) -> f64| runs.iter().map(pick).collect::<Vec<_>>();
        let per_device = |pick: fn(&Measured) -> &Vec<f64>| {
            runs.iter()
                .map(|run| mib(median(pick(run))))
                .collect::<Vec<_>>()
        };
        let totals: Vec<f64> = runs
            .iter()
            .map(|run| mib(run.private.iter().sum()))
            .collect();
        let _ = writeln!(
            report,
            "| {devices} | {} | {} | {} | {} | {} |",
            spread(&of(|run| run.running_after)),
            spread(&of(|run| run.wall_to_running)),
            spread(&per_device(|run| &run.rss)),
            spread(&per_device(|run| &run.private)),
            spread(&totals),
        );
    }
    drop(cluster);
    let path = out_dir.join("report.md");
    println!("{report}");
    if let Err(error) = std::fs::write(&path, &report) {
        eprintln!(
            "xtask launch-scale: cannot write {}: {error}",
            path.display()
        );
        return false;
    }
    println!(
        "xtask launch-scale: {} (report in {})",
        if all_passed { "done" } else { "FAILED" },
        path.display()
    );
    all_passed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by a bad-input sweep: `--devices` had no upper bound, so a topology no launcher
    /// takes went on to a release build and a cluster start.
    #[test]
    fn device_counts_are_even_and_within_a_topologys_instances() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace");
        let max_devices = max_instances(workspace).expect("the topology crate's MAX_INSTANCES");
        assert!(max_devices >= 1000, "{max_devices}");
        assert_eq!(
            check_devices(&[10, 100, 500, 1000, max_devices], max_devices),
            Ok(())
        );
        for bad in [0, 1, 3, max_devices + 2, usize::MAX - 1] {
            let error = check_devices(&[10, bad], max_devices).expect_err("refused");
            assert_eq!(
                error,
                format!(
                    "--devices {bad}: expected an even number from 2 to {max_devices} (the most \
                     instances a topology may have)"
                )
            );
        }
    }

    #[test]
    fn the_launchers_running_line_is_read() {
        assert_eq!(
            running_after("ferromq: 500 devices RUNNING 1.25 s after the launch began"),
            Some(1.25)
        );
        assert_eq!(running_after("n1: [sink-0] RUNNING"), None);
    }

    #[test]
    fn the_trivial_topology_pairs_devices_on_alternate_nodes() {
        let text = topology(4);
        assert_eq!(text.matches("[[device]]").count(), 4);
        assert!(text.contains("id = \"sink-1\"\nkind = \"sink\"\nhost = 1\n"));
        assert!(text.contains("connect = \"sampler-1.data\""));
    }
}
