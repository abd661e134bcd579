//! `ferromq top`: every device running on this host, live or in one snapshot.
//!
//! Devices say where they are through [`ferromq_device::presence`]: each `ferromq device`
//! process (and each binary built on `run_device_main`), whoever started it, keeps a file in
//! this user's presence directory naming a read-only control endpoint. This crate lists those
//! entries ([`Observer::look`]), asks every device at once for an `overview` (state, time in
//! state, channel counters) and turns two looks into rates ([`snapshot`]). What it shows is
//! drawn as a plain table or JSON ([`render`]) or, live, in the terminal ([`live`]).
//!
//! Looking never steers: the endpoints refuse every request that changes something, and
//! leaving (`q`, Esc, Ctrl-C) only closes this process's connections. A device that does not
//! answer within a second is shown as not answering, and asked again at the next refresh over
//! a fresh connection.
//!
//! The transport the endpoints are reached over (zeromq's ipc) is given by the binary, as
//! everywhere else: this crate compiles none.

#![forbid(unsafe_code)]

pub mod live;
pub mod render;
pub mod snapshot;

pub use snapshot::{ChannelRates, ChannelView, DeviceView, MemoryView, Observer, Snapshot};
