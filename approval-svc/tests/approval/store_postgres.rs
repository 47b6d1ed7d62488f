//! The PostgreSQL ApprovalStore on a throwaway cluster: the conformance suite, plus what only a
//! store shared by several processes has (two stores on one database racing decisions, one
//! store's changes announced to the other, the leader's advisory lock).

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::conformance;
use crate::support;

use std::{sync::Arc, time::Duration};

use arbor_approval_svc::{
    ApprovalStore, Error,
    approvals::Approvals,
    lifecycle::ApprovalState,
    model::{AuditAction, AuditEntry, AuditQuery, NewDecision},
    policy::Policy,
    store::{
        ANY_CANCELLABLE_OF_RUN, CANCELLABLE_OF_RUN, Consumed, DeliveryOutcome, OUTBOX_PAGE,
        PgStore, RUNS_TO_CANCEL,
    },
};
use arbor_shared::domain::{DecisionKind, DecisionSource};
use arbor_testkit::{PgCluster, proxy::Proxy};
use conformance::{Backend, tool};
use serde_json::json;
use support::{WAIT, eventually};

/// A fresh database on the shared cluster; a reopen is a new store on the same URL.
struct Postgres;

impl Backend for Postgres {
    type Store = PgStore;
    type Place = String;

    async fn place() -> String {
        tokio::task::spawn_blocking(|| PgCluster::shared().fresh_database("approval"))
            .await
            .unwrap()
    }

    async fn open(url: &String) -> PgStore {
        PgStore::open(url).await.unwrap()
    }
}

conformance::suite!(Postgres);

/// `sql` run by psql on the database at `url`, off the runtime's threads; its output.
async fn psql(url: &str, sql: &str) -> String {
    let (url, sql) = (url.to_string(), sql.to_string());
    tokio::task::spawn_blocking(move || PgCluster::shared().psql(&url, &sql).unwrap())
        .await
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_database_have_exactly_one_winner() {
    let url = Postgres::place().await;
    let stores = [
        Arc::new(Postgres::open(&url).await),
        Arc::new(Postgres::open(&url).await),
    ];
    for round in 0..5 {
        let id = format!("r{round}");
        stores[0]
            .put_request(tool(&id, "run-1"), None)
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = stores[i % 2].clone();
            let id = id.clone();
            tasks.push(tokio::spawn(async move {
                let mut d = NewDecision::person(DecisionKind::Edit, format!("p{i}"));
                d.args = json!({"replicas": i});
                store.resolve_request(&id, d).await
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(r) => {
                    assert!(!r.duplicate);
                    winners.push(r.approval);
                }
                Err(Error::AlreadyDecided { .. }) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}");
        for store in &stores {
            assert_eq!(store.get(&id).unwrap().unwrap(), winners[0]);
            let decided = store
                .audit(&AuditQuery::Request(id.clone()), 100, None)
                .unwrap()
                .items
                .iter()
                .filter(|e| e.action == AuditAction::Decided)
                .count();
            assert_eq!(decided, 1);
        }
    }
    // The same new request from both at once: stored once, audited once.
    let (a, b) = tokio::join!(
        stores[0].put_request(tool("twin", "run-2"), None),
        stores[1].put_request(tool("twin", "run-2"), None),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.created != b.created, "exactly one of them created it");
    assert_eq!(a.approval, b.approval);
    assert_eq!(stores[1].pending_count().unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_store_is_announced_to_the_other() {
    let url = Postgres::place().await;
    let (a, b) = (Postgres::open(&url).await, Postgres::open(&url).await);
    let mut seen_by_b = b
        .foreign_changes()
        .expect("a shared store announces changes");
    let mut seen_by_a = a.foreign_changes().unwrap();
    // The listeners connect in the background: changes until B hears one, then the test.
    let mut warm = 0;
    eventually("B's listener to connect", WAIT, || {
        warm += 1;
        let (a, id) = (&a, format!("warm-{warm}"));
        let heard = seen_by_b.try_recv().is_ok();
        async move {
            a.put_request(tool(&id, "run-0"), None).await.unwrap();
            heard.then_some(())
        }
    })
    .await;
    while seen_by_b.try_recv().is_ok() {}
    a.put_request(tool("r1", "run-1"), None).await.unwrap();
    a.resolve_request("r1", NewDecision::person(DecisionKind::Approve, "ana"))
        .await
        .unwrap();
    let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>| {
        let got = rx.try_recv().ok();
        async move { got }
    };
    let first = eventually("B to hear of the request", WAIT, || {
        // The last warm-up change may still be on its way.
        let got = seen_by_b
            .try_recv()
            .ok()
            .filter(|id| !id.starts_with("warm-"));
        async move { got }
    })
    .await;
    assert_eq!(first, "r1");
    let second = eventually("B to hear of the decision", WAIT, || next(&mut seen_by_b)).await;
    assert_eq!(second, "r1");
    assert_eq!(b.get("r1").unwrap().unwrap().state, ApprovalState::Resolved);
    // A store never hears its own changes (its process published them already).
    assert!(seen_by_a.try_recv().is_err(), "A did not hear itself");
    b.cancel("r1", "runner", "withdrawn").await.unwrap();
    let from_b = eventually("A to hear of B's change", WAIT, || next(&mut seen_by_a)).await;
    assert_eq!(from_b, "r1");
    assert!(seen_by_a.try_recv().is_err(), "A heard only B's change");
    assert!(seen_by_b.try_recv().is_err(), "B did not hear itself");
}

/// Ending a run looks up its approvals that may still be cancelled. That lookup must stay a few
/// pages however many approvals came before it, including before the first ANALYZE of the table
/// and under the generic plan a prepared statement settles on: planned as the run index ANDed with
/// the state index, it read every entry the state index ever held for the open states, dead
/// ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_run_reads_a_few_pages_however_long_the_history() {
    // A history of approvals, each decided and then pruned.
    let (url, store) = with_history(
        "'PENDING'",
        "i",
        false,
        "UPDATE approval_records SET state = 'RESOLVED'; \
         UPDATE approval_records SET state = 'PRUNED';",
    )
    .await;
    // One more, through the store: decided, consumed, pruned; its run then ends.
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    let decided = store
        .resolve_request("r1", NewDecision::person(DecisionKind::Approve, "ana"))
        .await
        .unwrap()
        .approval;
    let held = decided.decision.unwrap().decision_id;
    store
        .ack_and_prune(Consumed::new("r1", &held))
        .await
        .unwrap();
    assert!(
        store
            .cancel_run("run-1", "runner", "ended")
            .await
            .unwrap()
            .is_empty()
    );

    // The look at the runs ending together answers exactly (here: none).
    assert!(
        store
            .runs_to_cancel(&["run-1".into(), "run-2".into()])
            .unwrap()
            .is_empty()
    );
    // A few pages for each run looked up.
    for (lookup, ty, runs, budget) in [
        (ANY_CANCELLABLE_OF_RUN, "text", "'run-1'", 8),
        (CANCELLABLE_OF_RUN, "text", "'run-1'", 8),
        (RUNS_TO_CANCEL, "text[]", "ARRAY['run-1', 'run-2']", 16),
    ] {
        let (pages, plan) = pages_read(&url, lookup, ty, runs);
        assert!(pages <= budget, "{lookup} read {pages} pages: {plan:#}");
    }
}

/// A store on a fresh database holding 20 000 approvals, written in bulk (`state` and `arrival`
/// are SQL of the row's number `i`), then changed by `changes`: every change of an indexed
/// column leaves an index entry behind until a vacuum.
async fn with_history(
    state: &str,
    arrival: &str,
    awaiting: bool,
    changes: &str,
) -> (String, PgStore) {
    let url = Postgres::place().await;
    let store = Postgres::open(&url).await;
    PgCluster::shared()
        .psql(
            &url,
            &format!(
                "INSERT INTO approval_records (request_id, run_id, state, created_at_ms, arrival, \
                     updated_at_ms, deadline_ms, awaiting_delivery, record) \
                 SELECT 'old-' || i, 'old-run-' || i, {state}, i, {arrival}, i, 0, {awaiting}, '{{}}' \
                 FROM generate_series(1, 20000) AS i; {changes}"
            ),
        )
        .unwrap();
    (url, store)
}

/// The pages (of the table and its indexes) that one run of `statement`, with the parameter
/// `value` of type `ty`, reads under the generic plan a prepared statement settles on; and that
/// plan, as PostgreSQL explains it.
fn pages_read(url: &str, statement: &str, ty: &str, value: &str) -> (u64, serde_json::Value) {
    let generic = [("plan_cache_mode", "force_generic_plan")];
    let plan = PgCluster::shared().explain(url, &generic, statement, ty, value);
    (arbor_testkit::pages(&plan), plan)
}

/// The node of `plan` that is an index scan of `index`, if one is.
fn index_scan<'a>(plan: &'a serde_json::Value, index: &str) -> Option<&'a serde_json::Value> {
    if plan["Node Type"] == "Index Scan" && plan["Index Name"] == index {
        return Some(plan);
    }
    plan["Plans"]
        .as_array()?
        .iter()
        .find_map(|child| index_scan(child, index))
}

/// Every decision's delivery starts with a read of the outbox. Until a vacuum, the outbox index
/// still holds an entry for every decision delivered since the last one. Read as a scan of the
/// table (or a bitmap scan), every read visited the table page of each of them; a walk of the
/// index marks them dead once they are, and later reads pass over the index's own pages alone
/// (about 60 for 20 000 entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_the_outbox_reads_a_few_pages_however_many_were_delivered() {
    // A history of decisions that waited for delivery and were delivered.
    let (url, store) = with_history(
        "'RESOLVED'",
        "-i",
        true,
        "UPDATE approval_records SET state = 'PRUNED', awaiting_delivery = false;",
    )
    .await;
    store.put_request(tool("r1", "run-1"), None).await.unwrap();
    store
        .resolve_request("r1", NewDecision::person(DecisionKind::Approve, "ana"))
        .await
        .unwrap();
    // A read marks an entry dead once no transaction on the database can still see its row
    // (another test's transaction on the cluster can hold that back for a moment), so the store
    // reads again, and the read after it is measured, as the store plans it whatever the
    // table's statistics say, until the entries are behind it.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let waiting: Vec<String> = store
            .undelivered()
            .unwrap()
            .iter()
            .map(|a| a.id().to_string())
            .collect();
        assert_eq!(waiting, ["r1"]);
        let (_, plan) = pages_read(&url, OUTBOX_PAGE, "bigint", &i64::MIN.to_string());
        // The walk of the outbox (the one row's trace is looked up beside it, a page or two).
        let walk = index_scan(&plan, "approval_records_outbox")
            .unwrap_or_else(|| panic!("the outbox is not read as a walk of its index: {plan:#}"));
        let pages = arbor_testkit::pages(walk);
        if pages <= 100 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the read still took {pages} pages: {plan:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_the_next_takes_over_when_it_goes() {
    let url = Postgres::place().await;
    let (a, b) = (Postgres::open(&url).await, Postgres::open(&url).await);
    let first = a.lead().await.unwrap().expect("nobody leads yet");
    for _ in 0..3 {
        assert!(b.lead().await.unwrap().is_none(), "two leaders at once");
        assert!(
            a.lead().await.unwrap().is_none(),
            "the lock is not re-entrant"
        );
    }
    drop(first);
    let second = eventually("B to take over", WAIT, || async { b.lead().await.unwrap() }).await;
    assert!(!second.is_lost());
    assert!(a.lead().await.unwrap().is_none());

    // A leader that goes away without a word (its store and connections dropped, as when
    // its process dies): the other takes over.
    drop(second);
    let third = eventually("A to take over", WAIT, || async { a.lead().await.unwrap() }).await;
    drop(b);
    drop(a);
    let c = Postgres::open(&url).await;
    eventually("C to take over from the dropped store", WAIT, || async {
        c.lead().await.unwrap()
    })
    .await;
    tokio::time::timeout(WAIT, third.lost())
        .await
        .expect("a leader whose database handle is gone knows it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_session_ends_stops_leading() {
    let url = Postgres::place().await;
    let (a, b) = (Postgres::open(&url).await, Postgres::open(&url).await);
    let leadership = a.lead().await.unwrap().unwrap();
    let terminated = psql(
        &url,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'arbor-approval-leader' AND datname = current_database()",
    )
    .await;
    assert_eq!(terminated, "1");
    tokio::time::timeout(WAIT, leadership.lost())
        .await
        .expect("the leader noticed its session is gone");
    let next = eventually("B to take over", WAIT, || async { b.lead().await.unwrap() }).await;
    assert!(!next.is_lost());
    // A may try again, but B leads now.
    assert!(a.lead().await.unwrap().is_none());
}

/// A decision whose transaction is slow to commit after its audit entry is numbered (a trigger
/// sleeps in it, as a replica paused mid-transaction would), and a decision on another request
/// of the same run that commits meanwhile: what a reader sees of the run's trail at any moment
/// is a prefix of what it sees later, so paging by id never steps past a late entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_never_lands_behind_an_entry_already_visible() {
    let url = Postgres::place().await;
    let store = Arc::new(Postgres::open(&url).await);
    for id in ["slow", "fast"] {
        store.put_request(tool(id, "run-x"), None).await.unwrap();
    }
    psql(
        &url,
        "CREATE FUNCTION linger() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
         CREATE TRIGGER linger AFTER INSERT ON approval_audit FOR EACH ROW
             WHEN (NEW.request_id = 'slow') EXECUTE FUNCTION linger();",
    )
    .await;
    let run = AuditQuery::Run("run-x".into());
    let trail = |store: &PgStore| -> Vec<u64> {
        let page = store.audit(&run, 100, None).unwrap();
        page.items.iter().map(|e| e.id).collect()
    };
    let slow = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .resolve_request("slow", NewDecision::person(DecisionKind::Approve, "ana"))
                .await
                .unwrap()
        }
    });
    // The slow decision's entry is numbered and lingers uncommitted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    store
        .resolve_request("fast", NewDecision::person(DecisionKind::Approve, "ana"))
        .await
        .unwrap();
    let seen = trail(&store);
    slow.await.unwrap();
    let later = trail(&store);
    assert_eq!(later.len(), 4, "two requests, each requested and decided");
    assert!(
        later.starts_with(&seen),
        "an entry landed behind one already visible: saw {seen:?}, later {later:?}"
    );
}

/// A store call from a task that has spent tokio's cooperative budget (after a burst of ready
/// channel reads, say) still answers. The calls block their thread on the query, and a query's
/// first use of a statement on a pooled connection takes a tokio semaphore (the statement
/// cache); with the budget spent, tokio defers that wake-up until the task yields, which a
/// blocked task never does: the delivery loop of approval-svc hung this way for good.
#[test]
fn a_store_call_from_a_task_out_of_budget_answers() {
    use futures_util::FutureExt;
    let url = PgCluster::shared().fresh_database("approval");
    let (done, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let store = PgStore::open(&url).await.unwrap();
            let task = tokio::spawn(async move {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let mut spent = 0;
                while tokio::task::coop::has_budget_remaining() {
                    tx.send(()).unwrap();
                    rx.recv().now_or_never().flatten().unwrap();
                    spent += 1;
                }
                (spent, store.undelivered().map(|due| due.len()))
            });
            let _ = done.send(task.await.unwrap());
        });
    });
    let (spent, due) = answered
        .recv_timeout(WAIT)
        .expect("a store call from a task out of budget never answered");
    assert!(spent > 0, "the task had no budget to spend");
    assert_eq!(due.unwrap(), 0);
}

/// A batch of the runner's requests is one transaction: one commit, so one WAL flush, however
/// many it holds; and a batch that fails leaves none of them behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_requests_is_one_commit() {
    let url = Postgres::place().await;
    let store = Postgres::open(&url).await;
    let batch = |ids: &[&str]| {
        ids.iter()
            .map(|id| (tool(id, "run-b"), None, format!("00-{id}-01")))
            .collect::<Vec<_>>()
    };
    let before = store.fsyncs();
    let puts = store
        .put_traced_requests(batch(&["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"]))
        .await
        .unwrap();
    assert!(puts.iter().all(|p| p.created));
    assert_eq!(store.fsyncs() - before, 1, "one commit for eight requests");

    // A request id PostgreSQL cannot hold (a NUL byte; the subscriber passes over such an
    // event) fails the batch whole.
    let mut bad = batch(&["c1", "c2"]);
    bad.push((tool("c3\0", "run-b"), None, String::new()));
    assert!(store.put_traced_requests(bad).await.is_err());
    assert_eq!(
        store.get("c1").unwrap(),
        None,
        "nothing of a failed batch is stored"
    );
    assert_eq!(store.trace("c1").unwrap(), None);
}

/// On PostgreSQL a request the policy decides as it arrives costs no transaction of its own:
/// the batch's requests and their decisions are one commit, each record stored already
/// RESOLVED; a request the policy leaves to a person stays PENDING in the same commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_decided_by_the_policy_is_one_commit() {
    let url = Postgres::place().await;
    let store = Postgres::open(&url).await;
    let batch: Vec<_> = ["d1", "d2", "d3", "ask"]
        .iter()
        .map(|id| (tool(id, "run-d"), None, String::new()))
        .collect();
    let before = store.fsyncs();
    let puts = store
        .put_and_decide_requests(batch, |a| {
            (a.id() != "ask").then(|| NewDecision {
                source: DecisionSource::Policy,
                rule: "ledger-ok".into(),
                ..NewDecision::person(DecisionKind::Approve, "policy:ledger-ok")
            })
        })
        .await
        .unwrap();
    assert_eq!(store.fsyncs() - before, 1, "one commit for the batch");
    let outcome: Vec<(&str, bool, ApprovalState)> = puts
        .iter()
        .map(|p| (p.approval.id(), p.decided, p.approval.state))
        .collect();
    assert_eq!(
        outcome,
        vec![
            ("d1", true, ApprovalState::Resolved),
            ("d2", true, ApprovalState::Resolved),
            ("d3", true, ApprovalState::Resolved),
            ("ask", false, ApprovalState::Pending),
        ]
    );
    for put in &puts {
        assert_eq!(
            store.get(put.approval.id()).unwrap().as_ref(),
            Some(&put.approval)
        );
        // Its first stored version: watchers are told it was created.
        assert_eq!(put.approval.version, 1, "{}", put.approval.id());
    }
    let trail: Vec<AuditAction> = store
        .audit(&AuditQuery::Request("d1".into()), 10, None)
        .unwrap()
        .items
        .iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(trail, [AuditAction::Requested, AuditAction::Decided]);
}

/// On PostgreSQL the delivery attempts recorded together are one commit, and a batch that
/// fails changes nothing; through `Approvals`, attempts that finish at once share commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_attempts_recorded_together_are_one_commit_or_nothing() {
    let url = Postgres::place().await;
    let store = Arc::new(Postgres::open(&url).await);
    let attempts = decided(&store, "d", 26).await;
    let accepted = |batch: &[(String, String)]| {
        batch
            .iter()
            .map(|(id, d)| (id.clone(), d.clone(), DeliveryOutcome::Accepted))
            .collect::<Vec<_>>()
    };
    let before = store.fsyncs();
    store
        .record_deliveries(accepted(&attempts[..3]))
        .await
        .unwrap();
    assert_eq!(store.fsyncs() - before, 1, "one commit for three attempts");

    // An unknown approval fails the batch: none of it is recorded.
    let mut failing = accepted(&attempts[3..6]);
    failing.push(("gone".into(), "d".into(), DeliveryOutcome::Accepted));
    assert!(store.record_deliveries(failing).await.is_err());
    for (id, _) in &attempts[3..6] {
        assert!(store.get(id).unwrap().unwrap().needs_delivery(), "{id}");
    }

    let approvals = Approvals::new(store.clone(), Policy::default());
    let before = store.fsyncs();
    let answers = futures_util::future::join_all(
        attempts[6..]
            .iter()
            .map(|(id, d)| approvals.record_delivery(id, d, DeliveryOutcome::Accepted)),
    )
    .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let commits = store.fsyncs() - before;
    assert!(commits <= 3, "20 attempts at once took {commits} commits");
    for (id, _) in &attempts[6..] {
        assert!(!store.get(id).unwrap().unwrap().needs_delivery(), "{id}");
    }
}

/// On PostgreSQL the decisions taken together are one commit, and a batch that fails changes
/// nothing; through `Approvals`, decisions asked for at once share commits, and one that fails
/// the statement (a request id PostgreSQL cannot hold) is refused alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_taken_together_are_one_commit_or_nothing() {
    let url = Postgres::place().await;
    let store = Arc::new(Postgres::open(&url).await);
    let ids: Vec<String> = (0..26).map(|i| format!("p{i}")).collect();
    for id in &ids {
        store.put_request(tool(id, "run-p"), None).await.unwrap();
    }
    let approve = |ids: &[String]| {
        ids.iter()
            .map(|id| {
                (
                    id.clone(),
                    NewDecision::person(DecisionKind::Approve, "ana"),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = store.fsyncs();
    let taken = store.resolve_requests(approve(&ids[..3])).await.unwrap();
    assert!(taken.iter().all(Result::is_ok), "{taken:?}");
    assert_eq!(store.fsyncs() - before, 1, "one commit for three decisions");

    let mut failing = approve(&ids[3..6]);
    failing.push((
        "p\0".into(),
        NewDecision::person(DecisionKind::Approve, "ana"),
    ));
    assert!(store.resolve_requests(failing).await.is_err());
    for id in &ids[3..6] {
        assert_eq!(
            store.get(id).unwrap().unwrap().state,
            ApprovalState::Pending,
            "{id} untouched"
        );
    }

    let approvals = Approvals::new(store.clone(), Policy::default());
    let decide_all = |ids: Vec<&'static str>| {
        futures_util::future::join_all(
            ids.into_iter()
                .map(|id| approvals.decide(id, NewDecision::person(DecisionKind::Approve, "ana"))),
        )
    };
    let before = store.fsyncs();
    let leak = |id: &String| -> &'static str { Box::leak(id.clone().into_boxed_str()) };
    let answers = decide_all(ids[6..16].iter().map(leak).collect()).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let commits = store.fsyncs() - before;
    assert!(commits <= 3, "10 decisions at once took {commits} commits");

    // A batch the database refuses is taken again one at a time: only the bad one fails.
    let answers = decide_all(ids[16..].iter().map(leak).chain(["p\0"]).collect()).await;
    let (refused, taken) = answers.split_last().unwrap();
    assert!(taken.iter().all(Result::is_ok), "{taken:?}");
    assert!(refused.is_err(), "{refused:?}");
    for id in &ids[6..] {
        assert_eq!(
            store.get(id).unwrap().unwrap().state,
            ApprovalState::Resolved,
            "{id}"
        );
    }
}

/// On PostgreSQL the consumptions of a batch are one commit, and a batch that fails changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_consumptions_is_one_commit_or_nothing() {
    let url = Postgres::place().await;
    let store = Postgres::open(&url).await;
    let mut batch = Vec::new();
    for i in 0..6 {
        let id = format!("c{i}");
        store.put_request(tool(&id, "run-c"), None).await.unwrap();
        let resolved = store
            .resolve_request(&id, NewDecision::person(DecisionKind::Approve, "ana"))
            .await
            .unwrap();
        batch.push(Consumed::new(
            id,
            resolved.approval.decision.unwrap().decision_id,
        ));
    }
    let before = store.fsyncs();
    let (first, rest) = batch.split_at(3);
    store.ack_and_prune_all(first.to_vec()).await.unwrap();
    assert_eq!(
        store.fsyncs() - before,
        1,
        "one commit for three consumptions"
    );

    // A request id PostgreSQL cannot hold (a NUL byte) fails the statement, so the batch: none
    // of it is done.
    let mut failing = rest.to_vec();
    failing.push(Consumed::new("c\0", "d"));
    assert!(store.ack_and_prune_all(failing).await.is_err());
    for c in rest {
        assert_eq!(
            store.get(&c.request_id).unwrap().unwrap().state,
            ApprovalState::Resolved,
            "{} untouched",
            c.request_id
        );
    }
}

/// On PostgreSQL a move that writes two audit entries (a request the policy decides as it is
/// stored: REQUESTED and DECIDED; a consumption: ACKED and PRUNED) writes them with the record
/// in one statement, numbered in order, each entry holding its own id; and the statement is
/// not planned again at every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_audit_entries_of_one_move_are_written_with_the_record_in_one_statement() {
    let cluster = PgCluster::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track_planning=on",
    ]);
    let url = cluster.fresh_database("audits");
    cluster
        .psql(&url, "CREATE EXTENSION pg_stat_statements")
        .unwrap();
    let store = Postgres::open(&url).await;
    // Another run's trail first, so that ids and ranks differ.
    store
        .put_request(tool("other", "run-o"), None)
        .await
        .unwrap();
    // (calls, plans) of the statements that write audit entries.
    let audit_writes = || -> (u64, u64) {
        let out = cluster
            .psql(
                &url,
                "SELECT coalesce(sum(calls), 0) || ' ' || coalesce(sum(plans), 0) \
                 FROM pg_stat_statements WHERE dbid = \
                 (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND query LIKE '%INSERT INTO approval_audit%'",
            )
            .unwrap();
        let mut n = out.split_whitespace().map(|n| n.parse().unwrap());
        (n.next().unwrap(), n.next().unwrap())
    };
    let by_policy = |id: &str| {
        let id = id.to_string();
        let store = &store;
        async move {
            let puts = store
                .put_and_decide_requests(vec![(tool(&id, "run-a"), None, String::new())], |_| {
                    Some(NewDecision {
                        source: DecisionSource::Policy,
                        rule: "ledger-ok".into(),
                        ..NewDecision::person(DecisionKind::Approve, "policy:ledger-ok")
                    })
                })
                .await
                .unwrap();
            assert!(puts[0].decided);
            puts[0].approval.decision.clone().unwrap().decision_id
        }
    };
    cluster
        .psql(&url, "SELECT pg_stat_statements_reset()")
        .unwrap();

    let held = by_policy("a").await;
    assert_eq!(
        audit_writes().0,
        1,
        "the record and both entries in one statement"
    );
    store
        .ack_and_prune(Consumed::new("a", &held))
        .await
        .unwrap();
    assert_eq!(
        audit_writes().0,
        2,
        "a consumption's two entries in one statement"
    );

    let trail = store
        .audit(&AuditQuery::Request("a".into()), 10, None)
        .unwrap()
        .items;
    let actions: Vec<AuditAction> = trail.iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        [
            AuditAction::Requested,
            AuditAction::Decided,
            AuditAction::Acked,
            AuditAction::Pruned
        ]
    );
    let ids: Vec<u64> = trail.iter().map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids {ids:?}");
    let rows = cluster
        .psql(
            &url,
            "SELECT string_agg(id::text || ':' || (entry::jsonb->>'id') || ':' || action, ',' ORDER BY id) \
             FROM approval_audit WHERE request_id = 'a'",
        )
        .unwrap();
    let expected: Vec<String> = trail
        .iter()
        .map(|e| {
            format!(
                "{0}:{0}:{1}",
                e.id,
                format!("{:?}", e.action).to_uppercase()
            )
        })
        .collect();
    assert_eq!(rows.trim(), expected.join(","));
    assert!(trail.iter().all(|e| e.time_ms > 0 && e.run_id == "run-a"));

    // PostgreSQL plans a prepared statement for its first five calls on a connection, then
    // keeps a generic plan unless it looks costlier: on each of the store's connections at most
    // six plans, however many calls follow (a statement planned at every call plans them all).
    let connections = || -> u64 {
        cluster
            .psql(
                &url,
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let before = (audit_writes(), connections());
    let moves = 6 * before.1 + 20;
    for i in 0..moves {
        by_policy(&format!("more-{i}")).await;
    }
    let ((calls, plans), open) = (audit_writes(), connections().max(before.1));
    assert_eq!(calls - before.0.0, moves);
    let planned = plans - before.0.1;
    assert!(
        planned <= 6 * open,
        "{planned} plans for {moves} calls over {open} connections"
    );
}

/// On PostgreSQL a transaction's writes go out with its COMMIT, in one round trip: recording
/// forty delivery attempts together takes about as many round trips as recording two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_s_writes_go_out_with_its_commit() {
    let url = Postgres::place().await;
    // Through a proxy that counts round trips.
    let relay = Proxy::start(PgCluster::shared().addr()).await;
    let store = Postgres::open(&PgCluster::shared().through(&url, relay.addr())).await;
    let attempts: Vec<_> = decided(&store, "w", 44)
        .await
        .into_iter()
        .map(|(id, decision)| (id, decision, DeliveryOutcome::Accepted))
        .collect();
    // The round trips of recording `batch` together.
    let round_trips = |batch: &[(String, String, DeliveryOutcome)]| {
        let (store, relay, batch) = (&store, &relay, batch.to_vec());
        async move {
            let start = relay.round_trips();
            store.record_deliveries(batch).await.unwrap();
            relay.round_trips() - start
        }
    };
    // The first batch prepares the statements on its connection.
    round_trips(&attempts[..2]).await;
    // Answers held back as a distant server's are: the writes a client pipelines have all
    // gone out before the first answer comes, however they are split into sends.
    relay.delay_answers(Duration::from_millis(25));
    let two = round_trips(&attempts[2..4]).await;
    let forty = round_trips(&attempts[4..]).await;
    relay.delay_answers(Duration::ZERO);
    // One write a round trip would take 38 more. What else may fall in either count: a look
    // at the server's reachability, and a connection the pool opens meanwhile (its start-up
    // and the statements it prepares).
    assert!(
        forty <= two + 10,
        "2 attempts took {two} round trips, 40 took {forty}"
    );
    for (id, _, _) in &attempts {
        assert!(!store.get(id).unwrap().unwrap().needs_delivery(), "{id}");
    }
}

/// `n` requests (ids `{prefix}0`…, of the run `run-{prefix}`), each approved by a person:
/// (request id, decision id).
async fn decided(store: &PgStore, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}{i}");
        let run = format!("run-{prefix}");
        store.put_request(tool(&id, &run), None).await.unwrap();
        let resolved = store
            .resolve_request(&id, NewDecision::person(DecisionKind::Approve, "ana"))
            .await
            .unwrap();
        out.push((id, resolved.approval.decision.unwrap().decision_id));
    }
    out
}

/// A database an older release wrote, with the records and audit entries as `jsonb` (schema
/// version 2), is brought up to date at open and reads exactly as it did; what is written after
/// the upgrade is numbered on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_database_is_upgraded_with_everything_in_it() {
    let url = Postgres::place().await;
    let sql = |q: &'static str| psql(&url, q);
    let trail = |store: &PgStore, id: &str| {
        store
            .audit(&AuditQuery::Request(id.into()), 100, None)
            .unwrap()
            .items
    };
    let (decided, pending, decided_trail) = {
        let store = Postgres::open(&url).await;
        store.put_request(tool("r1", "run-1"), None).await.unwrap();
        store.put_request(tool("r2", "run-1"), None).await.unwrap();
        let decided = store
            .resolve_request(
                "r1",
                NewDecision::person(DecisionKind::Reject, "ana").with_reason("not now"),
            )
            .await
            .unwrap()
            .approval;
        (
            decided,
            store.get("r2").unwrap().unwrap(),
            trail(&store, "r1"),
        )
    };
    // As version 2 kept them: `jsonb`, and none of the tables later versions added.
    sql(
        "ALTER TABLE approval_records ALTER COLUMN record TYPE jsonb USING record::jsonb; \
         ALTER TABLE approval_audit ALTER COLUMN entry TYPE jsonb USING entry::jsonb; \
         DROP TABLE approval_delegations; \
         DROP TABLE approval_webhooks; \
         UPDATE arbor_schema SET version = 2 WHERE component = 'approval'",
    )
    .await;
    let column_types = "SELECT string_agg(data_type, ' ' ORDER BY table_name) \
         FROM information_schema.columns WHERE (table_name, column_name) \
         IN (('approval_records', 'record'), ('approval_audit', 'entry'))";
    assert_eq!(sql(column_types).await, "jsonb jsonb");

    let store = Postgres::open(&url).await;
    assert_eq!(sql(column_types).await, "text text");
    assert_eq!(
        sql("SELECT version FROM arbor_schema WHERE component = 'approval'").await,
        "5"
    );
    assert_eq!(store.get("r1").unwrap().unwrap(), decided);
    assert_eq!(store.get("r2").unwrap().unwrap(), pending);
    assert_eq!(trail(&store, "r1"), decided_trail);
    let approved = store
        .resolve_request("r2", NewDecision::person(DecisionKind::Approve, "bo"))
        .await
        .unwrap();
    assert!(!approved.duplicate);
    let run_trail = store
        .audit(&AuditQuery::Run("run-1".into()), 100, None)
        .unwrap()
        .items;
    let ids: Vec<u64> = run_trail.iter().map(|e| e.id).collect();
    assert_eq!(run_trail.len(), 4, "{run_trail:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let of_r1: Vec<_> = run_trail
        .iter()
        .filter(|e| e.request_id == "r1")
        .cloned()
        .collect();
    assert_eq!(of_r1, decided_trail);
    let last = run_trail.last().unwrap();
    assert_eq!(
        (last.request_id.as_str(), last.action, last.actor.as_str()),
        ("r2", AuditAction::Decided, "bo")
    );

    // A replica of the older release, still running during a rolling upgrade, writes `jsonb`
    // as it did (a record rewritten, an audit entry numbered by `jsonb_set`): PostgreSQL
    // assigns it to the text columns, and this release reads it.
    sql(
        "UPDATE approval_records SET record = record::jsonb WHERE request_id = 'r2'; \
         INSERT INTO approval_audit (id, request_id, run_id, time_ms, action, entry) \
         SELECT n.id, a.request_id, a.run_id, a.time_ms, a.action, \
             jsonb_set(a.entry::jsonb, '{id}', to_jsonb(n.id)) \
         FROM approval_audit a, (SELECT nextval('approval_audit_ids') AS id) n \
         WHERE a.id = (SELECT max(id) FROM approval_audit)",
    )
    .await;
    assert_eq!(store.get("r2").unwrap().unwrap(), approved.approval);
    let r2_trail = trail(&store, "r2");
    let (copy, original) = (&r2_trail[r2_trail.len() - 1], &r2_trail[r2_trail.len() - 2]);
    assert!(copy.id > original.id, "{r2_trail:?}");
    assert_eq!(
        AuditEntry {
            id: original.id,
            ..copy.clone()
        },
        *original
    );
}
