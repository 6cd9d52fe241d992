//! The simulator's fault knobs for one round, drawn from the seeded RNG. Request-level
//! counters are consumed by the next requests; line- and batch-level knobs apply to the
//! batches created while they are set. Knobs that would stall the run for minutes
//! (insufficient quota: a 15-minute pause; 401: a 5-minute pause) are left out.

use commitpoint::simulator::Faults;
use rand::Rng;
use rand::rngs::StdRng;

pub fn for_round(rng: &mut StdRng) -> Faults {
    let mut faults = Faults { retry_after_secs: 1, ..Faults::default() };
    if rng.random_bool(0.3) {
        faults.rate_limit_next = rng.random_range(1..=2);
    }
    if rng.random_bool(0.3) {
        faults.server_error_next = rng.random_range(1..=3);
    }
    if rng.random_bool(0.2) {
        faults.drop_after_create_next = 1;
    }
    if rng.random_bool(0.35) {
        faults.duplicate_line_every = rng.random_range(1..=3);
    }
    if rng.random_bool(0.15) {
        faults.malformed_line_every = rng.random_range(2..=5);
    }
    if rng.random_bool(0.15) {
        faults.expire_batches = true;
    }
    if rng.random_bool(0.15) {
        faults.failed_line_every = rng.random_range(2..=6);
    }
    if rng.random_bool(0.1) {
        faults.invalid_output_every = rng.random_range(3..=6);
    }
    if rng.random_bool(0.05) {
        faults.fail_batch_validation = true;
    }
    if rng.random_bool(0.2) {
        faults.slow_ms = rng.random_range(10..=80);
    }
    faults
}

/// The knobs that are on, for the round log.
pub fn describe(f: &Faults) -> String {
    let mut on = Vec::new();
    let counters = [
        ("429x", f.rate_limit_next),
        ("5xx x", f.server_error_next),
        ("drop-after-create x", f.drop_after_create_next),
        ("dup-line/", f.duplicate_line_every),
        ("torn-line/", f.malformed_line_every),
        ("failed-line/", f.failed_line_every),
        ("invalid-output/", f.invalid_output_every),
    ];
    for (name, n) in counters {
        if n > 0 {
            on.push(format!("{name}{n}"));
        }
    }
    if f.expire_batches {
        on.push("expire".into());
    }
    if f.fail_batch_validation {
        on.push("batch-validation-fails".into());
    }
    if f.slow_ms > 0 {
        on.push(format!("slow{}ms", f.slow_ms));
    }
    if on.is_empty() { "none".into() } else { on.join(" ") }
}
