//! Payloads that check themselves: message `idx` of `size` bytes carries `idx` in its first 8
//! bytes (as many as fit) and a pattern that depends on `idx` after them, so a receiver can tell
//! a lost, reordered, duplicated or corrupted message from the bytes alone.

use ferromq_core::{Message, Transport};

use crate::failure::{During, Failure};

fn pattern_byte(idx: u64, byte_idx: usize) -> u8 {
    (idx.wrapping_mul(31).wrapping_add(byte_idx as u64) % 251) as u8
}

/// Writes payload `idx` into `bytes`.
pub(crate) fn fill(idx: u64, bytes: &mut [u8]) {
    for (byte_idx, byte) in bytes.iter_mut().enumerate() {
        *byte = pattern_byte(idx, byte_idx);
    }
    let header = idx.to_le_bytes();
    let n_header = bytes.len().min(8);
    bytes[..n_header].copy_from_slice(&header[..n_header]);
}

/// Payload `idx` of `size` bytes in the transport's own memory (a shared-memory block for
/// shmem), as a sender makes it.
pub(crate) async fn message(
    transport: &dyn Transport,
    idx: u64,
    size: usize,
) -> Result<Message, Failure> {
    let mut message = transport
        .new_message(size)
        .await
        .during(&format!("allocating message {idx} of {size} bytes"))?;
    fill(idx, message.data_mut());
    Ok(message)
}

/// Checks that `bytes` is payload `idx` of `expected_size` bytes.
pub(crate) fn verify(idx: u64, expected_size: usize, bytes: &[u8]) -> Result<(), Failure> {
    if bytes.len() != expected_size {
        return Err(Failure::expectation(format!(
            "message {idx}: {} bytes arrived, {expected_size} were sent",
            bytes.len()
        )));
    }
    let header = idx.to_le_bytes();
    let n_header = bytes.len().min(8);
    if bytes[..n_header] != header[..n_header] {
        return Err(Failure::expectation(format!(
            "message {idx} expected, message {} arrived (lost, reordered or duplicated)",
            index_of(bytes)
        )));
    }
    if let Some(byte_idx) =
        (n_header..bytes.len()).find(|&byte_idx| bytes[byte_idx] != pattern_byte(idx, byte_idx))
    {
        return Err(Failure::expectation(format!(
            "message {idx} of {} bytes is corrupt at byte {byte_idx}",
            bytes.len()
        )));
    }
    Ok(())
}

/// The index in a payload's header (shorter payloads give what they have).
pub(crate) fn index_of(bytes: &[u8]) -> u64 {
    let mut header = [0u8; 8];
    let n_header = bytes.len().min(8);
    header[..n_header].copy_from_slice(&bytes[..n_header]);
    u64::from_le_bytes(header)
}
