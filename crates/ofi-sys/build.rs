//! Finds the system libfabric with pkg-config, generates bindings for its headers with bindgen and
//! compiles the shim that exports its static inline calls.

use std::env;
use std::path::PathBuf;

/// The oldest libfabric this crate is written against (Debian 12's `libfabric-dev`).
const MINIMUM_VERSION: &str = "1.17";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim.h");
    println!("cargo:rerun-if-changed=shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if env::var_os("CARGO_FEATURE_OFI").is_none() {
        // Without the `ofi` feature the crate is empty and libfabric is not needed.
        return;
    }

    let library = match pkg_config::Config::new()
        .atleast_version(MINIMUM_VERSION)
        .probe("libfabric")
    {
        Ok(library) => library,
        Err(error) => {
            // One clear line instead of a wall of linker or clang errors further down.
            panic!(
                "\n\nferromq-ofi-sys: libfabric >= {MINIMUM_VERSION} was not found by pkg-config \
                 ({error}).\nThe `ofi` feature needs libfabric's headers and library: install \
                 `libfabric-dev` (Debian/Ubuntu: `apt-get install -y libfabric-dev`; Fedora/RHEL: \
                 `dnf install libfabric-devel`), or point PKG_CONFIG_PATH at a libfabric.pc.\n\
                 Without the `ofi` feature ferromq builds without libfabric.\n"
            );
        }
    };

    let mut shim = cc::Build::new();
    shim.file("shim.c").warnings(true);
    for path in &library.include_paths {
        shim.include(path);
    }
    shim.compile("ferromq_ofi_shim");

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("fi_getinfo|fi_freeinfo|fi_dupinfo|fi_strerror|fi_version")
        .allowlist_function("ferromq_fi_.*")
        .allowlist_var("ferromq_fi_.*|FI_.*")
        .allowlist_type("fi_.*|fid_.*")
        .allowlist_item("FI_.*")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for path in &library.include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|error| {
        panic!(
            "ferromq-ofi-sys: bindgen could not read libfabric's headers ({error}); bindgen needs \
             libclang (Debian/Ubuntu: `apt-get install -y libclang-dev`)"
        )
    });
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("OUT_DIR is writable");
}
