//! `ferromq run`'s live table: on a terminal it stays at the bottom, redrawn in place, while the
//! devices' log lines scroll above it, none erased; everywhere its first figures are rates, not
//! zeros. The terminal is a pseudo-terminal from util-linux's `script`, read back through a
//! terminal emulator (`vt100`).

mod support;

use std::process::Stdio;

use support::finish;
use tokio::process::Command;

fn topology(name: &str) -> String {
    format!("{}/../../topologies/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A sampler → sink pair whose sink logs its rate every second: lines that arrive between two
/// redraws of the table.
fn chatty_topology(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join(format!("chatty-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        r#"transport = "shmem"

[[device]]
id = "sampler"
kind = "sampler"
properties = { msg-size = 1024, rate = 2000 }

[[device.channel]]
name = "data"
type = "push"

[[device]]
id = "sink"
kind = "sink"

[[device.channel]]
name = "data"
type = "pull"
connect = "sampler.data"
rateLogging = 1
"#,
    )
    .expect("write the topology");
    file
}

/// The row of `device` in the first table of `output`, split into columns.
fn first_row<'a>(output: &'a str, device: &str) -> Vec<&'a str> {
    output
        .lines()
        .skip_while(|line| !line.starts_with("device "))
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|columns| columns.first() == Some(&device))
        .unwrap_or_else(|| panic!("no table row for {device}:\n{output}"))
}

#[tokio::test]
async fn the_first_table_shows_rates_not_zeros() {
    let run = Command::new(env!("CARGO_BIN_EXE_ferromq"))
        .args(["run", &topology("default.toml"), "--duration", "5"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ferromq run");
    let run = finish(run).await;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    // device, state, channel, in msg/s, in MB/s, out msg/s, out MB/s
    let row = first_row(&run.stdout, "sampler");
    let sent_per_second: f64 = row[5].parse().expect("a rate");
    assert!(
        sent_per_second > 0.0,
        "the first table shows a sampler sending nothing: {row:?}\n{}",
        run.stdout
    );
}

#[tokio::test]
async fn on_a_terminal_log_lines_stay_above_a_single_table() {
    let dir = std::env::temp_dir();
    let file = chatty_topology(&dir);
    // A terminal tall enough that nothing scrolls away, as wide as the emulator below.
    let (rows, cols): (u16, u16) = (1000, 200);
    let inner = format!(
        "stty rows {rows} cols {cols}; exec '{}' run '{}' --duration 5",
        env!("CARGO_BIN_EXE_ferromq"),
        file.display()
    );
    let script = Command::new("script")
        .args(["-qfec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("util-linux's script");
    let run = finish(script).await;
    let _ = std::fs::remove_file(&file);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let size = |n: u16| std::num::NonZeroU16::new(n).expect("not zero");
    let mut terminal = vt100::Parser::new(size(rows), size(cols), 0);
    terminal.process(run.stdout.as_bytes());
    let screen = terminal
        .screen()
        .rows(0, cols)
        .map(|row| row.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n");
    let written = run.stdout.matches("][sink] data: in: ").count();
    let shown = screen.matches("][sink] data: in: ").count();
    assert!(
        written >= 2,
        "the sink logged too little to test:\n{screen}"
    );
    assert_eq!(
        shown, written,
        "log lines written between two tables were erased:\n{screen}"
    );
    let headers = screen
        .lines()
        .filter(|line| line.starts_with("device "))
        .count();
    assert_eq!(headers, 1, "one table on screen, not {headers}:\n{screen}");
    assert!(
        screen.contains("ferromq: duration reached"),
        "the stop's lines go below the table:\n{screen}"
    );
}
