//! The webhook outbox on every backend: a change queues one message per endpoint that wants
//! its event, in its own transaction; a refused or repeated change queues nothing; messages
//! read back oldest first, keep their ids across a reopen, and go once delivered.

use arbor_approval_svc::{
    ApprovalStore,
    model::NewDecision,
    store::WebhookOutbox,
    webhooks::{EventKind, Routes},
};
use arbor_shared::{
    domain::{DecisionKind, DecisionSource},
    time::now_ms,
};

use super::{Backend, request};

fn routes() -> Routes {
    Routes {
        link_base: "https://inbox.example".into(),
        endpoints: vec![
            (
                "all".into(),
                vec![EventKind::Requested, EventKind::Decided, EventKind::Expired],
            ),
            ("decisions".into(), vec![EventKind::Decided]),
        ],
    }
}

/// `(type, request_id)` of each message waiting for `endpoint`, oldest first.
fn queued<S: ApprovalStore>(store: &S, endpoint: &str) -> Vec<(String, String)> {
    store
        .webhook_page(endpoint, 100)
        .unwrap()
        .into_iter()
        .map(|q| {
            let body: serde_json::Value = serde_json::from_str(&q.message.body).unwrap();
            assert_eq!(body["type"], q.message.kind.as_str());
            let id = body["data"]["request_id"].as_str().unwrap().to_string();
            (q.message.kind, id)
        })
        .collect()
}

fn of(kind: &str, id: &str) -> (String, String) {
    (kind.to_string(), id.to_string())
}

pub async fn webhooks_are_queued_with_their_change_and_only_with_it<B: Backend>(place: &B::Place) {
    let store = B::open(place).await;
    store
        .put_request(request("before", "run-1"), None)
        .await
        .unwrap();
    assert!(
        queued(&store, "all").is_empty(),
        "no routes: nothing queued"
    );
    store.route_webhooks(routes());

    store
        .put_request(request("w1", "run-1"), None)
        .await
        .unwrap();
    store
        .put_request(request("w1", "run-1"), None)
        .await
        .unwrap();
    let approve = NewDecision::person(DecisionKind::Approve, "ana");
    store.resolve_request("w1", approve.clone()).await.unwrap();
    // A repeat and a refusal change nothing, so they queue nothing.
    assert!(
        store
            .resolve_request("w1", approve)
            .await
            .unwrap()
            .duplicate
    );
    let reject = NewDecision::person(DecisionKind::Reject, "bo");
    assert!(store.resolve_request("w1", reject).await.is_err());
    let mut late = request("w2", "run-1");
    late.deadline_ms = now_ms() + 60_000;
    store.put_request(late, None).await.unwrap();
    store.expire("w2").await.unwrap();
    let by_policy = NewDecision {
        source: DecisionSource::Policy,
        rule: "auto".into(),
        ..NewDecision::person(DecisionKind::Approve, "")
    };
    let batch = vec![(request("w3", "run-1"), None, String::new())];
    let puts = store
        .put_and_decide_requests(batch, move |_| Some(by_policy.clone()))
        .await
        .unwrap();
    assert!(puts[0].decided);
    store
        .cancel("before", "runner", "run cancelled")
        .await
        .unwrap();

    let all = vec![
        of("approval.requested", "w1"),
        of("approval.decided", "w1"),
        of("approval.requested", "w2"),
        of("approval.expired", "w2"),
        of("approval.requested", "w3"),
        of("approval.decided", "w3"),
    ];
    assert_eq!(queued(&store, "all"), all);
    assert_eq!(
        queued(&store, "decisions"),
        [of("approval.decided", "w1"), of("approval.decided", "w3")]
    );
    assert_eq!(store.webhook_backlog("all").unwrap(), 6);
    assert_eq!(store.webhook_backlog("nobody").unwrap(), 0);

    let first = store.webhook_page("all", 1).unwrap().remove(0);
    assert!(first.message.id.starts_with("msg_"));
    store.webhook_delivered("all", first.seq).unwrap();
    store.webhook_delivered("all", first.seq).unwrap();
    let left = store.webhook_page("all", 100).unwrap();
    assert_eq!(left.len(), 5);
    let mut ids: Vec<&str> = left.iter().map(|q| q.message.id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 5, "each message has its own id");
    assert_eq!(
        queued(&store, "decisions").len(),
        2,
        "each endpoint has its own copy"
    );

    drop(store);
    let store = B::open(place).await;
    assert_eq!(
        store.webhook_page("all", 100).unwrap(),
        left,
        "the same messages, with the same ids, after a reopen"
    );
}
