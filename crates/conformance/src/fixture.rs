//! What a scenario works with: the transport of its trial, fresh addresses, channels opened the
//! way devices open them, and a watchdog around every wait.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferromq_core::{Address, Channel, ChannelConfig, Method, SocketType, Transport};

use crate::failure::{During, Failure};
use crate::{AddressScheme, Suite, WATCHDOG};

/// Names that belong to one trial: its session (shared with the trial's child processes) and the
/// prefix of its ipc paths and inproc names.
#[derive(Debug, Clone)]
pub struct TrialEnv {
    session: String,
}

impl TrialEnv {
    pub(crate) fn new(trial_idx: usize) -> TrialEnv {
        TrialEnv {
            session: format!("conformance-{}-{trial_idx}", std::process::id()),
        }
    }

    pub(crate) fn from_session(session: String) -> TrialEnv {
        TrialEnv { session }
    }

    /// The trial's session name (unique in this machine while the trial runs).
    pub fn session(&self) -> &str {
        &self.session
    }
}

/// The transport under test for one trial, and the channels a scenario opens on it.
pub struct Fixture {
    pub(crate) suite: Arc<Suite>,
    pub(crate) env: TrialEnv,
    transport: Arc<dyn Transport>,
    next_address: AtomicUsize,
    ipc_paths: Mutex<Vec<PathBuf>>,
}

/// Messages a test channel keeps queued each way unless a scenario says otherwise.
pub(crate) const QUEUE: usize = 1000;

impl Fixture {
    pub(crate) fn new(suite: Arc<Suite>, env: TrialEnv) -> Fixture {
        let transport = (suite.make_transport)(&env);
        Fixture {
            suite,
            env,
            transport,
            next_address: AtomicUsize::new(0),
            ipc_paths: Mutex::new(Vec::new()),
        }
    }

    /// The transport under test.
    pub fn transport(&self) -> &dyn Transport {
        &*self.transport
    }

    /// An address to bind that nothing else uses: port 0 on loopback, or a fresh ipc path or
    /// inproc name.
    pub(crate) fn fresh_address(&self) -> String {
        let idx = self.next_address.fetch_add(1, Ordering::Relaxed);
        match self.suite.scheme {
            AddressScheme::Tcp => "tcp://127.0.0.1:0".to_owned(),
            AddressScheme::Ipc => {
                let path =
                    std::env::temp_dir().join(format!("ferromq-{}-{idx}.ipc", self.env.session));
                let address = format!("ipc://{}", path.display());
                self.ipc_paths
                    .lock()
                    .expect("no scenario panics while holding the path list")
                    .push(path);
                address
            }
            AddressScheme::Inproc => format!("inproc://{}-{idx}", self.env.session),
        }
    }

    /// An address a connector can use before anything binds it: a free loopback port (bound
    /// and released at once), or a fresh ipc path or inproc name.
    pub(crate) fn unbound_address(&self) -> Result<String, Failure> {
        match self.suite.scheme {
            AddressScheme::Tcp => {
                let listener = std::net::TcpListener::bind("127.0.0.1:0")
                    .map_err(|error| Failure::call("picking a free loopback port", &error))?;
                let port = listener
                    .local_addr()
                    .map_err(|error| Failure::call("reading the free port", &error))?
                    .port();
                Ok(format!("tcp://127.0.0.1:{port}"))
            }
            AddressScheme::Ipc | AddressScheme::Inproc => Ok(self.fresh_address()),
        }
    }

    /// The configuration scenarios start from: no rate logging, `QUEUE` messages each way and
    /// a generous linger (debug builds verifying large payloads are slow).
    pub(crate) fn config(socket_type: SocketType, method: Method) -> ChannelConfig {
        let mut config = ChannelConfig::new("data", socket_type, method);
        config.rate_logging = 0;
        config.snd_buf_size = QUEUE;
        config.rcv_buf_size = QUEUE;
        config.linger = 30_000;
        config
    }

    /// Opens a channel of `config` on the transport under test.
    pub(crate) async fn open(&self, config: ChannelConfig) -> Result<Channel, Failure> {
        let what = format!("opening a {} channel", config.socket_type.as_str());
        Channel::open(self.transport(), config, "data")
            .await
            .during(&what)
    }

    /// A channel of `socket_type` bound to a fresh address, and the address it bound.
    pub(crate) async fn bound(
        &self,
        socket_type: SocketType,
    ) -> Result<(Channel, Address), Failure> {
        self.bound_with(Self::config(socket_type, Method::Bind))
            .await
    }

    /// A channel of `config` bound to a fresh address, and the address it bound.
    pub(crate) async fn bound_with(
        &self,
        config: ChannelConfig,
    ) -> Result<(Channel, Address), Failure> {
        let what = format!("binding a {}", config.socket_type.as_str());
        let mut channel = self.open(config).await?;
        let address = parse(&self.fresh_address())?;
        let bound = watch(&what, channel.bind(&address)).await?.during(&what)?;
        Ok((channel, bound))
    }

    /// A channel of `socket_type` connected to `address`.
    pub(crate) async fn connected(
        &self,
        socket_type: SocketType,
        address: &Address,
    ) -> Result<Channel, Failure> {
        self.connected_with(Self::config(socket_type, Method::Connect), address)
            .await
    }

    /// A channel of `config` connected to `address`.
    pub(crate) async fn connected_with(
        &self,
        config: ChannelConfig,
        address: &Address,
    ) -> Result<Channel, Failure> {
        let what = format!("connecting a {} to {address}", config.socket_type.as_str());
        let mut channel = self.open(config).await?;
        watch(&what, channel.connect(address))
            .await?
            .during(&what)?;
        Ok(channel)
    }

    /// Whether the transport refuses `socket_type` by design.
    pub(crate) fn refuses(&self, socket_type: SocketType) -> bool {
        self.suite.is_refused(socket_type)
    }

    /// Whether a channel of the transport serves one peer at a time, by design (ofi).
    pub(crate) fn one_peer_per_channel(&self) -> bool {
        self.suite.one_peer_per_channel
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let paths = self
            .ipc_paths
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for path in paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Parses an address the suite made itself.
pub(crate) fn parse(text: &str) -> Result<Address, Failure> {
    Address::parse(text).map_err(|error| Failure::call(&format!("parsing {text}"), &error))
}

/// Waits for `future` under the watchdog.
pub(crate) async fn watch<T>(what: &str, future: impl Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(WATCHDOG, future)
        .await
        .map_err(|_| Failure::Stuck {
            what: what.to_owned(),
            after: WATCHDOG,
        })
}
