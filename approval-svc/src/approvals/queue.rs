//! A group commit for callers of the façade: what is queued while a batch is written goes in
//! the next one.

use std::{
    panic::AssertUnwindSafe,
    sync::{Arc, PoisonError},
};

use futures_util::FutureExt;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// Work that callers wait on and that one task writes, batch after batch: what is queued while
/// a batch is being written goes in the next one (a group commit), each item answered alone.
pub(super) struct Queue<I, O> {
    waiting: std::sync::Mutex<Waiting<I, O>>,
}

type Answer<O> = oneshot::Sender<Result<O>>;

struct Waiting<I, O> {
    items: Vec<(I, Answer<O>)>,
    /// A task is writing: it takes whatever is queued before it stops.
    writing: bool,
}

impl<I, O> Default for Queue<I, O> {
    fn default() -> Self {
        Self {
            waiting: std::sync::Mutex::new(Waiting {
                items: Vec::new(),
                writing: false,
            }),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Queue<I, O> {
    /// Queues `item` and waits for its outcome. When no task is writing, one is started that
    /// hands batch after batch to `write`, which answers each item's outcome in order; it runs
    /// on its own (in no caller's span: it writes for them all), so an item is written even
    /// when its caller goes away. Should `write` panic, its batch is answered with an error
    /// and the task goes on; only a runtime shutting down ends it before it answers.
    pub(super) async fn push<W, F>(self: &Arc<Self>, item: I, write: W) -> Result<O>
    where
        W: Fn(Vec<I>) -> F + Send + 'static,
        F: std::future::Future<Output = Vec<Result<O>>> + Send + 'static,
    {
        let (done, answer) = oneshot::channel();
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.items.push((item, done));
            !std::mem::replace(&mut waiting.writing, true)
        };
        if first {
            let queue = self.clone();
            tokio::spawn(async move { queue.write_all(write).await });
        }
        answer.await.map_err(|_| Error::ShuttingDown)?
    }

    async fn write_all<W, F>(&self, write: W)
    where
        W: Fn(Vec<I>) -> F,
        F: std::future::Future<Output = Vec<Result<O>>>,
    {
        loop {
            let batch = {
                let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                if waiting.items.is_empty() {
                    waiting.writing = false;
                    return;
                }
                std::mem::take(&mut waiting.items)
            };
            let (items, answers): (Vec<I>, Vec<Answer<O>>) = batch.into_iter().unzip();
            let written = AssertUnwindSafe(write(items)).catch_unwind().await;
            match written {
                Ok(outcomes) => {
                    for (answer, outcome) in answers.into_iter().zip(outcomes) {
                        let _ = answer.send(outcome);
                    }
                }
                Err(_) => {
                    for answer in answers {
                        let _ = answer.send(Err(Error::Storage("the write panicked".into())));
                    }
                }
            }
        }
    }
}
