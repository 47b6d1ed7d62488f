//! The chaos workload shared by the crash and partition suites: seeded run plans, simulated
//! people driving them through both services, a durable event subscriber, and the final checks.

pub mod driver;
pub mod plan;
pub mod recorder;
pub mod verify;
pub mod workers;

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use arbor_shared::proto::approval::v1 as apb;
use tokio::task::JoinHandle;

pub use driver::{DriveConfig, Shared};
pub use plan::Plan;
pub use recorder::Recorder;
pub use verify::Report;

use crate::{
    Cluster,
    auth::Tokens,
    clients::{approvals_as, runner_as},
    process::Replicas,
};

/// The seed: `ARBOR_CHAOS_SEED` when set (to replay a failure), else fresh.
pub fn seed() -> u64 {
    match std::env::var("ARBOR_CHAOS_SEED") {
        Ok(s) => s.parse().expect("ARBOR_CHAOS_SEED is a u64"),
        Err(_) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            now ^ u64::from(std::process::id())
        }
    }
}

/// Whether the long variants were asked for (`ARBOR_CHAOS_LONG=1`).
pub fn long() -> bool {
    std::env::var("ARBOR_CHAOS_LONG").is_ok_and(|v| v == "1")
}

/// A workload in progress against a secured cluster.
pub struct Workload {
    pub shared: Arc<Shared>,
    recorder: Recorder,
    actors: Vec<JoinHandle<()>>,
    tokens: Tokens,
    runner_urls: Vec<String>,
    approval_urls: Vec<String>,
    pub started: Instant,
}

/// What the workload gathered before the services are stopped.
struct Gathered {
    report: Report,
    plans: Vec<Plan>,
    runs: std::collections::HashMap<String, arbor_shared::proto::runner::v1::Run>,
    log: Vec<arbor_shared::proto::runner::v1::Event>,
    approvals: Vec<apb::Approval>,
    decided: std::collections::HashMap<String, usize>,
    recorded: std::collections::BTreeMap<u64, recorder::Seen>,
    recorder_problems: Vec<String>,
}

impl Workload {
    /// Registers the trees and starts the actors and the durable subscriber. Clients talk to the
    /// services directly (a partition test puts its proxy between the services only).
    pub async fn start(
        cluster: &Cluster,
        tokens: &Tokens,
        plans: Vec<Plan>,
        cfg: DriveConfig,
    ) -> Workload {
        Self::start_spread(
            &[cluster.runner.url()],
            &[cluster.approval.url()],
            tokens,
            plans,
            cfg,
        )
        .await
    }

    /// [`Workload::start`] against replicas: the actors spread over every replica (see
    /// [`driver::spawn_spread`]) and the durable subscriber opens each stream on the next
    /// runner replica.
    pub async fn start_spread(
        runner_urls: &[String],
        approval_urls: &[String],
        tokens: &Tokens,
        plans: Vec<Plan>,
        cfg: DriveConfig,
    ) -> Workload {
        let mut submitter = runner_as(&runner_urls[0], Some(&tokens.submitter));
        driver::register_trees(&mut submitter).await;
        let shared = Shared::new(plans);
        let recorder = Recorder::start_spread(
            runner_urls
                .iter()
                .map(|u| runner_as(u, Some(&tokens.operator)))
                .collect(),
            "chaos-auditor",
        );
        let actors = driver::spawn_spread(
            shared.clone(),
            cfg,
            runner_urls
                .iter()
                .map(|u| runner_as(u, Some(&tokens.submitter)))
                .collect(),
            approval_urls
                .iter()
                .map(|u| approvals_as(u, Some(&tokens.approver)))
                .collect(),
        );
        Workload {
            shared,
            recorder,
            actors,
            tokens: tokens.clone(),
            runner_urls: runner_urls.to_vec(),
            approval_urls: approval_urls.to_vec(),
            started: Instant::now(),
        }
    }

    /// Counts a kill, cut or stall (the submitter paces itself by them).
    pub fn disrupted(&self) {
        self.shared.disruptions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn progress(&self) -> String {
        let c = &self.shared.counters;
        format!(
            "{:>5.1}s submitted {}/{} finished {} decisions {} (+{} dup) answers {} (+{} dup) \
             subscriber at {} ({} streams)",
            self.started.elapsed().as_secs_f64(),
            self.shared.submitted(),
            self.shared.plans.len(),
            self.shared.finished(),
            c.decisions.load(Ordering::Relaxed),
            c.decision_duplicates.load(Ordering::Relaxed),
            c.inputs.load(Ordering::Relaxed),
            c.input_duplicates.load(Ordering::Relaxed),
            self.recorder.contiguous(),
            self.recorder.connects(),
        )
    }

    /// Waits (at most `timeout`) until every approval of the workload is PRUNED and the durable
    /// subscriber has everything the log holds. Gives up quietly: the checks then say what is
    /// missing.
    pub async fn settle(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut approvals = approvals_as(&self.approval_urls[0], Some(&self.tokens.operator));
        let mut runner = runner_as(&self.runner_urls[0], Some(&self.tokens.operator));
        while Instant::now() < deadline {
            let unsettled = driver::list_approvals(
                &mut approvals,
                &[
                    apb::ApprovalState::Pending,
                    apb::ApprovalState::Resolved,
                    apb::ApprovalState::Acked,
                    apb::ApprovalState::Expired,
                ],
            )
            .await
            .map(|a| a.len());
            let last = verify::full_log(&mut runner)
                .await
                .map(|log| log.last().map_or(0, |e| e.seq));
            if let (Ok(0), Ok(last)) = (unsettled, last)
                && self.recorder.contiguous() >= last
                && self.shared.all_finished()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the actors and the subscriber without checking runs (a soak's runs are compacted
    /// away by retention); returns what the clients and the subscriber found wrong.
    pub async fn stop(self) -> Vec<String> {
        self.shared.stop.store(true, Ordering::Relaxed);
        for actor in self.actors {
            let _ = actor.await;
        }
        let (_, mut problems) = self.recorder.finish().await;
        problems.extend(self.shared.problems());
        problems
    }

    /// Stops the actors, gathers the evidence, stops both services cleanly (their exit codes are
    /// checked too), reads the runner's ledger and runs every check.
    pub async fn finish(self, cluster: &mut Cluster) -> Report {
        let mut g = self.gather().await;
        let approval_exit = cluster.approval.stop().await;
        let runner_exit = cluster.runner.stop().await;
        if approval_exit != Some(0) || runner_exit != Some(0) {
            g.report.problem(format!(
                "clean shutdown: approval-svc exited {approval_exit:?}, runner-svc {runner_exit:?}"
            ));
        }
        let ledger = verify::read_ledger(&cluster.runner.data_dir).await;
        g.check(&ledger)
    }

    /// [`Workload::finish`] for replicas on PostgreSQL: every replica must stop cleanly, and
    /// the ledger is the one they share in the database.
    pub async fn finish_replicas(self, replicas: &mut Replicas) -> Report {
        let mut g = self.gather().await;
        for unclean in replicas.stop_all().await {
            g.report.problem(format!("clean shutdown: {unclean}"));
        }
        let ledger = verify::read_ledger_postgres(&replicas.store_url).await;
        g.check(&ledger)
    }

    /// Stops the actors and gathers everything but the ledger, while the services still run.
    async fn gather(self) -> Gathered {
        self.shared.stop.store(true, Ordering::Relaxed);
        for actor in self.actors {
            let _ = actor.await;
        }
        let mut report = Report::default();
        report.fact(format!(
            "workload time {:.1}s",
            self.started.elapsed().as_secs_f64()
        ));
        let mut runner = runner_as(&self.runner_urls[0], Some(&self.tokens.operator));
        let mut approvals = approvals_as(&self.approval_urls[0], Some(&self.tokens.operator));
        let plans = self.shared.plans.clone();
        let runs = verify::final_runs(&mut runner, &plans)
            .await
            .expect("GetRun of every planned run");
        let log = verify::full_log(&mut runner)
            .await
            .expect("read the event log");
        for other in &self.runner_urls[1..] {
            let theirs = verify::full_log(&mut runner_as(other, Some(&self.tokens.operator)))
                .await
                .expect("read the event log");
            if theirs != log {
                report.problem(format!(
                    "the event log read from {other} ({} events) is not the one read from {} \
                     ({} events)",
                    theirs.len(),
                    self.runner_urls[0],
                    log.len()
                ));
            }
        }
        let all_approvals = driver::list_approvals(&mut approvals, &[])
            .await
            .expect("ListApprovals");
        let decided = verify::decided_counts(&mut approvals, &plans)
            .await
            .expect("GetAuditLog");
        let connects = self.recorder.connects();
        let acked = self.recorder.acked();
        let (recorded, recorder_problems) = self.recorder.finish().await;
        report.fact(format!(
            "durable subscriber: {connects} streams opened, cursor acked up to {acked}"
        ));
        for p in self.shared.problems() {
            report.problem(format!("client: {p}"));
        }
        let c = &self.shared.counters;
        report.fact(format!(
            "approver decisions {} (+{} duplicates, {} retried); inputs/results {} (+{} duplicates, \
             {} retried); submit retries {}",
            c.decisions.load(Ordering::Relaxed),
            c.decision_duplicates.load(Ordering::Relaxed),
            c.decision_retries.load(Ordering::Relaxed),
            c.inputs.load(Ordering::Relaxed),
            c.input_duplicates.load(Ordering::Relaxed),
            c.input_retries.load(Ordering::Relaxed),
            c.submit_retries.load(Ordering::Relaxed),
        ));
        Gathered {
            report,
            plans,
            runs,
            log,
            approvals: all_approvals,
            decided,
            recorded,
            recorder_problems,
        }
    }
}

impl Gathered {
    fn check(mut self, ledger: &std::collections::BTreeMap<String, serde_json::Value>) -> Report {
        verify::check(
            &verify::Evidence {
                plans: &self.plans,
                runs: &self.runs,
                log: &self.log,
                recorded: &self.recorded,
                recorder_problems: &self.recorder_problems,
                approvals: &self.approvals,
                decided: &self.decided,
                ledger,
            },
            &mut self.report,
        );
        self.report
    }
}
