//! `ferromq record` and `ferromq replay`: a multipart stream recorded from a running device and
//! replayed into a sink that checks every part's checksum and the part count; a recorder that
//! falls behind says how much it missed while the pipeline it taps loses nothing; replay keeps
//! the recorded pace (or a multiple); bad input is refused naming it.

mod support;

use std::time::Duration;

use tokio::io::AsyncBufReadExt;

use support::{
    Device, Ipc, ferromq_as_is, finish, finish_rest, signal, top_json_until, wait_for_line,
};

/// A scratch file, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        Scratch(std::env::temp_dir().join(format!("ferromq-{tag}-{}.rec", std::process::id())))
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Waits until `session` has a device `id` that `ferromq top` sees RUNNING.
async fn running(session: &str, id: &str) {
    top_json_until(session, |snapshot| {
        snapshot["devices"].as_array().is_some_and(|devices| {
            devices
                .iter()
                .any(|device| device["id"] == id && device["state"] == "RUNNING")
        })
    })
    .await;
}

/// `ferromq record SESSION DEVICE CHANNEL --output /dev/null`, run to its end.
async fn record_nowhere(session: &str, device: &str, channel: &str) -> support::Finished {
    finish(ferromq_as_is(&[
        "record",
        session,
        device,
        channel,
        "--output",
        "/dev/null",
    ]))
    .await
}

/// A sink and a sampler of `session` over `live`, started in that order with their extra
/// arguments; returns once `ferromq top` sees the sampler RUNNING.
async fn sampler_into_sink(
    session: &str,
    live: &Ipc,
    sink_args: &[&str],
    sampler_args: &[&str],
) -> (tokio::process::Child, tokio::process::Child) {
    let sink = Device::new("sink", "sink")
        .args(&["--session", session])
        .args(sink_args)
        .channel("pull", "bind", &live.address())
        .spawn();
    let sampler = Device::new("sampler", "sampler")
        .args(&["--session", session])
        .args(sampler_args)
        .channel("push", "connect", &live.address())
        .spawn();
    running(session, "sampler").await;
    (sink, sampler)
}

/// A sampler of 64-byte messages at a rate into a sink, and a recorder of the sampler whose
/// tap is open (it said so).
struct Recorded {
    session: String,
    _live: Ipc,
    sink: tokio::process::Child,
    sampler: tokio::process::Child,
    recording: Scratch,
    recorder: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Recorded {
    /// Starts them (session, ipc and file named after `tag`), the recorder with `extra`.
    async fn start(tag: &str, rate: &str, extra: &[&str]) -> Recorded {
        let session = format!("{tag}-{}", std::process::id());
        let live = Ipc::new(tag);
        let (sink, sampler) =
            sampler_into_sink(&session, &live, &[], &["--rate", rate, "--msg-size", "64"]).await;
        let recording = Scratch::new(tag);
        let mut recorder = record_sampler(&session, recording.path(), extra);
        let mut lines = tokio::io::BufReader::new(recorder.stdout.take().expect("stdout")).lines();
        wait_for_line(&mut lines, "ferromq: recording ", &mut Vec::new()).await;
        Recorded {
            session,
            _live: live,
            sink,
            sampler,
            recording,
            recorder,
            lines,
        }
    }
}

/// The messages `ferromq top`'s `snapshot` says the device `sampler` sent (0 when not shown).
fn sampler_sent(snapshot: &serde_json::Value) -> u64 {
    snapshot["devices"]
        .as_array()
        .and_then(|devices| devices.iter().find(|device| device["id"] == "sampler"))
        .and_then(|device| device["channels"][0]["messages_out"].as_u64())
        .unwrap_or(0)
}

/// `ferromq record SESSION sampler data --output PATH` with `extra`.
fn record_sampler(session: &str, path: &str, extra: &[&str]) -> tokio::process::Child {
    let mut args = vec!["record", session, "sampler", "data", "--output", path];
    args.extend_from_slice(extra);
    ferromq_as_is(&args)
}

/// `ferromq replay PATH` at `speed` into a push channel connecting to `address`.
fn replay(path: &str, speed: &str, address: &str) -> tokio::process::Child {
    ferromq_as_is(&[
        "replay",
        path,
        "--id",
        "replay",
        "--control",
        "static",
        "--speed",
        speed,
        "--color",
        "false",
        "--channel-config",
        &format!("name=data,type=push,method=connect,address={address},rateLogging=0"),
    ])
}

/// The number after `key` in `text` (`received 100 messages` -> 100 for `received `).
fn number_after(text: &str, key: &str) -> u64 {
    text.split_once(key)
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|number| number.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_multipart_stream_replays_into_a_verifying_sink() {
    let session = format!("record-{}", std::process::id());
    let live = Ipc::new("record-live");
    // 150 000 messages, 50 000 of them recorded (the recorder starts after the sampler, which
    // runs 7.5 s: room for a slow start on a loaded machine); both ends stop on their own.
    let (sink, sampler) = sampler_into_sink(
        &session,
        &live,
        &["--verify", "--num-parts", "3", "--max-iterations", "149999"],
        &[
            "--rate",
            "20000",
            "--num-parts",
            "3",
            "--msg-size",
            "200",
            "--max-iterations",
            "149999",
        ],
    )
    .await;
    let recording = Scratch::new("record-multipart");
    let recorded = finish(record_sampler(
        &session,
        recording.path(),
        &["--messages", "50000"],
    ))
    .await;
    assert!(
        recorded.stdout.contains("recorded 50000 messages"),
        "{}{}",
        recorded.stdout,
        recorded.stderr
    );
    // The pipeline went on untouched: every message arrived, every checksum held.
    let sampler = finish(sampler).await;
    let sink = finish(sink).await;
    sampler.assert_exited_0();
    sink.assert_exited_0();
    assert!(
        sink.stdout.contains("received 150000 messages")
            && sink.stdout.contains("150000 checksums ok"),
        "{}",
        sink.stdout
    );

    let mut reader =
        ferromq_record::Reader::open(std::path::Path::new(recording.path())).expect("a recording");
    assert_eq!(reader.header().device, "sampler");
    assert_eq!(reader.header().channel, "data");
    assert!(reader.header().channel_config.contains("type=push"));
    let first = reader.next_record().expect("readable").expect("a message");
    assert_eq!(first.parts.len(), 3);
    assert_eq!(first.direction, ferromq_record::Direction::Out);

    // Replayed as fast as possible into a sink that checks every part and the part count
    // (parts of 200, 100 and 66 bytes: 366 a message).
    let replayed_into = Ipc::new("record-replay");
    let checker = Device::new("sink", "checker")
        .args(&["--verify", "--num-parts", "3", "--max-iterations", "49999"])
        .channel("pull", "bind", &replayed_into.address())
        .spawn();
    let replay = finish(replay(recording.path(), "0", &replayed_into.address())).await;
    replay.assert_exited_0();
    let checked = finish(checker).await;
    checked.assert_exited_0();
    assert!(
        checked
            .stdout
            .contains("received 50000 messages, 18300000 bytes")
            && checked.stdout.contains("50000 checksums ok"),
        "{}",
        checked.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorder_that_falls_behind_says_how_much_it_missed_and_slows_nothing() {
    let session = format!("record-behind-{}", std::process::id());
    let live = Ipc::new("record-behind");
    // 600 000 messages at 100 000 a second; both ends stop on their own.
    let (sink, sampler) = sampler_into_sink(
        &session,
        &live,
        &["--max-iterations", "599999"],
        &[
            "--msg-size",
            "64",
            "--rate",
            "100000",
            "--max-iterations",
            "599999",
        ],
    )
    .await;
    let recording = Scratch::new("record-behind");
    let recorder = record_sampler(&session, recording.path(), &[]);
    let mut pause = tokio::time::interval(Duration::from_millis(1500));
    pause.tick().await;
    pause.tick().await;
    // The recorder stops taking copies; the sampler goes on at full speed.
    signal(&recorder, "STOP");
    pause.tick().await;
    signal(&recorder, "CONT");
    pause.tick().await;
    signal(&recorder, "INT");
    let recorded = finish(recorder).await;
    recorded.assert_exited(1);
    let missed = number_after(&recorded.stderr, "missed ");
    assert!(missed > 0, "{}", recorded.stderr);
    let mut reader =
        ferromq_record::Reader::open(std::path::Path::new(recording.path())).expect("a recording");
    while reader.next_record().expect("readable").is_some() {}
    let summary = reader.summary().expect("a finished recording");
    assert_eq!(summary.missed, missed);
    assert!(summary.messages > 0);

    let sampler = finish(sampler).await;
    let sink = finish(sink).await;
    sampler.assert_exited_0();
    sink.assert_exited_0();
    assert!(
        sink.stdout.contains("received 600000 messages"),
        "the tapped pipeline lost messages: {}",
        sink.stdout
    );
}

/// A recorder stops when the device it taps ends (SIGINT), `--messages` not reached and the
/// device's parent (this test) not yet having waited for it, so that its pid is a zombie's:
/// the ending device closes its tap after the copies still queued, and the recording holds
/// every message the tap numbered. A device killed with SIGKILL cannot close it: the recorder
/// says its recording may lack copies it cannot count, and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorder_stops_when_its_device_ends_or_is_killed() {
    // 1. The sampler is stopped (SIGINT) once the tap is open, at 5 000 messages a second (a
    // pace any recorder keeps up with: nothing is missed).
    let Recorded {
        session,
        _live,
        sink,
        sampler,
        recording,
        recorder,
        lines,
    } = Recorded::start("record-end", "5000", &["--messages", "1000000"]).await;
    // Stopped once it sent another 2 000 messages (copies went to the recorder meanwhile).
    let sent_then = sampler_sent(&top_json_until(&session, |_| true).await);
    top_json_until(&session, |snapshot| {
        sampler_sent(snapshot) >= sent_then + 2000
    })
    .await;
    signal(&sampler, "INT");
    let recorded = finish_rest(recorder, lines).await;
    recorded.assert_exited_0();
    let numbered = number_after(&recorded.stdout, "closed the tap after ");
    assert!(numbered > 0, "{}", recorded.stdout);
    let mut reader =
        ferromq_record::Reader::open(std::path::Path::new(recording.path())).expect("a recording");
    let mut sequences = Vec::new();
    while let Some(record) = reader.next_record().expect("readable") {
        sequences.push(record.sequence);
    }
    assert_eq!(
        sequences,
        (0..numbered).collect::<Vec<_>>(),
        "the recording lacks copies the tap numbered:\n{}",
        recorded.stdout
    );
    assert_eq!(reader.summary().expect("a finished recording").missed, 0);
    finish(sampler).await.assert_exited_0();
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();

    // 2. The sampler is killed once the tap is open.
    let Recorded {
        sink,
        sampler,
        recorder,
        lines,
        _live,
        recording: _recording,
        ..
    } = Recorded::start("record-kill", "10000", &[]).await;
    signal(&sampler, "KILL");
    let recorded = finish_rest(recorder, lines).await;
    recorded.assert_exited(1);
    assert!(
        recorded.stderr.contains("device \"sampler\" (pid ")
            && recorded
                .stderr
                .contains("ended without closing its tap (killed, or its tap's forwarder"),
        "{}",
        recorded.stderr
    );
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();
    let _ = finish(sampler).await;
}

/// Writes a finished recording of channel `data` holding `records`, `missed` missed.
fn write_recording(
    path: &str,
    records: impl IntoIterator<Item = ferromq_record::Record>,
    missed: u64,
) {
    let header = ferromq_record::Header {
        device: "test".into(),
        session: "test".into(),
        channel: "data".into(),
        channel_config: "name=data,type=push".into(),
        started_unix_ms: 0,
        ferromq_version: "test".into(),
    };
    let mut writer =
        ferromq_record::Writer::create(std::path::Path::new(path), &header).expect("create");
    for record in records {
        writer.write(&record).expect("write");
    }
    writer.finish(missed).expect("finish");
}

/// Writes a recording of `n` one-part messages `gap` apart.
fn paced_recording(path: &str, n: u64, gap: Duration) {
    let records = (0..n).map(|sequence| ferromq_record::Record {
        direction: ferromq_record::Direction::Out,
        sequence,
        at: gap * u32::try_from(sequence).expect("small"),
        parts: vec![bytes::Bytes::from(format!("message {sequence}"))],
    });
    write_recording(path, records, 0);
}

/// Replays `path` at `speed` into a sink taking `n` messages; the seconds the replay says it
/// took.
async fn replay_seconds(path: &str, speed: &str, n: u64) -> f64 {
    let into = Ipc::new("replay-pace");
    let sink = Device::new("sink", "pace-sink")
        .args(&["--max-iterations", &(n - 1).to_string()])
        .channel("pull", "bind", &into.address())
        .spawn();
    let replay = finish(replay(path, speed, &into.address())).await;
    replay.assert_exited_0();
    finish(sink).await.assert_exited_0();
    let text = format!("{}{}", replay.stdout, replay.stderr);
    let (_, rest) = text.split_once(" in ").unwrap_or_else(|| panic!("{text}"));
    let seconds = rest.split_whitespace().next().expect("seconds");
    let _ = number_after(&text, "replayed ");
    seconds.parse().unwrap_or_else(|_| panic!("{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_keeps_the_recorded_pace_or_a_multiple_of_it() {
    let recording = Scratch::new("replay-pace");
    // 41 messages 25 ms apart: one second from the first to the last.
    paced_recording(recording.path(), 41, Duration::from_millis(25));
    let as_recorded = replay_seconds(recording.path(), "1", 41).await;
    let four_times = replay_seconds(recording.path(), "4", 41).await;
    assert!(
        as_recorded >= 0.99,
        "the recorded second took {as_recorded} s"
    );
    assert!(four_times >= 0.24, "a quarter second took {four_times} s");
    assert!(
        four_times < as_recorded,
        "{four_times} s at 4x, {as_recorded} s at 1x"
    );
}

#[tokio::test]
async fn record_and_replay_refuse_what_they_cannot_do() {
    let nowhere = record_nowhere("no-such-session", "dev", "data").await;
    assert_eq!(nowhere.code, Some(1));
    assert!(
        nowhere
            .stderr
            .contains("no running device of session \"no-such-session\""),
        "{}",
        nowhere.stderr
    );

    // `--messages 0` recorded nothing and exited 0 (a bad-input sweep).
    let zero = finish(support::ferromq_as_is(&[
        "record",
        "s",
        "d",
        "data",
        "--output",
        "/nonexistent/x.fmqr",
        "--messages",
        "0",
    ]))
    .await;
    assert_eq!(zero.code, Some(2), "{}", zero.stderr);
    assert!(
        zero.stderr.contains("'0' for '--messages"),
        "{}",
        zero.stderr
    );

    let session = format!("record-refuse-{}", std::process::id());
    let ipc = Ipc::new("record-refuse");
    let sink = Device::new("sink", "quiet")
        .args(&["--session", &session])
        .channel("pull", "bind", &ipc.address())
        .spawn();
    running(&session, "quiet").await;
    let no_channel = record_nowhere(&session, "quiet", "nope").await;
    assert_eq!(no_channel.code, Some(1));
    assert!(
        no_channel
            .stderr
            .contains("no channel \"nope\"; its channels: data"),
        "{}",
        no_channel.stderr
    );
    let no_device = record_nowhere(&session, "loud", "data").await;
    assert_eq!(no_device.code, Some(1));
    assert!(
        no_device
            .stderr
            .contains("has no device \"loud\"; its devices: quiet")
    );
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();

    let not_a_recording = Scratch::new("not-a-recording");
    std::fs::write(&not_a_recording.0, b"just some bytes").unwrap();
    let refused = finish(replay(not_a_recording.path(), "1", "ipc:///nonexistent/x")).await;
    assert_eq!(refused.code, Some(1));
    assert!(
        refused.stderr.contains("is not a ferromq recording"),
        "{}",
        refused.stderr
    );
    // The cause once, not twice (it was both the message's end and its source).
    let missing = finish(replay(
        "/nonexistent-recording",
        "1",
        "ipc:///nonexistent/x",
    ))
    .await;
    assert_eq!(missing.code, Some(1), "{}", missing.stderr);
    assert_eq!(
        missing.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        missing.stderr
    );
    // Negative, too slow to schedule (a tiny factor panicked the device turning the recorded
    // gap into a wait), and too large to mean anything: each refused at once, by value.
    for (speed, shown) in [
        ("-1", "--speed -1.0"),
        ("1e-300", "--speed 1e-300"),
        ("1e-9", "--speed 1e-9"),
        ("1e308", "--speed 1e308:"),
    ] {
        let bad_speed = finish(replay(
            not_a_recording.path(),
            speed,
            "ipc:///nonexistent/x",
        ))
        .await;
        assert_eq!(
            bad_speed.code,
            Some(2),
            "--speed {speed}: {}",
            bad_speed.stderr
        );
        assert!(
            bad_speed.stderr.contains(shown) && !bad_speed.stderr.contains("panicked"),
            "--speed {speed}: {}",
            bad_speed.stderr
        );
    }
}

/// Writes a finished recording of channel `data`: a message of `parts` parts for each of
/// `sequences`, `missed` missed.
fn recording_of(path: &str, sequences: &[u64], parts: usize, missed: u64) {
    let records = sequences.iter().map(|&sequence| ferromq_record::Record {
        direction: ferromq_record::Direction::Out,
        sequence,
        at: Duration::ZERO,
        parts: vec![bytes::Bytes::from(format!("message {sequence}")); parts],
    });
    write_recording(path, records, missed);
}

/// A recording that contradicts itself (a sweep found each replayed without a word, exit 0)
/// fails the replay (exit 1) where the reading reaches it, naming the file, the place and the
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_refuses_a_recording_that_contradicts_itself() {
    let into = Ipc::new("replay-inconsistent");
    let sink = Device::new("sink", "inconsistent-sink")
        .channel("pull", "bind", &into.address())
        .spawn();
    let recording = Scratch::new("replay-inconsistent");
    let path = recording.path();
    let bad_files: [(&str, &dyn Fn()); 4] = [
        (
            "1 byte(s) after the end record, where the file should end",
            &|| {
                recording_of(path, &[0, 1], 1, 0);
                let mut bytes = std::fs::read(path).unwrap();
                bytes.push(b'x');
                std::fs::write(path, bytes).unwrap();
            },
        ),
        ("the summary says 9 messages, the file holds 2", &|| {
            recording_of(path, &[0, 1], 1, 0);
            let mut bytes = std::fs::read(path).unwrap();
            let count = b"\"messages\":2";
            let at = bytes
                .windows(count.len())
                .rposition(|window| window == count)
                .expect("the summary's message count");
            bytes[at + count.len() - 1] = b'9';
            std::fs::write(path, bytes).unwrap();
        }),
        (
            "message 3 has sequence number 1, which channel \"data\" already had (message 2)",
            &|| recording_of(path, &[0, 1, 1], 1, 0),
        ),
        (
            "message 1 (sequence number 0) has 0 parts: a message has at least 1",
            &|| recording_of(path, &[0], 0, 0),
        ),
    ];
    let mut not_refused = Vec::new();
    for (problem, write) in bad_files {
        write();
        let replayed = finish(replay(path, "0", &into.address())).await;
        if replayed.code != Some(1)
            || !replayed.stderr.contains(&format!("{path} at byte "))
            || !replayed.stderr.contains(problem)
            || replayed.stderr.contains("panicked")
        {
            not_refused.push(format!(
                "{problem}: exit {:?}, {}",
                replayed.code, replayed.stderr
            ));
        }
    }
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();
    assert!(not_refused.is_empty(), "{not_refused:#?}");
}

/// A replay that `--max-iterations` ends early, on a recording longer than its reader reads
/// ahead, said the finished file had no end record (the reader, cut off, reported none); and
/// the bytes it said it replayed were counted before each send, not after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_ended_by_max_iterations_counts_what_it_sent_and_blames_no_file() {
    let into = Ipc::new("replay-cut");
    let sink = Device::new("sink", "cut-sink")
        .channel("pull", "bind", &into.address())
        .spawn();
    let recording = Scratch::new("replay-cut");
    let sequences: Vec<u64> = (0..3000).collect();
    recording_of(recording.path(), &sequences, 1, 0);
    let replayed = finish(ferromq_as_is(&[
        "replay",
        recording.path(),
        "--id",
        "replay",
        "--control",
        "static",
        "--speed",
        "0",
        "--max-iterations",
        "10",
        "--color",
        "false",
        "--channel-config",
        &format!(
            "name=data,type=push,method=connect,address={},rateLogging=0",
            into.address()
        ),
    ]))
    .await;
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();
    replayed.assert_exited_0();
    let text = format!("{}{}", replayed.stdout, replayed.stderr);
    assert!(!text.contains("no end record"), "{text}");
    let n_messages: u64 = text
        .split("replayed ")
        .find_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count of messages replayed in:\n{text}"));
    let sent_bytes: u64 = (0..n_messages)
        .map(|sequence| format!("message {sequence}").len() as u64)
        .sum();
    assert!(
        text.contains(&format!(
            "replayed {n_messages} messages ({sent_bytes} bytes)"
        )),
        "{text}"
    );
    // Stopped while its first message waits for a peer: nothing was sent, no byte either.
    let session = format!("replay-nopeer-{}", std::process::id());
    let nowhere = Ipc::new("replay-nopeer");
    let waiting = ferromq_as_is(&[
        "replay",
        recording.path(),
        "--id",
        "replay",
        "--session",
        &session,
        "--control",
        "static",
        "--speed",
        "0",
        "--color",
        "false",
        "--channel-config",
        &format!(
            "name=data,type=push,method=connect,address={},rateLogging=0",
            nowhere.address()
        ),
    ]);
    running(&session, "replay").await;
    signal(&waiting, "INT");
    let stopped = finish(waiting).await;
    let text = format!("{}{}", stopped.stdout, stopped.stderr);
    assert!(text.contains("replayed 0 messages (0 bytes)"), "{text}");
}
