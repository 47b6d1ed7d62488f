//! Draining workers: on SIGTERM the Python and Node helpers stop taking tasks and hand back
//! (ReleaseTask) what they could not finish within their grace; another worker takes it at once
//! with the same attempt number and goes on from its heartbeat's details.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_worker_releases_its_task_and_another_finishes_it_on_the_same_attempt() {
    let cluster = Cluster::start(Profile::Debug).await;
    for lang in ["py", "node"] {
        let types = format!("{lang}.*");
        let start = |id: String| {
            let (cluster, types) = (&cluster, types.clone());
            // A short grace: the task outlasts it and is handed back.
            async move {
                let flags = ["--grace-ms", "200"];
                match lang {
                    "py" => Worker::python(cluster, &id, &types, &flags).await,
                    _ => Worker::node(cluster, &id, &types, &flags).await,
                }
            }
        };
        let (first, second) = (format!("{lang}-drain-a"), format!("{lang}-drain-b"));
        let resume = format!("{lang}.resume");
        let mut a = start(first.clone()).await;
        let run_id = submit(
            &cluster,
            tree(
                &format!("workers-release-{lang}"),
                &[resume.as_str()],
                tool(
                    "work",
                    &resume,
                    json!({"steps": 40, "step_ms": 100}),
                    "worked",
                ),
            ),
        )
        .await;
        let task = a.task_line(&resume).await;
        assert_eq!(task.attempt, 1);
        // Progress is stored (as heartbeat details) before the worker is told to stop.
        let progress = format!("progress id={} ", task.id);
        a.line("progress", |l| l.starts_with(&progress)).await;
        a.signal(Signal::SIGTERM);
        assert_eq!(a.exit_code().await, Some(0), "{}", a.transcript());
        let released = format!("released id={} accepted=true attempt=1", task.id);
        let lines = a.lines();
        let at = |wanted: &str| lines.iter().position(|l| l == wanted);
        assert!(
            matches!((at(&released), at("stopped")), (Some(r), Some(s)) if r < s),
            "released before stopping\n{}",
            a.transcript()
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("completed ")),
            "{}",
            a.transcript()
        );

        // Queued again at once, no attempt spent; another worker goes on from the details.
        let tasks = tasks_of(&cluster, &run_id).await;
        assert_eq!(state(&tasks[0]), rpb::TaskState::Queued, "{tasks:?}");
        assert_eq!(tasks[0].attempt, 0, "attempts spent: {tasks:?}");
        let b = start(second.clone()).await;
        let taken = b.task_line(&resume).await;
        assert_eq!((taken.id.as_str(), taken.attempt), (task.id.as_str(), 1));
        let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
        let worked = &bb["worked"];
        let from = worked["resumed_from"].as_u64().unwrap();
        assert!(from >= 1, "the first worker's progress was lost: {worked}");
        assert_eq!(
            worked,
            &json!({"resumed_from": from, "previous": {"done": from}, "attempt": 1,
                    "worker": second}),
            "the details a task starts with stay the earlier attempt's\n{}",
            b.transcript()
        );
        assert_eq!(
            task_log(&cluster, &run_id).await,
            [
                format!("dispatched {resume} #1 to {first}"),
                format!("released {resume} #1 by {first}"),
                format!("dispatched {resume} #1 to {second}"),
                format!("completed {resume} #1 by {second}"),
            ]
        );
    }
}
