//! Reading runs and jobs, cancelling runs, requeueing dead letters and storing subscriber
//! cursors.

use arbor_shared::{domain::RunStatus, page};
use serde_json::{Map, Value as Json};

use super::{Runner, records, records::RunRecord, submit};
use crate::{
    engine::{Checkpoint, SuspensionRecord},
    error::RunnerError,
    events,
    mailbox::{Job, JobFilter, MailboxStore},
    store::{T, codec},
};

/// A run with the parts of its checkpoint clients read.
#[derive(Debug, Clone)]
pub struct RunView {
    pub run: RunRecord,
    pub blackboard: Map<String, Json>,
    /// Active suspensions.
    pub suspensions: Vec<SuspensionRecord>,
}

impl RunView {
    /// The run with its checkpoint's blackboard and active suspensions.
    pub fn of(run: RunRecord, ck: &Checkpoint) -> Self {
        Self {
            run,
            blackboard: ck.blackboard().clone(),
            suspensions: ck
                .suspensions()
                .filter(|s| s.state == arbor_shared::domain::SuspensionState::Active)
                .cloned()
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub thread_id: String,
    pub tree_id: String,
    pub statuses: Vec<RunStatus>,
    /// Only the runs the caller may read (`None`: every run). Applied before paging, so a page
    /// holds `page_size` readable runs when there are that many.
    pub visible: Option<std::sync::Arc<dyn Visible>>,
}

/// Which runs a caller may see; the gRPC layer decides it from the caller's roles.
pub trait Visible: std::fmt::Debug + Send + Sync {
    /// The answer when the run record settles it; `None` when it takes the checkpoint's view.
    fn record(&self, run: &RunRecord) -> Option<bool>;
    fn view(&self, view: &RunView) -> bool;
}

pub struct RunPage {
    pub runs: Vec<RunView>,
    pub next_page_token: String,
}

pub struct JobPage {
    pub jobs: Vec<Job>,
    pub next_page_token: String,
}

impl Runner {
    pub fn get_run(&self, run_id: &str) -> Result<RunView, RunnerError> {
        submit::check_id("run_id", run_id)?;
        let run = self.run_record(run_id)?;
        self.view(run)
    }

    fn view(&self, run: RunRecord) -> Result<RunView, RunnerError> {
        let ck = match self.store.tree(T::Checkpoints).get(run.run_id.as_bytes())? {
            Some(bytes) => Some(Checkpoint::decode(&bytes).map_err(|e| codec::Corrupt {
                what: "checkpoint",
                message: e.to_string(),
            })?),
            None => None,
        };
        Ok(match ck {
            Some(ck) => RunView::of(run, &ck),
            None => RunView {
                run,
                blackboard: Map::new(),
                suspensions: Vec::new(),
            },
        })
    }

    /// Runs in id order (ids are time-ordered), filtered, paginated by the last id.
    pub fn list_runs(
        &self,
        filter: &RunFilter,
        page_size_req: u32,
        page_token: &str,
    ) -> Result<RunPage, RunnerError> {
        let limit = page::size(page_size_req);
        let page_token = &after_token(RUNS, page_token)?;
        let matches = |r: &RunRecord| {
            (filter.tree_id.is_empty() || r.tree_id == filter.tree_id)
                && (filter.thread_id.is_empty() || r.thread_id == filter.thread_id)
                && (filter.statuses.is_empty() || filter.statuses.contains(&r.status))
        };
        let mut runs = Vec::new();
        let mut last = String::new();
        let mut more = false;
        let ids: Box<dyn Iterator<Item = Result<String, RunnerError>>> =
            if filter.thread_id.is_empty() {
                Box::new(
                    self.store
                        .tree(T::Runs)
                        .after(page_token)
                        .keys()
                        .map(|k| Ok(String::from_utf8_lossy(&k?).into_owned())),
                )
            } else {
                let token = page_token.to_string();
                Box::new(
                    self.thread_runs(&filter.thread_id)?
                        .into_iter()
                        .filter(move |id| token.is_empty() || id.as_str() > token.as_str())
                        .map(Ok),
                )
            };
        for id in ids {
            let id = id?;
            let Some(bytes) = self.store.tree(T::Runs).get(id.as_bytes())? else {
                continue;
            };
            let run: RunRecord = codec::decode("run", &bytes)?;
            if !matches(&run) {
                continue;
            }
            let view = match filter.visible.as_ref().map(|v| (v, v.record(&run))) {
                None | Some((_, Some(true))) => None,
                Some((_, Some(false))) => continue,
                Some((v, None)) => {
                    let view = self.view(run.clone())?;
                    if !v.view(&view) {
                        continue;
                    }
                    Some(view)
                }
            };
            if runs.len() == limit {
                more = true;
                break;
            }
            last = run.run_id.clone();
            runs.push(match view {
                Some(view) => view,
                None => self.view(run)?,
            });
        }
        Ok(RunPage {
            runs,
            next_page_token: if more {
                page::token(RUNS, last.as_bytes())
            } else {
                String::new()
            },
        })
    }

    pub fn list_jobs(
        &self,
        filter: &JobFilter,
        page_size_req: u32,
        page_token: &str,
    ) -> Result<JobPage, RunnerError> {
        let limit = page::size(page_size_req);
        let after = after_token(JOBS, page_token)?;
        let mut jobs = self.mailbox.list(filter, &after, limit + 1)?;
        let more = jobs.len() > limit;
        jobs.truncate(limit);
        let next_page_token = if more {
            jobs.last()
                .map(|j| page::token(JOBS, j.job_id.as_bytes()))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(JobPage {
            jobs,
            next_page_token,
        })
    }

    /// Operator: a dead-lettered job goes back to the queue with a fresh attempt budget; a run
    /// that failed because of it is revived.
    pub async fn requeue_job(&self, job_id: &str) -> Result<Job, RunnerError> {
        if job_id.is_empty() {
            return Err(RunnerError::invalid("job_id", "required"));
        }
        let now = self.now_ms();
        let job_id = job_id.to_string();
        let job = self
            .commit(move |tx| {
                let job = crate::store::lift(crate::mailbox::tx::requeue(tx, &job_id, now))?;
                let mut appended = Vec::new();
                if let Some(mut run) = records::get_run(tx, &job.run_id)?
                    && run.status == RunStatus::Failed
                    && run.error.starts_with("job ")
                {
                    run.status = super::state::apply(
                        run.status,
                        super::state::RunEvent::Revive {
                            started: run.started,
                        },
                    )?;
                    run.error.clear();
                    run.generation = job.generation;
                    run.updated_at_ms = now;
                    records::put_run(tx, &run)?;
                    appended = events::append(
                        tx,
                        &[events::NewEvent {
                            run_id: run.run_id.clone(),
                            thread_id: run.thread_id.clone(),
                            detail: arbor_shared::domain::EventDetail::RunQueued {
                                job_id: job.job_id.clone(),
                                tree_id: run.tree_id.clone(),
                                tree_version: run.tree_version,
                                priority: job.priority,
                                job_kind: job.kind,
                            },
                        }],
                        now,
                        "",
                    )?;
                }
                Ok((job, appended))
            })
            .await?;
        self.wake_pool();
        Ok(job)
    }

    /// Cancels a queued, running or suspended run through a cancel job (the run's one owner is
    /// the worker holding its thread), then waits for the run to reach a terminal status.
    pub async fn cancel_run(&self, run_id: &str, reason: &str) -> Result<RunView, RunnerError> {
        submit::check_id("run_id", run_id)?;
        let run = self.run_record(run_id)?;
        if run.status.is_terminal() {
            return Err(RunnerError::RunFinished {
                run_id: run_id.into(),
                status: run.status,
            });
        }
        let reason = if reason.is_empty() {
            "cancelled"
        } else {
            reason
        };
        let order = self.store.next_id()?;
        let now = self.now_ms();
        let default_max = self.mailbox.config().default_max_attempts;
        let (id, reason) = (run_id.to_string(), reason.to_string());
        self.commit(move |tx| {
            let run = records::must_get_run(tx, &id)?;
            if run.status.is_terminal() {
                return Ok(((), Vec::new()));
            }
            submit::enqueue_cancel(tx, &run, &reason, order, now, default_max)?;
            Ok(((), Vec::new()))
        })
        .await?;
        self.wake_pool();
        let run = self.wait_terminal(run_id, self.opts.cancel_wait).await?;
        self.view(run)
    }

    /// Stores a durable subscriber's cursor (never backwards).
    pub async fn ack_cursor(&self, subscriber: &str, seq: u64) -> Result<u64, RunnerError> {
        if subscriber.is_empty() || subscriber.len() > 128 {
            return Err(RunnerError::invalid("subscriber_id", "must be 1-128 bytes"));
        }
        let last = self.events.last_seq()?;
        if seq > last {
            return Err(RunnerError::invalid(
                "seq",
                format!("{seq} is beyond the last event ({last})"),
            ));
        }
        let subscriber = subscriber.to_string();
        self.commit(move |tx| {
            let stored = events::ack_cursor(tx, &subscriber, seq, last)?;
            Ok((stored, Vec::new()))
        })
        .await
    }
}

/// The lists' names in their page tokens, so one list's token is refused by another.
const RUNS: &str = "runs";
const JOBS: &str = "jobs";

/// The id a page token continues after ("" for the first page).
fn after_token(list: &str, token: &str) -> Result<String, RunnerError> {
    if token.is_empty() {
        return Ok(String::new());
    }
    page::key(list, token)
        .and_then(|k| String::from_utf8(k).ok())
        .ok_or_else(|| RunnerError::invalid("page_token", page::INVALID))
}
