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
//! - `call` (fire and forget), `call_buffer` (the handler runs once the buffer is there; on
//!   shmem a buffer in shared memory moves as a descriptor; [`CallBuilder::call_buffer_pull`]:
//!   the destination fetches it when it is ready), `call_return` (a typed result),
//!   `broadcast` / `broadcast_buffer` (over a k-ary tree); through [`Rpc::to`] a call chooses
//!   what a full destination means ([`WhenFull`]: wait, queue, fail handing the call back) and
//!   when its [`Ticket`] is done ([`Confirm`]: accepted, left, consumed).
//! - Arguments and results are serde types (postcard), or [`Plain`] plain-old-data moved as
//!   its bytes.
//! - Calls from one member to another run in the order they were made.
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
//! `outlet.rs` (aggregation and sending to one destination), `node.rs` (the member: calls,
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

pub use error::{CallError, Refused, RemoteFailure};
pub use group::{JoinError, join, join_with, options_from_properties};
pub use handlers::{HandlerId, Handlers, Invocation, Procedure};
pub use node::{
    AGGREGATE_BYTES_BOUNDS, AGGREGATE_US_BOUNDS, CallBuilder, Confirm, Inbound, Member, Rpc,
    RpcOptions, RpcStats, StartError, Ticket, WhenFull,
};
pub use outlet::Aggregation;
pub use plain::Plain;
pub use wire::{Status, WireError};
