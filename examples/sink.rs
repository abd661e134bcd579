//! A sink device: receives the sampler's JSON events on channel `data` and sums their energy.
//!
//! ```sh
//! cargo run --example sink -- --id sink1 --control static --max-iterations 1000 \
//!     --channel-config name=data,type=pull,method=connect,address=tcp://127.0.0.1:5555
//! ```

use ferromq::prelude::*;

#[derive(serde::Deserialize)]
struct Event {
    energy: f64,
}

#[derive(Default)]
struct Sink(u64, f64);

#[ferromq::async_trait]
impl Device for Sink {
    async fn on_data(
        &mut self,
        _channel: &str,
        parts: Parts,
        _ctx: &mut DeviceContext,
    ) -> Result<Flow, BoxError> {
        for part in parts {
            let Json(event): Json<Event> = Decode::decode(part)?;
            (self.0, self.1) = (self.0 + 1, self.1 + event.energy);
        }
        Ok(Flow::Continue)
    }

    async fn reset_task(&mut self, _ctx: &mut DeviceContext) -> Result<(), BoxError> {
        println!("sink: {} events, total energy {}", self.0, self.1);
        Ok(())
    }
}

// `pub` only so that tests/examples.rs can run this example's `main` in a child process.
pub fn main() -> std::process::ExitCode {
    ferromq::run_device_main(|_options| Sink::default())
}
