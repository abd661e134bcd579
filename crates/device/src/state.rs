//! FairMQ's device state machine: exactly its states, transitions and edges.
//!
//! ```text
//! IDLE --INIT DEVICE--> INITIALIZING DEVICE --COMPLETE INIT--> INITIALIZED --BIND--> BINDING
//!   --(auto)--> BOUND --CONNECT--> CONNECTING --(auto)--> DEVICE READY --INIT TASK-->
//!   INITIALIZING TASK --(auto)--> READY --RUN--> RUNNING --STOP or (auto)--> READY
//! READY --RESET TASK--> RESETTING TASK --(auto)--> DEVICE READY
//! INITIALIZED | BOUND | DEVICE READY --RESET DEVICE--> RESETTING DEVICE --(auto)--> IDLE
//! IDLE --END--> EXITING;  any state but EXITING and ERROR --ERROR FOUND--> ERROR --END--> EXITING
//! ```
//!
//! [`next_state`] is the whole table; everything else in the crate asks it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A device state, named as FairMQ names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum State {
    /// Nothing configured.
    #[serde(rename = "IDLE")]
    Idle,
    /// Reading configuration, creating channels, `init` hook.
    #[serde(rename = "INITIALIZING DEVICE")]
    InitializingDevice,
    /// Configured; channels exist but are not attached.
    #[serde(rename = "INITIALIZED")]
    Initialized,
    /// Binding channels.
    #[serde(rename = "BINDING")]
    Binding,
    /// Every binding channel is bound.
    #[serde(rename = "BOUND")]
    Bound,
    /// Connecting channels.
    #[serde(rename = "CONNECTING")]
    Connecting,
    /// Every channel is attached.
    #[serde(rename = "DEVICE READY")]
    DeviceReady,
    /// `init_task` hook.
    #[serde(rename = "INITIALIZING TASK")]
    InitializingTask,
    /// Ready to run.
    #[serde(rename = "READY")]
    Ready,
    /// The `run` hook (or the `on_data` loop) is running.
    #[serde(rename = "RUNNING")]
    Running,
    /// `reset_task` hook.
    #[serde(rename = "RESETTING TASK")]
    ResettingTask,
    /// Closing channels, `reset` hook.
    #[serde(rename = "RESETTING DEVICE")]
    ResettingDevice,
    /// Leaving.
    #[serde(rename = "EXITING")]
    Exiting,
    /// A hook failed.
    #[serde(rename = "ERROR")]
    Error,
}

impl State {
    /// Every state, in the order of the diagram.
    pub const ALL: [State; 14] = [
        State::Idle,
        State::InitializingDevice,
        State::Initialized,
        State::Binding,
        State::Bound,
        State::Connecting,
        State::DeviceReady,
        State::InitializingTask,
        State::Ready,
        State::Running,
        State::ResettingTask,
        State::ResettingDevice,
        State::Exiting,
        State::Error,
    ];

    /// FairMQ's name (`DEVICE READY`).
    pub fn name(self) -> &'static str {
        match self {
            State::Idle => "IDLE",
            State::InitializingDevice => "INITIALIZING DEVICE",
            State::Initialized => "INITIALIZED",
            State::Binding => "BINDING",
            State::Bound => "BOUND",
            State::Connecting => "CONNECTING",
            State::DeviceReady => "DEVICE READY",
            State::InitializingTask => "INITIALIZING TASK",
            State::Ready => "READY",
            State::Running => "RUNNING",
            State::ResettingTask => "RESETTING TASK",
            State::ResettingDevice => "RESETTING DEVICE",
            State::Exiting => "EXITING",
            State::Error => "ERROR",
        }
    }

    /// The automatic transition out of a working state, if it has one (BINDING → BOUND, ...).
    pub fn auto_next(self) -> Option<State> {
        match self {
            State::Binding => Some(State::Bound),
            State::Connecting => Some(State::DeviceReady),
            State::InitializingTask => Some(State::Ready),
            State::Running => Some(State::Ready),
            State::ResettingTask => Some(State::DeviceReady),
            State::ResettingDevice => Some(State::Idle),
            _ => None,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for State {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let wanted = text.trim().replace('_', " ").to_ascii_uppercase();
        State::ALL
            .into_iter()
            .find(|state| state.name() == wanted)
            .ok_or_else(|| UnknownName {
                kind: "state",
                name: text.to_owned(),
            })
    }
}

/// A transition a controller can request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Transition {
    /// IDLE → INITIALIZING DEVICE.
    #[serde(rename = "INIT DEVICE")]
    InitDevice,
    /// INITIALIZING DEVICE → INITIALIZED.
    #[serde(rename = "COMPLETE INIT")]
    CompleteInit,
    /// INITIALIZED → BINDING.
    #[serde(rename = "BIND")]
    Bind,
    /// BOUND → CONNECTING.
    #[serde(rename = "CONNECT")]
    Connect,
    /// DEVICE READY → INITIALIZING TASK.
    #[serde(rename = "INIT TASK")]
    InitTask,
    /// READY → RUNNING.
    #[serde(rename = "RUN")]
    Run,
    /// RUNNING → READY.
    #[serde(rename = "STOP")]
    Stop,
    /// READY → RESETTING TASK.
    #[serde(rename = "RESET TASK")]
    ResetTask,
    /// INITIALIZED, BOUND or DEVICE READY → RESETTING DEVICE.
    #[serde(rename = "RESET DEVICE")]
    ResetDevice,
    /// IDLE or ERROR → EXITING.
    #[serde(rename = "END")]
    End,
    /// Any working state → ERROR.
    #[serde(rename = "ERROR FOUND")]
    ErrorFound,
}

impl Transition {
    /// Every transition.
    pub const ALL: [Transition; 11] = [
        Transition::InitDevice,
        Transition::CompleteInit,
        Transition::Bind,
        Transition::Connect,
        Transition::InitTask,
        Transition::Run,
        Transition::Stop,
        Transition::ResetTask,
        Transition::ResetDevice,
        Transition::End,
        Transition::ErrorFound,
    ];

    /// FairMQ's name (`INIT DEVICE`).
    pub fn name(self) -> &'static str {
        match self {
            Transition::InitDevice => "INIT DEVICE",
            Transition::CompleteInit => "COMPLETE INIT",
            Transition::Bind => "BIND",
            Transition::Connect => "CONNECT",
            Transition::InitTask => "INIT TASK",
            Transition::Run => "RUN",
            Transition::Stop => "STOP",
            Transition::ResetTask => "RESET TASK",
            Transition::ResetDevice => "RESET DEVICE",
            Transition::End => "END",
            Transition::ErrorFound => "ERROR FOUND",
        }
    }
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transition {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let wanted = text.trim().replace('_', " ").to_ascii_uppercase();
        Transition::ALL
            .into_iter()
            .find(|transition| transition.name() == wanted)
            .ok_or_else(|| UnknownName {
                kind: "transition",
                name: text.to_owned(),
            })
    }
}

/// A state or transition name that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {name:?}")]
pub struct UnknownName {
    /// `state` or `transition`.
    pub kind: &'static str,
    /// The name given.
    pub name: String,
}

/// The state `transition` leads to from `state`, or `None` when FairMQ's machine has no such edge.
pub fn next_state(state: State, transition: Transition) -> Option<State> {
    use State as S;
    use Transition as T;
    match (state, transition) {
        (S::Idle, T::InitDevice) => Some(S::InitializingDevice),
        (S::InitializingDevice, T::CompleteInit) => Some(S::Initialized),
        (S::Initialized, T::Bind) => Some(S::Binding),
        (S::Bound, T::Connect) => Some(S::Connecting),
        (S::DeviceReady, T::InitTask) => Some(S::InitializingTask),
        (S::Ready, T::Run) => Some(S::Running),
        (S::Running, T::Stop) => Some(S::Ready),
        (S::Ready, T::ResetTask) => Some(S::ResettingTask),
        (S::Initialized | S::Bound | S::DeviceReady, T::ResetDevice) => Some(S::ResettingDevice),
        (S::Idle | S::Error, T::End) => Some(S::Exiting),
        (S::Exiting | S::Error, T::ErrorFound) => None,
        (_, T::ErrorFound) => Some(S::Error),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use State as S;
    use Transition as T;

    /// Every edge of FairMQ's machine that a controller requests.
    const VALID: &[(State, Transition, State)] = &[
        (S::Idle, T::InitDevice, S::InitializingDevice),
        (S::InitializingDevice, T::CompleteInit, S::Initialized),
        (S::Initialized, T::Bind, S::Binding),
        (S::Bound, T::Connect, S::Connecting),
        (S::DeviceReady, T::InitTask, S::InitializingTask),
        (S::Ready, T::Run, S::Running),
        (S::Running, T::Stop, S::Ready),
        (S::Ready, T::ResetTask, S::ResettingTask),
        (S::Initialized, T::ResetDevice, S::ResettingDevice),
        (S::Bound, T::ResetDevice, S::ResettingDevice),
        (S::DeviceReady, T::ResetDevice, S::ResettingDevice),
        (S::Idle, T::End, S::Exiting),
        (S::Error, T::End, S::Exiting),
    ];

    #[test]
    fn every_valid_transition() {
        for &(from, transition, to) in VALID {
            assert_eq!(
                next_state(from, transition),
                Some(to),
                "{from} --{transition}-->"
            );
        }
        for state in State::ALL {
            let expected = (!matches!(state, S::Exiting | S::Error)).then_some(S::Error);
            assert_eq!(
                next_state(state, T::ErrorFound),
                expected,
                "{state} --ERROR FOUND-->"
            );
        }
    }

    #[test]
    fn every_invalid_transition_is_refused() {
        let mut n_refused = 0;
        for state in State::ALL {
            for transition in Transition::ALL {
                let listed = VALID
                    .iter()
                    .any(|&(from, t, _)| from == state && t == transition);
                if listed || transition == T::ErrorFound {
                    continue;
                }
                assert_eq!(
                    next_state(state, transition),
                    None,
                    "{state} --{transition}--> must be refused"
                );
                n_refused += 1;
            }
        }
        assert_eq!(n_refused, 14 * 10 - VALID.len());
    }

    #[test]
    fn full_cycles_through_auto_transitions() {
        // init → run → stop → reset → end, following auto edges as the device does.
        let requested = [
            T::InitDevice,
            T::CompleteInit,
            T::Bind,
            T::Connect,
            T::InitTask,
            T::Run,
            T::Stop,
            T::ResetTask,
            T::ResetDevice,
            T::End,
        ];
        let mut state = S::Idle;
        let mut visited = vec![state];
        for transition in requested {
            state = next_state(state, transition)
                .unwrap_or_else(|| panic!("{state} --{transition}-->"));
            visited.push(state);
            while let Some(next) = state.auto_next().filter(|_| state != S::Running) {
                state = next;
                visited.push(state);
            }
        }
        assert_eq!(
            visited,
            [
                S::Idle,
                S::InitializingDevice,
                S::Initialized,
                S::Binding,
                S::Bound,
                S::Connecting,
                S::DeviceReady,
                S::InitializingTask,
                S::Ready,
                S::Running,
                S::Ready,
                S::ResettingTask,
                S::DeviceReady,
                S::ResettingDevice,
                S::Idle,
                S::Exiting,
            ]
        );
    }

    #[test]
    fn names_round_trip() {
        for state in State::ALL {
            assert_eq!(state.name().parse::<State>(), Ok(state));
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{}\"", state.name())
            );
        }
        for transition in Transition::ALL {
            assert_eq!(transition.name().parse::<Transition>(), Ok(transition));
        }
        assert_eq!("init_device".parse::<Transition>(), Ok(T::InitDevice));
        assert!("JUMP".parse::<Transition>().is_err());
    }
}
