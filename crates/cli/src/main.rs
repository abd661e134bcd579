//! The `ferromq` binary.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferromq_cli::shm_command::{self, ShmCommand};
use ferromq_cli::{BuiltinOptions, DeviceOptions, launch, run_builtin_device};
use ferromq_devices::Builtin;

#[derive(Parser)]
#[command(
    name = "ferromq",
    version,
    about = "ferromq: async dataflow runtime for high-rate pipelines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a built-in device: a sampler, sink or forwarder, a client or server, an event
    /// builder's source or builder, an MCTS driver or worker, or a replay (KIND lists them).
    Device {
        /// The kind of device.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(Builtin::names()))]
        kind: String,
        #[command(flatten)]
        options: Box<DeviceOptions>,
        #[command(flatten)]
        builtin: Box<BuiltinOptions>,
    },
    /// Run a topology: one process per device, stepped through the state machine together.
    Run {
        /// The topology file (TOML).
        file: std::path::PathBuf,
        /// Stop after this many seconds.
        #[arg(long, allow_hyphen_values = true, value_parser = ferromq_cli::options::seconds)]
        duration: Option<f64>,
        /// Default transport of every channel that names none (overrides the file's).
        #[arg(long)]
        transport: Option<String>,
        /// Session id (default: one per run).
        #[arg(long, value_parser = ferromq_cli::options::session_id)]
        session: Option<String>,
        /// How devices start: here, on other hosts through ssh, or as tasks of a Slurm job
        /// step (inside salloc/sbatch); devices are placed by their `host` key.
        #[arg(long, value_enum, default_value_t)]
        launcher: launch::LauncherKind,
        /// Hosts by position, for `host = 0, 1, ...` with --launcher ssh (e.g. --hosts a,b).
        #[arg(long, value_delimiter = ',', value_parser = ferromq_cli::options::host_name)]
        hosts: Vec<String>,
        /// Print an sbatch script that runs the topology with --launcher slurm, and exit.
        #[arg(long)]
        print_batch: bool,
        /// Serve Prometheus metrics of every device (channel counters, state, host) at
        /// http://ADDR/metrics, as often as the live table polls them.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
        /// Or push them every second to an OTLP/HTTP receiver, e.g.
        /// http://127.0.0.1:4318/v1/metrics (a binary built with the `otel` feature).
        #[arg(long = "otlp-endpoint", value_name = "URL")]
        otlp_endpoint: Option<String>,
    },
    /// One device of `ferromq run --launcher slurm`: runs the command srun's task number names.
    #[command(hide = true)]
    SlurmTask,
    /// Measure throughput (or latency) between two processes across transports and sizes.
    Bench(ferromq_cli::bench::BenchOptions),
    /// One side of a `ferromq bench` pair (started by `ferromq bench`).
    #[command(hide = true)]
    BenchRole(ferromq_cli::bench::RoleOptions),
    /// The destination of a `ferromq bench rpc` pair (started by `ferromq bench rpc`).
    #[command(hide = true)]
    BenchRpcRole(ferromq_cli::rpc_bench::RpcRoleOptions),
    /// Check a topology file without starting anything.
    Validate {
        /// The topology file (TOML).
        file: std::path::PathBuf,
    },
    /// Print a topology's devices and channels as a graph.
    Graph {
        /// The topology file (TOML).
        file: std::path::PathBuf,
        /// Graphviz DOT or Mermaid.
        #[arg(long, value_enum, default_value = "dot")]
        format: GraphFormat,
    },
    /// Show the devices running on this host (any session, whoever started them): live, or
    /// one snapshot with --once / --json. Leave with q, Esc or Ctrl-C; the run goes on.
    Top(ferromq_cli::top_command::TopOptions),
    /// Record a running device's channel into a file (until Ctrl-C, --duration or --messages).
    Record(ferromq_cli::record_command::RecordOptions),
    /// Feed a recording into a channel: the built-in `replay` device with `file` set
    /// (`--speed`: 1 as recorded, 2 twice as fast, 0 as fast as possible).
    Replay {
        /// The recording (`ferromq record`'s file).
        file: std::path::PathBuf,
        /// The pace: a multiple of the recorded one, or 0 for as fast as possible.
        #[arg(long, default_value = "1", allow_negative_numbers = true)]
        speed: f64,
        #[command(flatten)]
        options: Box<DeviceOptions>,
    },
    /// Show or remove shared memory (`ferromq shm list`, `ferromq shm clean --stale`).
    Shm {
        #[command(subcommand)]
        command: ShmCommand,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum GraphFormat {
    Dot,
    Mermaid,
}

/// `ferromq device KIND`: FairMQ's options, checked before anything starts (exit 2 naming the
/// option and the value), `--print-channels`, then the device.
fn run_builtin(kind: Builtin, mut options: DeviceOptions, builtin: &BuiltinOptions) -> ExitCode {
    let properties = builtin.properties();
    let checked = options
        .check()
        .and_then(|()| builtin.check())
        .and_then(|()| options.prepare_logging());
    if let Err(error) = checked {
        eprintln!("ferromq: {error:#}");
        return ExitCode::from(2);
    }
    if options.print_channels == Some(true) {
        let renamed = |key: &str| {
            properties
                .iter()
                .find(|(name, _)| *name == key)
                .map(|(_, value)| value.clone())
        };
        for (name, min, max) in kind.channel_endpoints(renamed) {
            println!("{name}:{min}:{max}");
        }
        return ExitCode::SUCCESS;
    }
    options.also_ignored.extend(builtin.ignored());
    // Built-in devices count `--max-iterations` as FairMQ's benchmark devices do (N + 1).
    options.max_iterations = ferromq_devices::fairmq_iterations(options.max_iterations);
    run_builtin_device(kind, &options, &properties)
}

fn main() -> ExitCode {
    // A device of a shmem session may re-execute this binary as the session's watchdog.
    ferromq_shm::run_watchdog_if_requested();
    let cli = Cli::parse();
    match cli.command {
        Command::Device {
            kind,
            options,
            builtin,
        } => {
            let kind = Builtin::from_name(&kind).expect("clap checked the kind");
            run_builtin(kind, *options, &builtin)
        }
        Command::Shm { command } => shm_command::run(&command),
        Command::Top(options) => ferromq_cli::top_command::run(&options),
        Command::Record(options) => ferromq_cli::record_command::run(&options),
        Command::Replay {
            file,
            speed,
            options,
        } => {
            let (min, max) = (
                ferromq_devices::MIN_REPLAY_SPEED,
                ferromq_devices::MAX_REPLAY_SPEED,
            );
            if !(speed == 0.0 || (min..=max).contains(&speed)) {
                // `{:?}`: 1e308 as `1e308`, not 309 digits.
                eprintln!(
                    "ferromq: --speed {speed:?}: expected 0 (as fast as possible) or a factor from {min:e} to {max:e}"
                );
                return ExitCode::from(2);
            }
            let mut options = *options;
            if let Err(error) = options.check().and_then(|()| options.prepare_logging()) {
                eprintln!("ferromq: {error:#}");
                return ExitCode::from(2);
            }
            options.max_iterations = ferromq_devices::fairmq_iterations(options.max_iterations);
            let properties = [
                ("file", file.display().to_string()),
                ("speed", speed.to_string()),
            ];
            run_builtin_device(Builtin::Replay, &options, &properties)
        }
        Command::Bench(options) => ferromq_cli::block_on(1, ferromq_cli::bench::run(options)),
        Command::BenchRpcRole(options) => {
            ferromq_cli::block_on(1, ferromq_cli::rpc_bench::run_role(options))
        }
        Command::BenchRole(options) => {
            ferromq_cli::block_on(1, ferromq_cli::bench::run_role(options))
        }
        Command::Validate { file } => match launch::load_topology(&file, None) {
            Ok(topology) => {
                println!(
                    "{}: valid, {} device(s), {} process(es)",
                    file.display(),
                    topology.devices.len(),
                    topology.instances().len()
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{error:#}");
                ExitCode::from(2)
            }
        },
        Command::Graph { file, format } => match launch::load_topology(&file, None) {
            Ok(topology) => {
                match format {
                    GraphFormat::Dot => print!("{}", topology.to_dot()),
                    GraphFormat::Mermaid => print!("{}", topology.to_mermaid()),
                }
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{error:#}");
                ExitCode::from(2)
            }
        },
        Command::Run {
            file,
            duration,
            transport,
            session,
            launcher,
            hosts,
            print_batch,
            metrics,
            otlp_endpoint,
        } => {
            ferromq_cli::logging::init(
                "ferromq",
                ferromq_cli::logging::Severity::Warn,
                ferromq_cli::logging::Verbosity::Medium,
                ferromq_cli::logging::Color::Auto,
            );
            let options = launch::RunOptions {
                file,
                duration: duration.map(std::time::Duration::from_secs_f64),
                transport,
                session,
                launcher,
                hosts,
                print_batch,
                metrics,
                otlp_endpoint,
            };
            ferromq_cli::block_on(2, launch::run(options))
        }
        Command::SlurmTask => match launch::run_slurm_task() {
            Ok(code) => code,
            Err(error) => {
                eprintln!("ferromq slurm-task: {error:#}");
                ExitCode::from(2)
            }
        },
    }
}
