//! The `ferromq` binary.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferromq_cli::shm_command::{self, ShmCommand};
use ferromq_cli::{BuiltinOptions, DeviceOptions, run_device};
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
    /// Run a built-in device (sampler, sink, bsampler, processor, splitter, merger, proxy, multiplier).
    Device {
        /// The kind of device.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(Builtin::names()))]
        kind: String,
        #[command(flatten)]
        options: Box<DeviceOptions>,
        #[command(flatten)]
        builtin: Box<BuiltinOptions>,
    },
    /// Show or remove shared memory (`ferromq shm list`, `ferromq shm clean --stale`).
    Shm {
        #[command(subcommand)]
        command: ShmCommand,
    },
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
            run_device(kind.create(), &options, &builtin.properties())
        }
        Command::Shm { command } => shm_command::run(&command),
    }
}
