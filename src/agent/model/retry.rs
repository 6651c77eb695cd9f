//! How failed model requests are retried: the delays of a [`RetryPolicy`], for `backon`.

use std::time::Duration;

use backon::{Backoff, BackoffBuilder, ExponentialBuilder};
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
    /// The delays before at most `max_retries` retries, the first one first.
    pub(crate) fn backoff(&self, max_retries: u32) -> impl Backoff + use<> {
        ExponentialBuilder::new()
            .with_factor(2.0)
            .with_min_delay(self.base_delay.min(self.max_delay))
            .with_max_delay(self.max_delay)
            .with_max_times(max_retries as usize)
            .build()
            .map(|delay| delay.mul_f64(rand::rng().random_range(0.5..=1.0)))
    }

    /// The delay before a retry: the wait the server asked for (at most `max_retry_after`), else
    /// the `backoff` delay.
    pub(crate) fn wait(&self, retry_after: Option<Duration>, backoff: Duration) -> Duration {
        retry_after.map_or(backoff, |wait| wait.min(self.max_retry_after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_and_stop_after_max_retries() {
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(350),
            max_retry_after: Duration::from_secs(1),
        };
        let delays: Vec<Duration> = policy.backoff(4).collect();
        let ceilings = [100, 200, 350, 350].map(Duration::from_millis);
        assert_eq!(delays.len(), ceilings.len());
        for (delay, ceiling) in delays.iter().zip(ceilings) {
            assert!(
                *delay >= ceiling / 2 && *delay <= ceiling,
                "{delay:?} not in [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        assert_eq!(policy.backoff(0).count(), 0);
        assert_eq!(
            policy.wait(Some(Duration::from_secs(5)), Duration::ZERO),
            Duration::from_secs(1)
        );
        assert_eq!(
            policy.wait(None, Duration::from_millis(7)),
            Duration::from_millis(7)
        );
    }
}
