//! Who may read what on the runner, and who may answer a run's questions (docs/auth.md): the one
//! place these rules live.
//!
//! Operators, services and readers read everything. A submitter reads the runs it submitted;
//! an approver reads the runs that wait for an approval (what it may decide); anyone named as an
//! answerer of a run's open question or external request reads that run. Anyone else reads
//! no run. A run the caller may not read is PERMISSION_DENIED, after NOT_FOUND for a run that
//! does not exist (as CancelRun does): run ids are no secret, blackboards are.

use std::{collections::HashMap, sync::Arc};

use arbor_shared::{
    auth::{Principal, Role},
    domain::{SuspensionCategory, SuspensionState},
};
use serde_json::Value as Json;
use tonic::Status;

use crate::{
    engine::SuspensionRecord,
    error::RunnerError,
    runs::{RunRecord, RunView, Runner, Visible},
};

/// Who may answer a user-input or external request (RunnerService.Resolve): services (approval-svc
/// relaying a person's answer, integrations) and operators always; else those the node names in
/// `answerers` (an identity, or `group:NAME` for the members of a group); a node that names no
/// one is answered by the run's submitter. Checked by the runner inside the decision's step, so a
/// refused caller changes nothing.
#[derive(Debug, Clone)]
pub struct Answerer {
    name: String,
    groups: Vec<String>,
}

impl Answerer {
    /// `None` for callers every request accepts (services, operators).
    pub fn of(p: &Principal) -> Option<Self> {
        if p.has_any(&[Role::Service, Role::Operator]) {
            return None;
        }
        Some(Self {
            name: p.name.clone(),
            groups: p.groups.clone(),
        })
    }

    /// Whether this caller is among those the request names (`answerers` in its payload), or,
    /// when it names no one, the run's submitter.
    pub fn may_answer(&self, record: &SuspensionRecord, submitted_by: &str) -> bool {
        match named(record) {
            Some(names) => names.iter().any(|who| self.is(who)),
            None => self.name == submitted_by,
        }
    }

    /// PERMISSION_DENIED (as [`RunnerError::NotAnswerer`]) naming who may answer.
    pub fn check(&self, run: &RunRecord, record: &SuspensionRecord) -> Result<(), RunnerError> {
        if self.may_answer(record, &run.submitted_by) {
            return Ok(());
        }
        let who = match named(record) {
            Some(names) => names.join(", "),
            None => format!("the run's submitter '{}'", run.submitted_by),
        };
        Err(RunnerError::NotAnswerer(format!(
            "principal '{}' may not answer request '{}' of run {}: it may be answered by {who} \
             (and operators)",
            self.name, record.request_id, run.run_id
        )))
    }

    fn is(&self, who: &str) -> bool {
        match who.strip_prefix("group:") {
            Some(group) => self.groups.iter().any(|g| g == group),
            None => who == self.name,
        }
    }
}

/// The `answerers` a user-input or external request names; `None` when it names no one.
fn named(record: &SuspensionRecord) -> Option<Vec<&str>> {
    let list = record.payload.get("answerers")?.as_array()?;
    let names: Vec<&str> = list.iter().filter_map(Json::as_str).collect();
    (!names.is_empty()).then_some(names)
}

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
        /// Runs with an open question or external request it may answer.
        answerer: Answerer,
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
            answerer: Answerer {
                name: p.name.clone(),
                groups: p.groups.clone(),
            },
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
                     submitted, approvers the runs waiting for an approval, answerers the runs \
                     waiting for their answer",
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
            // A finished run waits for nothing: settled without reading its checkpoint (most
            // stored runs are finished, and a list filters them all).
            Self::Share { .. } if run.status.is_terminal() => Some(false),
            // Whether it waits for an approval or for this caller's answer: the checkpoint says.
            Self::Share { .. } => None,
        }
    }

    fn view(&self, view: &RunView) -> bool {
        self.record(&view.run).unwrap_or_else(|| {
            let Self::Share {
                awaiting_approval,
                answerer,
                ..
            } = self
            else {
                return true;
            };
            view.suspensions.iter().any(|s| {
                s.state == SuspensionState::Active
                    && match s.category {
                        SuspensionCategory::RequireApproval => *awaiting_approval,
                        _ => answerer.may_answer(s, &view.run.submitted_by),
                    }
            })
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
