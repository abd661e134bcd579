//! Reading a configuration file (a topology, FairMQ's `--mq-config` JSON) with a bound.
//!
//! Either may come from a pipe (`ferromq run <(generate-topology)`), so its size cannot be
//! asked first: the read stops one byte past [`MAX_CONFIG_BYTES`], and a file that long is
//! refused, naming it. (`ferromq validate /dev/zero` used to read until memory ran out.)

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The largest configuration file read: far beyond any topology the checks would take (at
/// most [`ferromq_topology::MAX_INSTANCES`] processes), far below what would strain memory.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of the configuration file `path`, which `what` names in errors (`--mq-config`).
///
/// # Errors
/// It cannot be opened or read, is not UTF-8, or is longer than [`MAX_CONFIG_BYTES`].
pub fn read_config(path: &Path, what: &str) -> Result<String> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("{what} {}: cannot open it", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{what} {}: cannot read it", path.display()))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        bail!(
            "{what} {}: longer than {} MiB; no configuration is that long",
            path.display(),
            MAX_CONFIG_BYTES >> 20
        );
    }
    String::from_utf8(bytes)
        .map_err(|error| anyhow::anyhow!("{what} {}: not UTF-8 text: {error}", path.display()))
}
