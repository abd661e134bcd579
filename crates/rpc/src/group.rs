//! [`join`]: a device joins an rpc group declared in its topology (`[[rpc]]`, see
//! docs/topology.md).
//!
//! The launcher gives every member a pull channel named after the group (its inbound), a push
//! channel `<group>-out` with one socket per member (socket i connected to member i), and the
//! properties `rpc.<group>.members` (the instance ids, in order) and `rpc.<group>.<key>` for the
//! group's settings. `join` takes those channels out of the device (the device no longer closes
//! them: call [`Rpc::shutdown`] before the device leaves RUNNING, or let the last handle drop)
//! and starts the member.

use std::time::Duration;

use ferromq_device::{DeviceContext, DeviceError};
use thiserror::Error;

use crate::handlers::Handlers;
use crate::node::{Rpc, RpcOptions, StartError};
use crate::outlet::Aggregation;

/// Why a device could not join its rpc group.
#[derive(Debug, Error)]
pub enum JoinError {
    /// The device is not a member (no `rpc.<group>.members` property naming it).
    #[error("device {device:?} is not a member of rpc group {group:?}: {why}")]
    NotAMember {
        /// The device.
        device: String,
        /// The group.
        group: String,
        /// What was missing.
        why: String,
    },
    /// A property of the group has a value that is no setting.
    #[error("device {device:?}: property {key:?} = {value:?}: {problem}")]
    Property {
        /// The device.
        device: String,
        /// The property.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The push channel has not one socket per member.
    #[error("device {device:?}: channel {channel:?} has {found} sockets for {expected} members")]
    Sockets {
        /// The device.
        device: String,
        /// The channel.
        channel: String,
        /// Members in the group.
        expected: usize,
        /// Sockets the channel has.
        found: usize,
    },
    /// The device has no such channel.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The member could not start.
    #[error(transparent)]
    Start(#[from] StartError),
}

/// The keys of group `G` that a member reads from its properties, `rpc.G.KEY` ([`join`] and
/// [`options_from_properties`]); an `[[rpc]]` group sets them for its members. Any other
/// `rpc.` property changes nothing, so the topology's check and `ferromq device` refuse it.
pub const GROUP_KEYS: [&str; 6] = [
    "members",
    "aggregate",
    "aggregate-bytes",
    "aggregate-us",
    "timeout-ms",
    "tree-arity",
];

/// The settings of `group` from the device's properties (defaults where none is given).
///
/// # Errors
/// [`JoinError::Property`] naming a property whose value is no setting.
pub fn options_from_properties(ctx: &DeviceContext, group: &str) -> Result<RpcOptions, JoinError> {
    let mut options = RpcOptions::default();
    let property = |key: &str| {
        debug_assert!(
            GROUP_KEYS.contains(&key),
            "{key} is read, not in GROUP_KEYS"
        );
        let key = format!("rpc.{group}.{key}");
        ctx.property_text(&key).map(|value| (key, value))
    };
    let bad = |key: String, value: String, problem: String| JoinError::Property {
        device: ctx.id().to_owned(),
        key,
        value,
        problem,
    };
    if let Some((key, value)) = property("aggregate") {
        options.aggregation = value
            .parse::<Aggregation>()
            .map_err(|problem| bad(key, value, problem))?;
    }
    let number = |name: &str, bounds: (u64, u64)| -> Result<Option<u64>, JoinError> {
        let Some((key, value)) = property(name) else {
            return Ok(None);
        };
        match value.parse::<u64>() {
            Ok(number) if (bounds.0..=bounds.1).contains(&number) => Ok(Some(number)),
            _ => {
                let problem = format!("must be a whole number from {} to {}", bounds.0, bounds.1);
                Err(bad(key, value, problem))
            }
        }
    };
    if let Some(bytes) = number("aggregate-bytes", crate::AGGREGATE_BYTES_BOUNDS)? {
        options.aggregate_bytes = bytes as usize;
    }
    if let Some(micros) = number("aggregate-us", crate::AGGREGATE_US_BOUNDS)? {
        options.aggregate_delay = Duration::from_micros(micros);
    }
    if let Some(millis) = number("timeout-ms", (1, 86_400_000))? {
        options.timeout = Duration::from_millis(millis);
    }
    if let Some(arity) = number("tree-arity", (1, 255))? {
        options.tree_arity = arity as u8;
    }
    Ok(options)
}

/// Joins `group` with `handlers`, settings from the topology (see the module docs).
///
/// # Errors
/// [`JoinError`] naming the device, the group and what is missing or wrong.
pub async fn join(
    ctx: &mut DeviceContext,
    group: &str,
    handlers: Handlers,
) -> Result<Rpc, JoinError> {
    let options = options_from_properties(ctx, group)?;
    join_with(ctx, group, handlers, options).await
}

/// [`join`] with settings given in code (overriding the topology's).
///
/// # Errors
/// As [`join`].
pub async fn join_with(
    ctx: &mut DeviceContext,
    group: &str,
    handlers: Handlers,
    options: RpcOptions,
) -> Result<Rpc, JoinError> {
    let device = ctx.id().to_owned();
    let not_a_member = |why: String| JoinError::NotAMember {
        device: device.clone(),
        group: group.to_owned(),
        why,
    };
    let members_key = format!("rpc.{group}.{}", GROUP_KEYS[0]);
    let names: Vec<String> = ctx
        .property_text(&members_key)
        .ok_or_else(|| not_a_member(format!("it has no property {members_key:?} (declare the group with [[rpc]] in a topology and start it with `ferromq run`: a device started alone is in no group)")))?
        .split(',')
        .map(str::to_owned)
        .collect();
    let me = names
        .iter()
        .position(|name| *name == device)
        .ok_or_else(|| not_a_member(format!("{members_key} lists {}", names.join(", "))))?;
    let lender = ctx.transport_of(group)?;
    let inbound = ctx
        .take_channel_sockets(group)?
        .into_iter()
        .next()
        .expect("take_channel_sockets returns at least one socket");
    let out = format!("{group}-out");
    let outbound = ctx.take_channel_sockets(&out)?;
    if outbound.len() != names.len() {
        return Err(JoinError::Sockets {
            device,
            channel: out,
            expected: names.len(),
            found: outbound.len(),
        });
    }
    let outbound = outbound
        .into_iter()
        .enumerate()
        .map(|(idx, channel)| (idx != me).then_some(channel))
        .collect();
    Ok(Rpc::from_channels(
        Some(lender),
        me,
        names,
        inbound,
        outbound,
        handlers,
        options,
    )?)
}
