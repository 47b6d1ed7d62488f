//! A decision bound to the digest its decider approved: the runner runs a tool call only with
//! arguments of that digest, refuses any other (FAILED_PRECONDITION, the run still waits, the
//! ledger untouched), and records the digest it ran with in APPROVAL_RESOLVED, so an auditor
//! can match the approval to the ledger's one record.

use std::sync::Arc;

use arbor_runner_svc::{
    engine::{LedgerTool, TreeFormat},
    error::RunnerError,
    mailbox::MailboxStore,
    runs::{Processed, ResolveInput, Runner, SubmitInput},
};
use arbor_shared::{
    digest,
    domain::{DecisionKind, DecisionSource, EventDetail, RunStatus, Verdict},
};
use serde_json::{Value as Json, json};

use crate::common;

/// `ledger.append` of `{amount}` behind a person's approval that may be edited or answered.
const TREE: &str = r#"{"id": "pay", "version": 1, "root": {"type": "tool", "name": "append",
  "tool": "ledger.append", "args": {"entry": {"amount": {"$ref": "amount"}}},
  "policy": "ask", "allow_edit": true, "allow_respond": true, "output": "receipt"}}"#;

/// An approval gate that shows its approver `plan`.
const GATE: &str = r#"{"id": "gate", "version": 1, "root": {"type": "approval", "name": "go",
  "title": "Go?", "context": ["plan"], "child": {"type": "succeed"}}}"#;

struct Rig {
    runner: Arc<Runner>,
    ledger: LedgerTool,
    run_id: String,
    request_id: String,
    _dir: tempfile::TempDir,
}

/// A run of `pay` for 5, waiting on its tool approval.
async fn waiting() -> Rig {
    waiting_on(TREE, json!({"amount": 5})).await
}

/// A run of `tree` (`pay` or `gate`) on `input`, waiting on its first approval.
async fn waiting_on(tree: &str, input: Json) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let runner = common::Backend::Sled.open_runner(dir.path(), |_| {}).await;
    let tree = runner.register_tree(tree, TreeFormat::Json).await.unwrap();
    let input = input.as_object().cloned().unwrap();
    let run_id = runner
        .submit(SubmitInput {
            tree_id: tree.0.id.clone(),
            input,
            submitted_by: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run
        .run_id;
    assert_eq!(
        process_next(&runner).await,
        Processed::Done(RunStatus::Suspended)
    );
    let request_id = runner.get_run(&run_id).unwrap().suspensions[0]
        .request_id
        .clone();
    let ledger = LedgerTool::new(runner.store().clone()).unwrap();
    Rig {
        runner,
        ledger,
        run_id,
        request_id,
        _dir: dir,
    }
}

async fn process_next(runner: &Arc<Runner>) -> Processed {
    let claim = runner.mailbox().claim("w").unwrap().expect("a job to do");
    runner.process(&claim).await
}

impl Rig {
    async fn decide(
        &self,
        decision_id: &str,
        kind: DecisionKind,
        result: Json,
        args_digest: &str,
    ) -> Result<(), RunnerError> {
        self.runner
            .resolve(ResolveInput {
                run_id: self.run_id.clone(),
                request_id: self.request_id.clone(),
                decision_id: decision_id.into(),
                action: Verdict::of(kind),
                result,
                reason: String::new(),
                decided_by: "bob".into(),
                source: DecisionSource::Person,
                may_resolve_approvals: true,
                answerer: None,
                trace: None,
                args_digest: args_digest.into(),
            })
            .await
            .map(|_| ())
    }

    /// The run still waits on its request, with nothing decided and nothing written.
    async fn still_waits(&self) {
        let view = self.runner.get_run(&self.run_id).unwrap();
        assert_eq!(view.run.status, RunStatus::Suspended);
        assert_eq!(view.suspensions[0].request_id, self.request_id);
        assert!(self.resolved_digests().await.is_empty());
        assert_eq!(self.ledger.count(), 0);
    }

    /// The `args_digest` of every APPROVAL_RESOLVED in the log.
    async fn resolved_digests(&self) -> Vec<String> {
        let events = self.runner.events().read_after(0, 1000).await.unwrap();
        events
            .into_iter()
            .filter_map(|e| match e.detail {
                EventDetail::ApprovalResolved { args_digest, .. } => Some(args_digest),
                _ => None,
            })
            .collect()
    }

    /// Runs the woken run to its end and returns the ledger's entries.
    async fn finish(&self) -> Vec<Json> {
        assert_eq!(
            process_next(&self.runner).await,
            Processed::Done(RunStatus::Succeeded)
        );
        self.ledger
            .entries()
            .into_iter()
            .map(|(_, receipt)| receipt["entry"].clone())
            .collect()
    }
}

fn refused(r: Result<(), RunnerError>) {
    match r {
        Err(e @ RunnerError::DecisionNotOffered { .. }) => {
            assert_eq!(
                tonic::Status::from(e).code(),
                tonic::Code::FailedPrecondition
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_with_another_digest_is_refused_and_the_approved_one_runs_once() {
    let rig = waiting().await;
    let asked = digest::of(&json!({"entry": {"amount": 5}}));
    let other = digest::of(&json!({"entry": {"amount": 6}}));

    refused(
        rig.decide("d-1", DecisionKind::Approve, Json::Null, &other)
            .await,
    );
    rig.still_waits().await;
    let malformed = rig
        .decide("d-1", DecisionKind::Approve, Json::Null, "sha256:nothex")
        .await;
    assert!(
        matches!(&malformed, Err(RunnerError::Invalid { violations, .. })
            if violations[0].field == "args_digest"),
        "{malformed:?}"
    );
    rig.still_waits().await;

    rig.decide("d-1", DecisionKind::Approve, Json::Null, &asked)
        .await
        .unwrap();
    assert_eq!(rig.finish().await, vec![json!({"amount": 5})]);
    assert_eq!(rig.resolved_digests().await, vec![asked]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_runs_exactly_the_arguments_of_its_digest() {
    let rig = waiting().await;
    let edited = json!({"entry": {"amount": 7}});
    // The request's digest does not cover an edit: the decider approved other arguments.
    let asked = digest::of(&json!({"entry": {"amount": 5}}));
    refused(
        rig.decide("d-1", DecisionKind::Edit, edited.clone(), &asked)
            .await,
    );
    rig.still_waits().await;

    let bound = digest::of(&edited);
    rig.decide("d-2", DecisionKind::Edit, edited, &bound)
        .await
        .unwrap();
    assert_eq!(rig.finish().await, vec![json!({"amount": 7})]);
    assert_eq!(rig.resolved_digests().await, vec![bound]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_is_bound_to_its_result_and_a_reject_to_nothing() {
    let rig = waiting().await;
    let answer = json!({"seq": 0, "stand_in": true});
    refused(
        rig.decide(
            "d-1",
            DecisionKind::Respond,
            answer.clone(),
            &digest::of(&json!({})),
        )
        .await,
    );
    rig.still_waits().await;
    rig.decide(
        "d-2",
        DecisionKind::Respond,
        answer.clone(),
        &digest::of(&answer),
    )
    .await
    .unwrap();
    assert_eq!(rig.finish().await, Vec::<Json>::new());
    assert_eq!(rig.resolved_digests().await, vec![digest::of(&answer)]);

    // A reject runs nothing: whatever digest it names, it is taken, and records none.
    let rig = waiting().await;
    let any = digest::of(&json!("anything"));
    rig.decide("d-1", DecisionKind::Reject, Json::Null, &any)
        .await
        .unwrap();
    assert_eq!(rig.resolved_digests().await, vec![String::new()]);
    assert_eq!(rig.ledger.count(), 0);
}

/// Callers that send no digest (older approval services, operators) are not checked, and the
/// event still says what the run went on with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_digest_nothing_is_checked_and_the_event_still_binds() {
    let rig = waiting().await;
    rig.decide("d-1", DecisionKind::Approve, Json::Null, "")
        .await
        .unwrap();
    assert_eq!(rig.finish().await, vec![json!({"amount": 5})]);
    assert_eq!(
        rig.resolved_digests().await,
        vec![digest::of(&json!({"entry": {"amount": 5}}))]
    );
}

/// A gate's approval is bound to the context its approver was shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_approval_is_bound_to_its_context() {
    let plan = json!({"service": "billing", "replicas": 3});
    let rig = waiting_on(GATE, json!({"plan": plan})).await;
    let other = digest::of(&json!({"plan": {"service": "billing", "replicas": 30}}));
    refused(
        rig.decide("d-1", DecisionKind::Approve, Json::Null, &other)
            .await,
    );
    rig.still_waits().await;

    let shown = digest::of(&json!({"plan": plan}));
    rig.decide("d-2", DecisionKind::Approve, Json::Null, &shown)
        .await
        .unwrap();
    assert_eq!(rig.finish().await, Vec::<Json>::new());
    assert_eq!(rig.resolved_digests().await, vec![shown]);
}
