//! The fuzz targets: one per decoder fed from outside the process.
//!
//! Each target has valid seed inputs (made by the matching encoder, or the files users write),
//! a dictionary of tokens for the mutator, and a check that runs the decoder the way the
//! product does, including what the product does next with a decoded value (expanding sockets
//! and replicas, re-encoding). A check returns `Err` when a property fails (a round trip that
//! does not give back what was decoded); a panic is caught by the driver.

use std::path::{Path, PathBuf};

use ferromq_core::{Address, ChannelConfig};
use ferromq_device::control::{DeviceToLauncher, LauncherToDevice};
use ferromq_device::{DeviceConfig, State, Transition};
use ferromq_devices::Builtin;
use ferromq_shm::wire::{self, DeliveryRef, ObjectRef, PartRef, WireRange};
use ferromq_topology::Known;

use crate::FuzzError;
use crate::mutate::Shape;

/// One decoder under test.
#[derive(Clone, Copy)]
pub struct Target {
    /// The name given on the command line.
    pub name: &'static str,
    /// What it feeds, in a few words.
    pub about: &'static str,
    /// Binary or text.
    pub shape: Shape,
    /// Tokens the mutator inserts.
    pub dictionary: &'static [&'static str],
    seeds: fn() -> Result<Vec<Vec<u8>>, FuzzError>,
    check: fn(&[u8]) -> Result<bool, String>,
}

impl Target {
    /// The valid inputs mutations start from.
    ///
    /// # Errors
    /// [`FuzzError::Seeds`] when a seed file cannot be read.
    pub fn seeds(&self) -> Result<Vec<Vec<u8>>, FuzzError> {
        (self.seeds)()
    }

    /// Runs the decoder on `input`: `Ok(true)` when it accepted the input, `Ok(false)` when it
    /// refused it with an error (as it should refuse most mutated inputs).
    ///
    /// # Errors
    /// A description of the property that failed.
    ///
    /// # Panics
    /// When the decoder panics: that is what fuzzing looks for.
    pub fn check(&self, input: &[u8]) -> Result<bool, String> {
        (self.check)(input)
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("name", &self.name).finish()
    }
}

/// Every target built into this binary.
pub fn all() -> Vec<Target> {
    let targets = vec![
        Target {
            name: "shm-frame",
            about: "shmem descriptor frames (ferromq_shm::wire::decode), with the encode round trip",
            shape: Shape::Binary,
            dictionary: &["FMQSHM03", "\u{0}\u{0}\u{0}\u{0}", "\u{1}", "\u{2}"],
            seeds: shm_frame_seeds,
            check: check_shm_frame,
        },
        Target {
            name: "rpc-frame",
            about: "remote-invocation frames (ferromq_rpc's frame reader, as the dispatcher reads them), written again and read back",
            shape: Shape::Binary,
            dictionary: &["FRPC", "\u{2}", "\u{7}", "\u{1}", "\u{4}"],
            seeds: || Ok(ferromq_rpc::fuzzing::frame_examples()),
            check: ferromq_rpc::fuzzing::read_frame,
        },
        Target {
            name: "control-request",
            about: "the control protocol's requests (launcher to device JSON)",
            shape: Shape::Text,
            dictionary: JSON_TOKENS,
            seeds: control_request_seeds,
            check: check_control_request,
        },
        Target {
            name: "control-reply",
            about: "the control protocol's replies (device to launcher JSON)",
            shape: Shape::Text,
            dictionary: JSON_TOKENS,
            seeds: control_reply_seeds,
            check: check_control_reply,
        },
        Target {
            name: "mq-config",
            about: "FairMQ JSON configurations (--mq-config, DeviceConfig::add_mq_config)",
            shape: Shape::Text,
            dictionary: JSON_TOKENS,
            seeds: mq_config_seeds,
            check: check_mq_config,
        },
        Target {
            name: "channel-config",
            about: "--channel-config key=value lists (ChannelConfig::parse_key_values, add_channel)",
            shape: Shape::Text,
            dictionary: CHANNEL_CONFIG_TOKENS,
            seeds: || Ok(text_seeds(CHANNEL_CONFIG_SEEDS)),
            check: check_channel_config,
        },
        Target {
            name: "topology",
            about: "TOML topologies (ferromq_topology::load, instances, to_dot, to_mermaid)",
            shape: Shape::Text,
            dictionary: TOML_TOKENS,
            seeds: topology_seeds,
            check: check_topology,
        },
        Target {
            name: "recording",
            about: "recordings of `ferromq record` (ferromq_record::Reader, every message and the summary)",
            shape: Shape::Binary,
            dictionary: &["ferromq-recording\n", "\u{1}", "\u{2}", "{}"],
            seeds: recording_seeds,
            check: check_recording,
        },
        Target {
            name: "tap-header",
            about: "the tap stream's header part (ferromq_device::tap::TapHeader::decode), with the encode round trip",
            shape: Shape::Binary,
            dictionary: &["\u{0}", "\u{1}", "\u{2}"],
            seeds: tap_header_seeds,
            check: check_tap_header,
        },
        Target {
            name: "address",
            about: "channel addresses (ferromq_core::Address::parse), with the display round trip",
            shape: Shape::Text,
            dictionary: ADDRESS_TOKENS,
            seeds: || Ok(text_seeds(ADDRESS_SEEDS)),
            check: check_address,
        },
    ];
    #[cfg(feature = "ofi")]
    let targets = {
        let mut targets = targets;
        targets.insert(
        1,
        Target {
            name: "ofi-control",
            about: "ofi side-channel frames (hello, announce, grant, ...), with the encode round trip",
            shape: Shape::Binary,
            dictionary: &["FMQOFI", "\u{0}", "\u{1}", "\u{7f}", "\u{ff}"],
            seeds: ofi_control_seeds,
            check: check_ofi_control,
        },
    );
        targets
    };
    targets
}

/// Targets that misbehave on purpose, to test the driver and the supervisor: each seed names
/// what happens to inputs that still start with it. Not in [`all`].
pub fn self_tests() -> Vec<Target> {
    let target = |name, about, check| Target {
        name,
        about,
        shape: Shape::Text,
        dictionary: &[],
        seeds: || Ok(text_seeds(&["fine", "abort", "hang", "panic", "property"])),
        check,
    };
    vec![
        target(
            "selftest-abort",
            "aborts the process on inputs that start with \"abort\"",
            |input| {
                if input.starts_with(b"abort") {
                    std::process::abort();
                }
                Ok(true)
            },
        ),
        target(
            "selftest-hang",
            "never returns on inputs that start with \"hang\"",
            |input| {
                if input.starts_with(b"hang") {
                    loop {
                        std::thread::park();
                    }
                }
                Ok(true)
            },
        ),
        target(
            "selftest-panic",
            "panics on \"panic...\", fails its property on \"property...\"",
            |input| {
                if input.starts_with(b"panic") {
                    panic!("selftest panic on {} bytes", input.len());
                }
                if input.starts_with(b"property") {
                    return Err("selftest property".to_owned());
                }
                Ok(input.starts_with(b"fine"))
            },
        ),
    ]
}

/// The target called `name` (one of [`all`] or [`self_tests`]).
///
/// # Errors
/// [`FuzzError::UnknownTarget`] listing the targets there are.
pub fn by_name(name: &str) -> Result<Target, FuzzError> {
    all()
        .into_iter()
        .chain(self_tests())
        .find(|target| target.name == name)
        .ok_or_else(|| FuzzError::UnknownTarget {
            name: name.to_owned(),
            known: all()
                .iter()
                .map(|target| target.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Literal inputs as seeds.
fn text_seeds(texts: &[&str]) -> Vec<Vec<u8>> {
    texts.iter().map(|text| text.as_bytes().to_vec()).collect()
}

/// The round-trip property: `again`, what `printed` (`decoded` encoded by `how`) decodes to, is
/// `decoded`.
fn round_trip<T: PartialEq + std::fmt::Debug, E: std::fmt::Display>(
    how: &str,
    decoded: &T,
    printed: &str,
    again: Result<T, E>,
) -> Result<bool, String> {
    match again {
        Ok(again) if again == *decoded => Ok(true),
        Ok(again) => Err(format!(
            "{how} round trip changed {decoded:?} into {again:?}"
        )),
        Err(error) => Err(format!("{how} gave {printed:?}, which fails: {error}")),
    }
}

const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "null",
    "true",
    "false",
    "-",
    "0",
    "1e999",
    "\"\"",
    "{}",
    "[]",
    "\\u0000",
    "\\ud800",
    "\"request\"",
    "\"transition\"",
    "\"state\"",
    "\"ok\"",
    "\"value\"",
    "\"error\"",
    "\"timeout_ms\"",
    "\"key\"",
    "\"fairMQOptions\"",
    "\"devices\"",
    "\"channels\"",
    "\"sockets\"",
    "\"numSockets\"",
    "\"name\"",
    "\"type\"",
    "\"method\"",
    "\"address\"",
    "\"id\"",
    "\"sndBufSize\"",
    "\"portRangeMin\"",
    "\"autoBind\"",
    "\"linger\"",
    "\"RUNNING\"",
    "\"BIND\"",
];

const CHANNEL_CONFIG_TOKENS: &[&str] = &[
    ",",
    "=",
    "name=",
    "type=",
    "method=",
    "address=",
    "transport=",
    "sndBufSize=",
    "rcvBufSize=",
    "sndKernelSize=",
    "rcvKernelSize=",
    "linger=",
    "rateLogging=",
    "portRangeMin=",
    "portRangeMax=",
    "autoBind=",
    "numSockets=",
    "busyPoll=",
    "spinUs=",
    "provider=",
    "push",
    "pull",
    "pub",
    "sub",
    "req",
    "rep",
    "pair",
    "bind",
    "connect",
    "tcp://",
    "ipc://",
    "inproc://",
    "verbs://",
    "*",
    ":",
    "[",
    "]",
    "@",
    "+",
    "-1",
    "18446744073709551616",
];

const TOML_TOKENS: &[&str] = &[
    "[[device]]\n",
    "[[device.channel]]\n",
    "[device.properties]\n",
    "=",
    "\"",
    "'''",
    "\"\"\"",
    "\n",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    "id = ",
    "kind = ",
    "replicas = ",
    "max-iterations = ",
    "numSockets = ",
    "sndBufSize = ",
    "connect = ",
    "address = ",
    "transport = ",
    "type = ",
    "method = ",
    "command = ",
    "host = ",
    "auto-address = ",
    "name = ",
    "\"exec\"",
    "\"push\"",
    "\"pull\"",
    "\"sampler\"",
    "\"sink\"",
    "\"tcp://127.0.0.1:0\"",
    "1979-05-27T07:32:00Z",
    "inf",
    "nan",
    "0x7fffffffffffffff",
    "1_000",
    "true",
    "#",
];

const ADDRESS_TOKENS: &[&str] = &[
    "tcp://",
    "ipc://",
    "inproc://",
    "verbs://",
    "*",
    ":",
    "[",
    "]",
    "::1",
    "127.0.0.1",
    "localhost",
    "0",
    "65535",
    "65536",
    "/",
    "@",
    "+",
    ",",
    " ",
    "%",
    "é",
];

// ---- shm-frame ----

/// The session hash the frames are decoded against.
fn shm_session() -> u64 {
    wire::session_hash(1000, "fuzz")
}

fn shm_frame_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    let block = |index, offset, size| PartRef::Block {
        segment: ObjectRef {
            creator_pid: 4242,
            index,
        },
        range: WireRange { offset, size },
        header: wire::HeaderAt::BeforeData,
    };
    let region = PartRef::Region {
        region: ObjectRef {
            creator_pid: 77,
            index: 3,
        },
        range: WireRange {
            offset: 4096,
            size: 1 << 20,
        },
        hint: 0xdead_beef,
    };
    let batches: Vec<Vec<Vec<PartRef>>> = vec![
        vec![],
        vec![vec![]],
        vec![vec![PartRef::Inline(b"hello".into())]],
        vec![vec![PartRef::Inline(vec![7; 256].into())]],
        vec![vec![block(0, 4160, 8 << 20)]],
        vec![vec![PartRef::Block {
            segment: ObjectRef {
                creator_pid: 4242,
                index: 0,
            },
            range: WireRange {
                offset: 69_696,
                size: 1 << 20,
            },
            header: wire::HeaderAt::Slot(5),
        }]],
        vec![vec![
            PartRef::Inline(b"header".into()),
            block(1, 64, 9000),
            region.clone(),
        ]],
        (0..16)
            .map(|msg_idx| vec![PartRef::Inline(vec![msg_idx; 8].into())])
            .collect(),
        vec![
            vec![region],
            vec![PartRef::Inline(Vec::new().into())],
            vec![],
        ],
    ];
    let counted = DeliveryRef {
        segment: ObjectRef {
            creator_pid: 4242,
            index: 0,
        },
        slot: 5,
        generation: 1,
    };
    Ok(batches
        .iter()
        .enumerate()
        .map(|(batch_idx, records)| {
            let delivery = if batch_idx % 2 == 0 {
                counted
            } else {
                DeliveryRef::NONE
            };
            wire::encode(shm_session(), delivery, records)
        })
        .collect())
}

fn check_shm_frame(input: &[u8]) -> Result<bool, String> {
    let Ok(frame) = wire::decode(input, shm_session()) else {
        return Ok(false);
    };
    // The format has one encoding per value: what decodes must encode back to the same bytes.
    let encoded = wire::encode(shm_session(), frame.delivery, &frame.records());
    if encoded != input {
        return Err(format!(
            "decode then encode changed the frame: {} bytes in, {} bytes out",
            input.len(),
            encoded.len()
        ));
    }
    Ok(true)
}

// ---- ofi-control ----

#[cfg(feature = "ofi")]
fn ofi_control_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    Ok(ferromq_ofi::fuzzing::control_frame_examples())
}

#[cfg(feature = "ofi")]
fn check_ofi_control(input: &[u8]) -> Result<bool, String> {
    let Some(encoded) = ferromq_ofi::fuzzing::decode_and_encode_control_frame(input) else {
        return Ok(false);
    };
    // postcard ignores trailing bytes and accepts some non-minimal forms, so the property is
    // that the re-encoded frame decodes to itself, not that it equals the input.
    match ferromq_ofi::fuzzing::decode_and_encode_control_frame(&encoded) {
        Some(again) if again == encoded => Ok(true),
        Some(_) => Err("an ofi control frame re-encoded differently the second time".to_owned()),
        None => Err("an encoded ofi control frame does not decode".to_owned()),
    }
}

// ---- control protocol ----

fn json_seeds<T: serde::Serialize>(values: &[T], literals: &[&str]) -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = values
        .iter()
        .map(|value| serde_json::to_vec(value).expect("control messages serialise"))
        .collect();
    seeds.extend(
        values
            .iter()
            .take(3)
            .map(|value| serde_json::to_vec_pretty(value).expect("control messages serialise")),
    );
    seeds.extend(literals.iter().map(|text| text.as_bytes().to_vec()));
    seeds
}

fn recording_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    use ferromq_record::{Direction, Header, Record, Writer};
    let header = Header {
        device: "sampler".to_owned(),
        session: "fuzz".to_owned(),
        channel: "data".to_owned(),
        channel_config: "name=data,type=push,method=bind".to_owned(),
        started_unix_ms: 1_795_600_000_000,
        ferromq_version: "0.1.0".to_owned(),
    };
    let path = std::env::temp_dir().join(format!("ferromq-fuzz-seed-{}.rec", std::process::id()));
    let mut seeds = Vec::new();
    for (n_messages, missed) in [(0u64, 0u64), (1, 0), (3, 2)] {
        let written = Writer::create(&path, &header).and_then(|mut writer| {
            for sequence in 0..n_messages {
                writer.write(&Record {
                    direction: if sequence % 2 == 0 {
                        Direction::Out
                    } else {
                        Direction::In
                    },
                    sequence: sequence * 2,
                    at: std::time::Duration::from_micros(sequence * 100),
                    parts: (0..=sequence)
                        .map(|part| bytes::Bytes::from(vec![part as u8; (part * 3) as usize]))
                        .collect(),
                })?;
            }
            writer.finish(missed)
        });
        let read = written
            .map_err(|error| std::io::Error::other(error.to_string()))
            .and_then(|_| std::fs::read(&path));
        match read {
            Ok(bytes) => seeds.push(bytes),
            Err(source) => {
                let _ = std::fs::remove_file(&path);
                return Err(FuzzError::Seeds { path, source });
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    Ok(seeds)
}

fn check_recording(input: &[u8]) -> Result<bool, String> {
    let Ok(mut reader) = ferromq_record::Reader::from_reader(
        input,
        input.len() as u64,
        std::path::Path::new("fuzz input"),
    ) else {
        return Ok(false);
    };
    loop {
        match reader.next_record() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => return Ok(false),
        }
    }
    // Accepted: a whole recording, its closing summary read and agreeing with the messages
    // (the reader refuses one that does not).
    Ok(reader.summary().is_some())
}

fn tap_header_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    use ferromq_device::tap::{TapHeader, TapKind};
    Ok([TapKind::In, TapKind::Out, TapKind::End]
        .into_iter()
        .enumerate()
        .map(|(idx, kind)| {
            TapHeader {
                sequence: idx as u64 * 1000,
                at: std::time::Duration::from_millis(idx as u64),
                missed: idx as u64,
                kind,
            }
            .encode()
            .to_vec()
        })
        .collect())
}

fn check_tap_header(input: &[u8]) -> Result<bool, String> {
    let Some(header) = ferromq_device::tap::TapHeader::decode(input) else {
        return Ok(false);
    };
    if header.encode()[..] != *input {
        return Err(format!(
            "{header:?} encodes to other bytes than it was read from"
        ));
    }
    Ok(true)
}

fn control_request_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    let mut requests: Vec<LauncherToDevice> = Transition::ALL
        .iter()
        .map(|&transition| LauncherToDevice::Transition { transition })
        .collect();
    requests.extend([
        LauncherToDevice::State,
        LauncherToDevice::WaitForState {
            state: State::Bound,
            timeout_ms: Some(5000),
        },
        LauncherToDevice::WaitForState {
            state: State::Exiting,
            timeout_ms: None,
        },
        LauncherToDevice::GetProperty {
            key: "msg-size".to_owned(),
        },
        LauncherToDevice::SetProperty {
            key: "rate".to_owned(),
            value: "0".to_owned(),
        },
        LauncherToDevice::Properties,
        LauncherToDevice::Channels,
        LauncherToDevice::Counters,
        LauncherToDevice::Shutdown,
        LauncherToDevice::Overview,
        LauncherToDevice::Tap {
            channel: "data".to_owned(),
        },
        LauncherToDevice::Untap {
            channel: "data[1]".to_owned(),
        },
    ]);
    Ok(json_seeds(
        &requests,
        &[r#"{"request":"wait_for_state","state":"READY","timeout_ms":18446744073709551615}"#],
    ))
}

fn check_control_request(input: &[u8]) -> Result<bool, String> {
    let Ok(request) = serde_json::from_slice::<LauncherToDevice>(input) else {
        return Ok(false);
    };
    let encoded = serde_json::to_vec(&request).map_err(|error| format!("re-encoding: {error}"))?;
    round_trip(
        "JSON",
        &request,
        &String::from_utf8_lossy(&encoded),
        serde_json::from_slice(&encoded),
    )
}

fn control_reply_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    let reply = |ok, state, error: Option<&str>, value| DeviceToLauncher {
        ok,
        state,
        error: error.map(str::to_owned),
        value,
    };
    let replies = [
        reply(true, State::Binding, None, None),
        reply(true, State::Running, None, None),
        reply(
            false,
            State::Idle,
            Some("transition RUN is not allowed in state IDLE"),
            None,
        ),
        reply(
            true,
            State::Bound,
            None,
            Some(serde_json::json!({"data": "tcp://*:41234", "data[1]": "ipc:///tmp/x"})),
        ),
        reply(
            true,
            State::Running,
            None,
            Some(
                serde_json::json!({"data": {"messages_in": 10, "bytes_in": 10240,
                "messages_out": 0, "bytes_out": 0}}),
            ),
        ),
        reply(true, State::Ready, None, Some(serde_json::json!("1024"))),
        reply(
            true,
            State::Ready,
            None,
            Some(serde_json::json!({"rate": "0.5", "msg-size": "1024"})),
        ),
    ];
    Ok(json_seeds(&replies, &[]))
}

fn check_control_reply(input: &[u8]) -> Result<bool, String> {
    let Ok(reply) = serde_json::from_slice::<DeviceToLauncher>(input) else {
        return Ok(false);
    };
    // The launcher reads the answer: these must not panic whatever the device sent.
    let _ = (reply.ok, reply.state.to_string(), reply.error.as_deref());
    let encoded = serde_json::to_vec(&reply).map_err(|error| format!("re-encoding: {error}"))?;
    match serde_json::from_slice::<DeviceToLauncher>(&encoded) {
        Ok(again)
            if again.ok == reply.ok
                && again.state == reply.state
                && again.error == reply.error
                && same_json(again.value.as_ref(), reply.value.as_ref()) =>
        {
            Ok(true)
        }
        Ok(again) => Err(format!("round trip changed {reply:?} into {again:?}")),
        Err(error) => Err(format!("a re-encoded reply does not decode: {error}")),
    }
}

/// JSON equality where floats may differ in the last place: without its `float_roundtrip`
/// feature, serde_json's parser is not always correctly rounded (a number beyond u64, such as
/// `92233720363720368547854775807`, reads back one ulp off), which is no concern of ours.
fn same_json(left: Option<&serde_json::Value>, right: Option<&serde_json::Value>) -> bool {
    use serde_json::Value;
    match (left, right) {
        (None, None) => true,
        (Some(Value::Number(left)), Some(Value::Number(right))) => {
            match (left.as_f64(), right.as_f64()) {
                (Some(left_f64), Some(right_f64)) if left.is_f64() || right.is_f64() => {
                    (left_f64 - right_f64).abs() <= left_f64.abs().max(right_f64.abs()) * 1e-15
                }
                _ => left == right,
            }
        }
        (Some(Value::Array(left)), Some(Value::Array(right))) => {
            left.len() == right.len()
                && left
                    .iter()
                    .zip(right)
                    .all(|(left, right)| same_json(Some(left), Some(right)))
        }
        (Some(Value::Object(left)), Some(Value::Object(right))) => {
            left.len() == right.len()
                && left
                    .iter()
                    .all(|(key, value)| same_json(Some(value), right.get(key)))
        }
        (left, right) => left == right,
    }
}

// ---- --mq-config ----

/// The device ids the configurations are read for.
const MQ_DEVICE_IDS: [&str; 3] = ["sampler1", "sink1", "d"];

fn mq_config_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    // Trimmed of the files' final newline, the seeds stay the bytes runs were made from.
    let sampler_sink = include_str!("../../device/tests/data/sampler-sink.json")
        .trim_end()
        .replace("ADDRESS", "ipc:///tmp/fuzz");
    Ok(text_seeds(&[
        // FairMQ's documented example, in its own spelling (numbers as numbers and as text).
        include_str!("../../device/tests/data/fairmq-example.json").trim_end(),
        // The CLI test's sampler and sink.
        &sampler_sink,
        r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "x", "type": "push", "method": "bind", "transport": "ofi", "provider": "verbs;ofi_rxm", "address": "tcp://127.0.0.1:0"}]}]}}"#,
        r#"{"fairMQOptions": {"devices": [{"id": "d", "channels": [{"name": "out", "type": "pub", "method": "bind", "numSockets": "3", "autoBind": "true", "transport": "default"}, {"name": "in", "type": "sub", "method": "connect", "address": "tcp://localhost:6000"}]}]}}"#,
    ]))
}

fn check_mq_config(input: &[u8]) -> Result<bool, String> {
    // The CLI reads the file as UTF-8; the lossy form keeps every input useful.
    let json = String::from_utf8_lossy(input);
    let mut accepted = false;
    for id in MQ_DEVICE_IDS {
        let mut config = DeviceConfig::new(id);
        if config.add_mq_config("fuzz.json", &json).is_err() {
            continue;
        }
        accepted = true;
        for socket in &config.sockets {
            socket.config.validate().map_err(|error| {
                format!("accepted an invalid channel {:?}: {error}", socket.name)
            })?;
        }
    }
    Ok(accepted)
}

// ---- --channel-config ----

const CHANNEL_CONFIG_SEEDS: &[&str] = &[
    "name=data,type=push,method=bind,address=tcp://*:5555,rateLogging=1",
    "name=data,type=pull,method=connect,address=tcp://localhost:5555",
    "name=data,type=pub,method=bind,address=ipc:///tmp/x",
    "name=data,type=sub,method=connect,address=ipc:///tmp/x,transport=shmem",
    "name=ctl,type=req,method=connect,address=inproc://ctl,linger=500,sndBufSize=1000,rcvBufSize=1000",
    "name=out,type=push,method=bind,numSockets=3,autoBind=true,portRangeMin=22000,portRangeMax=23000",
    "name=x,type=pair,method=bind,address=tcp://127.0.0.1:0,transport=ofi,provider=tcp;ofi_rxm",
    "name=rep,type=rep,method=bind,address=verbs://[::1]:0,busyPoll=1,sndKernelSize=0,rcvKernelSize=65536",
    "name=data,type=push,method=bind,address=tcp://*:5555,address=ipc:///tmp/y,numSockets=2",
];

fn check_channel_config(input: &[u8]) -> Result<bool, String> {
    let text = String::from_utf8_lossy(input);
    // What the CLI reads: one configuration per `address=`, each a socket of the channel.
    if let Ok(sockets) = ChannelConfig::parse_key_values_sockets(&text) {
        if sockets.len() > 1
            && sockets
                .iter()
                .any(|socket| socket.num_sockets != sockets.len())
        {
            return Err(format!(
                "{} sockets whose numSockets differ from their number",
                sockets.len()
            ));
        }
        let _ = DeviceConfig::new("fuzz").add_channel_sockets(sockets);
    }
    let Ok(config) = ChannelConfig::parse_key_values(&text) else {
        return Ok(false);
    };
    // What the CLI does next: add it to the device, which expands numSockets.
    let _ = DeviceConfig::new("fuzz").add_channel(config.clone());
    let printed = config.to_key_values();
    round_trip(
        "to_key_values",
        &config,
        &printed,
        ChannelConfig::parse_key_values(&printed),
    )
}

// ---- topologies ----

/// The transports of the `ferromq` binary with every feature.
const TRANSPORTS: [&str; 3] = ["zeromq", "shmem", "ofi"];

/// The device properties those transports read (ofi's only with the `ofi` feature: without it
/// an `ofi-*` key is refused as one no device reads, which only makes a load refuse more).
fn transport_properties() -> Vec<&'static str> {
    let keys = ferromq_shm::ShmOptions::PROPERTIES.iter();
    #[cfg(feature = "ofi")]
    let keys = keys.chain(&ferromq_ofi::OfiOptions::PROPERTIES);
    keys.copied().collect()
}

/// The address schemes of those transports, as they give them (zeromq's and shmem's are the
/// plain ones; ofi's only with the `ofi` feature: without it, unjudged). Not through
/// `ferromq_ofi::register`: code that can reach libfabric links it into this binary, and
/// loading it installs its providers' signal handlers, which turned a worker's abort into an
/// exit the supervisor did not count as a crash.
fn transport_schemes() -> Vec<(&'static str, &'static [&'static str])> {
    let plain = ferromq_core::TransportTraits::PLAIN.schemes;
    #[allow(unused_mut)]
    let mut schemes = vec![("zeromq", plain), ("shmem", plain)];
    #[cfg(feature = "ofi")]
    schemes.push(("ofi", &ferromq_ofi::SCHEMES));
    schemes
}

fn workspace_dir(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

fn toml_files(dir: &Path) -> Result<Vec<Vec<u8>>, FuzzError> {
    let seeds_error = |source| FuzzError::Seeds {
        path: dir.to_owned(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(seeds_error)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()
        .map_err(seeds_error)?;
    paths.retain(|path| {
        path.extension()
            .is_some_and(|extension| extension == "toml")
    });
    paths.sort();
    paths
        .iter()
        .map(|path| {
            std::fs::read(path).map_err(|source| FuzzError::Seeds {
                path: path.clone(),
                source,
            })
        })
        .collect()
}

fn topology_seeds() -> Result<Vec<Vec<u8>>, FuzzError> {
    let mut seeds = toml_files(&workspace_dir("topologies"))?;
    seeds.extend(toml_files(&workspace_dir("crates/topology/tests/data"))?);
    Ok(seeds)
}

fn check_topology(input: &[u8]) -> Result<bool, String> {
    let text = String::from_utf8_lossy(input);
    let kinds = Builtin::names();
    let transport_properties = transport_properties();
    let transport_schemes = transport_schemes();
    let known = Known {
        kinds: &kinds,
        transports: &TRANSPORTS,
        transport_properties: &transport_properties,
        transport_schemes: &transport_schemes,
        rpc_group_keys: &ferromq_rpc::GROUP_KEYS,
        // As `ferromq run` loads: the built-in devices' property reading is fed the file too.
        check_properties: Some(ferromq_devices::check_topology_properties),
        required_channels: Some(ferromq_devices::required_channels),
    };
    match ferromq_topology::load("fuzz.toml", &text, &known) {
        Ok(topology) => {
            if topology.devices.is_empty() {
                return Err("a topology without devices was accepted".to_owned());
            }
            // What `ferromq run` does next.
            let instances = topology.instances();
            let _ = (topology.to_dot(), topology.to_mermaid());
            let n_expected: usize = topology.devices.iter().map(|device| device.replicas).sum();
            if instances.len() != n_expected {
                return Err(format!(
                    "{} instances for {n_expected} replicas",
                    instances.len()
                ));
            }
            Ok(true)
        }
        Err(errors) => {
            if errors.0.is_empty() {
                return Err("a topology was refused without an error".to_owned());
            }
            let _ = errors.to_string();
            Ok(false)
        }
    }
}

// ---- addresses ----

const ADDRESS_SEEDS: &[&str] = &[
    "tcp://*:5555",
    "tcp://127.0.0.1:0",
    "tcp://localhost:5555",
    "tcp://[::1]:6000",
    "verbs://10.0.0.1:7000",
    "ipc:///tmp/ferromq-data",
    "ipc://@abstract",
    "inproc://control",
];

fn check_address(input: &[u8]) -> Result<bool, String> {
    let text = String::from_utf8_lossy(input);
    let Ok(address) = Address::parse(&text) else {
        return Ok(false);
    };
    let _ = (
        address.wants_free_port(),
        address.scheme(),
        address.for_local_connect(),
    );
    let printed = address.to_string();
    round_trip("display", &address, &printed, Address::parse(&printed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the long run of `control-reply` (seed 1, input 5369388): a number beyond u64
    /// reads back one ulp off without serde_json's `float_roundtrip`; not a ferromq bug.
    #[test]
    fn a_reply_number_beyond_u64_passes_the_round_trip() {
        let input = br#"{"ok":true,"state":"RUNNING","value":{"data":{"bytes_in":92233720363720368547854775807,"bytes_out":0}}}"#;
        assert_eq!(check_control_reply(input), Ok(true));
        let changed = serde_json::json!({"a": [1.5, 2]});
        assert!(!same_json(
            Some(&changed),
            Some(&serde_json::json!({"a": [1.5, 3]}))
        ));
        assert!(!same_json(
            Some(&changed),
            Some(&serde_json::json!({"b": [1.5, 2]}))
        ));
        assert!(same_json(Some(&changed), Some(&changed)));
    }

    #[test]
    fn every_seed_passes_its_check_and_most_decode() {
        for target in all() {
            let seeds = target.seeds().unwrap();
            assert!(!seeds.is_empty(), "{} has no seeds", target.name);
            for seed in &seeds {
                assert!(target.check(seed).is_ok(), "{}", target.name);
            }
        }
        assert!(by_name("topology").is_ok());
        assert!(
            by_name("nope")
                .unwrap_err()
                .to_string()
                .contains("topology")
        );
    }
}
