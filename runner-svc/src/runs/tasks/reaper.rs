//! The reaper of expired task leases: a task whose worker stopped heartbeating goes back to the
//! queue (attempt + 1), or fails its node when no attempt is left.

use std::sync::{Arc, atomic::Ordering};

use arbor_shared::domain::TaskFailure;

use super::{attempt_failed, cancelled_event};
use crate::{
    error::RunnerError,
    events,
    runs::Runner,
    store::{T, tables},
    tasks::{TaskEvent, TaskState, tx as ttx},
};

impl Runner {
    /// Returns tasks whose lease ran out to the queue (attempt + 1), or fails their node when
    /// no attempt is left; a task whose cancellation was requested is cancelled.
    pub async fn reap_tasks(&self) -> Result<usize, RunnerError> {
        let now = self.now_ms();
        let mut expired = Vec::new();
        for key in self.store.tree(T::TaskLeases).iter().keys() {
            let key = key?;
            let Some((until, id)) = tables::tasks::parse_lease_key(&key) else {
                continue;
            };
            if until > now {
                break;
            }
            expired.push((until, id.to_string()));
            if expired.len() >= 256 {
                break;
            }
        }
        if expired.is_empty() {
            return Ok(0);
        }
        let order = self.store.next_id()?;
        let default_max = self.mailbox.config().default_max_attempts;
        let ids: Vec<String> = expired.iter().map(|(_, id)| id.clone()).collect();
        let reaped = self
            .commit(move |tx| {
                let mut reaped = 0;
                let mut appended = Vec::new();
                for (until, id) in &expired {
                    let task = ttx::get(tx, id)?;
                    let current = task.as_ref().is_some_and(|t| {
                        t.state == TaskState::Leased && t.lease_until_ms == *until
                    });
                    if !current {
                        // A heartbeat moved the lease meanwhile, or the entry outlived its
                        // task: either way this key is not a lease any more.
                        if task.as_ref().is_none_or(|t| {
                            t.lease_until_ms != *until || t.state != TaskState::Leased
                        }) {
                            tx.tree(T::TaskLeases)
                                .remove(tables::tasks::lease_key(*until, id))?;
                            tx.wake(crate::store::Wake::Tasks);
                        }
                        continue;
                    }
                    let Some(mut task) = task else { continue };
                    if task.lease_until_ms > now {
                        continue;
                    }
                    reaped += 1;
                    // The lease ended without its worker: its token is void, so a late call
                    // with it is ABORTED, not answered as a repeat of a call that ended it.
                    task.lease_token.clear();
                    if task.cancel_requested {
                        let task = ttx::close(tx, task, TaskEvent::Cancel, "lease expired", now)?;
                        appended.extend(events::append(tx, &[cancelled_event(&task)], now, "")?);
                        continue;
                    }
                    let retry = task.attempt < task.max_attempts;
                    let error = format!(
                        "lease of worker '{}' expired on attempt {}",
                        task.worker_id, task.attempt
                    );
                    let (_, mut events_out) = attempt_failed(
                        tx,
                        task,
                        TaskFailure::LeaseExpired,
                        &error,
                        retry,
                        0,
                        now,
                        order,
                        default_max,
                    )?;
                    appended.append(&mut events_out);
                }
                Ok((reaped, appended))
            })
            .await?;
        for id in &ids {
            self.lease_ended(id);
        }
        if reaped > 0 {
            self.task_metrics
                .lease_expiries
                .fetch_add(reaped as u64, Ordering::Relaxed);
            tracing::warn!(tasks = reaped, "task leases expired");
            self.after_task_change();
        }
        Ok(reaped)
    }

    /// When the soonest lease runs out (store clock), if any task is leased.
    pub fn next_lease_expiry(&self) -> Result<Option<u64>, RunnerError> {
        match self.store.tree(T::TaskLeases).iter().keys().next() {
            Some(key) => Ok(tables::tasks::parse_lease_key(&key?).map(|(at, _)| at)),
            None => Ok(None),
        }
    }
}

/// Returns expired task leases to the queue as they run out: sleeps until the soonest lease
/// ends (at most a second, so leases taken on other replicas are seen), or a task changed.
pub async fn reap_task_leases(runner: Arc<Runner>, stop: tokio_util::sync::CancellationToken) {
    const MAX_SLEEP: std::time::Duration = std::time::Duration::from_secs(1);
    loop {
        let changed = runner.task_changes();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let mut wait = MAX_SLEEP;
        match runner.next_lease_expiry() {
            Ok(Some(at)) => {
                let now = runner.now_ms();
                if at <= now {
                    match runner.reap_tasks().await {
                        Ok(n) if n > 0 => continue,
                        Ok(_) => wait = std::time::Duration::from_millis(50),
                        Err(e) => {
                            tracing::warn!("cannot return expired task leases: {e}");
                            wait = std::time::Duration::from_millis(200);
                        }
                    }
                } else {
                    wait = wait.min(std::time::Duration::from_millis(at - now));
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!("cannot read task leases: {e}"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = &mut changed => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
