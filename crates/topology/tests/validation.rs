//! Every validation error, from a deliberately broken file, with its position and message; and
//! every bundled topology loads.

use std::path::Path;

use ferromq_topology::{Known, load};

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
    ],
    transports: &["zeromq", "shmem", "ofi"],
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

#[test]
fn all_errors_are_reported_not_only_the_first() {
    let text = "[[device]]\nid = \"a\"\nkind = \"nope\"\nhost = \"far.away\"\n";
    let errors = load("two.toml", text, &KNOWN).unwrap_err();
    assert_eq!(errors.0.len(), 2, "{errors}");
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
