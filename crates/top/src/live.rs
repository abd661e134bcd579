//! The live view: the table redrawn in the terminal every interval until `q`, Esc or Ctrl-C.
//!
//! The terminal is put in raw mode on the alternate screen for the view's life and given back
//! as it was on every way out, an error or a panic included (`TerminalGuard`). Keys arrive as
//! an async stream beside the refresh tick, so a key is acted on at once, not at the next
//! refresh; a look that waits for slow devices (a second at most) is raced against the keys too.

use std::io::Stdout;
use std::time::Duration;

use crossterm::event::{Event, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use futures_util::StreamExt;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Row, Table};

use crate::render::{COLUMNS, rows, summary};
use crate::snapshot::{Observer, Snapshot};

/// Restores the terminal when dropped.
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> std::io::Result<TerminalGuard> {
        crossterm::terminal::enable_raw_mode()?;
        let guard = TerminalGuard;
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::LeaveAlternateScreen,
            crossterm::cursor::Show
        );
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// True for the keys that leave: q, Esc, Ctrl-C (raw mode turns Ctrl-C into a key).
fn leaves(key: &KeyEvent) -> bool {
    key.kind != KeyEventKind::Release
        && (matches!(key.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc)
            || (key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL)))
}

/// Shows `session`'s devices (all when `None`) every `interval` until the user leaves.
///
/// # Errors
/// The terminal cannot be put in raw mode or drawn on (standard output is not a terminal).
pub async fn run(
    observer: &mut Observer,
    session: Option<&str>,
    interval: Duration,
) -> std::io::Result<()> {
    let _guard = TerminalGuard::enter()?;
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // The guard's drop runs after the hook: give the terminal back first so the message
        // can be read.
        let _ = crossterm::execute!(std::io::stdout(), crossterm::terminal::LeaveAlternateScreen);
        let _ = crossterm::terminal::disable_raw_mode();
        previous_hook(info);
    }));
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    let mut keys = EventStream::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shown: Option<Snapshot> = None;
    loop {
        tokio::select! {
            key = keys.next() => match key {
                Some(Ok(Event::Key(key))) if leaves(&key) => return Ok(()),
                Some(Ok(Event::Resize(..))) => {
                    if let Some(snapshot) = &shown {
                        draw(&mut terminal, snapshot, session, interval)?;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error),
                None => return Ok(()),
            },
            _ = tick.tick() => {
                let look = observer.look(session);
                tokio::pin!(look);
                let snapshot = loop {
                    tokio::select! {
                        snapshot = &mut look => break snapshot,
                        key = keys.next() => match key {
                            Some(Ok(Event::Key(key))) if leaves(&key) => return Ok(()),
                            Some(Err(error)) => return Err(error),
                            None => return Ok(()),
                            Some(Ok(_)) => {}
                        },
                    }
                };
                draw(&mut terminal, &snapshot, session, interval)?;
                shown = Some(snapshot);
            }
        }
    }
}

fn draw(
    terminal: &mut Terminal<CrosstermBackend<Stdout>>,
    snapshot: &Snapshot,
    session: Option<&str>,
    interval: Duration,
) -> std::io::Result<()> {
    let scope = session.map_or_else(
        || "every session".to_owned(),
        |session| format!("session {session}"),
    );
    let title = format!(
        " ferromq top: {scope}, every {:.1} s; q to leave ",
        interval.as_secs_f64()
    );
    let body = rows(snapshot);
    let mut widths = COLUMNS.map(|column| column.len());
    for row in &body {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let empty = body.is_empty();
    let table = Table::new(
        body.into_iter().map(Row::new),
        widths.map(|width| Constraint::Length(u16::try_from(width).unwrap_or(u16::MAX))),
    )
    .header(Row::new(COLUMNS).style(Style::default().add_modifier(Modifier::BOLD)))
    .block(Block::bordered().title(title));
    let status = if empty {
        format!(
            "no running device{} found on this host",
            session.map_or_else(String::new, |session| format!(" of session {session}"))
        )
    } else {
        summary(snapshot)
    };
    terminal.draw(|frame| {
        let [top, bottom] =
            Layout::vertical([Constraint::Min(3), Constraint::Length(1)]).areas(frame.area());
        frame.render_widget(table, top);
        frame.render_widget(Line::from(status), bottom);
    })?;
    Ok(())
}
