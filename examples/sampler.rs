//! A sampler device: sends `--max-iterations` JSON events on channel `data`.
//!
//! ```sh
//! cargo run --example sampler -- --id sampler1 --control static --max-iterations 1000 \
//!     --channel-config name=data,type=push,method=bind,address=tcp://127.0.0.1:5555
//! ```

use ferromq::prelude::*;

#[derive(serde::Serialize)]
struct Event {
    id: u64,
    energy: f64,
}

struct Sampler;

#[ferromq::async_trait]
impl Device for Sampler {
    async fn run(&mut self, ctx: &mut DeviceContext) -> Result<(), BoxError> {
        while ctx.next_iteration() {
            let event = Event {
                id: ctx.iterations(),
                energy: 1.5 * ctx.iterations() as f64,
            };
            ctx.send_value("data", Json(event)).await?;
        }
        Ok(())
    }
}

// `pub` only so that tests/examples.rs can run this example's `main` in a child process.
pub fn main() -> std::process::ExitCode {
    ferromq::run_device_main(|_options| Sampler)
}
