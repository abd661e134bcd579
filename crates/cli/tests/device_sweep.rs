//! Built-in devices found wanting by a sweep of `ferromq device`: real processes, real signals.

mod support;

use std::time::Duration;

use support::{
    Device, Ipc, ShmSession, assert_each_fails_at_init, finish, ids_in_state, signal,
    top_json_until, wait_for_line,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// How long a device may take to go down after the signal that asks it to.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

fn as_strs(strings: &[String]) -> Vec<&str> {
    strings.iter().map(String::as_str).collect()
}

/// The first shmem figures `top --json` shows of device `id`.
fn memory_of(snapshot: &serde_json::Value, id: &str) -> serde_json::Value {
    snapshot["devices"]
        .as_array()
        .and_then(|devices| devices.iter().find(|device| device["id"] == id))
        .map(|device| device["memory"][0].clone())
        .unwrap_or_default()
}

/// A sender of `kind` whose receiver is stopped (SIGSTOP) fills its 1 MiB segment with 64 KiB
/// messages and then waits for room; SIGINT ends it at once, as a stop in RUNNING does, exit 0.
/// It ignored the signal: with `--shm-throw-bad-alloc false` it waited for room until a second
/// signal killed it (exit 130), and otherwise until the allocation timed out, 10 s later, which
/// it reported as a failure (exit 1).
async fn a_sender_waiting_for_room_goes_down_at_the_first_signal(kind: &str, options: &[&str]) {
    let session = ShmSession::new(kind);
    let ipc = Ipc::new("room");
    let shmem = [
        "--transport",
        "shmem",
        "--session",
        &session.0,
        "--shm-segment-size",
        "1048576",
    ];
    let sink = Device::new("sink", "stalled")
        .args(&shmem)
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let sender = Device::new(kind, "waiting")
        .args(&shmem)
        .args(&["--msg-size", "65536"])
        .args(options)
        .channel("push", "connect", &ipc.address())
        .spawn();
    top_json_until(&session.0, |snapshot| {
        ids_in_state(snapshot, "RUNNING").len() == 2
    })
    .await;
    signal(&sink, "STOP");
    // No room for another message: the sender waits for the sink to release one.
    top_json_until(&session.0, |snapshot| {
        memory_of(snapshot, "waiting")["largest_free"]
            .as_u64()
            .is_some_and(|largest_free| largest_free < 65536)
    })
    .await;
    signal(&sender, "INT");
    let sender = tokio::time::timeout(EXIT_TIMEOUT, finish(sender))
        .await
        .unwrap_or_else(|_| panic!("the {kind} waiting for room ignored SIGINT"));
    sender.assert_exited_0();
    assert!(
        sender.stdout.contains("RUNNING ---> READY"),
        "{}",
        sender.stdout
    );
    signal(&sink, "CONT");
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bsampler_waiting_for_room_for_ever_goes_down_at_the_first_signal() {
    a_sender_waiting_for_room_goes_down_at_the_first_signal(
        "bsampler",
        &["--shm-throw-bad-alloc", "false"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampler_waiting_for_room_goes_down_at_the_first_signal() {
    a_sender_waiting_for_room_goes_down_at_the_first_signal("sampler", &[]).await;
}

/// Values a built-in device cannot work with are refused before it binds (exit 2), naming the
/// device, the property, the value and what it takes.
#[tokio::test]
async fn bad_values_are_refused_naming_the_property_and_what_it_takes() {
    let ipc = Ipc::new("bad-values");
    let cases: &[(&[&str], &str)] = &[
        // No upper bound: 10^12 parts aborted the device (exit 134) allocating their list.
        (
            &["bsampler", "--num-parts", "1000000000000", "--multipart"],
            "device \"bad\": property \"num-parts\" has invalid value \"1000000000000\": expected 1 to 1024",
        ),
        // `--num-parts 0` was refused, the same value as a property taken (as "any count").
        (
            &["sink", "--property", "num-parts=0"],
            "device \"bad\": property \"num-parts\" has invalid value \"0\": expected at least 1 part",
        ),
        // msg-rate won, silently.
        (
            &["bsampler", "--rate", "10", "--msg-rate", "1000"],
            "device \"bad\": property \"msg-rate\" (= \"1000\") is given with \"rate\" (= \"10\")",
        ),
        // Raised to 8 bytes, silently.
        (
            &["client", "--msg-size", "0"],
            "device \"bad\": property \"msg-size\" has invalid value \"0\": expected at least 8 bytes",
        ),
        // The channel namespace took any key and any value; the runner read only
        // `chan.<socket>.address`, skipped the addresses that did not parse and an empty list.
        (
            &["sink", "--property", "chan.data.adress=tcp://127.0.0.1:0"],
            "device \"bad\": property \"chan.data.adress\" (= \"tcp://127.0.0.1:0\") is not read: the one property per channel is chan.<channel>.address",
        ),
        (
            &[
                "sink",
                "--property",
                "chan.data.0.address=tcp://127.0.0.1:0",
            ],
            "property \"chan.data.0.address\" (= \"tcp://127.0.0.1:0\") is not read",
        ),
        (
            &["sink", "--property", "chan.data.address=tcp//127.0.0.1:0"],
            "device \"bad\": property \"chan.data.address\" (= \"tcp//127.0.0.1:0\") has an address that does not parse",
        ),
        (
            &["sink", "--property", "chan.data.address=tcp://127.0.0.1:0;"],
            "property \"chan.data.address\" (= \"tcp://127.0.0.1:0;\") has an empty address, number 2 of 2",
        ),
        (
            &["sink", "--property", "chan.data.address="],
            "property \"chan.data.address\" is empty",
        ),
    ];
    for (args, expected) in cases {
        let (kind, options) = args.split_first().expect("a kind");
        // A channel the kind takes: the value alone is at fault.
        let socket_type = match *kind {
            "sink" => "pull",
            "client" => "req",
            _ => "push",
        };
        let device =
            Device::new(kind, "bad")
                .args(options)
                .channel(socket_type, "bind", &ipc.address());
        let finished = tokio::time::timeout(EXIT_TIMEOUT, device.finish())
            .await
            .unwrap_or_else(|_| panic!("{args:?} was taken: the device ran on"));
        assert_eq!(finished.code, Some(2), "{args:?}: {}", finished.stderr);
        assert!(
            finished.stderr.contains(expected),
            "{args:?}: {}",
            finished.stderr
        );
    }
}

/// A device whose stdout is closed (`ferromq device sink ... | head -c 1`) goes down as it would
/// otherwise, its summary line lost: printing the summary panicked ("failed printing to stdout:
/// Broken pipe") and the device failed in RESETTING TASK (sink) or RUNNING (processor), exit 1.
#[tokio::test]
async fn a_closed_stdout_costs_a_device_its_summary_and_nothing_else() {
    let input = Ipc::new("closed-in");
    let output = Ipc::new("closed-out");
    let processor_channels = [
        "--channel-config".to_owned(),
        format!(
            "name=data-in,type=pull,method=bind,address={},rateLogging=0",
            input.address()
        ),
        "--channel-config".to_owned(),
        format!(
            "name=data-out,type=push,method=bind,address={},rateLogging=0",
            output.address()
        ),
    ];
    let devices = [
        Device::new("sink", "closed").channel("pull", "bind", &input.address()),
        Device::new("processor", "closed").args(&as_strs(&processor_channels)),
    ];
    for device in devices {
        let mut child = device.spawn();
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut seen = Vec::new();
        wait_for_line(&mut lines, "READY ---> RUNNING", &mut seen).await;
        drop(lines);
        signal(&child, "INT");
        let mut stderr = String::new();
        let mut err = child.stderr.take().expect("stderr");
        let status = tokio::time::timeout(EXIT_TIMEOUT, async {
            let (_, status) = tokio::join!(err.read_to_string(&mut stderr), child.wait());
            status
        })
        .await
        .expect("the device did not exit in time")
        .expect("wait for the device");
        assert_eq!(status.code(), Some(0), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A send that fails outside a stop fails the device, as it does every other device: a server
/// on a pull socket took every request, answered none and exited 0; a client on one waited for
/// ever for the reply to a request it never sent.
#[tokio::test]
async fn a_failed_send_fails_a_client_and_a_server() {
    let ipc = Ipc::new("unanswered");
    let server = Device::new("server", "deaf")
        .args(&["--max-iterations", "5"])
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let _sampler = Device::new("sampler", "asker")
        .args(&["--max-iterations", "5"])
        .channel("push", "connect", &ipc.address())
        .spawn();
    let client_ipc = Ipc::new("unasked");
    let client = Device::new("client", "mute")
        .channel("pull", "bind", &client_ipc.address())
        .spawn();
    for (kind, device) in [("server", server), ("client", client)] {
        let finished = tokio::time::timeout(EXIT_TIMEOUT, finish(device))
            .await
            .unwrap_or_else(|_| panic!("the {kind} on a pull socket never ended"));
        assert_eq!(finished.code, Some(1), "{kind}: {}", finished.stderr);
        assert!(
            finished.stderr.contains("channel \"data\"") && finished.stderr.contains("pull socket"),
            "{kind}: {}",
            finished.stderr
        );
    }
}

/// Every built-in device checks its channels' types at INIT, as the sampler and the sink do:
/// a client on a push socket sent one request and then failed to receive, one on a rep socket
/// and a multiplier sending on a rep ran until a message came, and a server on a req socket,
/// a stf-source and a builder with their types swapped reached RUNNING before failing.
#[tokio::test]
async fn every_device_refuses_a_socket_of_the_wrong_type_at_init() {
    let ipc = Ipc::new("types");
    let other = Ipc::new("types-other");
    let channel = |name: &str, socket_type: &str, address: &Ipc| {
        format!(
            "name={name},type={socket_type},method=bind,address={},rateLogging=0",
            address.address()
        )
    };
    let two = |first: String, second: String| {
        [
            "--channel-config".to_owned(),
            first,
            "--channel-config".to_owned(),
            second,
        ]
    };
    let multiplier = two(
        channel("data-in", "pull", &ipc),
        channel("data-out", "rep", &other),
    );
    let source = two(
        channel("requests", "push", &ipc),
        channel("data-out", "pull", &other),
    );
    let builder = two(
        channel("data-in", "push", &ipc),
        channel("requests", "pull", &other),
    );
    let cases = [
        (
            Device::new("client", "t").channel("push", "bind", &ipc.address()),
            "channel \"data\" is a push socket, which cannot request, and the device requests on it",
        ),
        (
            Device::new("client", "t").channel("rep", "bind", &ipc.address()),
            "channel \"data\" is a rep socket, which cannot request",
        ),
        (
            Device::new("server", "t").channel("req", "bind", &ipc.address()),
            "channel \"data\" is a req socket, which cannot answer, and the device answers on it",
        ),
        // A req or rep socket sends and receives, only in turn: "cannot send" was wrong of it.
        (
            Device::new("sampler", "t").channel("req", "bind", &ipc.address()),
            "channel \"data\" is a req socket, which sends a request only once the last one's reply came, and the device sends one message after another on it",
        ),
        (
            Device::new("sink", "t").channel("req", "bind", &ipc.address()),
            "channel \"data\" is a req socket, which receives only the replies to its own requests, and the device receives without asking on it",
        ),
        (
            Device::new("sink", "t").channel("rep", "bind", &ipc.address()),
            "channel \"data\" is a rep socket, which takes a request only once it answered the last, and the device receives without answering on it",
        ),
        (
            Device::new("multiplier", "t").args(&as_strs(&multiplier)),
            "channel \"data-out\" is a rep socket, which sends only replies, one per request it received, and the device sends unasked on it",
        ),
        (
            Device::new("stf-source", "t").args(&as_strs(&source)),
            "channel \"requests\" is a push socket, which cannot receive",
        ),
        (
            Device::new("builder", "t").args(&as_strs(&builder)),
            "channel \"data-in\" is a push socket, which cannot receive",
        ),
    ];
    assert_each_fails_at_init(cases.into()).await;
}

/// A device given no channel says so and how to give it one, as the sampler does: the
/// forwarders, stf-source and builder ended with an empty list, `its channels: `.
#[tokio::test]
async fn a_device_without_channels_says_how_to_give_it_one() {
    let cases = [
        ("processor", "data-in"),
        ("splitter", "data-in"),
        ("merger", "data-in"),
        ("proxy", "data-in"),
        ("multiplier", "data-in"),
        ("stf-source", "requests"),
        ("builder", "data-in"),
    ];
    for (kind, channel) in cases {
        let bare = Device::new(kind, "bare").finish().await;
        assert_eq!(bare.code, Some(1), "{kind}: {}", bare.stderr);
        let expected = format!(
            "device \"bare\" has no channel \"{channel}\"; its channels: none (give it one with"
        );
        assert!(bare.stderr.contains(&expected), "{kind}: {}", bare.stderr);
    }
}

/// A verifying sink fed parts too short to hold a checksum said "checksum mismatch", as if
/// the bytes had been damaged, where the sender had put no checksum in them.
#[tokio::test]
async fn a_part_too_short_for_a_checksum_is_said_to_be_so() {
    let ipc = Ipc::new("short-parts");
    let sink = Device::new("sink", "checker")
        .args(&["--verify", "true"])
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let _sampler = Device::new("bsampler", "tiny")
        .args(&["--msg-size", "4", "--max-iterations", "5"])
        .channel("push", "connect", &ipc.address())
        .spawn();
    let finished = tokio::time::timeout(EXIT_TIMEOUT, finish(sink))
        .await
        .expect("the verifying sink ended");
    assert_eq!(finished.code, Some(1), "{}", finished.stderr);
    assert!(
        finished.stderr.contains(
            "message 0 part 0 (4 bytes): too short to carry a checksum (it takes 8 bytes)"
        ),
        "{}",
        finished.stderr
    );
}

/// An rpc group member started alone was told to declare its group in "the topology" it did
/// not have.
#[tokio::test]
async fn an_mcts_worker_started_alone_is_told_it_needs_ferromq_run() {
    let ipc = Ipc::new("lone-worker");
    let worker = Device::new("mcts-worker", "lone")
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let finished = tokio::time::timeout(EXIT_TIMEOUT, finish(worker))
        .await
        .expect("the lone worker ended");
    assert_eq!(finished.code, Some(1), "{}", finished.stderr);
    assert!(
        finished
            .stderr
            .contains("start it with `ferromq run`: a device started alone is in no group"),
        "{}",
        finished.stderr
    );
}

/// An address given for a channel the device does not have was taken and used nowhere, the
/// device running on its configured address (`chan.nosuch.address`, a bad-input sweep): only
/// the device knows its channels, so it refuses the property when it binds.
#[tokio::test]
async fn an_address_for_a_channel_the_device_lacks_is_refused() {
    let ipc = Ipc::new("no-such-channel");
    let other = Ipc::new("no-such-channel-other");
    let property = format!("chan.nosuch.address={}", other.address());
    let expected = format!(
        "device \"t\": property \"chan.nosuch.address\" (= \"{}\") names no channel of this device; its channels: data",
        other.address()
    );
    let cases = [
        (
            Device::new("sink", "t")
                .channel("pull", "bind", &ipc.address())
                .args(&["--property", &property]),
            expected.as_str(),
        ),
        // Connecting reads the same properties.
        (
            Device::new("sampler", "t")
                .channel("push", "connect", &ipc.address())
                .args(&["--property", &property]),
            expected.as_str(),
        ),
    ];
    assert_each_fails_at_init(cases.into()).await;
}

/// The length of the send queue of device `id`'s first channel in a `--json` snapshot.
fn queued_of(snapshot: &serde_json::Value, id: &str) -> u64 {
    channel_figure(snapshot, id, "queued")
}

/// Figure `name` of the first channel of device `id` in a `top --json` snapshot; 0 when the
/// snapshot does not show it (a stopped device does not answer).
fn channel_figure(snapshot: &serde_json::Value, id: &str, name: &str) -> u64 {
    snapshot["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|device| device["id"] == id)
        .and_then(|device| device["channels"][0][name].as_u64())
        .unwrap_or(0)
}

/// A second signal ends a device at once (exit 130) and says what that leaves behind: the
/// messages its sends accepted that had not left, here a sampler's queue behind a stopped sink
/// while its close waits out a long linger. It said only "exiting now", and the contract is
/// that a sender that cannot deliver says how many messages it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_says_how_many_accepted_messages_had_not_left() {
    let session = ShmSession::new("second-signal");
    let ipc = Ipc::new("second-signal");
    let sink = Device::new("sink", "stalled")
        .args(&["--session", &session.0])
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let sampler = Device::new("sampler", "leaving")
        .args(&["--session", &session.0, "--msg-size", "65536"])
        .args(&[
            "--channel-config",
            &format!(
                "name=data,type=push,method=connect,address={},sndBufSize=10,linger=600000,rateLogging=0",
                ipc.address()
            ),
        ])
        .spawn();
    top_json_until(&session.0, |snapshot| {
        ids_in_state(snapshot, "RUNNING").len() == 2
    })
    .await;
    signal(&sink, "STOP");
    top_json_until(&session.0, |snapshot| queued_of(snapshot, "leaving") > 0).await;
    signal(&sampler, "INT");
    // The first signal: the sampler stops and its close waits for the stopped sink.
    let closing = top_json_until(&session.0, |snapshot| {
        ids_in_state(snapshot, "RESETTING DEVICE") == ["leaving"]
    })
    .await;
    // Stopped, the sampler sends no more: every message it accepted is in this count.
    let n_accepted = channel_figure(&closing, "leaving", "messages_out");
    // More than its sndBufSize: at least one 64 KiB message went to the kernel's buffers
    // (the default socket buffers hold a few).
    assert!(n_accepted > 10, "{closing}");
    signal(&sampler, "INT");
    let sampler = tokio::time::timeout(EXIT_TIMEOUT, finish(sampler))
        .await
        .expect("the second signal did not end the sampler");
    assert_eq!(sampler.code, Some(130), "{}", sampler.stderr);
    // At most `sndBufSize` had not left, and the sampler says how many (the writer of a
    // 64 KiB message waits for room in the kernel, so some of its batch may have gone).
    let said = sampler
        .stderr
        .split_once("ferromq: second signal, exiting now; ")
        .and_then(|(_, said)| {
            said.split_once(" message(s) accepted by send had not left yet and may be lost (data: ")
        })
        .and_then(|(n_lost, rest)| Some((n_lost.parse::<u64>().ok()?, rest.split_once(')')?.0)));
    let n_lost = match said {
        Some((n_lost, per_channel))
            if (1..=10).contains(&n_lost) && per_channel == n_lost.to_string() =>
        {
            n_lost
        }
        _ => panic!("{}", sampler.stderr),
    };
    // Those are gone with the sampler, and no other: every message it accepted besides waits
    // in the sink's socket, and the sink takes each of them once it runs again. (It said 10,
    // its writer's whole batch, when the sink then got 3 of them. And stopped before it took
    // them, the sink reports them lost, exit 1: the test once sent SIGINT right after
    // SIGCONT, and lost that race now and then.)
    signal(&sink, "CONT");
    let taken = top_json_until(&session.0, |snapshot| {
        channel_figure(snapshot, "stalled", "messages_in") >= n_accepted - n_lost
    })
    .await;
    assert_eq!(
        channel_figure(&taken, "stalled", "messages_in"),
        n_accepted - n_lost,
        "{}",
        sampler.stderr
    );
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();
}
