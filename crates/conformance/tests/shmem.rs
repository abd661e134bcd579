//! The conformance suite over the shmem transport (descriptors over ipc), each trial in a
//! session of its own whose shared memory is removed when the trial ends.

use std::sync::Arc;

use ferromq_conformance::{AddressScheme, Suite};
use ferromq_shm::{ShmOptions, ShmTransport};

fn main() {
    ferromq_shm::run_watchdog_if_requested();
    Suite::new("shmem", AddressScheme::Ipc, |trial| {
        Arc::new(ShmTransport::new(ShmOptions {
            session: trial.session().to_owned(),
            // Room for the 64 MiB message and a queue of 1 MiB ones; pages are used only
            // when touched.
            segment_size: 512 << 20,
            ..ShmOptions::default()
        }))
    })
    .cleanup(|trial| {
        let uid = ferromq_shm::names::current_uid();
        let _ = ferromq_shm::cleanup::clean_session(uid, trial.session(), true);
    })
    .run()
}
