//! [`OfiSocket`]: one end of an ofi channel, the async front of the driver task in `driver.rs`.
//!
//! The socket is a thin front: `bind`/`connect` open the engine and start the driver; `send`
//! takes a credit and hands the message to the driver; `receive` takes whole messages from a
//! queue the driver fills; `close` asks the driver to drain and waits for it, then reports what
//! is left in that queue (a pull's or pair's) as undelivered. An ofi channel has
//! exactly one peer at a time: a second connector is refused with a reason it reports.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferromq_core::{
    Address, ChannelConfig, ChannelLabel, Error, Parts, Result, SendError, Socket, SocketType,
    TcpHost,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use zeromq::Socket as _;

use crate::OfiOptions;
use crate::driver::{self, DriverCommand, Link, Outgoing, Shared, Side, sleep_until_opt};
use crate::engine::{EngineHandle, EngineStats};
use crate::protocol::{MAX_CHUNKS, MAX_PARTS};

/// One end of an ofi channel.
pub(crate) struct OfiSocket {
    label: ChannelLabel,
    config: ChannelConfig,
    options: Arc<OfiOptions>,
    shared: Arc<Shared>,
    credits: Arc<Semaphore>,
    link: Option<Link>,
    received: Option<mpsc::Receiver<Parts>>,
    stats: Arc<EngineStats>,
    /// A credit set aside by `reserve_send` for the next send.
    reserved: Option<OwnedSemaphorePermit>,
}

impl OfiSocket {
    pub(crate) fn new(
        config: &ChannelConfig,
        socket_name: &str,
        options: Arc<OfiOptions>,
        stats: Arc<EngineStats>,
    ) -> Result<OfiSocket> {
        let mut label = ChannelLabel::new(socket_name, config.socket_type);
        label.address = config.address.clone();
        if !matches!(
            config.socket_type,
            SocketType::Push
                | SocketType::Pull
                | SocketType::Pair
                | SocketType::Req
                | SocketType::Rep
        ) {
            return Err(Error::WrongSocketType {
                channel: label,
                operation: "use the ofi transport (it carries push, pull, pair, req and rep)",
            });
        }
        Ok(OfiSocket {
            label,
            config: config.clone(),
            options,
            shared: Arc::default(),
            credits: Arc::new(Semaphore::new(config.snd_buf_size.max(1))),
            link: None,
            received: None,
            stats,
            reserved: None,
        })
    }

    fn can_send(&self) -> bool {
        !matches!(self.config.socket_type, SocketType::Pull)
    }

    fn can_receive(&self) -> bool {
        !matches!(self.config.socket_type, SocketType::Push)
    }

    /// Why `parts` cannot be sent on this socket at all, if they cannot.
    fn refusal(&self, parts: &Parts) -> Option<Error> {
        // req/rep alternation is `Channel`'s, as for every transport.
        if !self.can_send() {
            return Some(Error::WrongSocketType {
                channel: self.label.clone(),
                operation: "send",
            });
        }
        if parts.len() > MAX_PARTS {
            return Some(Error::Transport {
                channel: self.label.clone(),
                source: format!(
                    "a message of {} parts; the ofi transport carries at most {MAX_PARTS}",
                    parts.len()
                )
                .into(),
            });
        }
        let too_large = parts
            .iter()
            .find(|part| part.len().div_ceil(self.options.max_chunk) > MAX_CHUNKS)?;
        Some(Error::MessageTooLarge {
            channel: self.label.clone(),
            size: too_large.len(),
            limit: MAX_CHUNKS * self.options.max_chunk,
        })
    }

    /// One of the `sndBufSize` credits, waiting at most `timeout`; a peer's death reported
    /// meanwhile ends the wait. Cancel-safe: a dropped wait holds no credit.
    async fn wait_for_credit(&mut self, timeout: Option<Duration>) -> Result<OwnedSemaphorePermit> {
        let deadline = timeout.map(|after| Instant::now() + after);
        loop {
            if let Some(problem) = self
                .shared
                .send_problem
                .lock()
                .expect("problem lock")
                .take()
            {
                return Err(problem.into_error(&self.label));
            }
            tokio::select! {
                credit = Arc::clone(&self.credits).acquire_owned() => {
                    return Ok(credit.expect("the credit semaphore is never closed"));
                }
                () = self.shared.send_wakeup.notified() => {}
                () = sleep_until_opt(deadline) => {
                    return Err(Error::Timeout {
                        channel: self.label.clone(),
                        after: timeout.unwrap_or_default(),
                    });
                }
            }
        }
    }

    /// Hands an accepted message and its credit to the driver.
    // The error hands the message back, as every send does.
    #[allow(clippy::result_large_err)]
    fn hand_to_driver(
        &self,
        parts: Parts,
        credit: OwnedSemaphorePermit,
    ) -> Result<(), SendError<Parts>> {
        let interrupted = || Error::Interrupted {
            channel: self.label.clone(),
        };
        let Some(link) = &self.link else {
            return Err(SendError::new(interrupted(), parts));
        };
        let outgoing = Outgoing {
            parts: parts.into_vec(),
            _credit: credit,
        };
        if let Err(mpsc::error::SendError(DriverCommand::Send(outgoing))) =
            link.commands.send(DriverCommand::Send(outgoing))
        {
            return Err(SendError::new(interrupted(), outgoing.parts.into()));
        }
        Ok(())
    }

    /// The zmq address of the side channel, the default provider and the interface to open the
    /// endpoint on, for an ofi address.
    fn plan(&self, address: &Address) -> Result<(Address, String)> {
        let (host, port, provider) = match address {
            Address::Tcp { host, port } => (host, port, "tcp;ofi_rxm"),
            Address::Verbs { host, port } => (host, port, "verbs;ofi_rxm"),
            _ => {
                return Err(Error::UnsupportedAddress {
                    channel: self.label.clone(),
                    address: address.to_string(),
                    reason: "ofi channels take tcp://host:port (libfabric's tcp provider) or verbs://host:port (RDMA)",
                });
            }
        };
        let provider = self
            .config
            .provider
            .clone()
            .unwrap_or_else(|| provider.to_owned());
        Ok((
            Address::Tcp {
                host: host.clone(),
                port: *port,
            },
            provider,
        ))
    }

    fn start_engine(&mut self, provider: &str, node: Option<&str>) -> Result<EngineHandle> {
        let engine = EngineHandle::start(
            provider,
            node,
            self.options.max_chunk,
            &self.label.name,
            Arc::clone(&self.stats),
        )
        .map_err(|error| {
            let on = node.map(|node| format!(" on {node}")).unwrap_or_default();
            // FI_ENODATA from fi_getinfo: no provider of that name serves that address here.
            let hint = if error.call == "fi_getinfo" && error.code == 61 {
                " (no such provider for this address on this host: verbs needs an RDMA device \
                 and its drivers; `fi_info -l` lists the providers present)"
            } else {
                ""
            };
            Error::Transport {
                channel: self.label.clone(),
                source: format!(
                    "cannot open a libfabric endpoint with provider {provider:?}{on}: {error}{hint}"
                )
                .into(),
            }
        })?;
        Ok(engine)
    }

    fn start_driver(&mut self, engine: EngineHandle, side: Side) {
        let (link, received) = driver::spawn(
            self.label.clone(),
            &self.config,
            Arc::clone(&self.options),
            Arc::clone(&self.shared),
            engine,
            side,
        );
        self.link = Some(link);
        self.received = Some(received);
    }

    fn check_unlinked(&self, address: &Address) -> Result<()> {
        if self.link.is_some() {
            return Err(Error::UnsupportedAddress {
                channel: self.label.clone(),
                address: address.to_string(),
                reason: "an ofi channel has one peer: bind or connect it once",
            });
        }
        Ok(())
    }
}

fn is_loopback(host: &TcpHost) -> bool {
    match host {
        TcpHost::Any => false,
        TcpHost::Name(name) => {
            name == "localhost" || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
    }
}

#[async_trait]
impl Socket for OfiSocket {
    fn label(&self) -> &ChannelLabel {
        &self.label
    }

    async fn bind(&mut self, address: &Address) -> Result<Address> {
        self.check_unlinked(address)?;
        let (side_address, provider) = self.plan(address)?;
        let node = match &side_address {
            Address::Tcp {
                host: TcpHost::Name(name),
                ..
            } => Some(name.clone()),
            _ => None,
        };
        let mut router = zeromq::RouterSocket::new();
        let (bound, _) =
            ferromq_zmq::endpoint::bind(&mut router, &self.label, &side_address).await?;
        let engine = self.start_engine(&provider, node.as_deref())?;
        let Address::Tcp { host, port } = bound else {
            unreachable!("a tcp bind reports a tcp address")
        };
        let bound = match address {
            Address::Verbs { .. } => Address::Verbs { host, port },
            _ => Address::Tcp { host, port },
        };
        tracing::debug!(channel = %self.label, %bound, provider = engine.provider(), "ofi bound");
        self.start_driver(engine, Side::Binder(router));
        self.label.address = Some(bound.to_string());
        Ok(bound)
    }

    async fn connect(&mut self, address: &Address) -> Result<()> {
        self.check_unlinked(address)?;
        let (side_address, provider) = self.plan(address)?;
        let endpoint = ferromq_zmq::endpoint::connect_endpoint(&self.label, &side_address)?;
        let node = match &side_address {
            Address::Tcp { host, .. } if is_loopback(host) => match host {
                TcpHost::Name(name) => Some(name.clone()),
                TcpHost::Any => None,
            },
            _ => None,
        };
        let engine = self.start_engine(&provider, node.as_deref())?;
        self.start_driver(
            engine,
            Side::Connector {
                endpoint,
                dealer: None,
                retry_at: Instant::now(),
            },
        );
        self.label.address = Some(address.to_string());
        Ok(())
    }

    async fn send_parts(
        &mut self,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), SendError<Parts>> {
        if let Some(error) = self.refusal(&parts) {
            return Err(SendError::new(error, parts));
        }
        // A credit (one set aside by a reservation first).
        let credit = match self.reserved.take() {
            Some(credit) => credit,
            None => match self.wait_for_credit(timeout).await {
                Ok(credit) => credit,
                Err(error) => return Err(SendError::new(error, parts)),
            },
        };
        self.hand_to_driver(parts, credit)
    }

    async fn reserve_send(&mut self) -> Result<bool> {
        if !self.can_send() {
            return Err(Error::WrongSocketType {
                channel: self.label.clone(),
                operation: "send",
            });
        }
        if self.reserved.is_none() {
            self.reserved = Some(self.wait_for_credit(None).await?);
        }
        Ok(true)
    }

    fn send_reserved(&mut self, parts: Parts) -> Result<(), SendError<Parts>> {
        if let Some(error) = self.refusal(&parts) {
            return Err(SendError::new(error, parts));
        }
        let Some(credit) = self.reserved.take() else {
            let error = Error::Unsupported {
                channel: self.label.clone(),
                operation: "send through a reservation",
                reason: "no room was reserved on this channel (Channel::reserve first)",
            };
            return Err(SendError::new(error, parts));
        };
        self.hand_to_driver(parts, credit)
    }

    async fn receive_parts(&mut self) -> Result<Parts> {
        if !self.can_receive() {
            return Err(Error::WrongSocketType {
                channel: self.label.clone(),
                operation: "receive",
            });
        }
        let Some(received) = self.received.as_mut() else {
            return Err(Error::Interrupted {
                channel: self.label.clone(),
            });
        };
        loop {
            if let Ok(parts) = received.try_recv() {
                return Ok(parts);
            }
            if let Some(problem) = self
                .shared
                .receive_problem
                .lock()
                .expect("problem lock")
                .take()
            {
                return Err(problem.into_error(&self.label));
            }
            tokio::select! {
                parts = received.recv() => match parts {
                    Some(parts) => return Ok(parts),
                    None => return Err(Error::Interrupted { channel: self.label.clone() }),
                },
                () = self.shared.receive_wakeup.notified() => {}
            }
        }
    }

    async fn close(&mut self, linger: Duration) -> Result<()> {
        let Some(link) = self.link.take() else {
            return Ok(());
        };
        let (done, lost) = oneshot::channel();
        let lost = if link
            .commands
            .send(DriverCommand::Close { linger, done })
            .is_ok()
        {
            lost.await.unwrap_or(0)
        } else {
            0
        };
        let _ = link.task.await;
        // What reached this pull or pair whole and the device did not take: its sender saw the
        // transfer complete, so it is this side's to report (a req's or rep's is not: a reply
        // is the acknowledgement).
        let unread = match self.received.take() {
            Some(mut received) if self.config.socket_type.counts_unread_at_close() => {
                received.close();
                std::iter::from_fn(|| received.try_recv().ok()).count()
            }
            _ => 0,
        };
        let sent = match lost {
            0 => Ok(()),
            lost => Err(Error::Undelivered {
                channel: self.label.clone(),
                n_messages: lost as u64,
                reason: format!("nothing moved to the peer for linger = {linger:?}"),
            }),
        };
        const UNREAD: &str = "they reached this receiver, and it closed before taking them";
        ferromq_core::with_unread_at_close(sent, &self.label, unread as u64, UNREAD)
    }
}

impl Drop for OfiSocket {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            link.task.abort();
        }
    }
}
