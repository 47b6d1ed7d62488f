//! ReleaseTask: the lease holder gives a task back without spending an attempt — it is queued
//! at once for any worker, with the same attempt number and its heartbeat's details — while a
//! release by anyone else (a foreign, stale or expired token) is ABORTED and changes nothing.
//! Also ListTasks' and ListRuns' page sizes: above the maximum they are clamped, not refused.

use super::rig::*;

pub async fn a_released_task_is_taken_by_another_worker_on_the_same_attempt(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("release", remote(WORK, json!({"attempts": 2}))))
        .await;
    let run = rig.submit("release", json!({"n": 5})).await;
    let a = rig.take("w-draining", &[WORK], 30_000).await;
    assert_eq!(a.attempt, 1);
    let mut w = rig.w();
    heartbeat(&mut w, &a, &a.lease_token, Some(json!({"page": 7})))
        .await
        .unwrap();

    let out = release(&mut w, &a, &a.lease_token, "draining")
        .await
        .unwrap();
    assert_eq!((out.accepted, out.attempt), (true, 1), "{out:?}");
    // Queued again at once: no attempt spent, nothing failed.
    let task = rig.task(&run).await;
    assert_eq!(
        (task.state, task.attempt, task.cancel_requested),
        (S::Queued as i32, 0, false)
    );
    let events = rig.task_event_count(&run).await;
    // A repeat (its answer was lost) is answered the same and changes nothing.
    let again = release(&mut w, &a, &a.lease_token, "draining")
        .await
        .unwrap();
    assert_eq!((again.accepted, again.attempt), (true, 1));
    assert_eq!(rig.task_event_count(&run).await, events);
    // The released token acts on nothing any more.
    assert_eq!(
        code(heartbeat(&mut w, &a, &a.lease_token, None).await),
        Code::Aborted
    );
    let fail = w
        .fail_task(pb::FailTaskRequest {
            task_id: a.task_id.clone(),
            lease_token: a.lease_token.clone(),
            error: "late".into(),
            retryable: true,
            backoff_ms: None,
        })
        .await;
    assert_eq!(code(fail), Code::Aborted);

    let b = rig.take("w-fresh", &[WORK], 30_000).await;
    assert_eq!(b.task_id, a.task_id);
    assert_eq!(b.attempt, 1, "the released attempt is not spent");
    assert_ne!(b.lease_token, a.lease_token);
    assert_eq!(b.idempotency_key, a.idempotency_key);
    assert_eq!(from_optional_value(b.details.as_ref()), json!({"page": 7}));
    // Now the task is the other worker's: the first one's repeat is stale.
    assert_eq!(
        code(release(&mut w, &a, &a.lease_token, "draining").await),
        Code::Aborted
    );
    assert!(complete(&mut w, &b, doubled(&b)).await.accepted);

    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["result"], json!({"doubled": 10}));
    let task = rig.task(&run).await;
    assert_eq!(
        (task.state, task.attempt, task.worker_id.as_str()),
        (S::Completed as i32, 1, "w-fresh")
    );
    assert!(rig.failures(&run).await.is_empty());
    let released: Vec<_> = rig
        .events(&run)
        .await
        .into_iter()
        .filter_map(|e| match e.detail {
            EventDetail::TaskReleased { task, reason } => {
                Some((task.attempt, task.worker_id, reason))
            }
            _ => None,
        })
        .collect();
    assert_eq!(released, [(1, "w-draining".to_string(), "draining".into())]);
    assert_eq!(rig.count(&run, EventKind::TaskDispatched).await, 2);
    rig.served.stop().await;
}

pub async fn a_release_by_anyone_but_the_lease_holder_is_refused_and_changes_nothing(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("release-fence", remote(WORK, json!({}))))
        .await;
    let run = rig.submit("release-fence", json!({"n": 1})).await;
    let a = rig.take("w-holder", &[WORK], 30_000).await;
    let other_run = rig.submit("release-fence", json!({"n": 2})).await;
    let b = rig.take("w-other", &[WORK], 30_000).await;
    assert_eq!(b.run_id, other_run);
    let before = rig.task(&run).await;
    let events = rig.task_event_count(&run).await;
    let mut w = rig.w();

    for wrong in ["not-the-token", b.lease_token.as_str()] {
        assert_eq!(code(release(&mut w, &a, wrong, "").await), Code::Aborted);
    }
    let ghost = pb::TaskActivation {
        task_id: "no-such-task".into(),
        ..a.clone()
    };
    assert_eq!(
        code(release(&mut w, &ghost, &a.lease_token, "").await),
        Code::NotFound
    );
    assert_eq!(
        code(release(&mut w, &a, "", "").await),
        Code::InvalidArgument
    );
    let long = "r".repeat(64 * 1024 + 1);
    assert_eq!(
        code(release(&mut w, &a, &a.lease_token, &long).await),
        Code::InvalidArgument
    );
    assert_eq!(
        rig.task(&run).await,
        before,
        "a refused release changed the task"
    );
    assert_eq!(rig.task_event_count(&run).await, events);
    // Still the holder's to finish.
    assert!(complete(&mut w, &a, doubled(&a)).await.accepted);
    assert_eq!(rig.finished(&run).await.run.status, RunStatus::Succeeded);
    // An ended task cannot be released either.
    assert_eq!(
        code(release(&mut w, &a, &a.lease_token, "").await),
        Code::Aborted
    );
    rig.served.stop().await;
}

pub async fn a_release_after_the_lease_ran_out_or_the_run_cancelled_the_task_queues_nothing(
    b: Backend,
) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("release-late", remote(WORK, json!({}))))
        .await;
    let mut w = rig.w();

    // The lease ran out and was reaped (attempt 1 spent): its token releases nothing.
    let expired = rig.submit("release-late", json!({"n": 1})).await;
    let a = rig.take("w-slow", &[WORK], 200).await;
    let task = rig.task_becomes(&expired, S::Queued).await;
    assert_eq!(task.attempt, 1);
    let events = rig.task_event_count(&expired).await;
    assert_eq!(
        code(release(&mut w, &a, &a.lease_token, "").await),
        Code::Aborted
    );
    assert_eq!(rig.task(&expired).await, task);
    assert_eq!(rig.task_event_count(&expired).await, events);
    let retry = rig.take("w-next", &[WORK], 30_000).await;
    assert_eq!(retry.attempt, 2);
    assert!(complete(&mut w, &retry, doubled(&retry)).await.accepted);

    // The run no longer wants the task: releasing it cancels it instead of queuing it.
    let cancelled = rig.submit("release-late", json!({"n": 2})).await;
    let c = rig.take("w-1", &[WORK], 30_000).await;
    rig.runs
        .clone()
        .cancel_run(pb::CancelRunRequest {
            run_id: cancelled.clone(),
            reason: "not needed".into(),
        })
        .await
        .unwrap();
    let out = release(&mut w, &c, &c.lease_token, "").await.unwrap();
    assert!(!out.accepted);
    assert!(out.reason.contains("cancel"), "{}", out.reason);
    assert_eq!(rig.task(&cancelled).await.state, S::Cancelled as i32);
    assert!(rig.poll("w-2", &[WORK], 30_000, 0).await.is_empty());
    rig.served.stop().await;
}

pub async fn a_page_size_above_the_maximum_is_clamped_not_refused(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("pages", remote(WORK, json!({})))).await;
    let mut runs = Vec::new();
    for n in 0..3 {
        runs.push(rig.submit("pages", json!({"n": n})).await);
    }
    for run in &runs {
        rig.task_becomes(run, S::Queued).await;
    }
    for size in [1001, u32::MAX] {
        let page = rig
            .w()
            .list_tasks(pb::ListTasksRequest {
                page_size: size,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.tasks.len(), 3, "ListTasks, page size {size}");
        assert!(page.next_page_token.is_empty());
        let page = rig
            .runs
            .clone()
            .list_runs(pb::ListRunsRequest {
                page_size: size,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.runs.len(), 3, "ListRuns, page size {size}");
        let jobs = rig
            .runs
            .clone()
            .list_jobs(pb::ListJobsRequest {
                page_size: size,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!jobs.jobs.is_empty(), "ListJobs, page size {size}");
    }
    rig.served.stop().await;
}
