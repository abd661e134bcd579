//! `ferromq top [SESSION]`: the devices running on this host, live in the terminal, or one
//! snapshot as a table (`--once`) or JSON (`--json`) for scripts. See `ferromq-top`.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ferromq_top::{Observer, render};

/// What `ferromq top` was asked for.
#[derive(Debug, clap::Args)]
pub struct TopOptions {
    /// Only this session's devices (default: every session of this user).
    #[arg(value_parser = crate::options::session_id)]
    pub session: Option<String>,
    /// Print one snapshot as a plain table and exit.
    #[arg(long)]
    pub once: bool,
    /// Print one snapshot as JSON and exit (one snapshot with or without --once).
    #[arg(long)]
    pub json: bool,
    /// Seconds between refreshes; for --once and --json, the time the rates are measured over
    /// (at least 0.1).
    #[arg(long, default_value = "1", value_parser = interval)]
    pub interval: f64,
}

/// clap's parser for `--interval`: [`crate::options::measured_seconds`], for the reason a
/// benchmark's measurement has a minimum (`--interval 1e-300` printed rates "over the last 0.0
/// s").
fn interval(text: &str) -> Result<f64, String> {
    crate::options::measured_seconds(
        text,
        "rates over a time that short measure the looks themselves",
    )
}

/// Runs `ferromq top`; returns the exit code: 0, 1 when a snapshot found no device, 2 when
/// the live view has no terminal.
pub fn run(options: &TopOptions) -> ExitCode {
    let interval = Duration::from_secs_f64(options.interval);
    let session = options.session.as_deref();
    let transport: Arc<dyn ferromq_core::Transport> = Arc::new(ferromq_zmq::ZmqTransport::new());
    let mut observer = Observer::new(transport);
    // `--json` is a snapshot by itself; `--once` beside it changes nothing (README, "Watching
    // what runs").
    if options.once || options.json {
        return crate::block_on(1, async {
            // Two looks `interval` apart: the second has rates.
            let first = observer.look(session).await;
            if first.devices.is_empty() {
                return nothing_found(session);
            }
            tokio::time::sleep(interval).await;
            let snapshot = observer.look(session).await;
            if snapshot.devices.is_empty() {
                return nothing_found(session);
            }
            let text = if options.json {
                render::json(&snapshot) + "\n"
            } else {
                render::text(&snapshot)
            };
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                // A reader that has seen enough (`| head`) is no failure.
                Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("ferromq: top: cannot write the snapshot: {error}");
                    ExitCode::FAILURE
                }
                _ => ExitCode::SUCCESS,
            }
        });
    }
    if !std::io::stdout().is_terminal() {
        eprintln!(
            "ferromq: top's live view needs a terminal on standard output; use --once or --json \
             for a snapshot"
        );
        return ExitCode::from(2);
    }
    crate::block_on(1, async {
        match ferromq_top::live::run(&mut observer, session, interval).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("ferromq: top: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

fn nothing_found(session: Option<&str>) -> ExitCode {
    let which = session.map_or_else(String::new, |session| format!(" of session {session:?}"));
    eprintln!(
        "ferromq: no running device{which} found on this host (devices announce themselves in {})",
        ferromq_device::presence::directory().display()
    );
    ExitCode::FAILURE
}
