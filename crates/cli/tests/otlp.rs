//! `--otlp-endpoint`: with the `otel` feature a device pushes its metrics to an OTLP/HTTP
//! receiver (here a minimal one in the test, which answers every POST with 200 and keeps the
//! bodies); without it the option is refused naming the feature. Bad values are refused naming
//! them either way.

mod support;

use support::{Device, Ipc};

#[cfg(feature = "otel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_pushes_its_channel_counters_to_an_otlp_receiver() {
    use support::{finish, signal};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/v1/metrics", listener.local_addr().unwrap());
    let (bodies_tx, mut bodies) = tokio::sync::mpsc::unbounded_channel::<(String, Vec<u8>)>();
    let receiver = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let bodies_tx = bodies_tx.clone();
            tokio::spawn(async move {
                // One request per connection is enough for the exporter's blocking client;
                // keep-alive requests are read in turn.
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 65536];
                loop {
                    let Some(head_end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
                    let length: usize = head
                        .lines()
                        .find_map(|line| {
                            let (key, value) = line.split_once(':')?;
                            key.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buffer.len() < head_end + 4 + length {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = buffer[head_end + 4..head_end + 4 + length].to_vec();
                    buffer.drain(..head_end + 4 + length);
                    let _ = bodies_tx.send((head, body));
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let ipc = Ipc::new("otlp");
    let sink = Device::new("sink", "otlp-sink")
        .args(&["--otlp-endpoint", &endpoint])
        .channel("pull", "bind", &ipc.address())
        .spawn();
    let sampler = Device::new("sampler", "otlp-sampler")
        .args(&["--rate", "100", "--max-iterations", "100000"])
        .channel("push", "connect", &ipc.address())
        .spawn();
    let wanted = b"ferromq_channel_messages_in_total";
    let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some((head, body)) = bodies.recv().await {
            if body.windows(wanted.len()).any(|window| window == wanted)
                && body.windows(9).any(|window| window == b"otlp-sink")
            {
                return Some(head);
            }
        }
        None
    })
    .await
    .expect("no OTLP push with the sink's counters within a minute")
    .expect("the receiver ended");
    assert!(found.starts_with("POST /v1/metrics"), "{found}");
    assert!(
        found
            .to_ascii_lowercase()
            .contains("application/x-protobuf"),
        "{found}"
    );
    // Upstream first: a sink stopped at the same time may leave the sampler's last message
    // untaken, which fails the sampler (see `top.rs`).
    signal(&sampler, "INT");
    finish(sampler).await.assert_exited_0();
    signal(&sink, "INT");
    finish(sink).await.assert_exited_0();
    receiver.abort();
}

#[cfg(not(feature = "otel"))]
#[tokio::test]
async fn without_the_otel_feature_the_option_says_how_to_get_it() {
    let refused = Device::new("sink", "s")
        .args(&["--otlp-endpoint", "http://collector.invalid/v1/metrics"])
        .finish()
        .await;
    assert_eq!(refused.code, Some(2));
    assert!(
        refused.stderr.contains("--features otel"),
        "{}",
        refused.stderr
    );
}

#[tokio::test]
async fn metrics_and_otlp_together_or_a_bad_url_are_refused_naming_them() {
    let both = Device::new("sink", "s")
        .args(&[
            "--metrics",
            "127.0.0.1:0",
            "--otlp-endpoint",
            "http://collector.invalid/v1/metrics",
        ])
        .finish()
        .await;
    assert_eq!(both.code, Some(2));
    assert!(both.stderr.contains("give one"), "{}", both.stderr);
    let ipc = Ipc::new("otlp-bad");
    let bad = Device::new("sink", "s")
        .args(&["--otlp-endpoint", "ftp://collector"])
        .channel("pull", "bind", &ipc.address())
        .finish()
        .await;
    assert_eq!(bad.code, Some(2));
    assert!(bad.stderr.contains("ftp://collector"), "{}", bad.stderr);
}
