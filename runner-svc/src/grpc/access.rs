//! Who may read what on the runner (docs/auth.md): the one place the read rules live.
//!
//! Operators, services and readers read everything. A submitter reads the runs it submitted;
//! an approver reads the runs that wait for an approval (what it may decide). Anyone else reads
//! no run. A run the caller may not read is PERMISSION_DENIED, after NOT_FOUND for a run that
//! does not exist (as CancelRun does): run ids are no secret, blackboards are.

use std::{collections::HashMap, sync::Arc};

use arbor_shared::{
    auth::{Principal, Role},
    domain::SuspensionCategory,
};
use tonic::Status;

use crate::{
    error::RunnerError,
    runs::{RunRecord, RunView, Runner, Visible},
};

/// Roles that may read some runs: those that read all, and those that read their share.
const SOME_RUNS: [Role; 5] = [
    Role::Operator,
    Role::Service,
    Role::Reader,
    Role::Submitter,
    Role::Approver,
];

/// Registered trees are shared definitions, not anyone's data: whoever submits runs, or reads
/// everything, may read them.
pub const TREE_READERS: &[Role] = &[Role::Submitter, Role::Operator, Role::Service, Role::Reader];

/// Jobs are operations' view of every thread.
pub const JOB_READERS: &[Role] = &[Role::Operator, Role::Service, Role::Reader];

/// Tasks: operations, and the workers that take them.
pub const TASK_READERS: &[Role] = &[Role::Operator, Role::Service, Role::Reader, Role::Worker];

/// A durable subscriber's stream starts at its stored cursor, which only those who may move it
/// (Ack) use: a named subscription belongs to a service or an operator.
const SUBSCRIBERS: &[Role] = &[Role::Service, Role::Operator];

/// The runs a caller may read.
#[derive(Debug, Clone)]
pub enum RunReads {
    All,
    Share {
        name: String,
        /// Submitter: the runs it submitted.
        own: bool,
        /// Approver: runs with an approval waiting.
        awaiting_approval: bool,
    },
}

impl RunReads {
    /// PERMISSION_DENIED for a principal that may read no run at all.
    pub fn of(p: &Principal) -> Result<Self, Status> {
        if p.reads_all() {
            return Ok(Self::All);
        }
        p.require(&SOME_RUNS, "read runs")?;
        Ok(Self::Share {
            name: p.name.clone(),
            own: p.has(Role::Submitter),
            awaiting_approval: p.has(Role::Approver),
        })
    }

    pub fn is_all(&self) -> bool {
        matches!(self, Self::All)
    }

    /// PERMISSION_DENIED unless the caller may read `view`.
    pub fn check(&self, view: &RunView) -> Result<(), Status> {
        match self {
            Self::All => Ok(()),
            Self::Share { name, .. } if !self.view(view) => {
                Err(Status::permission_denied(format!(
                    "principal '{name}' may not read run {}: submitters read the runs they \
                     submitted, approvers the runs waiting for an approval",
                    view.run.run_id
                )))
            }
            Self::Share { .. } => Ok(()),
        }
    }

    /// `check` by id: NOT_FOUND for an unknown run, then the read rule.
    pub fn check_run(&self, runner: &Runner, run_id: &str) -> Result<(), Status> {
        let view = runner.get_run(run_id)?;
        self.check(&view)
    }

    /// A list filter that keeps what the caller may read (`None`: everything).
    pub fn visible(&self) -> Option<Arc<dyn Visible>> {
        match self {
            Self::All => None,
            Self::Share { .. } => Some(Arc::new(self.clone())),
        }
    }
}

impl Visible for RunReads {
    fn record(&self, run: &RunRecord) -> Option<bool> {
        match self {
            Self::All => Some(true),
            Self::Share {
                own: true, name, ..
            } if run.submitted_by == *name => Some(true),
            Self::Share {
                awaiting_approval: true,
                ..
            } => None,
            Self::Share { .. } => Some(false),
        }
    }

    fn view(&self, view: &RunView) -> bool {
        self.record(&view.run).unwrap_or_else(|| {
            view.suspensions
                .iter()
                .any(|s| s.category == SuspensionCategory::RequireApproval)
        })
    }
}

/// What one StreamEvents call may see, settled before it starts: every event, or the events of
/// the runs the caller may read (each run judged once, when its first event comes by).
pub struct StreamReads {
    reads: RunReads,
    seen: HashMap<String, bool>,
}

impl StreamReads {
    /// A named subscriber needs service/operator; the whole log needs a caller that reads
    /// everything; a submitter or approver names a run it may read, or a thread in which it may
    /// read a run (or that has none yet).
    pub fn of(
        p: &Principal,
        runner: &Runner,
        subscriber_id: &str,
        run_id: &str,
        thread_id: &str,
    ) -> Result<Self, Status> {
        if !subscriber_id.is_empty() {
            p.require(SUBSCRIBERS, "follow a named (durable) subscription")?;
        }
        let reads = RunReads::of(p)?;
        let mut seen = HashMap::new();
        if let RunReads::Share { name, .. } = &reads {
            if !run_id.is_empty() {
                reads.check_run(runner, run_id)?;
                seen.insert(run_id.to_string(), true);
            } else if !thread_id.is_empty() {
                let runs = runner.thread_runs(thread_id)?;
                let mut any = runs.is_empty();
                for id in runs {
                    let readable = readable(&reads, runner, &id)?;
                    any |= readable;
                    seen.insert(id, readable);
                }
                if !any {
                    return Err(Status::permission_denied(format!(
                        "principal '{name}' may not follow thread {thread_id}: it reads none of \
                         its runs"
                    )));
                }
            } else {
                return Err(Status::permission_denied(format!(
                    "principal '{name}' may not follow the whole event log (needs one of: \
                     operator, service, reader); filter by a run or thread of yours"
                )));
            }
        }
        Ok(Self { reads, seen })
    }

    /// Whether an event of `run_id` goes to this stream.
    pub fn shows(&mut self, runner: &Runner, run_id: &str) -> Result<bool, RunnerError> {
        if self.reads.is_all() {
            return Ok(true);
        }
        if let Some(seen) = self.seen.get(run_id) {
            return Ok(*seen);
        }
        let shown = !run_id.is_empty() && readable(&self.reads, runner, run_id)?;
        self.seen.insert(run_id.to_string(), shown);
        Ok(shown)
    }
}

/// Whether the caller may read the run; a run that is gone is not readable.
fn readable(reads: &RunReads, runner: &Runner, run_id: &str) -> Result<bool, RunnerError> {
    match runner.get_run(run_id) {
        Ok(view) => Ok(reads.view(&view)),
        Err(RunnerError::RunNotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}
