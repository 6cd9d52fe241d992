//! Latency percentiles and how the benches print durations and rates.

use std::time::Duration;

#[derive(Debug, Default, Clone, Copy)]
pub struct Latencies {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl From<Vec<u32>> for Latencies {
    fn from(mut v: Vec<u32>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_unstable();
        // Nearest-rank percentiles.
        let rank = |p: f64| {
            let idx = ((p / 100.0) * v.len() as f64).ceil() as usize;
            f64::from(v[idx.clamp(1, v.len()) - 1])
        };
        Self {
            mean: v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64,
            p50: rank(50.0),
            p99: rank(99.0),
            max: f64::from(v[v.len() - 1]),
        }
    }
}

pub fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

pub fn rate(ops: u64, elapsed: Duration) -> f64 {
    if elapsed.is_zero() { 0.0 } else { ops as f64 / elapsed.as_secs_f64() }
}

pub fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 100_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{:.0} ms", us / 1000.0)
    }
}
