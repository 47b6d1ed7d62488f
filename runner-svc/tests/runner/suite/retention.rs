//! Retention keeps the database bounded: acked events, finished runs (with their checkpoints
//! and trace contexts) and final jobs are compacted, unacked events stay until their maximum
//! age, and a stream whose cursor was compacted away gets OUT_OF_RANGE instead of a silent gap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{self, Backend};

use std::time::Duration;

use arbor_runner_svc::{
    ServeConfig, engine::TreeFormat, open_runner, retention::RetentionConfig, runs::SubmitInput,
    serve_runner,
};
use arbor_shared::{
    domain::RunStatus,
    proto::runner::v1::{self as pb, runner_service_client::RunnerServiceClient},
    testing::eventually,
};

const QUICK: &str = r#"{"id": "quick", "version": 1, "root": {"type": "set", "name": "s", "key": "x", "value": 1}}"#;
const HOUR: Duration = Duration::from_secs(3600);

pub async fn acked_events_finished_runs_and_final_jobs_are_compacted(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServeConfig {
        data_dir: dir.path().to_path_buf(),
        store_url: b.store_url(dir.path()),
        workers: 2,
        ..ServeConfig::default()
    };
    let runner = open_runner(&cfg).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (health, health_svc) = tonic_health::server::health_reporter();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_runner(
        cfg,
        runner.clone(),
        listener,
        async move {
            let _ = stop_rx.await;
        },
        health,
        health_svc,
    ));

    runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..20 {
        let s = runner
            .submit(SubmitInput {
                tree_id: "quick".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        ids.push(s.run.run_id);
    }
    let wait = Duration::from_secs(20);
    eventually("the runs to finish", wait, || async {
        ids.iter()
            .all(|id| runner.get_run(id).unwrap().run.status == RunStatus::Succeeded)
            .then_some(())
    })
    .await;
    // Every assigned seq durable and the log no longer growing.
    let mut seen = 0;
    let last = eventually("the event log to settle", wait, || {
        let assigned = runner.events().last_seq().unwrap();
        let settled = assigned == seen && runner.events().durable_seq() == assigned;
        seen = assigned;
        async move { settled.then_some(assigned) }
    })
    .await;
    let half = last / 2;
    runner.ack_cursor("audit-sink", half).await.unwrap();

    // Only events the durable subscriber acked go; nothing finished is old enough yet.
    let now = arbor_shared::time::now_ms() + 1;
    let keep_finished = RetentionConfig {
        events_acked: Duration::ZERO,
        events_max: HOUR,
        finished: HOUR,
        interval: HOUR,
    };
    let c = runner.compact(&keep_finished, now).await.unwrap();
    assert_eq!((c.events, c.runs, c.jobs), (half, 0, 0));
    assert_eq!(runner.events().first_seq().unwrap(), half + 1);
    assert_eq!(
        runner.get_run(&ids[0]).unwrap().run.status,
        RunStatus::Succeeded
    );

    // A stream from before the compacted range is told so.
    let mut client = RunnerServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let err = client
        .stream_events(pb::StreamEventsRequest {
            after_seq: Some(1),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange);
    let mut ok = client
        .stream_events(pb::StreamEventsRequest {
            after_seq: Some(half),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ok.message().await.unwrap().unwrap().event.unwrap().seq,
        half + 1
    );

    // Finished runs and final jobs past their retention go; the rest of the events past max age.
    let drop_all = RetentionConfig {
        events_acked: Duration::ZERO,
        events_max: Duration::ZERO,
        finished: Duration::ZERO,
        interval: HOUR,
    };
    assert!(!runner.events().run_trace_id(&ids[0]).is_empty());
    let c = runner.compact(&drop_all, now).await.unwrap();
    assert_eq!(c.events, last - half);
    assert_eq!(c.runs, 20);
    assert_eq!(c.jobs, 20);
    assert!(runner.get_run(&ids[0]).is_err());
    assert_eq!(
        runner.events().run_trace_id(&ids[0]),
        "",
        "the run's trace context goes with it"
    );
    assert_eq!(runner.events().first_seq().unwrap(), last + 1);
    let again = runner.compact(&drop_all, now).await.unwrap();
    assert_eq!(again, Default::default(), "nothing left to compact");

    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

/// Tasks of task workers go with the runs they served: an ended task is compacted once it is
/// past the finished-retention age, a task still waiting for a worker never is.
pub async fn ended_tasks_are_compacted_and_waiting_ones_kept(b: Backend) {
    use arbor_runner_svc::{
        runs::{ResolveInput, tasks::TaskFilter},
        tasks::TaskState,
    };
    use arbor_shared::domain::{DecisionSource, Verdict};

    let dir = tempfile::tempdir().unwrap();
    let runner = b.open_runner(dir.path(), |_| {}).await;
    let workers = arbor_runner_svc::pool::spawn(
        runner.clone(),
        2,
        tokio_util::sync::CancellationToken::new(),
    );
    const WAITS: &str = r#"{"id": "waits", "version": 1, "root": {"type": "external",
        "name": "ci", "execution_kind": "ci.build", "task": {"sha": "abc"}, "output": "ci"}}"#;
    runner.register_tree(WAITS, TreeFormat::Json).await.unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let s = runner
            .submit(SubmitInput {
                tree_id: "waits".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        runs.push(s.run.run_id);
    }
    let tasks = |state: Option<TaskState>| {
        let filter = TaskFilter {
            states: state.into_iter().collect(),
            ..Default::default()
        };
        runner.list_tasks(&filter, 0, "").unwrap().tasks
    };
    let queued = eventually("both tasks queued", Duration::from_secs(20), || async {
        let queued = tasks(Some(TaskState::Queued));
        (queued.len() == 2).then_some(queued)
    })
    .await;
    // The first run's task is answered from outside through Resolve: the task is closed.
    let first = queued.iter().find(|t| t.run_id == runs[0]).unwrap();
    runner
        .resolve(ResolveInput {
            run_id: runs[0].clone(),
            request_id: first.task_id.clone(),
            decision_id: "d1".into(),
            action: Verdict::Resume,
            result: serde_json::json!({"status": "succeeded", "result": {"ok": true}}),
            reason: String::new(),
            decided_by: "ci".into(),
            source: DecisionSource::Person,
            may_resolve_approvals: false,
            answerer: None,
            trace: None,
            args_digest: String::new(),
        })
        .await
        .unwrap();
    common::wait_status(&runner, &runs[0], RunStatus::Succeeded).await;
    assert_eq!(tasks(Some(TaskState::Resolved)).len(), 1);

    let drop_all = RetentionConfig {
        events_acked: Duration::ZERO,
        events_max: HOUR,
        finished: Duration::ZERO,
        interval: HOUR,
    };
    let c = runner
        .compact(&drop_all, arbor_shared::time::now_ms() + 1)
        .await
        .unwrap();
    assert_eq!(c.tasks, 1, "the resolved task goes");
    let left = tasks(None);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].run_id, runs[1]);
    assert_eq!(left[0].state, TaskState::Queued, "a waiting task stays");
    drop(workers);
}
