//! busyPoll receives deliver every message, in order, on a current-thread runtime (where a spin
//! loop that never yielded would starve the transport's own tasks). No timing is asserted.

use std::time::Duration;

use ferromq::prelude::*;
use ferromq::{ShmOptions, ShmTransport, ZmqTransport};

async fn ping_pong(transport: &dyn Transport, address: &str) {
    let busy = |socket_type, method| ChannelConfig {
        busy_poll: true,
        ..ChannelConfig::new("data", socket_type, method).with_address(address)
    };
    let mut rep = Channel::open(transport, busy(SocketType::Rep, Method::Bind), "data")
        .await
        .unwrap();
    let bound = rep.bind_configured().await.unwrap().for_local_connect();
    let mut req = Channel::open(
        transport,
        ChannelConfig {
            address: Some(bound.to_string()),
            ..busy(SocketType::Req, Method::Connect)
        },
        "data",
    )
    .await
    .unwrap();
    req.connect_configured().await.unwrap();
    let server = async {
        for _ in 0..2000 {
            let request = rep.receive().await.unwrap();
            rep.send(request).await.unwrap();
        }
        // A busy receive still honours its timeout.
        let nothing = rep.receive_timeout(Duration::from_millis(20)).await;
        assert!(
            matches!(nothing, Err(ferromq::Error::Timeout { .. })),
            "{nothing:?}"
        );
    };
    let client = async {
        for msg_idx in 0..2000u64 {
            let mut request = transport.new_message(64).await.unwrap();
            request.data_mut()[..8].copy_from_slice(&msg_idx.to_le_bytes());
            req.send(request).await.unwrap();
            let reply = req.receive().await.unwrap();
            assert_eq!(reply.data()[..8], msg_idx.to_le_bytes());
        }
    };
    tokio::join!(server, client);
}

#[tokio::test(flavor = "current_thread")]
async fn busy_poll_round_trips_over_zeromq_ipc() {
    let path = std::env::temp_dir().join(format!("ferromq-busy-{}.ipc", std::process::id()));
    ping_pong(&ZmqTransport::new(), &format!("ipc://{}", path.display())).await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "current_thread")]
async fn busy_poll_round_trips_over_shmem() {
    let session = format!("test-busy-{}", std::process::id());
    let transport = ShmTransport::new(ShmOptions {
        session: session.clone(),
        segment_size: 16 << 20,
        ..ShmOptions::default()
    });
    let path = std::env::temp_dir().join(format!("ferromq-busy-shm-{}.ipc", std::process::id()));
    ping_pong(&transport, &format!("ipc://{}", path.display())).await;
    let _ = std::fs::remove_file(path);
    drop(transport);
    let _ = ferromq_shm::cleanup::clean_session(ferromq_shm::names::current_uid(), &session, true);
}
