//! Log output: tracing events as FairMQ-like lines, prefixed with the device id.
//!
//! `--verbosity` picks the line format (FairMQ's names), `--severity` the lowest level shown
//! (`RUST_LOG` overrides it with a full filter), `--color` the ANSI colours.
//!
//! | verbosity | line |
//! |---|---|
//! | `low` | `[INFO] message` |
//! | `medium` | `[12:01:02][INFO][sampler1] message` |
//! | `high` | `[12:01:02.123456][INFO][sampler1] message fields` |
//! | `veryhigh` | as high, plus the module that logged |

use std::fmt;
use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// Lowest level logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Severity {
    /// Everything, per message.
    Trace,
    /// Resources created and destroyed.
    Debug,
    /// States, bound addresses, rates.
    Info,
    /// Recovered problems.
    Warn,
    /// Failures only.
    Error,
}

impl Severity {
    fn directive(self) -> &'static str {
        match self {
            Severity::Trace => "trace",
            Severity::Debug => "debug",
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }
}

/// How much each log line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Verbosity {
    /// Level and message.
    Low,
    /// Time, level, device id, message.
    Medium,
    /// Microsecond time and structured fields too.
    High,
    /// And the module that logged.
    Veryhigh,
}

/// Whether to colour log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Color {
    /// When standard output is a terminal.
    Auto,
    /// Always.
    True,
    /// Never.
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

struct StdoutLines;

struct LineWriter(std::io::Stdout);

impl std::io::Write for LineWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self.0.write(bytes) {
            // A reader that went away (`| head`) is not the device's problem.
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(bytes.len()),
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl<'a> MakeWriter<'a> for StdoutLines {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(std::io::stdout())
    }
}

/// Installs the log subscriber for a process running device `device_id` (or a launcher).
pub fn init(device_id: &str, severity: Severity, verbosity: Verbosity, color: Color) {
    let ansi = match color {
        Color::Auto => std::io::stdout().is_terminal(),
        Color::True => true,
        Color::False => false,
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(severity.directive()));
    let format = LineFormat {
        device_id: device_id.to_owned(),
        verbosity,
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
        .with_writer(StdoutLines)
        .with_ansi(ansi)
        .fmt_fields(fields)
        .event_format(format)
        .try_init();
}
