//! Handing tasks out: StreamTasks never holds more than `max_in_flight` unfinished tasks,
//! PollTasks' long poll returns as soon as a task is queued, and concurrent completions with one
//! token reach the run once.

use super::rig::*;

pub async fn a_stream_holds_at_most_max_in_flight_tasks_and_every_run_gets_its_output(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("flow", remote(WORK, json!({})))).await;
    let mut runs = HashMap::new();
    for n in 0..5 {
        runs.insert(rig.submit("flow", json!({"n": n})).await, n);
    }
    eventually("five queued tasks", WAIT, || async {
        (rig.in_states(&[S::Queued]).await.len() == 5).then_some(())
    })
    .await;

    let mut w = rig.w();
    let mut stream = w
        .stream_tasks(pb::StreamTasksRequest {
            worker_id: "w-flow".into(),
            task_types: vec!["rs.*".into()],
            max_in_flight: 2,
            lease_ms: 30_000,
        })
        .await
        .unwrap()
        .into_inner();
    let mut held = vec![
        next_activation(&mut stream).await,
        next_activation(&mut stream).await,
    ];
    let third = tokio::time::timeout(Duration::from_millis(700), stream.message()).await;
    assert!(
        third.is_err(),
        "a third task came while two were held: {third:?}"
    );
    let leased = rig.in_states(&[S::Leased]).await;
    assert_eq!(leased.len(), 2);
    assert!(leased.iter().all(|t| t.worker_id == "w-flow"));
    assert_eq!(rig.in_states(&[S::Queued]).await.len(), 3);

    // Each completion frees one slot, and only one.
    let mut seen = Vec::new();
    let mut done = 0;
    while done < 5 {
        let a = held.remove(0);
        assert!(complete(&mut w, &a, doubled(&a)).await.accepted);
        seen.push(a);
        done += 1;
        if done + held.len() < 5 {
            held.push(next_activation(&mut stream).await);
            assert!(held.len() <= 2);
            if done == 1 {
                let more = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
                assert!(more.is_err(), "a task beyond max_in_flight came: {more:?}");
            }
        }
    }
    let mut ids: Vec<_> = seen.iter().map(|a| a.task_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "five distinct tasks");

    for a in &seen {
        assert_eq!(a.task_type, WORK);
        assert_eq!(a.attempt, 1);
        assert!(a.idempotency_key.starts_with(&format!("{}:", a.run_id)));
        let n = runs[&a.run_id];
        assert_eq!(from_optional_value(a.args.as_ref()), json!({"n": n}));
        let view = rig.finished(&a.run_id).await;
        assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
        assert_eq!(view.blackboard["result"], json!({"doubled": n * 2}));
        assert_eq!(rig.count(&a.run_id, EventKind::TaskDispatched).await, 1);
        assert_eq!(rig.count(&a.run_id, EventKind::TaskCompleted).await, 1);
        assert_eq!(rig.task(&a.run_id).await.state, S::Completed as i32);
    }
    drop(stream);
    rig.served.stop().await;
}

pub async fn concurrent_completions_with_one_token_reach_the_run_once(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    let doc = json!({"type": "sequence", "name": "main", "children": [
        remote(WORK, json!({})),
        {"type": "tool", "name": "record", "tool": "ledger.append",
         "args": {"entry": {"$ref": "result"}}}]});
    rig.register(tree("once", doc)).await;
    let run = rig.submit("once", json!({"n": 1})).await;
    let a = rig.take("w-1", &[WORK], 30_000).await;

    let calls: Vec<_> = (0..16)
        .map(|i| {
            let mut w = rig.w();
            let req = complete_req(&a, &a.lease_token, json!({"call": i}));
            tokio::spawn(async move { w.complete_task(req).await })
        })
        .collect();
    for call in calls {
        let answer = call
            .await
            .unwrap()
            .expect("every completion is OK")
            .into_inner();
        assert!(answer.accepted, "{}", answer.reason);
    }

    let view = rig.finished(&run).await;
    assert_eq!(view.run.status, RunStatus::Succeeded, "{}", view.run.error);
    let result = view.blackboard["result"].clone();
    let call = result["call"].as_i64().expect("one of the outputs");
    assert!((0..16).contains(&call));
    assert_eq!(rig.count(&run, EventKind::TaskCompleted).await, 1);
    let consumed = rig
        .events(&run)
        .await
        .into_iter()
        .filter(|e| matches!(&e.detail, EventDetail::ApprovalConsumed { request_id, .. } if *request_id == a.task_id))
        .count();
    assert_eq!(consumed, 1, "the task's outcome was consumed once");
    assert_eq!(rig.count(&run, EventKind::RunSucceeded).await, 1);
    let ledger = arbor_runner_svc::engine::LedgerTool::new(rig.runner().store().clone()).unwrap();
    let entries: Vec<_> = ledger
        .entries()
        .into_iter()
        .filter(|(key, _)| key.starts_with(&run))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0].1["entry"], result,
        "the next node saw the output that was kept"
    );
    assert_eq!(rig.task(&run).await.state, S::Completed as i32);
    rig.served.stop().await;
}

pub async fn a_long_poll_returns_once_a_task_is_queued_and_empty_after_its_wait(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("polled", remote(WORK, json!({})))).await;

    let started = Instant::now();
    let poll = {
        let mut w = rig.w();
        tokio::spawn(async move { w.poll_tasks(poll_req("w-1", &[WORK], 30_000, 2_000)).await })
    };
    // The poll is in flight before the task exists (nothing else could end it this early).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "the poll returned with nothing queued");
    let run = rig.submit("polled", json!({"n": 1})).await;
    let tasks = poll.await.unwrap().unwrap().into_inner().tasks;
    let took = started.elapsed();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0].run_id, run);
    assert!(
        took < Duration::from_millis(1_500),
        "the poll waited out its time: {took:?}"
    );
    // The activation was durable before it was sent.
    assert_eq!(rig.count(&run, EventKind::TaskDispatched).await, 1);

    let started = Instant::now();
    let none = rig.poll("w-1", &["rs.nothing"], 30_000, 400).await;
    let took = started.elapsed();
    assert!(none.is_empty());
    assert!(
        took >= Duration::from_millis(400),
        "returned early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(2_000),
        "returned late: {took:?}"
    );

    let mut w = rig.w();
    assert!(
        complete(&mut w, &tasks[0], doubled(&tasks[0]))
            .await
            .accepted
    );
    assert_eq!(rig.finished(&run).await.run.status, RunStatus::Succeeded);
    rig.served.stop().await;
}

/// A poll that goes away while its dispatch commits (a worker whose connection is cut drops the
/// RPC) leaves the task leased to it, as a dispatch does, and its TASK_DISPATCHED event is
/// streamed at once: on an otherwise idle runner no later commit would publish it.
pub async fn a_dispatch_whose_poller_went_away_is_streamed_at_once(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(b, dir.path()).await;
    rig.register(tree("gone", remote(WORK, json!({})))).await;
    let run = rig.submit("gone", json!({"n": 1})).await;
    rig.task_becomes(&run, S::Queued).await;
    let events = rig.runner().events();
    eventually("the run's step to be streamable", WAIT, || async {
        (events.durable_seq() >= events.last_seq().unwrap()).then_some(())
    })
    .await;
    let streamed = events.durable_seq();

    let types = globset::GlobSetBuilder::new()
        .add(globset::Glob::new(WORK).unwrap())
        .build()
        .unwrap();
    {
        // Polled once: the dispatch is sent to the store; then dropped.
        let mut poll = std::pin::pin!(rig.runner().take_tasks("w-gone", &types, 30_000, 1));
        assert!(futures_util::poll!(poll.as_mut()).is_pending());
    }
    let task = rig.task_becomes(&run, S::Leased).await;
    assert_eq!(task.worker_id, "w-gone");
    // Read without `caught_up`, which would publish the event itself.
    let dispatched = eventually("TASK_DISPATCHED to be streamable", WAIT, || async {
        let durable = events.durable_seq();
        events
            .read_after(streamed, 100)
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.kind() == EventKind::TaskDispatched && e.seq <= durable)
    })
    .await;
    assert_eq!(dispatched.run_id, run);
    rig.served.stop().await;
}
