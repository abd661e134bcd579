//! Tidy checks over the source tree, run by `cargo test`.

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    fn workspace_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace")
            .to_owned()
    }

    fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|name| name != "target") {
                rust_files(&path, files);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                files.push(path);
            }
        }
    }

    fn test_sources() -> Vec<PathBuf> {
        let root = workspace_root();
        let mut files = Vec::new();
        rust_files(&root.join("tests"), &mut files);
        for krate in fs::read_dir(root.join("crates"))
            .expect("crates/")
            .flatten()
        {
            rust_files(&krate.path().join("tests"), &mut files);
        }
        files
    }

    /// Tests synchronise on events under a timeout, never on sleeps.
    #[test]
    fn no_sleep_in_tests() {
        let offenders: Vec<String> = test_sources()
            .into_iter()
            .filter(|path| {
                let text = fs::read_to_string(path).expect("read test source");
                text.contains("thread::sleep") || text.contains("time::sleep")
            })
            .map(|path| path.display().to_string())
            .collect();
        assert!(offenders.is_empty(), "sleep in tests: {offenders:?}");
    }

    /// Tests bind port 0 and pass the bound address on; a fixed port collides on a shared box.
    #[test]
    fn no_fixed_ports_in_tests() {
        for path in test_sources() {
            let text = fs::read_to_string(&path).expect("read test source");
            for (line_idx, line) in text.lines().enumerate() {
                let fixed = ["127.0.0.1:", "localhost:", "*:"].iter().any(|host| {
                    line.match_indices(host).any(|(at, _)| {
                        let port: String = line[at + host.len()..]
                            .chars()
                            .take_while(char::is_ascii_digit)
                            .collect();
                        !port.is_empty() && port != "0"
                    })
                });
                assert!(
                    !fixed,
                    "{}:{}: fixed port: {line}",
                    path.display(),
                    line_idx + 1
                );
            }
        }
    }

    /// Every library explains itself in its first lines, and only the crates that must touch
    /// raw memory may use `unsafe`.
    #[test]
    fn libraries_have_module_docs_and_forbid_unsafe() {
        let root = workspace_root();
        let mut libs = vec![root.join("src/lib.rs")];
        for krate in fs::read_dir(root.join("crates"))
            .expect("crates/")
            .flatten()
        {
            let lib = krate.path().join("src/lib.rs");
            if lib.exists() {
                libs.push(lib);
            }
        }
        // alloc-count: a `GlobalAlloc` forwarding to the system allocator (tests only).
        let may_use_unsafe = ["shm", "ofi", "ofi-sys", "alloc-count"];
        for lib in libs {
            let text = fs::read_to_string(&lib).expect("read lib.rs");
            assert!(
                text.starts_with("//!"),
                "{} must start with a //! module doc",
                lib.display()
            );
            let crate_dir = lib
                .parent()
                .and_then(Path::parent)
                .and_then(Path::file_name);
            let unsafe_allowed =
                crate_dir.is_some_and(|dir| may_use_unsafe.iter().any(|name| dir == *name));
            if unsafe_allowed {
                assert!(
                    text.contains("clippy::undocumented_unsafe_blocks"),
                    "{} must deny undocumented unsafe blocks",
                    lib.display()
                );
            } else {
                assert!(
                    text.contains("#![forbid(unsafe_code)]"),
                    "{} must forbid unsafe code",
                    lib.display()
                );
            }
        }
    }

    /// Examples are what a device author copies: they name only the `ferromq` crate, whose
    /// default features hold everything a device needs (`ferromq::run_device_main`, regions, the
    /// shm watchdog), never a member crate (`ferromq_cli::`, `ferromq_shm::`, ...).
    #[test]
    fn examples_use_only_the_ferromq_facade() {
        let mut examples = Vec::new();
        rust_files(&workspace_root().join("examples"), &mut examples);
        assert!(!examples.is_empty(), "no examples found");
        for path in examples {
            let text = fs::read_to_string(&path).expect("read example");
            for (line_idx, line) in text.lines().enumerate() {
                assert!(
                    !line.contains("ferromq_"),
                    "{}:{}: names a member crate; use the `ferromq` facade's path: {line}",
                    path.display(),
                    line_idx + 1
                );
            }
        }
    }

    /// The built-in kinds, from `Builtin::ALL` in crates/devices/src/lib.rs.
    fn builtin_kinds() -> Vec<String> {
        let source = fs::read_to_string(workspace_root().join("crates/devices/src/lib.rs"))
            .expect("read crates/devices/src/lib.rs");
        let start = source
            .find("pub const ALL")
            .expect("crates/devices/src/lib.rs defines Builtin::ALL");
        let table = &source[start..];
        let table = &table[..table.find("];").expect("Builtin::ALL ends with `];`")];
        let kinds: Vec<String> = table
            .lines()
            .filter_map(|line| line.trim().strip_prefix("(\""))
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_owned)
            .collect();
        assert!(kinds.len() >= 8, "Builtin::ALL parsed as {kinds:?}");
        kinds
    }

    /// The words between backticks in `text`.
    fn backticked(text: &str) -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    fn sorted(mut names: Vec<String>) -> Vec<String> {
        names.sort();
        names
    }

    /// README's "Built-in kinds: `a`, `b`, ... ." sentence lists exactly `Builtin::ALL`.
    #[test]
    fn readme_lists_every_builtin_kind() {
        let readme = fs::read_to_string(workspace_root().join("README.md")).expect("read README");
        let start = readme
            .find("Built-in kinds:")
            .expect("README.md has a `Built-in kinds:` sentence");
        let sentence = &readme[start + "Built-in kinds:".len()..];
        let sentence = &sentence[..sentence
            .find(". ")
            .or(sentence.find(".\n"))
            .unwrap_or(sentence.len())];
        assert_eq!(
            sorted(backticked(sentence)),
            sorted(builtin_kinds()),
            "README.md's `Built-in kinds:` list differs from Builtin::ALL in crates/devices/src/lib.rs"
        );
    }

    /// The README's `cargo run --release -- run ...` needs exactly one binary among the default
    /// members (the CLI's `ferromq`; the fuzz driver is left out), and every other crate is a
    /// default member, so that a plain `cargo build --release` builds it.
    #[test]
    fn the_default_members_hold_every_crate_and_one_binary() {
        let root = workspace_root();
        let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("read Cargo.toml");
        let start = manifest
            .find("default-members = [")
            .expect("Cargo.toml lists default-members");
        let list = &manifest[start..];
        let list = &list[..list.find(']').expect("the list is closed")];
        for krate in fs::read_dir(root.join("crates"))
            .expect("crates/")
            .flatten()
        {
            if !krate.path().join("Cargo.toml").exists() {
                continue;
            }
            let dir = format!("\"crates/{}\"", krate.file_name().to_string_lossy());
            let has_binary = krate.path().join("src/main.rs").exists()
                || fs::read_to_string(krate.path().join("Cargo.toml"))
                    .expect("read a crate's Cargo.toml")
                    .contains("[[bin]]");
            let wanted = !has_binary || dir == "\"crates/cli\"";
            assert_eq!(
                list.contains(&dir),
                wanted,
                "{dir} should {}be a default member",
                if wanted { "" } else { "not " }
            );
        }
    }

    /// ARCHITECTURE.md's code map names every crate directory (`crates/<dir>` is package
    /// `ferromq-<dir>`) and the built-in kinds on the `ferromq-devices` line.
    #[test]
    fn architecture_code_map_matches_the_crates_and_kinds() {
        let root = workspace_root();
        let text = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
        let start = text
            .find("## Code map")
            .expect("ARCHITECTURE.md has a `## Code map`");
        let map = &text[start..];
        let block_start = map
            .find("```text")
            .expect("the code map opens with a ```text block")
            + 7;
        let block = &map[block_start..];
        let block = &block[..block.find("```").expect("the code map's block is closed")];
        let names: Vec<&str> = block
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        for krate in fs::read_dir(root.join("crates"))
            .expect("crates/")
            .flatten()
        {
            if !krate.path().join("Cargo.toml").exists() {
                continue;
            }
            let package = format!("ferromq-{}", krate.file_name().to_string_lossy());
            assert!(
                names.contains(&package.as_str()),
                "ARCHITECTURE.md's code map lacks a line for {package} (crates/{})",
                krate.file_name().to_string_lossy()
            );
        }
        let devices_line = block
            .lines()
            .find(|line| line.starts_with("ferromq-devices"))
            .expect("the code map has a ferromq-devices line");
        let listed: Vec<String> = devices_line
            .split_once(':')
            .map_or("", |(_, kinds)| kinds)
            .split(',')
            .map(|kind| kind.trim().to_owned())
            .filter(|kind| !kind.is_empty())
            .collect();
        assert_eq!(
            sorted(listed),
            sorted(builtin_kinds()),
            "ARCHITECTURE.md's ferromq-devices line differs from Builtin::ALL"
        );
    }

    /// README's "Set up" holds exactly two commands: the main job on the bundled default
    /// topology, and the tests.
    #[test]
    fn readme_set_up_has_the_two_commands() {
        let readme = fs::read_to_string(workspace_root().join("README.md")).expect("read README");
        let start = readme
            .find("## Set up")
            .expect("README.md has a `## Set up` section");
        let section = &readme[start + 1..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let commands: Vec<&str> = section
            .split("```sh\n")
            .skip(1)
            .map(|block| block.split("```").next().unwrap_or_default().trim())
            .collect();
        assert_eq!(commands.len(), 2, "README's Set up has {commands:?}");
        assert!(
            commands.iter().all(|command| !command.contains('\n')),
            "each set-up command is one line: {commands:?}"
        );
        assert!(
            commands[0].starts_with("cargo run --release")
                && commands[0].contains("run topologies/default.toml"),
            "the first command runs the default topology: {:?}",
            commands[0]
        );
        assert!(
            workspace_root().join("topologies/default.toml").exists(),
            "topologies/default.toml is missing"
        );
        assert_eq!(
            commands[1], "cargo test --workspace",
            "the second command runs the tests"
        );
    }

    /// The binary picks the transports (issue 12): the libraries devices are written against
    /// compile none, so a device crate never drags libfabric or zmq.rs in by itself.
    #[test]
    fn libraries_below_the_binary_depend_on_no_transport() {
        const TRANSPORTS: [&str; 3] = ["ferromq-zmq", "ferromq-shm", "ferromq-ofi"];
        for krate in ["device", "devices", "topology"] {
            let manifest = workspace_root()
                .join("crates")
                .join(krate)
                .join("Cargo.toml");
            let text = fs::read_to_string(&manifest).expect("read Cargo.toml");
            let dependencies = text
                .split("\n[")
                .find(|section| section.starts_with("dependencies]"))
                .unwrap_or_default();
            for transport in TRANSPORTS {
                assert!(
                    !dependencies
                        .lines()
                        .any(|line| line.trim_start().starts_with(transport)),
                    "{} depends on {transport}; transports are registered by the binary",
                    manifest.display()
                );
            }
        }
    }
}
