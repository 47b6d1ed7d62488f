//! The ApprovalStore conformance suite, written once against the trait: every lifecycle
//! transition and every illegal one (typed error, right status code, nothing changed), the
//! single-winner decision under concurrency, deadlines and expiry, the delivery outbox, cancel
//! of a run, pruning and retention that keep the audit trail and tombstones, listing and paging,
//! cursors and traces, the pending count, and durability across a reopen.
//!
//! A backend implements [`Backend`] and instantiates every case with [`suite!`]
//! (`tests/store_sled.rs` for sled); each case gets a fresh [`Backend::Place`].

use std::{future::Future, sync::Arc};

use arbor_approval_svc::{
    ApprovalStore, Error,
    approvals::Approvals,
    convert::request_from_event,
    lifecycle::{ApprovalState, Transition},
    model::{Approval, AuditAction, AuditEntry, AuditQuery, Filter, NewDecision},
    policy::Policy,
    store::{Compacted, Consumed, DeliveryOutcome},
};
use arbor_shared::{
    domain::{ApprovalRequest, DecisionKind, DecisionSource, TimeoutAction},
    time::now_ms,
};
use serde_json::json;
use tonic::Code;

use crate::support;

mod counts;
pub use counts::*;
mod governance;
pub use governance::*;
mod webhooks;
pub use webhooks::*;

/// How the suite gets at a backend.
pub trait Backend: 'static {
    type Store: ApprovalStore;
    /// Where one case keeps its data (a directory, a database); gone when dropped.
    type Place;

    /// A fresh, empty place.
    fn place() -> impl Future<Output = Self::Place>;

    /// Opens the store kept in `place`: empty the first time; after an earlier store on it
    /// was dropped, whatever that one answered (a restart).
    fn open(place: &Self::Place) -> impl Future<Output = Self::Store>;
}

/// One `#[tokio::test]` per case for `$backend`. Every case is listed here, next to the cases,
/// so a backend cannot leave one out.
macro_rules! suite {
    ($backend:ty) => {
        $crate::conformance::suite!(@cases $backend;
            put_is_idempotent_and_audited,
            resolve_is_single_winner_and_idempotent,
            edit_and_respond_need_the_runner_to_allow_them,
            nobody_decides_on_a_run_they_submitted,
            concurrent_different_decisions_have_exactly_one_winner,
            expiry_takes_the_on_timeout_decision,
            next_deadline_is_the_earliest_pending_one,
            the_outbox_holds_a_decision_until_it_is_delivered_once,
            the_outbox_lists_every_waiting_decision_oldest_first,
            delivery_ack_and_prune_keep_the_audit_and_a_tombstone,
            ack_and_prune_is_one_step,
            every_illegal_transition_is_refused_and_changes_nothing,
            unknown_ids_are_not_found,
            several_approvals_are_read_at_once_in_the_order_asked,
            the_named_decisions_awaiting_delivery_are_read_with_their_traces,
            cancel_run_withdraws_what_the_run_can_still_abandon,
            the_runs_to_cancel_hold_every_run_with_something_to_cancel,
            everything_answered_survives_a_reopen,
            the_pending_count_moves_with_every_transition,
            list_filters_and_pages_in_creation_order,
            counts_agree_with_the_listing_and_stop_at_their_limit,
            the_audit_trail_pages_by_request_and_by_run,
            a_run_s_trail_read_while_it_grows_skips_nothing,
            cursor_and_traces_are_remembered,
            final_approvals_and_their_audit_go_the_rest_stays,
            compaction_of_many_keeps_the_survivors_between,
            a_decision_whose_caller_went_away_is_published,
            a_batch_of_requests_is_stored_in_order_with_its_traces,
            a_batch_of_consumptions_acks_and_prunes_each,
            a_consumption_records_the_delivery_it_carries,
            a_batch_of_requests_is_decided_by_the_policy_as_one_at_a_time,
            delivery_attempts_recorded_together_are_each_booked,
            a_batch_of_decisions_is_taken_as_one_at_a_time,
            text_with_nul_characters_is_kept_as_given,
            two_of_a_group_decide_once_and_the_submitter_is_not_one,
            a_veto_or_counted_rejections_decide_reject,
            a_stage_too_small_for_its_quorum_rejects_at_once,
            a_stage_deadline_escalates_to_the_next_stage,
            a_delegate_fills_the_delegators_seat,
            a_claim_held_by_another_is_refused,
            an_edit_makes_votes_stale_and_a_stale_digest_changes_nothing,
            sixteen_voters_at_once_decide_once,
            webhooks_are_queued_with_their_change_and_only_with_it,
        );
    };
    (@cases $backend:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let place = <$backend as $crate::conformance::Backend>::place().await;
                $crate::conformance::$case::<$backend>(&place).await;
            }
        )*
    };
}
pub(crate) use suite;

pub fn request(id: &str, run: &str) -> ApprovalRequest {
    request_from_event(&support::node_request(id, run))
        .unwrap()
        .0
}

/// A tool-call request that allows every decision.
pub fn tool(id: &str, run: &str) -> ApprovalRequest {
    request_from_event(&support::tool_request(id, run, "ledger.append"))
        .unwrap()
        .0
}

fn approve(by: &str) -> NewDecision {
    NewDecision::person(DecisionKind::Approve, by)
}

fn actions<S: ApprovalStore>(store: &S, id: &str) -> Vec<AuditAction> {
    store
        .audit(&AuditQuery::Request(id.into()), 100, None)
        .unwrap()
        .items
        .iter()
        .map(|e| e.action)
        .collect()
}

fn current<S: ApprovalStore>(store: &S, id: &str) -> Approval {
    store.get(id).unwrap().unwrap()
}

/// The trail of an approval decided, delivered and consumed.
const CONSUMED: [AuditAction; 5] = [
    AuditAction::Requested,
    AuditAction::Decided,
    AuditAction::Delivered,
    AuditAction::Acked,
    AuditAction::Pruned,
];

fn ids(approvals: &[Approval]) -> Vec<String> {
    approvals.iter().map(|a| a.id().to_string()).collect()
}

/// Brings a fresh tool request `id` of `run-1` into `state` through legal moves only.
pub async fn in_state<S: ApprovalStore>(store: &S, id: &str, state: ApprovalState) -> Approval {
    store.put_request(tool(id, "run-1"), None).await.unwrap();
    match state {
        ApprovalState::Pending => {}
        ApprovalState::Resolved => {
            store.resolve_request(id, approve("ana")).await.unwrap();
        }
        ApprovalState::Expired => {
            store.expire(id).await.unwrap();
        }
        ApprovalState::Acked | ApprovalState::Pruned => {
            let d = store
                .resolve_request(id, approve("ana"))
                .await
                .unwrap()
                .approval
                .decision
                .unwrap();
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

/// PENDING approvals by a pass over every approval: what the stored count must equal.
pub fn pending_by_scan<S: ApprovalStore>(store: &S) -> u64 {
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

pub async fn put_is_idempotent_and_audited<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let put = store
        .put_request(request("r1", "run-1"), None)
        .await
        .unwrap();
    assert!(put.created);
    assert_eq!(put.approval.state, ApprovalState::Pending);
    assert_eq!(put.approval.version, 1);
    assert_eq!(put.approval.unknown_kind, None);
    let again = store
        .put_request(request("r1", "run-1"), None)
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.approval, put.approval);
    assert_eq!(current(&store, "r1"), put.approval);
    assert_eq!(actions(&store, "r1"), vec![AuditAction::Requested]);

    // An unknown kind is kept with the record; the lazy put is idempotent too.
    let odd = store
        .put_request_lazy(request("r2", "run-1"), Some(99))
        .await
        .unwrap();
    assert!(odd.created);
    assert_eq!(odd.approval.unknown_kind, Some(99));
    let odd_again = store
        .put_request_lazy(request("r2", "run-1"), None)
        .await
        .unwrap();
    assert!(!odd_again.created);
    assert_eq!(odd_again.approval, odd.approval);
    assert_eq!(actions(&store, "r2"), vec![AuditAction::Requested]);
}

pub async fn resolve_is_single_winner_and_idempotent<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    let first = store
        .resolve_request("r1", approve("ana").with_reason("looks fine"))
        .await
        .unwrap();
    assert!(!first.duplicate);
    let d = first.approval.decision.clone().unwrap();
    assert_eq!(first.approval.state, ApprovalState::Resolved);
    assert_eq!(first.approval.version, 2);
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

pub async fn edit_and_respond_need_the_runner_to_allow_them<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
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
    assert_eq!(actions(&store, "gate"), vec![AuditAction::Requested]);

    store.put_request(tool("t", "run-1"), None).await.unwrap();
    let r = store.resolve_request("t", edit).await.unwrap();
    assert_eq!(
        r.approval.decision.unwrap().runner_result(),
        json!({"replicas": 1})
    );
}

/// A decision that may not come from the run's submitter (`sam` here) is refused when it does,
/// and changes nothing; the check is in the decision's transaction.
pub async fn nobody_decides_on_a_run_they_submitted<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    store.put_request(tool("t", "run-1"), None).await.unwrap();
    let before = current(&store, "t");
    let own = NewDecision {
        not_by_submitter: true,
        ..approve("sam")
    };
    let err = store.resolve_request("t", own.clone()).await.unwrap_err();
    assert!(matches!(err, Error::OwnRun { .. }), "{err:?}");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(current(&store, "t"), before);
    assert_eq!(actions(&store, "t"), vec![AuditAction::Requested]);
    // Unknown ids stay NOT_FOUND.
    let err = store
        .resolve_request("nope", own.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // Someone else may; the decision stands, and the submitter cannot repeat it either.
    let other = NewDecision {
        not_by_submitter: true,
        ..approve("ana")
    };
    let r = store.resolve_request("t", other).await.unwrap();
    assert_eq!(r.approval.state, ApprovalState::Resolved);
    let err = store.resolve_request("t", own).await.unwrap_err();
    assert!(matches!(err, Error::OwnRun { .. }), "{err:?}");
    // Without the check (authentication off) the submitter's name is nobody in particular.
    store.put_request(tool("u", "run-2"), None).await.unwrap();
    let r = store.resolve_request("u", approve("sam")).await.unwrap();
    assert_eq!(r.approval.decision.unwrap().decided_by, "sam");
}

/// The look at the runs that end together never leaves out one that holds an approval its
/// cancel would change; a run it leaves out has nothing to cancel.
pub async fn the_runs_to_cancel_hold_every_run_with_something_to_cancel<B: Backend>(
    place: &B::Place,
) {
    let store = B::open(place).await;
    // run-1: pending; run-r: resolved; run-e: expired; run-c: consumed (ACKED, PRUNED);
    // run-x: cancelled; run-0: none at all.
    in_state(&store, "p", ApprovalState::Pending).await;
    for (id, run) in [("r", "run-r"), ("c", "run-c"), ("x", "run-x")] {
        store.put_request(tool(id, run), None).await.unwrap();
    }
    store.resolve_request("r", approve("ana")).await.unwrap();
    let held = store
        .resolve_request("c", approve("ana"))
        .await
        .unwrap()
        .approval
        .decision
        .unwrap()
        .decision_id;
    store
        .ack_and_prune(Consumed::new("c", &held))
        .await
        .unwrap();
    store.cancel("x", "runner", "withdrawn").await.unwrap();
    let mut expiring = tool("e", "run-e");
    expiring.deadline_ms = 1;
    store.put_request(expiring, None).await.unwrap();
    store.expire("e").await.unwrap();

    let runs: Vec<String> = ["run-1", "run-r", "run-e", "run-c", "run-x", "run-0"]
        .map(String::from)
        .into();
    let answer = store.runs_to_cancel(&runs).unwrap();
    for open in ["run-1", "run-r", "run-e"] {
        assert!(answer.contains(open), "{open} left out of {answer:?}");
    }
    for run in runs.iter().filter(|r| !answer.contains(*r)) {
        let changed = store.cancel_run(run, "runner", "ended").await.unwrap();
        assert!(changed.is_empty(), "{run} was left out but had {changed:?}");
    }
    assert!(store.runs_to_cancel(&[]).unwrap().is_empty());
}

pub async fn concurrent_different_decisions_have_exactly_one_winner<B: Backend>(place: &B::Place) {
    let store = Arc::new(B::open(place).await);
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
    assert_eq!(current(&*store, "r1"), winners[0]);
    let decided = actions(&*store, "r1")
        .into_iter()
        .filter(|a| *a == AuditAction::Decided)
        .count();
    assert_eq!(decided, 1);
}

pub async fn expiry_takes_the_on_timeout_decision<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
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

    // A person's decision after expiry does not override the timeout's.
    let err = store
        .resolve_request("late", approve("ana"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(
        current(&store, "late").decision.unwrap().source,
        DecisionSource::Timeout
    );
}

pub async fn next_deadline_is_the_earliest_pending_one<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    assert_eq!(store.next_deadline().unwrap(), None);
    let base = now_ms() + 3_600_000;
    // No deadline (0) never shows; the others in deadline order, not arrival order.
    store
        .put_request(request("none", "run-1"), None)
        .await
        .unwrap();
    for (id, at) in [
        ("third", base + 3),
        ("first", base + 1),
        ("second", base + 2),
    ] {
        let mut r = tool(id, "run-1");
        r.deadline_ms = at;
        store.put_request(r, None).await.unwrap();
    }
    assert_eq!(
        store.next_deadline().unwrap(),
        Some((base + 1, "first".into()))
    );
    store
        .resolve_request("first", approve("ana"))
        .await
        .unwrap();
    assert_eq!(
        store.next_deadline().unwrap(),
        Some((base + 2, "second".into()))
    );
    store.cancel("second", "runner", "x").await.unwrap();
    assert_eq!(
        store.next_deadline().unwrap(),
        Some((base + 3, "third".into()))
    );
    store.expire("third").await.unwrap();
    assert_eq!(store.next_deadline().unwrap(), None);
}

pub async fn the_outbox_holds_a_decision_until_it_is_delivered_once<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    store.put_request(tool("r2", "run-1"), None).await.unwrap();
    // Nothing to deliver while pending; delivery bookkeeping for it changes nothing.
    assert!(store.undelivered().unwrap().is_empty());
    let before = current(&store, "r1");
    assert_eq!(
        store
            .record_delivery("r1", "no-decision", DeliveryOutcome::Accepted)
            .await
            .unwrap(),
        None
    );
    assert_eq!(current(&store, "r1"), before);

    let d1 = store
        .resolve_request("r1", approve("ana"))
        .await
        .unwrap()
        .approval
        .decision
        .unwrap();
    store.expire("r2").await.unwrap();
    let mut waiting = ids(&store.undelivered().unwrap());
    waiting.sort();
    assert_eq!(waiting, ["r1", "r2"]);

    // A failed attempt is counted and keeps it in the outbox.
    let failed = store
        .record_delivery(
            "r1",
            &d1.decision_id,
            DeliveryOutcome::Failed("UNAVAILABLE".into()),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.delivery_attempts, 1);
    assert_eq!(failed.last_delivery_error, "UNAVAILABLE");
    assert_eq!(failed.delivered_at_ms, 0);
    assert_eq!(ids(&store.undelivered().unwrap()).len(), 2);

    // Another decision id than the one held is not this approval's delivery.
    assert_eq!(
        store
            .record_delivery("r1", "stale", DeliveryOutcome::Accepted)
            .await
            .unwrap(),
        None
    );
    assert_eq!(current(&store, "r1"), failed);

    let accepted = store
        .record_delivery("r1", &d1.decision_id, DeliveryOutcome::Accepted)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(accepted.delivery_attempts, 2);
    assert!(accepted.delivered_at_ms > 0 && accepted.last_delivery_error.is_empty());
    assert_eq!(accepted.state, ApprovalState::Resolved);
    assert_eq!(ids(&store.undelivered().unwrap()), ["r2"]);

    // Once accepted it is not delivered again, and is audited once.
    assert_eq!(
        store
            .record_delivery("r1", &d1.decision_id, DeliveryOutcome::Accepted)
            .await
            .unwrap(),
        None
    );
    assert_eq!(current(&store, "r1"), accepted);
    let delivered = actions(&store, "r1")
        .into_iter()
        .filter(|a| *a == AuditAction::Delivered)
        .count();
    assert_eq!(delivered, 1);
}

/// More decisions waiting than a store reads at once: every one is listed, oldest first, and
/// a delivered one no longer is.
pub async fn the_outbox_lists_every_waiting_decision_oldest_first<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let all: Vec<String> = (0..150).map(|i| format!("d{i:03}")).collect();
    let mut held = Vec::new();
    for id in &all {
        store.put_request(tool(id, "run-1"), None).await.unwrap();
    }
    for id in &all {
        let resolved = store.resolve_request(id, approve("ana")).await.unwrap();
        held.push(resolved.approval.decision.unwrap().decision_id);
    }
    assert_eq!(ids(&store.undelivered().unwrap()), all);
    // Every other one of the first hundred is delivered.
    for i in (0..100).step_by(2) {
        store
            .record_delivery(&all[i], &held[i], DeliveryOutcome::Accepted)
            .await
            .unwrap()
            .unwrap();
    }
    let waiting: Vec<String> = (0..150)
        .filter(|i| *i >= 100 || i % 2 == 1)
        .map(|i| all[i].clone())
        .collect();
    assert_eq!(ids(&store.undelivered().unwrap()), waiting);
}

pub async fn delivery_ack_and_prune_keep_the_audit_and_a_tombstone<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
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
    assert_eq!(actions(&store, "r1"), CONSUMED);

    // A late duplicate APPROVAL_REQUESTED does not bring the request back.
    let late = store.put_request(tool("r1", "run-1"), None).await.unwrap();
    assert!(!late.created);
    assert_eq!(late.approval.state, ApprovalState::Pruned);
    assert!(late.approval.request.tool_args.is_null());
    // Nor does a late repeat of the decision it held: a duplicate, nothing changes.
    let repeat = store.resolve_request("r1", {
        let mut r = NewDecision::person(DecisionKind::Respond, "bo");
        r.result = json!({"receipt": "manual"});
        r
    });
    let repeat = repeat.await.unwrap();
    assert!(repeat.duplicate);
    assert_eq!(repeat.approval.state, ApprovalState::Pruned);
    assert_eq!(actions(&store, "r1").len(), 5);
}

pub async fn ack_and_prune_is_one_step<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    // From PENDING nothing can be acked: refused, nothing changes.
    let pending = in_state(&store, "p", ApprovalState::Pending).await;
    let err = store
        .ack_and_prune(Consumed::new("p", "d"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTransition { .. }), "{err:?}");
    assert_eq!(current(&store, "p"), pending);

    let resolved = in_state(&store, "r", ApprovalState::Resolved).await;
    let held = resolved.decision.clone().unwrap().decision_id;
    // A foreign decision id: neither the ack nor the prune happens.
    let err = store
        .ack_and_prune(Consumed::new("r", "foreign"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DecisionMismatch { .. }), "{err:?}");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(current(&store, "r"), resolved);
    assert_eq!(
        actions(&store, "r"),
        vec![AuditAction::Requested, AuditAction::Decided]
    );

    let (acked, pruned) = store
        .ack_and_prune(Consumed::new("r", &held))
        .await
        .unwrap();
    assert_eq!(acked.state, ApprovalState::Acked);
    assert_eq!(pruned.state, ApprovalState::Pruned);
    assert!(pruned.request.tool_args.is_null());
    assert_eq!(current(&store, "r"), pruned);
    assert_eq!(
        actions(&store, "r"),
        vec![
            AuditAction::Requested,
            AuditAction::Decided,
            AuditAction::Acked,
            AuditAction::Pruned
        ]
    );
    assert!(store.undelivered().unwrap().is_empty());
}

pub async fn every_illegal_transition_is_refused_and_changes_nothing<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let mut refused = 0;
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
            refused += 1;
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
    assert!(refused > 10, "the lifecycle refuses only {refused} moves");
}

pub async fn unknown_ids_are_not_found<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let err = store
        .resolve_request("nope", approve("a"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        store.expire("nope").await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        store.ack_result("nope", "d").await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        store.prune_result("nope").await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        store
            .ack_and_prune(Consumed::new("nope", "d"))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(
        store
            .cancel("nope", "runner", "x")
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert!(store.get("nope").unwrap().is_none());
    assert!(
        store
            .cancel_run("no-run", "runner", "x")
            .await
            .unwrap()
            .is_empty()
    );
}

/// Delivery reads the decisions it is told of by id: of those named, the ones awaiting
/// delivery, oldest first, each with its trace; pending, delivered and unknown ones are left out.
pub async fn the_named_decisions_awaiting_delivery_are_read_with_their_traces<B: Backend>(
    place: &B::Place,
) {
    let store = B::open(place).await;
    let traced = |id: &str| (tool(id, &format!("run-{id}")), None, format!("00-{id}-01"));
    store
        .put_traced_requests(vec![traced("n1"), traced("n2"), traced("n3")])
        .await
        .unwrap();
    store.put_request(tool("n4", "run-n4"), None).await.unwrap();
    for id in ["n1", "n2", "n4"] {
        store.resolve_request(id, approve("ana")).await.unwrap();
    }
    let delivered = current(&store, "n1").decision.unwrap().decision_id;
    store
        .record_delivery("n1", &delivered, DeliveryOutcome::Accepted)
        .await
        .unwrap();
    let named: Vec<String> = ["n4", "gone", "n3", "n1", "n2"].map(String::from).to_vec();
    let found = store.undelivered_of(&named).unwrap();
    let found: Vec<(&str, Option<&str>)> =
        found.iter().map(|(a, t)| (a.id(), t.as_deref())).collect();
    assert_eq!(
        found,
        [("n2", Some("00-n2-01")), ("n4", None)],
        "awaiting delivery, oldest first, with traces"
    );
    let waiting: Vec<String> = ids(&store.undelivered().unwrap());
    assert_eq!(waiting, ["n2", "n4"], "the outbox agrees");
    assert!(store.undelivered_of(&[]).unwrap().is_empty());
}

pub async fn cancel_run_withdraws_what_the_run_can_still_abandon<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    in_state(&store, "pending", ApprovalState::Pending).await;
    in_state(&store, "resolved", ApprovalState::Resolved).await;
    in_state(&store, "expired", ApprovalState::Expired).await;
    let acked = in_state(&store, "acked", ApprovalState::Acked).await;
    let pruned = in_state(&store, "pruned", ApprovalState::Pruned).await;
    store
        .put_request(request("other-run", "run-2"), None)
        .await
        .unwrap();
    let changed = store
        .cancel_run("run-1", "runner", "run cancelled")
        .await
        .unwrap();
    let mut changed_ids = ids(&changed);
    changed_ids.sort();
    assert_eq!(changed_ids, vec!["expired", "pending", "resolved"]);
    assert!(changed.iter().all(|a| a.state == ApprovalState::Cancelled));
    assert_eq!(current(&store, "pending").cancel_reason, "run cancelled");
    assert_eq!(current(&store, "acked"), acked);
    assert_eq!(current(&store, "pruned"), pruned);
    assert_eq!(current(&store, "other-run").state, ApprovalState::Pending);
    assert!(store.undelivered().unwrap().is_empty());
    assert_eq!(store.pending_count().unwrap(), 1);
    let cancelled = store
        .audit(&AuditQuery::Request("resolved".into()), 10, None)
        .unwrap()
        .items;
    let last = cancelled.last().unwrap();
    assert_eq!(
        (last.action, last.actor.as_str(), last.reason.as_str()),
        (AuditAction::Cancelled, "runner", "run cancelled")
    );
    // A decision on a cancelled approval is refused, even the one it held.
    let err = store
        .resolve_request("resolved", approve("ana"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    // Cancelling the run again changes nothing.
    assert!(
        store
            .cancel_run("run-1", "runner", "again")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(current(&store, "pending").cancel_reason, "run cancelled");
}

pub async fn everything_answered_survives_a_reopen<B: Backend>(place: &B::Place) {
    let acked;
    {
        let store = B::open(place).await;
        let mut r = request("r1", "run-1");
        r.deadline_ms = now_ms() + 3_600_000;
        store.put_request(r, None).await.unwrap();
        in_state(&store, "r2", ApprovalState::Resolved).await;
        acked = in_state(&store, "r3", ApprovalState::Acked).await;
        in_state(&store, "r4", ApprovalState::Pruned).await;
        // A lazy put is durable once `flush` answers.
        store
            .put_request_lazy(request("r5", "run-2"), None)
            .await
            .unwrap();
        store.flush().await.unwrap();
    }
    let store = B::open(place).await;
    assert_eq!(current(&store, "r1").state, ApprovalState::Pending);
    assert_eq!(store.next_deadline().unwrap().unwrap().1, "r1");
    assert_eq!(current(&store, "r2").state, ApprovalState::Resolved);
    assert_eq!(ids(&store.undelivered().unwrap()), ["r2"]);
    assert_eq!(actions(&store, "r2").len(), 2);
    assert_eq!(current(&store, "r3"), acked);
    assert_eq!(current(&store, "r4").state, ApprovalState::Pruned);
    assert_eq!(actions(&store, "r4").len(), 4);
    assert_eq!(current(&store, "r5").state, ApprovalState::Pending);
    assert_eq!(store.pending_count().unwrap(), 2);
    // The single winner holds across the restart too.
    let err = store
        .resolve_request("r2", NewDecision::person(DecisionKind::Reject, "bo"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyDecided { .. }), "{err:?}");
    // A known id stays known.
    assert!(
        !store
            .put_request(tool("r4", "run-1"), None)
            .await
            .unwrap()
            .created
    );
}

/// Ends with one PENDING approval ("late", run-2) in `place`.
pub async fn the_pending_count_moves_with_every_transition<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    assert_eq!(store.pending_count().unwrap(), 0);
    for state in ApprovalState::ALL {
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
    assert_eq!(store.pending_count().unwrap(), 1);
    assert_eq!(pending_by_scan(&store), 1);
}

pub async fn list_filters_and_pages_in_creation_order<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
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
    assert_eq!(ids(&first.items), vec!["r2", "r4"]);
    let second = store
        .list(&filter, 2, first.next.as_deref(), now_ms())
        .unwrap();
    assert_eq!(ids(&second.items), vec!["r6"]);
    assert!(second.next.is_none());

    // Everything, in the order it arrived, page by page.
    let mut all = Vec::new();
    let mut token = None;
    loop {
        let page = store
            .list(&Filter::default(), 3, token.as_deref(), now_ms())
            .unwrap();
        assert!(page.items.len() <= 3);
        all.extend(ids(&page.items));
        match page.next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(all, ["r0", "r1", "r2", "r3", "r4", "r5", "r6"]);

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
    let recent = Filter {
        max_age_ms: 3_600_000,
        ..Default::default()
    };
    assert_eq!(
        store.list(&recent, 10, None, now_ms()).unwrap().items.len(),
        7
    );

    // A token that no listing handed out is the caller's mistake, not a storage failure.
    let err = store
        .list(&filter, 2, Some("not-a-token"), now_ms())
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

pub async fn the_audit_trail_pages_by_request_and_by_run<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    in_state(&store, "a", ApprovalState::Pruned).await;
    in_state(&store, "b", ApprovalState::Resolved).await;
    store
        .put_request(request("c", "run-2"), None)
        .await
        .unwrap();
    let about = current(&store, "b");
    let note = store
        .append_audit(
            AuditEntry::about(&about, AuditAction::Delivered, "approval-svc").with_reason("note"),
        )
        .await
        .unwrap();
    assert!(note.id > 0 && note.time_ms > 0);

    let by_request = |id: &str| {
        store
            .audit(&AuditQuery::Request(id.into()), 100, None)
            .unwrap()
            .items
    };
    let b = by_request("b");
    assert_eq!(
        b.iter().map(|e| e.action).collect::<Vec<_>>(),
        [
            AuditAction::Requested,
            AuditAction::Decided,
            AuditAction::Delivered
        ]
    );
    assert_eq!(b.last().unwrap(), &note);
    assert!(b.windows(2).all(|w| w[0].id < w[1].id));
    assert!(b.iter().all(|e| e.request_id == "b" && e.run_id == "run-1"));

    // A run's trail holds its requests' entries, oldest first, page by page.
    let mut run = Vec::new();
    let mut token = None;
    loop {
        let page = store
            .audit(&AuditQuery::Run("run-1".into()), 2, token.as_deref())
            .unwrap();
        assert!(page.items.len() <= 2);
        run.extend(page.items);
        match page.next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(run.len(), by_request("a").len() + b.len());
    assert!(run.windows(2).all(|w| w[0].id < w[1].id));
    assert!(run.iter().all(|e| e.run_id == "run-1"));
    assert_eq!(
        store
            .audit(&AuditQuery::Run("run-2".into()), 100, None)
            .unwrap()
            .items
            .len(),
        1
    );
    assert!(by_request("nope").is_empty());
    let err = store
        .audit(&AuditQuery::Run("run-1".into()), 2, Some("not-a-token"))
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

/// Many decisions on one run's requests at once, while a reader tails the run's trail one
/// entry per page, staying at its head: it moves past an entry only when a next page exists,
/// and never looks behind a page token again. A page token is a position no entry can later
/// appear before, so the reader has seen every entry up to the last one it moved past.
pub async fn a_run_s_trail_read_while_it_grows_skips_nothing<B: Backend>(place: &B::Place) {
    const REQUESTS: usize = 128;
    const WRITERS: usize = 4;
    let store = Arc::new(B::open(place).await);
    let run = AuditQuery::Run("run-w".into());
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..REQUESTS).step_by(WRITERS) {
                    let id = format!("w{i}");
                    store.put_request(tool(&id, "run-w"), None).await.unwrap();
                    store.resolve_request(&id, approve("ana")).await.unwrap();
                }
            })
        })
        .collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::task::spawn_blocking({
        let (store, run, done) = (store.clone(), run.clone(), done.clone());
        move || {
            let (mut passed, mut token) = (Vec::new(), None);
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let page = store.audit(&run, 1, token.as_deref()).unwrap();
                if let (Some(next), Some(entry)) = (page.next, page.items.first()) {
                    passed.push(entry.id);
                    token = Some(next);
                }
            }
            passed
        }
    });
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let passed = reader.await.unwrap();
    let all: Vec<u64> = store
        .audit(&run, 1000, None)
        .unwrap()
        .items
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(all.len(), 2 * REQUESTS, "a Requested and a Decided each");
    let reached = passed.last().copied().unwrap_or(0);
    let before: Vec<u64> = all.iter().copied().filter(|&id| id <= reached).collect();
    let missed: Vec<u64> = before
        .iter()
        .copied()
        .filter(|id| !passed.contains(id))
        .collect();
    assert!(missed.is_empty(), "the reader stepped past {missed:?}");
    assert_eq!(passed, before);
    assert!(
        passed.len() > REQUESTS,
        "the reader kept up: {} passed",
        passed.len()
    );
}

pub async fn cursor_and_traces_are_remembered<B: Backend>(place: &B::Place) {
    {
        let store = B::open(place).await;
        assert_eq!(store.cursor().unwrap(), None);
        assert_eq!(store.cursor_acked_at().unwrap(), None);
        assert_eq!(store.trace("r1").unwrap(), None);
        let before = now_ms();
        store.set_cursor(41).unwrap();
        store.set_cursor(42).unwrap();
        assert_eq!(store.cursor().unwrap(), Some(42));
        let at = store.cursor_acked_at().unwrap().unwrap();
        assert!(at >= before && at <= now_ms(), "{at}");
        store.put_trace("r1", "00-aaaa-bbbb-01").unwrap();
        store.put_request(tool("r1", "run-1"), None).await.unwrap();
        // A replayed event writes the trace again.
        store.put_trace("r1", "00-aaaa-bbbb-01").unwrap();
        assert_eq!(
            store.trace("r1").unwrap().as_deref(),
            Some("00-aaaa-bbbb-01")
        );
        // A request and its trace written together, as the runner's event brings them.
        let put = store
            .put_traced_request(tool("r2", "run-2"), None, "00-cccc-dddd-01")
            .await
            .unwrap();
        assert!(put.created);
        assert_eq!(put.approval.state, ApprovalState::Pending);
        // Replayed: the record is returned unchanged, the trace is written again.
        let again = store
            .put_traced_request(tool("r2", "run-2"), None, "00-cccc-dddd-01")
            .await
            .unwrap();
        assert!(!again.created);
        assert_eq!(again.approval.version, put.approval.version);
        // Without a trace (an event that carried none), nothing is written for it.
        store
            .put_traced_request(tool("r3", "run-3"), None, "")
            .await
            .unwrap();
        store.flush().await.unwrap();
    }
    let store = B::open(place).await;
    assert_eq!(store.cursor().unwrap(), Some(42));
    assert!(store.cursor_acked_at().unwrap().is_some());
    assert_eq!(
        store.trace("r1").unwrap().as_deref(),
        Some("00-aaaa-bbbb-01")
    );
    assert_eq!(
        store.trace("r2").unwrap().as_deref(),
        Some("00-cccc-dddd-01")
    );
    assert_eq!(
        store.get("r2").unwrap().unwrap().state,
        ApprovalState::Pending
    );
    assert_eq!(store.trace("r3").unwrap(), None);
    assert!(store.get("r3").unwrap().is_some());
    assert_eq!(store.trace("r4").unwrap(), None);
    // A decision awaiting delivery is read with its trace, which the delivery carries on.
    for id in ["r3", "r1"] {
        store.resolve_request(id, approve("ana")).await.unwrap();
    }
    let due: Vec<(String, Option<String>)> = store
        .undelivered_traced()
        .unwrap()
        .into_iter()
        .map(|(a, trace)| (a.id().to_string(), trace))
        .collect();
    assert_eq!(
        due,
        [
            ("r1".to_string(), Some("00-aaaa-bbbb-01".to_string())),
            ("r3".to_string(), None)
        ],
        "in order of arrival"
    );
    assert_eq!(ids(&store.undelivered().unwrap()), ["r1", "r3"]);
}

fn audit_len<S: ApprovalStore>(store: &S, query: AuditQuery) -> usize {
    store.audit(&query, 1000, None).unwrap().items.len()
}

fn listed<S: ApprovalStore>(store: &S) -> Vec<String> {
    ids(&store
        .list(&Filter::default(), 1000, None, now_ms())
        .unwrap()
        .items)
}

/// A fresh approval `id` of run `run-1` with a trace, brought into `state` the way the service
/// does (a RESOLVED one delivered, a PRUNED one acked and pruned in one step).
async fn make<S: ApprovalStore>(store: &S, id: &str, state: ApprovalState) {
    store.put_request(tool(id, "run-1"), None).await.unwrap();
    store.put_trace(id, "00-trace-span-01").unwrap();
    let decide = || async {
        store
            .resolve_request(id, approve("ana"))
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
            store.ack_and_prune(Consumed::new(id, &d)).await.unwrap();
        }
        ApprovalState::Cancelled => {
            store.cancel(id, "runner", "run cancelled").await.unwrap();
        }
    }
    assert_eq!(store.get(id).unwrap().unwrap().state, state);
}

/// Retention: final approvals (PRUNED, CANCELLED) past the cutoff go with their audit trail,
/// their index entries and their trace; PENDING, RESOLVED, EXPIRED and delivered-but-unacked
/// approvals stay however old; compaction is idempotent; the store still opens afterwards even
/// when the newest audit entries went.
pub async fn final_approvals_and_their_audit_go_the_rest_stays<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
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
    assert!(doomed_audit > 0);
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
    assert_eq!(store.pending_count().unwrap(), 1);

    // Idempotent: nothing is left to remove, whatever the cutoff.
    assert_eq!(store.compact(now_ms()).await.unwrap(), Compacted::default());
    assert_eq!(
        store.compact(u64::MAX).await.unwrap(),
        Compacted::default(),
        "in-flight approvals stay however old"
    );

    // The newest audit entries (the prune of `pruned`) went; the store must still open
    // (for a backend with an integrity check: progress never goes backwards).
    store.record_progress().await.unwrap();
    drop(store);
    let store = B::open(place).await;
    assert_eq!(listed(&store), ["pending", "resolved", "expired", "acked"]);
    // A request id that comes back is new: it starts PENDING again.
    make(&store, "pruned", ApprovalState::Pending).await;
    assert_eq!(actions(&store, "pruned"), vec![AuditAction::Requested]);
}

pub async fn compaction_of_many_keeps_the_survivors_between<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    // More than one batch of a batching backend, with survivors in between.
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
    let survivors = listed(&store);
    assert_eq!(survivors.len(), 43);
    assert!(
        survivors
            .iter()
            .all(|id| current(&store, id).state == ApprovalState::Pending)
    );
    assert_eq!(store.pending_count().unwrap(), 43);
    assert_eq!(store.compact(now_ms()).await.unwrap(), Compacted::default());
}

/// A decision whose caller goes away while it commits (a client whose connection is cut, or
/// whose deadline passes, drops the RPC) is made whole: stored, shown to watchers and handed to
/// delivery, as stored. Left unpublished, it would wait for the next unrelated wake-up to be delivered,
/// which on a quiet service may never come.
pub async fn a_decision_whose_caller_went_away_is_published<B: Backend>(place: &B::Place) {
    let store = Arc::new(B::open(place).await);
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    let approvals = Approvals::new(store.clone(), Policy::default());
    let mut watched = approvals.subscribe();
    let delivery = approvals.delivery_wake();
    {
        // Polled once, so the decision is on its way to the store; then dropped.
        let mut deciding = std::pin::pin!(approvals.decide("r1", approve("ana")));
        assert!(futures_util::poll!(deciding.as_mut()).is_pending());
    }
    let seen = tokio::time::timeout(support::WAIT, watched.recv())
        .await
        .expect("watchers to be told of the decision")
        .unwrap();
    assert_eq!((seen.id(), seen.state), ("r1", ApprovalState::Resolved));
    tokio::time::timeout(support::WAIT, delivery.notified())
        .await
        .expect("delivery to be woken for the decision");
    let due = delivery.take();
    let handed: Vec<&str> = due.handed.iter().map(|(a, _)| a.id()).collect();
    assert_eq!(handed, ["r1"], "delivery is handed the decision");
    let stored = current(&*store, "r1");
    assert_eq!(stored.state, ApprovalState::Resolved);
    assert_eq!(stored.decision, seen.decision);
    assert_eq!(due.handed[0].0, stored, "handed as stored");
    assert_eq!(
        store.undelivered().unwrap().len(),
        1,
        "waiting to be delivered"
    );
}

/// A batch of the runner's APPROVAL_REQUESTED events is stored as each would be alone, in the
/// batch's order (arrival order is event order), with its traces; a request already stored
/// comes back unchanged, also when it repeats within the batch; the batch survives a reopen.
pub async fn a_batch_of_requests_is_stored_in_order_with_its_traces<B: Backend>(place: &B::Place) {
    {
        let store = B::open(place).await;
        let known = store.put_request(tool("b0", "run-0"), None).await.unwrap();
        let traced = |id: &str, trace: &str| (tool(id, &format!("run-{id}")), None, trace.into());
        let puts = store
            .put_traced_requests(vec![
                traced("b2", "00-b2-01"),
                traced("b0", "00-b0-01"),
                traced("b1", ""),
                (tool("b3", "run-b3"), Some(99), "00-b3-01".into()),
                traced("b2", "00-b2-01"),
            ])
            .await
            .unwrap();
        let ids: Vec<(&str, bool)> = puts.iter().map(|p| (p.approval.id(), p.created)).collect();
        assert_eq!(
            ids,
            vec![
                ("b2", true),
                ("b0", false),
                ("b1", true),
                ("b3", true),
                ("b2", false)
            ]
        );
        assert_eq!(
            puts[1].approval, known.approval,
            "a known request is unchanged"
        );
        assert_eq!(
            puts[4].approval, puts[0].approval,
            "a repeat in the batch too"
        );
        assert_eq!(puts[3].approval.unknown_kind, Some(99));
        assert!(
            puts[0].approval.arrival < puts[2].approval.arrival
                && puts[2].approval.arrival < puts[3].approval.arrival,
            "arrival follows the batch's order: {puts:?}"
        );
        assert!(
            store
                .put_traced_requests(Vec::new())
                .await
                .unwrap()
                .is_empty()
        );
        store.flush().await.unwrap();
    }
    let store = B::open(place).await;
    for id in ["b0", "b1", "b2", "b3"] {
        assert_eq!(current(&store, id).state, ApprovalState::Pending);
        assert_eq!(actions(&store, id), vec![AuditAction::Requested], "{id}");
    }
    assert_eq!(store.trace("b2").unwrap().as_deref(), Some("00-b2-01"));
    assert_eq!(store.trace("b3").unwrap().as_deref(), Some("00-b3-01"));
    assert_eq!(store.trace("b1").unwrap(), None);
    // The known request's trace is written again, as a replayed event's is.
    assert_eq!(store.trace("b0").unwrap().as_deref(), Some("00-b0-01"));
    assert_eq!(store.pending_count().unwrap(), 4);
}

/// A consumption that carries the runner's acceptance of its decision records the delivery
/// first, in the same write, as an accepted `record_delivery` would: DELIVERED ahead of ACKED
/// and PRUNED, `delivered_at_ms` set, the attempt counted, the outbox empty. A delivery that is
/// recorded already is not recorded twice.
pub async fn a_consumption_records_the_delivery_it_carries<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let mut batch = Vec::new();
    for id in ["m1", "m2"] {
        let a = in_state(&store, id, ApprovalState::Resolved).await;
        batch.push(Consumed {
            delivered: true,
            ..Consumed::new(id, a.decision.unwrap().decision_id)
        });
    }
    let recorded = store
        .record_delivery("m2", &batch[1].decision_id, DeliveryOutcome::Accepted)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ids(&store.undelivered().unwrap()), ["m1"]);
    let outcomes = store.ack_and_prune_all(batch).await.unwrap();
    for outcome in outcomes {
        let (acked, pruned) = outcome.unwrap();
        assert_eq!(acked.state, ApprovalState::Acked);
        assert!(acked.delivered_at_ms > 0, "{acked:?}");
        assert_eq!(acked.delivery_attempts, 1, "{acked:?}");
        assert_eq!(pruned.state, ApprovalState::Pruned);
        assert_eq!(&current(&store, pruned.id()), &pruned);
        assert_eq!(actions(&store, pruned.id()), CONSUMED);
    }
    assert_eq!(
        current(&store, "m2").delivered_at_ms,
        recorded.delivered_at_ms,
        "recorded once"
    );
    assert!(store.undelivered().unwrap().is_empty());
}

/// The consumptions of a batch of the runner's events, acked and pruned as each would be alone
/// and answered in order; one that cannot be done (unknown, not the decision held, already
/// pruned) is refused alone and changes nothing, the others are done.
pub async fn a_batch_of_consumptions_acks_and_prunes_each<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    let mut batch = Vec::new();
    for id in ["c1", "c2", "c3"] {
        let a = in_state(&store, id, ApprovalState::Resolved).await;
        batch.push(Consumed::new(id, a.decision.unwrap().decision_id));
    }
    let pairs: Vec<_> = store
        .ack_and_prune_all(batch.clone())
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let ids: Vec<&str> = pairs.iter().map(|(acked, _)| acked.id()).collect();
    assert_eq!(ids, ["c1", "c2", "c3"]);
    for (acked, pruned) in &pairs {
        assert_eq!(acked.state, ApprovalState::Acked);
        assert_eq!(pruned.state, ApprovalState::Pruned);
        assert_eq!(&current(&store, pruned.id()), pruned);
        assert_eq!(
            actions(&store, pruned.id()),
            vec![
                AuditAction::Requested,
                AuditAction::Decided,
                AuditAction::Acked,
                AuditAction::Pruned
            ]
        );
    }
    assert!(
        store
            .ack_and_prune_all(Vec::new())
            .await
            .unwrap()
            .is_empty()
    );

    // A repeat (already pruned), one of another decision and an unknown one are refused alone,
    // changing nothing; the other is done and answered.
    let d4 = in_state(&store, "c4", ApprovalState::Resolved).await;
    let d4 = d4.decision.unwrap().decision_id;
    let d5 = in_state(&store, "c5", ApprovalState::Resolved).await;
    let outcomes = store
        .ack_and_prune_all(vec![
            batch[0].clone(),
            Consumed::new("c5", "another"),
            Consumed::new("c4", d4),
            Consumed::new("c-unknown", "d"),
        ])
        .await
        .unwrap();
    let err = outcomes[0].as_ref().unwrap_err();
    assert!(matches!(err, Error::InvalidTransition { .. }), "{err:?}");
    let err = outcomes[1].as_ref().unwrap_err();
    assert!(matches!(err, Error::DecisionMismatch { .. }), "{err:?}");
    let (_, pruned) = outcomes[2].as_ref().unwrap();
    assert_eq!(pruned.state, ApprovalState::Pruned);
    assert_eq!(&current(&store, "c4"), pruned);
    let err = outcomes[3].as_ref().unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert_eq!(current(&store, "c5"), d5, "a refused one is untouched");
    assert_eq!(
        actions(&store, "c5"),
        vec![AuditAction::Requested, AuditAction::Decided]
    );
}

/// The runner's requests stored in a batch and settled are decided by the policy exactly as
/// one stored and settled alone (whether the store decides them in the same write or the
/// decision follows): a request an `allow` (`deny`) rule matches ends RESOLVED, approved
/// (rejected) by the policy under the rule's name, with its REQUESTED then DECIDED audit
/// entries, watchers told and delivery waiting; one an `ask` rule matches stays PENDING with
/// only REQUESTED; one already stored and still PENDING (a replayed event) is decided too. All
/// of it survives a reopen.
pub async fn a_batch_of_requests_is_decided_by_the_policy_as_one_at_a_time<B: Backend>(
    place: &B::Place,
) {
    let request = |id: &str, tool: &str| {
        request_from_event(&support::tool_request(id, &format!("run-{id}"), tool))
            .unwrap()
            .0
    };
    {
        let store = Arc::new(B::open(place).await);
        store.put_request(tool("p0", "run-p0"), None).await.unwrap();
        let policy = Policy::from_toml(
            "default = 'ask'\n\
             [[tool]]\nname = 'ledger-ok'\ntool = 'ledger.*'\naction = 'allow'\n\
             [[tool]]\nname = 'no-shell'\ntool = 'shell.*'\naction = 'deny'",
        )
        .unwrap();
        let approvals = Approvals::new(store.clone(), policy);
        let mut watched = approvals.subscribe();
        let puts = approvals
            .put_requests(vec![
                (tool("p1", "run-p1"), None, "00-p1-01".into()),
                (request("p2", "search.web"), None, String::new()),
                (request("p3", "shell.exec"), None, String::new()),
                (tool("p0", "run-p0"), None, String::new()),
            ])
            .await
            .unwrap();
        let created: Vec<(&str, bool)> =
            puts.iter().map(|p| (p.approval.id(), p.created)).collect();
        assert_eq!(
            created,
            vec![("p1", true), ("p2", true), ("p3", true), ("p0", false)]
        );
        for put in puts {
            approvals.settle(put).await.unwrap();
        }
        let mut last_seen = std::collections::HashMap::new();
        while let Ok(a) = watched.try_recv() {
            last_seen.insert(a.id().to_string(), a);
        }
        for id in ["p0", "p1", "p3"] {
            let seen = last_seen
                .get(id)
                .unwrap_or_else(|| panic!("{id} not shown"));
            assert_eq!(seen.state, ApprovalState::Resolved, "{id} shown decided");
        }
        let mut due = ids(&store.undelivered().unwrap());
        due.sort();
        assert_eq!(
            due,
            vec!["p0", "p1", "p3"],
            "the decisions wait for delivery"
        );
    }
    let store = B::open(place).await;
    for (id, kind, rule) in [
        ("p0", DecisionKind::Approve, "ledger-ok"),
        ("p1", DecisionKind::Approve, "ledger-ok"),
        ("p3", DecisionKind::Reject, "no-shell"),
    ] {
        let a = current(&store, id);
        assert_eq!(a.state, ApprovalState::Resolved, "{id}");
        let d = a.decision.clone().unwrap();
        assert_eq!(
            (d.kind, d.source, d.rule.as_str()),
            (kind, DecisionSource::Policy, rule),
            "{id}"
        );
        assert!(a.needs_delivery(), "{id}");
        assert_eq!(
            actions(&store, id),
            vec![AuditAction::Requested, AuditAction::Decided],
            "{id}"
        );
    }
    assert_eq!(current(&store, "p2").state, ApprovalState::Pending);
    assert_eq!(actions(&store, "p2"), vec![AuditAction::Requested]);
    assert_eq!(store.trace("p1").unwrap().as_deref(), Some("00-p1-01"));
    assert_eq!(store.pending_count().unwrap(), 1);
}

/// Delivery attempts that finish together are recorded together, each as it would be alone:
/// in the store's batch, an accepted attempt takes its approval out of the outbox with a
/// DELIVERED entry, a failed one is counted and keeps it there, and one for a decision the
/// approval does not hold changes nothing; through [`Approvals`], many attempts at once are
/// each answered, shown to watchers and kept across a reopen.
pub async fn delivery_attempts_recorded_together_are_each_booked<B: Backend>(place: &B::Place) {
    let decided = |store: &Arc<B::Store>, id: &'static str| {
        let store = store.clone();
        async move {
            store.put_request(tool(id, "run-1"), None).await.unwrap();
            let resolved = store.resolve_request(id, approve("ana")).await.unwrap();
            resolved.approval.decision.unwrap().decision_id
        }
    };
    {
        let store = Arc::new(B::open(place).await);
        let (d1, d2) = (decided(&store, "r1").await, decided(&store, "r2").await);
        let before_r3 = {
            decided(&store, "r3").await;
            current(&*store, "r3")
        };
        let recorded = store
            .record_deliveries(vec![
                ("r1".into(), d1, DeliveryOutcome::Accepted),
                (
                    "r2".into(),
                    d2,
                    DeliveryOutcome::Failed("UNAVAILABLE".into()),
                ),
                ("r3".into(), "stale".into(), DeliveryOutcome::Accepted),
            ])
            .await
            .unwrap();
        let recorded: Vec<Option<Approval>> = recorded.into_iter().map(|r| r.unwrap()).collect();
        let r1 = recorded[0].clone().expect("r1 recorded");
        assert!(r1.delivered_at_ms > 0 && !r1.needs_delivery());
        let r2 = recorded[1].clone().expect("r2 recorded");
        assert_eq!((r2.delivery_attempts, r2.delivered_at_ms), (1, 0));
        assert_eq!(r2.last_delivery_error, "UNAVAILABLE");
        assert_eq!(recorded[2], None, "a decision not held is not recorded");
        assert_eq!(current(&*store, "r3"), before_r3);
        let mut due = ids(&store.undelivered().unwrap());
        due.sort();
        assert_eq!(due, vec!["r2", "r3"]);
        assert!(
            store
                .record_deliveries(Vec::new())
                .await
                .unwrap()
                .is_empty()
        );

        // Through the one door: twenty attempts at once, each answered and published.
        let approvals = Approvals::new(store.clone(), Policy::default());
        let mut watched = approvals.subscribe();
        let mut attempts = Vec::new();
        for i in 0..20 {
            let id: &'static str = Box::leak(format!("m{i}").into_boxed_str());
            attempts.push((id, decided(&store, id).await));
        }
        let answers = futures_util::future::join_all(
            attempts
                .iter()
                .map(|(id, d)| approvals.record_delivery(id, d, DeliveryOutcome::Accepted)),
        )
        .await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        let mut shown = Vec::new();
        while let Ok(a) = watched.try_recv() {
            assert!(a.delivered_at_ms > 0, "{a:?}");
            shown.push(a.id().to_string());
        }
        shown.sort();
        let mut expected: Vec<String> = attempts.iter().map(|(id, _)| id.to_string()).collect();
        expected.sort();
        assert_eq!(shown, expected);
        store.flush().await.unwrap();
    }
    let store = B::open(place).await;
    for id in (0..20).map(|i| format!("m{i}")).chain(["r1".into()]) {
        let a = current(&store, &id);
        assert!(a.delivered_at_ms > 0 && !a.needs_delivery(), "{id}");
        assert_eq!(
            actions(&store, &id),
            vec![
                AuditAction::Requested,
                AuditAction::Decided,
                AuditAction::Delivered
            ],
            "{id}"
        );
    }
    assert_eq!(current(&store, "r2").delivery_attempts, 1);
}

/// Decisions taken together are each taken, or refused, as alone, answered in the order given
/// (a decision taken with its request's trace): an unknown id is NOT_FOUND, a decision the request does not allow and one by the run's
/// submitter are refused and change nothing, two different decisions on one approval have one
/// winner, the same one again is a duplicate. Through `Approvals`, decisions asked for at once
/// are each answered and published. All of it survives a reopen.
pub async fn a_batch_of_decisions_is_taken_as_one_at_a_time<B: Backend>(place: &B::Place) {
    {
        let store = Arc::new(B::open(place).await);
        for id in ["d2", "d3"] {
            store.put_request(tool(id, "run-1"), None).await.unwrap();
        }
        store
            .put_traced_request(tool("d1", "run-1"), None, "00-d1-01")
            .await
            .unwrap();
        store
            .put_request(request("gate", "run-1"), None)
            .await
            .unwrap();
        let gate = current(&*store, "gate");
        let mut edit = NewDecision::person(DecisionKind::Edit, "ana");
        edit.args = json!({"replicas": 1});
        let by_submitter = NewDecision {
            not_by_submitter: true,
            ..approve("sam")
        };
        let outcomes = store
            .resolve_requests(vec![
                ("d2".into(), approve("ana").with_reason("fine")),
                ("nope".into(), approve("ana")),
                ("d1".into(), NewDecision::person(DecisionKind::Reject, "bo")),
                ("d2".into(), NewDecision::person(DecisionKind::Reject, "cy")),
                ("gate".into(), edit),
                ("d3".into(), by_submitter),
                ("d1".into(), NewDecision::person(DecisionKind::Reject, "cy")),
            ])
            .await
            .unwrap();
        assert_eq!(outcomes.len(), 7);
        let err = outcomes[1].as_ref().unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err:?}");
        let d1 = outcomes[2].as_ref().unwrap();
        assert!(!d1.duplicate);
        // Each one taken answers its request's trace, when one was stored.
        assert_eq!(d1.traceparent.as_deref(), Some("00-d1-01"));
        assert_eq!(d1.approval.state, ApprovalState::Resolved);
        assert_eq!(
            d1.approval.decision.as_ref().unwrap().kind,
            DecisionKind::Reject
        );
        // d2: one of the two wins, the other is refused; what is stored is the winner.
        let (won, lost) = match (&outcomes[0], &outcomes[3]) {
            (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won, lost),
            other => panic!("two decisions on d2, one winner expected: {other:?}"),
        };
        assert!(matches!(lost, Error::AlreadyDecided { .. }), "{lost:?}");
        assert_eq!(current(&*store, "d2"), won.approval);
        assert_eq!(won.traceparent, None);
        let err = outcomes[4].as_ref().unwrap_err();
        assert!(matches!(err, Error::NotAllowed { .. }), "{err:?}");
        assert_eq!(current(&*store, "gate"), gate);
        let err = outcomes[5].as_ref().unwrap_err();
        assert!(matches!(err, Error::OwnRun { .. }), "{err:?}");
        assert_eq!(current(&*store, "d3").state, ApprovalState::Pending);
        let again = outcomes[6].as_ref().unwrap();
        assert!(again.duplicate, "the same decision again: {again:?}");
        assert_eq!(again.approval, d1.approval);
        assert!(store.resolve_requests(Vec::new()).await.unwrap().is_empty());

        // Through the one door: twenty decisions at once, each answered and published once,
        // and one on an unknown id refused alone.
        let approvals = Approvals::new(store.clone(), Policy::default());
        let mut watched = approvals.subscribe();
        let mut expected = Vec::new();
        for i in 0..20 {
            let id = format!("m{i}");
            store.put_request(tool(&id, "run-2"), None).await.unwrap();
            expected.push(id);
        }
        let asked: Vec<&str> = expected
            .iter()
            .map(String::as_str)
            .chain(["unknown"])
            .collect();
        let answers = futures_util::future::join_all(
            asked.iter().map(|id| approvals.decide(id, approve("ana"))),
        )
        .await;
        for (id, answer) in asked.iter().zip(&answers) {
            match *id {
                "unknown" => assert_eq!(answer.as_ref().unwrap_err().code(), Code::NotFound),
                _ => {
                    let resolved = answer.as_ref().unwrap();
                    assert_eq!(resolved.approval.id(), *id);
                    assert_eq!(resolved.approval.state, ApprovalState::Resolved);
                }
            }
        }
        let mut shown = Vec::new();
        while let Ok(a) = watched.try_recv() {
            assert_eq!(a.state, ApprovalState::Resolved, "{a:?}");
            shown.push(a.id().to_string());
        }
        shown.sort();
        expected.sort();
        assert_eq!(shown, expected);
        store.flush().await.unwrap();
    }
    let store = B::open(place).await;
    for id in (0..20)
        .map(|i| format!("m{i}"))
        .chain(["d1".into(), "d2".into()])
    {
        assert_eq!(current(&store, &id).state, ApprovalState::Resolved, "{id}");
        assert_eq!(
            actions(&store, &id),
            vec![AuditAction::Requested, AuditAction::Decided],
            "{id}"
        );
    }
    for id in ["d3", "gate"] {
        assert_eq!(current(&store, id).state, ApprovalState::Pending, "{id}");
        assert_eq!(actions(&store, id), vec![AuditAction::Requested], "{id}");
    }
}

pub async fn several_approvals_are_read_at_once_in_the_order_asked<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    for id in ["m1", "m2", "m3"] {
        store.put_request(tool(id, "run-m"), None).await.unwrap();
    }
    store.resolve_request("m2", approve("ana")).await.unwrap();
    let asked: Vec<String> = ["m3", "gone", "m1", "m2"].map(String::from).to_vec();
    let read = store.get_many(&asked).unwrap();
    let ids: Vec<&str> = read.iter().map(|a| a.id()).collect();
    assert_eq!(
        ids,
        ["m3", "m1", "m2"],
        "unknown ids left out, the rest in order"
    );
    for a in &read {
        assert_eq!(*a, store.get(a.id()).unwrap().unwrap());
    }
    assert_eq!(read[2].state, ApprovalState::Resolved);
    assert!(store.get_many(&[]).unwrap().is_empty());
}

/// Free text may hold any character, NUL included (a tool's output in a title, a reason pasted
/// from a terminal): a request and its decision are stored, read back, audited and kept across
/// a reopen exactly as given, ids aside (no stored id holds a NUL).
pub async fn text_with_nul_characters_is_kept_as_given<B: Backend>(place: &B::Place) {
    let mut r = tool("r1", "run-1");
    r.title = "deploy \0 now".into();
    r.node_name = "gate\0".into();
    r.submitted_by = "bot\0".into();
    r.context.insert("log".into(), json!("line\0line \\u0000"));
    r.tool_args = json!({"text": "a\0b"});
    let decided;
    {
        let store = B::open(place).await;
        let put = store.put_request(r.clone(), None).await.unwrap();
        assert_eq!(put.approval.request, r);
        assert_eq!(current(&store, "r1"), put.approval);
        let mut edit =
            NewDecision::person(DecisionKind::Edit, "ana\0").with_reason("fine \0 \\u0000");
        edit.args = json!({"text": "c\0d"});
        decided = store.resolve_request("r1", edit).await.unwrap().approval;
        let d = decided.decision.as_ref().unwrap();
        assert_eq!(
            (d.reason.as_str(), d.decided_by.as_str(), &d.args),
            ("fine \0 \\u0000", "ana\0", &json!({"text": "c\0d"}))
        );
        assert_eq!(current(&store, "r1"), decided);
        let trail = store
            .audit(&AuditQuery::Request("r1".into()), 10, None)
            .unwrap()
            .items;
        assert_eq!(trail.len(), 2);
        assert_eq!(
            (trail[1].actor.as_str(), trail[1].reason.as_str()),
            ("ana\0", "fine \0 \\u0000")
        );
    }
    let store = B::open(place).await;
    assert_eq!(current(&store, "r1"), decided);
}
