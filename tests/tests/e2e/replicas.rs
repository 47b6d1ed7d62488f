//! Replicas on PostgreSQL: two runner-svc and two approval-svc processes on one database, with
//! every client call on a different replica than the one before it. Every kind of suspension
//! goes round the loop across replicas (an approval gate decided through the approval replica
//! that does not lead, a tool call that the runner's guards turn into an approval, user input,
//! an external result), both runner replicas stream the same gap-free event log, a SIGKILLed
//! runner replica's leases go to the other one, and a SIGKILLed approval leader hands over to
//! the other approval replica, which delivers the decisions taken meanwhile; before and after,
//! every approval replica names the one leader (`GetLeader`, its gauge, `approval-svc leader`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use arbor_shared::{json::from_proto_struct, proto::approval::v1 as apb, proto::runner::v1 as rpb};
use arbor_testkit::PgCluster;
use arbor_tests::{
    Profile, WAIT,
    chaos::verify::{full_log, read_ledger_postgres},
    clients::{ApprovalClient, RunnerClient, approvals_as, runner_as},
    eventually,
    flow::{answer, decide, suspension_of, watch_for},
    process::Replicas,
    scrape::scrape,
    secured::{register, submit, wait_approval, wait_run},
};
use rpb::{DecisionKind as D, EventKind as K, SuspensionCategory as C};
use serde_json::{Value as Json, json};

/// One of each suspension kind: a gate around a ledger append, `math.add` (which the guards
/// below make ask), a user input and an external execution. The gate's title holds a NUL
/// character, as text a tool copied from a terminal might: PostgreSQL keeps it as given.
fn flow_tree() -> String {
    json!({"id": "replica-flow", "version": 1,
        "root": {"type": "sequence", "name": "main", "children": [
            {"type": "set", "name": "plan", "key": "plan", "value": {"service": "billing", "replicas": 3}},
            {"type": "approval", "name": "gate", "phase": "before", "on_reject": "failure",
             "title": TITLE, "context": ["plan"],
             "child": {"type": "tool", "name": "ship", "tool": "ledger.append",
                       "args": {"entry": {"$ref": "plan"}}, "output": "receipt"}},
            {"type": "tool", "name": "sum", "tool": "math.add", "args": {"a": 2, "b": 3},
             "output": "sum"},
            {"type": "user_input", "name": "notes", "input_kind": "text", "prompt": "Notes?",
             "schema": {"type": "string", "minLength": 1}, "output": "notes"},
            {"type": "external", "name": "provision", "execution_kind": "webhook",
             "task": {"plan": {"$ref": "plan"}}, "output": "provisioned"}
        ]}})
    .to_string()
}

/// The gate's title.
const TITLE: &str = "Ship it?\0 (pasted)";

/// The runner's guards: every `math.*` call needs a person's confirmation.
const GUARDS: &str = "[[rules]]\ntool = \"math.*\"\npolicy = \"ask\"\n";

/// Starts 2 runner + 2 approval replicas on a fresh database of the shared cluster.
async fn replicas(hint: &str, runner_args: &[&str]) -> Replicas {
    let url = PgCluster::shared().fresh_database(hint);
    let mut r = Replicas::prepare(
        Profile::Debug,
        &url,
        (2, 2),
        runner_args.iter().map(|s| s.to_string()).collect(),
        Vec::new(),
    );
    let guards = r.dir.path().join("guards.toml");
    std::fs::write(&guards, GUARDS).unwrap();
    for runner in &mut r.runners {
        runner
            .extra_args
            .extend(["--guards".to_string(), guards.display().to_string()]);
    }
    for (i, approval) in r.approvals.iter_mut().enumerate() {
        approval
            .extra_args
            .extend(["--replica-name".to_string(), format!("approval-{i}")]);
    }
    r.start_all().await;
    r
}

/// Waits until every running approval replica names approval replica `leader` as the leader
/// (`GetLeader`), and exactly that one says it leads, on `GetLeader` and on its
/// `arbor_approval_leader` gauge; `approval-svc leader` prints its name.
async fn wait_named_leader(r: &Replicas, c: &Clients, leader: usize) {
    let name = format!("approval-{leader}");
    for (i, a) in r
        .approvals
        .iter()
        .enumerate()
        .filter(|(_, a)| a.is_running())
    {
        let want = apb::GetLeaderResponse {
            replica: format!("approval-{i}"),
            leading: i == leader,
            leader: name.clone(),
        };
        eventually(&format!("approval-{i} to name {name}"), WAIT, || {
            let (mut client, want) = (c.approvals[i].clone(), want.clone());
            async move {
                let got = client.get_leader(apb::GetLeaderRequest {}).await.ok()?;
                (got.into_inner() == want).then_some(())
            }
        })
        .await;
        let gauge = scrape(&a.metrics_url()).await.value(
            "arbor_approval_leader",
            &[("replica", &format!("approval-{i}"))],
        );
        assert_eq!(
            gauge,
            f64::from(u8::from(i == leader)),
            "approval-{i}'s gauge"
        );
        let cli = tokio::process::Command::new(&a.binary)
            .args(["leader", "--addr", &a.url()])
            .output()
            .await
            .unwrap();
        let printed = String::from_utf8_lossy(&cli.stdout);
        assert!(
            printed.starts_with(&format!("leader: {name} (")),
            "{printed}"
        );
    }
}

struct Clients {
    runners: Vec<RunnerClient>,
    approvals: Vec<ApprovalClient>,
}

impl Clients {
    fn of(r: &Replicas) -> Clients {
        Clients {
            runners: r.runner_urls().iter().map(|u| runner_as(u, None)).collect(),
            approvals: r
                .approval_urls()
                .iter()
                .map(|u| approvals_as(u, None))
                .collect(),
        }
    }
}

/// Drives run `i` of `flow_tree` to its end, every step on another replica than the last:
/// submit on runner `i`, the gate watched and approved on approval `i+1`, the tool approval
/// found on approval `i` and approved there, the user input on runner `i+1`, the external
/// result on runner `i`, and the outcome read on runner `i+1` (indices mod 2).
async fn drive_flow(c: &Clients, i: usize) -> rpb::Run {
    let (ra, rb) = (&c.runners[i % 2], &c.runners[(i + 1) % 2]);
    let (aa, ab) = (&c.approvals[i % 2], &c.approvals[(i + 1) % 2]);
    let run_id = format!("flow-{i}");
    submit(&mut ra.clone(), "replica-flow", &run_id).await;

    let gate = watch_for(&mut ab.clone(), &run_id, apb::ApprovalState::Pending).await;
    let request = gate.request.clone().unwrap();
    assert_eq!(request.kind, rpb::ApprovalKind::Node as i32, "{run_id}");
    assert_eq!(request.title, TITLE);
    decide(&mut ab.clone(), &gate.request_id, D::Approve, None).await;

    let tool = eventually(&format!("{run_id}'s tool approval"), WAIT, || {
        let mut aa = aa.clone();
        let run_id = run_id.clone();
        async move {
            let page = aa
                .list_approvals(apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        run_id,
                        states: vec![apb::ApprovalState::Pending as i32],
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            page.approvals.into_iter().find(|a| {
                a.request
                    .as_ref()
                    .is_some_and(|r| r.kind == rpb::ApprovalKind::Tool as i32)
            })
        }
    })
    .await;
    let request = tool.request.clone().unwrap();
    assert_eq!(request.tool_name, "math.add", "{run_id}");
    decide(&mut aa.clone(), &tool.request_id, D::Approve, None).await;

    let input = suspension_of(rb, &run_id, C::RequireUserInput).await;
    answer(
        &mut rb.clone(),
        &run_id,
        &input.request_id,
        json!({"text": format!("notes of {run_id}")}),
    )
    .await;
    let external = suspension_of(ra, &run_id, C::RequireExternalExecution).await;
    answer(
        &mut ra.clone(),
        &run_id,
        &external.request_id,
        json!({"status": "succeeded", "result": {"cluster": format!("eu-{i}")}}),
    )
    .await;
    wait_run(rb, &run_id, rpb::RunStatus::Succeeded).await
}

/// Events of the whole log, as a follow stream on `runner` delivers them, until `until` holds.
async fn follow_until(
    runner: &RunnerClient,
    until: impl Fn(&[rpb::Event]) -> bool,
) -> Vec<rpb::Event> {
    let mut request = tonic::Request::new(rpb::StreamEventsRequest {
        after_seq: Some(0),
        follow: true,
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(120));
    let mut stream = runner
        .clone()
        .stream_events(request)
        .await
        .expect("StreamEvents")
        .into_inner();
    let mut out = Vec::new();
    while !until(&out) {
        let item = tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("the follow stream went quiet")
            .expect("the follow stream")
            .expect("the follow stream ended");
        out.extend(item.event);
    }
    out
}

fn assert_gap_free(events: &[rpb::Event], what: &str) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "{what}: position {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_kind_of_suspension_goes_round_the_loop_across_replicas() {
    let mut r = replicas("replicas_flows", &[]).await;
    let c = Clients::of(&r);
    register(&mut c.runners[1].clone(), flow_tree()).await;
    const RUNS: usize = 6;
    let finished = |events: &[rpb::Event]| {
        events
            .iter()
            .filter(|e| e.kind == K::RunSucceeded as i32)
            .count()
            == RUNS
    };
    // Followers opened before anything runs: each one sees the log as it grows.
    let followers: Vec<_> = c
        .runners
        .iter()
        .map(|runner| {
            let runner = runner.clone();
            tokio::spawn(async move { follow_until(&runner, finished).await })
        })
        .collect();

    let c = std::sync::Arc::new(c);
    let mut flows = tokio::task::JoinSet::new();
    for i in 0..RUNS {
        let c = c.clone();
        flows.spawn(async move { (i, drive_flow(&c, i).await) });
    }
    while let Some(done) = flows.join_next().await {
        let (i, run) = done.expect("a flow panicked");
        let bb = from_proto_struct(&run.blackboard.unwrap_or_default());
        assert_eq!(
            bb["receipt"]["entry"],
            json!({"service": "billing", "replicas": 3})
        );
        assert_eq!(bb["sum"], json!(5), "the approved tool call ran");
        assert_eq!(bb["notes"], json!(format!("notes of flow-{i}")));
        assert_eq!(bb["provisioned"], json!({"cluster": format!("eu-{i}")}));
    }

    // Every approval (gate and tool call of each run) delivered, consumed and pruned, as
    // either approval replica tells.
    for approvals in &c.approvals {
        for i in 0..RUNS {
            let run_id = format!("flow-{i}");
            let pruned = eventually(&format!("{run_id}'s approvals pruned"), WAIT, || {
                let mut approvals = approvals.clone();
                let run_id = run_id.clone();
                async move {
                    let all = approvals
                        .list_approvals(apb::ListApprovalsRequest {
                            filter: Some(apb::ApprovalFilter {
                                run_id,
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .await
                        .ok()?
                        .into_inner()
                        .approvals;
                    all.iter()
                        .all(|a| a.state == apb::ApprovalState::Pruned as i32)
                        .then_some(all)
                }
            })
            .await;
            assert_eq!(pruned.len(), 2, "{run_id}: the gate and the tool call");
        }
    }

    // The same log, gap-free from 1, from both replicas: followed live and read afterwards.
    let mut followed = Vec::new();
    for f in followers {
        followed.push(f.await.expect("a follower panicked"));
    }
    let mut reads = Vec::new();
    for runner in &c.runners {
        reads.push(full_log(&mut runner.clone()).await.unwrap());
    }
    assert_gap_free(&reads[0], "runner 0's log");
    assert_eq!(reads[0], reads[1], "both runner replicas read the same log");
    for (n, f) in followed.iter().enumerate() {
        assert_gap_free(f, &format!("runner {n}'s follow stream"));
        assert_eq!(
            f[..],
            reads[0][..f.len()],
            "runner {n}'s follow stream is the log"
        );
    }
    let count = |k: K| reads[0].iter().filter(|e| e.kind == k as i32).count();
    assert_eq!(count(K::ApprovalRequested), 2 * RUNS);
    assert_eq!(count(K::ExecutionSuspended), 4 * RUNS);
    assert_eq!(count(K::ApprovalConsumed), 4 * RUNS);
    assert_eq!(count(K::RunSucceeded), RUNS);

    assert!(r.stop_all().await.is_empty(), "every replica stops cleanly");
    let ledger = read_ledger_postgres(&r.store_url).await;
    assert_eq!(ledger.len(), RUNS, "one ledger record per run: {ledger:?}");
}

/// Many calls of `ledger.append` in one job: a run keeps its worker busy for a while.
fn busy_tree() -> String {
    json!({"id": "busy", "version": 1,
        "root": {"type": "repeat", "name": "again", "count": BUSY_STEPS,
            "child": {"type": "tool", "name": "append", "tool": "ledger.append",
                      "args": {"entry": {"step": "busy"}}}}})
    .to_string()
}
const BUSY_STEPS: usize = 40;

async fn jobs_of(runner: &mut RunnerClient, statuses: &[rpb::JobStatus]) -> Vec<rpb::Job> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = runner
            .list_jobs(rpb::ListJobsRequest {
                statuses: statuses.iter().map(|s| *s as i32).collect(),
                page_size: 1000,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .expect("ListJobs")
            .into_inner();
        out.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_runner_replica_s_leases_go_to_the_other() {
    const LEASE: Duration = Duration::from_millis(1500);
    // Two workers per replica, more runs than workers: the queue stays full for a while.
    let mut r = replicas(
        "replicas_runner_kill",
        &["--lease-ms", "1500", "--workers", "2"],
    )
    .await;
    let c = Clients::of(&r);
    let (mut a, mut b) = (c.runners[0].clone(), c.runners[1].clone());
    register(&mut a, busy_tree()).await;
    let runner_0 = format!("{}@", r.runners[0].pid().expect("runner 0 runs"));
    const RUNS: usize = 24;
    const TRIES: usize = 5;
    let mut runs = Vec::new();
    let (held, frozen) = 'tries: {
        for attempt in 0..TRIES {
            // Runner 1 frozen while the runs go in (through runner 0): every claim is runner 0's.
            r.runners[1].pause();
            let batch: Vec<String> = (0..RUNS).map(|i| format!("busy-{attempt}-{i}")).collect();
            for run_id in &batch {
                submit(&mut a, "busy", run_id).await;
            }
            runs.extend(batch.iter().cloned());
            // Two workers, more runs than workers: runner 0 holds claims with work queued.
            eventually("runner 0 to hold claims with work queued", WAIT, || {
                let mut a = a.clone();
                async move {
                    let claimed = jobs_of(&mut a, &[rpb::JobStatus::Claimed]).await.len();
                    let queued = jobs_of(&mut a, &[rpb::JobStatus::Queued]).await.len();
                    (claimed >= 1 && queued >= 1).then_some(())
                }
            })
            .await;
            r.runners[0].pause();
            let frozen = Instant::now();
            // What it sent before it froze (a job's last commit) is done by the database
            // meanwhile; from here on its claims are what it holds when it dies. A live worker
            // extends its lease every third of one, so they outlive this look.
            tokio::time::sleep(Duration::from_millis(200)).await;
            r.runners[1].resume();
            let held: Vec<String> = jobs_of(&mut b, &[rpb::JobStatus::Claimed])
                .await
                .into_iter()
                .filter(|j| j.claimed_by.starts_with(&runner_0))
                .map(|j| j.job_id)
                .collect();
            if !held.is_empty() {
                break 'tries (held, frozen);
            }
            // Its workers were between jobs when it froze: let it finish this batch, try again.
            r.runners[0].resume();
            for run_id in &batch {
                wait_run(&a, run_id, rpb::RunStatus::Succeeded).await;
            }
        }
        panic!("runner 0 held no claim when frozen, {TRIES} times");
    };
    r.runners[0].kill().await;

    for run_id in &runs {
        let run = wait_run(&b, run_id, rpb::RunStatus::Succeeded).await;
        assert!(run.error.is_empty(), "{run_id}: {}", run.error);
    }
    let took = frozen.elapsed();
    let jobs = jobs_of(&mut b, &[]).await;
    let taken_over: Vec<&rpb::Job> = jobs
        .iter()
        .filter(|j| j.attempt_count >= 2 && !j.last_error.is_empty())
        .collect();
    println!(
        "runner kill: {} runs finished {took:?} after runner 0 froze; it held {held:?}; {} jobs \
         retried after their lease expired: {:?}",
        runs.len(),
        taken_over.len(),
        taken_over
            .iter()
            .map(|j| (&j.run_id, &j.last_error))
            .collect::<Vec<_>>()
    );
    for job_id in &held {
        let job = jobs
            .iter()
            .find(|j| &j.job_id == job_id)
            .expect("a held job");
        assert_eq!(
            (job.status, job.attempt_count, job.last_error.as_str()),
            (rpb::JobStatus::Accepted as i32, 2, "lease expired"),
            "{}: the killed replica's claim was taken again once its lease ran out",
            job.run_id
        );
    }
    assert_eq!(
        taken_over.len(),
        held.len(),
        "only the killed replica's jobs were retried"
    );
    // A live worker extends its lease every third of one, so a claim outlives its replica by
    // at least two thirds of a lease.
    assert!(
        took >= LEASE * 2 / 3,
        "a dead replica's claims wait for their lease ({took:?})"
    );
    let dead = jobs
        .iter()
        .filter(|j| j.status == rpb::JobStatus::DeadLetter as i32)
        .count();
    assert_eq!(dead, 0, "no job dead-lettered");

    let log = full_log(&mut b).await.unwrap();
    assert_gap_free(&log, "the log after the kill");
    let succeeded = log
        .iter()
        .filter(|e| e.kind == K::RunSucceeded as i32)
        .count();
    assert_eq!(succeeded, runs.len(), "each run succeeded exactly once");

    let unclean = r.stop_all().await;
    assert!(unclean.is_empty(), "{unclean:?}");
    let ledger = read_ledger_postgres(&r.store_url).await;
    for run_id in &runs {
        let prefix = format!("{run_id}:");
        let records = ledger.keys().filter(|k| k.starts_with(&prefix)).count();
        assert_eq!(
            records, BUSY_STEPS,
            "{run_id}: each of its appends exactly once, the replayed ones included"
        );
    }
    assert_eq!(ledger.len(), runs.len() * BUSY_STEPS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_approval_leader_hands_over_and_its_decisions_are_delivered() {
    let mut r = replicas("replicas_leader_kill", &[]).await;
    let c = Clients::of(&r);
    let leader = r.wait_leader(WAIT).await;
    wait_named_leader(&r, &c, leader).await;
    let other = 1 - leader;
    let mut runner = c.runners[other].clone();
    register(&mut runner, arbor_tests::gate_tree("gated", "failure")).await;
    const RUNS: usize = 8;
    for i in 0..RUNS {
        submit(
            &mut c.runners[i % 2].clone(),
            "gated",
            &format!("gated-{i}"),
        )
        .await;
    }
    // Every gate is PENDING: the leader followed the runner.
    let mut pending = Vec::new();
    for i in 0..RUNS {
        let run_id = format!("gated-{i}");
        pending.push(
            wait_approval(&c.approvals[other], &run_id, apb::ApprovalState::Pending)
                .await
                .request_id,
        );
    }
    // Half are decided before the leader dies, half while no one leads.
    for request_id in &pending[..RUNS / 2] {
        decide(
            &mut c.approvals[other].clone(),
            request_id,
            D::Approve,
            None,
        )
        .await;
    }
    r.approvals[leader].kill().await;
    for request_id in &pending[RUNS / 2..] {
        decide(
            &mut c.approvals[other].clone(),
            request_id,
            D::Approve,
            None,
        )
        .await;
    }
    let new_leader = r.wait_leader(WAIT).await;
    assert_eq!(new_leader, other, "the surviving replica leads");
    wait_named_leader(&r, &c, other).await;

    for i in 0..RUNS {
        let run = wait_run(&runner, &format!("gated-{i}"), rpb::RunStatus::Succeeded).await;
        let bb = from_proto_struct(&run.blackboard.unwrap_or_default());
        assert_eq!(bb["done"], Json::Bool(true), "gated-{i}");
    }
    // A run after the handover goes round the loop too.
    submit(&mut runner, "gated", "gated-after").await;
    let late = wait_approval(
        &c.approvals[other],
        "gated-after",
        apb::ApprovalState::Pending,
    )
    .await;
    decide(
        &mut c.approvals[other].clone(),
        &late.request_id,
        D::Approve,
        None,
    )
    .await;
    wait_run(&runner, "gated-after", rpb::RunStatus::Succeeded).await;
    // The old leader comes back as a follower and sees the same, settled approvals.
    r.approvals[leader].start().await;
    for i in 0..RUNS {
        wait_approval(
            &c.approvals[leader],
            &format!("gated-{i}"),
            apb::ApprovalState::Pruned,
        )
        .await;
    }
    assert_eq!(r.leader(), Some(other), "leadership does not flap back");
    wait_named_leader(&r, &c, other).await;

    let log = full_log(&mut runner).await.unwrap();
    assert_gap_free(&log, "the log");
    let consumed = log
        .iter()
        .filter(|e| e.kind == K::ApprovalConsumed as i32)
        .count();
    assert_eq!(consumed, RUNS + 1, "each decision consumed exactly once");

    let unclean = r.stop_all().await;
    assert!(unclean.is_empty(), "{unclean:?}");
    let ledger = read_ledger_postgres(&r.store_url).await;
    assert_eq!(ledger.len(), RUNS + 1, "one ship per run: {ledger:?}");
}
