//! Every validation error, from a deliberately broken file, with its position and message; and
//! every bundled topology loads.

use std::collections::BTreeMap;
use std::path::Path;

use ferromq_topology::{
    HostRef, Known, PropertyProblem, Restart, RestartPolicy, load, load_with_transport,
};

const KNOWN: Known<'static> = Known {
    kinds: &[
        "sampler",
        "bsampler",
        "sink",
        "processor",
        "splitter",
        "merger",
        "proxy",
        "multiplier",
        "client",
        "server",
        "stf-source",
        "builder",
        "mcts-driver",
        "mcts-worker",
    ],
    transports: &["zeromq", "shmem", "ofi"],
    transport_properties: &[],
    transport_schemes: &[
        ("zeromq", &["tcp", "ipc", "inproc"]),
        ("shmem", &["tcp", "ipc", "inproc"]),
        ("ofi", &["tcp", "verbs"]),
    ],
    rpc_group_keys: &[
        "members",
        "aggregate",
        "aggregate-bytes",
        "aggregate-us",
        "timeout-ms",
        "tree-arity",
    ],
    check_properties: None,
    required_channels: None,
};

#[test]
fn every_invalid_file_fails_at_its_expected_position() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut n_files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("invalid-") {
            continue;
        }
        n_files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{name} has no # expect line"));
        let (position, message) = expect.split_once(": ").unwrap();
        let errors = load(&name, &text, &KNOWN).expect_err(&name);
        let wanted = format!("{name}:{position}: ");
        assert!(
            errors
                .0
                .iter()
                .any(|error| error.to_string().starts_with(&wanted)
                    && error.to_string().contains(message)),
            "{name}: expected {wanted}...{message}, got:\n{errors}"
        );
    }
    assert!(n_files >= 15, "only {n_files} invalid files found");
}

#[test]
fn every_bundled_topology_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topologies");
    let mut n_files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|extension| extension != "toml") {
            continue;
        }
        n_files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let topology = load(&path.display().to_string(), &text, &KNOWN)
            .unwrap_or_else(|errors| panic!("{errors}"));
        assert!(!topology.instances().is_empty());
        assert!(topology.to_dot().starts_with("digraph"));
        assert!(topology.to_mermaid().starts_with("flowchart"));
    }
    assert!(n_files >= 7, "only {n_files} bundled topologies");
}

/// Found by a bad-input sweep: toml's errors for a missing or a duplicate key said neither
/// which device (or channel, group, host) nor, for a duplicate, which key.
#[test]
fn toml_errors_name_the_table_and_the_key() {
    for (text, expected) in [
        (
            "[[device]]\nid = \"a\"\nkind = \"sink\"\n\n[[device]]\nid = \"b\"\n",
            "t.toml:5:1: device \"b\": missing field `kind`",
        ),
        (
            "[[device]]\nid = \"a\"\nkind = \"sink\"\n[[device.channel]]\nname = \"data\"\n",
            "t.toml:4:1: device \"a\" channel \"data\": missing field `type`",
        ),
        (
            "[[device]]\nid = \"a\"\nkind = \"sink\"\n\n[[device]]\nid = \"b\"\nkind = \"sink\"\nkind = \"sampler\"\n",
            "t.toml:8:1: device \"b\": duplicate key `kind`",
        ),
        (
            "[[device]]\nid = \"a\"\nkind = \"sink\"\n[[device.channel]]\nname = \"data\"\ntype = \"pull\"\ntype = \"push\"\n",
            "t.toml:7:1: device \"a\" channel \"data\": duplicate key `type`",
        ),
        (
            "[[device]]\nid = \"a\"\nkind = \"sink\"\n[[rpc]]\nname = \"g\"\n",
            "t.toml:4:1: rpc \"g\": missing field `members`",
        ),
        (
            "[hosts.n1]\nssh = \"a\"\nssh = \"b\"\n[[device]]\nid = \"a\"\nkind = \"sink\"\n",
            "t.toml:3:1: host \"n1\": duplicate key `ssh`",
        ),
    ] {
        let errors = load("t.toml", text, &KNOWN).unwrap_err().to_string();
        assert_eq!(errors, expected, "{text}");
    }
}

#[test]
fn all_errors_are_reported_not_only_the_first() {
    let text = "[[device]]\nid = \"a\"\nkind = \"nope\"\nhost = -1\n";
    let errors = load("two.toml", text, &KNOWN).unwrap_err();
    assert_eq!(errors.0.len(), 2, "{errors}");
}

#[test]
fn a_built_in_kinds_property_check_is_reported_at_the_value_or_the_kind() {
    // Refuses `size` "-1" (naming the key) and a device without `file` (naming none).
    fn check(
        kind: &str,
        id: &str,
        properties: &BTreeMap<String, String>,
        _transport_properties: &[&str],
    ) -> Result<(), PropertyProblem> {
        assert!(
            KNOWN.kinds.contains(&kind),
            "exec or unknown kind {kind} checked"
        );
        if properties.get("size").map(String::as_str) == Some("-1") {
            return Err(PropertyProblem {
                key: Some("size".to_owned()),
                message: format!("device {id:?}: size -1"),
            });
        }
        if kind == "sink" && !properties.contains_key("file") {
            return Err(PropertyProblem {
                key: None,
                message: format!("device {id:?}: no file"),
            });
        }
        Ok(())
    }
    let known = Known {
        check_properties: Some(check),
        ..KNOWN
    };
    let text = r#"[[device]]
id = "a"
kind = "sampler"
properties = { size = -1 }

[[device]]
id = "b"
kind = "sink"
properties = { size = 3 }

[[device]]
id = "c"
kind = "exec"
command = ["true"]
properties = { size = -1 }

[[device]]
id = "d"
kind = "nope"
properties = { size = -1 }

[[device]]
id = "e"
kind = "sampler"
properties = { size = [-1] }
"#;
    let errors = load("checked.toml", text, &known).unwrap_err().to_string();
    let lines: Vec<&str> = errors.lines().collect();
    assert_eq!(
        lines,
        [
            "checked.toml:4:23: device \"a\": size -1",
            "checked.toml:8:8: device \"b\": no file",
            "checked.toml:19:8: device \"d\": unknown kind \"nope\"; built in: sampler, bsampler, sink, processor, splitter, merger, proxy, multiplier, client, server, stf-source, builder, mcts-driver, mcts-worker, or exec",
            "checked.toml:25:23: device \"e\": property \"size\" must be a string, number or boolean, not array",
        ],
        "{errors}"
    );
}

#[test]
fn a_channel_sets_its_auto_bind_port_range() {
    let text = r#"
[[device]]
id = "a"
kind = "sink"
[[device.channel]]
name = "data"
type = "pull"
portRangeMin = 31000
portRangeMax = 31010
"#;
    let topology = load("range.toml", text, &KNOWN).unwrap_or_else(|errors| panic!("{errors}"));
    let config = &topology.instances()[0].channels[0].config;
    assert_eq!(
        (config.port_range_min, config.port_range_max),
        (31000, 31010)
    );
}

/// docs/topology.md's channel table and the key table (ferromq-core's `CHANNEL_KEYS`, which
/// every configuration form reads through) list the same keys, with the same defaults.
#[test]
fn the_documented_channel_keys_are_the_key_table() {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/topology.md"),
    )
    .unwrap();
    let section = docs
        .split("## `[[device.channel]]`")
        .nth(1)
        .expect("docs/topology.md has a channel section");
    let section = section.split("\n## ").next().unwrap();
    // Each row: the keys it documents (backticked, comma-separated) and their defaults.
    let mut documented = Vec::new();
    for row in section.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let backticked = |cell: &str| -> Vec<String> {
            cell.split(", ")
                .filter_map(|item| item.strip_prefix('`')?.strip_suffix('`'))
                .map(str::to_owned)
                .collect()
        };
        let keys = backticked(cells[1]);
        let defaults = backticked(cells[2]);
        for (idx, key) in keys.iter().enumerate() {
            let default = defaults.get(idx).or(defaults.first()).cloned();
            documented.push((key.clone(), default));
        }
    }
    for key in &ferromq_core::CHANNEL_KEYS {
        let Some((_, default)) = documented.iter().find(|(name, _)| name == key.name) else {
            panic!(
                "docs/topology.md does not document channel key {}",
                key.name
            );
        };
        // A topology's channels do not log rates (the launcher shows them): its one default
        // that differs from FairMQ's.
        if key.default.is_empty() || key.name == "rateLogging" {
            continue;
        }
        assert_eq!(
            default.as_deref(),
            Some(key.default),
            "default of {} in docs/topology.md",
            key.name
        );
    }
    for (name, _) in &documented {
        assert!(
            name == "connect" || ferromq_core::channel_key(name).is_some(),
            "docs/topology.md documents {name}, which is not a channel key"
        );
    }
}

#[test]
fn float_properties_reach_the_device_as_the_file_wrote_them() {
    let text = r#"
[[device]]
id = "a"
kind = "sink"
properties = { whole = 11.0, half = 2.5, huge = 1e300, tiny = 1e-7, big-whole = 1e18, minus = -3.0, none = inf }
"#;
    let topology = load("floats.toml", text, &KNOWN).unwrap_or_else(|errors| panic!("{errors}"));
    let instances = topology.instances();
    let properties = &instances[0].properties;
    for (key, text) in [
        ("whole", "11"),
        ("half", "2.5"),
        ("huge", "1e300"),
        ("tiny", "1e-7"),
        ("big-whole", "1000000000000000000"),
        ("minus", "-3"),
        ("none", "inf"),
    ] {
        assert_eq!(properties[key], text, "{key}");
    }
}

#[test]
fn an_rpc_group_becomes_an_inbound_and_one_push_socket_per_member() {
    let text = r#"
transport = "shmem"
[[device]]
id = "driver"
kind = "sink"
[[device]]
id = "worker"
kind = "sink"
replicas = 2
[[rpc]]
name = "search"
members = ["driver", "worker"]
aggregate = "trad"
aggregate-us = 50
spin-us = 0
"#;
    let topology = load("rpc.toml", text, &KNOWN).unwrap_or_else(|errors| panic!("{errors}"));
    let instances = topology.instances();
    let ids: Vec<&str> = instances
        .iter()
        .map(|instance| instance.id.as_str())
        .collect();
    assert_eq!(ids, ["driver", "worker-0", "worker-1"]);
    for instance in &instances {
        assert_eq!(
            instance.properties["rpc.search.members"],
            "driver,worker-0,worker-1"
        );
        assert_eq!(instance.properties["rpc.search.aggregate"], "trad");
        assert_eq!(instance.properties["rpc.search.aggregate-us"], "50");
        let inbound = &instance.channels[0];
        assert_eq!(inbound.config.name, "search");
        assert_eq!(inbound.config.socket_type, ferromq_core::SocketType::Pull);
        assert_eq!(inbound.config.method, ferromq_core::Method::Bind);
        assert!(!inbound.config.busy_poll);
        assert_eq!(inbound.config.spin_us, 0);
        assert_ne!(
            ferromq_core::DEFAULT_SPIN_US,
            0,
            "the group's 0 is not the default"
        );
        let out = &instance.channels[1];
        assert_eq!(out.config.name, "search-out");
        assert_eq!(out.config.num_sockets, 3);
        let targets: Vec<&str> = out.connect_to.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(targets, ids, "socket i connects to member i");
        assert!(out.connect_to.iter().all(|(_, socket)| socket == "search"));
    }
}

/// Found by a bad-input sweep: a group's `transport` went to each member's two channels, and
/// an unknown one was reported once for each (4 times for 2 members).
#[test]
fn an_rpc_groups_unknown_transport_is_reported_once() {
    let text = r#"[[device]]
id = "driver"
kind = "sink"
[[device]]
id = "worker"
kind = "sink"
[[rpc]]
name = "search"
members = ["driver", "worker"]
transport = "tcp"
"#;
    let errors = load("rpc.toml", text, &KNOWN).unwrap_err().to_string();
    assert_eq!(
        errors,
        "rpc.toml:10:13: rpc \"search\": transport \"tcp\" is not built in (built in: zeromq, shmem, ofi)"
    );
}

/// Found by a bad-input sweep: rpc keys that do not apply together were taken and changed
/// nothing. Each is refused once, at the group, which is still wired: its members (here a kind
/// that needs the group's channels) are not also told they lack them.
#[test]
fn rpc_keys_that_do_not_apply_together_are_refused_once() {
    fn group_channels(
        kind: &str,
        _properties: &BTreeMap<String, String>,
    ) -> Option<Vec<(String, String)>> {
        (kind == "mcts-worker").then(|| {
            ["search", "search-out"]
                .map(|name| (name.to_owned(), "its rpc group gives it".to_owned()))
                .to_vec()
        })
    }
    let known = Known {
        required_channels: Some(group_channels),
        ..KNOWN
    };
    for (keys, expected) in [
        (
            "busy-poll = true\nspin-us = 20",
            "t.toml:9:11: rpc \"search\": spin-us = 20 does nothing with busy-poll = true (a busy-polled inbound never sleeps, so it never spins before sleeping): give one of the two",
        ),
        (
            "aggregate = \"none\"\naggregate-bytes = 8192",
            "t.toml:9:19: rpc \"search\": aggregate-bytes does nothing with aggregate = \"none\" (each call is a frame of its own): give it only with \"trad\" or \"ovfl\"",
        ),
        (
            "aggregate = \"none\"\naggregate-us = 50",
            "t.toml:9:16: rpc \"search\": aggregate-us does nothing with aggregate = \"none\" (only \"trad\" holds a frame that is not full): give it only with \"trad\"",
        ),
        // A value that is no setting is reported, and the group still wired.
        (
            "aggregate = \"bogus\"",
            "t.toml:8:13: rpc \"search\": aggregate \"bogus\" is not none, trad or ovfl",
        ),
        (
            "tree-arity = 0",
            "t.toml:8:14: rpc \"search\": tree-arity must be at least 1, not 0",
        ),
        (
            "spin-us = -1",
            "t.toml:8:11: rpc \"search\": spin-us must be at least 0, not -1",
        ),
        (
            "timeout-ms = 5\naggregate-us = 50",
            "t.toml:9:16: rpc \"search\": aggregate-us does nothing with aggregate = \"ovfl\", the default (only \"trad\" holds a frame that is not full): give it only with \"trad\"",
        ),
    ] {
        let text = format!(
            "[[device]]\nid = \"worker\"\nkind = \"mcts-worker\"\nreplicas = 2\n[[rpc]]\nname = \"search\"\nmembers = [\"worker\"]\n{keys}\n"
        );
        let errors = load("t.toml", &text, &known).unwrap_err().to_string();
        assert_eq!(errors, expected, "{keys}");
    }
    // Each alone, or with the aggregation that uses it, is taken.
    for keys in [
        "busy-poll = false\nspin-us = 20",
        "aggregate = \"trad\"\naggregate-us = 50\naggregate-bytes = 8192",
        "aggregate = \"ovfl\"\naggregate-bytes = 8192",
    ] {
        let text = format!(
            "[[device]]\nid = \"worker\"\nkind = \"mcts-worker\"\n[[rpc]]\nname = \"search\"\nmembers = [\"worker\"]\n{keys}\n"
        );
        load("t.toml", &text, &known).unwrap_or_else(|errors| panic!("{keys}: {errors}"));
    }
}

/// `busy-poll = true` reaches the members' inbound channels (given alone: with `spin-us` it
/// is refused, see invalid-rpc-spin-us-busy-poll.toml).
#[test]
fn an_rpc_groups_busy_poll_reaches_its_inbound_channels() {
    let text = r#"[[device]]
id = "driver"
kind = "sink"
[[rpc]]
name = "search"
members = ["driver"]
busy-poll = true
"#;
    let topology = load("rpc.toml", text, &KNOWN).unwrap_or_else(|errors| panic!("{errors}"));
    let inbound = &topology.instances()[0].channels[0];
    assert_eq!(inbound.config.name, "search");
    assert!(inbound.config.busy_poll);
}

/// Found by a bad-input sweep: `verbs://` on a zeromq channel passed `validate` and was
/// refused only when the device bound it. Each transport takes the schemes it binds and
/// connects, whether the channel names it or the file's `transport` applies.
#[test]
fn each_transport_takes_the_address_schemes_it_binds() {
    for (transport, address, refused) in [
        ("zeromq", "ipc:///tmp/ferromq-scheme", None),
        ("zeromq", "tcp://127.0.0.1:0", None),
        (
            "zeromq",
            "verbs://10.0.0.1:5555",
            Some("tcp:// and ipc://, not verbs://"),
        ),
        ("shmem", "ipc:///tmp/ferromq-scheme", None),
        (
            "shmem",
            "verbs://10.0.0.1:5555",
            Some("tcp:// and ipc://, not verbs://"),
        ),
        ("ofi", "verbs://10.0.0.1:5555", None),
        ("ofi", "tcp://127.0.0.1:0", None),
        (
            "ofi",
            "ipc:///tmp/ferromq-scheme",
            Some("tcp:// and verbs://, not ipc://"),
        ),
    ] {
        for channel_transport in [true, false] {
            let (file_transport, own_transport) = if channel_transport {
                ("zeromq", format!("transport = {transport:?}\n"))
            } else {
                (transport, String::new())
            };
            let text = format!(
                "transport = {file_transport:?}\n[[device]]\nid = \"a\"\nkind = \"sink\"\n\
                 [[device.channel]]\nname = \"data\"\ntype = \"pull\"\n{own_transport}\
                 address = {address:?}\n"
            );
            let loaded = load("scheme.toml", &text, &KNOWN);
            match refused {
                None => {
                    loaded.unwrap_or_else(|errors| panic!("{transport} {address}: {errors}"));
                }
                Some(takes) => {
                    let errors = loaded.unwrap_err().to_string();
                    let line = if channel_transport { 9 } else { 8 };
                    assert_eq!(
                        errors,
                        format!(
                            "scheme.toml:{line}:11: device \"a\" channel \"data\": address {address}: transport {transport} takes {takes}"
                        )
                    );
                }
            }
        }
    }
}

/// `ferromq run FILE --transport NAME` checked the file with its own `transport` and only then
/// ran its channels that name none on NAME: an address NAME does not take, or a connection
/// whose ends NAME put on two transports, passed and failed once the devices ran; one the
/// file's transport refused but NAME takes was refused. Loaded with the transport that will
/// run them, those channels are checked with it, in `validate`'s words.
#[test]
fn a_transport_given_instead_of_the_files_is_the_one_checked() {
    let address = |address: &str| {
        format!(
            "transport = \"zeromq\"\n[[device]]\nid = \"a\"\nkind = \"sink\"\n\
             [[device.channel]]\nname = \"data\"\ntype = \"pull\"\naddress = {address:?}\n"
        )
    };
    // Both ends of `b.data -> a.data`, `a`'s on the transport it names.
    let connection = |transport: &str| {
        format!(
            "transport = \"zeromq\"\n[[device]]\nid = \"a\"\nkind = \"sampler\"\n\
             [[device.channel]]\nname = \"data\"\ntype = \"push\"\ntransport = {transport:?}\n\
             [[device]]\nid = \"b\"\nkind = \"sink\"\n\
             [[device.channel]]\nname = \"data\"\ntype = \"pull\"\nconnect = \"a.data\"\n"
        )
    };
    // (file, the transport given, what the file's transport says, what the given one says)
    for (text, given, as_written, as_run) in [
        (
            address("ipc:///tmp/ferromq-given"),
            "ofi",
            None,
            Some(
                "given.toml:8:11: device \"a\" channel \"data\": address ipc:///tmp/ferromq-given: transport ofi takes tcp:// and verbs://, not ipc://",
            ),
        ),
        (
            address("verbs://10.0.0.1:5555"),
            "ofi",
            Some(
                "given.toml:8:11: device \"a\" channel \"data\": address verbs://10.0.0.1:5555: transport zeromq takes tcp:// and ipc://, not verbs://",
            ),
            None,
        ),
        (
            connection("zeromq"),
            "shmem",
            None,
            Some(
                "given.toml:15:11: device \"b\" channel \"data\": connect \"a.data\": that channel is on zeromq, this one on shmem; both ends of a connection use one transport",
            ),
        ),
        (
            connection("shmem"),
            "shmem",
            Some(
                "given.toml:15:11: device \"b\" channel \"data\": connect \"a.data\": that channel is on shmem, this one on zeromq; both ends of a connection use one transport",
            ),
            None,
        ),
    ] {
        for (loaded, expected) in [
            (load("given.toml", &text, &KNOWN), as_written),
            (
                load_with_transport("given.toml", &text, &KNOWN, given),
                as_run,
            ),
        ] {
            match (loaded, expected) {
                (Ok(topology), None) => {
                    assert!(["zeromq", given].contains(&topology.transport.as_str()));
                }
                (Err(errors), Some(expected)) => assert_eq!(errors.to_string(), expected),
                (loaded, expected) => panic!("{text}: {loaded:?}, expected {expected:?}"),
            }
        }
    }
    let topology = load_with_transport("given.toml", &connection("shmem"), &KNOWN, "shmem")
        .unwrap_or_else(|errors| panic!("{errors}"));
    assert_eq!(topology.transport, "shmem");
    let errors = load_with_transport("given.toml", &connection("shmem"), &KNOWN, "carrier-pigeon")
        .unwrap_err()
        .to_string();
    assert_eq!(
        errors.lines().next(),
        Some(
            "given.toml:1:1: transport \"carrier-pigeon\", given instead of the file's, is not built in (built in: zeromq, shmem, ofi)"
        ),
        "{errors}"
    );
}

#[test]
fn a_bad_host_table_reports_every_problem() {
    let text =
        "[[device]]\nid = \"b\"\nkind = \"sink\"\nhost = [0, true]\n\n[hosts.n1]\nssh = \"\"\n";
    let errors = load("hosts.toml", text, &KNOWN).unwrap_err().to_string();
    assert!(
        errors.contains("hosts.toml:4:8: device \"b\": host is a boolean"),
        "{errors}"
    );
    assert!(
        errors.contains("hosts.toml:7:7: host \"n1\": ssh is empty"),
        "{errors}"
    );
}

#[test]
fn replicas_are_spread_over_their_hosts_and_shmem_stays_on_one_host() {
    let text = r#"
transport = "shmem"
[hosts.far]
ssh = "me@far.example"
address = "10.1.2.3"
[[device]]
id = "source"
kind = "sampler"
host = 0
[[device.channel]]
name = "data"
type = "push"
[[device]]
id = "sink"
kind = "sink"
replicas = 3
host = [0, 1]
[[device.channel]]
name = "data"
type = "pull"
connect = "source.data"
[[device]]
id = "here"
kind = "sink"
host = "localhost"
"#;
    let topology = load("spread.toml", text, &KNOWN).unwrap_or_else(|errors| panic!("{errors}"));
    let hosts: Vec<(String, Option<HostRef>)> = topology
        .instances()
        .into_iter()
        .map(|instance| (instance.id, instance.host))
        .collect();
    assert_eq!(
        hosts,
        [
            ("source".to_owned(), Some(HostRef::Index(0))),
            ("sink-0".to_owned(), Some(HostRef::Index(0))),
            ("sink-1".to_owned(), Some(HostRef::Index(1))),
            ("sink-2".to_owned(), Some(HostRef::Index(0))),
            ("here".to_owned(), None),
        ]
    );
    assert_eq!(topology.hosts["far"].address.as_deref(), Some("10.1.2.3"));
    let host_of =
        |instance: &ferromq_topology::Instance| instance.host.as_ref().map(ToString::to_string);
    let errors = topology.placement_errors(&["shmem"], &host_of);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("device \"sink-1\" (on host 1) and device \"source\" (on host 0)"),
        "{errors:?}"
    );
    assert!(topology.placement_errors(&["ofi"], &host_of).is_empty());
}

#[test]
fn restart_policies_and_minimum_replicas_reach_every_instance() {
    let text = r#"
[[device]]
id = "source"
kind = "sampler"
restart = "always"
max-restarts = 2
restart-delay = 0.25
[[device.channel]]
name = "data"
type = "push"
[[device]]
id = "worker"
kind = "sink"
replicas = 3
min-replicas = 2
restart = "on-failure"
[[device.channel]]
name = "data"
type = "pull"
connect = "source.data"
[[device]]
id = "spare"
kind = "sink"
expendable = true
"#;
    let topology = load("restart.toml", text, &KNOWN).unwrap_or_else(|errors| panic!("{errors}"));
    let policies: Vec<(String, Restart, u32, f64, usize)> = topology
        .instances()
        .into_iter()
        .map(|instance| {
            (
                instance.id,
                instance.restart.when,
                instance.restart.limit,
                instance.restart.delay.as_secs_f64(),
                instance.min_replicas,
            )
        })
        .collect();
    let default_limit = RestartPolicy::DEFAULT_LIMIT;
    assert_eq!(
        policies,
        [
            ("source".to_owned(), Restart::Always, 2, 0.25, 1),
            (
                "worker-0".to_owned(),
                Restart::OnFailure,
                default_limit,
                1.0,
                2
            ),
            (
                "worker-1".to_owned(),
                Restart::OnFailure,
                default_limit,
                1.0,
                2
            ),
            (
                "worker-2".to_owned(),
                Restart::OnFailure,
                default_limit,
                1.0,
                2
            ),
            ("spare".to_owned(), Restart::Never, default_limit, 1.0, 0),
        ]
    );
    // The delay doubles per restart, up to a minute.
    let policy = topology.instances()[0].restart;
    let delays: Vec<f64> = [1, 2, 3, 12]
        .map(|restart| policy.delay_before(restart).as_secs_f64())
        .to_vec();
    assert_eq!(delays, [0.25, 0.5, 1.0, 60.0]);
    assert!(Restart::OnFailure.applies(false) && !Restart::OnFailure.applies(true));
    assert!(Restart::Always.applies(true) && !Restart::Never.applies(false));
}

/// Found by a bad-input sweep: a `"` in an id made the DOT invalid, and Mermaid named `日本`
/// and `中国` (and `a-b` and `a_b`) alike, drawing their edge as a loop.
#[test]
fn graphs_quote_ids_and_keep_devices_apart() {
    let text = r#"
[[device]]
id = 'a"b'
kind = "sampler"
[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "日本"
kind = "sink"
[[device.channel]]
name = "data"
type = "pull"
connect = 'a"b.data'

[[device]]
id = "中国"
kind = "sink"
[[device.channel]]
name = "data"
type = "pull"
connect = 'a"b.data'
"#;
    let topology = load("graph.toml", text, &KNOWN).unwrap_or_else(|errors| panic!("{errors}"));
    let dot = topology.to_dot();
    assert!(
        dot.contains(r#"  "a\"b" [label="a\"b\n(sampler)"];"#),
        "{dot}"
    );
    assert!(
        dot.contains(r#"  "a\"b" -> "日本" [label="a\"b.data pull (zeromq)"];"#),
        "{dot}"
    );
    let mermaid = topology.to_mermaid();
    for line in [
        r#"  d0["a#quot;b (sampler)"]"#,
        r#"  d1["日本 (sink)"]"#,
        r#"  d2["中国 (sink)"]"#,
        r#"  d0 -->|"a#quot;b.data pull (zeromq)"| d1"#,
        r#"  d0 -->|"a#quot;b.data pull (zeromq)"| d2"#,
    ] {
        assert!(
            mermaid.lines().any(|seen| seen == line),
            "no {line:?} in\n{mermaid}"
        );
    }
}
