//! What the tests of every crate share: waiting for a condition with a deadline, so no test
//! sleeps a fixed time and hopes.

use std::{future::Future, time::Duration};

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`. The pause between
/// polls starts at 5 ms and doubles up to 100 ms.
#[allow(clippy::panic)]
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}
