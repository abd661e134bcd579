//! A short message travels inside its descriptor wherever it lies: one of at most
//! `shm-inline-max` bytes in a block (an rpc frame holding one call, a block whose used size
//! was cut) is copied into its ring entry, and its block is released by its sender, not handed
//! to the receiver. The block's reference must then be neither handed over (a leak: the
//! segment fills) nor released twice, for a push and for a publisher, which hands one
//! reference per subscriber to what it sends by reference.

use std::time::Duration;

use ferromq_core::{Channel, Message, Method, SocketType, Transport};
use ferromq_shm::ShmTransport;

mod support;
use support::{TestSession, blocks_back_to, is_block, live_blocks, reclaim_released};

/// Through a 4 MiB segment: 2 000 blocks of 64 KiB (125 MiB) would fill it 31 times over.
const N_MESSAGES: u64 = 2_000;
const BLOCK: usize = 64 << 10;
const USED: usize = 100;

async fn open(
    transport: &ShmTransport,
    socket_type: SocketType,
    method: Method,
    address: &str,
) -> Channel {
    support::open_channel(transport, socket_type, method, address, false).await
}

/// A 64 KiB block of the segment holding `idx` in its first `USED` bytes, cut to those.
async fn short_message_in_a_block(transport: &ShmTransport, idx: u64) -> Message {
    let mut message = transport.new_message(BLOCK).await.unwrap();
    message.set_used_size(USED).unwrap();
    message.data_mut()[..8].copy_from_slice(&idx.to_le_bytes());
    assert!(is_block(&message), "a 64 KiB message is a block");
    message
}

fn check(message: &Message, idx: u64) {
    assert_eq!(message.len(), USED);
    assert_eq!(message.data()[..8], idx.to_le_bytes());
    assert!(
        !is_block(message),
        "message {idx} arrived in the sender's block, not inline"
    );
}

#[tokio::test]
async fn a_short_message_in_a_block_travels_inline_and_its_block_comes_back_push() {
    let session = TestSession::new("inline-push");
    let transport = session.small_transport();
    let (mut pull, mut push) = support::pull_and_push(&transport, &session.address()).await;
    let first = short_message_in_a_block(&transport, u64::MAX).await;
    check(
        &support::one_message_through(&mut push, &mut pull, first).await,
        u64::MAX,
    );
    reclaim_released(&transport).await;
    let rings = live_blocks(&transport);
    let send = async {
        for idx in 0..N_MESSAGES {
            let message = short_message_in_a_block(&transport, idx).await;
            push.send(message)
                .await
                .map_err(|failed| failed.error)
                .unwrap();
        }
    };
    let receive = async {
        for idx in 0..N_MESSAGES {
            check(&pull.receive().await.unwrap(), idx);
        }
    };
    tokio::join!(send, receive);
    blocks_back_to(&transport, rings).await;
    push.close().await.unwrap();
    pull.close().await.unwrap();
}

#[tokio::test]
async fn a_short_message_in_a_block_travels_inline_and_its_block_comes_back_pub_sub() {
    let session = TestSession::new("inline-pub");
    let transport = session.small_transport();
    let address = session.address();
    let mut publisher = open(&transport, SocketType::Pub, Method::Bind, &address).await;
    let mut subscribers = Vec::new();
    for _ in 0..2 {
        let mut subscriber = open(&transport, SocketType::Sub, Method::Connect, &address).await;
        subscriber.subscribe("").await.unwrap();
        subscribers.push(subscriber);
    }
    // A publisher drops what it sends before a subscriber is connected: markers (numbered
    // u64::MAX) until both got one, then what follows them is drained.
    let mut connected = [false; 2];
    while connected != [true; 2] {
        let marker = short_message_in_a_block(&transport, u64::MAX).await;
        publisher
            .send(marker)
            .await
            .map_err(|failed| failed.error)
            .unwrap();
        for (subscriber, connected) in subscribers.iter_mut().zip(&mut connected) {
            if let Ok(got) =
                tokio::time::timeout(Duration::from_millis(10), subscriber.receive()).await
            {
                got.unwrap();
                *connected = true;
            }
        }
    }
    for subscriber in &mut subscribers {
        while let Ok(got) =
            tokio::time::timeout(Duration::from_millis(100), subscriber.receive()).await
        {
            got.unwrap();
        }
    }
    reclaim_released(&transport).await;
    let rings = live_blocks(&transport);
    for idx in 0..N_MESSAGES {
        let message = short_message_in_a_block(&transport, idx).await;
        publisher
            .send(message)
            .await
            .map_err(|failed| failed.error)
            .unwrap();
        for subscriber in &mut subscribers {
            check(&subscriber.receive().await.unwrap(), idx);
        }
    }
    blocks_back_to(&transport, rings).await;
    publisher.close().await.unwrap();
    for mut subscriber in subscribers {
        subscriber.close().await.unwrap();
    }
}
