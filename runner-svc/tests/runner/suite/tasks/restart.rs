//! A runner restart under tasks: a leased task keeps its lease and its token works until the
//! lease ends, a queued task stays queued, and a lease that ran out meanwhile is tried again.

use super::rig::*;

pub async fn leased_and_queued_tasks_survive_a_runner_restart(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(backend, dir.path()).await;
    let doc = json!({"type": "sequence", "name": "main", "children": [
        {"type": "selector", "name": "pick", "children": [
            {"type": "sequence", "name": "held", "children": [
                {"type": "condition", "name": "is-held", "key": "kind", "op": "eq", "value": "held"},
                remote(WORK, json!({"name": "hold"}))]},
            {"type": "sequence", "name": "expiring", "children": [
                {"type": "condition", "name": "is-expiring", "key": "kind", "op": "eq", "value": "expiring"},
                remote("rs.expire", json!({"name": "expire"}))]},
            remote("rs.later", json!({"name": "later"}))]}]});
    rig.register(tree("restart", doc)).await;
    let held = rig.submit("restart", json!({"kind": "held", "n": 1})).await;
    let a = rig.take("w-1", &[WORK], 60_000).await;
    let expiring = rig
        .submit("restart", json!({"kind": "expiring", "n": 2}))
        .await;
    let b = rig.take("w-1", &["rs.expire"], 300).await;
    let queued = rig
        .submit("restart", json!({"kind": "queued", "n": 3}))
        .await;
    rig.task_becomes(&queued, S::Queued).await;
    let lease_before = rig.task(&held).await.lease_until.unwrap();

    rig.served.stop().await;
    let rig = Rig::start(backend, dir.path()).await;
    let mut w = rig.w();

    // The held lease is as it was, and its token still works.
    let task = rig.task(&held).await;
    assert_eq!(
        (task.state, task.worker_id.as_str()),
        (S::Leased as i32, "w-1")
    );
    assert_eq!(task.lease_until.unwrap(), lease_before);
    let beat = heartbeat(&mut w, &a, &a.lease_token, Some(json!({"half": true})))
        .await
        .unwrap();
    assert!(from_timestamp(&beat.lease_until.unwrap()) >= from_timestamp(&lease_before));
    assert!(complete(&mut w, &a, doubled(&a)).await.accepted);
    let view = rig.finished(&held).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["result"], json!({"doubled": 2}));

    // The queued task is still queued, for its first attempt.
    let task = rig.task(&queued).await;
    assert_eq!((task.state, task.attempt), (S::Queued as i32, 0));
    let c = rig.take("w-2", &["rs.later"], 30_000).await;
    assert_eq!((c.run_id.as_str(), c.attempt), (queued.as_str(), 1));
    assert!(complete(&mut w, &c, doubled(&c)).await.accepted);
    assert_eq!(
        rig.finished(&queued).await.blackboard["result"],
        json!({"doubled": 6})
    );

    // The short lease ended meanwhile: its token is void, the task goes on as attempt 2.
    let b2 = rig.take("w-2", &["rs.expire"], 30_000).await;
    assert_eq!((b2.task_id.as_str(), b2.attempt), (b.task_id.as_str(), 2));
    assert_eq!(
        code(heartbeat(&mut w, &b, &b.lease_token, None).await),
        Code::Aborted
    );
    assert!(complete(&mut w, &b2, doubled(&b2)).await.accepted);
    let view = rig.finished(&expiring).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["result"], json!({"doubled": 4}));
    rig.served.stop().await;
}
