//! Everything a client can observe of both services' state, in one comparable value: the runs
//! (with their blackboards and suspensions), the mailbox jobs, the event log's length, every
//! approval, the audit trail of chosen runs and whether chosen tree ids exist. "Bad input
//! changes nothing" is `Snapshot::take` before and after being equal.

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};

use crate::{
    chaos::{driver, verify},
    clients::{ApprovalClient, RunnerClient},
};

#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub runs: Vec<rpb::Run>,
    pub jobs: Vec<rpb::Job>,
    pub last_seq: u64,
    pub approvals: Vec<apb::Approval>,
    pub audit: Vec<apb::AuditEntry>,
    /// (tree id, digest of its latest version if registered)
    pub trees: Vec<(String, Option<String>)>,
}

/// What a snapshot looks at beyond "everything listable".
#[derive(Debug, Clone, Default)]
pub struct Probes {
    /// Runs whose audit trail is compared.
    pub audit_runs: Vec<String>,
    /// Tree ids whose registration is compared (bad documents must not register them).
    pub tree_ids: Vec<String>,
}

impl Snapshot {
    /// Reads the state as an operator.
    pub async fn take(
        runner: &mut RunnerClient,
        approvals: &mut ApprovalClient,
        probes: &Probes,
    ) -> Snapshot {
        let runs = driver::list_runs(runner, &[]).await.expect("ListRuns");
        let mut jobs = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = runner
                .list_jobs(rpb::ListJobsRequest {
                    page_size: 1000,
                    page_token: page_token.clone(),
                    ..Default::default()
                })
                .await
                .expect("ListJobs")
                .into_inner();
            jobs.extend(page.jobs);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let last_seq = verify::full_log(runner)
            .await
            .expect("event log")
            .last()
            .map_or(0, |e| e.seq);
        let all = driver::list_approvals(approvals, &[])
            .await
            .expect("ListApprovals");
        let mut audit = Vec::new();
        for run_id in &probes.audit_runs {
            audit.extend(
                approvals
                    .get_audit_log(apb::GetAuditLogRequest {
                        run_id: run_id.clone(),
                        page_size: 1000,
                        ..Default::default()
                    })
                    .await
                    .expect("GetAuditLog")
                    .into_inner()
                    .entries,
            );
        }
        let mut trees = Vec::new();
        for id in &probes.tree_ids {
            let digest = runner
                .get_tree(rpb::GetTreeRequest {
                    tree_id: id.clone(),
                    version: 0,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().tree)
                .map(|t| t.digest);
            trees.push((id.clone(), digest));
        }
        Snapshot {
            runs,
            jobs,
            last_seq,
            approvals: all,
            audit,
            trees,
        }
    }

    /// Which parts differ (empty when equal).
    pub fn diff(&self, after: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        if self.runs != after.runs {
            out.push(format!(
                "runs changed: {:?}",
                after
                    .runs
                    .iter()
                    .filter(|r| !self.runs.contains(r))
                    .map(|r| (&r.run_id, r.status))
                    .collect::<Vec<_>>()
            ));
        }
        if self.jobs != after.jobs {
            out.push(format!(
                "jobs changed ({} → {})",
                self.jobs.len(),
                after.jobs.len()
            ));
        }
        if self.last_seq != after.last_seq {
            out.push(format!(
                "events appended: last seq {} → {}",
                self.last_seq, after.last_seq
            ));
        }
        if self.approvals != after.approvals {
            out.push(format!(
                "approvals changed: {:?}",
                after
                    .approvals
                    .iter()
                    .filter(|a| !self.approvals.contains(a))
                    .map(|a| (&a.request_id, a.state))
                    .collect::<Vec<_>>()
            ));
        }
        if self.audit != after.audit {
            out.push(format!(
                "audit trail changed ({} → {} entries)",
                self.audit.len(),
                after.audit.len()
            ));
        }
        if self.trees != after.trees {
            out.push(format!(
                "trees changed: {:?} → {:?}",
                self.trees, after.trees
            ));
        }
        out
    }
}
