//! A device's process, wherever it runs: started here, through `ssh` on another host, or as a
//! task of the launcher's `srun` job step. The rest of the launcher sees one type,
//! [`DeviceProcess`]: its exit status when it has one, its announced control endpoint, and
//! how to signal it.
//!
//! - **here**: the device is the launcher's child, in a process group of its own (its pid), so
//!   that what it starts can be told from everything else: SIGKILL goes to the group, and what
//!   is left of an exited device's group is killed and named (`kill_leftovers`) when its exit
//!   is handled, before a restart, or once the run's devices are down for those whose exit
//!   was not handled so; an `exec` device `sh -c "sleep 100"` left its `sleep` running,
//!   reparented to init (a bad-input sweep). SIGTERM and SIGINT go to the device alone: a
//!   wrapper that forwards them would pass the device a second one, which ends it at once. A
//!   session's shared-memory watchdog runs in a group of its own and outlives its device, as
//!   it must to clean up after it; a process that leaves the group (`setsid`) is not followed.
//!   The terminal's Ctrl-C reaches the launcher alone, which stops the devices in data-flow
//!   order.
//! - **ssh**: the child is the OpenSSH client running `exec env ... ferromq device ...` on the
//!   host (no daemon of ours there; keys and options from the user's ssh config, the command
//!   from `FERROMQ_SSH_COMMAND` when set, like git's `GIT_SSH_COMMAND`). The device's exit
//!   status is ssh's; ssh's own failure (255) means the host could not be reached or was lost.
//!   Signals go to the device's pid on the host (from its announcement) through another ssh.
//! - **slurm**: every device is a task of one `srun` step (`--distribution=arbitrary`, the node
//!   of task i on line i of `SLURM_HOSTFILE`); each task runs `ferromq slurm-task`, which fetches
//!   its own command by `SLURM_PROCID` from the launcher (a one-line TCP exchange with a port the
//!   launcher opened for the step, at `SLURM_LAUNCH_NODE_IPADDR`, with a random token: the
//!   environment would carry every task's command to every task, O(N²) bytes for N devices,
//!   and no file system is assumed shared), runs it as its child
//!   and prints its exit status as its last line (srun tells only of tasks that failed, and only
//!   when they are done; a device that exits 0 mid-step would go unseen). Output comes labelled
//!   with the task number (`--label`); srun's report of a task that failed (`task 3: Killed`:
//!   the wrapper itself was killed) is that device's exit too. Signals go to the device's pid
//!   (from its announcement) through `srun --overlap` on its node.
//!
//! On drop nothing is killed here: the launcher stops devices through their control endpoint,
//! kills what does not stop, and the tasks owning local children kill them when the runtime
//! ends (`kill_on_drop`).

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

use crate::console::Console;

use super::LAST_LINES;

/// The environment variable that tells a `ferromq slurm-task` where to fetch its command:
/// `PORT TOKEN` (the host is srun's, `SLURM_LAUNCH_NODE_IPADDR`).
pub const SLURM_COMMANDS_ENV: &str = "FERROMQ_SLURM_COMMANDS";
/// The last line of a `ferromq slurm-task`: its device's exit (`code N` or `signal N`).
const TASK_EXIT_PREFIX: &str = "ferromq-task-exit: ";
/// How long a task waits for the launcher's answer, and the launcher for a task's request.
const COMMAND_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest request a task sends (`TOKEN PROCID`).
const COMMAND_REQUEST_MAX: u64 = 256;
/// The longest answer a task accepts (one device's command as JSON).
const COMMAND_REPLY_MAX: u64 = 16 * 1024 * 1024;

/// What to run for one device: program, arguments and extra environment.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DeviceCommand {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables to set.
    pub env: Vec<(String, String)>,
}

/// Where a device's output goes: its last lines (for failure reports), the console (prefixed
/// with device and, on another host, the host), and its control endpoint announcement.
#[derive(Clone)]
pub(super) struct OutputSink {
    id: String,
    host: Option<String>,
    last_lines: Arc<Mutex<VecDeque<String>>>,
    announced: Arc<watch::Sender<Option<(String, u32)>>>,
}

impl OutputSink {
    pub(super) fn new(id: &str, host: Option<String>) -> OutputSink {
        OutputSink {
            id: id.to_owned(),
            host,
            last_lines: Arc::new(Mutex::new(VecDeque::new())),
            announced: Arc::new(watch::Sender::new(None)),
        }
    }

    pub(super) fn last_lines(&self) -> Arc<Mutex<VecDeque<String>>> {
        Arc::clone(&self.last_lines)
    }

    pub(super) fn announcements(&self) -> watch::Receiver<Option<(String, u32)>> {
        self.announced.subscribe()
    }

    fn line(&self, line: &str, to_stderr: bool) {
        if let Some(announced) = ferromq_device::control::parse_announcement(line) {
            self.announced.send_replace(Some(announced));
            return;
        }
        {
            let mut last = self.last_lines.lock().expect("line buffer poisoned");
            if last.len() == LAST_LINES {
                last.pop_front();
            }
            last.push_back(line.to_owned());
        }
        // Device log lines already carry the device id; other output gets it here.
        let id = &self.id;
        let mut line = if line.contains(&format!("[{id}]")) {
            line.to_owned()
        } else {
            format!("[{id}] {line}")
        };
        if let Some(host) = &self.host {
            line = format!("{host}: {line}");
        }
        if to_stderr {
            Console::global().error_line(&line);
        } else {
            Console::global().line(&line);
        }
    }
}

fn forward_lines(
    stream: impl AsyncRead + Unpin + Send + 'static,
    to_stderr: bool,
    sink: OutputSink,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            sink.line(&line, to_stderr);
        }
    })
}

/// How signals reach a device.
#[derive(Debug, Clone)]
enum Reach {
    Here {
        pid: Option<u32>,
    },
    Ssh {
        ssh: Vec<String>,
        client_pid: Option<u32>,
    },
    Slurm {
        job: String,
        node: String,
    },
}

/// A device's process (see the module documentation).
pub(super) struct DeviceProcess {
    exit: watch::Receiver<Option<ExitStatus>>,
    announced: watch::Receiver<Option<(String, u32)>>,
    reach: Reach,
}

impl DeviceProcess {
    /// Its exit status, once it exited.
    pub(super) fn try_wait(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Its exit status as it comes.
    pub(super) fn exits(&self) -> watch::Receiver<Option<ExitStatus>> {
        self.exit.clone()
    }

    /// Waits for it to exit.
    pub(super) async fn wait(&mut self) -> Option<ExitStatus> {
        self.exit
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|status| *status)
    }

    /// Its pid when it runs on this machine as the launcher's child (whose CPU use can be read).
    pub(super) fn local_pid(&self) -> Option<u32> {
        match self.reach {
            Reach::Here { pid } => pid,
            _ => None,
        }
    }

    /// Whether it was started through ssh, whose own failure (exit status 255) means its host
    /// was unreachable or lost.
    pub(super) fn lost_its_host(&self) -> bool {
        matches!(self.reach, Reach::Ssh { .. })
            && self.try_wait().and_then(|status| status.code()) == Some(255)
    }

    /// Its control endpoint and pid, once it announced them.
    pub(super) fn announced(&self) -> watch::Receiver<Option<(String, u32)>> {
        self.announced.clone()
    }

    /// Sends it `signal` (where it runs), without waiting.
    pub(super) fn signal(&self, signal: nix::sys::signal::Signal) {
        if self.try_wait().is_some() {
            return;
        }
        let remote_pid = self.announced.borrow().as_ref().map(|(_, pid)| *pid);
        match &self.reach {
            Reach::Here { pid } => {
                if let Some(pid) = pid {
                    let pid = nix::unistd::Pid::from_raw(*pid as i32);
                    // SIGKILL to its group: what it started goes with it (see the module
                    // documentation); anything else to the device alone.
                    if signal != nix::sys::signal::Signal::SIGKILL
                        || nix::sys::signal::killpg(pid, signal).is_err()
                    {
                        let _ = nix::sys::signal::kill(pid, signal);
                    }
                }
            }
            Reach::Ssh { ssh, client_pid } => {
                if let Some(pid) = remote_pid {
                    run_quietly(ssh, &["kill", "-s", signal.as_str(), &pid.to_string()]);
                }
                if signal == nix::sys::signal::Signal::SIGKILL
                    && let Some(client) = client_pid
                {
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(*client as i32), signal);
                }
            }
            Reach::Slurm { job, node } => {
                if let Some(pid) = remote_pid {
                    let srun = on_node(job, node);
                    run_quietly(&srun, &["kill", "-s", signal.as_str(), &pid.to_string()]);
                }
            }
        }
    }

    /// Kills it and waits (at most 5 s) for it to be gone.
    pub(super) async fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.wait()).await;
    }
}

/// The processes of the groups of local devices that already exited, killed: what each device
/// started and left running (see the module documentation). Each `(id, pid)` is a device and
/// its pid, which is its group's id; returns each device that left processes with their pids
/// and names. One scan of `/proc` for all of them: call it off the async threads.
pub(super) fn kill_leftovers(devices: &[(String, u32)]) -> Vec<(String, Vec<(u32, String)>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut members: Vec<(u32, u32, String)> = Vec::new();
    for pid in entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((name, group)) = name_and_group(&stat)
            && devices.iter().any(|(_, device)| *device == group)
        {
            members.push((group, pid, name));
        }
    }
    let mut left = Vec::new();
    for (id, device) in devices {
        let Some(processes) = leftovers_of(*device, &members) else {
            continue;
        };
        // The group has members and no leader, so its id is the device's.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(*device as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        left.push((id.clone(), processes));
    }
    left
}

/// What device `device` (an exited process that led its group) left in its group, from
/// `members` (`(group, pid, name)` of live processes): `None` when nothing, or when a live
/// process has the device's pid. The kernel gives no new process a pid that a live group
/// still uses as its id, so such a process was given the pid after the device's group was
/// gone, and the group of that id (which it leads) is not the device's.
fn leftovers_of(device: u32, members: &[(u32, u32, String)]) -> Option<Vec<(u32, String)>> {
    let processes: Vec<(u32, String)> = members
        .iter()
        .filter(|(group, _, _)| *group == device)
        .map(|(_, pid, name)| (*pid, name.clone()))
        .collect();
    let reused = processes.iter().any(|(pid, _)| *pid == device);
    (!processes.is_empty() && !reused).then_some(processes)
}

/// A live process's command name and process group, from the bytes of its `/proc/<pid>/stat`
/// (`pid (name) state ppid pgrp ...`, [`stat_fields`]). `None` for a zombie, which is already
/// gone, and for text of another form.
fn name_and_group(stat: &[u8]) -> Option<(String, u32)> {
    let (name, mut fields) = stat_fields(stat)?;
    let state = fields.next()?;
    let group = fields.nth(1)?.parse().ok()?;
    (state != "Z").then_some((name, group))
}

/// The command name of `/proc/<pid>/stat`'s bytes, and the fields after it, from the state on
/// (the name may hold spaces, parentheses and bytes that are not UTF-8: the fields count from
/// its last `)`).
pub(super) fn stat_fields(stat: &[u8]) -> Option<(String, std::str::Split<'_, char>)> {
    let open = stat.iter().position(|&byte| byte == b'(')?;
    let close = stat.iter().rposition(|&byte| byte == b')')?;
    let name = String::from_utf8_lossy(stat.get(open + 1..close)?).into_owned();
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    Some((name, rest.split(' ')))
}

/// `srun` running one task on `node` beside the launcher's step.
pub(super) fn on_node(job: &str, node: &str) -> Vec<String> {
    [
        "srun",
        "--overlap",
        "--jobid",
        job,
        "--nodelist",
        node,
        "--nodes=1",
        "--ntasks=1",
        "--quiet",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Runs `prefix` + `args` in the background, its output discarded, killed after 10 s.
fn run_quietly(prefix: &[String], args: &[&str]) {
    let mut command = Command::new(&prefix[0]);
    command
        .args(&prefix[1..])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Ok(mut child) = command.spawn() {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        });
    }
}

/// Starts `command` here, as the launcher's child.
pub(super) fn spawn_here(command: &DeviceCommand, sink: &OutputSink) -> Result<DeviceProcess> {
    let mut process = Command::new(&command.program);
    process
        .args(&command.args)
        .envs(command.env.iter().cloned())
        .env(crate::run::LAUNCHER_PID_ENV, std::process::id().to_string())
        .process_group(0);
    let (child_pid, exit) =
        spawn_child(process, sink).with_context(|| format!("cannot start {}", command.program))?;
    Ok(DeviceProcess {
        exit,
        announced: sink.announcements(),
        reach: Reach::Here { pid: child_pid },
    })
}

/// The ssh client command: `FERROMQ_SSH_COMMAND` (split as a shell would) or `ssh`, with the
/// options a launcher needs (no password prompts, a dead connection noticed within seconds).
pub(super) fn ssh_command(destination: &str) -> Result<Vec<String>> {
    let mut ssh = match std::env::var("FERROMQ_SSH_COMMAND") {
        Ok(text) => shlex::split(&text)
            .filter(|words| !words.is_empty())
            .with_context(|| format!("FERROMQ_SSH_COMMAND={text:?} is not a command"))?,
        Err(_) => vec!["ssh".to_owned()],
    };
    ssh.extend(
        [
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "ServerAliveInterval=1",
            "-o",
            "ServerAliveCountMax=3",
            destination,
            "--",
        ]
        .map(str::to_owned),
    );
    Ok(ssh)
}

/// Starts `command` on another host through `ssh` (see the module documentation).
pub(super) fn spawn_ssh(
    destination: &str,
    command: &DeviceCommand,
    sink: &OutputSink,
) -> Result<DeviceProcess> {
    let ssh = ssh_command(destination)?;
    let mut words = vec!["exec".to_owned(), "env".to_owned()];
    words.extend(
        command
            .env
            .iter()
            .map(|(key, value)| format!("{key}={value}")),
    );
    words.push(command.program.clone());
    words.extend(command.args.iter().cloned());
    let remote = shlex::try_join(words.iter().map(String::as_str))
        .context("a device argument holds a NUL byte")?;
    let mut process = Command::new(&ssh[0]);
    process.args(&ssh[1..]).arg(remote);
    let (client_pid, exit) =
        spawn_child(process, sink).with_context(|| format!("cannot start {}", ssh[0]))?;
    Ok(DeviceProcess {
        exit,
        announced: sink.announcements(),
        reach: Reach::Ssh { ssh, client_pid },
    })
}

fn spawn_child(
    mut process: Command,
    sink: &OutputSink,
) -> Result<(Option<u32>, watch::Receiver<Option<ExitStatus>>)> {
    process
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = process.spawn()?;
    let stdout = forward_lines(child.stdout.take().expect("piped"), false, sink.clone());
    let stderr = forward_lines(child.stderr.take().expect("piped"), true, sink.clone());
    let pid = child.id();
    let (exit_tx, exit) = watch::channel(None);
    tokio::spawn(async move {
        let status = child.wait().await.ok();
        // Its last lines are read before its exit is told (which reports them); a process it
        // left behind may hold the pipes open, so not for long.
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = stdout.await;
            let _ = stderr.await;
        })
        .await;
        exit_tx.send_replace(Some(status.unwrap_or_else(|| ExitStatus::from_raw(1 << 8))));
    });
    Ok((pid, exit))
}

/// One task of the srun step.
pub(super) struct SlurmTask {
    pub(super) node: String,
    pub(super) command: DeviceCommand,
    pub(super) sink: OutputSink,
}

/// Starts every task in one `srun` step inside the allocation `job`; `hostfile` is written
/// with each task's node. The step's tasks find their commands in the environment.
pub(super) fn spawn_slurm(
    job: &str,
    tasks: &[SlurmTask],
    hostfile: &std::path::Path,
    ferromq: &str,
) -> Result<Vec<DeviceProcess>> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let nodes: Vec<&str> = tasks.iter().map(|task| task.node.as_str()).collect();
    std::fs::write(hostfile, nodes.join("\n") + "\n")
        .with_context(|| format!("cannot write {}", hostfile.display()))?;
    let commands: Vec<String> = tasks
        .iter()
        .map(|task| serde_json::to_string(&task.command).expect("commands serialise"))
        .collect();
    let listener = std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|listener| {
            listener.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(listener)
        })
        .context("cannot open a port for the tasks to fetch their commands")?;
    let port = listener.local_addr().context("the command port")?.port();
    let token = random_token().context("cannot read /dev/urandom")?;
    let server = tokio::spawn(serve_commands(listener, token.clone(), Arc::new(commands)));
    let mut srun = Command::new("srun");
    // The hostfile alone places the tasks (a --nodelist beside it would be read as the
    // arbitrary list itself); --overcommit lets more devices than CPUs share a node.
    srun.args([
        "--jobid",
        job,
        "--ntasks",
        &tasks.len().to_string(),
        "--distribution=arbitrary",
        "--overcommit",
        "--label",
        "--kill-on-bad-exit=0",
        "--input=none",
        "--job-name=ferromq-devices",
        ferromq,
        "slurm-task",
    ])
    .env("SLURM_HOSTFILE", hostfile)
    .env(SLURM_COMMANDS_ENV, format!("{port} {token}"));
    srun.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = srun.spawn().context("cannot start srun")?;
    let senders: Arc<Vec<watch::Sender<Option<ExitStatus>>>> =
        Arc::new(tasks.iter().map(|_| watch::Sender::new(None)).collect());
    let sinks: Arc<Vec<OutputSink>> =
        Arc::new(tasks.iter().map(|task| task.sink.clone()).collect());
    let processes = tasks
        .iter()
        .zip(senders.iter())
        .map(|(task, sender)| DeviceProcess {
            exit: sender.subscribe(),
            announced: task.sink.announcements(),
            reach: Reach::Slurm {
                job: job.to_owned(),
                node: task.node.clone(),
            },
        })
        .collect();
    let route = |stream: Box<dyn AsyncRead + Unpin + Send>, to_stderr: bool| {
        let senders = Arc::clone(&senders);
        let sinks = Arc::clone(&sinks);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                route_srun_line(&line, to_stderr, &senders, &sinks);
            }
        })
    };
    let stdout_task = route(Box::new(child.stdout.take().expect("piped")), false);
    let stderr_task = route(Box::new(child.stderr.take().expect("piped")), true);
    tokio::spawn(async move {
        let status = child.wait().await.ok();
        server.abort();
        // srun's own last lines (which task failed) are read before the step counts as over.
        let _ = stdout_task.await;
        let _ = stderr_task.await;
        let unreported = match status {
            Some(status) if status.signal().is_some() => status,
            _ => ExitStatus::from_raw(0),
        };
        for sender in senders.iter() {
            set_exit_once(sender, unreported);
        }
    });
    Ok(processes)
}

/// 128 random bits as hex: only the step's tasks, which srun gives it, can fetch commands.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Answers each connection's `TOKEN PROCID` line with task PROCID's command (one JSON line),
/// or `error: ...`; runs until aborted (when the step ends).
async fn serve_commands(
    listener: tokio::net::TcpListener,
    token: String,
    commands: Arc<Vec<String>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of descriptors, say: try again without starving the runtime.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let token = token.clone();
        let commands = Arc::clone(&commands);
        tokio::spawn(async move {
            let exchange = async {
                let mut request = String::new();
                let (reader, mut writer) = stream.split();
                let mut lines = BufReader::new(reader.take(COMMAND_REQUEST_MAX));
                lines.read_line(&mut request).await.ok()?;
                let reply = match command_for(&request, &token, &commands) {
                    Ok(command) => command.to_owned(),
                    Err(error) => format!("error: {error}"),
                };
                writer.write_all(format!("{reply}\n").as_bytes()).await.ok()
            };
            let _ = tokio::time::timeout(COMMAND_EXCHANGE_TIMEOUT, exchange).await;
        });
    }
}

/// The command a `TOKEN PROCID` request asks for.
fn command_for<'a>(request: &str, token: &str, commands: &'a [String]) -> Result<&'a str, String> {
    let (given, task) = request
        .trim()
        .split_once(' ')
        .ok_or("a request is `TOKEN PROCID`")?;
    if given != token {
        return Err("wrong token".to_owned());
    }
    let task: usize = task
        .parse()
        .map_err(|_| format!("task {task:?} is not a number"))?;
    commands
        .get(task)
        .map(String::as_str)
        .ok_or_else(|| format!("task {task} beyond the step's {} tasks", commands.len()))
}

/// Asks the launcher at `address` for task `task`'s command.
fn fetch_command(address: &str, token: &str, task: usize) -> Result<DeviceCommand> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let target = address
        .to_socket_addrs()
        .with_context(|| format!("launcher address {address:?}"))?
        .next()
        .with_context(|| format!("launcher address {address:?} resolves to nothing"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&target, COMMAND_EXCHANGE_TIMEOUT)
        .with_context(|| format!("cannot reach the launcher at {address}"))?;
    stream.set_read_timeout(Some(COMMAND_EXCHANGE_TIMEOUT))?;
    writeln!(stream, "{token} {task}").context("cannot ask the launcher")?;
    let mut reply = String::new();
    stream
        .take(COMMAND_REPLY_MAX)
        .read_to_string(&mut reply)
        .context("no answer from the launcher")?;
    if let Some(error) = reply.trim().strip_prefix("error: ") {
        bail!("the launcher at {address} refused task {task}: {error}");
    }
    serde_json::from_str(reply.trim())
        .with_context(|| format!("the launcher's answer for task {task} is not a command"))
}

/// Records `status` as a task's exit unless one was recorded already.
fn set_exit_once(sender: &watch::Sender<Option<ExitStatus>>, status: ExitStatus) {
    sender.send_if_modified(|exit| {
        let unset = exit.is_none();
        if unset {
            *exit = Some(status);
        }
        unset
    });
}

/// One line of srun's output: a task's line (`3: text`) goes to that device; srun's report of
/// a task that failed (`srun: error: n2: task 3: Killed`) is that device's exit.
fn route_srun_line(
    line: &str,
    to_stderr: bool,
    senders: &[watch::Sender<Option<ExitStatus>>],
    sinks: &[OutputSink],
) {
    if let Some((tasks, status)) = parse_task_exit(line) {
        // The wrapper's own report (below) says more (a signal, not 128 + N) and wins; srun's
        // counts where the wrapper itself was killed and said nothing.
        for task in tasks {
            if let Some(sender) = senders.get(task) {
                set_exit_once(sender, status);
            }
        }
        Console::global().error_line(line);
        return;
    }
    let labelled = line
        .trim_start()
        .split_once(": ")
        .and_then(|(label, text)| {
            let task: usize = label.parse().ok()?;
            Some((task, text))
        });
    if let Some((task, text)) = labelled
        && let Some(exit) = text.strip_prefix(TASK_EXIT_PREFIX)
        && let Some(status) = parse_exit(exit)
    {
        if let Some(sender) = senders.get(task) {
            sender.send_replace(Some(status));
        }
        return;
    }
    match labelled.and_then(|(task, text)| Some((sinks.get(task)?, text))) {
        Some((sink, text)) => sink.line(text, to_stderr),
        None if to_stderr => Console::global().error_line(line),
        None => Console::global().line(line),
    }
}

/// `code 3` or `signal 9`, as a `ferromq slurm-task` reports its device's end.
fn parse_exit(text: &str) -> Option<ExitStatus> {
    match text.trim().split_once(' ')? {
        ("code", code) => Some(ExitStatus::from_raw(code.parse::<i32>().ok()? << 8)),
        ("signal", signal) => Some(ExitStatus::from_raw(signal.parse::<i32>().ok()?)),
        _ => None,
    }
}

/// `srun: error: n2: task 3: Killed` -> ([3], killed by SIGKILL); `... task 1: Exited with
/// exit code 3` -> ([1], exit code 3); srun groups tasks that ended alike (`tasks 0-2,5:
/// Terminated`). `Terminated` is SIGTERM, `Aborted` SIGABRT, `Segmentation fault` SIGSEGV.
pub(super) fn parse_task_exit(line: &str) -> Option<(Vec<usize>, ExitStatus)> {
    let rest = line.strip_prefix("srun: error: ")?;
    let (_, rest) = rest.split_once(": task")?;
    let rest = rest.strip_prefix("s ").or_else(|| rest.strip_prefix(' '))?;
    let (list, what) = rest.split_once(": ")?;
    let mut tasks = Vec::new();
    for range in list.split(',') {
        match range.split_once('-') {
            Some((first, last)) => {
                let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
                if last < first || last - first > 1 << 16 {
                    return None;
                }
                tasks.extend(first..=last);
            }
            None => tasks.push(range.parse().ok()?),
        }
    }
    let status = if let Some(code) = what.strip_prefix("Exited with exit code ") {
        ExitStatus::from_raw(code.trim().parse::<i32>().ok()? << 8)
    } else {
        let signal = match what.trim() {
            "Killed" => 9,
            "Terminated" => 15,
            "Aborted" => 6,
            "Segmentation fault" => 11,
            "Interrupt" => 2,
            "Bus error" => 7,
            _ => return None,
        };
        ExitStatus::from_raw(signal)
    };
    Some((tasks, status))
}

/// `ferromq slurm-task`: the command of task `SLURM_PROCID`, fetched from the launcher (see
/// the module docs), run as this process's child; its exit is printed as the task's last line and
/// becomes this process's (signals as 128 + N). SIGINT and SIGTERM that reach the whole task
/// (Slurm signals process groups) are left to the device, which goes down cleanly on them.
///
/// # Errors
/// The launcher cannot be reached or refuses the task, or the command cannot be started.
pub fn run_slurm_task() -> Result<std::process::ExitCode> {
    let task: usize = std::env::var("SLURM_PROCID")
        .context("SLURM_PROCID is not set: `ferromq slurm-task` runs as a task of `ferromq run --launcher slurm`")?
        .parse()
        .context("SLURM_PROCID is not a number")?;
    let exchange = std::env::var(SLURM_COMMANDS_ENV)
        .with_context(|| format!("{SLURM_COMMANDS_ENV} is not set"))?;
    let (port, token) = exchange
        .split_once(' ')
        .with_context(|| format!("{SLURM_COMMANDS_ENV} {exchange:?} is not `PORT TOKEN`"))?;
    let host =
        std::env::var("SLURM_LAUNCH_NODE_IPADDR").context("SLURM_LAUNCH_NODE_IPADDR is not set")?;
    let address = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let command = fetch_command(&address, token, task)?;
    let mut child = std::process::Command::new(&command.program);
    child
        .args(&command.args)
        .envs(command.env.iter().cloned())
        .env_remove(SLURM_COMMANDS_ENV);
    // SIGINT and SIGTERM are caught (and dropped) for the task's life: handlers, unlike an
    // ignored disposition, are not inherited by the device, which handles them itself.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    let _caught = runtime.block_on(async { crate::Signals::install() });
    let mut child = child
        .spawn()
        .with_context(|| format!("cannot start {}", command.program))?;
    let status = child.wait().context("cannot wait for the device")?;
    let (line, code) = match (status.code(), status.signal()) {
        (Some(code), _) => (format!("code {code}"), code),
        (None, Some(signal)) => (format!("signal {signal}"), 128 + signal),
        (None, None) => ("code 1".to_owned(), 1),
    };
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{TASK_EXIT_PREFIX}{line}");
        let _ = stdout.flush();
    }
    Ok(std::process::ExitCode::from(
        u8::try_from(code).unwrap_or(1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name with spaces, parentheses and bytes that are not UTF-8 does not shift the fields;
    /// a zombie is no member.
    #[test]
    fn stat_fields_count_from_the_names_last_parenthesis() {
        let mut stat = b"4242 (a) b (\xff) S 1 4240 4240 0 -1".to_vec();
        assert_eq!(
            name_and_group(&stat),
            Some(("a) b (\u{fffd}".to_owned(), 4240))
        );
        stat = b"4243 (sleep) Z 1 4240 4240 0 -1".to_vec();
        assert_eq!(name_and_group(&stat), None);
        assert_eq!(name_and_group(b"garbage"), None);
    }

    /// A device's group with members and no leader is what it left; a group led by a process
    /// that has the device's pid is another's (the pid was given again once the group was
    /// gone), and is left alone.
    #[test]
    fn a_group_led_by_a_process_with_the_devices_pid_is_not_the_devices() {
        let members = [
            (100, 101, "sleep".to_owned()),
            (100, 102, "cat".to_owned()),
            (200, 200, "daemon".to_owned()),
            (200, 201, "worker".to_owned()),
        ];
        assert_eq!(
            leftovers_of(100, &members),
            Some(vec![(101, "sleep".to_owned()), (102, "cat".to_owned())])
        );
        assert_eq!(leftovers_of(200, &members), None);
        assert_eq!(leftovers_of(300, &members), None);
    }

    #[test]
    fn srun_reports_of_failed_tasks_become_exit_statuses() {
        let (tasks, status) = parse_task_exit("srun: error: n2: task 3: Killed").unwrap();
        assert_eq!((tasks, status.signal()), (vec![3], Some(9)));
        let (tasks, status) =
            parse_task_exit("srun: error: n1: task 12: Exited with exit code 1").unwrap();
        assert_eq!((tasks, status.code()), (vec![12], Some(1)));
        let (tasks, status) = parse_task_exit("srun: error: n2: tasks 2-3,7: Terminated").unwrap();
        assert_eq!((tasks, status.signal()), (vec![2, 3, 7], Some(15)));
        assert!(parse_task_exit("srun: error: something else").is_none());
        assert!(parse_task_exit("3: srun: error: n1: task 1: Killed").is_none());
    }

    #[test]
    fn a_command_request_needs_the_token_and_a_task_of_the_step() {
        let commands = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(command_for("t0k 1\n", "t0k", &commands), Ok("b"));
        assert_eq!(
            command_for("bad 1\n", "t0k", &commands),
            Err("wrong token".to_owned())
        );
        assert_eq!(
            command_for("t0k 2", "t0k", &commands),
            Err("task 2 beyond the step's 2 tasks".to_owned())
        );
        assert_eq!(
            command_for("t0k x", "t0k", &commands),
            Err("task \"x\" is not a number".to_owned())
        );
        assert!(command_for("", "t0k", &commands).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_fetches_its_own_command_from_the_launcher() {
        let command = |name: &str| DeviceCommand {
            program: "ferromq".to_owned(),
            args: vec!["device".to_owned(), name.to_owned()],
            env: vec![("K".to_owned(), "V".to_owned())],
        };
        let commands: Vec<String> = ["sampler", "sink"]
            .iter()
            .map(|name| serde_json::to_string(&command(name)).unwrap())
            .collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(serve_commands(
            listener,
            "tok".to_owned(),
            Arc::new(commands),
        ));
        let fetched = tokio::task::spawn_blocking({
            let address = address.clone();
            move || {
                (
                    fetch_command(&address, "tok", 1),
                    fetch_command(&address, "nope", 0),
                )
            }
        })
        .await
        .unwrap();
        server.abort();
        let sink = fetched.0.unwrap();
        assert_eq!(sink.args, ["device", "sink"]);
        assert_eq!(sink.env, [("K".to_owned(), "V".to_owned())]);
        let refused = format!("{:#}", fetched.1.unwrap_err());
        assert!(refused.contains("refused task 0: wrong token"), "{refused}");
    }
}
