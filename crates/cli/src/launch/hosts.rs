//! Where each device runs: the launcher (`--launcher local|ssh|slurm`) turns the topology's
//! placement (`host = "name" | index | [...]`, `[hosts.NAME]`) into concrete hosts, each with
//! the address other hosts reach it at and the `ferromq` binary there.
//!
//! - `local`: every device here, whatever the file places (a file made for several hosts
//!   runs on one for a try; the launcher says so).
//! - `ssh`: a name is a `[hosts]` entry or an SSH destination; an index is a position in
//!   `--hosts`. A device without `host` (or `"localhost"`) runs here, started directly.
//! - `slurm`: inside an allocation; a name is one of its nodes, an index a position in its
//!   node list (`scontrol show hostnames`); a device without `host` runs on the first node.
//!   A node's address is its `NodeAddr` unless `[hosts.NAME] address` says otherwise.
//!
//! Placement is checked before anything starts: a channel over a transport that reaches one
//! host only (shmem) between devices on different hosts is an error naming both.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow, bail};
use ferromq_topology::{HostRef, HostSpec, Instance, Topology};

/// How `ferromq run` starts devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LauncherKind {
    /// Every device on this host, as the launcher's children.
    #[default]
    Local,
    /// Devices placed on other hosts through the OpenSSH client.
    Ssh,
    /// Devices as tasks of one `srun` step inside a Slurm allocation.
    Slurm,
}

/// A host devices run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Host {
    /// Its name as shown (`localhost`, a `[hosts]` name, a Slurm node).
    pub(super) name: String,
    /// The address other hosts and the launcher reach it at.
    pub(super) address: String,
    /// The `ferromq` binary there.
    pub(super) ferromq: String,
    /// How devices are started there.
    pub(super) start: StartOn,
}

/// How devices are started on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StartOn {
    /// As the launcher's children.
    Here,
    /// Through ssh to this destination.
    Ssh(String),
    /// As tasks of the launcher's srun step on this node of allocation `job`.
    Slurm { job: String, node: String },
}

impl Host {
    pub(super) fn is_here(&self) -> bool {
        self.start == StartOn::Here
    }
}

/// Every instance's host.
#[derive(Debug, Clone)]
pub(super) struct Placement {
    pub(super) hosts: Vec<Host>,
    /// Instance id -> index in `hosts`.
    pub(super) host_of: BTreeMap<String, usize>,
}

impl Placement {
    pub(super) fn host(&self, instance: &str) -> &Host {
        &self.hosts[self.host_of[instance]]
    }

    /// Whether any device runs elsewhere than here.
    pub(super) fn spans_hosts(&self) -> bool {
        self.hosts.iter().any(|host| !host.is_here())
    }
}

fn own_binary() -> Result<String> {
    Ok(std::env::current_exe()
        .context("cannot find the ferromq binary")?
        .display()
        .to_string())
}

fn here() -> Result<Host> {
    Ok(Host {
        name: "localhost".to_owned(),
        address: "127.0.0.1".to_owned(),
        ferromq: own_binary()?,
        start: StartOn::Here,
    })
}

/// The machine part of an SSH destination (`user@machine` -> `machine`).
fn machine_of(destination: &str) -> &str {
    destination
        .rsplit_once('@')
        .map_or(destination, |(_, machine)| machine)
}

/// Places every instance for `launcher` (see the module documentation).
///
/// # Errors
/// An index beyond the host list, a name that is not a node of the allocation, no allocation,
/// or devices joined over a one-host transport on different hosts.
pub(super) fn place(
    topology: &Topology,
    instances: &[Instance],
    launcher: LauncherKind,
    host_list: &[String],
    one_host_transports: &[&str],
) -> Result<Placement> {
    let mut hosts: Vec<Host> = Vec::new();
    let mut index_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut host_of = BTreeMap::new();
    let slurm = match launcher {
        LauncherKind::Slurm => Some(SlurmAllocation::discover()?),
        _ => None,
    };
    for instance in instances {
        let host = match (launcher, &instance.host) {
            (LauncherKind::Local, _) => here()?,
            (LauncherKind::Ssh, None) => here()?,
            (LauncherKind::Ssh, Some(HostRef::Name(name))) if name == "localhost" => here()?,
            (LauncherKind::Ssh, Some(HostRef::Name(name))) => ssh_host(topology, name)?,
            (LauncherKind::Ssh, Some(HostRef::Index(index))) => {
                let name = host_list.get(*index).ok_or_else(|| {
                    anyhow!(
                        "device {:?} is placed on host {index}, but --hosts names {} host(s){}",
                        instance.id,
                        host_list.len(),
                        if host_list.is_empty() {
                            " (give --hosts a,b,... for placements by index)".to_owned()
                        } else {
                            format!(": {}", host_list.join(", "))
                        }
                    )
                })?;
                if name == "localhost" {
                    here()?
                } else {
                    ssh_host(topology, name)?
                }
            }
            (LauncherKind::Slurm, placed) => {
                let allocation = slurm.as_ref().expect("discovered for slurm");
                allocation.host(topology, &instance.id, placed.as_ref())?
            }
        };
        let idx = *index_of.entry(host.name.clone()).or_insert_with(|| {
            hosts.push(host.clone());
            hosts.len() - 1
        });
        host_of.insert(instance.id.clone(), idx);
    }
    if launcher == LauncherKind::Local && instances.iter().any(|instance| instance.host.is_some()) {
        println!("ferromq: --launcher local runs every device on this host (placements ignored)");
    }
    let placement = Placement { hosts, host_of };
    let host_name = |instance: &Instance| Some(placement.host(&instance.id).name.clone());
    let errors = topology.placement_errors(one_host_transports, &host_name);
    if !errors.is_empty() {
        bail!("{}", errors.join("\n"));
    }
    Ok(placement)
}

fn ssh_host(topology: &Topology, name: &str) -> Result<Host> {
    let spec = topology
        .hosts
        .get(name)
        .cloned()
        .unwrap_or(HostSpec::default());
    let destination = spec.ssh.unwrap_or_else(|| name.to_owned());
    Ok(Host {
        name: name.to_owned(),
        address: spec
            .address
            .unwrap_or_else(|| machine_of(&destination).to_owned()),
        ferromq: spec.ferromq.map_or_else(own_binary, Ok)?,
        start: StartOn::Ssh(destination),
    })
}

/// The Slurm allocation the launcher runs in: its job id and nodes with their addresses.
pub(super) struct SlurmAllocation {
    pub(super) job: String,
    nodes: Vec<(String, String)>,
}

impl SlurmAllocation {
    fn discover() -> Result<SlurmAllocation> {
        let job = std::env::var("SLURM_JOB_ID").map_err(|_| {
            anyhow!(
                "--launcher slurm runs inside an allocation (salloc, sbatch): SLURM_JOB_ID is not \
                 set (`ferromq run FILE --launcher slurm --print-batch` writes a batch script)"
            )
        })?;
        let node_list = std::env::var("SLURM_JOB_NODELIST")
            .or_else(|_| std::env::var("SLURM_NODELIST"))
            .map_err(|_| anyhow!("SLURM_JOB_NODELIST is not set in allocation {job}"))?;
        let names = command_output("scontrol", &["show", "hostnames", &node_list])?;
        let names: Vec<String> = names.split_whitespace().map(str::to_owned).collect();
        if names.is_empty() {
            bail!("allocation {job} has no nodes ({node_list:?})");
        }
        let details = command_output("scontrol", &["show", "node", "--oneliner", &node_list])?;
        let nodes = names
            .into_iter()
            .map(|name| {
                let address = details
                    .lines()
                    .find(|line| {
                        line.split_whitespace()
                            .any(|field| field == format!("NodeName={name}"))
                    })
                    .and_then(|line| {
                        line.split_whitespace()
                            .find_map(|field| field.strip_prefix("NodeAddr="))
                    })
                    .unwrap_or(&name)
                    .to_owned();
                (name, address)
            })
            .collect();
        Ok(SlurmAllocation { job, nodes })
    }

    fn host(&self, topology: &Topology, device: &str, placed: Option<&HostRef>) -> Result<Host> {
        let names = || {
            self.nodes
                .iter()
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (name, address) = match placed {
            None => &self.nodes[0],
            Some(HostRef::Index(index)) => self.nodes.get(*index).ok_or_else(|| {
                anyhow!(
                    "device {device:?} is placed on host {index}, but allocation {} has {} \
                     node(s): {}",
                    self.job,
                    self.nodes.len(),
                    names()
                )
            })?,
            Some(HostRef::Name(wanted)) => self
                .nodes
                .iter()
                .find(|(name, _)| name == wanted)
                .ok_or_else(|| {
                    anyhow!(
                        "device {device:?} is placed on host {wanted:?}, which is not a node of \
                         allocation {} ({})",
                        self.job,
                        names()
                    )
                })?,
        };
        let spec = topology.hosts.get(name).cloned().unwrap_or_default();
        Ok(Host {
            name: name.clone(),
            address: spec.address.unwrap_or_else(|| address.clone()),
            ferromq: spec.ferromq.map_or_else(own_binary, Ok)?,
            start: StartOn::Slurm {
                job: self.job.clone(),
                node: name.clone(),
            },
        })
    }
}

fn command_output(program: &str, args: &[&str]) -> Result<String> {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The batch script that runs `file` with `--launcher slurm` on as many nodes as it places
/// devices on (`ferromq run FILE --launcher slurm --print-batch`).
///
/// `passed_on`: the options of the `ferromq run` that asked for the script which the job's
/// `ferromq run` must be given too (`--transport`, `--duration`, ...), so that the job runs
/// what the same command without `--print-batch` would.
pub(super) fn batch_script(
    topology: &Topology,
    file: &std::path::Path,
    passed_on: &[String],
) -> Result<String> {
    let instances = topology.instances();
    let mut names = std::collections::BTreeSet::new();
    let mut max_index = 0;
    for instance in &instances {
        match &instance.host {
            Some(HostRef::Index(index)) => max_index = max_index.max(*index + 1),
            Some(HostRef::Name(name)) => {
                names.insert(name.clone());
            }
            None => max_index = max_index.max(1),
        }
    }
    let nodes = max_index.max(names.len()).max(1);
    let file = std::fs::canonicalize(file)
        .with_context(|| format!("cannot resolve {}", file.display()))?;
    let stem = file
        .file_stem()
        .map_or("topology".into(), |stem| stem.to_string_lossy());
    let mut script = format!(
        "#!/bin/bash\n\
         # Runs {} with ferromq's Slurm launcher: every device is a task of one srun step.\n\
         #SBATCH --job-name=ferromq-{stem}\n\
         #SBATCH --nodes={nodes}\n\
         #SBATCH --ntasks={}\n\
         #SBATCH --overcommit\n",
        file.display(),
        instances.len()
    );
    if !names.is_empty() {
        script.push_str(&format!(
            "#SBATCH --nodelist={}\n",
            names.into_iter().collect::<Vec<_>>().join(",")
        ));
    }
    let mut command = vec![
        shlex::try_quote(&own_binary()?)
            .context("binary path")?
            .into_owned(),
        "run".to_owned(),
        shlex::try_quote(&file.display().to_string())
            .context("file path")?
            .into_owned(),
        "--launcher".to_owned(),
        "slurm".to_owned(),
    ];
    for option in passed_on {
        command.push(
            shlex::try_quote(option)
                .with_context(|| format!("option {option:?}"))?
                .into_owned(),
        );
    }
    script.push_str(&format!("exec {}\n", command.join(" ")));
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_of_a_destination_is_after_the_user() {
        assert_eq!(machine_of("me@flp042"), "flp042");
        assert_eq!(machine_of("flp042"), "flp042");
    }
}
