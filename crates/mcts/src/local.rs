//! A search group on this host without a topology: the driver in this process, the workers as
//! child processes of a program that calls [`run_worker_if_asked`] first thing (the
//! `mcts-hex` example, a test binary).
//!
//! Each worker binds its inbound on an ipc address and says where on stdout; the driver hands
//! everyone the member list on the workers' stdin; a worker serves until its stdin ends (the
//! driver stopped, or died: the workers go too). Dropping a [`LocalSearch`] kills the workers.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ferromq_core::{Address, Transport};
use ferromq_rpc::{Aggregation, Inbound, Member, Rpc, RpcOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::game::Game;
use crate::search::{Driver, DriverCounts, SearchSettings, driver_handlers, worker_handlers};

/// Set (to the worker's member index) in a worker's environment.
pub const WORKER_VAR: &str = "FERROMQ_MCTS_WORKER";

/// Makes the transport of a process from its name (`shmem`, `zeromq`) and session.
pub type MakeTransport = fn(&str, &str) -> Result<Arc<dyn Transport>, String>;

/// What a local search group is made of.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Worker processes.
    pub workers: usize,
    /// The transport's name, for [`MakeTransport`] in every process.
    pub transport: String,
    /// The session (shared memory objects and ipc files are named after it).
    pub session: String,
    /// How calls are packed.
    pub aggregation: Aggregation,
    /// The size of an aggregated frame ([`RpcOptions::aggregate_bytes`]).
    pub aggregate_bytes: usize,
    /// How long `trad` holds a frame that is not full ([`RpcOptions::aggregate_delay`]).
    pub aggregate_delay: Duration,
    /// Playouts, exploration and spread depth.
    pub settings: SearchSettings,
    /// The longest wait for a call.
    pub timeout: Duration,
}

fn ipc_path(session: &str, member: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ferromq-{session}-mcts-{member}.ipc"))
}

fn address(session: &str, member: usize) -> Result<Address, String> {
    let text = format!("ipc://{}", ipc_path(session, member).display());
    Address::parse(&text).map_err(|error| error.to_string())
}

/// The group's ipc socket files, removed on drop: workers are SIGKILLed when the group is
/// dropped and cannot remove theirs (every killed-worker test left three in the temp dir).
struct IpcFiles(Vec<std::path::PathBuf>);

impl Drop for IpcFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn rpc_options(config: &LocalConfig) -> RpcOptions {
    RpcOptions {
        aggregation: config.aggregation,
        aggregate_bytes: config.aggregate_bytes,
        aggregate_delay: config.aggregate_delay,
        timeout: config.timeout,
        spin_us: spin_us(config.workers, host_cores()),
        ..RpcOptions::default()
    }
}

/// The cores this process may run on (1 when that cannot be told).
fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// How long a member's inbound spins before it sleeps ([`RpcOptions::spin_us`]): the default
/// while each worker has one of `cores`, never when they are more. A member waits for the
/// others' calls; spinning there takes a core that one of them, with fewer cores than
/// workers, may be waiting for. The driver does not count: since the root's owner keeps the
/// search going it sleeps through a search but for a report per 256 simulations. On this
/// project's 2-core machine (AMD EPYC, 2026-12-03, `mcts-hex --board 11 --workers 2
/// --rollouts 100000`, 12 rounds, builds alternating) two workers that spin made 216.9 k
/// rollouts a second against 198.0 k, more in 11 rounds of 12. (On 2026-12-02, when the
/// driver still started every simulation and was woken ~3 300 times a second, spinning two
/// workers lost ~5 %: the driver counted then.)
fn spin_us(workers: usize, cores: usize) -> u32 {
    if workers <= cores {
        ferromq_core::DEFAULT_SPIN_US
    } else {
        0
    }
}

struct Worker {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

/// The driver and its worker processes.
pub struct LocalSearch<G: Game> {
    /// The driver (member 0).
    pub driver: Driver<G>,
    workers: Vec<Worker>,
    /// Declared last, so dropped after the workers are killed.
    _ipc_files: IpcFiles,
}

impl<G: Game> LocalSearch<G> {
    /// Starts `config.workers` copies of `program` as workers and the driver here.
    ///
    /// # Errors
    /// What failed, naming the worker.
    pub async fn start(
        program: &Path,
        make_transport: MakeTransport,
        config: &LocalConfig,
    ) -> Result<LocalSearch<G>, String> {
        let ipc_files = IpcFiles(
            (0..=config.workers)
                .map(|member| ipc_path(&config.session, member))
                .collect(),
        );
        let mut workers = Vec::new();
        let mut addresses = vec![address(&config.session, 0)?.to_string()];
        for idx in 1..=config.workers {
            let mut child = Command::new(program)
                .env(WORKER_VAR, idx.to_string())
                .env("FERROMQ_MCTS_CONFIG", config_text(config))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|error| {
                    format!("cannot start worker {idx} ({}): {error}", program.display())
                })?;
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let mut worker = Worker {
                child,
                lines: BufReader::new(stdout).lines(),
            };
            let bound = worker.line(idx).await?;
            let bound = bound
                .strip_prefix("bound ")
                .ok_or_else(|| format!("worker {idx} said {bound:?}"))?;
            addresses.push(bound.to_owned());
            workers.push(worker);
        }
        let transport = make_transport(&config.transport, &config.session)?;
        let inbound = Inbound::bind_with(
            transport.as_ref(),
            &address(&config.session, 0)?,
            &rpc_options(config),
        )
        .await
        .map_err(|error| error.to_string())?;
        let list = format!("members {}\n", addresses.join(" "));
        for worker in &mut workers {
            let stdin = worker.child.stdin.as_mut().ok_or("no stdin")?;
            stdin
                .write_all(list.as_bytes())
                .await
                .map_err(|error| error.to_string())?;
            stdin.flush().await.map_err(|error| error.to_string())?;
        }
        let members = members(&addresses)?;
        let counts = Arc::new(DriverCounts::default());
        let rpc = Rpc::start(
            transport,
            0,
            &members,
            inbound,
            driver_handlers::<G>(&counts),
            rpc_options(config),
        )
        .await
        .map_err(|error| error.to_string())?;
        for (idx, worker) in workers.iter_mut().enumerate() {
            let ready = worker.line(idx + 1).await?;
            if ready != "ready" {
                return Err(format!("worker {} said {ready:?}", idx + 1));
            }
        }
        let mut driver = Driver::new(rpc, counts);
        driver.stall_timeout = config.timeout;
        Ok(LocalSearch {
            driver,
            workers,
            _ipc_files: ipc_files,
        })
    }

    /// The process id of worker `idx` (1-based, as its member index).
    pub fn worker_pid(&self, idx: usize) -> Option<u32> {
        self.workers.get(idx.checked_sub(1)?)?.child.id()
    }

    /// Stops the driver, then the workers (their stdin closes); each must exit 0.
    ///
    /// # Errors
    /// A worker that failed, by index and status.
    pub async fn stop(mut self) -> Result<(), String> {
        self.driver
            .rpc()
            .shutdown()
            .await
            .map_err(|error| error.to_string())?;
        for (idx, worker) in self.workers.iter_mut().enumerate() {
            drop(worker.child.stdin.take());
            let status = tokio::time::timeout(Duration::from_secs(30), worker.child.wait())
                .await
                .map_err(|_| format!("worker {} did not exit", idx + 1))?
                .map_err(|error| error.to_string())?;
            if !status.success() {
                return Err(format!("worker {} exited with {status}", idx + 1));
            }
        }
        Ok(())
    }
}

impl Worker {
    async fn line(&mut self, idx: usize) -> Result<String, String> {
        match tokio::time::timeout(Duration::from_secs(60), self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err(format!("worker {idx} ended before it was ready")),
            Ok(Err(error)) => Err(format!("worker {idx}: {error}")),
            Err(_) => Err(format!("worker {idx} said nothing for a minute")),
        }
    }
}

fn members(addresses: &[String]) -> Result<Vec<Member>, String> {
    addresses
        .iter()
        .enumerate()
        .map(|(idx, address)| {
            Ok(Member {
                name: if idx == 0 {
                    "driver".to_owned()
                } else {
                    format!("worker-{idx}")
                },
                address: Address::parse(address).map_err(|error| error.to_string())?,
            })
        })
        .collect()
}

fn config_text(config: &LocalConfig) -> String {
    format!(
        "{} {} {} {} {} {} {} {} {} {}",
        config.workers,
        config.transport,
        config.session,
        config.aggregation,
        config.aggregate_bytes,
        config.aggregate_delay.as_micros(),
        config.settings.playouts,
        config.settings.exploration,
        config.settings.spread_depth,
        config.timeout.as_millis()
    )
}

fn parse_config(text: &str) -> Result<LocalConfig, String> {
    let fields: Vec<&str> = text.split(' ').collect();
    let [
        workers,
        transport,
        session,
        aggregation,
        aggregate_bytes,
        aggregate_us,
        playouts,
        exploration,
        spread_depth,
        timeout_ms,
    ] = fields[..]
    else {
        return Err(format!("FERROMQ_MCTS_CONFIG {text:?} has not 10 fields"));
    };
    let number = |field: &str| {
        field
            .parse::<u64>()
            .map_err(|error| format!("{field:?}: {error}"))
    };
    Ok(LocalConfig {
        workers: number(workers)? as usize,
        transport: transport.to_owned(),
        session: session.to_owned(),
        aggregation: aggregation.parse()?,
        aggregate_bytes: number(aggregate_bytes)? as usize,
        aggregate_delay: Duration::from_micros(number(aggregate_us)?),
        settings: SearchSettings {
            playouts: number(playouts)? as u32,
            exploration: exploration
                .parse()
                .map_err(|error| format!("{exploration:?}: {error}"))?,
            spread_depth: number(spread_depth)?
                .try_into()
                .map_err(|_| format!("spread depth {spread_depth:?} is too large"))?,
        },
        timeout: Duration::from_millis(number(timeout_ms)?),
    })
}

/// In a process started as a worker ([`WORKER_VAR`] set): serves as that worker until stdin
/// ends and returns `Some(exit code)`; `None` in any other process.
pub fn run_worker_if_asked<G: Game>(
    make_transport: MakeTransport,
) -> Option<std::process::ExitCode> {
    let idx: usize = std::env::var(WORKER_VAR).ok()?.parse().ok()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(serve::<G>(idx, make_transport)),
        Err(error) => Err(error.to_string()),
    };
    Some(match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mcts worker {idx}: {error}");
            std::process::ExitCode::FAILURE
        }
    })
}

async fn serve<G: Game>(idx: usize, make_transport: MakeTransport) -> Result<(), String> {
    let config =
        parse_config(&std::env::var("FERROMQ_MCTS_CONFIG").map_err(|_| "no FERROMQ_MCTS_CONFIG")?)?;
    let transport = make_transport(&config.transport, &config.session)?;
    let inbound = Inbound::bind_with(
        transport.as_ref(),
        &address(&config.session, idx)?,
        &rpc_options(&config),
    )
    .await
    .map_err(|error| error.to_string())?;
    println!("bound {}", inbound.address());
    let read_line = || {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    };
    let line = tokio::task::spawn_blocking(read_line)
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| error.to_string())?;
    let addresses: Vec<String> = line
        .trim_end()
        .strip_prefix("members ")
        .ok_or("no member list on stdin")?
        .split(' ')
        .map(str::to_owned)
        .collect();
    let members = members(&addresses)?;
    let handlers = worker_handlers::<G>(config.workers, config.settings, 0x9e37_79b9 ^ idx as u64);
    let rpc = Rpc::start(
        transport,
        idx,
        &members,
        inbound,
        handlers,
        rpc_options(&config),
    )
    .await
    .map_err(|error| error.to_string())?;
    println!("ready");
    // Serves until stdin ends: the driver stopped or died.
    let _ = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        while matches!(std::io::stdin().read_line(&mut rest), Ok(n) if n > 0) {
            rest.clear();
        }
    })
    .await;
    // Peers are going away too: what is undelivered to them is not a failure of this worker,
    // but it is said (stderr is the search's).
    match rpc.shutdown().await {
        Ok(()) => Ok(()),
        Err(error @ ferromq_core::Error::Undelivered { .. }) => {
            eprintln!(
                "mcts worker {idx}: left the search group with what its members did not take \
                 (the group is ending): {error}"
            );
            Ok(())
        }
        Err(error) => Err(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The members spin while the workers each have a core (the driver sleeps through a
    /// search), and not once they are more than the cores.
    #[test]
    fn members_spin_only_while_every_worker_has_a_core() {
        assert_eq!(spin_us(1, 2), ferromq_core::DEFAULT_SPIN_US);
        assert_eq!(spin_us(2, 2), ferromq_core::DEFAULT_SPIN_US);
        assert_eq!(spin_us(3, 2), 0);
        assert_eq!(spin_us(4, 2), 0);
        assert_eq!(spin_us(8, 16), ferromq_core::DEFAULT_SPIN_US);
        assert_eq!(spin_us(16, 16), ferromq_core::DEFAULT_SPIN_US);
        assert_eq!(spin_us(17, 16), 0);
    }
}
