//! Helpers shared by the CLI's end-to-end tests.

use std::time::Duration;

#[allow(dead_code)] // Only the multi-host tests use it.
pub mod hosts;

use tokio::io::AsyncReadExt;
use tokio::process::Child;

const FINISH_TIMEOUT: Duration = Duration::from_secs(90);

/// How a process ended and what it printed.
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Panics, with everything the process printed, unless it exited 0.
    #[allow(dead_code)]
    pub fn assert_exited_0(&self) {
        self.assert_exited(0);
    }

    /// Panics, with everything the process printed, unless it exited with `code`.
    #[allow(dead_code)]
    pub fn assert_exited(&self, code: i32) {
        assert_eq!(self.code, Some(code), "{}{}", self.stdout, self.stderr);
    }
}

/// Reads everything a child prints and waits for it, within a bound.
pub async fn finish(mut child: Child) -> Finished {
    let mut stdout = String::new();
    let mut stderr = String::new();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let status = tokio::time::timeout(FINISH_TIMEOUT, async {
        let (_, _, status) = tokio::join!(
            out.read_to_string(&mut stdout),
            err.read_to_string(&mut stderr),
            child.wait()
        );
        status
    })
    .await
    .expect("the process did not exit in time")
    .expect("wait for the process");
    Finished {
        code: status.code(),
        stdout,
        stderr,
    }
}

#[allow(dead_code)]
/// Reads what is left of a child whose stdout lines were partly read already.
pub async fn finish_rest(
    mut child: tokio::process::Child,
    mut lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> Finished {
    let mut stdout = String::new();
    let mut stderr = String::new();
    let mut err = child.stderr.take().expect("stderr");
    let read_out = async {
        while let Ok(Some(line)) = lines.next_line().await {
            stdout.push_str(&line);
            stdout.push('\n');
        }
    };
    let status = tokio::time::timeout(FINISH_TIMEOUT, async {
        let (_, _, status) = tokio::join!(
            read_out,
            tokio::io::AsyncReadExt::read_to_string(&mut err, &mut stderr),
            child.wait()
        );
        status
    })
    .await
    .expect("the launcher did not exit in time")
    .expect("wait for the launcher");
    Finished {
        code: status.code(),
        stdout,
        stderr,
    }
}

/// The path of a bundled topology (`topologies/NAME`).
#[allow(dead_code)]
pub fn bundled(name: &str) -> String {
    format!("{}/../../topologies/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Spawns `command` with stdin closed and stdout and stderr piped, killed when dropped.
#[allow(dead_code)]
pub fn spawn_piped(mut command: tokio::process::Command) -> Child {
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the command")
}

/// The processes whose command line names `--session SESSION` (a launcher's devices).
#[allow(dead_code)]
pub fn processes_of_session(session: &str) -> Vec<i32> {
    // The launcher passes `--session=SESSION`; by hand it is two words.
    let needles = [
        format!("\0--session={session}\0"),
        format!("\0--session\0{session}\0"),
    ];
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let cmdline = String::from_utf8_lossy(&cmdline);
                needles
                    .iter()
                    .any(|needle| cmdline.contains(needle.as_str()))
            })
        })
        .collect()
}

/// How many shared memory objects in /dev/shm name `session`.
#[allow(dead_code)]
pub fn shm_objects_of(session: &str) -> usize {
    std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().contains(session))
                .count()
        })
        .unwrap_or(0)
}

/// The sampler's total (`[sampler] sent N messages`) on a line that starts with `prefix`
/// (`"HOST: "` for a device on another host).
#[allow(dead_code)]
pub fn sampler_total(stdout: &str, prefix: &str) -> u64 {
    stdout
        .lines()
        .find_map(|line| {
            line.strip_prefix(prefix)?
                .split_once("[sampler] sent ")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sampler total after {prefix:?}:\n{stdout}"))
}

/// The sink's summary line, printed after `prefix` (`"HOST: "` for a device on another host).
#[allow(dead_code)]
pub fn sink_summary<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    let start = format!("{prefix}[sink] sink summary");
    stdout
        .lines()
        .find(|line| line.starts_with(&start))
        .unwrap_or_else(|| panic!("no sink summary after {prefix:?}:\n{stdout}"))
}

/// A unique ipc address, its socket file removed on drop.
#[allow(dead_code)] // Not every test binary that includes this module uses every helper.
pub struct Ipc(std::path::PathBuf);

#[allow(dead_code)]
impl Ipc {
    pub fn new(tag: &str) -> Ipc {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ipc(std::env::temp_dir().join(format!("ferromq-t-{tag}-{}-{n}.ipc", std::process::id())))
    }

    pub fn address(&self) -> String {
        format!("ipc://{}", self.0.display())
    }
}

impl Drop for Ipc {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `ferromq ARGS --color false` (a device's option), output piped, killed when dropped.
#[allow(dead_code)]
pub fn ferromq(args: &[&str]) -> Child {
    let mut with_color: Vec<&str> = args.to_vec();
    with_color.extend(["--color", "false"]);
    ferromq_as_is(&with_color)
}

/// `ferromq ARGS` (for the commands without `--color`: run, top), output piped, killed when
/// dropped.
#[allow(dead_code)]
pub fn ferromq_as_is(args: &[&str]) -> Child {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferromq"));
    command.args(args);
    spawn_piped(command)
}

/// Sends `signal` (`INT`, `TERM`, `STOP`, `CONT`, `KILL`) to `child`.
#[allow(dead_code)]
pub fn signal(child: &Child, signal: &str) {
    let pid = child.id().expect("the child is running").to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Reads `child`'s stdout until a line contains `needle` (within a bound), keeping every line
/// read; the rest of stdout stays readable through the returned reader.
#[allow(dead_code)]
pub async fn wait_for_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    needle: &str,
    seen: &mut Vec<String>,
) {
    tokio::time::timeout(FINISH_TIMEOUT, async {
        loop {
            match lines.next_line().await.expect("read stdout") {
                Some(line) => {
                    let found = line.contains(needle);
                    seen.push(line);
                    if found {
                        return;
                    }
                }
                None => panic!("stdout ended before {needle:?}: {seen:#?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no line with {needle:?} in time: {seen:#?}"));
}

/// Reads the rest of `child`'s stdout to its end (within a bound), keeping every line read.
#[allow(dead_code)]
pub async fn wait_for_end(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    seen: &mut Vec<String>,
) {
    tokio::time::timeout(FINISH_TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            seen.push(line);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("stdout did not end in time: {seen:#?}"));
}

/// `ferromq device KIND --id ID` and its options, built up option by option, then spawned (see
/// [`ferromq`]) or run to the end.
#[allow(dead_code)]
pub struct Device {
    args: Vec<String>,
}

#[allow(dead_code)]
impl Device {
    /// `ferromq device KIND --id ID --control static`: a device that goes through its states on
    /// its own, as most tests want.
    pub fn new(kind: &str, id: &str) -> Device {
        Device::plain(kind, id).args(&["--control", "static"])
    }

    /// `ferromq device KIND --id ID` and nothing else (for `--control external`, or options that
    /// end the device before any control).
    pub fn plain(kind: &str, id: &str) -> Device {
        Device {
            args: ["device", kind, "--id", id].map(str::to_owned).to_vec(),
        }
    }

    /// More options.
    pub fn args(mut self, args: &[&str]) -> Device {
        self.args.extend(args.iter().map(|&arg| arg.to_owned()));
        self
    }

    /// `--channel-config` for channel `data` of `kind` (`push`, `pull`, ...) that does `method`
    /// (`bind`, `connect`) at `address`, without rate logging.
    pub fn channel(self, kind: &str, method: &str, address: &str) -> Device {
        self.args(&[
            "--channel-config",
            &format!("name=data,type={kind},method={method},address={address},rateLogging=0"),
        ])
    }

    /// Starts the device.
    pub fn spawn(&self) -> Child {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        ferromq(&args)
    }

    /// Runs the device to its end.
    pub async fn finish(&self) -> Finished {
        finish(self.spawn()).await
    }
}

/// `ferromq top ARGS` run to its end.
#[allow(dead_code)]
pub async fn top(args: &[&str]) -> Finished {
    let mut with_top = vec!["top"];
    with_top.extend(args);
    finish(ferromq_as_is(&with_top)).await
}

#[allow(dead_code)]
/// Runs `top SESSION --json` every 200 ms until `done` accepts what it printed (for 60 s at
/// most); that JSON.
pub async fn top_json_until(
    session: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut look = tokio::time::interval(Duration::from_millis(200));
    let mut last = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        look.tick().await;
        let seen = top(&[session, "--json", "--interval", "0.2"]).await;
        if seen.code == Some(0) {
            let value: serde_json::Value =
                serde_json::from_str(&seen.stdout).expect("top --json prints JSON");
            if done(&value) {
                return value;
            }
        }
        last = format!("{}{}", seen.stdout, seen.stderr);
    }
    panic!("top never showed what was awaited; last:\n{last}");
}

#[allow(dead_code)]
/// The ids of the devices in a `--json` snapshot that are in `state`.
pub fn ids_in_state(snapshot: &serde_json::Value, state: &str) -> Vec<String> {
    let mut ids: Vec<String> = snapshot["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter(|device| device["state"] == state)
        .map(|device| device["id"].as_str().expect("id").to_owned())
        .collect();
    ids.sort();
    ids
}

/// A unique temporary file (its name ends in `tag`), removed on drop, also when a test fails.
#[allow(dead_code)]
pub struct TempFile(pub std::path::PathBuf);

#[allow(dead_code)]
impl TempFile {
    pub fn new(tag: &str) -> TempFile {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!("ferromq-cli-{}-{n}-{tag}", std::process::id())))
    }

    /// A unique temporary file holding `text`.
    pub fn holding(tag: &str, text: &str) -> TempFile {
        let file = TempFile::new(tag);
        std::fs::write(&file.0, text).unwrap();
        file
    }

    pub fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A unique shm session whose objects are removed when the guard drops, failed test included.
#[allow(dead_code)]
pub struct ShmSession(pub String);

#[allow(dead_code)]
impl ShmSession {
    pub fn new(tag: &str) -> ShmSession {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// Runs each device of `cases` and checks that it failed (exit 1) at INIT, before RUNNING,
/// saying the case's text.
#[allow(dead_code)]
pub async fn assert_each_fails_at_init(cases: Vec<(Device, &str)>) {
    for (device, expected) in cases {
        let failed = tokio::time::timeout(std::time::Duration::from_secs(30), device.finish())
            .await
            .unwrap_or_else(|_| panic!("{expected}: the device never ended"));
        assert_eq!(failed.code, Some(1), "{expected}: {}", failed.stderr);
        assert!(
            failed.stderr.contains(expected),
            "{expected}: {}",
            failed.stderr
        );
        assert!(
            !failed.stdout.contains("---> RUNNING"),
            "{expected}: reached RUNNING: {}",
            failed.stdout
        );
    }
}
