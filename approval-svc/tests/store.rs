//! The sled ApprovalStore on real files: every lifecycle transition, every illegal one (typed
//! error, right status code, nothing changed), the single-winner decision under concurrency,
//! pruning that keeps the audit trail, tombstones, and durability across a reopen.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use arbor_approval_svc::{
    ApprovalStore, Error, SledStore,
    convert::request_from_event,
    lifecycle::{ApprovalState, Transition},
    model::{Approval, AuditAction, AuditQuery, Filter, NewDecision},
    store::DeliveryOutcome,
};
use arbor_shared::{
    domain::{ApprovalRequest, DecisionKind, DecisionSource, TimeoutAction},
    time::now_ms,
};
use serde_json::json;
use tonic::Code;

fn request(id: &str, run: &str) -> ApprovalRequest {
    request_from_event(&support::node_request(id, run))
        .unwrap()
        .0
}

fn tool(id: &str, run: &str) -> ApprovalRequest {
    request_from_event(&support::tool_request(id, run, "ledger.append"))
        .unwrap()
        .0
}

fn open() -> (tempfile::TempDir, SledStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path()).unwrap();
    (dir, store)
}

fn approve(by: &str) -> NewDecision {
    NewDecision::person(DecisionKind::Approve, by)
}

fn actions(store: &SledStore, id: &str) -> Vec<AuditAction> {
    store
        .audit(&AuditQuery::Request(id.into()), 100, None)
        .unwrap()
        .items
        .iter()
        .map(|e| e.action)
        .collect()
}

fn current(store: &SledStore, id: &str) -> Approval {
    store.get(id).unwrap().unwrap()
}

/// Brings a fresh request `id` into `state` through legal moves only.
async fn in_state(store: &SledStore, id: &str, state: ApprovalState) -> Approval {
    store.put_request(tool(id, "run-1"), None).await.unwrap();
    let decide = |s: &SledStore| {
        let s = s.clone();
        let id = id.to_string();
        async move { s.resolve_request(&id, approve("ana")).await.unwrap() }
    };
    match state {
        ApprovalState::Pending => {}
        ApprovalState::Resolved => {
            decide(store).await;
        }
        ApprovalState::Expired => {
            store.expire(id).await.unwrap();
        }
        ApprovalState::Acked | ApprovalState::Pruned => {
            let d = decide(store).await.approval.decision.unwrap();
            store.ack_result(id, &d.decision_id).await.unwrap();
            if state == ApprovalState::Pruned {
                store.prune_result(id).await.unwrap();
            }
        }
        ApprovalState::Cancelled => {
            store.cancel(id, "runner", "run cancelled").await.unwrap();
        }
    }
    let a = current(store, id);
    assert_eq!(a.state, state);
    a
}

#[tokio::test]
async fn put_is_idempotent_and_audited() {
    let (_dir, store) = open();
    let put = store
        .put_request(request("r1", "run-1"), None)
        .await
        .unwrap();
    assert!(put.created);
    assert_eq!(put.approval.state, ApprovalState::Pending);
    assert_eq!(put.approval.version, 1);
    let again = store
        .put_request(request("r1", "run-1"), None)
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.approval, put.approval);
    assert_eq!(actions(&store, "r1"), vec![AuditAction::Requested]);
}

#[tokio::test]
async fn resolve_is_single_winner_and_idempotent() {
    let (_dir, store) = open();
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    let first = store
        .resolve_request("r1", approve("ana").with_reason("looks fine"))
        .await
        .unwrap();
    assert!(!first.duplicate);
    let d = first.approval.decision.clone().unwrap();
    assert_eq!(first.approval.state, ApprovalState::Resolved);
    assert_eq!(
        (d.kind, d.source, d.decided_by.as_str()),
        (DecisionKind::Approve, DecisionSource::Person, "ana")
    );
    assert_eq!(
        uuid::Uuid::parse_str(&d.decision_id)
            .unwrap()
            .get_version_num(),
        7
    );

    // The same decision again, by someone else: OK, nothing changes, same decision id.
    let again = store.resolve_request("r1", approve("bo")).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.approval, first.approval);

    // A different decision: FAILED_PRECONDITION, and the first one stands.
    let err = store
        .resolve_request("r1", NewDecision::person(DecisionKind::Reject, "bo"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyDecided { .. }), "{err:?}");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(current(&store, "r1"), first.approval);
    assert_eq!(
        actions(&store, "r1"),
        vec![AuditAction::Requested, AuditAction::Decided]
    );
}

#[tokio::test]
async fn edit_and_respond_need_the_runner_to_allow_them() {
    let (_dir, store) = open();
    store
        .put_request(request("gate", "run-1"), None)
        .await
        .unwrap();
    let before = current(&store, "gate");
    let mut edit = NewDecision::person(DecisionKind::Edit, "ana");
    edit.args = json!({"replicas": 1});
    let err = store
        .resolve_request("gate", edit.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotAllowed { .. }), "{err:?}");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(current(&store, "gate"), before);

    store.put_request(tool("t", "run-1"), None).await.unwrap();
    let r = store.resolve_request("t", edit).await.unwrap();
    assert_eq!(
        r.approval.decision.unwrap().runner_result(),
        json!({"replicas": 1})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_different_decisions_have_exactly_one_winner() {
    let (_dir, store) = open();
    let store = Arc::new(store);
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut d = NewDecision::person(DecisionKind::Edit, format!("p{i}"));
            d.args = json!({"replicas": i});
            store.resolve_request("r1", d).await
        }));
    }
    let mut winners = Vec::new();
    let mut losers = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => {
                assert!(!r.duplicate);
                winners.push(r.approval);
            }
            Err(Error::AlreadyDecided { .. }) => losers += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!((winners.len(), losers), (1, 15));
    assert_eq!(current(&store, "r1"), winners[0]);
    let decided = actions(&store, "r1")
        .into_iter()
        .filter(|a| *a == AuditAction::Decided)
        .count();
    assert_eq!(decided, 1);
}

#[tokio::test]
async fn expiry_takes_the_on_timeout_decision() {
    let (_dir, store) = open();
    let mut r = request("late", "run-1");
    r.deadline_ms = now_ms() + 60_000;
    store.put_request(r.clone(), None).await.unwrap();
    assert_eq!(store.next_deadline().unwrap().unwrap().1, "late");
    let a = store.expire("late").await.unwrap();
    assert_eq!(a.state, ApprovalState::Expired);
    let d = a.decision.unwrap();
    assert_eq!(
        (d.kind, d.source, d.decided_by.as_str()),
        (DecisionKind::Reject, DecisionSource::Timeout, "timeout")
    );
    assert_eq!(store.next_deadline().unwrap(), None);
    assert_eq!(store.undelivered().unwrap().len(), 1);

    r.request_id = "lenient".into();
    r.on_timeout = TimeoutAction::Approve;
    store.put_request(r, None).await.unwrap();
    let a = store.expire("lenient").await.unwrap();
    assert_eq!(a.decision.unwrap().kind, DecisionKind::Approve);
    let entries = store
        .audit(&AuditQuery::Request("lenient".into()), 10, None)
        .unwrap()
        .items;
    let expired = entries.last().unwrap();
    assert_eq!(expired.action, AuditAction::Expired);
    assert_eq!(expired.actor, "timeout");
    assert_eq!(expired.source, Some(DecisionSource::Timeout));
}

#[tokio::test]
async fn delivery_ack_and_prune_keep_the_audit_and_a_tombstone() {
    let (_dir, store) = open();
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    let mut respond = NewDecision::person(DecisionKind::Respond, "ana");
    respond.result = json!({"receipt": "manual"});
    let d = store
        .resolve_request("r1", respond)
        .await
        .unwrap()
        .approval
        .decision
        .unwrap();

    let failed = DeliveryOutcome::Failed("UNAVAILABLE".into());
    store
        .record_delivery("r1", &d.decision_id, failed)
        .await
        .unwrap();
    let a = store
        .record_delivery("r1", &d.decision_id, DeliveryOutcome::Accepted)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.delivery_attempts, 2);
    assert!(a.delivered_at_ms > 0 && a.last_delivery_error.is_empty());
    assert!(store.undelivered().unwrap().is_empty());

    // Only the decision the approval holds can be acked.
    let err = store.ack_result("r1", "someone-else").await.unwrap_err();
    assert!(matches!(err, Error::DecisionMismatch { .. }));
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(current(&store, "r1").state, ApprovalState::Resolved);

    let acked = store.ack_result("r1", &d.decision_id).await.unwrap();
    assert_eq!(acked.state, ApprovalState::Acked);
    let pruned = store.prune_result("r1").await.unwrap();
    assert_eq!(pruned.state, ApprovalState::Pruned);
    assert!(pruned.request.tool_args.is_null() && pruned.request.context.is_empty());
    let kept = pruned.decision.unwrap();
    assert_eq!(
        (kept.kind, kept.decision_id.as_str()),
        (DecisionKind::Respond, d.decision_id.as_str())
    );
    assert!(kept.result.is_null());
    assert_eq!(
        actions(&store, "r1"),
        vec![
            AuditAction::Requested,
            AuditAction::Decided,
            AuditAction::Delivered,
            AuditAction::Acked,
            AuditAction::Pruned
        ]
    );

    // A late duplicate APPROVAL_REQUESTED does not bring the request back.
    let late = store.put_request(tool("r1", "run-1"), None).await.unwrap();
    assert!(!late.created);
    assert_eq!(late.approval.state, ApprovalState::Pruned);
    assert!(late.approval.request.tool_args.is_null());
}

#[tokio::test]
async fn every_illegal_transition_is_refused_and_changes_nothing() {
    let (_dir, store) = open();
    for (i, from) in ApprovalState::ALL.into_iter().enumerate() {
        for event in [
            Transition::Decide,
            Transition::Expire,
            Transition::Ack,
            Transition::Prune,
            Transition::Cancel,
        ] {
            if from.apply(event).is_ok() {
                continue;
            }
            let id = format!("r-{i}-{event}");
            let before = in_state(&store, &id, from).await;
            let audit_before = actions(&store, &id);
            let decision_id = before
                .decision
                .as_ref()
                .map(|d| d.decision_id.clone())
                .unwrap_or_default();
            let err = match event {
                // A different decision than any held (edit with fresh args).
                Transition::Decide => {
                    let mut d = NewDecision::person(DecisionKind::Edit, "zed");
                    d.args = json!({"other": true});
                    store.resolve_request(&id, d).await.map(|_| ())
                }
                Transition::Expire => store.expire(&id).await.map(|_| ()),
                Transition::Ack => store.ack_result(&id, &decision_id).await.map(|_| ()),
                Transition::Prune => store.prune_result(&id).await.map(|_| ()),
                Transition::Cancel => store.cancel(&id, "runner", "x").await.map(|_| ()),
            }
            .expect_err(&format!("{from} --{event}--> must be refused"));
            assert_eq!(
                err.code(),
                Code::FailedPrecondition,
                "{from} {event}: {err}"
            );
            if event != Transition::Decide || from == ApprovalState::Cancelled {
                assert!(
                    matches!(&err, Error::InvalidTransition { source, .. }
                        if source.from == from && source.event == event),
                    "{from} {event}: {err:?}"
                );
            }
            assert_eq!(
                current(&store, &id),
                before,
                "{from} {event} changed the record"
            );
            assert_eq!(actions(&store, &id), audit_before);
        }
    }
}

#[tokio::test]
async fn unknown_ids_are_not_found() {
    let (_dir, store) = open();
    let err = store
        .resolve_request("nope", approve("a"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        store.expire("nope").await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        store.ack_result("nope", "d").await.unwrap_err().code(),
        Code::NotFound
    );
    assert!(store.get("nope").unwrap().is_none());
}

#[tokio::test]
async fn cancel_run_withdraws_what_the_run_can_still_abandon() {
    let (_dir, store) = open();
    in_state(&store, "pending", ApprovalState::Pending).await;
    in_state(&store, "resolved", ApprovalState::Resolved).await;
    in_state(&store, "acked", ApprovalState::Acked).await;
    store
        .put_request(request("other-run", "run-2"), None)
        .await
        .unwrap();
    let changed = store
        .cancel_run("run-1", "runner", "run cancelled")
        .await
        .unwrap();
    let mut ids: Vec<_> = changed.iter().map(|a| a.id().to_string()).collect();
    ids.sort();
    assert_eq!(ids, vec!["pending", "resolved"]);
    assert_eq!(current(&store, "pending").cancel_reason, "run cancelled");
    assert_eq!(current(&store, "acked").state, ApprovalState::Acked);
    assert_eq!(current(&store, "other-run").state, ApprovalState::Pending);
    assert!(store.undelivered().unwrap().is_empty());
    // A decision on a cancelled approval is refused, even the one it held.
    let err = store
        .resolve_request("resolved", approve("ana"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn everything_answered_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(dir.path()).unwrap();
        let mut r = request("r1", "run-1");
        r.deadline_ms = now_ms() + 3_600_000;
        store.put_request(r, None).await.unwrap();
        in_state(&store, "r2", ApprovalState::Resolved).await;
    }
    let store = reopen(dir.path()).await;
    assert_eq!(current(&store, "r1").state, ApprovalState::Pending);
    assert_eq!(store.next_deadline().unwrap().unwrap().1, "r1");
    assert_eq!(current(&store, "r2").state, ApprovalState::Resolved);
    assert_eq!(store.undelivered().unwrap()[0].id(), "r2");
    assert_eq!(actions(&store, "r2").len(), 2);
}

/// PENDING approvals by a pass over every approval: what the stored count must equal.
fn pending_by_scan(store: &SledStore) -> u64 {
    let filter = Filter {
        states: vec![ApprovalState::Pending],
        ..Filter::default()
    };
    store
        .list(&filter, 1000, None, now_ms())
        .unwrap()
        .items
        .len() as u64
}

#[tokio::test]
async fn the_pending_count_moves_with_every_transition_and_is_rebuilt_for_an_old_store() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(store.pending_count().unwrap(), 0);
        for state in [
            ApprovalState::Pending,
            ApprovalState::Resolved,
            ApprovalState::Expired,
            ApprovalState::Acked,
            ApprovalState::Pruned,
            ApprovalState::Cancelled,
        ] {
            in_state(&store, &format!("{state:?}"), state).await;
            in_state(&store, &format!("{state:?}-2"), state).await;
        }
        // A repeated request and a refused decision change nothing.
        store
            .put_request(tool("Pending", "run-1"), None)
            .await
            .unwrap();
        store
            .resolve_request("Resolved", NewDecision::person(DecisionKind::Reject, "bo"))
            .await
            .unwrap_err();
        assert_eq!(store.pending_count().unwrap(), 2);
        assert_eq!(pending_by_scan(&store), 2);
        store
            .cancel_run("run-1", "runner", "run cancelled")
            .await
            .unwrap();
        assert_eq!(store.pending_count().unwrap(), 0);
        assert_eq!(pending_by_scan(&store), 0);
        store
            .put_request(tool("late", "run-2"), None)
            .await
            .unwrap();
    }
    // What an older release left behind: the approvals, no count.
    {
        let db = support::eventually("the database to reopen", support::WAIT, || async {
            arbor_shared::sled_backend::sled_config(dir.path(), 8 << 20)
                .open()
                .ok()
        })
        .await;
        let meta = db.open_tree("meta").unwrap();
        assert!(meta.remove(b"count/pending").unwrap().is_some());
        meta.flush().unwrap();
    }
    let store = reopen(dir.path()).await;
    assert_eq!(store.pending_count().unwrap(), 1);
    assert_eq!(pending_by_scan(&store), 1);
}

/// sled lets go of its lock from a background thread; wait for it like a restart would.
async fn reopen(path: &std::path::Path) -> SledStore {
    support::eventually("the store to reopen", support::WAIT, || async {
        SledStore::open(path).ok()
    })
    .await
}

#[tokio::test]
async fn list_filters_and_pages_in_creation_order() {
    let (_dir, store) = open();
    for i in 0..7 {
        let run = if i % 2 == 0 { "even" } else { "odd" };
        store
            .put_request(tool(&format!("r{i}"), run), None)
            .await
            .unwrap();
    }
    store.resolve_request("r0", approve("a")).await.unwrap();
    let filter = Filter {
        run_id: "even".into(),
        states: vec![ApprovalState::Pending],
        ..Default::default()
    };
    let first = store.list(&filter, 2, None, now_ms()).unwrap();
    let ids: Vec<_> = first.items.iter().map(|a| a.id().to_string()).collect();
    assert_eq!(ids, vec!["r2", "r4"]);
    let second = store
        .list(&filter, 2, first.next.as_deref(), now_ms())
        .unwrap();
    assert_eq!(second.items.len(), 1);
    assert_eq!(second.items[0].id(), "r6");
    assert!(second.next.is_none());
    let old = Filter {
        min_age_ms: 3_600_000,
        ..Default::default()
    };
    assert!(
        store
            .list(&old, 10, None, now_ms())
            .unwrap()
            .items
            .is_empty()
    );
}
