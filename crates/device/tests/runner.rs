//! The device runner in one process, over inproc channels.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferromq_core::{BoxError, ChannelConfig, Message, Method, Parts, SocketType};
use ferromq_device::{
    Device, DeviceConfig, DeviceContext, DeviceError, DeviceRunner, Flow, State, Transition,
    control,
};

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

/// The runner knows no transport of its own: these tests give it zeromq.
fn transports() -> std::sync::Arc<ferromq_core::TransportRegistry> {
    let mut registry = ferromq_core::TransportRegistry::new();
    ferromq_zmq::register(&mut registry);
    std::sync::Arc::new(registry)
}
static NEXT_NAME: AtomicU64 = AtomicU64::new(0);

fn unique(tag: &str) -> String {
    format!(
        "inproc://{tag}-{}",
        NEXT_NAME.fetch_add(1, Ordering::Relaxed)
    )
}

/// A device's runner and the driver of `--control static`'s sequence, each as a task, once
/// the device is in RUNNING, with its controller.
struct Running {
    task: tokio::task::JoinHandle<ferromq_device::Result<()>>,
    driver: tokio::task::JoinHandle<ferromq_device::Result<()>>,
    controller: ferromq_device::DeviceController,
}

async fn running(
    device: impl Device + 'static,
    config: DeviceConfig,
    registry: std::sync::Arc<ferromq_core::TransportRegistry>,
) -> Running {
    let (runner, controller) = DeviceRunner::new(device, config, registry);
    let task = tokio::spawn(runner.run());
    let driver = {
        let controller = controller.clone();
        tokio::spawn(async move { control::run_static(&controller).await })
    };
    controller
        .wait_for_state(State::Running, WAIT)
        .await
        .unwrap();
    Running {
        task,
        driver,
        controller,
    }
}

/// From IDLE to DEVICE READY, each transition with the state it leads to.
const TO_DEVICE_READY: [(Transition, State); 4] = [
    (Transition::InitDevice, State::InitializingDevice),
    (Transition::CompleteInit, State::Initialized),
    (Transition::Bind, State::Bound),
    (Transition::Connect, State::DeviceReady),
];

/// Asks for each transition in turn and waits for the state it leads to.
async fn step_through(
    controller: &ferromq_device::DeviceController,
    steps: &[(Transition, State)],
) {
    for &(transition, state) in steps {
        controller.change_state(transition).await.unwrap();
        controller.wait_for_state(state, WAIT).await.unwrap();
    }
}

struct Idle;

#[async_trait::async_trait]
impl Device for Idle {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        ctx.stopped().await;
        Ok(())
    }
}

#[tokio::test]
async fn invalid_transition_names_state_and_transition() {
    let (runner, controller) = DeviceRunner::new(Idle, DeviceConfig::new("idle"), transports());
    let task = tokio::spawn(runner.run());
    let error = controller.change_state(Transition::Run).await.unwrap_err();
    assert!(matches!(
        error,
        DeviceError::InvalidTransition {
            state: State::Idle,
            transition: Transition::Run
        }
    ));
    assert_eq!(
        error.to_string(),
        "transition RUN is not allowed in state IDLE"
    );
    controller.change_state(Transition::End).await.unwrap();
    task.await.unwrap().unwrap();
}

struct FailsInInitTask;

#[async_trait::async_trait]
impl Device for FailsInInitTask {
    async fn init_task(&mut self, _ctx: &mut DeviceContext) -> Result<(), BoxError> {
        Err("calibration file missing".into())
    }
    async fn run(&mut self, _ctx: &mut DeviceContext) -> Result<(), BoxError> {
        Ok(())
    }
}

#[tokio::test]
async fn failing_hook_moves_to_error_with_its_cause() {
    let (runner, controller) =
        DeviceRunner::new(FailsInInitTask, DeviceConfig::new("broken"), transports());
    let task = tokio::spawn(runner.run());
    let outcome = control::run_static(&controller).await;
    let text = outcome.unwrap_err().to_string();
    assert!(text.contains("calibration file missing"), "{text}");
    let error = task.await.unwrap().unwrap_err();
    assert!(
        matches!(
            error,
            DeviceError::Hook {
                hook: "init_task",
                state: State::InitializingTask,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        controller
            .last_error()
            .unwrap()
            .contains("calibration file missing")
    );
}

/// A failed device whose controllers are all dropped while it is in ERROR still ends with the
/// error that failed it: it used to end with "device ... is gone", which named the controllers'
/// end instead of the cause.
#[tokio::test]
async fn a_failed_device_whose_controllers_are_dropped_ends_with_its_failure() {
    let (runner, controller) =
        DeviceRunner::new(FailsInInitTask, DeviceConfig::new("broken"), transports());
    let task = tokio::spawn(runner.run());
    step_through(&controller, &TO_DEVICE_READY).await;
    controller.change_state(Transition::InitTask).await.unwrap();
    controller.wait_for_state(State::Error, WAIT).await.unwrap();
    drop(controller);
    let error = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the runner ends once its controllers are gone")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            error,
            DeviceError::Hook {
                hook: "init_task",
                ..
            }
        ),
        "{error}"
    );
    let cause = std::error::Error::source(&error).map(ToString::to_string);
    assert_eq!(
        cause.as_deref(),
        Some("calibration file missing"),
        "{error}"
    );
}

struct BlockedReceiver;

#[async_trait::async_trait]
impl Device for BlockedReceiver {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        // Nobody ever sends: STOP must interrupt the receive.
        match ctx.receive("data").await {
            Err(DeviceError::Channel(error)) if error.is_interrupted() => Ok(()),
            other => Err(format!("expected an interruption, got {other:?}").into()),
        }
    }
}

#[tokio::test]
async fn stop_interrupts_a_blocked_receive_and_the_device_goes_down_cleanly() {
    let channel =
        ChannelConfig::new("data", SocketType::Pull, Method::Bind).with_address(unique("blocked"));
    let config = DeviceConfig::new("sink").with_channel(channel).unwrap();
    let (runner, controller) = DeviceRunner::new(BlockedReceiver, config, transports());
    let task = tokio::spawn(runner.run());
    let mut changes = controller.subscribe_changes();
    let driver = {
        let controller = controller.clone();
        tokio::spawn(async move { control::run_static(&controller).await })
    };
    controller
        .wait_for_state(State::Running, WAIT)
        .await
        .unwrap();
    controller.abort("SIGINT");
    let mut seen = vec![];
    while let Ok(change) = changes.recv().await {
        seen.push(change.to);
        if change.to == State::Exiting {
            break;
        }
    }
    let after_running = seen
        .iter()
        .position(|&state| state == State::Running)
        .expect("RUNNING was seen");
    let seen = &seen[after_running + 1..];
    driver.await.unwrap().unwrap();
    task.await.unwrap().unwrap();
    assert_eq!(
        seen,
        [
            State::Ready,
            State::ResettingTask,
            State::DeviceReady,
            State::ResettingDevice,
            State::Idle,
            State::Exiting
        ]
    );
}

/// Connecting does not wait for the peer (FairMQ's devices go on to RUNNING, where messages wait
/// for it): a device whose address is never bound still reaches RUNNING, and an abort there
/// still takes it down, not a hang.
#[tokio::test]
async fn connecting_does_not_wait_for_the_peer_and_an_abort_ends_the_device() {
    let path = std::env::temp_dir().join(format!("ferromq-never-bound-{}.ipc", std::process::id()));
    let channel = ChannelConfig::new("data", SocketType::Pull, Method::Connect)
        .with_address(format!("ipc://{}", path.display()));
    let config = DeviceConfig::new("lonely").with_channel(channel).unwrap();
    let Running {
        task,
        driver,
        controller,
    } = running(Idle, config, transports()).await;
    controller.abort("SIGTERM");
    let driven = tokio::time::timeout(Duration::from_secs(30), driver)
        .await
        .expect("the driver hung after the abort")
        .unwrap();
    let finished = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the device hung after the abort")
        .unwrap();
    assert!(driven.is_ok(), "{driven:?}");
    assert!(finished.is_ok(), "{finished:?}");
    assert_eq!(controller.state(), State::Exiting);
}

/// A signal's abort meant for RUNNING that reaches the device once it left RUNNING by itself
/// (its `--max-iterations` as the signal came) does not fail it: the shutdown that follows
/// takes it down cleanly, RESET DEVICE closing its channels and reporting what they lost.
/// Before, the abort failed it in READY (ERROR, exit 1, channels dropped without a close).
#[tokio::test]
async fn an_abort_meant_for_a_state_the_device_left_is_not_a_failure() {
    let (runner, controller) = DeviceRunner::new(Idle, DeviceConfig::new("idle"), transports());
    let task = tokio::spawn(runner.run());
    step_through(&controller, &TO_DEVICE_READY).await;
    step_through(&controller, &[(Transition::InitTask, State::Ready)]).await;
    controller.abort_in(State::Running, "SIGTERM received in RUNNING");
    control::shut_down(&controller).await.unwrap();
    task.await.unwrap().unwrap();
    // Meant for the state it is in, it still fails the device.
    let (runner, controller) = DeviceRunner::new(Idle, DeviceConfig::new("idle"), transports());
    let task = tokio::spawn(runner.run());
    for transition in [Transition::InitDevice, Transition::CompleteInit] {
        controller.change_state(transition).await.unwrap();
    }
    controller
        .wait_for_state(State::Initialized, WAIT)
        .await
        .unwrap();
    controller.abort_in(State::Initialized, "SIGTERM received in INITIALIZED");
    assert!(control::shut_down(&controller).await.is_err());
    assert!(task.await.unwrap().is_err());
}

struct CountsPerChannel {
    counts: std::collections::BTreeMap<String, u64>,
    report: tokio::sync::mpsc::UnboundedSender<std::collections::BTreeMap<String, u64>>,
}

#[async_trait::async_trait]
impl Device for CountsPerChannel {
    async fn on_data(
        &mut self,
        channel: &str,
        _parts: Parts,
        _ctx: &mut DeviceContext,
    ) -> Result<Flow, BoxError> {
        *self.counts.entry(channel.to_owned()).or_default() += 1;
        Ok(Flow::Continue)
    }
    async fn reset_task(&mut self, _ctx: &mut DeviceContext) -> Result<(), BoxError> {
        self.report.send(self.counts.clone())?;
        Ok(())
    }
}

#[tokio::test]
async fn on_data_poller_serves_every_busy_channel() {
    let (left, right) = (unique("left"), unique("right"));
    let config = DeviceConfig::new("merger")
        .with_channel(
            ChannelConfig::new("left", SocketType::Pull, Method::Bind).with_address(&left),
        )
        .unwrap()
        .with_channel(
            ChannelConfig::new("right", SocketType::Pull, Method::Bind).with_address(&right),
        )
        .unwrap();
    let config = DeviceConfig {
        max_iterations: 2000,
        ..config
    };
    let (report, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let (runner, controller) = DeviceRunner::new(
        CountsPerChannel {
            counts: Default::default(),
            report,
        },
        config,
        transports(),
    );
    let task = tokio::spawn(runner.run());
    let driver = {
        let controller = controller.clone();
        tokio::spawn(async move { control::run_static(&controller).await })
    };
    controller
        .wait_for_state(State::DeviceReady, WAIT)
        .await
        .unwrap();
    // Both inputs are flooded: each must get a fair share of the 2000 iterations.
    let transport = ferromq_zmq::ZmqTransport::new();
    let mut senders = Vec::new();
    for address in [&left, &right] {
        let config = ChannelConfig::new("out", SocketType::Push, Method::Connect)
            .with_address(address.as_str());
        let mut channel = ferromq_core::Channel::open(&transport, config, "out")
            .await
            .unwrap();
        channel.connect_configured().await.unwrap();
        senders.push(tokio::spawn(async move {
            while channel.send(Message::from("x")).await.is_ok() {}
        }));
    }
    // It stops after 2000 with both inputs still flooded: what was sent to it and not taken
    // is reported when its channels close, and the device fails for it.
    let driven = driver.await.unwrap();
    let ran = task.await.unwrap();
    for ended in [
        driven.map_err(|error| error.to_string()),
        ran.map_err(|error| error.to_string()),
    ] {
        assert!(
            ended
                .as_ref()
                .is_err_and(|error| error.contains("accepted by send were not delivered")),
            "{ended:?}"
        );
    }
    let counts = reports.recv().await.unwrap();
    assert_eq!(counts.values().sum::<u64>(), 2000);
    for (channel, n_msgs) in &counts {
        assert!(
            *n_msgs >= 500,
            "{channel} got only {n_msgs} of 2000: {counts:?}"
        );
    }
    for sender in senders {
        sender.abort();
    }
}

/// The runner makes channels only from the transports it was given: a name the binary did not
/// register fails INIT naming the name and what exists, and the device still exits.
#[tokio::test]
async fn a_transport_the_binary_did_not_register_is_refused_naming_it() {
    let mut channel = ChannelConfig::new("data", SocketType::Pull, Method::Bind)
        .with_address(unique("unregistered"));
    channel.transport = Some("shmem".to_owned());
    let config = DeviceConfig::new("picky").with_channel(channel).unwrap();
    let (runner, controller) = DeviceRunner::new(Idle, config, transports());
    let task = tokio::spawn(runner.run());
    let driven = control::run_static(&controller).await;
    let text = driven.expect_err("shmem is not registered").to_string();
    let finished = task.await.unwrap();
    let finished = ferromq_device::error_chain(&finished.expect_err("the device failed"));
    for text in [&text, &finished] {
        assert!(
            text.contains("unknown transport \"shmem\"") && text.contains("built in: zeromq"),
            "{text}"
        );
    }
}

/// A program adds a transport of its own under a name of its own, and channels configured with
/// that name use it, with the traits registered for it: one transport per name per device,
/// however many channels use it.
#[tokio::test]
async fn a_transport_the_program_registers_carries_the_channels_that_name_it() {
    let made = std::sync::Arc::new(AtomicU64::new(0));
    let mut registry = ferromq_core::TransportRegistry::new();
    {
        let made = std::sync::Arc::clone(&made);
        registry.register(
            "counted",
            // Not true of zeromq: shows that a channel's traits are those of the name it was
            // made from.
            ferromq_core::TransportTraits::PLAIN.lending_shared_memory(),
            move |_options| {
                made.fetch_add(1, Ordering::Relaxed);
                Ok(std::sync::Arc::new(ferromq_zmq::ZmqTransport::new()))
            },
        );
    }
    let address = unique("counted");
    let mut config = DeviceConfig::new("own-transport");
    for (name, socket_type, method) in [
        ("in", SocketType::Pull, Method::Bind),
        ("out", SocketType::Push, Method::Connect),
    ] {
        let mut channel =
            ChannelConfig::new(name, socket_type, method).with_address(address.as_str());
        channel.transport = Some("counted".to_owned());
        config = config.with_channel(channel).unwrap();
    }
    config.max_iterations = 5;
    let (runner, controller) = DeviceRunner::new(Loopback, config, std::sync::Arc::new(registry));
    let task = tokio::spawn(runner.run());
    control::run_static(&controller).await.unwrap();
    let device = task.await.unwrap();
    assert!(device.is_ok(), "{device:?}");
    assert_eq!(made.load(Ordering::Relaxed), 1);
}

/// Sends to itself and receives it back, once per iteration.
struct Loopback;

#[async_trait::async_trait]
impl Device for Loopback {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        if !ctx.transport_traits("out")?.lends_shared_memory {
            return Err("the channel's traits are not those registered for its name".into());
        }
        while ctx.next_iteration() {
            ctx.send("out", Message::from("loop")).await?;
            let back = ctx.receive("in").await?;
            assert_eq!(back.data(), b"loop");
        }
        Ok(())
    }
}

/// Ignores STOP: its run never ends (as one stuck sending to a peer on a lost host).
struct Stuck;

#[async_trait::async_trait]
impl Device for Stuck {
    async fn run(&mut self, _ctx: &mut DeviceContext) -> Result<(), BoxError> {
        std::future::pending().await
    }
}

/// Serves external control with a heartbeat limit and nobody ever asking anything.
async fn serve_unattended(device: impl Device + 'static, tag: &str, to_running: bool) {
    let config = DeviceConfig::new(tag);
    let heartbeat = Duration::from_millis(200);
    let (served, controller) = serve_silently(device, config, to_running, heartbeat).await;
    if to_running {
        assert!(
            matches!(served, Err(DeviceError::LauncherGone { ref device, .. }) if device == tag),
            "{served:?}"
        );
    } else {
        assert!(
            matches!(served, Err(DeviceError::LauncherSilent { ref device, .. }) if device == tag),
            "{served:?}"
        );
        assert_eq!(controller.state(), State::Exiting);
    }
}

/// Runs `device` of `config` (to RUNNING when `to_running`) and serves its external control
/// with a `heartbeat` limit and nobody ever asking anything, until the endpoint ends.
async fn serve_silently(
    device: impl Device + 'static,
    config: DeviceConfig,
    to_running: bool,
    heartbeat: Duration,
) -> (Result<(), DeviceError>, ferromq_device::DeviceController) {
    let tag = config.id.clone();
    let (runner, controller) = DeviceRunner::new(device, config, transports());
    let _task = tokio::spawn(runner.run());
    if to_running {
        // INIT DEVICE .. RUN, the first six.
        for transition in &Transition::ALL[..6] {
            controller.change_state(*transition).await.unwrap();
        }
        assert_eq!(controller.state(), State::Running);
    }
    let path = std::env::temp_dir().join(format!("ferromq-{tag}-{}.ipc", std::process::id()));
    let endpoint = control::ControlEndpoint {
        address: format!("ipc://{}", path.display()),
        heartbeat: Some(heartbeat),
        first_contact: Duration::ZERO,
        read_only: false,
    };
    let transport = ferromq_zmq::ZmqTransport::new();
    let served = tokio::time::timeout(
        Duration::from_secs(20),
        control::serve_external_control(&transport, &endpoint, controller.clone(), |_| {}),
    )
    .await
    .expect("a silent launcher must end the control endpoint");
    let _ = std::fs::remove_file(&path);
    (served, controller)
}

/// Fills its `out` channel until a send waits, says so, then ignores STOP: one stuck sending
/// to a stalled peer.
struct StuckFull(Option<tokio::sync::oneshot::Sender<()>>);

#[async_trait::async_trait]
impl Device for StuckFull {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let out = ctx.channel("out")?;
        // Full: a send waits although the peer is connected (one went through) and the
        // channel's counters show messages queued.
        let mut n_sent = 0_u64;
        loop {
            let message = Message::from(vec![7_u8; 64 << 10]);
            match out.send_timeout(message, Duration::from_millis(100)).await {
                Ok(()) => n_sent += 1,
                Err(_) if n_sent > 0 && out.counters().snapshot().queued > 0 => break,
                Err(_) => {}
            }
        }
        if let Some(full) = self.0.take() {
            let _ = full.send(());
        }
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_device_ended_for_a_silent_launcher_says_what_its_channels_still_held() {
    let tag = "unattended-full";
    let path = std::env::temp_dir().join(format!("ferromq-{tag}-data-{}.ipc", std::process::id()));
    let address = format!("ipc://{}", path.display());
    // The peer: bound, and never reading.
    let mut pull = ferromq_core::Channel::open(
        &ferromq_zmq::ZmqTransport::new(),
        ChannelConfig::new("in", SocketType::Pull, Method::Bind).with_address(address.as_str()),
        "peer",
    )
    .await
    .unwrap();
    pull.bind_configured().await.unwrap();
    let mut out =
        ChannelConfig::new("out", SocketType::Push, Method::Connect).with_address(address.as_str());
    out.snd_buf_size = 10;
    let config = DeviceConfig::new(tag).with_channel(out).unwrap();
    let (full, filled) = tokio::sync::oneshot::channel();
    let device = StuckFull(Some(full));
    // Long enough for the device to fill its channel before the launcher is taken for gone.
    let heartbeat = Duration::from_secs(2);
    let serve = serve_silently(device, config, true, heartbeat);
    let ((served, _controller), filled) = tokio::join!(serve, filled);
    filled.expect("the device filled its channel");
    let _ = std::fs::remove_file(&path);
    let error = served.expect_err("a stuck device is told to end its process");
    let DeviceError::LauncherGone { ref unsent, .. } = error else {
        panic!("{error:?}");
    };
    assert!(
        matches!(unsent.as_slice(), [(channel, n)] if channel == "out" && *n > 0),
        "{unsent:?}"
    );
    let text = error.to_string();
    assert!(text.contains("\"out\": "), "{text}");
    assert!(
        text.contains("which may be lost with the process"),
        "{text}"
    );
    drop(pull);
}

#[tokio::test]
async fn a_device_whose_launcher_falls_silent_goes_down_by_itself() {
    serve_unattended(Idle, "unattended-idle", false).await;
}

#[tokio::test]
async fn a_stuck_device_whose_launcher_falls_silent_is_told_to_end_its_process() {
    serve_unattended(Stuck, "unattended-stuck", true).await;
}

/// A transport whose sockets never wait: a push takes every message at once and drops it, a
/// pull always has one. What a device sees when its peers keep up (a send into a ring with
/// room, a receive from a full queue).
#[derive(Debug)]
struct Bottomless;

struct BottomlessSocket(ferromq_core::ChannelLabel);

#[async_trait::async_trait]
impl ferromq_core::Socket for BottomlessSocket {
    fn label(&self) -> &ferromq_core::ChannelLabel {
        &self.0
    }
    async fn bind(
        &mut self,
        address: &ferromq_core::Address,
    ) -> ferromq_core::Result<ferromq_core::Address> {
        Ok(address.clone())
    }
    async fn connect(&mut self, _address: &ferromq_core::Address) -> ferromq_core::Result<()> {
        Ok(())
    }
    async fn send_parts(
        &mut self,
        _parts: Parts,
        _timeout: Option<Duration>,
    ) -> Result<(), ferromq_core::SendError<Parts>> {
        Ok(())
    }
    fn try_send_parts(&mut self, _parts: Parts) -> Result<(), Parts> {
        Ok(())
    }
    fn try_receive_parts(&mut self) -> Option<Parts> {
        Some(Parts::from(Message::from("x")))
    }
    async fn receive_parts(&mut self) -> ferromq_core::Result<Parts> {
        Ok(Parts::from(Message::from("x")))
    }
    async fn close(&mut self, _linger: Duration) -> ferromq_core::Result<()> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl ferromq_core::Transport for Bottomless {
    fn name(&self) -> &'static str {
        "bottomless"
    }
    async fn create_socket(
        &self,
        config: &ChannelConfig,
        _socket_name: &str,
    ) -> ferromq_core::Result<Box<dyn ferromq_core::Socket>> {
        Ok(Box::new(BottomlessSocket(ferromq_core::ChannelLabel::new(
            config.name.clone(),
            config.socket_type,
        ))))
    }
}

/// Sends and receives through sockets that never wait until a task it spawned on its own
/// (current-thread) runtime has run; fails after 100 000 of each.
struct Tireless;

#[async_trait::async_trait]
impl Device for Tireless {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let (out, input) = (ctx.channel_id("out")?, ctx.channel_id("in")?);
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let other = {
            let ran = std::sync::Arc::clone(&ran);
            tokio::spawn(async move { ran.store(true, Ordering::Relaxed) })
        };
        for _ in 0..100_000 {
            if ran.load(Ordering::Relaxed) {
                other.await?;
                return Ok(());
            }
            ctx.send_parts_on(out, Parts::from(Message::from("x")))
                .await?;
            ctx.receive_parts_on(input).await?;
        }
        Err("100 000 sends and receives that never waited gave the runtime no turn".into())
    }
}

/// Sends and receives that complete at once (no future built around them) still spend the
/// task's cooperative budget, as `Channel`'s do: a device whose peers always keep up gives its
/// runtime's other tasks (control, signals, connections) their turns.
#[tokio::test]
async fn sends_and_receives_that_never_wait_still_let_other_tasks_run() {
    let mut registry = ferromq_core::TransportRegistry::new();
    registry.register(
        "bottomless",
        ferromq_core::TransportTraits::PLAIN,
        |_options| Ok(std::sync::Arc::new(Bottomless)),
    );
    let mut config = DeviceConfig::new("tireless");
    for (name, socket_type, method) in [
        ("in", SocketType::Pull, Method::Bind),
        ("out", SocketType::Push, Method::Connect),
    ] {
        let mut channel = ChannelConfig::new(name, socket_type, method)
            .with_address(unique("bottomless").as_str());
        channel.transport = Some("bottomless".to_owned());
        config = config.with_channel(channel).unwrap();
    }
    let (runner, controller) = DeviceRunner::new(Tireless, config, std::sync::Arc::new(registry));
    let task = tokio::spawn(runner.run());
    control::run_static(&controller).await.unwrap();
    let device = task.await.unwrap();
    assert!(device.is_ok(), "{device:?}");
}

/// A transport whose memory is full and stays full (a shmem segment whose blocks a stopped
/// receiver holds): no message is ever made.
#[derive(Debug)]
struct Full;

#[async_trait::async_trait]
impl ferromq_core::Transport for Full {
    fn name(&self) -> &'static str {
        "full"
    }
    async fn new_message(&self, _size: usize) -> ferromq_core::Result<Message> {
        std::future::pending().await
    }
    async fn create_socket(
        &self,
        config: &ChannelConfig,
        socket_name: &str,
    ) -> ferromq_core::Result<Box<dyn ferromq_core::Socket>> {
        Bottomless.create_socket(config, socket_name).await
    }
}

/// Asks its transport for a message, which never has room: STOP must interrupt the wait.
struct WaitsForRoom;

#[async_trait::async_trait]
impl Device for WaitsForRoom {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        match ctx.new_message("out", 64).await {
            Err(DeviceError::Channel(error)) if error.is_interrupted() => Ok(()),
            other => Err(format!("expected an interruption, got {other:?}").into()),
        }
    }
}

/// A device waiting for its transport's room leaves RUNNING at STOP, as one waiting in a send
/// does: `new_message` waited out the transport's allocation timeout (10 s on shmem), or for
/// ever with `shm-throw-bad-alloc false`, and the stop with it.
#[tokio::test]
async fn stop_interrupts_a_message_waiting_for_room_and_the_device_goes_down_cleanly() {
    let mut registry = ferromq_core::TransportRegistry::new();
    registry.register("full", ferromq_core::TransportTraits::PLAIN, |_options| {
        Ok(std::sync::Arc::new(Full))
    });
    let mut channel = ChannelConfig::new("out", SocketType::Push, Method::Connect)
        .with_address(unique("full").as_str());
    channel.transport = Some("full".to_owned());
    let config = DeviceConfig::new("waiting").with_channel(channel).unwrap();
    let Running {
        task,
        driver,
        controller,
    } = running(WaitsForRoom, config, std::sync::Arc::new(registry)).await;
    controller
        .change_state(ferromq_device::Transition::Stop)
        .await
        .unwrap();
    let device = tokio::time::timeout(WAIT.unwrap(), task)
        .await
        .expect("the device went on waiting for room after STOP")
        .unwrap();
    assert!(device.is_ok(), "{device:?}");
    driver.abort();
}

/// A transport whose sends wait for a gate the test opens (a receiver that makes room late or
/// never). With `reserves`, its sockets set room aside (`reserve_send`), as zeromq's push and
/// shmem's do; without, they only send by waiting, as a shmem pair does. Each wait that starts
/// records its timeout, so the test sees the wait after STOP (one of `linger`) begin.
#[derive(Debug, Clone)]
struct Gated {
    reserves: bool,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
    /// The longest timeout a send has waited with so far, in ms (`u64::MAX`: none).
    longest_wait_ms: std::sync::Arc<AtomicU64>,
    wait_started: std::sync::Arc<tokio::sync::Notify>,
    sent: std::sync::Arc<AtomicU64>,
}

impl Gated {
    /// Shut: no room until the test adds some.
    fn shut(reserves: bool) -> Self {
        Gated {
            reserves,
            gate: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
            longest_wait_ms: std::sync::Arc::default(),
            wait_started: std::sync::Arc::default(),
            sent: std::sync::Arc::default(),
        }
    }

    /// Waits (under the tests' watchdog) until a send waits with a timeout of `at_least`.
    async fn wait_started_with(&self, at_least: Duration) {
        let waited_long_enough = async {
            loop {
                let notified = self.wait_started.notified();
                let longest = self.longest_wait_ms.load(Ordering::SeqCst);
                if u128::from(longest) >= at_least.as_millis() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WAIT.unwrap(), waited_long_enough)
            .await
            .unwrap_or_else(|_| panic!("no send waited for {at_least:?}"));
    }
}

struct GatedSocket {
    label: ferromq_core::ChannelLabel,
    transport: Gated,
    /// Room set aside by `reserve_send`.
    reserved: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl GatedSocket {
    fn take(&mut self, permit: tokio::sync::OwnedSemaphorePermit) {
        permit.forget();
        self.transport.sent.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl ferromq_core::Socket for GatedSocket {
    fn label(&self) -> &ferromq_core::ChannelLabel {
        &self.label
    }
    async fn bind(
        &mut self,
        address: &ferromq_core::Address,
    ) -> ferromq_core::Result<ferromq_core::Address> {
        Ok(address.clone())
    }
    async fn connect(&mut self, _address: &ferromq_core::Address) -> ferromq_core::Result<()> {
        Ok(())
    }
    async fn send_parts(
        &mut self,
        parts: Parts,
        timeout: Option<Duration>,
    ) -> Result<(), ferromq_core::SendError<Parts>> {
        if let Some(permit) = self.reserved.take() {
            self.take(permit);
            return Ok(());
        }
        let wait_ms = timeout.map_or(u64::MAX, |timeout| timeout.as_millis() as u64);
        self.transport
            .longest_wait_ms
            .fetch_max(wait_ms, Ordering::SeqCst);
        self.transport.wait_started.notify_waiters();
        let room = std::sync::Arc::clone(&self.transport.gate).acquire_owned();
        let room = match timeout {
            Some(timeout) => tokio::time::timeout(timeout, room).await.ok(),
            None => Some(room.await),
        };
        match room {
            Some(Ok(permit)) => {
                self.take(permit);
                Ok(())
            }
            _ => Err(ferromq_core::SendError::new(
                ferromq_core::Error::Timeout {
                    channel: self.label.clone(),
                    after: timeout.unwrap_or_default(),
                },
                parts,
            )),
        }
    }
    fn try_send_parts(&mut self, parts: Parts) -> Result<(), Parts> {
        if let Some(permit) = self.reserved.take() {
            self.take(permit);
            return Ok(());
        }
        match std::sync::Arc::clone(&self.transport.gate).try_acquire_owned() {
            Ok(permit) => {
                self.take(permit);
                Ok(())
            }
            Err(_) => Err(parts),
        }
    }
    async fn reserve_send(&mut self) -> ferromq_core::Result<bool> {
        if !self.transport.reserves {
            return Ok(false);
        }
        if self.reserved.is_none() {
            let room = std::sync::Arc::clone(&self.transport.gate).acquire_owned();
            self.reserved = room.await.ok();
        }
        Ok(true)
    }
    fn send_reserved(&mut self, parts: Parts) -> Result<(), ferromq_core::SendError<Parts>> {
        match self.reserved.take() {
            Some(permit) => {
                self.take(permit);
                Ok(())
            }
            None => Err(ferromq_core::SendError::new(
                ferromq_core::Error::Timeout {
                    channel: self.label.clone(),
                    after: Duration::ZERO,
                },
                parts,
            )),
        }
    }
    async fn receive_parts(&mut self) -> ferromq_core::Result<Parts> {
        std::future::pending().await
    }
    async fn close(&mut self, _linger: Duration) -> ferromq_core::Result<()> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl ferromq_core::Transport for Gated {
    fn name(&self) -> &'static str {
        "gated"
    }
    async fn create_socket(
        &self,
        config: &ChannelConfig,
        _socket_name: &str,
    ) -> ferromq_core::Result<Box<dyn ferromq_core::Socket>> {
        Ok(Box::new(GatedSocket {
            label: ferromq_core::ChannelLabel::new(config.name.clone(), config.socket_type),
            transport: self.clone(),
            reserved: None,
        }))
    }
}

/// Passes on one message it "took from an input" with `forward_parts`.
struct ForwardsOne;

#[async_trait::async_trait]
impl Device for ForwardsOne {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        let out = ctx.channel_id("out")?;
        ctx.forward_parts_on(out, Parts::from(Message::from("taken from an input")))
            .await?;
        Ok(())
    }
}

/// A device forwarding on `gated` with `linger` (ms), in RUNNING and waiting for room, with
/// STOP asked for once the wait had begun, and seen: its send waits with `linger` now.
async fn forwarding_stopped_while_it_waits(gated: &Gated, linger: u64) -> Running {
    let mut registry = ferromq_core::TransportRegistry::new();
    let transport = gated.clone();
    registry.register("gated", ferromq_core::TransportTraits::PLAIN, move |_| {
        Ok(std::sync::Arc::new(transport.clone()))
    });
    let mut channel = ChannelConfig::new("out", SocketType::Push, Method::Connect)
        .with_address(unique("gated").as_str());
    channel.transport = Some("gated".to_owned());
    channel.linger = linger;
    let config = DeviceConfig::new("forwarder")
        .with_channel(channel)
        .unwrap();
    let Running {
        task,
        driver,
        controller,
    } = running(ForwardsOne, config, std::sync::Arc::new(registry)).await;
    if !gated.reserves {
        // Its first slice of waiting: the forward has begun.
        gated.wait_started_with(Duration::from_millis(1)).await;
    }
    {
        // Asked from a task of its own: the answer may wait for the device to leave RUNNING.
        let controller = controller.clone();
        tokio::spawn(async move { controller.change_state(Transition::Stop).await });
    }
    gated.wait_started_with(Duration::from_millis(linger)).await;
    Running {
        task,
        driver,
        controller,
    }
}

/// Found by a contract sweep (the built-in processor dropped the message in hand at STOP and
/// exited 0): `forward_parts` keeps a taken message through STOP, on sockets that reserve room
/// and on those that only send by waiting. A receiver that makes room within the channel's
/// linger gets it and the device goes down cleanly; one that does not makes the device fail
/// naming the one message lost. `send_parts` drops it at STOP instead, which is right only for
/// a message the device made itself.
#[tokio::test]
async fn a_forwarded_message_outlives_stop_for_linger_or_its_loss_fails_the_device() {
    for reserves in [true, false] {
        // Room comes after STOP, within linger: delivered, and the device ends cleanly.
        let gated = Gated::shut(reserves);
        let Running { task, driver, .. } = forwarding_stopped_while_it_waits(&gated, 30_000).await;
        gated.gate.add_permits(1);
        let device = tokio::time::timeout(WAIT.unwrap(), task)
            .await
            .expect("the device went down")
            .unwrap();
        assert!(device.is_ok(), "reserves {reserves}: {device:?}");
        assert_eq!(
            gated.sent.load(Ordering::SeqCst),
            1,
            "reserves {reserves}: the message was dropped"
        );
        driver.abort();

        // No room within linger (100 ms): the device fails, naming the message it lost.
        let gated = Gated::shut(reserves);
        let Running {
            task,
            driver,
            controller,
        } = forwarding_stopped_while_it_waits(&gated, 100).await;
        let device = tokio::time::timeout(WAIT.unwrap(), task)
            .await
            .expect("the device went down")
            .unwrap();
        assert!(
            matches!(device, Err(DeviceError::Hook { hook: "run", .. })),
            "reserves {reserves}: a lost message fails the device: {device:?}"
        );
        let text = controller.last_error().expect("the device says why");
        assert!(
            text.contains("1 message(s) accepted by send were not delivered")
                && text.contains("not forwarded"),
            "reserves {reserves}: {text}"
        );
        assert_eq!(gated.sent.load(Ordering::SeqCst), 0, "reserves {reserves}");
        driver.abort();
    }
}
