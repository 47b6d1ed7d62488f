//! Retention: keeps the store's size bounded by the rate of work, not its history. Events are
//! compacted once every durable subscriber has acked them and they are old enough (or,
//! regardless, once they pass the maximum age — a subscriber that far behind is told OUT_OF_RANGE
//! rather than silently skipped); finished runs and final jobs go after their retention.

use std::time::Duration;

use crate::{
    counts::{self, Counted},
    error::RunnerError,
    mailbox::{Job, state::is_final},
    runs::{RunRecord, Runner},
    store::{
        T, codec,
        tables::{self, finished},
    },
};

/// How long things are kept.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Events every durable subscriber has acked are kept this long.
    pub events_acked: Duration,
    /// Events older than this go even if a subscriber has not acked them.
    pub events_max: Duration,
    /// Finished runs (record, checkpoint) and final jobs are kept this long.
    pub finished: Duration,
    /// How often the compactor runs.
    pub interval: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            events_acked: crate::defaults::EVENTS_ACKED_RETENTION,
            events_max: crate::defaults::EVENTS_MAX_RETENTION,
            finished: crate::defaults::FINISHED_RETENTION,
            interval: crate::defaults::COMPACT_INTERVAL,
        }
    }
}

/// What one compaction pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    pub events: u64,
    pub runs: u64,
    pub jobs: u64,
    /// Ended tasks of task workers.
    pub tasks: u64,
}

/// Keys deleted per transaction, so one pass never holds the write lock for long.
const BATCH: usize = 1000;

impl Runner {
    /// One compaction pass at wall-clock time `now_ms`.
    pub async fn compact(
        &self,
        cfg: &RetentionConfig,
        now_ms: u64,
    ) -> Result<Compacted, RunnerError> {
        let events = self.compact_events(cfg, now_ms).await?;
        let cutoff = now_ms.saturating_sub(cfg.finished.as_millis() as u64);
        let runs = self.compact_finished(finished::RUN, cutoff).await?;
        let jobs = self.compact_finished(finished::JOB, cutoff).await?;
        let tasks = self.compact_finished(finished::TASK, cutoff).await?;
        Ok(Compacted {
            events,
            runs,
            jobs,
            tasks,
        })
    }

    async fn compact_events(&self, cfg: &RetentionConfig, now_ms: u64) -> Result<u64, RunnerError> {
        let acked_floor = self
            .events()
            .cursors()?
            .into_iter()
            .map(|(_, c)| c)
            .min()
            .unwrap_or(u64::MAX);
        let durable = self.events().durable_seq();
        let acked_cutoff = now_ms.saturating_sub(cfg.events_acked.as_millis() as u64);
        let max_cutoff = now_ms.saturating_sub(cfg.events_max.as_millis() as u64);
        let mut removed = 0;
        loop {
            let first = self.events().first_seq()?;
            let mut doomed = Vec::new();
            for entry in self
                .store()
                .tree(T::Events)
                .range_from(tables::meta::event_key(first))
            {
                let (key, bytes) = entry?;
                let seq = codec::read_u64(&key);
                let event: arbor_shared::domain::Event = codec::decode("event", &bytes)?;
                let acked_and_old = seq <= acked_floor && event.time_ms <= acked_cutoff;
                if seq > durable || !(acked_and_old || event.time_ms <= max_cutoff) {
                    break;
                }
                doomed.push(seq);
                if doomed.len() == BATCH {
                    break;
                }
            }
            let Some(&last) = doomed.last() else {
                return Ok(removed);
            };
            let count = doomed.len();
            self.commit(move |tx| {
                for seq in &doomed {
                    tx.tree(T::Events).remove(tables::meta::event_key(*seq))?;
                }
                crate::events::set_first_seq(tx, last + 1)?;
                Ok(((), Vec::new()))
            })
            .await?;
            removed += count as u64;
            if count < BATCH {
                return Ok(removed);
            }
        }
    }

    /// Deletes finished runs (`kind` b'r'), final jobs (b'j') or ended tasks (b't') that finished
    /// before `cutoff`.
    async fn compact_finished(&self, kind: u8, cutoff: u64) -> Result<u64, RunnerError> {
        let mut removed = 0;
        loop {
            let mut batch = Vec::new();
            for entry in self.store().tree(T::Finished).scan_prefix([kind]) {
                let (key, _) = entry?;
                let Some((at, id)) = finished::parse(&key) else {
                    continue;
                };
                if at > cutoff {
                    break;
                }
                batch.push((key.to_vec(), id));
                if batch.len() == BATCH {
                    break;
                }
            }
            if batch.is_empty() {
                return Ok(removed);
            }
            let full = batch.len() == BATCH;
            let n = self
                .commit(move |tx| {
                    let mut n = 0u64;
                    for (index_key, id) in &batch {
                        tx.tree(T::Finished).remove(index_key.as_slice())?;
                        n += match kind {
                            finished::RUN => delete_run(tx, id, cutoff)?,
                            finished::TASK => delete_task(tx, id, cutoff)?,
                            _ => delete_job(tx, id, cutoff)?,
                        };
                    }
                    Ok((n, Vec::new()))
                })
                .await?;
            removed += n;
            if !full {
                return Ok(removed);
            }
        }
    }
}

type Tx<'a> = crate::store::Tx<'a>;
type R<T> = crate::store::TxResult<T, RunnerError>;

/// Deletes a run (record, checkpoint, thread index entry, trace context) that is still finished
/// and unchanged since `cutoff` (a requeued dead letter may have revived it: then only its stale
/// index entry goes).
fn delete_run(tx: &Tx<'_>, run_id: &str, cutoff: u64) -> R<u64> {
    let Some(bytes) = tx.tree(T::Runs).get(run_id.as_bytes())? else {
        return Ok(0);
    };
    let run: RunRecord = match codec::decode("run", &bytes) {
        Ok(r) => r,
        Err(e) => return crate::store::abort(e),
    };
    if !run.status.is_terminal() || run.updated_at_ms > cutoff {
        return Ok(0);
    }
    // A finished run has no suspensions counted; only its status count goes.
    counts::moved(tx, Some(Counted::Run(run.status)), None)?;
    tx.tree(T::Runs).remove(run_id.as_bytes())?;
    tx.tree(T::Checkpoints).remove(run_id.as_bytes())?;
    tx.tree(T::ThreadRuns)
        .remove(tables::runs::thread_run_key(&run.thread_id, run_id))?;
    crate::events::clear_run_trace(tx, run_id)?;
    Ok(1)
}

fn delete_job(tx: &Tx<'_>, job_id: &str, cutoff: u64) -> R<u64> {
    let Some(bytes) = tx.tree(T::Jobs).get(job_id.as_bytes())? else {
        return Ok(0);
    };
    let job: Job = match codec::decode("job", &bytes) {
        Ok(j) => j,
        Err(e) => return crate::store::abort(e),
    };
    if !is_final(job.status) || job.updated_at_ms > cutoff {
        return Ok(0);
    }
    counts::moved(tx, Some(Counted::Job(job.status)), None)?;
    tx.tree(T::Jobs).remove(job_id.as_bytes())?;
    tx.tree(T::MailboxJobs)
        .remove(tables::jobs::mailbox_job_key(&job.mailbox_id, job.order))?;
    Ok(1)
}

/// Deletes a task that ended before `cutoff` (its run has its outcome in its checkpoint).
fn delete_task(tx: &Tx<'_>, task_id: &str, cutoff: u64) -> R<u64> {
    match crate::tasks::tx::get(tx, task_id)? {
        Some(task) if task.state.is_terminal() && task.updated_at_ms <= cutoff => {
            tx.tree(T::Tasks).remove(task_id.as_bytes())?;
            Ok(1)
        }
        _ => Ok(0),
    }
}

/// Runs a compaction pass every `cfg.interval` until `stop`.
pub async fn compactor(
    runner: std::sync::Arc<Runner>,
    cfg: RetentionConfig,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {}
            _ = stop.cancelled() => return,
        }
        match runner.compact(&cfg, runner.now_ms()).await {
            Ok(c) if c != Compacted::default() => {
                tracing::info!(events = c.events, runs = c.runs, jobs = c.jobs, "compacted")
            }
            Ok(_) => {}
            Err(e) => tracing::error!("compaction failed: {e}"),
        }
    }
}
