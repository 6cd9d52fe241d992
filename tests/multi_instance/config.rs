//! The configuration file every instance shares: prices (so every paid answer has a ledger
//! entry to count) and one outbox sink that never accepts, so every event the instances
//! write stays listed and can be counted per extraction at the end.

use std::path::{Path, PathBuf};

pub const SINK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const SINK_SECRET_ENV: &str = "MULTI_SINK_SECRET";
/// The providers' lease: a paused driver loses its term this long after its last renewal.
pub const DRIVER_LEASE: &str = "3s";
/// What the simulator answers as `model` (the server's default model).
const OPENAI_MODEL: &str = "gpt-4o-mini";
/// The model the external workers report; it names no provider, so it is `external`.
pub const WORKER_MODEL: &str = "multi-worker-model";

/// Writes the file into `dir`; `sink_url` refuses every delivery.
pub fn write(dir: &Path, sink_url: &str) -> PathBuf {
    let text = format!(
        r#"[store]
driver_lease = "{DRIVER_LEASE}"

[[prices]]
provider = "openai"
model = "{OPENAI_MODEL}"
input_per_mtok = 0.15
output_per_mtok = 0.60

[[prices]]
provider = "external"
model = "{WORKER_MODEL}"
input_per_mtok = 0.5
output_per_mtok = 1.5

# Nothing is delivered (the sink refuses), and nothing may go dead during the run.
[[outbox.sinks]]
name = "downstream"
url = "{sink_url}"
secret_env = "{SINK_SECRET_ENV}"
max_attempts = 1000
timeout = "2s"
"#
    );
    let path = dir.join("multi-instance.toml");
    std::fs::write(&path, text).expect("write the config file");
    path
}
