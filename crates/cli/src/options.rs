//! FairMQ's device options, and how they become a [`DeviceConfig`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use ferromq_core::{ChannelConfig, Method};
use ferromq_device::DeviceConfig;

use crate::logging::{Color, Severity, Verbosity};

/// How the device's state machine is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ControlMode {
    /// Straight to RUNNING; down and out when the work ends (`--max-iterations`) or on a signal.
    Static,
    /// Single keys on the terminal (`h` for help); falls back to static without a terminal.
    Interactive,
    /// Requests over the control endpoint (`--control-address`), as `ferromq run` does.
    External,
}

pub use ferromq_core::MAX_SECONDS;

/// clap's parser for a number of seconds: finite, at least [`MIN_SECONDS`] (a nanosecond, the
/// finest time a [`std::time::Duration`] keeps: `--duration 1e-320` was taken, and became no
/// time at all), at most [`MAX_SECONDS`].
///
/// # Errors
/// The text and what was expected.
pub fn seconds(text: &str) -> Result<f64, String> {
    let value = positive_number(text, "seconds", MAX_SECONDS)?;
    if value < MIN_SECONDS {
        return Err(format!(
            "{text}: expected at least {MIN_SECONDS:e} seconds (a nanosecond)"
        ));
    }
    Ok(value)
}

/// The shortest time [`seconds`] takes: one nanosecond.
pub const MIN_SECONDS: f64 = 1e-9;

/// clap's parser for one host of `--hosts a,b`: a name, not empty (`a,,b` reached ssh as
/// the host "") and without spaces.
///
/// # Errors
/// The text and what was expected.
pub fn host_name(text: &str) -> Result<String, String> {
    // Not `-...`: a host name is an ssh destination, which ssh would read as an option.
    if text.is_empty()
        || text.starts_with('-')
        || text.contains(|c: char| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{text:?}: expected a host name (hosts are separated by one comma)"
        ));
    }
    Ok(text.to_owned())
}

/// clap's parser for a session id (`--session`): not empty (`--session=` ran in a session
/// called "default", and `shm clean --session ''` cleaned that one) and without control
/// characters (a newline split the lines a launcher reads of its devices).
///
/// # Errors
/// The text and what was expected.
pub fn session_id(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains(char::is_control) {
        return Err(format!(
            "{text:?}: expected a session id (not empty, no control characters)"
        ));
    }
    Ok(text.to_owned())
}

/// The shortest measurement `ferromq bench` and `ferromq bench rpc` take: shorter, a run
/// measures its own start and stop (`--duration 1e-9` reported 4e11 messages a second).
pub const MIN_BENCH_SECONDS: f64 = 0.1;

/// clap's parser for a benchmark's `--duration`: [`seconds`], at least [`MIN_BENCH_SECONDS`].
///
/// # Errors
/// The text and what was expected.
pub fn bench_seconds(text: &str) -> Result<f64, String> {
    measured_seconds(text, "a measurement that short measures its own start")
}

/// [`seconds`] a measurement takes, at least [`MIN_BENCH_SECONDS`]; `shorter` says what a
/// shorter time would measure instead.
///
/// # Errors
/// The text, `shorter` and the minimum.
pub fn measured_seconds(text: &str, shorter: &str) -> Result<f64, String> {
    // Its own minimum says more than `seconds`' nanosecond does.
    let value = positive_number(text, "seconds", MAX_SECONDS)?;
    if value < MIN_BENCH_SECONDS {
        return Err(format!(
            "{text:?}: {shorter}; expected at least {MIN_BENCH_SECONDS} seconds"
        ));
    }
    Ok(value)
}

/// The most calls per second `ferromq bench rpc --light-load-rate` accepts: above any rate one
/// caller reaches (a call costs tens of nanoseconds at the least), so only a mistyped rate is
/// refused.
pub const MAX_CALLS_PER_SECOND: f64 = 1e9;

/// The lowest rate `ferromq bench rpc --light-load-rate` accepts: its light load lasts half a
/// second, so a lower rate makes fewer than 5 calls to take a median of (`1e-300` made one).
pub const MIN_CALLS_PER_SECOND: f64 = 10.0;

/// clap's parser for a rate of calls: finite, at least [`MIN_CALLS_PER_SECOND`], at most
/// [`MAX_CALLS_PER_SECOND`].
///
/// # Errors
/// The text and what was expected.
pub fn calls_per_second(text: &str) -> Result<f64, String> {
    let value = positive_number(text, "calls per second", MAX_CALLS_PER_SECOND)?;
    if value < MIN_CALLS_PER_SECOND {
        return Err(format!(
            "{text}: expected at least {MIN_CALLS_PER_SECOND} calls per second (the light load \
             lasts 0.5 s: fewer calls give no median)"
        ));
    }
    Ok(value)
}

/// A number of `unit`s in `text`, finite, above 0 and at most `max`.
fn positive_number(text: &str, unit: &str, max: f64) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of {unit}"))?;
    if value.is_finite() && value > 0.0 && value <= max {
        Ok(value)
    } else {
        Err(format!(
            "{text}: expected a number of {unit} above 0 and at most {max:e}"
        ))
    }
}

/// clap's parser for messages per second: 0 (unlimited) or finite and at least
/// [`ferromq_devices::MIN_RATE`].
pub fn messages_per_second(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of messages per second"))?;
    ferromq_devices::check_rate(value)
}

/// A `--rate-burst-ms` value (clap's parser): a whole number of ms, 0 to 1000
/// ([`ferromq_devices::check_rate_burst_ms`]).
///
/// # Errors
/// The text and what was expected.
pub fn rate_burst_ms(text: &str) -> Result<u64, String> {
    let value: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of milliseconds"))?;
    ferromq_devices::check_rate_burst_ms(value).map(|_| value)
}

fn boolish() -> clap::builder::BoolishValueParser {
    clap::builder::BoolishValueParser::new()
}

/// The options every device takes, with FairMQ's names (FairMQ 1.10's device, control-plugin
/// and logging options; see the crate docs for what each one does here).
#[derive(Debug, Clone, Args)]
pub struct DeviceOptions {
    /// Device id, unique in a topology.
    #[arg(long)]
    pub id: String,
    /// Default transport of the device's channels.
    #[arg(long, default_value = "zeromq")]
    pub transport: String,
    /// A channel: name=data,type=push,method=bind,address=tcp://*:5555[,rateLogging=1,...].
    #[arg(long = "channel-config", value_name = "KEY=VALUE,...")]
    pub channel_config: Vec<String>,
    /// FairMQ JSON channel configuration; the entry whose id (or key) is --config-key or --id is
    /// used. A channel also given with --channel-config is taken from the command line.
    #[arg(long = "mq-config", value_name = "FILE")]
    pub mq_config: Option<PathBuf>,
    /// The device entry of --mq-config to use, instead of --id.
    #[arg(long = "config-key", value_name = "KEY")]
    pub config_key: Option<String>,
    /// Session id: devices of one session share transport resources.
    #[arg(long, default_value = "default", value_parser = session_id)]
    pub session: String,
    /// How the state machine is driven.
    #[arg(long, value_enum, default_value = "interactive")]
    pub control: ControlMode,
    /// Address of the external control endpoint (with --control external), e.g. ipc:///tmp/x.
    #[arg(long = "control-address", value_name = "ADDRESS")]
    pub control_address: Option<String>,
    /// Leave RUNNING after N iterations after the first (N + 1 in all, as FairMQ counts); 0 = never.
    #[arg(long = "max-iterations", default_value_t = 0)]
    pub max_iterations: u64,
    /// Messages per second for senders; 0 = unlimited.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub rate: f64,
    /// Lowest log level shown on the console (RUST_LOG overrides): FairLogger's names.
    #[arg(long, value_enum, default_value = "info")]
    pub severity: Severity,
    /// Lowest log level written to --log-to-file [default: debug].
    #[arg(long = "file-severity", value_enum)]
    pub file_severity: Option<Severity>,
    /// Colour log lines.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: Color,
    /// How much each log line says: FairLogger's names.
    #[arg(long, value_enum, default_value = "medium")]
    pub verbosity: Verbosity,
    /// Serve Prometheus metrics (channel counters, state) at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Push the same metrics every second to an OTLP/HTTP receiver, e.g.
    /// http://127.0.0.1:4318/v1/metrics (a binary built with the `otel` feature).
    #[arg(long = "otlp-endpoint", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Write log lines to this file instead of the console (results still go to stdout).
    #[arg(long = "log-to-file", value_name = "FILE")]
    pub log_to_file: Option<PathBuf>,
    /// Print the device's channel endpoints (`<name>:<min>:<max>`, FairMQ's format) and exit.
    #[arg(long = "print-channels", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub print_channels: Option<bool>,
    /// Network interface whose address tcp channels bind when their address names no host.
    #[arg(long = "network-interface", value_name = "NAME")]
    pub network_interface: Option<String>,
    /// Size in bytes of this device's shared-memory segment (shmem channels; FairMQ's default 2 GiB).
    #[arg(long = "shm-segment-size", value_name = "BYTES")]
    pub shm_segment_size: Option<u64>,
    /// How long a shared-memory allocation waits for room before failing.
    #[arg(long = "shm-allocation-timeout-ms", value_name = "MS")]
    pub shm_allocation_timeout_ms: Option<u64>,
    /// false: a shared-memory allocation waits for room as long as it takes, retrying every
    /// --bad-alloc-attempt-interval; true: the first failed attempt is an error.
    #[arg(long = "shm-throw-bad-alloc", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub shm_throw_bad_alloc: Option<bool>,
    /// Allocation attempts before an error (-1: no limit), --bad-alloc-attempt-interval apart.
    #[arg(long = "bad-alloc-max-attempts", allow_negative_numbers = true)]
    pub bad_alloc_max_attempts: Option<i64>,
    /// Milliseconds between allocation attempts when the segment is full.
    #[arg(long = "bad-alloc-attempt-interval", value_name = "MS")]
    pub bad_alloc_attempt_interval: Option<u64>,
    /// Lock this device's shared-memory segment into memory when it is created, and every
    /// peer's segment when it is mapped (mlock: no page faulted in at first use, none swapped
    /// out; needs `ulimit -l` or the CAP_IPC_LOCK capability).
    #[arg(long = "shm-mlock-segment", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub shm_mlock_segment: Option<bool>,
    /// Lock only this device's own segment into memory, when it is created.
    #[arg(long = "shm-mlock-segment-on-creation", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub shm_mlock_segment_on_creation: Option<bool>,
    /// Write zeros over this device's segment when it is created: every page is allocated
    /// then, not at its first use (a peer's segment is never written).
    #[arg(long = "shm-zero-segment", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub shm_zero_segment: Option<bool>,
    /// As --shm-zero-segment (ferromq creates every segment it zeroes).
    #[arg(long = "shm-zero-segment-on-creation", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub shm_zero_segment_on_creation: Option<bool>,
    /// Any device property, KEY=VALUE (repeatable); one that contradicts an option given
    /// (--verify false --property verify=true), or itself, is refused.
    #[arg(long = "property", value_name = "KEY=VALUE")]
    pub properties: Vec<String>,
    /// FairMQ options that have no effect here: accepted (so FairMQ's scripts run) with a warning.
    #[command(flatten)]
    pub ignored: IgnoredOptions,
    /// More options to name in the warning about ignored options (a device's own).
    #[arg(skip)]
    pub also_ignored: Vec<&'static str>,
}

/// FairMQ's device options that mean nothing in ferromq. Each one given is accepted and named
/// in one warning, so that a FairMQ script runs unchanged and still learns what is not done.
#[derive(Debug, Clone, Default, Args)]
pub struct IgnoredOptions {
    /// (FairMQ) I/O threads of libzmq; ferromq's sockets run on the device's async runtime.
    #[arg(long = "io-threads", hide = true, allow_negative_numbers = true)]
    pub io_threads: Option<i64>,
    /// (FairMQ) timeout of dynamic initialization; ferromq has none.
    #[arg(long = "init-timeout", hide = true, allow_negative_numbers = true)]
    pub init_timeout: Option<i64>,
    /// (FairMQ) boost's allocation algorithm; ferromq has its own allocator.
    #[arg(long = "shm-allocation", hide = true)]
    pub shm_allocation: Option<String>,
    /// (FairMQ) segment id for message creation.
    #[arg(long = "shm-segment-id", hide = true)]
    pub shm_segment_id: Option<u64>,
    /// (FairMQ) fixed shmid; ferromq names its objects after user and session.
    #[arg(long = "shmid", hide = true)]
    pub shmid: Option<u64>,
    /// (FairMQ) the shm monitor daemon; ferromq's session watchdog always runs.
    #[arg(long = "shm-monitor", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub shm_monitor: Option<bool>,
    /// (FairMQ) keep the memory when the last device leaves.
    #[arg(long = "shm-no-cleanup", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub shm_no_cleanup: Option<bool>,
    /// (FairMQ) size of shm metadata messages.
    #[arg(long = "shm-metadata-msg-size", hide = true)]
    pub shm_metadata_msg_size: Option<u64>,
    /// (FairMQ) OFI allocator size hint.
    #[arg(long = "ofi-size-hint", hide = true)]
    pub ofi_size_hint: Option<u64>,
    /// (FairMQ) signal handling on/off; ferromq always takes SIGINT/SIGTERM down cleanly.
    #[arg(long = "catch-signals", hide = true, allow_negative_numbers = true)]
    pub catch_signals: Option<i64>,
    /// (FairMQ) print the options in machine-readable form.
    #[arg(long = "print-options", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub print_options: Option<bool>,
    /// (FairMQ) plugins to load; ferromq has none.
    #[arg(long = "plugin", short = 'P', hide = true)]
    pub plugin: Vec<String>,
    /// (FairMQ) where plugins are searched.
    #[arg(long = "plugin-search-path", short = 'S', hide = true)]
    pub plugin_search_path: Vec<String>,
}

impl IgnoredOptions {
    /// The names of the options given.
    pub fn given(&self) -> Vec<&'static str> {
        let flags = [
            ("--io-threads", self.io_threads.is_some()),
            ("--init-timeout", self.init_timeout.is_some()),
            ("--shm-allocation", self.shm_allocation.is_some()),
            ("--shm-segment-id", self.shm_segment_id.is_some()),
            ("--shmid", self.shmid.is_some()),
            ("--shm-monitor", self.shm_monitor.is_some()),
            ("--shm-no-cleanup", self.shm_no_cleanup.is_some()),
            (
                "--shm-metadata-msg-size",
                self.shm_metadata_msg_size.is_some(),
            ),
            ("--ofi-size-hint", self.ofi_size_hint.is_some()),
            ("--catch-signals", self.catch_signals.is_some()),
            ("--print-options", self.print_options.is_some()),
            ("--plugin", !self.plugin.is_empty()),
            ("--plugin-search-path", !self.plugin_search_path.is_empty()),
        ];
        flags
            .into_iter()
            .filter_map(|(name, given)| given.then_some(name))
            .collect()
    }
}

/// Options of the built-in devices; each one given becomes a property of the same name.
#[derive(Debug, Clone, Default, Args)]
pub struct BuiltinOptions {
    /// Message size in bytes (sampler, bsampler, client).
    #[arg(long = "msg-size")]
    pub msg_size: Option<usize>,
    /// Send this text instead of generated bytes (sampler).
    #[arg(long)]
    pub text: Option<String>,
    /// Send this file's contents (sampler).
    #[arg(long = "payload-file", value_name = "FILE")]
    pub payload_file: Option<PathBuf>,
    /// Parts per message (bsampler; FairMQ sends them only with --multipart).
    #[arg(long = "num-parts")]
    pub num_parts: Option<usize>,
    /// Send --num-parts parts per message (bsampler); receivers always take whole messages.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub multipart: Option<bool>,
    /// Zero every byte of each message before sending it (bsampler; the sampler writes every
    /// byte anyway).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub memset: Option<bool>,
    /// Send one buffer over and over (bsampler).
    #[arg(long = "same-msg", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub same_msg: Option<bool>,
    /// Messages per second (bsampler; same as --rate).
    #[arg(long = "msg-rate", allow_negative_numbers = true)]
    pub msg_rate: Option<f64>,
    /// How long ahead of their due time paced messages may leave together, in ms (sampler,
    /// bsampler; 0 to 1000, default 5 as FairMQ's rate limiter): longer bursts wake the
    /// sender and its receiver less often.
    #[arg(long = "rate-burst-ms", value_name = "MS", value_parser = rate_burst_ms)]
    pub rate_burst_ms: Option<u64>,
    /// (FairMQ bsampler) message alignment; accepted, with a warning: buffers are 8-byte aligned.
    #[arg(long = "msg-alignment", hide = true)]
    pub msg_alignment: Option<u64>,
    /// Put a checksum in the first 8 bytes of each message (sampler; default true).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub checksum: Option<bool>,
    /// Verify each message's checksum (sink).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub verify: Option<bool>,
    /// Write every message received to this file (sink; FairMQ's option).
    #[arg(long = "out-filename", value_name = "FILE")]
    pub out_filename: Option<PathBuf>,
    /// Stop writing --out-filename (and running) after this many bytes; 0 = unlimited (sink).
    #[arg(long = "max-file-size", value_name = "BYTES")]
    pub max_file_size: Option<u64>,
    /// Read every byte of each message (processor).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub touch: Option<bool>,
    /// Name of the input channel.
    #[arg(long = "in-channel")]
    pub in_channel: Option<String>,
    /// Name of the output channel.
    #[arg(long = "out-channel")]
    pub out_channel: Option<String>,
    /// round-robin or key (splitter).
    #[arg(long)]
    pub routing: Option<String>,
}

impl BuiltinOptions {
    /// The options given, as properties.
    pub fn properties(&self) -> Vec<(&'static str, String)> {
        let text = |value: &Option<String>| value.clone();
        let path = |value: &Option<PathBuf>| value.as_ref().map(|path| path.display().to_string());
        [
            ("msg-size", self.msg_size.map(|value| value.to_string())),
            ("text", text(&self.text)),
            ("payload-file", path(&self.payload_file)),
            ("num-parts", self.num_parts.map(|value| value.to_string())),
            ("multipart", self.multipart.map(|value| value.to_string())),
            ("memset", self.memset.map(|value| value.to_string())),
            ("same-msg", self.same_msg.map(|value| value.to_string())),
            ("msg-rate", self.msg_rate.map(|value| value.to_string())),
            (
                "rate-burst-ms",
                self.rate_burst_ms.map(|value| value.to_string()),
            ),
            ("checksum", self.checksum.map(|value| value.to_string())),
            ("verify", self.verify.map(|value| value.to_string())),
            ("out-filename", path(&self.out_filename)),
            (
                "max-file-size",
                self.max_file_size.map(|value| value.to_string()),
            ),
            ("touch", self.touch.map(|value| value.to_string())),
            ("in-channel", text(&self.in_channel)),
            ("out-channel", text(&self.out_channel)),
            ("routing", text(&self.routing)),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.map(|value| (key, value)))
        .collect()
    }

    /// Checks the values that can be checked before the device starts.
    ///
    /// # Errors
    /// A usage error naming the option and the value.
    pub fn check(&self) -> Result<()> {
        if let Some(rate) = self.msg_rate {
            ferromq_devices::check_rate(rate).map_err(|problem| anyhow!("--msg-rate {problem}"))?;
        }
        if self.num_parts == Some(0) {
            bail!("--num-parts 0: expected at least 1 part");
        }
        Ok(())
    }

    /// The options given that have no effect here.
    pub fn ignored(&self) -> Vec<&'static str> {
        self.msg_alignment
            .map(|_| "--msg-alignment")
            .into_iter()
            .collect()
    }
}

impl DeviceOptions {
    /// Checks the values clap cannot: rates, sizes, the control address.
    ///
    /// # Errors
    /// A usage error naming the option and the value.
    pub fn check(&self) -> Result<()> {
        // A topology refuses an empty id too; so does FairMQ's device.
        if self.id.is_empty() {
            bail!("--id \"\": expected the device's id");
        }
        if self.id.contains(char::is_control) {
            bail!(
                "--id {:?}: expected an id without control characters",
                self.id
            );
        }
        ferromq_devices::check_rate(self.rate).map_err(|problem| anyhow!("--rate {problem}"))?;
        // The shm crate refuses a smaller segment only at INIT, naming the object, not the
        // option (and 1 was taken here while 0 was refused).
        let min_segment = ferromq_shm::segment::MIN_SEGMENT_SIZE as u64;
        if let Some(size) = self.shm_segment_size
            && size < min_segment
        {
            bail!("--shm-segment-size {size}: expected at least {min_segment} bytes");
        }
        if let Some(size) = self.shm_segment_size
            && usize::try_from(size).is_err()
        {
            bail!("--shm-segment-size {size}: larger than this machine's address space");
        }
        if let Some(attempts) = self.bad_alloc_max_attempts
            && attempts < -1
        {
            bail!(
                "--bad-alloc-max-attempts {attempts}: expected -1 (no limit) or a number of attempts"
            );
        }
        if self.control == ControlMode::External && self.control_address.is_none() {
            bail!(
                "--control external needs --control-address (e.g. ipc:///tmp/{}.control)",
                self.id
            );
        }
        // Taken and then ignored otherwise: nothing would ever bind it.
        if let Some(address) = &self.control_address
            && self.control != ControlMode::External
        {
            let mode = self
                .control
                .to_possible_value()
                .map_or_else(String::new, |value| value.get_name().to_owned());
            bail!(
                "--control-address {address:?}: only --control external reads it (this device has --control {mode})"
            );
        }
        // Refused now, naming the option: a control endpoint that cannot bind used to leave
        // the device in IDLE with nothing to control it.
        if let Some(address) = &self.control_address {
            match ferromq_core::Address::parse(address) {
                Ok(
                    ferromq_core::Address::Tcp { .. }
                    | ferromq_core::Address::Ipc { .. }
                    | ferromq_core::Address::Inproc { .. },
                ) => {}
                Ok(other) => bail!(
                    "--control-address {address:?}: the control endpoint is a zeromq socket: expected tcp://, ipc:// or inproc://, not {other}"
                ),
                Err(error) => bail!("--control-address {address:?}: {error}"),
            }
        }
        Ok(())
    }

    /// The FairMQ options given that have no effect here, for one warning.
    pub fn ignored(&self) -> Vec<&'static str> {
        let mut names = self.ignored.given();
        names.extend(self.also_ignored.iter().copied());
        names
    }

    /// What has to happen before the device's log subscriber is installed: `--log-to-file`.
    ///
    /// # Errors
    /// A usage error when the log file cannot be opened.
    pub fn prepare_logging(&self) -> Result<()> {
        if let Some(path) = &self.log_to_file {
            crate::logging::log_to_file(path, self.file_severity.unwrap_or(Severity::Debug))
                .with_context(|| format!("--log-to-file {}", path.display()))?;
        }
        Ok(())
    }

    /// `--print-channels` for a device that registers no endpoints of its own: the configured
    /// channels in FairMQ's `<name>:<min>:<max>` form, or FairMQ's "no channels registered.".
    ///
    /// # Errors
    /// As [`DeviceOptions::device_config`].
    pub fn configured_channel_lines(&self) -> Result<Vec<String>> {
        let config = self.device_config(&[])?;
        let mut counts: Vec<(String, usize)> = Vec::new();
        for socket in &config.sockets {
            match counts
                .iter_mut()
                .find(|(name, _)| *name == socket.config.name)
            {
                Some((_, n_sockets)) => *n_sockets += 1,
                None => counts.push((socket.config.name.clone(), 1)),
            }
        }
        if counts.is_empty() {
            return Ok(vec!["no channels registered.".to_owned()]);
        }
        Ok(counts
            .into_iter()
            .map(|(name, n_sockets)| format!("{name}:{n_sockets}:{n_sockets}"))
            .collect())
    }

    /// The shared-memory properties these options set (`shm-segment-size`,
    /// `shm-allocation-timeout-ms`, `shm-allocation-retry-ms`, FairMQ's `shm-mlock-segment`
    /// and `shm-zero-segment` with their `-on-creation` forms), FairMQ's allocation policy
    /// included: `--shm-throw-bad-alloc false` waits as long as it takes, `--bad-alloc-max-attempts`
    /// waits that many `--bad-alloc-attempt-interval`s.
    pub fn shm_properties(&self) -> Vec<(&'static str, String)> {
        let mut properties = Vec::new();
        if let Some(size) = self.shm_segment_size {
            properties.push(("shm-segment-size", size.to_string()));
        }
        let interval_ms = self.bad_alloc_attempt_interval;
        if let Some(interval_ms) = interval_ms {
            properties.push(("shm-allocation-retry-ms", interval_ms.to_string()));
        }
        let timeout_ms = match (self.shm_throw_bad_alloc, self.bad_alloc_max_attempts) {
            // FairMQ: an explicit `false` overrides every other setting.
            (Some(false), _) | (_, Some(-1)) => Some(u64::MAX),
            (_, Some(attempts)) => Some(
                interval_ms
                    .unwrap_or(FAIRMQ_ATTEMPT_INTERVAL_MS)
                    .saturating_mul(attempts.max(1).unsigned_abs() - 1),
            ),
            (Some(true), None) => Some(0),
            (None, None) => None,
        };
        // The explicit timeout wins over the policy derived from FairMQ's options.
        if let Some(timeout_ms) = self.shm_allocation_timeout_ms.or(timeout_ms) {
            properties.push(("shm-allocation-timeout-ms", timeout_ms.to_string()));
        }
        let flags = [
            ("shm-mlock-segment", self.shm_mlock_segment),
            (
                "shm-mlock-segment-on-creation",
                self.shm_mlock_segment_on_creation,
            ),
            ("shm-zero-segment", self.shm_zero_segment),
            (
                "shm-zero-segment-on-creation",
                self.shm_zero_segment_on_creation,
            ),
        ];
        for (key, flag) in flags {
            if let Some(flag) = flag {
                properties.push((key, flag.to_string()));
            }
        }
        properties
    }

    /// The device configuration these options describe.
    ///
    /// # Errors
    /// A message naming the option, channel or file that is wrong.
    pub fn device_config(&self, extra_properties: &[(&str, String)]) -> Result<DeviceConfig> {
        self.check()?;
        let ignored = self.ignored();
        if !ignored.is_empty() {
            tracing::warn!(
                "FairMQ option(s) {} have no effect in ferromq and are ignored",
                ignored.join(", ")
            );
        }
        if let (Some(severity), None) = (self.file_severity, &self.log_to_file) {
            tracing::warn!(
                "--file-severity {} has no effect without --log-to-file (no log file is written)",
                severity
                    .to_possible_value()
                    .map_or_else(String::new, |value| value.get_name().to_owned())
            );
        }
        let mut config = DeviceConfig::new(&self.id);
        config.session.clone_from(&self.session);
        config.transport.clone_from(&self.transport);
        config.max_iterations = self.max_iterations;
        for text in &self.channel_config {
            // FairMQ's repeated `address=`: one socket per address.
            let mut sockets = ChannelConfig::parse_key_values_sockets(text)
                .with_context(|| format!("--channel-config {text:?}"))?;
            for socket in &mut sockets {
                self.apply_network_interface(socket)?;
            }
            config
                .add_channel_sockets(sockets)
                .with_context(|| format!("--channel-config {text:?}"))?;
        }
        if let Some(path) = &self.mq_config {
            let json = crate::config_file::read_config(path, "--mq-config")?;
            let key = self.config_key.as_deref().unwrap_or(&self.id);
            let n_before = config.sockets.len();
            config.add_mq_config_for(&path.display().to_string(), &json, key)?;
            for socket in &mut config.sockets[n_before..] {
                self.apply_network_interface(&mut socket.config)?;
            }
        }
        config
            .properties
            .insert("rate".to_owned(), self.rate.to_string());
        // What the options set, and which option set it: a `--property` of the same key with
        // another value was taken over it without a word, and one key given twice kept the
        // last value.
        let mut from_options: BTreeMap<String, String> = BTreeMap::new();
        for (key, value) in self.shm_properties() {
            from_options.insert(key.to_owned(), shm_property_options(key));
            config.properties.insert(key.to_owned(), value);
        }
        for (key, value) in extra_properties {
            // The built-in devices' options, given on the command line; not what a caller
            // sets otherwise (`ferromq replay`'s recording and its `--speed`, which has a
            // default: a `--property` of those goes on taking precedence).
            if BUILTIN_OPTION_KEYS.contains(key) {
                from_options.insert((*key).to_owned(), format!("--{key}"));
            }
            config.properties.insert((*key).to_owned(), value.clone());
        }
        let mut given: BTreeMap<&str, &str> = BTreeMap::new();
        for pair in &self.properties {
            let Some((key, value)) = pair.split_once('=') else {
                bail!("--property {pair:?} is not KEY=VALUE");
            };
            if let Some(earlier) = given.insert(key, value)
                && !same_value(earlier, value)
            {
                bail!(
                    "--property {key}={value}: {key} is given twice, first as {earlier:?}: give it once"
                );
            }
            if let (Some(option), Some(set)) = (from_options.get(key), config.properties.get(key))
                && !same_value(set, value)
            {
                bail!(
                    "--property {key}={value} contradicts {option}, which sets {key} to {set:?}: give one of the two"
                );
            }
            config.properties.insert(key.to_owned(), value.to_owned());
        }
        // Unknown transports are refused now, naming the channel, not in the middle of INIT.
        let transport_names = std::iter::once(config.transport.clone()).chain(
            config
                .sockets
                .iter()
                .filter_map(|socket| socket.config.transport.clone()),
        );
        let transports = crate::built_in_transports();
        for name in transport_names {
            transports
                .traits(&name)
                .with_context(|| format!("device {:?}", config.id))?;
        }
        Ok(config)
    }

    /// With `--network-interface NAME`, a binding tcp channel without an address binds NAME's
    /// first IPv4 address (port 0, or autoBind's choice), as FairMQ does.
    fn apply_network_interface(&self, channel: &mut ChannelConfig) -> Result<()> {
        let Some(interface) = self.network_interface.as_deref() else {
            return Ok(());
        };
        if interface == "default" || channel.method != Method::Bind || channel.address.is_some() {
            return Ok(());
        }
        let ip = interface_address(interface)?;
        channel.address = Some(format!("tcp://{ip}:0"));
        Ok(())
    }
}

/// The keys of [`BuiltinOptions::properties`]: each is the name of the option that sets it.
const BUILTIN_OPTION_KEYS: [&str; 17] = [
    "msg-size",
    "text",
    "payload-file",
    "num-parts",
    "multipart",
    "memset",
    "same-msg",
    "msg-rate",
    "rate-burst-ms",
    "checksum",
    "verify",
    "out-filename",
    "max-file-size",
    "touch",
    "in-channel",
    "out-channel",
    "routing",
];

/// Whether two values of a property say the same: the same text, the same truth (`yes` and
/// `true`, as the devices read a flag) or the same number (`2` and `2.0`).
fn same_value(a: &str, b: &str) -> bool {
    let truth = ferromq_devices::flag_value;
    let number = |text: &str| text.trim().parse::<f64>().ok();
    a == b
        || truth(a).is_some_and(|a| truth(b) == Some(a))
        || number(a).is_some_and(|a| number(b) == Some(a))
}

/// The options that set shared-memory property `key` ([`DeviceOptions::shm_properties`]): the
/// option of the same name, but for the two FairMQ's allocation options set.
fn shm_property_options(key: &str) -> String {
    match key {
        "shm-allocation-retry-ms" => "--bad-alloc-attempt-interval".to_owned(),
        "shm-allocation-timeout-ms" => {
            "--shm-allocation-timeout-ms (or --shm-throw-bad-alloc, --bad-alloc-max-attempts)"
                .to_owned()
        }
        _ => format!("--{key}"),
    }
}

/// FairMQ's default `--bad-alloc-attempt-interval`.
const FAIRMQ_ATTEMPT_INTERVAL_MS: u64 = 50;

/// The first IPv4 address of network interface `name`.
fn interface_address(name: &str) -> Result<std::net::Ipv4Addr> {
    let addresses = nix::ifaddrs::getifaddrs()
        .with_context(|| format!("--network-interface {name:?}: cannot list interfaces"))?;
    let mut names = Vec::new();
    for interface in addresses {
        if !names.contains(&interface.interface_name) {
            names.push(interface.interface_name.clone());
        }
        if interface.interface_name != name {
            continue;
        }
        if let Some(ip) = interface
            .address
            .as_ref()
            .and_then(|address| address.as_sockaddr_in())
        {
            return Ok(ip.ip());
        }
    }
    bail!(
        "--network-interface {name:?}: no such interface with an IPv4 address (interfaces: {})",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        options: DeviceOptions,
    }

    fn options(args: &[&str]) -> DeviceOptions {
        Wrapper::try_parse_from([&["device", "--id", "d"][..], args].concat())
            .unwrap()
            .options
    }

    fn check_shm(args: &[&str], expected: &[(&str, &str)]) {
        let properties = options(args).shm_properties();
        let properties: Vec<(&str, &str)> = properties
            .iter()
            .map(|(key, value)| (*key, value.as_str()))
            .collect();
        assert_eq!(properties, expected, "{args:?}");
    }

    #[test]
    fn fairmqs_allocation_options_become_the_shmem_wait_policy() {
        check_shm(&[], &[]);
        check_shm(
            &["--shm-segment-size", "1048576"],
            &[("shm-segment-size", "1048576")],
        );
        let forever = u64::MAX.to_string();
        check_shm(
            &[
                "--shm-throw-bad-alloc",
                "false",
                "--bad-alloc-attempt-interval",
                "7",
            ],
            &[
                ("shm-allocation-retry-ms", "7"),
                ("shm-allocation-timeout-ms", &forever),
            ],
        );
        check_shm(
            &["--bad-alloc-max-attempts", "-1"],
            &[("shm-allocation-timeout-ms", &forever)],
        );
        // Four attempts, 50 ms (FairMQ's default interval) apart.
        check_shm(
            &["--bad-alloc-max-attempts", "4"],
            &[("shm-allocation-timeout-ms", "150")],
        );
        check_shm(
            &["--shm-throw-bad-alloc", "true"],
            &[("shm-allocation-timeout-ms", "0")],
        );
        // ferromq's own option wins over the policy derived from FairMQ's.
        check_shm(
            &[
                "--shm-throw-bad-alloc",
                "0",
                "--shm-allocation-timeout-ms",
                "20",
            ],
            &[("shm-allocation-timeout-ms", "20")],
        );
    }

    #[test]
    fn fairmqs_mlock_and_zero_segment_options_become_properties_and_are_not_ignored() {
        let args = [
            "--shm-mlock-segment",
            "--shm-mlock-segment-on-creation",
            "false",
            "--shm-zero-segment",
            "1",
            "--shm-zero-segment-on-creation",
            "no",
        ];
        check_shm(
            &args,
            &[
                ("shm-mlock-segment", "true"),
                ("shm-mlock-segment-on-creation", "false"),
                ("shm-zero-segment", "true"),
                ("shm-zero-segment-on-creation", "false"),
            ],
        );
        assert_eq!(options(&args).ignored(), Vec::<&str>::new());
    }

    #[test]
    fn shm_options_reach_the_device_properties() {
        let config = options(&[
            "--shm-segment-size",
            "1048576",
            "--shm-allocation-timeout-ms",
            "5",
        ])
        .device_config(&[])
        .unwrap();
        assert_eq!(config.properties["shm-segment-size"], "1048576");
        assert_eq!(config.properties["shm-allocation-timeout-ms"], "5");
    }

    /// Every key the built-in devices' options set is one the conflict check knows.
    #[test]
    fn the_builtin_option_keys_are_those_the_options_set() {
        #[derive(Parser)]
        struct Builtins {
            #[command(flatten)]
            options: BuiltinOptions,
        }
        let mut args = vec!["sampler".to_owned()];
        for key in BUILTIN_OPTION_KEYS {
            args.extend([format!("--{key}"), "1".to_owned()]);
        }
        let given = Builtins::try_parse_from(args).unwrap().options.properties();
        let keys: Vec<&str> = given.iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, BUILTIN_OPTION_KEYS.to_vec());
    }

    #[test]
    fn a_property_that_contradicts_an_option_or_itself_is_refused() {
        let refused = |args: &[&str], extra: &[(&str, String)]| {
            format!("{:#}", options(args).device_config(extra).unwrap_err())
        };
        assert_eq!(
            refused(
                &["--property", "verify=true"],
                &[("verify", "false".to_owned())]
            ),
            "--property verify=true contradicts --verify, which sets verify to \"false\": give one of the two"
        );
        assert_eq!(
            refused(
                &[
                    "--shm-throw-bad-alloc",
                    "false",
                    "--property",
                    "shm-allocation-timeout-ms=5"
                ],
                &[]
            ),
            "--property shm-allocation-timeout-ms=5 contradicts --shm-allocation-timeout-ms (or \
             --shm-throw-bad-alloc, --bad-alloc-max-attempts), which sets \
             shm-allocation-timeout-ms to \"18446744073709551615\": give one of the two"
        );
        assert_eq!(
            refused(
                &["--property", "msg-size=10", "--property", "msg-size=20"],
                &[]
            ),
            "--property msg-size=20: msg-size is given twice, first as \"10\": give it once"
        );
        // Values that say the same in other words are no contradiction.
        options(&["--property", "verify=yes", "--property", "msg-size=2.0"])
            .device_config(&[("verify", "true".to_owned()), ("msg-size", "2".to_owned())])
            .unwrap();
        // What `ferromq replay` sets is not an option of `ferromq device`: a property of the
        // same key takes precedence, as before.
        let replay = options(&["--property", "speed=2"])
            .device_config(&[("speed", "1".to_owned()), ("file", "rec".to_owned())])
            .unwrap();
        assert_eq!(replay.properties["speed"], "2");
        // The same value twice says nothing new, and a property alone is taken.
        let config = options(&[
            "--property",
            "verify=true",
            "--property",
            "verify=true",
            "--property",
            "msg-size=7",
        ])
        .device_config(&[("verify", "true".to_owned())])
        .unwrap();
        assert_eq!(
            (
                &*config.properties["verify"],
                &*config.properties["msg-size"]
            ),
            ("true", "7")
        );
    }

    #[test]
    fn config_key_picks_the_mq_config_entry_and_the_command_line_wins() {
        let file = std::env::temp_dir().join(format!(
            "ferromq-options-config-key-{}.json",
            std::process::id()
        ));
        std::fs::write(
            &file,
            r#"{"fairMQOptions": {"devices": [{"key": "worker", "channels": [
                {"name": "data", "type": "push", "method": "bind", "address": "ipc:///tmp/file"},
                {"name": "log", "type": "pub", "method": "bind", "address": "ipc:///tmp/log"}]}]}}"#,
        )
        .unwrap();
        let path = file.display().to_string();
        let config = options(&[
            "--mq-config",
            &path,
            "--config-key",
            "worker",
            "--channel-config",
            "name=data,type=push,method=bind,address=ipc:///tmp/command-line",
        ])
        .device_config(&[]);
        std::fs::remove_file(&file).unwrap();
        let config = config.unwrap();
        let addresses: Vec<(&str, &str)> = config
            .sockets
            .iter()
            .map(|socket| {
                (
                    socket.name.as_str(),
                    socket.config.address.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            addresses,
            [
                ("data", "ipc:///tmp/command-line"),
                ("log", "ipc:///tmp/log")
            ]
        );
    }

    #[test]
    fn network_interface_gives_binding_channels_without_an_address_its_address() {
        let config = options(&[
            "--network-interface",
            "lo",
            "--channel-config",
            "name=a,type=push,method=bind",
            "--channel-config",
            "name=b,type=push,method=bind,address=ipc:///tmp/b",
            "--channel-config",
            "name=c,type=pull,method=connect,address=tcp://host:1",
        ])
        .device_config(&[])
        .unwrap();
        let addresses: Vec<Option<&str>> = config
            .sockets
            .iter()
            .map(|socket| socket.config.address.as_deref())
            .collect();
        assert_eq!(
            addresses,
            [
                Some("tcp://127.0.0.1:0"),
                Some("ipc:///tmp/b"),
                Some("tcp://host:1")
            ]
        );
        let error = options(&[
            "--network-interface",
            "nosuch0",
            "--channel-config",
            "name=a,type=push,method=bind",
        ])
        .device_config(&[])
        .unwrap_err();
        assert!(format!("{error:#}").contains("--network-interface \"nosuch0\""));
    }

    #[test]
    fn ignored_options_are_named() {
        let parsed = options(&["--io-threads", "4", "--shm-monitor", "-P", "x"]);
        assert_eq!(
            parsed.ignored(),
            ["--io-threads", "--shm-monitor", "--plugin"]
        );
    }
}
