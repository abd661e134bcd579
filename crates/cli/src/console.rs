//! The launcher's output: device lines scroll, the live table stays at the bottom.
//!
//! On a terminal the table is a region managed by `indicatif` (chosen over cursor codes by hand:
//! it redraws the region in place, prints every other line above it, and keeps both intact when
//! a line arrives between two redraws). Anywhere else (a pipe, a file, CI) nothing is redrawn:
//! lines pass through as they come and each table is printed whole, so logs stay greppable.
//!
//! One console per process ([`Console::global`]); the line forwarders of every device and the
//! supervision loop share it. When the run ends (`finish`) the last table stays on screen as plain
//! lines and everything after goes below it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where the launcher writes.
pub struct Console {
    live: Option<Live>,
}

struct Live {
    region: MultiProgress,
    table: ProgressBar,
    /// Set by [`Console::finish`]: output goes below the last table from then on.
    finished: AtomicBool,
}

static CONSOLE: OnceLock<Console> = OnceLock::new();

impl Console {
    /// Sets the process's console up: a live region when `terminal`. Later calls keep the first.
    pub fn init(terminal: bool) -> &'static Console {
        CONSOLE.get_or_init(|| Console {
            live: terminal.then(|| {
                let region = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
                let table = region.add(ProgressBar::new_spinner());
                table.set_style(
                    ProgressStyle::with_template("{msg}").expect("a template without keys"),
                );
                Live {
                    region,
                    table,
                    finished: AtomicBool::new(false),
                }
            }),
        })
    }

    /// The process's console (plain output if [`Console::init`] was not called).
    pub fn global() -> &'static Console {
        Console::init(false)
    }

    fn region(&self) -> Option<&Live> {
        self.live
            .as_ref()
            .filter(|live| !live.finished.load(Ordering::Acquire))
    }

    /// True when the table is redrawn in place.
    pub fn is_live(&self) -> bool {
        self.region().is_some()
    }

    /// A line on stdout (above the table when live).
    pub fn line(&self, text: &str) {
        match self.region() {
            // It fails only when stdout is gone, where println would panic: drop the line.
            Some(live) => {
                let _ = live.region.println(text);
            }
            None => println!("{text}"),
        }
    }

    /// A line on stderr (above the table when live: the region steps aside while it prints).
    pub fn error_line(&self, text: &str) {
        match self.region() {
            Some(live) => live.region.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }

    /// Shows `lines` as the table: redrawn in place when live, printed otherwise.
    pub fn table(&self, lines: &[String]) {
        match self.region() {
            Some(live) => live.table.set_message(lines.join("\n")),
            None => println!("{}", lines.join("\n")),
        }
    }

    /// Ends the live region; the last table stays on screen and later output goes below it.
    pub fn finish(&self) {
        if let Some(live) = self.region() {
            // Printed above as plain lines, then the region goes: the cursor ends on a new line.
            let last = live.table.message();
            if !last.is_empty() {
                let _ = live.region.println(last);
            }
            live.table.finish_and_clear();
            live.finished.store(true, Ordering::Release);
        }
    }
}
