//! Remote invocation between ferromq devices: typed calls, results, buffers and broadcasts,
//! with calls to one destination packed into frames (after Seriema's RDMA-based remote
//! invocation and its aggregator).
//!
//! A group is a list of [`Member`]s, each with an inbound pull channel; every member connects a
//! push channel to every other, over any transport (zeromq tcp, ipc and inproc, shmem, ofi).
//! [`Rpc`] is one member:
//!
//! ```no_run
//! # async fn example(transport: std::sync::Arc<dyn ferromq_core::Transport>,
//! #                  members: Vec<ferromq_rpc::Member>, me: usize) -> anyhow::Result<()> {
//! use ferromq_rpc::{Handlers, Inbound, Procedure, Rpc, RpcOptions};
//!
//! struct Add;
//! impl Procedure for Add {
//!     const NAME: &'static str = "add";
//!     type Args = (u64, u64);
//!     type Output = u64;
//! }
//!
//! let inbound = Inbound::bind(transport.as_ref(), &members[me].address).await?;
//! let handlers = Handlers::new().on::<Add, _, _>(|_, (a, b)| async move { a + b });
//! let rpc = Rpc::start(transport, me, &members, inbound, handlers, RpcOptions::default()).await?;
//! assert_eq!(rpc.call_return::<Add>(0, &(2, 3)).await?, 5);
//! rpc.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! [`procedures!`] declares several procedures, a line each (`Add = "add": (u64, u64) => u64;`).
//!
//! - `call` (fire and forget), `call_buffer` (the handler runs once the buffer is there; on
//!   shmem a buffer in shared memory moves as a descriptor; [`CallBuilder::call_buffer_pull`]:
//!   the destination fetches it when it is ready), `call_return` (a typed result),
//!   `broadcast` / `broadcast_buffer` (over a k-ary tree); through [`Rpc::to`] a call chooses
//!   what a full destination means ([`WhenFull`]: wait, queue, fail handing the call back) and
//!   when its [`Ticket`] is done ([`Confirm`]: accepted, left, consumed).
//! - Arguments and results are serde types (postcard), or [`Plain`] plain-old-data moved as
//!   its bytes.
//! - Calls from one member to another run in the order they were made ([`CallWriter`]: its
//!   own calls run in order; it is a sender of its own).
//! - Handlers are async ([`Handlers::on`]) or synchronous ([`Handlers::on_sync`]: no future per
//!   call; such a handler calls with [`Rpc::queue_call`]).
//! - A missing handler, arguments that do not decode and a panicking handler come back to the
//!   caller as [`CallError::Remote`] naming the device, the handler and the cause; the
//!   destination keeps serving.
//! - [`Aggregation`]: `none`, `trad` (frames of `aggregate_bytes`, held `aggregate_delay`) or
//!   `ovfl` (packed only while the destination lags), per member in [`RpcOptions`].
//!
//! In a device, [`join`] starts a member of a group declared in the topology (`[[rpc]]`).
//!
//! Module map: `wire.rs` (the frame), `handlers.rs` (procedures and the handler table),
//! `outlet.rs` (aggregation and sending to one destination), `writer.rs` ([`CallWriter`]: one
//! caller's `trad` calls in a frame of its own, no lock per call), `node.rs` (the member: calls,
//! pending results, the dispatcher, broadcast trees), `group.rs` (joining a topology's group).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod group;
mod handlers;
mod node;
mod outlet;
mod plain;
mod wire;
mod writer;

pub use error::{CallError, Refused, RemoteFailure};
pub use group::{GROUP_KEYS, JoinError, join, join_with, options_from_properties};
pub use handlers::{HandlerId, Handlers, Invocation, Procedure};
pub use node::{
    AGGREGATE_BYTES_BOUNDS, AGGREGATE_US_BOUNDS, CLOSE_GRACE, CallBuilder, Confirm, Inbound,
    Member, Rpc, RpcOptions, RpcStats, StartError, Ticket, WhenFull,
};
pub use outlet::Aggregation;
pub use plain::Plain;
pub use wire::{Status, WireError};
pub use writer::CallWriter;

/// Entry points for `ferromq-fuzz` (crates/fuzz): the frame reader, reachable from outside the
/// crate. Not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::wire::{self, FrameReader, Record, RecordHead, Status};

    /// Reads every record of `frame` record by record and as a member's dispatcher does (runs
    /// of short calls taken whole), which must agree, then writes the records again as an
    /// outlet writes them and reads that back. `Ok(false)` when the frame is refused; `Err`
    /// when two readings differ.
    ///
    /// # Errors
    /// A description of the difference.
    pub fn read_frame(frame: &[u8]) -> Result<bool, String> {
        let as_dispatcher = read_as_dispatcher(frame);
        let Some((from, records)) = read_all(frame) else {
            return match as_dispatcher {
                None => Ok(false),
                Some((_, records)) => Err(format!(
                    "refused record by record, read as {} records with runs of short calls",
                    records.len()
                )),
            };
        };
        match as_dispatcher {
            Some((again_from, again)) if again_from == from && again == records => {}
            Some((_, again)) => {
                return Err(format!(
                    "{} records record by record, {} otherwise with runs of short calls",
                    records.len(),
                    again.len()
                ));
            }
            None => {
                return Err(format!(
                    "{} records record by record, refused with runs of short calls",
                    records.len()
                ));
            }
        }
        let written = wire::write_frame(from, &records);
        match read_all(&written) {
            Some((again_from, again)) if again_from == from && again == records => Ok(true),
            Some(_) => Err(format!(
                "{} records of member {from} read back otherwise once written again",
                records.len()
            )),
            None => Err(format!(
                "{} records of member {from}, written again, were refused",
                records.len()
            )),
        }
    }

    fn read_all(frame: &[u8]) -> Option<(u32, Vec<Record<'_>>)> {
        let mut reader = FrameReader::new(frame).ok()?;
        let mut records = Vec::new();
        while let Some(record) = reader.next_record() {
            records.push(record.ok()?);
        }
        Some((reader.from, records))
    }

    /// As [`read_all`], the way the dispatcher reads: after a plain call, the short calls to its
    /// handler that follow are taken in runs (of at most `CALLS_PER_LOOK`, as the dispatcher's) by
    /// `FrameReader::next_short_call_to`, the rest record by record.
    fn read_as_dispatcher(frame: &[u8]) -> Option<(u32, Vec<Record<'_>>)> {
        let mut reader = FrameReader::new(frame).ok()?;
        let mut records = Vec::new();
        let mut plain_call_to = None;
        loop {
            if let Some(handler) = plain_call_to
                && reader.at_short_call_to(handler)
            {
                let mut run = 0;
                while run < crate::node::CALLS_PER_LOOK
                    && let Some(payload) = reader.next_short_call_to(handler)
                {
                    records.push(Record {
                        head: RecordHead::call(handler, 0, 0),
                        payload,
                    });
                    run += 1;
                }
                if run > 0 {
                    continue;
                }
            }
            let Some(record) = reader.next_record() else {
                break;
            };
            let record = record.ok()?;
            if record.head.kind == wire::KIND_CALL && record.head.flags & wire::PULL == 0 {
                plain_call_to = Some(record.head.handler);
            }
            records.push(record);
        }
        Some((reader.from, records))
    }

    /// Frames to start from: every record kind, plain calls in the short form, a broadcast, an
    /// empty frame.
    pub fn frame_examples() -> Vec<Vec<u8>> {
        let call = |handler, seq, flags| RecordHead::call(handler, seq, flags);
        let answer = |kind, seq, status| RecordHead::answer(kind, 0xfeed, seq, status);
        let mut broadcast = call(0xb0, 0, wire::WANTS_ACK);
        broadcast.kind = wire::KIND_BROADCAST;
        broadcast.arity = 2;
        broadcast.root = 3;
        let frames: Vec<Vec<(RecordHead, &[u8])>> = vec![
            vec![],
            vec![
                (call(0xfeed, 0, 0), &[1; 8]),
                (call(0xfeed, 0, 0), &[2; 8]),
                (call(0xfeed, 0, 0), b""),
                (call(0xbeef, 0, 0), &[3; 64]),
                (call(0xbeef, 0, 0), &[4; 300]),
            ],
            vec![
                (call(0xfeed, 1, wire::WANTS_RESULT), b"args"),
                (call(0xfeed, 2, wire::BUFFER | wire::WANTS_ACK), b""),
                (call(0xfeed, 3, wire::BUFFER | wire::PULL), b"pull"),
                (call(0xfeed, 0, 0), &[5; 8]),
            ],
            vec![
                (answer(wire::KIND_REPLY, 1, Status::Ok), b"result"),
                (answer(wire::KIND_ACK, 2, Status::Panicked), b"why"),
                (answer(wire::KIND_FETCH, 3, Status::Ok), b""),
                (answer(wire::KIND_FETCHED, 3, Status::BadFrame), b""),
            ],
            vec![(broadcast, b"to all")],
        ];
        frames
            .iter()
            .enumerate()
            .map(|(from, records)| {
                let records: Vec<Record<'_>> = records
                    .iter()
                    .map(|&(head, payload)| Record { head, payload })
                    .collect();
                wire::write_frame(u32::try_from(from).unwrap_or(0), &records)
            })
            .collect()
    }
}
