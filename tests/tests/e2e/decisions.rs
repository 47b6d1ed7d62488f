//! Every decision kind on a tool approval, for every way a tree can configure the tool, through
//! both real binaries: the ledger ends up holding exactly what the approver decided — the
//! original arguments (APPROVE), the edited ones (EDIT), or no record at all (RESPOND, whose
//! result becomes the tool's output; REJECT, after which `on_reject` says what the node returns).
//! Each APPROVAL_RESOLVED carries the digest of what its run went on with: for a call that ran,
//! the digest of the arguments its one ledger record was written with.
//! A decision the node does not allow is FAILED_PRECONDITION at approval-svc and at the runner,
//! and changes nothing: the approval stays PENDING and the run stays suspended on it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use arbor_shared::{
    digest,
    json::{from_proto_struct, to_proto_value},
    proto::{approval::v1 as apb, runner::v1 as rpb},
};
use arbor_tests::{
    Cluster, Profile,
    chaos::verify::read_ledger,
    clients::{ApprovalClient, RunnerClient, approvals_as, runner_as},
    secured::{register, submit, wait_approval, wait_run},
};
use rpb::DecisionKind as K;
use serde_json::{Value as Json, json};
use tonic::Code;

/// A tool configuration: extra fields of the `pay` node and the decisions it must offer.
struct Config {
    name: &'static str,
    extra: Json,
    allowed: &'static [K],
    /// What a REJECT makes of the node: `None` fails the run, `Some(v)` succeeds with output `v`
    /// (`Json::Null`: no output written).
    on_reject: Option<Json>,
}

fn configs() -> Vec<Config> {
    let c = |name, extra, allowed, on_reject| Config {
        name,
        extra,
        allowed,
        on_reject,
    };
    vec![
        c("default", json!({}), &[K::Approve, K::Reject], None),
        c(
            "edit",
            json!({"allow_edit": true}),
            &[K::Approve, K::Reject, K::Edit],
            None,
        ),
        c(
            "respond",
            json!({"allow_respond": true}),
            &[K::Approve, K::Reject, K::Respond],
            None,
        ),
        c(
            "both",
            json!({"allow_edit": true, "allow_respond": true}),
            &[K::Approve, K::Reject, K::Edit, K::Respond],
            None,
        ),
        c(
            "replay",
            json!({"resume_mode": "replay_tool_call"}),
            &[K::Approve, K::Reject],
            None,
        ),
        c(
            "pass",
            json!({"resume_mode": "pass_decision_to_tool"}),
            &[K::Approve, K::Reject, K::Edit],
            None,
        ),
        c(
            "use-result",
            json!({"resume_mode": "use_decision_as_tool_result"}),
            &[K::Approve, K::Reject, K::Respond],
            None,
        ),
        c(
            "skip",
            json!({"on_reject": "skip", "reject_output": {"skipped": true}}),
            &[K::Approve, K::Reject],
            Some(json!({"skipped": true})),
        ),
        c(
            "skip-quiet",
            json!({"on_reject": "skip", "allow_respond": true}),
            &[K::Approve, K::Reject, K::Respond],
            Some(Json::Null),
        ),
    ]
}

fn tree(c: &Config) -> String {
    let mut node = json!({"type": "tool", "name": "pay", "tool": "ledger.append",
        "policy": "ask", "args": {"entry": {"amount": 10}}, "output": "receipt"});
    for (k, v) in c.extra.as_object().unwrap() {
        node[k] = v.clone();
    }
    json!({"id": format!("pay-{}", c.name), "version": 1, "root": node}).to_string()
}

const EDITED: fn() -> Json = || json!({"entry": {"amount": 99}});
const STAND_IN: fn() -> Json = || json!({"paid": false, "answered_by": "a person"});

fn resolve_request(request_id: &str, kind: K) -> apb::ResolveRequest {
    apb::ResolveRequest {
        request_id: request_id.into(),
        decision: kind as i32,
        reason: format!("decided {kind:?}"),
        args: (kind == K::Edit).then(|| to_proto_value(&EDITED())),
        result: (kind == K::Respond).then(|| to_proto_value(&STAND_IN())),
        expected_digest: String::new(),
    }
}

/// The clients one case talks through, and what the ledger must hold for each run: the entry
/// of its one record, or none.
struct Clients {
    runner: RunnerClient,
    service: RunnerClient,
    approvals: ApprovalClient,
    expected: BTreeMap<String, Option<Json>>,
}

/// One decision on one run's approval.
struct Case<'a> {
    c: &'a Config,
    kind: K,
    run_id: &'a str,
    request_id: &'a str,
}

async fn decide_allowed(cl: &mut Clients, case: Case<'_>) {
    let Case {
        c,
        kind,
        run_id,
        request_id,
    } = case;
    let (runner, approvals, expected) = (&cl.runner, &mut cl.approvals, &mut cl.expected);
    approvals
        .resolve(resolve_request(request_id, kind))
        .await
        .unwrap_or_else(|e| panic!("{} {kind:?}: {e}", c.name));
    let (status, receipt, record) = match kind {
        K::Approve => (rpb::RunStatus::Succeeded, None, Some(json!({"amount": 10}))),
        K::Edit => (rpb::RunStatus::Succeeded, None, Some(json!({"amount": 99}))),
        K::Respond => (rpb::RunStatus::Succeeded, Some(STAND_IN()), None),
        _ => match &c.on_reject {
            None => (rpb::RunStatus::Failed, None, None),
            Some(out) => (rpb::RunStatus::Succeeded, Some(out.clone()), None),
        },
    };
    let run = wait_run(runner, run_id, status).await;
    let bb = from_proto_struct(&run.blackboard.unwrap_or_default());
    match (receipt, &record) {
        (Some(stand_in), _) => assert_eq!(
            bb.get("receipt").cloned().unwrap_or(Json::Null),
            stand_in,
            "{} {kind:?}: the node's output",
            c.name
        ),
        (None, Some(entry)) => assert_eq!(
            bb["receipt"]["entry"], *entry,
            "{} {kind:?}: the receipt of the call that ran",
            c.name
        ),
        (None, None) => assert!(bb.get("receipt").is_none(), "{} {kind:?}", c.name),
    }
    if kind == K::Reject && c.on_reject.is_none() {
        assert!(run.error.contains("rejected"), "{}: {}", c.name, run.error);
    }
    expected.insert(run_id.to_string(), record);
}

/// A decision the node does not offer: refused by both services, nothing changes. Then a
/// reject closes the run.
async fn decide_refused(cl: &mut Clients, case: Case<'_>) {
    let Case {
        c,
        kind,
        run_id,
        request_id,
    } = case;
    let Clients {
        runner,
        service,
        approvals,
        expected,
    } = cl;
    let err = approvals
        .resolve(resolve_request(request_id, kind))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "{} {kind:?}: {err}",
        c.name
    );
    let still = approvals
        .get_approval(apb::GetApprovalRequest {
            request_id: request_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(still.state, apb::ApprovalState::Pending as i32);
    assert!(still.decision.is_none());

    let result = match kind {
        K::Edit => EDITED(),
        _ => STAND_IN(),
    };
    let err = service
        .resolve(rpb::ResolveRequest {
            run_id: run_id.into(),
            request_id: request_id.into(),
            decision_id: format!("direct-{run_id}"),
            decision_kind: kind as i32,
            result: Some(to_proto_value(&result)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "{} {kind:?}: {err}",
        c.name
    );
    let run = wait_run(runner, run_id, rpb::RunStatus::Suspended).await;
    assert_eq!(run.suspensions.len(), 1);
    assert_eq!(run.suspensions[0].request_id, request_id);

    approvals
        .resolve(resolve_request(request_id, K::Reject))
        .await
        .unwrap();
    let status = match c.on_reject {
        None => rpb::RunStatus::Failed,
        Some(_) => rpb::RunStatus::Succeeded,
    };
    wait_run(runner, run_id, status).await;
    expected.insert(run_id.to_string(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_kind_does_what_was_decided_for_every_tool_configuration() {
    let (mut cluster, tokens) = Cluster::start_secure(Profile::Debug).await;
    let mut cl = Clients {
        runner: runner_as(&cluster.runner.url(), Some(&tokens.submitter)),
        service: runner_as(&cluster.runner.url(), Some(&tokens.service)),
        approvals: approvals_as(&cluster.approval.url(), Some(&tokens.approver)),
        expected: BTreeMap::new(),
    };
    let mut resolved_kinds = BTreeMap::new();
    for c in configs() {
        let tree = register(&mut cl.runner, tree(&c)).await;
        for kind in [K::Approve, K::Reject, K::Edit, K::Respond] {
            let run_id = format!(
                "{}-{}",
                c.name,
                kind.as_str_name()["DECISION_KIND_".len()..].to_lowercase()
            );
            submit(&mut cl.runner, &tree.id, &run_id).await;
            let pending = wait_approval(&cl.approvals, &run_id, apb::ApprovalState::Pending).await;
            let request = pending.request.clone().unwrap();
            let offered: Vec<i32> = c.allowed.iter().map(|k| *k as i32).collect();
            assert_eq!(request.allowed_decisions, offered, "{}", c.name);
            let case = Case {
                c: &c,
                kind,
                run_id: &run_id,
                request_id: &pending.request_id,
            };
            if c.allowed.contains(&kind) {
                decide_allowed(&mut cl, case).await;
                resolved_kinds.insert(run_id.clone(), kind);
            } else {
                decide_refused(&mut cl, case).await;
                resolved_kinds.insert(run_id.clone(), K::Reject);
            }
        }
    }

    // The runner's event says what was decided, and the digest of what the run went on with.
    let mut digests = BTreeMap::new();
    for (run_id, kind) in &resolved_kinds {
        let events = arbor_tests::flow::events_from(&mut cl.runner, run_id).await;
        let resolved: Vec<(i32, String)> = events
            .iter()
            .filter_map(|e| match &e.detail {
                Some(rpb::event::Detail::ApprovalResolved(r)) => {
                    Some((r.decision_kind, r.args_digest.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(resolved.len(), 1, "{run_id}: {resolved:?}");
        let (decided, digest) = resolved[0].clone();
        assert_eq!(decided, *kind as i32, "{run_id}");
        match kind {
            K::Respond => assert_eq!(digest, digest::of(&STAND_IN()), "{run_id}"),
            K::Reject => assert_eq!(digest, "", "{run_id}"),
            _ => {}
        }
        digests.insert(run_id.clone(), digest);
    }

    // The ledger, read from the stopped runner's files: exactly the decided side effects.
    cluster.runner.stop().await;
    let ledger = read_ledger(&cluster.runner.data_dir).await;
    for (run_id, want) in &cl.expected {
        let records: Vec<&Json> = ledger
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{run_id}:")))
            .map(|(_, v)| v)
            .collect();
        match want {
            None => assert!(records.is_empty(), "{run_id}: {records:?}"),
            Some(entry) => {
                assert_eq!(records.len(), 1, "{run_id}: {records:?}");
                assert_eq!(records[0]["entry"], *entry, "{run_id}");
                // An auditor matches the approval to the execution: the event's digest is that
                // of the arguments the one record was written with.
                let ran_with = json!({"entry": records[0]["entry"].clone()});
                assert_eq!(digests[run_id], digest::of(&ran_with), "{run_id}");
            }
        }
    }
    assert_eq!(cl.expected.len(), 36);
}
