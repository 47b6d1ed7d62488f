//! ApprovalService over real gRPC on 127.0.0.1:0: listing with filters and pages, decisions and
//! their errors, bulk decisions, watching, the audit log, permissions per role with
//! authentication on, the self-approval rule, health and shutdown.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use arbor_shared::{
    auth::{Authenticator, hash_token},
    json::to_proto_value,
    proto::{
        approval::v1::{self as pb, ApprovalState, ChangeKind},
        runner::v1::DecisionKind,
    },
    status::field_violations,
};
use serde_json::json;
use support::*;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

struct Env {
    _dir: tempfile::TempDir,
    runner: FakeRunner,
    svc: Svc,
    client: Client,
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let svc = Svc::start(config(dir.path(), &runner.url())).await;
    let client = svc.client().await;
    Env {
        _dir: dir,
        runner,
        svc,
        client,
    }
}

/// Pushes requests through the runner and waits until the last one is stored.
async fn seed(e: &Env, requests: Vec<arbor_shared::proto::runner::v1::ApprovalRequested>) {
    let last = requests.last().unwrap().request_id.clone();
    for r in requests {
        e.runner.push_request(r);
    }
    wait_for(&e.client, &last, "seeded", |_| true).await;
}

async fn list(
    client: &mut Client,
    filter: pb::ApprovalFilter,
    size: u32,
    token: &str,
) -> pb::ListApprovalsResponse {
    client
        .list_approvals(pb::ListApprovalsRequest {
            filter: Some(filter),
            page_size: size,
            page_token: token.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

fn ids(approvals: &[pb::Approval]) -> Vec<&str> {
    approvals.iter().map(|a| a.request_id.as_str()).collect()
}

#[tokio::test]
async fn list_filters_and_paginates() {
    let mut e = env().await;
    let mut other_tree = node_request("n2", "run-b");
    other_tree.tree_id = "billing".into();
    seed(
        &e,
        vec![
            tool_request("t1", "run-a", "ledger.append"),
            tool_request("t2", "run-a", "search.web"),
            node_request("n1", "run-a"),
            tool_request("t3", "run-b", "ledger.close"),
            other_tree,
        ],
    )
    .await;
    let c = &mut e.client;
    let all = list(c, Default::default(), 0, "").await;
    assert_eq!(ids(&all.approvals), vec!["t1", "t2", "n1", "t3", "n2"]);
    assert!(all.next_page_token.is_empty());

    let run_a = pb::ApprovalFilter {
        run_id: "run-a".into(),
        ..Default::default()
    };
    assert_eq!(
        ids(&list(c, run_a, 0, "").await.approvals),
        vec!["t1", "t2", "n1"]
    );
    let ledger = pb::ApprovalFilter {
        tool_name: "ledger.*".into(),
        ..Default::default()
    };
    assert_eq!(
        ids(&list(c, ledger, 0, "").await.approvals),
        vec!["t1", "t3"]
    );
    let billing = pb::ApprovalFilter {
        tree_id: "billing".into(),
        ..Default::default()
    };
    assert_eq!(ids(&list(c, billing, 0, "").await.approvals), vec!["n2"]);
    let thread = pb::ApprovalFilter {
        thread_id: "thread-run-b".into(),
        ..Default::default()
    };
    assert_eq!(
        ids(&list(c, thread, 0, "").await.approvals),
        vec!["t3", "n2"]
    );

    c.resolve(resolve_req("t2", DecisionKind::Approve))
        .await
        .unwrap();
    let pending = pb::ApprovalFilter {
        states: vec![ApprovalState::Pending as i32],
        ..Default::default()
    };
    assert_eq!(
        ids(&list(c, pending, 0, "").await.approvals),
        vec!["t1", "n1", "t3", "n2"]
    );
    let old = pb::ApprovalFilter {
        min_age_ms: 3_600_000,
        ..Default::default()
    };
    assert!(list(c, old, 0, "").await.approvals.is_empty());
    let recent = pb::ApprovalFilter {
        max_age_ms: 3_600_000,
        ..Default::default()
    };
    assert_eq!(list(c, recent, 0, "").await.approvals.len(), 5);

    // Pages of two, then one; page sizes above the maximum are clamped, not refused.
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = list(c, Default::default(), 2, &token).await;
        seen.extend(page.approvals.iter().map(|a| a.request_id.clone()));
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!((pages, seen.len()), (3, 5));
    assert_eq!(
        list(c, Default::default(), 5000, "").await.approvals.len(),
        5
    );

    for (filter, token, field) in [
        (
            pb::ApprovalFilter {
                tool_name: "a[".into(),
                ..Default::default()
            },
            "",
            "filter.tool_name",
        ),
        (
            pb::ApprovalFilter {
                states: vec![99],
                ..Default::default()
            },
            "",
            "filter.states",
        ),
        (Default::default(), "not-a-token", "page_token"),
    ] {
        let err = c
            .list_approvals(pb::ListApprovalsRequest {
                filter: Some(filter),
                page_size: 0,
                page_token: token.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(field_violations(&err)[0].field, field);
    }
    e.svc.stop().await;
}

#[tokio::test]
async fn resolve_paths_and_errors() {
    let mut e = env().await;
    seed(
        &e,
        vec![
            node_request("gate", "run-1"),
            tool_request("tool", "run-1", "ledger.append"),
        ],
    )
    .await;
    let c = &mut e.client;

    let first = c
        .resolve(pb::ResolveRequest {
            reason: "ship it".into(),
            ..resolve_req("gate", DecisionKind::Approve)
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!first.duplicate);
    let approval = first.approval.unwrap();
    assert_eq!(approval.state, ApprovalState::Resolved as i32);
    let decision = approval.decision.unwrap();
    assert_eq!(
        (decision.decided_by.as_str(), decision.reason.as_str()),
        ("anonymous", "ship it")
    );

    let again = c
        .resolve(resolve_req("gate", DecisionKind::Approve))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate);
    assert_eq!(
        again.approval.unwrap().decision.unwrap().decision_id,
        decision.decision_id
    );

    let err = c
        .resolve(resolve_req("gate", DecisionKind::Reject))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("first decision stands"),
        "{}",
        err.message()
    );

    // EDIT needs the runner to allow it and needs args; RESPOND needs a result.
    seed(&e, vec![node_request("gate2", "run-1")]).await;
    let c = &mut e.client;
    let edit = |id: &str| pb::ResolveRequest {
        args: Some(to_proto_value(&json!({"replicas": 1}))),
        ..resolve_req(id, DecisionKind::Edit)
    };
    let err = c.resolve(edit("gate2")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    let cases = [
        (resolve_req("tool", DecisionKind::Edit), "args"),
        (resolve_req("tool", DecisionKind::Respond), "result"),
        (resolve_req("tool", DecisionKind::Unspecified), "decision"),
        (resolve_req("", DecisionKind::Approve), "request_id"),
        (resolve_req("to\0ol", DecisionKind::Approve), "request_id"),
        (
            pb::ResolveRequest {
                args: Some(to_proto_value(&json!(1))),
                ..resolve_req("tool", DecisionKind::Approve)
            },
            "args",
        ),
    ];
    for (req, field) in cases {
        let err = c.resolve(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert_eq!(field_violations(&err)[0].field, field);
    }
    assert_eq!(
        get(c, "tool").await.state,
        ApprovalState::Pending as i32,
        "bad input changed nothing"
    );
    let err = c
        .resolve(resolve_req("missing", DecisionKind::Approve))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let edited = c
        .resolve(edit("tool"))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let args = arbor_shared::json::from_optional_value(edited.decision.unwrap().args.as_ref());
    assert_eq!(args, json!({"replicas": 1}));
    let err = c
        .get_approval(pb::GetApprovalRequest {
            request_id: "missing".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    e.svc.stop().await;
}

#[tokio::test]
async fn bulk_resolve_by_ids_and_by_filter() {
    let mut e = env().await;
    seed(
        &e,
        vec![
            node_request("a", "run-1"),
            node_request("b", "run-1"),
            node_request("c", "run-2"),
            node_request("d", "run-2"),
        ],
    )
    .await;
    let c = &mut e.client;
    c.resolve(resolve_req("b", DecisionKind::Approve))
        .await
        .unwrap();
    let by_ids = c
        .bulk_resolve(pb::BulkResolveRequest {
            request_ids: vec!["a".into(), "b".into(), "nope".into(), "a".into()],
            decision: DecisionKind::Reject as i32,
            reason: "freeze".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let codes: Vec<(&str, i32)> = by_ids
        .items
        .iter()
        .map(|i| (i.request_id.as_str(), i.code))
        .collect();
    assert_eq!(
        codes,
        vec![
            ("a", 0),
            ("b", Code::FailedPrecondition as i32),
            ("nope", Code::NotFound as i32)
        ]
    );
    assert_eq!(
        by_ids.items[1].approval.as_ref().unwrap().state,
        ApprovalState::Resolved as i32
    );

    let by_filter = c
        .bulk_resolve(pb::BulkResolveRequest {
            filter: Some(pb::ApprovalFilter {
                run_id: "run-2".into(),
                ..Default::default()
            }),
            decision: DecisionKind::Approve as i32,
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ids(&by_filter
            .items
            .iter()
            .filter_map(|i| i.approval.clone())
            .collect::<Vec<_>>()),
        vec!["c"]
    );
    assert_eq!(
        get(c, "d").await.state,
        ApprovalState::Pending as i32,
        "the limit held"
    );

    for req in [
        pb::BulkResolveRequest {
            request_ids: vec!["a".into()],
            filter: Some(Default::default()),
            decision: DecisionKind::Approve as i32,
            ..Default::default()
        },
        pb::BulkResolveRequest {
            decision: DecisionKind::Approve as i32,
            ..Default::default()
        },
        pb::BulkResolveRequest {
            request_ids: vec!["d".into(), "a\0".into()],
            decision: DecisionKind::Approve as i32,
            ..Default::default()
        },
    ] {
        assert_eq!(
            c.bulk_resolve(req).await.unwrap_err().code(),
            Code::InvalidArgument
        );
    }
    e.svc.stop().await;
}

#[tokio::test]
async fn watch_shows_the_snapshot_then_every_change_in_order() {
    let mut e = env().await;
    seed(&e, vec![node_request("old", "run-1")]).await;
    let mut stream = e
        .client
        .watch_approvals(pb::WatchApprovalsRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    let mut next = async || stream.message().await.unwrap().unwrap();
    let first = next().await;
    assert_eq!(first.change, ChangeKind::Snapshot as i32);
    assert_eq!(first.approval.unwrap().request_id, "old");
    assert_eq!(next().await.change, ChangeKind::SnapshotEnd as i32);

    e.runner.push_request(node_request("new", "run-1"));
    let created = next().await;
    assert_eq!(created.change, ChangeKind::Created as i32);
    let a = created.approval.unwrap();
    assert_eq!(
        (a.request_id.as_str(), a.state),
        ("new", ApprovalState::Pending as i32)
    );

    e.client
        .resolve(resolve_req("new", DecisionKind::Approve))
        .await
        .unwrap();
    let updated = next().await;
    assert_eq!(updated.change, ChangeKind::Updated as i32);
    let a = updated.approval.unwrap();
    assert_eq!(
        (a.request_id.as_str(), a.state),
        ("new", ApprovalState::Resolved as i32)
    );
    // Delivery to the runner is the next change of the same approval.
    let delivered = next().await.approval.unwrap();
    assert_eq!(
        (delivered.request_id.as_str(), delivered.delivery_attempts),
        ("new", 1)
    );

    // Shutdown ends the stream with UNAVAILABLE.
    let Env { svc, .. } = e;
    let stop = tokio::spawn(svc.stop());
    let end = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(end.code(), Code::Unavailable);
    stop.await.unwrap();
}

#[tokio::test]
async fn watch_filters_and_reports_leaving_the_filter() {
    let mut e = env().await;
    let pending_only = pb::ApprovalFilter {
        states: vec![ApprovalState::Pending as i32],
        run_id: "run-1".into(),
        ..Default::default()
    };
    let mut stream = e
        .client
        .watch_approvals(pb::WatchApprovalsRequest {
            filter: Some(pending_only),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stream.message().await.unwrap().unwrap().change,
        ChangeKind::SnapshotEnd as i32
    );
    e.runner.push_request(node_request("other", "run-2"));
    e.runner.push_request(node_request("mine", "run-1"));
    let created = stream.message().await.unwrap().unwrap();
    assert_eq!(
        created.approval.unwrap().request_id,
        "mine",
        "other runs are filtered out"
    );
    e.client
        .resolve(resolve_req("mine", DecisionKind::Reject))
        .await
        .unwrap();
    let left = stream.message().await.unwrap().unwrap().approval.unwrap();
    assert_eq!(
        (left.request_id.as_str(), left.state),
        ("mine", ApprovalState::Resolved as i32)
    );
    e.svc.stop().await;
}

#[tokio::test]
async fn audit_log_by_request_and_by_run() {
    let mut e = env().await;
    seed(
        &e,
        vec![node_request("a", "run-1"), node_request("b", "run-1")],
    )
    .await;
    let c = &mut e.client;
    c.resolve(pb::ResolveRequest {
        reason: "no".into(),
        ..resolve_req("a", DecisionKind::Reject)
    })
    .await
    .unwrap();
    let entries = audit_actions(c, "a").await;
    let decided = &entries[1];
    assert_eq!(decided.action, pb::AuditAction::Decided as i32);
    assert_eq!(
        (decided.actor.as_str(), decided.reason.as_str()),
        ("anonymous", "no")
    );
    assert_eq!(decided.decision, DecisionKind::Reject as i32);
    assert_eq!(
        decided.source,
        arbor_shared::proto::runner::v1::DecisionSource::Person as i32
    );
    assert!(decided.time.is_some() && !decided.decision_id.is_empty());

    let by_run = c
        .get_audit_log(pb::GetAuditLogRequest {
            run_id: "run-1".into(),
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_run.entries.len(), 2);
    assert!(!by_run.next_page_token.is_empty());
    let rest = c
        .get_audit_log(pb::GetAuditLogRequest {
            run_id: "run-1".into(),
            page_token: by_run.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!rest.entries.is_empty());
    assert!(rest.entries[0].id > by_run.entries[1].id);

    let neither = c
        .get_audit_log(pb::GetAuditLogRequest::default())
        .await
        .unwrap_err();
    assert_eq!(neither.code(), Code::InvalidArgument);
    let unknown = c
        .get_audit_log(pb::GetAuditLogRequest {
            request_id: "zzz".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    e.svc.stop().await;
}

fn tokens() -> Authenticator {
    let mut text = String::new();
    for (name, role) in [
        ("ana", "approver"),
        ("olga", "operator"),
        ("svc", "service"),
        ("sub", "submitter"),
        ("sam", "approver"),
    ] {
        text.push_str(&format!(
            "[[principal]]\nname = '{name}'\nroles = ['{role}']\ntoken_sha256 = '{}'\n",
            hash_token(&format!("{name}-token"))
        ));
    }
    Authenticator::from_toml(&text).unwrap()
}

#[tokio::test]
async fn permissions_per_role_and_no_self_approval() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let mut cfg = config(dir.path(), &runner.url());
    cfg.auth = tokens();
    let svc = Svc::start(cfg).await;
    // node_request runs are submitted by "sam".
    runner.push_request(node_request("r1", "run-1"));
    runner.push_request(node_request("r2", "run-1"));
    let mut ana = svc.client_as(Some("ana-token")).await;
    wait_for(&ana, "r2", "seeded", |_| true).await;

    let mut anonymous = svc.client_as(None).await;
    let err = anonymous
        .get_approval(pb::GetApprovalRequest {
            request_id: "r1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    for (who, can_read, can_decide) in [
        ("ana", true, true),
        ("olga", true, true),
        ("svc", true, false),
        ("sub", false, false),
    ] {
        let mut c = svc.client_as(Some(&format!("{who}-token"))).await;
        let read = c.list_approvals(pb::ListApprovalsRequest::default()).await;
        assert_eq!(read.is_ok(), can_read, "{who} read");
        let leader = c.get_leader(pb::GetLeaderRequest {}).await;
        assert_eq!(leader.is_ok(), can_read, "{who} asks which replica leads");
        if !can_read {
            assert_eq!(read.unwrap_err().code(), Code::PermissionDenied);
            let watch = c
                .watch_approvals(pb::WatchApprovalsRequest::default())
                .await;
            assert_eq!(watch.unwrap_err().code(), Code::PermissionDenied);
        }
        if !can_decide {
            let err = c
                .resolve(resolve_req("r1", DecisionKind::Approve))
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::PermissionDenied, "{who} decide");
            let err = c
                .bulk_resolve(pb::BulkResolveRequest {
                    request_ids: vec!["r1".into()],
                    decision: DecisionKind::Approve as i32,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::PermissionDenied);
        }
    }

    // sam submitted run-1: an approver role does not let sam decide its approvals.
    let mut sam = svc.client_as(Some("sam-token")).await;
    let err = sam
        .resolve(resolve_req("r1", DecisionKind::Approve))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("submitted"), "{}", err.message());
    let bulk = sam
        .bulk_resolve(pb::BulkResolveRequest {
            request_ids: vec!["r2".into()],
            decision: DecisionKind::Approve as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bulk.items[0].code, Code::PermissionDenied as i32);
    assert_eq!(
        get(&mut ana, "r1").await.state,
        ApprovalState::Pending as i32
    );

    let decided = ana
        .resolve(resolve_req("r1", DecisionKind::Approve))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        decided.approval.unwrap().decision.unwrap().decided_by,
        "ana"
    );
    let call = eventually("delivery", WAIT, || async {
        runner.resolves_for("r1").into_iter().next()
    })
    .await;
    assert_eq!(call.decided_by, "ana");
    svc.stop().await;
}

#[tokio::test]
async fn health_reports_serving_once_started() {
    let e = env().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(e.svc.channel());
    for service in ["", "arbor.approval.v1.ApprovalService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    e.svc.stop().await;
}
