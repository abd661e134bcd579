//! Two simulated hosts for the multi-host tests: network namespaces made by the test, joined by a
//! bridge in the test's own namespace (addresses 10.214.N.2 and .3, only inside what the test
//! made), each with an `sshd` of its own on its address and a throw-away key. Everything is
//! removed on drop, whatever happened: sshd killed, namespaces, links and files deleted.
//!
//! Needs root, iproute2 (`ip`) and OpenSSH's server (`apt-get install openssh-server`; `.ci/run`
//! installs it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The simulated hosts.
pub struct NamespaceHosts {
    tag: String,
    dir: PathBuf,
    /// `root@ADDRESS` per host, in order.
    pub destinations: Vec<String>,
    /// The namespace of each host.
    pub namespaces: Vec<String>,
    /// The link in the test's namespace that joins each host to the bridge.
    pub links: Vec<String>,
    sshd: Vec<Child>,
}

fn run(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn run_quietly(program: &str, args: &[&str]) {
    let _ = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl NamespaceHosts {
    /// `count` hosts (at most 2 addresses are planned: .2 and .3, so at most 2).
    pub fn new(count: usize) -> NamespaceHosts {
        assert!(count <= 2);
        assert!(
            nix::unistd::geteuid().is_root(),
            "the multi-host tests make network namespaces: run them as root"
        );
        assert!(
            Path::new("/usr/sbin/sshd").exists(),
            "the multi-host tests need OpenSSH's server: apt-get install openssh-server"
        );
        // Names and a subnet of their own per set of hosts: tests of one binary run at once.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let pid = std::process::id();
        let tag = format!("{}{n}", pid % 100_000);
        let subnet = format!("10.{}.{}", 214 + n, pid % 250);
        let dir = std::env::temp_dir().join(format!("ferromq-hosts-{pid}-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("make the hosts' directory");
        let mut hosts = NamespaceHosts {
            tag: tag.clone(),
            dir: dir.clone(),
            destinations: Vec::new(),
            namespaces: Vec::new(),
            links: Vec::new(),
            sshd: Vec::new(),
        };
        for key in ["client", "host"] {
            let path = dir.join(key);
            run(
                "ssh-keygen",
                &[
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-f",
                    &path.display().to_string(),
                ],
            );
        }
        std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys"))
            .expect("authorize the client key");
        std::fs::create_dir_all("/run/sshd").expect("sshd's privilege separation directory");
        let bridge = format!("fmqb{tag}");
        run("ip", &["link", "add", &bridge, "type", "bridge"]);
        run("ip", &["link", "set", &bridge, "up"]);
        run(
            "ip",
            &["addr", "add", &format!("{subnet}.1/24"), "dev", &bridge],
        );
        for idx in 0..count {
            let name = ["a", "b"][idx];
            let namespace = format!("fmq-{pid}-{n}{name}");
            let link = format!("fmq{tag}{name}");
            let peer = format!("fmq{tag}{name}p");
            let address = format!("{subnet}.{}", idx + 2);
            run("ip", &["netns", "add", &namespace]);
            hosts.namespaces.push(namespace.clone());
            run(
                "ip",
                &["link", "add", &link, "type", "veth", "peer", "name", &peer],
            );
            hosts.links.push(link.clone());
            run("ip", &["link", "set", &peer, "netns", &namespace]);
            run("ip", &["link", "set", &link, "master", &bridge]);
            run("ip", &["link", "set", &link, "up"]);
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &namespace, "ip"];
                all.extend_from_slice(args);
                run("ip", &all);
            };
            inside(&["addr", "add", &format!("{address}/24"), "dev", &peer]);
            inside(&["link", "set", &peer, "up"]);
            inside(&["link", "set", "lo", "up"]);
            let config = dir.join(format!("sshd-{name}.conf"));
            std::fs::write(
                &config,
                format!(
                    "ListenAddress {address}\nPort 22\nHostKey {dir}/host\nPidFile {dir}/sshd-{name}.pid\n\
                     AuthorizedKeysFile {dir}/authorized_keys\nStrictModes no\nPermitRootLogin yes\n\
                     UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n",
                    dir = dir.display()
                ),
            )
            .expect("write sshd's config");
            let sshd = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &namespace,
                    "/usr/sbin/sshd",
                    "-D",
                    "-e",
                    "-f",
                ])
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start sshd");
            hosts.sshd.push(sshd);
            hosts.destinations.push(format!("root@{address}"));
        }
        hosts.wait_for_sshd();
        hosts
    }

    /// The ssh command (`FERROMQ_SSH_COMMAND`) that reaches these hosts with the test's key.
    pub fn ssh_command(&self) -> String {
        format!(
            "ssh -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.dir.join("client").display()
        )
    }

    fn wait_for_sshd(&self) {
        for destination in &self.destinations {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let mut command = Command::new("sh");
                command.args([
                    "-c",
                    &format!(
                        "{} -o BatchMode=yes -o ConnectTimeout=2 {destination} true",
                        self.ssh_command()
                    ),
                ]);
                if command.status().is_ok_and(|status| status.success()) {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "sshd on {destination} did not answer within 10 s"
                );
                // Polling a server coming up: there is nothing to wait on but its port.
                std::thread::yield_now();
            }
        }
    }

    /// The pids of `ferromq` processes running inside host `idx`'s namespace (sshd excluded).
    pub fn ferromq_processes(&self, idx: usize) -> Vec<u32> {
        self.processes(idx, |cmdline| {
            cmdline.contains("ferromq") && !cmdline.contains("sshd")
        })
    }

    /// The pids of processes inside host `idx`'s namespace whose command line `wanted` accepts.
    fn processes(&self, idx: usize, wanted: impl Fn(&str) -> bool) -> Vec<u32> {
        let output = Command::new("ip")
            .args(["netns", "pids", &self.namespaces[idx]])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|cmdline| wanted(&String::from_utf8_lossy(&cmdline)))
            })
            .collect()
    }

    /// Cuts host `idx` off: its link to the bridge goes down.
    pub fn cut_off(&self, idx: usize) {
        run("ip", &["link", "set", &self.links[idx], "down"]);
    }
}

impl Drop for NamespaceHosts {
    fn drop(&mut self) {
        for sshd in &mut self.sshd {
            let _ = sshd.kill();
            let _ = sshd.wait();
        }
        for idx in 0..self.namespaces.len() {
            // What runs in the namespace: devices, and sshd's sessions of the test's connections.
            for pid in self.processes(idx, |_| true) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        for link in &self.links {
            run_quietly("ip", &["link", "del", link]);
        }
        run_quietly("ip", &["link", "del", &format!("fmqb{}", self.tag)]);
        for namespace in &self.namespaces {
            run_quietly("ip", &["netns", "del", namespace]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
