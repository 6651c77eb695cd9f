//! Waiting, bounded in time, for something to happen.

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

use tokio::time::Instant;

/// Calls `check` every `interval` until it breaks with a value, which is returned, or until
/// `timeout` has passed, when the progress it last reported is returned as the error.
pub async fn poll_until<T, P, F, Fut>(
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> Result<T, P>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ControlFlow<T, P>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            ControlFlow::Break(value) => return Ok(value),
            ControlFlow::Continue(progress) if Instant::now() >= deadline => return Err(progress),
            ControlFlow::Continue(_) => tokio::time::sleep(interval).await,
        }
    }
}

/// Waits up to `timeout` for `check` to return `Some`, trying every 200 ms; panics naming `what`
/// when it does not.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until(timeout, Duration::from_millis(200), || {
        let next = check();
        async move {
            match next.await {
                Some(value) => ControlFlow::Break(value),
                None => ControlFlow::Continue(()),
            }
        }
    })
    .await
    .unwrap_or_else(|()| panic!("timed out waiting for {what}"))
}

/// A free TCP port on 127.0.0.1 (free when asked: bind it soon).
pub fn free_port() -> std::io::Result<std::net::SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn poll_until_returns_the_value_or_the_last_progress() {
        let mut calls = 0;
        let done = poll_until(Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            let n = calls;
            async move {
                if n == 3 {
                    ControlFlow::Break(n)
                } else {
                    ControlFlow::Continue(n)
                }
            }
        })
        .await;
        assert_eq!(done, Ok(3));
        let timed_out: Result<(), u32> = poll_until(
            Duration::from_millis(20),
            Duration::from_millis(1),
            || async { ControlFlow::Continue(7) },
        )
        .await;
        assert_eq!(timed_out, Err(7));
    }
}
