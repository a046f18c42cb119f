//! Bounds on a call's requests: how many at once, how big, how slow, how often.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The limits on one tool's requests (`[net]`, and `[net.tool.NAME]` for one tool).
#[derive(Debug, Clone, PartialEq)]
pub struct NetLimits {
    /// Requests one call may have in flight at once (`max_concurrent_requests`).
    pub max_concurrent_requests: u32,
    /// The largest request body sent (`max_request_body_kib`).
    pub max_request_body_bytes: u64,
    /// The largest response body the guest may read (`max_response_body_kib`).
    pub max_response_body_bytes: u64,
    /// Until the connection is up, TLS included (`connect_timeout_secs`).
    pub connect_timeout: Duration,
    /// From the request sent to the response's headers (`first_byte_timeout_secs`).
    pub first_byte_timeout: Duration,
    /// From the request made to the last byte of its response (`request_timeout_secs`).
    pub request_timeout: Duration,
    /// Requests one process may make with this tool per minute (`requests_per_minute`).
    pub requests_per_minute: u32,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            max_concurrent_requests: 4,
            max_request_body_bytes: 1 << 20,
            max_response_body_bytes: 4 << 20,
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            requests_per_minute: 60,
        }
    }
}

/// `[net]`: the limits of every tool, and those set for some tools.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetSettings {
    /// Every tool's limits unless it has its own.
    pub limits: NetLimits,
    /// `[net.tool.NAME]`: limits of one tool (the keys it does not set come from
    /// `limits`).
    pub per_tool: BTreeMap<String, NetLimits>,
}

impl NetSettings {
    /// The limits of `tool`.
    pub fn for_tool(&self, tool: &str) -> &NetLimits {
        self.per_tool.get(tool).unwrap_or(&self.limits)
    }

    /// Where `key` of `tool`'s limits is set in the config, for messages.
    pub fn key_of(&self, tool: &str, key: &str) -> String {
        if self.per_tool.contains_key(tool) {
            format!("[net.tool.{tool}] {key}")
        } else {
            format!("[net] {key}")
        }
    }
}

/// A token bucket per (process, tool): `requests_per_minute` tokens, refilled evenly.
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<(String, String), Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The most buckets kept: past it, full ones are dropped, then the least recently used.
const MAX_BUCKETS: usize = 4096;

impl RateLimiter {
    /// Takes one request for `process` calling `tool` at `per_minute`; `Err` holds how
    /// long until one is free.
    pub fn take(&self, process: &str, tool: &str, per_minute: u32) -> Result<(), Duration> {
        let capacity = f64::from(per_minute.max(1));
        let rate = capacity / 60.0;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let key = (process.to_owned(), tool.to_owned());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&key) {
            // A full bucket is the same as none; past that, the least recently used goes
            // (it gets a fresh minute if it comes back).
            buckets
                .retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < capacity);
            let oldest = buckets
                .iter()
                .min_by_key(|(_, b)| b.at)
                .map(|(k, _)| k.clone());
            if buckets.len() >= MAX_BUCKETS
                && let Some(oldest) = oldest
            {
                buckets.remove(&oldest);
            }
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_minute_then_refuses_per_process_and_tool() {
        let limiter = RateLimiter::default();
        for _ in 0..3 {
            limiter.take("worker:1", "http_request", 3).unwrap();
        }
        let wait = limiter.take("worker:1", "http_request", 3).unwrap_err();
        assert!(
            wait > Duration::from_secs(10) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        limiter.take("worker:2", "http_request", 3).unwrap();
        limiter.take("worker:1", "web_fetch", 3).unwrap();
    }
}

#[cfg(test)]
mod bounded {
    use super::*;

    /// Past MAX_BUCKETS, `take` only drops *full* buckets; a bucket that has been used once
    /// in the last minute is never full, so the map keeps growing (and every `take` then
    /// scans the whole map under the lock).
    #[test]
    fn the_bucket_map_stays_bounded() {
        let limiter = RateLimiter::default();
        for i in 0..(MAX_BUCKETS * 3) {
            limiter
                .take(&format!("worker:{i}"), "http_request", 1)
                .unwrap();
        }
        let len = limiter.buckets.lock().unwrap().len();
        assert!(len <= MAX_BUCKETS, "{len} buckets held, over {MAX_BUCKETS}");
    }
}
