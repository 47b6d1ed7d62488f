//! How an attempt fails: FailTask retries after its backoff or fails the run at once, and
//! ThrowError puts `{code, message, node}` on the blackboard for a selector to route on.

use super::rig::*;

pub async fn a_retryable_failure_waits_out_its_backoff_then_the_next_attempt_succeeds(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("flaky", remote(WORK, json!({})))).await;
    let run = rig.submit("flaky", json!({"n": 5})).await;
    let mut w = rig.w();
    let a = rig.take("w-1", &[WORK], 30_000).await;
    let failed = pb::FailTaskRequest {
        task_id: a.task_id.clone(),
        lease_token: a.lease_token.clone(),
        error: "upstream 503".into(),
        retryable: true,
        backoff_ms: Some(200),
    };
    let out = w.fail_task(failed.clone()).await.unwrap().into_inner();
    // Straight away: the task is waiting out its backoff, nothing to take.
    let early = rig.poll("w-2", &[WORK], 30_000, 0).await;
    assert!(early.is_empty(), "dispatched during its backoff: {early:?}");
    assert!(out.will_retry);
    assert_eq!(out.attempt, 1);
    let retry_at = from_timestamp(out.retry_at.as_ref().unwrap());
    assert!(retry_at >= from_timestamp(a.dispatched_at.as_ref().unwrap()) + 200);

    let task = rig.task(&run).await;
    assert_eq!((task.state, task.attempt), (S::Queued as i32, 1));
    assert_eq!(
        from_timestamp(task.available_at.as_ref().unwrap()),
        retry_at
    );
    assert_eq!(task.last_error, "upstream 503");
    let failures = rig.failures(&run).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    let (attempt, cause, will_retry, at, _, error) = &failures[0];
    assert_eq!(
        (*attempt, *cause, *will_retry, *at),
        (1, TaskFailure::Failed, true, retry_at)
    );
    assert_eq!(error, "upstream 503");
    // A repeat (its answer was lost) gets the same answer and changes nothing.
    let again = w.fail_task(failed).await.unwrap().into_inner();
    assert_eq!(again, out);
    assert_eq!(rig.failures(&run).await.len(), 1);

    let b = rig.take("w-2", &[WORK], 30_000).await;
    assert_eq!((b.task_id.as_str(), b.attempt), (a.task_id.as_str(), 2));
    assert!(
        from_timestamp(b.dispatched_at.as_ref().unwrap()) >= retry_at,
        "dispatched before its retry time"
    );
    assert!(complete(&mut w, &b, doubled(&b)).await.accepted);
    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["result"], json!({"doubled": 10}));
    rig.served.stop().await;
}

pub async fn a_failure_that_is_not_retryable_fails_the_run_at_once(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("fatal", remote(WORK, json!({})))).await;
    let run = rig.submit("fatal", json!({"n": 5})).await;
    let a = rig.take("w-1", &[WORK], 30_000).await;
    let out = rig
        .w()
        .fail_task(pb::FailTaskRequest {
            task_id: a.task_id.clone(),
            lease_token: a.lease_token.clone(),
            error: "bad input: n is odd".into(),
            retryable: false,
            backoff_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!out.will_retry);
    assert_eq!((out.attempt, out.retry_at), (1, None));
    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Failed);
    assert!(
        view.run.error.contains("bad input: n is odd"),
        "{}",
        view.run.error
    );
    assert_eq!(rig.task(&run).await.state, S::Failed as i32);
    let failures = rig.failures(&run).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!((failures[0].1, failures[0].2), (TaskFailure::Failed, false));
    assert_eq!(
        rig.count(&run, EventKind::TaskDispatched).await,
        1,
        "not tried again"
    );
    rig.served.stop().await;
}

pub async fn a_thrown_business_error_lands_on_the_blackboard_and_a_selector_falls_back(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    let root = json!({"type": "selector", "name": "route", "children": [
        {"type": "tool", "name": "reserve", "tool": "rs.reserve", "args": {"sku": "x-1"},
         "output": "reservation", "error_output": "reserve_error"},
        {"type": "sequence", "name": "fallback", "children": [
            {"type": "condition", "name": "out-of-stock", "key": "reserve_error.code",
             "op": "eq", "value": "E_STOCK"},
            {"type": "set", "name": "backorder", "key": "route", "value": "backorder"}]}]});
    rig.register(tree("throws", root)).await;
    let run = rig.submit("throws", json!({})).await;
    let a = rig.take("w-1", &["rs.reserve"], 30_000).await;
    let throw = pb::ThrowErrorRequest {
        task_id: a.task_id.clone(),
        lease_token: a.lease_token.clone(),
        code: "E_STOCK".into(),
        message: "none left".into(),
    };
    let thrown = rig
        .w()
        .throw_error(throw.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(thrown.accepted, "{}", thrown.reason);

    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(
        view.blackboard["reserve_error"],
        json!({"code": "E_STOCK", "message": "none left", "node": a.node_locator})
    );
    assert_eq!(view.blackboard["route"], json!("backorder"));
    assert!(!view.blackboard.contains_key("reservation"));
    assert_eq!(rig.task(&run).await.state, S::Errored as i32);
    let failures = rig.failures(&run).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    let (_, cause, will_retry, _, code_seen, _) = &failures[0];
    assert_eq!(
        (*cause, *will_retry, code_seen.as_str()),
        (TaskFailure::Error, false, "E_STOCK")
    );
    let again = rig
        .w()
        .complete_task(complete_req(&a, &a.lease_token, json!(1)))
        .await;
    assert_eq!(code(again), Code::Aborted, "the task is closed");
    let repeat = rig.w().throw_error(throw).await.unwrap().into_inner();
    assert!(
        repeat.accepted,
        "a repeat gets the same answer: {}",
        repeat.reason
    );
    assert_eq!(rig.failures(&run).await.len(), 1, "and changes nothing");
    rig.served.stop().await;
}
