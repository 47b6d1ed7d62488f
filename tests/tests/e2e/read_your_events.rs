//! GetRun is never ahead of the event log: a client that polls GetRun and, the moment it shows
//! a new status, reads StreamEvents finds every event of the step that status came from — the
//! checkpoint the run shows (CHECKPOINT_SAVED with the run's step), the suspension it waits on
//! (EXECUTION_SUSPENDED), the end (RUN_SUCCEEDED). Repeated over many runs, it must never miss.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_shared::{json::to_proto_value, proto::runner::v1 as rpb};
use arbor_tests::{Cluster, Profile, WAIT, clients::runner_as, flow::events_from};
use rpb::{RunStatus, event::Detail};
use serde_json::json;

const RUNS: usize = 100;

/// What the stream must already hold when GetRun shows `run`.
fn check(run: &rpb::Run, events: &[rpb::Event]) {
    let kinds: Vec<i32> = events.iter().map(|e| e.kind).collect();
    let has = |k: rpb::EventKind| kinds.contains(&(k as i32));
    assert!(has(rpb::EventKind::RunQueued), "{}: {kinds:?}", run.run_id);
    if run.step > 0 {
        let saved = events
            .iter()
            .any(|e| matches!(&e.detail, Some(Detail::CheckpointSaved(c)) if c.step == run.step));
        assert!(
            saved,
            "{} shows step {} before its CHECKPOINT_SAVED: {kinds:?}",
            run.run_id, run.step
        );
    }
    for s in &run.suspensions {
        let suspended = events.iter().any(|e| {
            matches!(&e.detail, Some(Detail::ExecutionSuspended(x)) if x.request_id == s.request_id)
        });
        assert!(
            suspended,
            "{} shows suspension {} before its EXECUTION_SUSPENDED",
            run.run_id, s.request_id
        );
    }
    if run.status == RunStatus::Succeeded as i32 {
        assert!(
            has(rpb::EventKind::RunSucceeded),
            "{}: {kinds:?}",
            run.run_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_seen_in_get_run_has_its_events_in_the_stream() {
    let cluster = Cluster::start(Profile::Debug).await;
    let mut runner = runner_as(&cluster.runner.url(), None);
    runner
        .register_tree(rpb::RegisterTreeRequest {
            document: json!({"id": "steps", "version": 1, "root": {"type": "sequence",
            "name": "main", "children": [
                {"type": "set", "name": "a", "key": "a", "value": 1},
                {"type": "user_input", "name": "q", "input_kind": "text", "prompt": "?",
                 "output": "answer"},
                {"type": "tool", "name": "say", "tool": "echo",
                 "args": {"said": {"$ref": "answer"}}, "output": "echoed"}
            ]}})
            .to_string(),
            format: 0,
        })
        .await
        .unwrap();
    let mut checked = 0;
    for i in 0..RUNS {
        let run_id = format!("poll-{i}");
        runner
            .submit_run(rpb::SubmitRunRequest {
                tree_id: "steps".into(),
                run_id: run_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = (0, 0u64);
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{run_id} never finished"
            );
            let run = runner
                .get_run(rpb::GetRunRequest {
                    run_id: run_id.clone(),
                })
                .await
                .unwrap()
                .into_inner()
                .run
                .unwrap();
            if (run.status, run.step) == seen {
                continue;
            }
            seen = (run.status, run.step);
            check(&run, &events_from(&mut runner, &run_id).await);
            checked += 1;
            if run.status == RunStatus::Succeeded as i32 {
                break;
            }
            if run.status == RunStatus::Suspended as i32 {
                runner
                    .resolve(rpb::ResolveRequest {
                        run_id: run_id.clone(),
                        request_id: run.suspensions[0].request_id.clone(),
                        decision_id: format!("d-{i}"),
                        action: rpb::ResolveAction::Resume as i32,
                        result: Some(to_proto_value(&json!({"text": format!("answer {i}")}))),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
        }
    }
    // Every run was seen at least suspended and succeeded (queued and running pass quickly).
    assert!(checked >= 2 * RUNS, "{checked} states checked");
}
