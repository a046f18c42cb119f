//! Percentiles of timed runs, as every benchmark prints them.

#![allow(dead_code)] // Each benchmark uses its share.

use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted`, sorted ascending: the nearest rank at or below.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// The p50 and p99 of `times` (sorted here), in microseconds.
pub fn p50_p99(times: &mut [Duration]) -> (f64, f64) {
    times.sort_unstable();
    let us = |p| percentile(times, p).as_secs_f64() * 1e6;
    (us(0.50), us(0.99))
}
