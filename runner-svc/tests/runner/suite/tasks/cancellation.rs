//! A run that no longer wants a task's result: CancelRun, a `timeout` decorator and
//! InterruptThread cancel a queued task outright and flag a leased one, whose worker hears it on
//! its next heartbeat and whose completion is refused.

use super::rig::*;

pub async fn cancelling_a_run_cancels_its_queued_task_and_flags_its_leased_one(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("cancel", remote(WORK, json!({})))).await;
    let mut runs = rig.runs.clone();
    let cancel = |run_id: &str| pb::CancelRunRequest {
        run_id: run_id.into(),
        reason: "the user gave up".into(),
    };

    // No worker has it yet: the task is cancelled outright.
    let queued = rig.submit("cancel", json!({"n": 1})).await;
    rig.task_becomes(&queued, S::Queued).await;
    let run = runs
        .cancel_run(cancel(&queued))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(run.status, pb::RunStatus::Cancelled as i32);
    let task = rig.task_becomes(&queued, S::Cancelled).await;
    assert_eq!(task.attempt, 0);
    assert!(rig.poll("w-1", &[WORK], 30_000, 0).await.is_empty());

    // A worker holds it: it hears of the cancel, and its result is refused.
    let leased = rig.submit("cancel", json!({"n": 2})).await;
    let a = rig.take("w-1", &[WORK], 30_000).await;
    assert_eq!(a.run_id, leased);
    runs.cancel_run(cancel(&leased)).await.unwrap();
    let mut w = rig.w();
    let beat = heartbeat(&mut w, &a, &a.lease_token, None).await.unwrap();
    assert!(beat.cancel_requested);
    let task = rig.task(&leased).await;
    assert_eq!(
        (task.state, task.cancel_requested),
        (S::Leased as i32, true)
    );
    let refused = complete(&mut w, &a, doubled(&a)).await;
    assert!(!refused.accepted);
    assert!(refused.reason.contains("cancel"), "{}", refused.reason);
    assert_eq!(rig.task(&leased).await.state, S::Cancelled as i32);
    let view = rig.finished(&leased).await;
    assert_eq!(view.run.status, RunStatus::Cancelled);
    assert!(
        !view.blackboard.contains_key("result"),
        "nothing written: {:?}",
        view.blackboard
    );
    assert_eq!(rig.count(&leased, EventKind::TaskCompleted).await, 0);
    assert_eq!(rig.count(&leased, EventKind::SuspensionWithdrawn).await, 1);
    rig.served.stop().await;
}

/// Heartbeats until the runner says the task is no longer wanted.
async fn until_cancel_requested(w: &mut Workers, a: &pb::TaskActivation) {
    eventually("the heartbeat to say cancel_requested", WAIT, || {
        let mut w = w.clone();
        async move {
            let beat = heartbeat(&mut w, a, &a.lease_token, None).await.unwrap();
            beat.cancel_requested.then_some(())
        }
    })
    .await
}

pub async fn a_timeout_or_an_interrupt_cancels_a_leased_task(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    let limited = json!({"type": "timeout", "name": "limit", "ms": 1500,
                         "child": remote(WORK, json!({}))});
    rig.register(tree("limited", limited)).await;
    rig.register(tree("chatty", remote(WORK, json!({})))).await;
    let mut w = rig.w();

    let timed = rig.submit("limited", json!({"n": 1})).await;
    let a = rig.take("w-1", &[WORK], 30_000).await;
    until_cancel_requested(&mut w, &a).await;
    let view = rig.finished(&timed).await;
    assert_eq!(view.run.status, RunStatus::Failed);
    assert!(view.run.error.contains("timeout"), "{}", view.run.error);
    assert!(!complete(&mut w, &a, doubled(&a)).await.accepted);
    assert_eq!(rig.task(&timed).await.state, S::Cancelled as i32);
    assert!(
        !rig.runner()
            .get_run(&timed)
            .unwrap()
            .blackboard
            .contains_key("result")
    );

    let chat = rig.submit_on("chatty", "chat-7", json!({"n": 2})).await;
    let b = rig.take("w-1", &[WORK], 30_000).await;
    assert_eq!(b.thread_id, "chat-7");
    rig.runs
        .clone()
        .interrupt_thread(pb::InterruptThreadRequest {
            thread_id: "chat-7".into(),
            reason: "a new message".into(),
            next: None,
        })
        .await
        .unwrap();
    until_cancel_requested(&mut w, &b).await;
    let view = rig.finished(&chat).await;
    assert_eq!(view.run.status, RunStatus::Cancelled);
    assert!(!complete(&mut w, &b, doubled(&b)).await.accepted);
    assert_eq!(rig.task(&chat).await.state, S::Cancelled as i32);
    assert!(
        !rig.runner()
            .get_run(&chat)
            .unwrap()
            .blackboard
            .contains_key("result")
    );
    rig.served.stop().await;
}
