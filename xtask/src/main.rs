//! ferromq's project automation, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `ci`: what `.ci/run` checks: formatting, clippy with warnings denied, the test suite.
//! - `fmt`: formats the workspace.
//! - `lint`: clippy over every target with warnings denied.
//! - `bench`: the criterion suites and `ferromq bench`, then `target/bench-report/report.md` and
//!   SVG plots.
//!
//! The project's tidy rules (no sleeps in tests, module docs, unsafe confined to the crates that
//! need it) are `#[test]`s in this crate, so `cargo test --workspace` enforces them.
#![forbid(unsafe_code)]

mod bench;
mod tidy;

use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ferromq project automation")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// fmt --check, clippy -D warnings, and the whole test suite (what CI runs).
    Ci,
    /// Format the workspace.
    Fmt,
    /// Clippy over every target with warnings denied.
    Lint,
    /// Criterion suites and `ferromq bench`; writes target/bench-report/report.md and plots.
    Bench,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.task, Task::Bench) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace");
        return if bench::run(&cargo, workspace) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let steps: Vec<Vec<&str>> = match cli.task {
        Task::Ci => vec![
            vec!["fmt", "--all", "--", "--check"],
            vec![
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
            vec!["test", "--workspace"],
        ],
        Task::Fmt => vec![vec!["fmt", "--all"]],
        Task::Lint => vec![vec![
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]],
        Task::Bench => unreachable!("handled above"),
    };
    for step in steps {
        if !run_cargo(&step) {
            eprintln!("xtask: `cargo {}` failed", step.join(" "));
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn run_cargo(args: &[&str]) -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("xtask: cargo {}", args.join(" "));
    Command::new(cargo)
        .args(args)
        .status()
        .is_ok_and(|status| status.success())
}
