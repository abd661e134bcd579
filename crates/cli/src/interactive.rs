//! `--control interactive`: FairMQ's single-key control on a terminal.
//!
//! The terminal leaves canonical mode (keys arrive one at a time, unechoed) but keeps its output
//! processing and signal keys, so log lines print normally and Ctrl-C is an ordinary SIGINT.

use std::io::Read;
use std::sync::Mutex;

use anyhow::Result;
use ferromq_device::{DeviceController, State, Transition, control};
use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};

const HELP: &str = "keys: [h] help, [i] init device, [b] bind, [x] connect, [j] init task, [r] run, \
[s] stop, [t] reset task, [d] reset device, [q] end (going down from any state), [p] properties, [c] counters";

/// The terminal settings to put back when interactive control ends.
static SAVED_TERMINAL: Mutex<Option<Termios>> = Mutex::new(None);

/// Puts the terminal back as it was, if interactive control changed it.
pub fn restore_terminal() {
    let saved = SAVED_TERMINAL
        .lock()
        .map(|mut saved| saved.take())
        .unwrap_or_default();
    if let Some(saved) = saved {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &saved);
    }
}

fn single_key_mode() -> Result<()> {
    let stdin = std::io::stdin();
    let saved = termios::tcgetattr(&stdin)?;
    let mut keys = saved.clone();
    keys.local_flags
        .remove(LocalFlags::ICANON | LocalFlags::ECHO);
    keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
    keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
    termios::tcsetattr(&stdin, SetArg::TCSANOW, &keys)?;
    *SAVED_TERMINAL.lock().expect("terminal settings lock") = Some(saved);
    Ok(())
}

/// Reads keys until the device reaches EXITING.
///
/// # Errors
/// The device's error when it went through ERROR, or the terminal's.
pub async fn run(controller: &DeviceController) -> Result<()> {
    single_key_mode()?;
    let outcome = read_keys(controller).await;
    restore_terminal();
    outcome
}

async fn read_keys(controller: &DeviceController) -> Result<()> {
    let (key_sender, mut keys) = tokio::sync::mpsc::unbounded_channel();
    // Terminal reads block: they get a thread of their own.
    std::thread::spawn(move || {
        let mut key = [0u8; 1];
        while let Ok(1) = std::io::stdin().read(&mut key) {
            if key_sender.send(char::from(key[0])).is_err() {
                break;
            }
        }
    });
    println!("{HELP}");
    let mut states = controller.subscribe();
    loop {
        let key = tokio::select! {
            key = keys.recv() => match key {
                Some(key) => key,
                None => return Ok(()),
            },
            changed = states.changed() => {
                if changed.is_err() || *states.borrow() == State::Exiting {
                    return finish(controller);
                }
                continue;
            }
        };
        let transition = match key {
            'h' => {
                println!("{HELP}");
                continue;
            }
            'p' => {
                println!("properties: {:?}", controller.properties());
                continue;
            }
            'c' => {
                println!("counters: {:?}", controller.counters());
                continue;
            }
            'q' => {
                control::shut_down(controller).await.ok();
                return finish(controller);
            }
            'i' => Transition::InitDevice,
            'b' => Transition::Bind,
            'x' => Transition::Connect,
            'j' => Transition::InitTask,
            'r' => Transition::Run,
            's' => Transition::Stop,
            't' => Transition::ResetTask,
            'd' => Transition::ResetDevice,
            '\n' | '\r' | ' ' => continue,
            other => {
                println!("unknown key {other:?}; press h for help");
                continue;
            }
        };
        let result = controller.change_state(transition).await;
        // FairMQ's 'i' both starts and completes initialisation.
        let result = match (transition, result) {
            (Transition::InitDevice, Ok(_)) => {
                controller.change_state(Transition::CompleteInit).await
            }
            (_, result) => result,
        };
        if let Err(error) = result {
            println!("{error}");
        }
    }
}

fn finish(controller: &DeviceController) -> Result<()> {
    match controller.last_error() {
        Some(error) => Err(anyhow::anyhow!(error)),
        None => Ok(()),
    }
}
