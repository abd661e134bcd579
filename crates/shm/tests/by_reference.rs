//! A block sent by reference without waiting (`Channel::try_send_parts`, what a device's send
//! tries first) belongs to its receiver from then on: the sender's handle, marked in place as
//! handed on, must release nothing when it is dropped (the receiver's message would then point
//! into a block the allocator hands out again), and the receiver's drop must release it once
//! (the segment would otherwise fill).

use ferromq_core::{Message, Parts, Transport};
use ferromq_shm::ShmTransport;

mod support;
use support::{TestSession, blocks_back_to, is_block, live_blocks, reclaim_released};

/// 64 KiB blocks through a 4 MiB segment: each round's blocks are held by the receiver while
/// the next ones are allocated, and 50 rounds go through the segment 25 times.
const BLOCK: usize = 64 << 10;
const PER_ROUND: u64 = 32;
const N_ROUNDS: u64 = 50;

/// A whole 64 KiB block with `idx` in its first and last 8 bytes.
async fn numbered_block(transport: &ShmTransport, idx: u64) -> Message {
    let mut message = transport.new_message(BLOCK).await.unwrap();
    let bytes = message.data_mut();
    bytes[..8].copy_from_slice(&idx.to_le_bytes());
    bytes[BLOCK - 8..].copy_from_slice(&idx.to_le_bytes());
    assert!(is_block(&message), "a 64 KiB message is a block");
    message
}

#[tokio::test]
async fn a_block_sent_without_waiting_is_the_receivers_until_it_drops_it() {
    let session = TestSession::new("by-reference");
    let transport = session.small_transport();
    let (mut pull, mut push) = support::pull_and_push(&transport, &session.address()).await;
    let first = numbered_block(&transport, u64::MAX).await;
    drop(support::one_message_through(&mut push, &mut pull, first).await);
    reclaim_released(&transport).await;
    let rings = live_blocks(&transport);

    let mut n_without_waiting = 0;
    for round in 0..N_ROUNDS {
        let first = round * PER_ROUND;
        for idx in first..first + PER_ROUND {
            let parts = Parts::from(numbered_block(&transport, idx).await);
            match push.try_send_parts(parts) {
                Ok(()) => n_without_waiting += 1,
                Err(parts) => push
                    .send_parts(parts)
                    .await
                    .map_err(|failed| failed.error)
                    .unwrap(),
            }
        }
        let mut held = Vec::new();
        for _ in 0..PER_ROUND {
            held.push(pull.receive().await.unwrap());
        }
        // Allocations made while the receiver holds them must not have reused their blocks.
        for (message, idx) in held.iter().zip(first..) {
            let bytes = message.data();
            assert_eq!(bytes.len(), BLOCK);
            assert_eq!(
                bytes[..8],
                idx.to_le_bytes(),
                "message {idx}'s block was reused"
            );
            assert_eq!(
                bytes[BLOCK - 8..],
                idx.to_le_bytes(),
                "message {idx}'s block was reused"
            );
        }
        // (Live: referenced, or released and not reclaimed yet.)
        assert!(
            live_blocks(&transport) >= PER_ROUND,
            "the {PER_ROUND} blocks the receiver holds are live: {:?}",
            transport.memory_figures().unwrap()
        );
        drop(held);
    }
    assert!(
        n_without_waiting > 0,
        "no message took the path without waiting"
    );
    // Each block released once: all of them come back (and none was released twice, which
    // would have freed a block another message held, caught above).
    blocks_back_to(&transport, rings).await;
    push.close().await.unwrap();
    pull.close().await.unwrap();
}
