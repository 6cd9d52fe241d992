//! The run's parameters and where it is: the seed and the round are printed with every
//! failure (by a panic hook, so a panic on any thread or task carries them), which is all
//! it takes to replay the same schedule of kills, faults and requests.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};

pub const SEED_VAR: &str = "COMMITPOINT_TORTURE_SEED";
pub const ROUNDS_VAR: &str = "COMMITPOINT_TORTURE_ROUNDS";
/// Set to 1 to go on after a failed `verify` between rounds, and fail at the end with all
/// of them (a long run then still exercises everything else).
pub const KEEP_GOING_VAR: &str = "COMMITPOINT_TORTURE_KEEP_GOING";
const DEFAULT_ROUNDS: u32 = 20;

/// -1 before the first round; `rounds` during the final drain and the checks.
static ROUND: AtomicI64 = AtomicI64::new(-1);
static RUN: OnceLock<(u64, u32)> = OnceLock::new();

#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub seed: u64,
    pub rounds: u32,
    pub keep_going: bool,
}

impl Params {
    /// Reads the environment; an unparsable value is a test failure, not a silent default.
    pub fn from_env() -> Params {
        let seed = match std::env::var(SEED_VAR) {
            Ok(text) => text.trim().parse().unwrap_or_else(|e| panic!("{SEED_VAR}={text:?} is not a u64: {e}")),
            Err(_) => rand::random(),
        };
        let rounds = match std::env::var(ROUNDS_VAR) {
            Ok(text) => text.trim().parse().unwrap_or_else(|e| panic!("{ROUNDS_VAR}={text:?} is not a u32: {e}")),
            Err(_) => DEFAULT_ROUNDS,
        };
        let keep_going = std::env::var(KEEP_GOING_VAR).is_ok_and(|v| v == "1");
        Params { seed, rounds, keep_going }
    }

    pub fn reproduce(&self) -> String {
        format!(
            "{SEED_VAR}={} {ROUNDS_VAR}={} cargo test --release --test torture -- --nocapture",
            self.seed, self.rounds
        )
    }
}

/// Installs the hook that names seed and round on every panic, then the default report.
pub fn install(params: Params) {
    let _ = RUN.set((params.seed, params.rounds));
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let (seed, rounds) = RUN.get().copied().unwrap_or_default();
        let round = ROUND.load(Ordering::SeqCst);
        let at = if round < 0 {
            "before round 0".to_string()
        } else if round >= i64::from(rounds) {
            "in the final drain/check".to_string()
        } else {
            format!("in round {round}")
        };
        say(&format!(
            "torture FAILED {at}, seed {seed}; reproduce with {SEED_VAR}={seed} {ROUNDS_VAR}={rounds} \
             cargo test --release --test torture -- --nocapture"
        ));
        default(info);
    }));
}

pub fn set_round(round: u32) {
    ROUND.store(i64::from(round), Ordering::SeqCst);
}

pub fn round() -> i64 {
    ROUND.load(Ordering::SeqCst)
}

/// Straight to the process's stderr, past libtest's capture: the seed must be visible
/// even for a run that passes or hangs.
pub fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}
