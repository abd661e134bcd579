//! The `ferromq` command line, and the same option handling for your own device binaries.
//!
//! `ferromq device KIND --id ID --channel-config ...` runs a built-in device with FairMQ's option
//! names; [`run_device_main`] gives a user's device binary exactly those options:
//!
//! ```no_run
//! use ferromq_core::BoxError;
//! use ferromq_device::{Device, DeviceContext};
//!
//! struct MyDevice;
//!
//! #[ferromq_device::async_trait]
//! impl Device for MyDevice {
//!     async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
//!         while ctx.next_iteration() {
//!             let message = ctx.receive("data").await?;
//!             println!("{} bytes", message.len());
//!         }
//!         Ok(())
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     ferromq_cli::run_device_main(|_options| MyDevice)
//! }
//! ```
//!
//! Only this crate knows clap and the terminal; everything it runs lives in the libraries below.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod config_file;
mod console;
pub mod interactive;
pub mod launch;
pub mod logging;
pub mod metrics_endpoint;
pub mod options;
pub mod record_command;
pub mod rpc_bench;
mod run;
pub mod session_dir;
pub mod shm_command;
pub mod signals;
pub mod top_command;
pub mod transports;

use std::process::ExitCode;

use clap::Parser;
use ferromq_device::Device;

pub use options::{BuiltinOptions, ControlMode, DeviceOptions};
pub use run::{run_builtin_device, run_device};
pub use signals::Signals;
pub use transports::built_in_transports;

#[derive(Parser)]
#[command(about = "A ferromq device", version)]
struct StandaloneDevice {
    #[command(flatten)]
    options: DeviceOptions,
}

/// Runs `work` to completion on a tokio runtime of `worker_threads` threads (1: a current-thread
/// runtime, on which zmq.rs is 32-37% faster for small messages) and returns its exit code.
pub fn block_on(
    worker_threads: usize,
    work: impl std::future::Future<Output = ExitCode>,
) -> ExitCode {
    let runtime = if worker_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads)
            .enable_all()
            .build()
    };
    match runtime {
        Ok(runtime) => runtime.block_on(work),
        Err(error) => {
            eprintln!("ferromq: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `main` for a user's device binary: parses FairMQ's device options from the command line,
/// builds the device with `make`, runs it, and returns the exit code.
pub fn run_device_main<D: Device>(make: impl FnOnce(&DeviceOptions) -> D) -> ExitCode {
    // A device of a shmem session may re-execute this binary as the session's watchdog.
    ferromq_shm::run_watchdog_if_requested();
    let parsed = StandaloneDevice::parse();
    if let Err(error) = parsed.options.prepare_logging() {
        eprintln!("ferromq: {error:#}");
        return ExitCode::from(2);
    }
    if parsed.options.print_channels == Some(true) {
        return match parsed.options.configured_channel_lines() {
            Ok(lines) => {
                lines.iter().for_each(|line| println!("{line}"));
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("ferromq: {error:#}");
                ExitCode::from(2)
            }
        };
    }
    let device = make(&parsed.options);
    run_device(device, &parsed.options, &[])
}
