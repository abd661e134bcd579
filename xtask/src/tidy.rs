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
        let may_use_unsafe = ["shm", "ofi", "ofi-sys"];
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
}
