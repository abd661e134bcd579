//! Log output: tracing events as FairMQ-like lines, prefixed with the device id.
//!
//! `--verbosity` picks the line format (FairMQ's names), `--severity` the lowest level shown
//! (`RUST_LOG` overrides it with a full filter), `--color` the ANSI colours.
//!
//! | verbosity | line |
//! |---|---|
//! | `verylow` | `message` |
//! | `low` | `[INFO] message` |
//! | `medium` | `[12:01:02][INFO][sampler1] message` |
//! | `high` | `[12:01:02.123456][INFO][sampler1] message fields` |
//! | `veryhigh` | as high, plus the module that logged |
//! | `user1` ... `user4` | as medium |
//!
//! `--log-to-file FILE` sends the lines to FILE (appending, no colours, from `--file-severity`)
//! instead of the console, as FairMQ does; a device's results (the sink's summary) still go to
//! standard output. A destination that refuses a line (a full disk, `/dev/full`) is named once
//! on standard error, and the lines go there from then on; the device runs on.

use std::fmt;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// Lowest level logged: FairLogger's severities, each mapped to the nearest `tracing` level.
///
/// | FairLogger | shown here from |
/// |---|---|
/// | `nolog` | nothing |
/// | `fatal`, `error` | error |
/// | `alarm`, `important`, `warn`, `warning` | warn |
/// | `state`, `info` | info (state changes are info lines here) |
/// | `detail`, `debug`, `debug1` ... `debug4` | debug |
/// | `trace` | trace |
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Severity {
    /// Everything, per message.
    Trace,
    /// FairLogger's finest debug level: debug here.
    Debug4,
    /// FairLogger's debug3: debug here.
    Debug3,
    /// FairLogger's debug2: debug here.
    Debug2,
    /// FairLogger's debug1: debug here.
    Debug1,
    /// Resources created and destroyed.
    Debug,
    /// FairLogger's detail (between debug and info): debug here.
    Detail,
    /// States, bound addresses, rates.
    Info,
    /// FairLogger's state (state changes only): info here, where state changes are info lines.
    State,
    /// Recovered problems.
    #[value(alias = "warning")]
    Warn,
    /// FairLogger's important: warn here.
    Important,
    /// FairLogger's alarm: warn here.
    Alarm,
    /// Failures only.
    Error,
    /// FairLogger's fatal: error here.
    Fatal,
    /// Nothing at all.
    Nolog,
}

impl Severity {
    fn directive(self) -> &'static str {
        match self {
            Severity::Trace => "trace",
            Severity::Debug4
            | Severity::Debug3
            | Severity::Debug2
            | Severity::Debug1
            | Severity::Debug
            | Severity::Detail => "debug",
            Severity::Info | Severity::State => "info",
            Severity::Warn | Severity::Important | Severity::Alarm => "warn",
            Severity::Error | Severity::Fatal => "error",
            Severity::Nolog => "off",
        }
    }
}

/// How much each log line says: FairLogger's verbosities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Verbosity {
    /// The message only.
    Verylow,
    /// Level and message.
    Low,
    /// Time, level, device id, message.
    Medium,
    /// Microsecond time and structured fields too.
    High,
    /// And the module that logged.
    Veryhigh,
    /// FairLogger's user-defined slot 1: as medium here.
    User1,
    /// FairLogger's user-defined slot 2: as medium here.
    User2,
    /// FairLogger's user-defined slot 3: as medium here.
    User3,
    /// FairLogger's user-defined slot 4: as medium here.
    User4,
}

impl Verbosity {
    /// The user slots have no definition here; they print as medium.
    fn effective(self) -> Verbosity {
        match self {
            Verbosity::User1 | Verbosity::User2 | Verbosity::User3 | Verbosity::User4 => {
                Verbosity::Medium
            }
            other => other,
        }
    }
}

/// Whether to colour log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Color {
    /// When standard output is a terminal.
    Auto,
    /// Always (FairMQ's spellings `1`, `yes`, `on` too).
    #[value(alias = "1", alias = "yes", alias = "on")]
    True,
    /// Never (FairMQ's spellings `0`, `no`, `off` too).
    #[value(alias = "0", alias = "no", alias = "off")]
    False,
}

struct LineFormat {
    device_id: String,
    verbosity: Verbosity,
    ansi: bool,
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        let (colour, reset) = match (self.ansi, level) {
            (false, _) => ("", ""),
            (true, Level::ERROR) => ("\x1b[31m", "\x1b[0m"),
            (true, Level::WARN) => ("\x1b[33m", "\x1b[0m"),
            (true, Level::INFO) => ("\x1b[32m", "\x1b[0m"),
            (true, _) => ("\x1b[2m", "\x1b[0m"),
        };
        if self.verbosity == Verbosity::Verylow {
            ctx.field_format().format_fields(writer.by_ref(), event)?;
            return writeln!(writer);
        }
        if self.verbosity != Verbosity::Low {
            let since_epoch = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let seconds_today = since_epoch.as_secs() % 86_400;
            let (hours, minutes, seconds) = (
                seconds_today / 3600,
                seconds_today / 60 % 60,
                seconds_today % 60,
            );
            write!(writer, "[{hours:02}:{minutes:02}:{seconds:02}")?;
            if matches!(self.verbosity, Verbosity::High | Verbosity::Veryhigh) {
                write!(writer, ".{:06}", since_epoch.subsec_micros())?;
            }
            write!(writer, "]")?;
        }
        write!(writer, "[{colour}{level}{reset}]")?;
        if self.verbosity != Verbosity::Low {
            write!(writer, "[{}]", self.device_id)?;
        }
        if self.verbosity == Verbosity::Veryhigh {
            write!(writer, "[{}]", event.metadata().target())?;
        }
        write!(writer, " ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Where log lines go: standard output, or the file of `--log-to-file`.
enum LineSink {
    Stdout,
    File(Arc<LogFile>),
}

/// The file of `--log-to-file`.
struct LogFile {
    file: Mutex<std::fs::File>,
    path: std::path::PathBuf,
}

enum LineWriter {
    Stdout(std::io::Stdout),
    File(Arc<LogFile>),
}

/// A log destination failed to take a line (a full disk, `/dev/full`, a closed descriptor):
/// from then on the lines go to standard error. Without this, `tracing-subscriber` printed an
/// error of its own for every line and the device went on as if logged.
static LOG_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes `bytes` to standard error instead of `destination`, which refused them with
/// `error`; says so (once per process) first.
fn log_to_stderr_instead(
    destination: &dyn fmt::Display,
    error: &std::io::Error,
    bytes: &[u8],
) -> std::io::Result<usize> {
    use std::io::Write as _;
    let mut stderr = std::io::stderr().lock();
    if !LOG_FAILED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let _ = writeln!(
            stderr,
            "ferromq: cannot write the log to {destination}: {error}; log lines go to standard error from now on"
        );
    }
    let _ = stderr.write_all(bytes);
    Ok(bytes.len())
}

impl std::io::Write for LineWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if LOG_FAILED.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = std::io::stderr().write_all(bytes);
            return Ok(bytes.len());
        }
        match self {
            LineWriter::Stdout(stdout) => match stdout.write(bytes) {
                // A reader that went away (`| head`) is not the device's problem.
                Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(bytes.len()),
                Err(error) => log_to_stderr_instead(&"standard output", &error, bytes),
                written => written,
            },
            LineWriter::File(log) => {
                let written = log
                    .file
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .write(bytes);
                written.or_else(|error| log_to_stderr_instead(&log.path.display(), &error, bytes))
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let flushed = match self {
            LineWriter::Stdout(stdout) => stdout.flush(),
            LineWriter::File(log) => log
                .file
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .flush(),
        };
        // A failed flush is reported by the write that follows it, if any.
        flushed.or(Ok(()))
    }
}

impl<'a> MakeWriter<'a> for LineSink {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        match self {
            LineSink::Stdout => LineWriter::Stdout(std::io::stdout()),
            LineSink::File(log) => LineWriter::File(Arc::clone(log)),
        }
    }
}

/// The file chosen by [`log_to_file`], with its severity.
static LOG_FILE: OnceLock<(Arc<LogFile>, Severity)> = OnceLock::new();

/// Makes the next [`init`] write log lines to `path` (appended) from `severity` up, instead of
/// the console: FairMQ's `--log-to-file` and `--file-severity`.
///
/// # Errors
/// When the file cannot be opened for appending.
pub fn log_to_file(path: &Path, severity: Severity) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let log = LogFile {
        file: Mutex::new(file),
        path: path.to_owned(),
    };
    let _ = LOG_FILE.set((Arc::new(log), severity));
    Ok(())
}

/// Installs the log subscriber for a process running device `device_id` (or a launcher).
pub fn init(device_id: &str, severity: Severity, verbosity: Verbosity, color: Color) {
    let (sink, severity, ansi) = match LOG_FILE.get() {
        Some((file, file_severity)) => (LineSink::File(Arc::clone(file)), *file_severity, false),
        None => {
            let ansi = match color {
                Color::Auto => std::io::stdout().is_terminal(),
                Color::True => true,
                Color::False => false,
            };
            (LineSink::Stdout, severity, ansi)
        }
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(severity.directive()));
    let format = LineFormat {
        device_id: device_id.to_owned(),
        verbosity: verbosity.effective(),
        ansi,
    };
    // A second init (tests running several devices in one process) keeps the first subscriber.
    // The message, then `key=value` for every other field; `device` is already the line's prefix.
    let fields =
        tracing_subscriber::fmt::format::debug_fn(|writer, field, value| match field.name() {
            "message" => write!(writer, "{value:?}"),
            "device" => Ok(()),
            // Lines bridged from the `log` crate carry their origin; the target is enough.
            name if name.starts_with("log.") => Ok(()),
            name => write!(writer, " {name}={value:?}"),
        });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(sink)
        .with_ansi(ansi)
        .fmt_fields(fields)
        .event_format(format)
        .try_init();
}
