//! `external` nodes are tasks too: a worker takes and completes one, or RunnerService.Resolve
//! answers it and voids the worker's lease; Resolve on a remote tool's task is refused.

use super::rig::*;

pub async fn an_external_node_is_a_task_that_a_worker_or_a_resolve_answers(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    let backup = json!({"type": "external", "name": "backup", "execution_kind": "rs.backup",
                        "task": {"db": {"$ref": "db"}}, "output": "snapshot"});
    rig.register(tree("backup", backup)).await;
    rig.register(tree("tooled", remote(WORK, json!({})))).await;
    let mut w = rig.w();
    let mut runs = rig.runs.clone();
    let resolve = |run_id: &str, request_id: &str, result: Json| pb::ResolveRequest {
        run_id: run_id.into(),
        request_id: request_id.into(),
        decision_id: format!("ops-{request_id}"),
        action: pb::ResolveAction::Resume.into(),
        result: val(result),
        reason: "done by hand".into(),
        decided_by: "ops".into(),
        ..Default::default()
    };

    // A worker serves it.
    let by_worker = rig.submit("backup", json!({"db": "main"})).await;
    let a = rig.take("w-ext", &["rs.*"], 30_000).await;
    assert_eq!(a.task_type, "rs.backup");
    assert_eq!(from_optional_value(a.args.as_ref()), json!({"db": "main"}));
    assert!(complete(&mut w, &a, json!({"snap": "s-1"})).await.accepted);
    let view = rig.finished(&by_worker).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["snapshot"], json!({"snap": "s-1"}));
    assert_eq!(rig.task(&by_worker).await.state, S::Completed as i32);

    // Resolve answers it while a worker holds it: the worker's lease is void.
    let by_hand = rig.submit("backup", json!({"db": "aux"})).await;
    let b = rig.take("w-ext", &["rs.*"], 30_000).await;
    assert_eq!(b.run_id, by_hand);
    let result = json!({"status": "succeeded", "result": {"snap": "by-hand"}});
    runs.resolve(resolve(&by_hand, &b.task_id, result))
        .await
        .unwrap();
    let view = rig.finished(&by_hand).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    assert_eq!(view.blackboard["snapshot"], json!({"snap": "by-hand"}));
    assert_eq!(rig.task(&by_hand).await.state, S::Resolved as i32);
    let late = w
        .complete_task(complete_req(&b, &b.lease_token, json!({"snap": "late"})))
        .await;
    assert_eq!(code(late), Code::Aborted);
    assert_eq!(
        code(heartbeat(&mut w, &b, &b.lease_token, None).await),
        Code::Aborted
    );
    assert_eq!(
        rig.runner().get_run(&by_hand).unwrap().blackboard["snapshot"],
        json!({"snap": "by-hand"})
    );

    // A remote tool's task is the workers' alone.
    let tooled = rig.submit("tooled", json!({"n": 3})).await;
    let c = rig.take("w-ext", &[WORK], 30_000).await;
    let r = runs
        .resolve(resolve(
            &tooled,
            &c.task_id,
            json!({"status": "succeeded", "result": 1}),
        ))
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);
    assert_eq!(rig.task(&tooled).await.state, S::Leased as i32);
    assert!(complete(&mut w, &c, doubled(&c)).await.accepted);
    assert_eq!(
        rig.finished(&tooled).await.blackboard["result"],
        json!({"doubled": 6})
    );
    rig.served.stop().await;
}
