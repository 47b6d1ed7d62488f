//! Fencing by lease token: a wrong token is ABORTED and changes nothing, bad fields are
//! INVALID_ARGUMENT, and a lease that runs out voids its token — the task is tried again with
//! its heartbeat's details, or with no attempt left its run fails.

use super::rig::*;

pub async fn a_wrong_token_is_aborted_and_changes_nothing_and_bad_fields_are_invalid(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("fence", remote(WORK, json!({})))).await;
    let run = rig.submit("fence", json!({"n": 1})).await;
    let a = rig.take("w-fence", &[WORK], 30_000).await;
    let other_run = rig.submit("fence", json!({"n": 2})).await;
    let b = rig.take("w-other", &[WORK], 30_000).await;
    assert_eq!(
        (a.run_id.as_str(), b.run_id.as_str()),
        (run.as_str(), other_run.as_str())
    );
    let events_before = rig.task_event_count(&run).await;
    let mut w = rig.w();

    // A made-up token, and another task's real one: both foreign.
    for wrong in ["not-the-token", b.lease_token.as_str()] {
        let r = w
            .complete_task(complete_req(&a, wrong, json!({"x": 1})))
            .await;
        assert_eq!(code(r), Code::Aborted);
        assert_eq!(
            code(heartbeat(&mut w, &a, wrong, Some(json!({"p": 1}))).await),
            Code::Aborted
        );
        let fail = w
            .fail_task(pb::FailTaskRequest {
                task_id: a.task_id.clone(),
                lease_token: wrong.into(),
                error: "boom".into(),
                retryable: false,
                backoff_ms: None,
            })
            .await;
        assert_eq!(code(fail), Code::Aborted);
        let throw = w
            .throw_error(pb::ThrowErrorRequest {
                task_id: a.task_id.clone(),
                lease_token: wrong.into(),
                code: "E_X".into(),
                message: "no".into(),
            })
            .await;
        assert_eq!(code(throw), Code::Aborted);
    }

    // An unknown task.
    let ghost = pb::TaskActivation {
        task_id: "no-such-task".into(),
        ..a.clone()
    };
    let r = w
        .complete_task(complete_req(&ghost, &a.lease_token, json!(1)))
        .await;
    assert_eq!(code(r), Code::NotFound);
    assert_eq!(
        code(heartbeat(&mut w, &ghost, &a.lease_token, None).await),
        Code::NotFound
    );

    // Empty and oversized fields, with the right token: refused before anything is looked at.
    let long_id = "t".repeat(129);
    let big = "e".repeat(64 * 1024 + 1);
    for (task_id, token) in [
        ("", a.lease_token.as_str()),
        (a.task_id.as_str(), ""),
        (long_id.as_str(), a.lease_token.as_str()),
    ] {
        let r = w
            .complete_task(pb::CompleteTaskRequest {
                task_id: task_id.into(),
                lease_token: token.into(),
                output: val(json!(1)),
            })
            .await;
        assert_eq!(
            code(r),
            Code::InvalidArgument,
            "task_id {task_id:?} token {token:?}"
        );
    }
    let fail = |error: &str, backoff_ms: Option<u32>| pb::FailTaskRequest {
        task_id: a.task_id.clone(),
        lease_token: a.lease_token.clone(),
        error: error.into(),
        retryable: true,
        backoff_ms,
    };
    assert_eq!(
        code(w.fail_task(fail(&big, None)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(w.fail_task(fail("x", Some(3_600_001))).await),
        Code::InvalidArgument
    );
    let throw = |code: &str, message: &str| pb::ThrowErrorRequest {
        task_id: a.task_id.clone(),
        lease_token: a.lease_token.clone(),
        code: code.into(),
        message: message.into(),
    };
    for (c, m) in [("", "m"), (long_id.as_str(), "m"), ("E_X", big.as_str())] {
        assert_eq!(
            code(w.throw_error(throw(c, m)).await),
            Code::InvalidArgument,
            "code {c:?}"
        );
    }
    let stream =
        |worker: &str, types: &[&str], max_in_flight: u32, lease_ms: u32| pb::StreamTasksRequest {
            worker_id: worker.into(),
            task_types: types.iter().map(|t| t.to_string()).collect(),
            max_in_flight,
            lease_ms,
        };
    for bad in [
        stream("w", &["rs.[oops"], 1, 0),
        stream("w", &["rs.{a"], 1, 0),
        stream("w", &[], 1, 0),
        stream("w", &[""], 1, 0),
        stream("w", &[WORK], 0, 0),
        stream("w", &[WORK], 1025, 0),
        stream("w", &[WORK], 1, 5),
        stream("w", &[WORK], 1, 3_600_001),
        stream("", &[WORK], 1, 0),
        stream(&long_id, &[WORK], 1, 0),
    ] {
        let what = format!("{bad:?}");
        assert_eq!(
            code(w.stream_tasks(bad).await),
            Code::InvalidArgument,
            "{what}"
        );
    }
    for bad in [
        poll_req("w", &["rs.[oops"], 0, 0),
        poll_req("w", &[WORK], 5, 0),
        poll_req("w", &[WORK], 0, 60_001),
        poll_req("", &[WORK], 0, 0),
    ] {
        let what = format!("{bad:?}");
        assert_eq!(
            code(w.poll_tasks(bad).await),
            Code::InvalidArgument,
            "{what}"
        );
    }
    // A pattern over the length limit is refused with a message that names the limit, in
    // StreamTasks, PollTasks and ListTasks alike.
    let long_pattern = format!("rs.{}*", "x".repeat(126));
    let refusals = [
        w.stream_tasks(stream("w", &[WORK, &long_pattern], 1, 0))
            .await
            .map(|_| ())
            .unwrap_err(),
        w.poll_tasks(poll_req("w", &[&long_pattern], 0, 0))
            .await
            .map(|_| ())
            .unwrap_err(),
        w.list_tasks(pb::ListTasksRequest {
            task_type: long_pattern.clone(),
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err(),
    ];
    for refused in refusals {
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().contains("1-128 bytes") && refused.message().contains("130"),
            "{}",
            refused.message()
        );
    }

    // Nothing of all that changed the task or the run.
    let task = rig.task(&run).await;
    assert_eq!(task.state, S::Leased as i32);
    assert_eq!((task.attempt, task.worker_id.as_str()), (1, "w-fence"));
    assert!(!task.cancel_requested && task.last_error.is_empty());
    let view = rig.runner().get_run(&run).unwrap();
    assert_eq!(view.run.status, RunStatus::Suspended);
    assert!(!view.blackboard.contains_key("result"));
    assert_eq!(
        rig.task_event_count(&run).await,
        events_before,
        "no TASK_* event was added"
    );

    // The right tokens still work.
    for t in [&a, &b] {
        assert!(complete(&mut w, t, doubled(t)).await.accepted);
    }
    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["result"], json!({"doubled": 2}));
    assert_eq!(
        rig.finished(&other_run).await.blackboard["result"],
        json!({"doubled": 4})
    );
    rig.served.stop().await;
}

pub async fn an_expired_lease_is_tried_again_with_its_details_and_the_old_token_is_aborted(
    b: Backend,
) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("expiry", remote(WORK, json!({})))).await;
    let run = rig.submit("expiry", json!({"n": 4})).await;
    let mut w = rig.w();
    let first = rig.take("w-1", &[WORK], 300).await;
    assert_eq!(
        (first.attempt, first.max_attempts, first.lease_ms),
        (1, 3, 300)
    );
    assert_eq!(from_optional_value(first.details.as_ref()), Json::Null);
    let beat = heartbeat(&mut w, &first, &first.lease_token, Some(json!({"page": 3})))
        .await
        .unwrap();
    assert!(!beat.cancel_requested);
    assert!(
        from_timestamp(&beat.lease_until.unwrap())
            >= from_timestamp(first.lease_until.as_ref().unwrap())
    );

    // The worker goes quiet; its lease runs out and the task comes back as attempt 2.
    let second = rig.take("w-2", &[WORK], 30_000).await;
    assert_eq!(second.task_id, first.task_id);
    assert_eq!(second.attempt, 2);
    assert_ne!(second.lease_token, first.lease_token);
    assert_eq!(second.idempotency_key, first.idempotency_key);
    assert_eq!(
        from_optional_value(second.details.as_ref()),
        json!({"page": 3})
    );

    assert_eq!(
        code(heartbeat(&mut w, &first, &first.lease_token, None).await),
        Code::Aborted
    );
    let late = w
        .complete_task(complete_req(
            &first,
            &first.lease_token,
            json!({"late": true}),
        ))
        .await;
    assert_eq!(code(late), Code::Aborted);
    let task = rig.task(&run).await;
    assert_eq!(
        (task.state, task.attempt, task.worker_id.as_str()),
        (S::Leased as i32, 2, "w-2")
    );
    let failures = rig.failures(&run).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    let (attempt, cause, will_retry, _, _, error) = &failures[0];
    assert_eq!(
        (*attempt, *cause, *will_retry),
        (1, TaskFailure::LeaseExpired, true)
    );
    assert!(error.contains("w-1"), "{error}");

    assert!(
        complete(&mut w, &second, json!({"by": "w-2"}))
            .await
            .accepted
    );
    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["result"], json!({"by": "w-2"}));
    assert_eq!(rig.count(&run, EventKind::TaskDispatched).await, 2);
    assert_eq!(rig.count(&run, EventKind::TaskCompleted).await, 1);
    rig.served.stop().await;
}

pub async fn with_one_attempt_an_expired_lease_fails_the_run(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("expiry-once", remote(WORK, json!({"attempts": 1}))))
        .await;
    let run = rig.submit("expiry-once", json!({"n": 4})).await;
    let a = rig.take("w-1", &[WORK], 200).await;
    assert_eq!(a.max_attempts, 1);

    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Failed);
    assert!(view.run.error.contains("lease"), "{}", view.run.error);
    assert!(!view.blackboard.contains_key("result"));
    let task = rig.task(&run).await;
    assert_eq!(task.state, S::Failed as i32);
    assert!(task.last_error.contains("lease"), "{}", task.last_error);
    let failures = rig.failures(&run).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        (failures[0].1, failures[0].2),
        (TaskFailure::LeaseExpired, false)
    );
    // The expired lease's token is void for every call.
    let mut w = rig.w();
    let late = w
        .complete_task(complete_req(&a, &a.lease_token, json!(1)))
        .await;
    assert_eq!(code(late), Code::Aborted);
    let late = w
        .fail_task(pb::FailTaskRequest {
            task_id: a.task_id.clone(),
            lease_token: a.lease_token.clone(),
            error: "late".into(),
            retryable: true,
            backoff_ms: None,
        })
        .await;
    assert_eq!(code(late), Code::Aborted);
    let late = w
        .throw_error(pb::ThrowErrorRequest {
            task_id: a.task_id.clone(),
            lease_token: a.lease_token.clone(),
            code: "E_LATE".into(),
            message: "late".into(),
        })
        .await;
    assert_eq!(code(late), Code::Aborted);
    assert_eq!(rig.failures(&run).await.len(), 1);
    rig.served.stop().await;
}
