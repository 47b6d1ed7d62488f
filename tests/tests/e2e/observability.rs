//! Observability through the real binaries: `/metrics` of both services moves by exactly one
//! approval's worth, one W3C trace id follows an approval across both services (events and JSON
//! logs), and health goes NOT_SERVING → SERVING at start-up and SERVING → NOT_SERVING on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{
    Binaries, Cluster, Profile, Service, ServiceKind, WAIT, eventually, flow, gate_tree,
    scrape::{Scrape, scrape},
};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

async fn both(cluster: &Cluster) -> (Scrape, Scrape) {
    (
        scrape(&cluster.runner.metrics_url()).await,
        scrape(&cluster.approval.metrics_url()).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_by_exactly_one_approved_run() {
    let cluster = Cluster::start(Profile::Debug).await;
    let (r0, a0) = both(&cluster).await;
    let succeeded = |s: &Scrape| s.value("arbor_runner_runs", &[("status", "succeeded")]);
    let decided = |s: &Scrape| {
        s.value(
            "arbor_approval_decisions_total",
            &[("source", "person"), ("decision", "approve")],
        )
    };
    let latency_count = |s: &Scrape| {
        s.value(
            "arbor_approval_decision_latency_seconds_count",
            &[("source", "person")],
        )
    };
    // Present from the first scrape, before anything happened.
    assert_eq!(latency_count(&a0), 0.0, "{}", a0.text);
    assert_eq!(a0.get("arbor_approval_pending", &[]), Some(0.0));
    assert_eq!(
        a0.get("arbor_approval_delivery_retries_total", &[]),
        Some(0.0)
    );
    assert_eq!(a0.get("arbor_approval_cursor_lost_total", &[]), Some(0.0));
    assert!(r0.get("arbor_runner_lease_takeovers_total", &[]).is_some());

    let run = flow::submit(&cluster, gate_tree("metered", "failure"), None).await;
    let pending = flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    let (r1, a1) = both(&cluster).await;
    assert_eq!(a1.get("arbor_approval_pending", &[]), Some(1.0));
    assert_eq!(
        r1.value("arbor_runner_runs", &[("status", "suspended")]),
        r0.value("arbor_runner_runs", &[("status", "suspended")]) + 1.0
    );
    assert_eq!(
        r1.value(
            "arbor_runner_active_suspensions",
            &[("category", "require_approval")]
        ),
        1.0
    );

    flow::approve(&cluster, &pending.request_id).await;
    flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pruned).await;
    // approval-svc acks its cursor in batches (100 ms); wait for the lag to drain.
    let r2 = eventually("approval-svc's cursor to catch up", WAIT, || async {
        let s = scrape(&cluster.runner.metrics_url()).await;
        (s.get(
            "arbor_runner_subscriber_lag_events",
            &[("subscriber", "approval-svc")],
        ) == Some(0.0))
        .then_some(s)
    })
    .await;
    let a2 = scrape(&cluster.approval.metrics_url()).await;

    assert_eq!(succeeded(&r2), succeeded(&r0) + 1.0, "{}", r2.text);
    assert_eq!(
        r2.value("arbor_runner_runs", &[("status", "suspended")]),
        r0.value("arbor_runner_runs", &[("status", "suspended")])
    );
    assert_eq!(
        r2.value(
            "arbor_runner_active_suspensions",
            &[("category", "require_approval")]
        ),
        0.0
    );
    assert_eq!(
        r2.value("arbor_runner_mailbox_jobs", &[("status", "queued")]),
        0.0
    );
    assert!(
        r2.value("arbor_runner_fsyncs_total", &[]) > r0.value("arbor_runner_fsyncs_total", &[])
    );
    // sled runs its transactions one at a time: none is ever run again after a conflict.
    assert_eq!(
        r2.get("arbor_runner_store_conflicts_total", &[]),
        Some(0.0),
        "{}",
        r2.text
    );
    // approval-svc follows the log's head: the run's events reach it from the runner's memory.
    let read =
        |s: &Scrape, from| s.value("arbor_runner_stream_events_read_total", &[("from", from)]);
    assert!(read(&r2, "memory") > read(&r0, "memory"), "{}", r2.text);
    assert_eq!(read(&r2, "store"), read(&r0, "store"), "{}", r2.text);
    assert_eq!(
        r2.value("arbor_runner_event_last_seq", &[]),
        flow::events_of(&cluster, &run.run_id)
            .await
            .last()
            .unwrap()
            .seq as f64
    );

    assert_eq!(decided(&a2), decided(&a0) + 1.0, "{}", a2.text);
    assert_eq!(latency_count(&a2), latency_count(&a0) + 1.0);
    assert_eq!(
        a2.value(
            "arbor_approval_decision_latency_seconds_count",
            &[("source", "policy")]
        ),
        0.0
    );
    assert_eq!(a2.get("arbor_approval_pending", &[]), Some(0.0));
    assert_eq!(
        a2.value("arbor_approval_deliveries_accepted_total", &[]),
        a0.value("arbor_approval_deliveries_accepted_total", &[]) + 1.0
    );
    assert_eq!(
        a2.get("arbor_approval_delivery_retries_total", &[]),
        Some(0.0)
    );
    assert_eq!(a2.get("arbor_approval_cursor_lost_total", &[]), Some(0.0));
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn json_lines(log: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `trace_id` of the line's innermost span that has one, if any.
fn trace_of(line: &serde_json::Value) -> Option<String> {
    let spans = line["spans"].as_array()?;
    spans
        .iter()
        .rev()
        .find_map(|s| s["trace_id"].as_str().map(str::to_string))
}

fn message(line: &serde_json::Value) -> &str {
    line["fields"]["message"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_id_follows_an_approval_across_both_services() {
    let json = vec!["--log-json".to_string()];
    let cluster = Cluster::start_with(Profile::Debug, json.clone(), json).await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let run = flow::submit(&cluster, gate_tree("traced", "failure"), Some(&traceparent)).await;
    let pending = flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    flow::approve(&cluster, &pending.request_id).await;
    flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pruned).await;

    // Runner: every event of the run is in the client's trace, each step with its own span.
    let events = flow::events_of(&cluster, &run.run_id).await;
    let mut spans = std::collections::BTreeSet::new();
    for e in &events {
        let parts: Vec<&str> = e.traceparent.split('-').collect();
        assert_eq!(
            parts.len(),
            4,
            "event {} has traceparent {:?}",
            e.seq,
            e.traceparent
        );
        assert_eq!(parts[1], CLIENT_TRACE, "event {} ({:?})", e.seq, e.kind);
        assert_ne!(parts[2], CLIENT_SPAN, "a step gets a span of its own");
        spans.insert(parts[2].to_string());
    }
    use rpb::EventKind as K;
    for kind in [
        K::RunQueued,
        K::ApprovalRequested,
        K::ApprovalResolved,
        K::ExecutionResumed,
        K::ApprovalConsumed,
        K::RunSucceeded,
    ] {
        assert!(
            events.iter().any(|e| e.kind == kind as i32),
            "no {kind:?} event"
        );
    }
    assert!(
        spans.len() >= 3,
        "submit, suspend, resolve and resume are separate steps: {spans:?}"
    );

    // approval-svc: every JSON line about the request carries the trace id.
    let rid = pending.request_id.as_str();
    let lines = eventually("approval-svc to log the delivery", WAIT, || async {
        let lines: Vec<_> = json_lines(&cluster.approval.log)
            .into_iter()
            .filter(|l| l.to_string().contains(rid))
            .collect();
        lines
            .iter()
            .any(|l| message(l) == "decision delivered")
            .then_some(lines)
    })
    .await;
    for wanted in [
        "approval requested",
        "approval decided",
        "decision delivered",
    ] {
        assert!(
            lines.iter().any(|l| message(l) == wanted),
            "no {wanted:?} line for {rid}"
        );
    }
    for line in &lines {
        assert_eq!(
            trace_of(line).as_deref(),
            Some(CLIENT_TRACE),
            "approval-svc log line without the trace id: {line}"
        );
    }

    // The runner saw approval-svc's Resolve arrive with `traceparent` metadata of that trace.
    let accepted: Vec<_> = json_lines(&cluster.runner.log)
        .into_iter()
        .filter(|l| message(l) == "decision accepted" && l.to_string().contains(rid))
        .collect();
    assert!(
        !accepted.is_empty(),
        "the runner logged no accepted decision"
    );
    for line in &accepted {
        assert_eq!(trace_of(line).as_deref(), Some(CLIENT_TRACE), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_traceparent_gets_a_trace_of_its_own() {
    let cluster = Cluster::start(Profile::Debug).await;
    let run = flow::submit(&cluster, gate_tree("untraced", "failure"), None).await;
    flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    let events = flow::events_of(&cluster, &run.run_id).await;
    let traces: std::collections::BTreeSet<String> = events
        .iter()
        .map(|e| {
            let parts: Vec<&str> = e.traceparent.split('-').collect();
            assert_eq!(parts.len(), 4, "{:?}", e.traceparent);
            parts[1].to_string()
        })
        .collect();
    assert_eq!(traces.len(), 1, "one trace for the run: {traces:?}");
}

async fn health_watch(
    service: &Service,
) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    let url = service.url();
    eventually("the health service to answer a watch", WAIT, || {
        let url = url.clone();
        async move {
            let channel = Channel::from_shared(url).ok()?.connect().await.ok()?;
            HealthClient::new(channel)
                .watch(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .ok()
                .map(|r| r.into_inner())
        }
    })
    .await
}

async fn next_status(watch: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>) -> i32 {
    tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("a health update in time")
        .expect("the watch stream is healthy")
        .expect("the watch stream stays open")
        .status
}

/// Starts a service of `kind` on a data dir this test holds the database lock of (as a
/// previous instance still shutting down would): it stays in recovery until the returned
/// database is dropped.
fn start_locked_out(kind: ServiceKind) -> (tempfile::TempDir, Service, sled::Db) {
    let bins = Binaries::get(Profile::Debug);
    let dir = tempfile::tempdir().unwrap();
    let binary = match kind {
        ServiceKind::Runner => bins.runner,
        ServiceKind::Approval => bins.approval,
    };
    let mut service = Service::new(kind, binary, dir.path(), Vec::new());
    if kind == ServiceKind::Approval {
        // Any address: the runner is not needed for approval-svc to become SERVING.
        service.extra_args = vec!["--runner".into(), "http://127.0.0.1:9".into()];
    }
    let holder = arbor_shared::sled_backend::sled_config(&service.data_dir, 1 << 20)
        .open()
        .unwrap();
    service.spawn();
    (dir, service, holder)
}

/// Start-up: the service binds and answers health before its database is open. The test holds
/// the database lock (as a previous instance still shutting down would), so the NOT_SERVING
/// window is certain without any timing assumption; releasing it lets recovery finish.
async fn startup_goes_not_serving_then_serving(kind: ServiceKind) {
    let (_dir, mut service, holder) = start_locked_out(kind);
    let mut watch = health_watch(&service).await;
    assert_eq!(
        next_status(&mut watch).await,
        NOT_SERVING,
        "while the lock is held"
    );
    assert!(!service.has_exited(), "{}", service.log_tail());
    drop(holder);
    assert_eq!(next_status(&mut watch).await, SERVING, "after recovery");
    drop(watch);
    assert_eq!(service.stop().await, Some(0), "{}", service.log_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_health_is_not_serving_until_recovered() {
    startup_goes_not_serving_then_serving(ServiceKind::Runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_health_is_not_serving_until_recovered() {
    startup_goes_not_serving_then_serving(ServiceKind::Approval).await;
}

/// A SIGTERM that arrives while the service is still recovering (here: waiting for a data dir
/// that another process holds) ends it cleanly, at once: exit 0, well before the lock wait
/// would have given up with an error.
async fn sigterm_while_recovering_exits_cleanly(kind: ServiceKind) {
    let (_dir, mut service, holder) = start_locked_out(kind);
    let mut watch = health_watch(&service).await;
    assert_eq!(next_status(&mut watch).await, NOT_SERVING);
    let signalled = Instant::now();
    service.terminate();
    // The open watch (as a client that checks health on its side keeps) ends cleanly, and
    // does not hold the shutdown up until the drain times out.
    watch_ends(&mut watch).await;
    let code = service.wait_exit(WAIT).await;
    assert_eq!(code, Some(0), "{}", service.log_tail());
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "took {:?} to stop while recovering (the lock wait and the drain are 10 s each)",
        signalled.elapsed()
    );
    drop(holder);
}

/// The health watch ends as a finished call (OK), not cut off with the connection.
async fn watch_ends(watch: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>) {
    match tokio::time::timeout(WAIT, watch.message()).await {
        Ok(Ok(None)) => {}
        other => panic!("the health watch did not end cleanly: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_sigterm_while_recovering_exits_cleanly() {
    sigterm_while_recovering_exits_cleanly(ServiceKind::Runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_sigterm_while_recovering_exits_cleanly() {
    sigterm_while_recovering_exits_cleanly(ServiceKind::Approval).await;
}

/// Shutdown: SIGTERM turns health NOT_SERVING at once, health keeps answering through the
/// drain grace, and only then does the process close and exit cleanly.
async fn sigterm_goes_not_serving_and_keeps_answering(service: &mut Service, grace: Duration) {
    let mut watch = health_watch(service).await;
    assert_eq!(next_status(&mut watch).await, SERVING);
    let signalled = Instant::now();
    service.terminate();
    assert_eq!(next_status(&mut watch).await, NOT_SERVING);
    let during_grace = HealthClient::new(service.channel().await)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health still answers during the drain grace")
        .into_inner()
        .status;
    assert_eq!(during_grace, NOT_SERVING);
    assert!(
        !service.has_exited(),
        "exited inside the grace: {}",
        service.log_tail()
    );
    // The watch stays open through the grace and ends when the service closes.
    watch_ends(&mut watch).await;
    let code = service.wait_exit(WAIT).await;
    assert_eq!(code, Some(0), "{}", service.log_tail());
    assert!(
        signalled.elapsed() < grace + Duration::from_secs(5),
        "took {:?} to stop after a {grace:?} grace (an open health watch held the drain?)",
        signalled.elapsed()
    );
    assert!(
        signalled.elapsed() >= grace,
        "exited after {:?}, before the {grace:?} grace",
        signalled.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_reports_not_serving_through_the_drain_grace() {
    let grace = Duration::from_millis(1500);
    let flag = vec![
        "--drain-grace-ms".to_string(),
        grace.as_millis().to_string(),
    ];
    let mut cluster = Cluster::start_with(Profile::Debug, flag.clone(), flag).await;
    sigterm_goes_not_serving_and_keeps_answering(&mut cluster.approval, grace).await;
    sigterm_goes_not_serving_and_keeps_answering(&mut cluster.runner, grace).await;
}
