//! Approval governance through the real binaries, on sled and on PostgreSQL: a tokens file of
//! people in approver groups, a policy file of `[[approval]]` rules chosen by the payee of a
//! `ledger.append` call, and cases that vote as those people and check what a user sees — the
//! approval after each vote (state, `governance.progress`), the audit (actions, actors, seats
//! filled by delegates), the run, and the ledger (the approved arguments, once).
//!
//! On sled every case runs against one pair; on PostgreSQL the quorum, escalation and
//! concurrency cases run on 2 runner + 2 approval replicas (each client call going to a
//! different replica than the one before), the rest on one pair.

mod cli;
mod concurrency;
mod digest;
mod escalation;
mod quorum;
mod seats;

use std::sync::Arc;

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_testkit::PgCluster;
use arbor_tests::{
    Cluster, Profile,
    auth::{Person, Tokens},
    chaos::verify::{read_ledger, read_ledger_postgres},
    clients::{ApprovalClient, RunnerClient, approvals_as, runner_as},
    flow::{audit_of, events_from},
    process::Replicas,
    secured::{register, submit_input, wait_approval, wait_run},
};
use serde_json::{Value as Json, json};
use tokio::task::JoinSet;

/// The submitter: in `payments` too, and never eligible on their own run.
pub const SUBMITTER: &str = arbor_tests::auth::SUBMITTER;

/// The payments group (the submitter is a fifth member); `pam` is excluded by one rule.
pub const PAYMENTS: [&str; 4] = ["pam", "paul", "pete", "pia"];
/// Stage 2 of the escalation rule.
pub const DIRECTORS: [&str; 2] = ["dan", "dora"];
/// An approver in no group: a delegate.
pub const DELEGATE: &str = "dana";
/// The one member of `tiny`, a group too small for its stage.
pub const TINY: &str = "tess";

/// The sixteen members of `board`, who all vote at once.
pub fn board() -> Vec<String> {
    (1..=16).map(|i| format!("b{i:02}")).collect()
}

fn people() -> Vec<Person> {
    let approver = |name: &str, groups: &[&str]| Person::new(name, &["approver"], groups);
    let mut people = vec![Person::new(SUBMITTER, &["submitter"], &["payments"])];
    people.extend(PAYMENTS.iter().map(|p| approver(p, &["payments"])));
    people.extend(DIRECTORS.iter().map(|p| approver(p, &["directors"])));
    people.push(approver(DELEGATE, &[]));
    people.push(approver(TINY, &["tiny"]));
    people.extend(board().iter().map(|p| approver(p, &["board"])));
    people
}

/// The rules, first match wins: the payee picks a case's rule; any other payment over 1000
/// needs two of `payments` (the submitter and `pam` left out); smaller ones are not governed.
const POLICY: &str = r#"
[[approval]]
name = "too-few"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "tiny-co"
[[approval.stage]]
name = "tiny"
approvers = ["group:tiny"]
required = 2

[[approval]]
name = "veto"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "veto-co"
[[approval.stage]]
name = "payments"
approvers = ["group:payments"]
required = 2

[[approval]]
name = "count"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "count-co"
[[approval.stage]]
name = "payments"
approvers = ["group:payments"]
required = 3
on_reject = "count"

[[approval]]
name = "escalate"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "escalate-co"
[[approval.stage]]
name = "payments"
approvers = ["group:payments"]
required = 2
deadline = "2s"
on_timeout = "escalate"
[[approval.stage]]
name = "directors"
approvers = ["group:directors"]
required = "all"

[[approval]]
name = "board"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "board-co"
[[approval.stage]]
name = "board"
approvers = ["group:board"]
required = "all"

[[approval]]
name = "edit"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "edit-co"
[[approval.stage]]
name = "payments"
approvers = ["group:payments"]
required = 2

[[approval]]
name = "big-payments"
tool = "ledger.*"
tree = "gov-*"
[[approval.when]]
arg = "/amount"
gt = 1000
[[approval.stage]]
name = "payments"
approvers = ["group:payments"]
exclude = ["user:pam"]
required = 2
"#;

/// One tool call, asked of a person, whose arguments come from the run's input.
fn tree() -> String {
    json!({"id": "gov-pay", "version": 1,
        "root": {"type": "tool", "name": "pay", "tool": "ledger.append", "policy": "ask",
                 "allow_edit": true, "output": "receipt",
                 "args": {"amount": {"$ref": "amount"}, "payee": {"$ref": "payee"}}}})
    .to_string()
}

/// The arguments of a payment.
pub fn payment(amount: u64, payee: &str) -> Json {
    json!({"amount": amount, "payee": payee})
}

enum Backend {
    Sled(Box<Cluster>),
    Postgres(Replicas),
}

/// The services a group of cases runs against, and the people who use them.
pub struct Env {
    backend: Backend,
    pub tokens: Tokens,
    runner_urls: Vec<String>,
    approval_urls: Vec<String>,
    tree_id: String,
    _policy: tempfile::TempDir,
}

/// What the ledger must hold for a run: the arguments of its one record, or nothing.
pub type Expect = (String, Option<Json>);

fn write_policy() -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, POLICY).unwrap();
    (dir, vec!["--policy".into(), path.display().to_string()])
}

impl Env {
    async fn sled() -> Env {
        let (policy, args) = write_policy();
        let (cluster, tokens) =
            Cluster::start_secure_people(Profile::Debug, &people(), Vec::new(), args).await;
        let (runner_urls, approval_urls) =
            (vec![cluster.runner.url()], vec![cluster.approval.url()]);
        Self::ready(
            Backend::Sled(Box::new(cluster)),
            tokens,
            runner_urls,
            approval_urls,
            policy,
        )
        .await
    }

    /// `replicas` runner and approval replicas on a fresh database.
    async fn postgres(hint: &str, replicas: usize) -> Env {
        let (policy, args) = write_policy();
        let url = PgCluster::shared().fresh_database(hint);
        let mut r = Replicas::prepare(Profile::Debug, &url, (replicas, replicas), vec![], args);
        let tokens = Tokens::write_with(r.dir.path(), &people());
        for s in &mut r.runners {
            s.extra_args.extend(tokens.runner_args());
        }
        for s in &mut r.approvals {
            s.extra_args.extend(tokens.approval_args());
        }
        r.start_all().await;
        let (runner_urls, approval_urls) = (r.runner_urls(), r.approval_urls());
        Self::ready(
            Backend::Postgres(r),
            tokens,
            runner_urls,
            approval_urls,
            policy,
        )
        .await
    }

    async fn ready(
        backend: Backend,
        tokens: Tokens,
        runner_urls: Vec<String>,
        approval_urls: Vec<String>,
        policy: tempfile::TempDir,
    ) -> Env {
        let mut runner = runner_as(&runner_urls[0], Some(&tokens.submitter));
        let tree_id = register(&mut runner, tree()).await.id;
        Env {
            backend,
            tokens,
            runner_urls,
            approval_urls,
            tree_id,
            _policy: policy,
        }
    }

    /// `who`'s ApprovalService client on approval replica `i` (modulo their number).
    pub fn approvals(&self, who: &str, i: usize) -> ApprovalClient {
        let url = &self.approval_urls[i % self.approval_urls.len()];
        approvals_as(url, Some(self.tokens.of(who)))
    }

    /// `who`'s RunnerService client on runner replica `i` (modulo their number).
    pub fn runner(&self, who: &str, i: usize) -> RunnerClient {
        runner_as(
            &self.runner_urls[i % self.runner_urls.len()],
            Some(self.tokens.of(who)),
        )
    }

    /// The submitter submits run `run_id` paying `args`; returns its approval once PENDING.
    /// The submitter submits run `run_id` paying `args`.
    pub async fn start(&self, run_id: &str, args: &Json) {
        let mut runner = self.runner(SUBMITTER, 0);
        let input = args.as_object().unwrap().clone();
        submit_input(&mut runner, &self.tree_id, run_id, input).await;
    }

    pub async fn submit(&self, run_id: &str, args: &Json) -> apb::Approval {
        self.start(run_id, args).await;
        wait_approval(
            &self.approvals(READER, 1),
            run_id,
            apb::ApprovalState::Pending,
        )
        .await
    }

    /// Waits until `run_id` has `status` (read on runner replica 1).
    pub async fn wait_run(&self, run_id: &str, status: rpb::RunStatus) -> rpb::Run {
        wait_run(&self.runner(SUBMITTER, 1), run_id, status).await
    }

    /// The audit of one request (read on approval replica 0).
    pub async fn audit(&self, request_id: &str) -> Vec<apb::AuditEntry> {
        audit_of(&mut self.approvals(READER, 0), request_id).await
    }

    /// How many `APPROVAL_RESOLVED` events the run has: the decisions it took in.
    pub async fn resolved_events(&self, run_id: &str) -> usize {
        let events = events_from(&mut self.runner(SUBMITTER, 0), run_id).await;
        events
            .iter()
            .filter(|e| matches!(e.detail, Some(rpb::event::Detail::ApprovalResolved(_))))
            .count()
    }

    /// Checks the ledger against what every case expects: one record with exactly the
    /// approved arguments, or none. On sled the runner is stopped to read its files.
    async fn check_ledger(&mut self, expected: &[Expect]) {
        let ledger = match &mut self.backend {
            Backend::Sled(cluster) => {
                cluster.runner.stop().await;
                read_ledger(&cluster.runner.data_dir).await
            }
            Backend::Postgres(r) => read_ledger_postgres(&r.store_url).await,
        };
        for (run_id, want) in expected {
            let records: Vec<&Json> = ledger
                .iter()
                .filter(|(k, _)| k.starts_with(&format!("{run_id}:")))
                .map(|(_, v)| &v["entry"])
                .collect();
            match want {
                None => assert!(records.is_empty(), "{run_id} wrote {records:?}"),
                Some(args) => assert_eq!(records, vec![args], "{run_id}: one record, as approved"),
            }
        }
    }
    /// Whether run `run_id`'s approval is among what `who` may act on now (`actionable`).
    pub async fn actionable(&self, who: &str, run_id: &str) -> bool {
        let filter = apb::ApprovalFilter {
            run_id: run_id.into(),
            actionable: true,
            ..Default::default()
        };
        let page = self
            .approvals(who, 1)
            .list_approvals(apb::ListApprovalsRequest {
                filter: Some(filter),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{who}'s actionable approvals: {e}"));
        !page.into_inner().approvals.is_empty()
    }
}

/// The built-in reader (reads approvals and the audit, decides nothing).
pub const READER: &str = arbor_tests::auth::READER;

/// The approval's `governance.progress` (`1 of 2 in payments`).
pub fn progress(a: &apb::Approval) -> String {
    a.governance.as_ref().expect("governed").progress.clone()
}

/// The audit's actions, in order, without the request's own entry and the pruning of a
/// finished run's results (retention's, whenever it comes).
pub fn actions(audit: &[apb::AuditEntry]) -> Vec<apb::AuditAction> {
    use apb::AuditAction as A;
    audit
        .iter()
        .map(|e| e.action())
        .filter(|a| ![A::Requested, A::Pruned].contains(a))
        .collect()
}

/// The `VOTED` entries as `(actor, on_behalf_of, decision)`.
pub fn votes(audit: &[apb::AuditEntry]) -> Vec<(String, String, rpb::DecisionKind)> {
    audit
        .iter()
        .filter(|e| e.action() == apb::AuditAction::Voted)
        .map(|e| (e.actor.clone(), e.on_behalf_of.clone(), e.decision()))
        .collect()
}

/// Runs the cases `start` spawns against `env` side by side, then checks the ledger.
async fn run_cases(env: Env, start: fn(&mut JoinSet<Vec<Expect>>, &Arc<Env>)) {
    let env = Arc::new(env);
    let mut cases = JoinSet::new();
    start(&mut cases, &env);
    let mut expected = Vec::new();
    while let Some(done) = cases.join_next().await {
        match done {
            Ok(e) => expected.extend(e),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let Ok(mut env) = Arc::try_unwrap(env) else {
        panic!("every case is done with the services");
    };
    env.check_ledger(&expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_governance_case_on_sled() {
    run_cases(Env::sled().await, |cases, env| {
        cases.spawn(quorum::two_of_three_without_the_submitter(env.clone()));
        cases.spawn(quorum::a_veto_rejects_at_once(env.clone()));
        cases.spawn(quorum::counted_rejections_decide_once_out_of_reach(
            env.clone(),
        ));
        cases.spawn(quorum::a_stage_too_small_rejects_at_once(env.clone()));
        cases.spawn(escalation::a_deadline_opens_stage_two(env.clone()));
        cases.spawn(seats::a_delegate_fills_the_delegator_s_seat(env.clone()));
        cases.spawn(seats::a_claim_keeps_others_out(env.clone()));
        cases.spawn(digest::an_edit_makes_votes_stale(env.clone()));
        cases.spawn(concurrency::sixteen_vote_at_once(env.clone()));
        cases.spawn(cli::a_person_votes_from_the_command_line(env.clone()));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_escalation_and_concurrency_on_postgres_replicas() {
    run_cases(Env::postgres("gov_replicas", 2).await, |cases, env| {
        cases.spawn(quorum::two_of_three_without_the_submitter(env.clone()));
        cases.spawn(quorum::a_veto_rejects_at_once(env.clone()));
        cases.spawn(quorum::counted_rejections_decide_once_out_of_reach(
            env.clone(),
        ));
        cases.spawn(quorum::a_stage_too_small_rejects_at_once(env.clone()));
        cases.spawn(escalation::a_deadline_opens_stage_two(env.clone()));
        cases.spawn(concurrency::sixteen_vote_at_once(env.clone()));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delegation_claims_and_digests_on_postgres() {
    run_cases(Env::postgres("gov_pair", 1).await, |cases, env| {
        cases.spawn(seats::a_delegate_fills_the_delegator_s_seat(env.clone()));
        cases.spawn(seats::a_claim_keeps_others_out(env.clone()));
        cases.spawn(digest::an_edit_makes_votes_stale(env.clone()));
    })
    .await;
}
