//! The server's configuration file for the run: prices (so every ledger entry costs
//! something), one outbox sink pointing at the receiver in this process, and one signed
//! webhook endpoint. The expected costs are computed here from the same figures, by the
//! documented rule, not by the server's code.

use std::path::{Path, PathBuf};

/// Signs outgoing outbox events and incoming webhooks alike (one secret, two uses).
pub const SINK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const SINK_SECRET_ENV: &str = "SINK_SECRET";
pub const SINK: &str = "downstream";
pub const WEBHOOK: &str = "std";
/// Every webhook intake lands in this tenant (the endpoint's fixed tenant).
pub const WEBHOOK_TENANT: &str = "hooks";
/// What the simulator answers as `model` (the server's default model).
pub const OPENAI_MODEL: &str = "gpt-4o-mini";
/// The model the external worker reports; it names no provider, so it is `external`.
pub const WORKER_MODEL: &str = "torture-model";
pub const WORKER_PROVIDER: &str = "external";

/// Micro-dollars per million tokens, and the percent charged through a batch API.
#[derive(Debug, Clone, Copy)]
pub struct Price {
    pub input: u64,
    pub output: u64,
    pub batch_percent: u64,
}

/// $0.15 / $0.60 per million tokens, half price through the batch API (the default discount).
pub const OPENAI_PRICE: Price = Price { input: 150_000, output: 600_000, batch_percent: 50 };
/// $0.50 / $1.50: odd enough that rounding to whole micro-dollars matters.
pub const WORKER_PRICE: Price = Price { input: 500_000, output: 1_500_000, batch_percent: 50 };

impl Price {
    /// tokens × price / 1e6, the batch discount applied, rounded half up once per call.
    pub fn cost(self, input_tokens: u64, output_tokens: u64, batch: bool) -> u64 {
        let list =
            u128::from(input_tokens) * u128::from(self.input) + u128::from(output_tokens) * u128::from(self.output);
        let percent = if batch { u128::from(self.batch_percent) } else { 100 };
        let denominator = 100 * 1_000_000u128;
        u64::try_from((list * percent + denominator / 2) / denominator).expect("a small cost")
    }
}

/// Writes the file next to the data directory; returns its path.
pub fn write(dir: &Path, sink_url: &str) -> PathBuf {
    let text = format!(
        r#"# The audit reads every output file the provider served: keep them there.
[scheduler]
delete_provider_files = false

[[prices]]
provider = "openai"
model = "{OPENAI_MODEL}"
input_per_mtok = 0.15
output_per_mtok = 0.60

[[prices]]
provider = "{WORKER_PROVIDER}"
model = "{WORKER_MODEL}"
input_per_mtok = 0.5
output_per_mtok = 1.5

# Attempts are not the limit here: the receiver fails often, and nothing may go dead.
[[outbox.sinks]]
name = "{SINK}"
url = "{sink_url}"
secret_env = "{SINK_SECRET_ENV}"
max_attempts = 1000
timeout = "5s"

[[webhooks]]
name = "{WEBHOOK}"
scheme = "standard"
secret_env = "{SINK_SECRET_ENV}"
tenant = "{WEBHOOK_TENANT}"
source_id_pointer = "/id"
content_pointer = "/text"
schema = "{schema}"
"#,
        schema = crate::workload::SCHEMA,
    );
    let path = dir.join("torture-config.toml");
    std::fs::write(&path, text).expect("write the config file");
    path
}
