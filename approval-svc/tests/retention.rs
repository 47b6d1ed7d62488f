//! Retention: final approvals (PRUNED, CANCELLED) past the retention go with their audit trail,
//! their index entries and their trace; PENDING, RESOLVED, EXPIRED and delivered-but-unacked
//! approvals stay however old; compaction is idempotent; the store still opens afterwards even
//! when the newest audit entries went; and over gRPC a retained-away id is NOT_FOUND.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use arbor_approval_svc::{
    ApprovalStore, SledStore,
    convert::request_from_event,
    lifecycle::ApprovalState,
    model::{AuditQuery, Filter, NewDecision},
    retention::RetentionConfig,
    store::{Compacted, DeliveryOutcome},
};
use arbor_shared::{
    domain::DecisionKind,
    proto::{approval::v1 as pb, runner::v1 as runner_pb},
    time::now_ms,
};
use support::*;
use tonic::Code;

fn audit_len(store: &SledStore, query: AuditQuery) -> usize {
    store.audit(&query, 1000, None).unwrap().items.len()
}

fn listed(store: &SledStore) -> Vec<String> {
    store
        .list(&Filter::default(), 1000, None, now_ms())
        .unwrap()
        .items
        .iter()
        .map(|a| a.id().to_string())
        .collect()
}

/// A fresh approval `id` of run `run-1`, brought into `state`.
async fn make(store: &SledStore, id: &str, state: ApprovalState) {
    let (request, _) = request_from_event(&tool_request(id, "run-1", "ledger.append")).unwrap();
    store.put_request(request, None).await.unwrap();
    store.put_trace(id, "00-trace-span-01").unwrap();
    let decide = || async {
        store
            .resolve_request(id, NewDecision::person(DecisionKind::Approve, "ana"))
            .await
            .unwrap()
            .approval
            .decision
            .unwrap()
            .decision_id
    };
    match state {
        ApprovalState::Pending => {}
        ApprovalState::Resolved => {
            // Delivered, but the run has not consumed it: it must stay.
            let d = decide().await;
            store
                .record_delivery(id, &d, DeliveryOutcome::Accepted)
                .await
                .unwrap();
        }
        ApprovalState::Expired => {
            store.expire(id).await.unwrap();
        }
        ApprovalState::Acked => {
            let d = decide().await;
            store.ack_result(id, &d).await.unwrap();
        }
        ApprovalState::Pruned => {
            let d = decide().await;
            store.ack_and_prune(id, &d).await.unwrap();
        }
        ApprovalState::Cancelled => {
            store.cancel(id, "runner", "run cancelled").await.unwrap();
        }
    }
    assert_eq!(store.get(id).unwrap().unwrap().state, state);
}

#[tokio::test]
async fn final_approvals_and_their_audit_go_the_rest_stays() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path()).unwrap();
    let keep = [
        ("pending", ApprovalState::Pending),
        ("resolved", ApprovalState::Resolved),
        ("expired", ApprovalState::Expired),
        ("acked", ApprovalState::Acked),
    ];
    let doomed = [
        ("cancelled", ApprovalState::Cancelled),
        ("pruned", ApprovalState::Pruned),
    ];
    for (id, state) in keep.iter().chain(&doomed) {
        make(&store, id, *state).await;
    }
    let kept_audit: Vec<usize> = keep
        .iter()
        .map(|(id, _)| audit_len(&store, AuditQuery::Request((*id).into())))
        .collect();
    let doomed_audit: usize = doomed
        .iter()
        .map(|(id, _)| audit_len(&store, AuditQuery::Request((*id).into())))
        .sum();
    let run_audit = audit_len(&store, AuditQuery::Run("run-1".into()));
    let after_all = now_ms();

    // A cutoff before the last change keeps everything.
    let nothing = store
        .compact(after_all.saturating_sub(60_000))
        .await
        .unwrap();
    assert_eq!(nothing, Compacted::default());

    let done = store.compact(after_all).await.unwrap();
    assert_eq!(done.approvals, 2);
    assert_eq!(done.audit_entries as usize, doomed_audit);
    for (id, _) in doomed {
        assert!(store.get(id).unwrap().is_none(), "{id} is gone");
        assert_eq!(audit_len(&store, AuditQuery::Request(id.into())), 0);
        assert_eq!(store.trace(id).unwrap(), None, "{id}'s trace is gone");
    }
    for ((id, state), n) in keep.iter().zip(kept_audit) {
        assert_eq!(store.get(id).unwrap().unwrap().state, *state, "{id} stays");
        assert_eq!(audit_len(&store, AuditQuery::Request((*id).into())), n);
        assert!(store.trace(id).unwrap().is_some());
    }
    assert_eq!(
        audit_len(&store, AuditQuery::Run("run-1".into())),
        run_audit - doomed_audit
    );
    assert_eq!(listed(&store), ["pending", "resolved", "expired", "acked"]);
    assert_eq!(store.next_deadline().unwrap(), None);
    assert_eq!(store.undelivered().unwrap().len(), 1, "the expired one");

    // Idempotent: nothing is left to remove, whatever the cutoff.
    assert_eq!(store.compact(now_ms()).await.unwrap(), Compacted::default());
    assert_eq!(
        store.compact(u64::MAX).await.unwrap(),
        Compacted::default(),
        "in-flight approvals stay however old"
    );

    // The newest audit entries (the prune of `pruned`) went; the store must still pass its
    // integrity check (progress never goes backwards) and its reference check.
    store.record_progress().await.unwrap();
    drop(store);
    let store = eventually("the store to reopen", WAIT, || async {
        SledStore::open(dir.path()).ok()
    })
    .await;
    assert_eq!(listed(&store), ["pending", "resolved", "expired", "acked"]);
    // A request id that comes back is new: it starts PENDING again.
    make(&store, "pruned", ApprovalState::Pending).await;
}

#[tokio::test]
async fn big_batches_are_compacted_in_several_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path()).unwrap();
    // More than one batch, with survivors in between.
    for i in 0..300 {
        let state = if i % 7 == 0 {
            ApprovalState::Pending
        } else {
            ApprovalState::Cancelled
        };
        make(&store, &format!("r{i:04}"), state).await;
    }
    let done = store.compact(now_ms()).await.unwrap();
    assert_eq!(done.approvals, 300 - 43);
    assert_eq!(listed(&store).len(), 43);
    assert_eq!(store.compact(now_ms()).await.unwrap(), Compacted::default());
}

#[tokio::test]
async fn the_service_compacts_in_the_background_and_answers_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let mut cfg = config(dir.path(), &runner.url());
    cfg.retention = RetentionConfig {
        keep: Duration::ZERO,
        interval: Duration::from_millis(50),
    };
    let svc = Svc::start(cfg).await;
    let mut client = svc.client().await;

    runner.push_request(tool_request("done", "run-1", "ledger.append"));
    runner.push_request(tool_request("waiting", "run-2", "ledger.append"));
    wait_for(
        &client,
        "done",
        "pending",
        state(pb::ApprovalState::Pending),
    )
    .await;
    let decided = client
        .resolve(resolve_req("done", runner_pb::DecisionKind::Approve))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let decision_id = decided.decision.unwrap().decision_id;
    eventually("the decision at the runner", WAIT, || async {
        (!runner.resolves_for("done").is_empty()).then_some(())
    })
    .await;
    runner.push_consumed("run-1", "done", &decision_id);

    // Once pruned (and the cursor acked past it) the approval and its audit trail go.
    eventually("the pruned approval to be compacted", WAIT, || async {
        let mut c = client.clone();
        let gone = c
            .get_approval(pb::GetApprovalRequest {
                request_id: "done".into(),
            })
            .await
            .err()
            .is_some_and(|s| s.code() == Code::NotFound);
        gone.then_some(())
    })
    .await;
    let err = client
        .get_audit_log(pb::GetAuditLogRequest {
            request_id: "done".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let run_audit = client
        .get_audit_log(pb::GetAuditLogRequest {
            run_id: "run-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(run_audit.entries.is_empty());

    // The pending one stays: retention has run since the other one was pruned.
    let waiting = get(&mut client, "waiting").await;
    assert_eq!(waiting.state, pb::ApprovalState::Pending as i32);
    svc.stop().await;
}
