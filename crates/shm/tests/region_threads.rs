//! Region buffers released from many threads of one process at once: each release reaches the
//! creator's callback exactly once (the per-process acknowledgement ring has one writer at a
//! time; without that, two releases at once wrote one slot and one was lost).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferromq_shm::{RegionBlock, RegionCallback, ShmOptions, ShmTransport};

/// Removes the session's shared memory when the test ends, passed or failed.
struct SessionCleanup(String);

impl Drop for SessionCleanup {
    fn drop(&mut self) {
        let uid = ferromq_shm::names::current_uid();
        let _ = ferromq_shm::cleanup::clean_session(uid, &self.0, true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_from_many_threads_are_each_acknowledged_once() {
    let session = format!("region-threads-{}", std::process::id());
    let _cleanup = SessionCleanup(session.clone());
    let transport = ShmTransport::new(ShmOptions {
        session: session.clone(),
        segment_size: 16 << 20,
        ..ShmOptions::default()
    });
    let n_buffers = 4000usize;
    let seen = Arc::new(
        (0..n_buffers)
            .map(|_| AtomicUsize::new(0))
            .collect::<Vec<_>>(),
    );
    let record = Arc::clone(&seen);
    let region = transport
        .create_region(
            n_buffers * 64,
            RegionCallback::Single(Box::new(move |block: RegionBlock| {
                record[block.hint as usize].fetch_add(1, Ordering::Relaxed);
            })),
        )
        .await
        .unwrap();
    let messages: Vec<_> = (0..n_buffers)
        .map(|index| region.message(index * 64, 64, index as u64).unwrap())
        .collect();
    // Four threads drop their quarter at the same time.
    let mut quarters: Vec<Vec<_>> = (0..4).map(|_| Vec::new()).collect();
    for (index, message) in messages.into_iter().enumerate() {
        quarters[index % 4].push(message);
    }
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = quarters
        .into_iter()
        .map(|quarter| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                drop(quarter);
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .sum::<usize>()
        < n_buffers
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "releases lost: {} of {n_buffers} acknowledged",
            seen.iter()
                .map(|count| count.load(Ordering::Relaxed))
                .sum::<usize>()
        );
        tokio::task::yield_now().await;
    }
    assert!(
        seen.iter().all(|count| count.load(Ordering::Relaxed) == 1),
        "a buffer was acknowledged twice"
    );
    assert_eq!(region.n_lent(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transports_figures_count_region_buffers_lent_until_released() {
    use ferromq_core::Transport;
    let session = format!("region-figures-{}", std::process::id());
    let _cleanup = SessionCleanup(session.clone());
    let transport = ShmTransport::new(ShmOptions {
        session: session.clone(),
        segment_size: 16 << 20,
        ..ShmOptions::default()
    });
    assert_eq!(transport.memory_figures(), None, "nothing made yet");
    let region = transport
        .create_region(64 * 10, RegionCallback::Single(Box::new(|_| {})))
        .await
        .unwrap();
    let messages: Vec<_> = (0..10)
        .map(|index| region.message(index * 64, 64, index as u64).unwrap())
        .collect();
    let figures = transport.memory_figures().expect("a region");
    assert_eq!((figures.regions, figures.region_buffers_lent), (1, 10));
    drop(messages);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut look = tokio::time::interval(Duration::from_millis(10));
    while transport
        .memory_figures()
        .expect("a region")
        .region_buffers_lent
        > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "released buffers still counted as lent"
        );
        look.tick().await;
    }
    drop(region);
    assert_eq!(transport.memory_figures(), None, "the region is gone");
}
