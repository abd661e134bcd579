//! STOP as a device's channel operations see it.
//!
//! A `CancellationToken` answers `is_cancelled` under a mutex and registers a waiter (another
//! lock, and one more to unregister) each time its `cancelled()` future is polled and dropped.
//! Done around every send and receive that cost about a sixth of a device pair's CPU at 64 B
//! (perf, 2026-11-25). [`StopSignal`] keeps the token for waiting and adds a flag read with one
//! atomic load; [`StopSignal::interrupt`] polls the operation first and registers for STOP only
//! when the operation has to wait, so a channel with room or a queued message costs no lock.
//!
//! Ordering: `request` sets the flag before it cancels the token, so whoever the cancellation
//! wakes sees the flag; a reader that saw the flag clear and then waits on the token is woken
//! by the cancellation that follows. Cancelling `interrupt`'s future drops the operation
//! (channel operations are cancel-safe) and unregisters from the token.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// One STOP request shared by the runner (which requests) and the device's context (which
/// checks). A new one is made for every RUNNING state.
#[derive(Clone, Debug, Default)]
pub(crate) struct StopSignal {
    requested: Arc<AtomicBool>,
    token: CancellationToken,
}

impl StopSignal {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Requests STOP: every current and later check sees it.
    pub(crate) fn request(&self) {
        self.requested.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// True once STOP was requested (one atomic load).
    pub(crate) fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Completes when STOP is requested; borrows nothing.
    pub(crate) fn requested_owned(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// Runs `operation` unless STOP comes first (`None` then). STOP requested before the call
    /// wins; otherwise an operation that completes at its first poll returns without touching
    /// the token.
    pub(crate) async fn interrupt<T>(&self, operation: impl Future<Output = T>) -> Option<T> {
        if self.is_requested() {
            return None;
        }
        let mut operation = pin!(operation);
        let first = std::future::poll_fn(|cx| Poll::Ready(operation.as_mut().poll(cx))).await;
        if let Poll::Ready(outcome) = first {
            return Some(outcome);
        }
        tokio::select! {
            biased;
            () = self.token.cancelled() => None,
            outcome = operation => Some(outcome),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ready_operation_completes_and_a_requested_stop_wins() {
        let stop = StopSignal::new();
        assert_eq!(stop.interrupt(async { 7 }).await, Some(7));
        stop.request();
        assert!(stop.is_requested());
        assert_eq!(stop.interrupt(async { 7 }).await, None);
    }

    #[tokio::test]
    async fn a_waiting_operation_is_interrupted_by_a_later_request() {
        let stop = StopSignal::new();
        let requester = stop.clone();
        let waiting =
            tokio::spawn(async move { stop.interrupt(std::future::pending::<u8>()).await });
        tokio::task::yield_now().await;
        requester.request();
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_owned_future_completes_on_request() {
        let stop = StopSignal::new();
        let waiter = stop.requested_owned();
        stop.request();
        waiter.await;
    }
}
