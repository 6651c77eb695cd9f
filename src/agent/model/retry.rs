//! How failed model requests are retried.

use std::time::Duration;

use rand::Rng;

/// How failed model requests are retried: exponential backoff from `base_delay`, capped at
/// `max_delay`, each delay scaled by a random factor in [0.5, 1.0]; a `Retry-After` (or
/// `retry-after-ms`) header from the server is honoured up to `max_retry_after`.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// The delay before the first retry (before jitter).
    pub base_delay: Duration,
    /// The longest computed backoff delay.
    pub max_delay: Duration,
    /// The longest delay taken from a `Retry-After` header.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `retry` (1 for the first retry).
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_retry_after);
        }
        let factor = 2u32.saturating_pow(retry.saturating_sub(1).min(20));
        let backoff = self.base_delay.saturating_mul(factor).min(self.max_delay);
        backoff.mul_f64(rand::rng().random_range(0.5..=1.0))
    }
}
