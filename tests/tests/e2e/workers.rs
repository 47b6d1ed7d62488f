//! Task workers end to end: the real binaries and real worker processes (Python `task_worker.py`,
//! Node `task_worker.js`, and the Rust `WorkerServiceClient` where a test must hold the lease
//! tokens itself). Each test checks what a tree's author or an operator sees: the run's status
//! and blackboard, which worker produced what, the TASK_* events, ListTasks and the CLI —
//! through approvals with EDIT, worker deaths, heartbeats, cancellation, stale tokens, business
//! errors, retries, misspelt tools, a worker's clean shutdown and a draining worker's release.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use arbor_shared::{
    json::{from_proto_struct, from_proto_value, to_proto_value},
    proto::{
        approval::v1 as apb,
        runner::v1::{self as rpb, event::Detail, worker_service_client::WorkerServiceClient},
    },
};
use arbor_tests::{
    Binaries, Cluster, Profile, WAIT, flow,
    process::workspace_root,
    tools::{node_client, python_client},
};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::{Value as Json, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::{Child, Command},
};
use tonic::{Code, transport::Channel};

// ---------------------------------------------------------------------------------------------
// Helpers: worker processes and what they print, runs, task events.

/// Lines a child process printed, collected as they arrive.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn snapshot(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn follow(&self, stream: impl AsyncRead + Unpin + Send + 'static) {
        let lines = self.clone();
        tokio::spawn(async move {
            let mut stream = BufReader::new(stream).lines();
            while let Ok(Some(line)) = stream.next_line().await {
                lines.0.lock().unwrap().push(line);
            }
        });
    }
}

/// A running task worker: its id, its process and the lines it printed.
struct Worker {
    id: String,
    child: Child,
    out: Lines,
    err: Lines,
}

/// The Python interpreter of the virtualenv with the `arbor-client` package (installed once).
fn python() -> &'static PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(python_client)
}

impl Worker {
    /// `task_worker.py` serving `types` (comma-separated globs) with `extra` flags.
    async fn python(cluster: &Cluster, id: &str, types: &str, extra: &[&str]) -> Worker {
        let mut cmd = Command::new(python());
        cmd.arg(workspace_root().join("tests/clients/python/task_worker.py"));
        Self::start(cmd, cluster, id, types, extra).await
    }

    /// `task_worker.js` serving `types` with `extra` flags.
    async fn node(cluster: &Cluster, id: &str, types: &str, extra: &[&str]) -> Worker {
        let mut cmd = Command::new("node");
        cmd.arg(workspace_root().join("tests/clients/node/task_worker.js"))
            .env("NODE_PATH", node_client());
        Self::start(cmd, cluster, id, types, extra).await
    }

    /// Spawns the worker and waits for its `ready` line (its first StreamTasks call).
    async fn start(
        mut cmd: Command,
        cluster: &Cluster,
        id: &str,
        types: &str,
        extra: &[&str],
    ) -> Worker {
        let shown = format!("{cmd:?}");
        cmd.args(["--runner", &cluster.runner.addr.to_string()])
            .args(["--worker-id", id, "--types", types])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start {shown}: {e} (is its interpreter installed and on PATH?)")
        });
        let (out, err) = (Lines::default(), Lines::default());
        out.follow(child.stdout.take().unwrap());
        err.follow(child.stderr.take().unwrap());
        let worker = Worker {
            id: id.to_string(),
            child,
            out,
            err,
        };
        worker.line("ready", |l| l == "ready").await;
        worker
    }

    fn lines(&self) -> Vec<String> {
        self.out.snapshot()
    }

    /// What the worker printed on both streams, for failure messages.
    fn transcript(&self) -> String {
        format!(
            "--- {} stdout:\n{}\n--- {} stderr:\n{}",
            self.id,
            self.out.snapshot().join("\n"),
            self.id,
            self.err.snapshot().join("\n")
        )
    }

    /// Waits until the worker printed a line matching `pred`; returns it.
    async fn line(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(l) = self.out.snapshot().into_iter().find(|l| pred(l)) {
                return l;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "worker {} printed no {what} within {WAIT:?}\n{}",
                self.id,
                self.transcript()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the worker's `task` line of a task of `task_type`.
    async fn task_line(&self, task_type: &str) -> TaskLine {
        let wanted = format!(" type={task_type} ");
        let line = self
            .line(&format!("task of {task_type}"), |l| {
                l.starts_with("task ") && l.contains(&wanted)
            })
            .await;
        TaskLine::parse(&line)
    }

    fn signal(&self, signal: Signal) {
        let pid = self.child.id().expect("the worker runs");
        nix::sys::signal::kill(Pid::from_raw(pid as i32), signal).unwrap();
    }

    /// Waits for the worker to exit by itself; its exit code (`None`: killed by a signal).
    async fn exit_code(&mut self) -> Option<i32> {
        match tokio::time::timeout(WAIT, self.child.wait()).await {
            Ok(status) => status.unwrap().code(),
            Err(_) => panic!("worker {} did not exit\n{}", self.id, self.transcript()),
        }
    }
}

/// A worker's `task id=… type=… attempt=… key=… args=…` line.
#[derive(Debug)]
struct TaskLine {
    id: String,
    attempt: u32,
    key: String,
    args: Json,
}

impl TaskLine {
    fn parse(line: &str) -> TaskLine {
        let (head, args) = line.split_once(" args=").expect("args= in a task line");
        let field = |name: &str| {
            head.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
                .to_string()
        };
        TaskLine {
            id: field("id"),
            attempt: field("attempt").parse().unwrap(),
            key: field("key"),
            args: serde_json::from_str(args).unwrap(),
        }
    }
}

/// Registers `tree` and submits a run of it; returns the run id.
async fn submit(cluster: &Cluster, tree: Json) -> String {
    flow::submit(cluster, tree.to_string(), None).await.run_id
}

/// Waits for the run to end with `status`; returns its blackboard.
async fn finished(cluster: &Cluster, run_id: &str, status: rpb::RunStatus) -> Json {
    let run = flow::wait_run(cluster, run_id, status).await;
    Json::Object(from_proto_struct(&run.blackboard.unwrap_or_default()))
}

async fn workers(cluster: &Cluster) -> WorkerServiceClient<Channel> {
    WorkerServiceClient::new(cluster.runner.channel().await)
}

/// The run's tasks, as ListTasks shows them.
async fn tasks_of(cluster: &Cluster, run_id: &str) -> Vec<rpb::Task> {
    let request = rpb::ListTasksRequest {
        run_id: run_id.into(),
        ..Default::default()
    };
    let page = workers(cluster).await.list_tasks(request).await.unwrap();
    page.into_inner().tasks
}

fn state(task: &rpb::Task) -> rpb::TaskState {
    rpb::TaskState::try_from(task.state).unwrap()
}

/// A worker driven by the test itself over the Rust client, holding the lease tokens.
struct Hand(WorkerServiceClient<Channel>);

impl Hand {
    /// Long-polls for one `rs.*` task under a lease of `lease_ms`.
    async fn take(&mut self, lease_ms: u32) -> rpb::TaskActivation {
        let request = rpb::PollTasksRequest {
            worker_id: "rust-1".into(),
            task_types: vec!["rs.*".into()],
            max_tasks: 1,
            lease_ms,
            wait_ms: 20_000,
        };
        let tasks = self.0.poll_tasks(request).await.unwrap().into_inner().tasks;
        let [task] = tasks.try_into().expect("one task within the poll's wait");
        task
    }

    async fn complete(
        &mut self,
        task_id: &str,
        token: &str,
        output: Json,
    ) -> Result<rpb::CompleteTaskResponse, tonic::Status> {
        let request = rpb::CompleteTaskRequest {
            task_id: task_id.into(),
            lease_token: token.into(),
            output: Some(to_proto_value(&output)),
        };
        self.0.complete_task(request).await.map(|r| r.into_inner())
    }
}

/// The run's TASK_* events, one line each, in log order: what an operator reads.
async fn task_log(cluster: &Cluster, run_id: &str) -> Vec<String> {
    let events = flow::events_of(cluster, run_id).await;
    events
        .iter()
        .filter_map(|e| match e.detail.as_ref()? {
            Detail::TaskDispatched(d) => Some(format!(
                "dispatched {} #{} to {}",
                d.task_type, d.attempt, d.worker_id
            )),
            Detail::TaskCompleted(d) => Some(format!(
                "completed {} #{} by {}",
                d.task_type, d.attempt, d.worker_id
            )),
            Detail::TaskFailed(d) => Some(format!(
                "failed {} #{} by {}: {} code={} retry={}",
                d.task_type, d.attempt, d.worker_id, d.cause, d.code, d.will_retry
            )),
            Detail::TaskReleased(d) => Some(format!(
                "released {} #{} by {}",
                d.task_type, d.attempt, d.worker_id
            )),
            _ => None,
        })
        .collect()
}

/// A tree whose `root` calls remote tools that it declares itself.
fn tree(id: &str, task_types: &[&str], root: Json) -> Json {
    json!({"id": id, "version": 1, "task_types": task_types, "root": root})
}

fn tool(name: &str, tool: &str, args: Json, output: &str) -> Json {
    json!({"type": "tool", "name": name, "tool": tool, "args": args, "output": output})
}

/// Merges `extra` fields into a node.
fn with(mut node: Json, extra: Json) -> Json {
    for (k, v) in extra.as_object().unwrap() {
        node[k] = v.clone();
    }
    node
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[path = "workers/release.rs"]
mod release;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_node_tools_run_in_sequence_and_each_output_names_its_worker() {
    let cluster = Cluster::start(Profile::Debug).await;
    let py = Worker::python(&cluster, "py-1", "py.*", &[]).await;
    let node = Worker::node(&cluster, "node-1", "node.*", &[]).await;
    let run_id = submit(
        &cluster,
        tree(
            "workers-polyglot",
            &["py.upper", "node.greet"],
            json!({"type": "sequence", "name": "shout-then-greet", "children": [
                tool("shout", "py.upper", json!({"text": "ada"}), "shouted"),
                tool("greet", "node.greet", json!({"name": {"$ref": "shouted.text"}}), "greeting"),
            ]}),
        ),
    )
    .await;

    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(bb["shouted"], json!({"text": "ADA", "worker": "py-1"}));
    assert_eq!(
        bb["greeting"],
        json!({"greeting": "Hello, ADA", "worker": "node-1"})
    );

    // Each worker took exactly its own task, with the args the tree resolved.
    let shout = py.task_line("py.upper").await;
    let greet = node.task_line("node.greet").await;
    assert_eq!(shout.args, json!({"text": "ada"}));
    assert_eq!(greet.args, json!({"name": "ADA"}));
    assert_eq!(shout.key, format!("{run_id}:shout#0"));
    assert!(!py.lines().iter().any(|l| l.contains("node.greet")));
    assert!(!node.lines().iter().any(|l| l.contains("py.upper")));
    py.line("its completion", |l| {
        l == format!("completed id={} accepted=true", shout.id)
    })
    .await;

    assert_eq!(
        task_log(&cluster, &run_id).await,
        [
            "dispatched py.upper #1 to py-1",
            "completed py.upper #1 by py-1",
            "dispatched node.greet #1 to node-1",
            "completed node.greet #1 by node-1",
        ]
    );
    let events = flow::events_of(&cluster, &run_id).await;
    let dispatched: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.detail {
            Some(Detail::TaskDispatched(d)) => Some(d.task_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(dispatched, [shout.id.as_str(), greet.id.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_in_front_of_a_remote_tool_sends_only_the_edited_args_to_the_worker() {
    let cluster = Cluster::start(Profile::Debug).await;
    let py = Worker::python(&cluster, "py-edit", "py.*", &[]).await;
    let original = json!({"text": "delete everything"});
    let edited = json!({"text": "delete nothing"});
    let run_id = submit(
        &cluster,
        tree(
            "workers-edit",
            &["py.upper"],
            with(
                tool("shout", "py.upper", original.clone(), "shouted"),
                json!({"policy": "ask", "allow_edit": true}),
            ),
        ),
    )
    .await;

    // The approver sees the call as the tree made it…
    let pending = flow::approval_of(&cluster, &run_id, apb::ApprovalState::Pending).await;
    let request = pending.request.clone().unwrap();
    assert_eq!(request.tool_name, "py.upper");
    assert_eq!(
        request.tool_args.as_ref().map(from_proto_value),
        Some(original.clone())
    );
    assert!(
        request
            .allowed_decisions
            .contains(&(rpb::DecisionKind::Edit as i32))
    );
    // …and no worker has it while it waits.
    assert!(tasks_of(&cluster, &run_id).await.is_empty());

    let mut approvals = arbor_tests::clients::approvals_as(&cluster.approval.url(), None);
    flow::decide(
        &mut approvals,
        &pending.request_id,
        rpb::DecisionKind::Edit,
        Some(edited.clone()),
    )
    .await;

    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(
        bb["shouted"],
        json!({"text": "DELETE NOTHING", "worker": "py-edit"})
    );
    let task = py.task_line("py.upper").await;
    assert_eq!(task.args, edited);
    assert!(
        !py.lines().iter().any(|l| l.contains("everything")),
        "the original args reached the worker:\n{}",
        py.transcript()
    );
    let resolved = flow::approval_of(&cluster, &run_id, apb::ApprovalState::Pruned).await;
    assert_eq!(
        resolved.decision.unwrap().kind,
        rpb::DecisionKind::Edit as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_a_killed_worker_goes_to_another_after_its_lease_and_its_effect_happens_once() {
    let cluster = Cluster::start(Profile::Debug).await;
    let effects = cluster.dir.path().join("effects.txt");
    let effects_arg = effects.to_str().unwrap();
    let flags = ["--lease-ms", "1000", "--effects", effects_arg];
    let mut a = Worker::python(&cluster, "py-a", "py.*", &flags).await;
    let run_id = submit(
        &cluster,
        tree(
            "workers-kill",
            &["py.effect"],
            tool("charge", "py.effect", json!({"ms": 2500}), "charged"),
        ),
    )
    .await;

    // A dies in the middle of the task, before it applied anything.
    let first = a.task_line("py.effect").await;
    assert_eq!(first.attempt, 1);
    a.child.start_kill().unwrap();
    assert_eq!(a.exit_code().await, None, "killed by SIGKILL");
    assert!(!effects.exists(), "A applied its effect before it died");

    let b = Worker::python(&cluster, "py-b", "py.*", &flags).await;
    let second = b.task_line("py.effect").await;
    assert_eq!((second.id.as_str(), second.attempt), (first.id.as_str(), 2));
    assert_eq!(
        second.key, first.key,
        "the same idempotency key on every attempt"
    );

    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(
        bb["charged"],
        json!({"key": first.key, "worker": "py-b", "attempt": 2})
    );
    assert_eq!(
        task_log(&cluster, &run_id).await,
        [
            "dispatched py.effect #1 to py-a",
            "failed py.effect #1 by py-a: lease_expired code= retry=true",
            "dispatched py.effect #2 to py-b",
            "completed py.effect #2 by py-b",
        ]
    );
    let applied = std::fs::read_to_string(&effects).unwrap();
    assert_eq!(applied.lines().collect::<Vec<_>>(), [first.key.as_str()]);
    let tasks = tasks_of(&cluster, &run_id).await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(state(&tasks[0]), rpb::TaskState::Completed);
    assert_eq!((tasks[0].attempt, tasks[0].worker_id.as_str()), (2, "py-b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_task_alive_for_several_times_its_lease() {
    let cluster = Cluster::start(Profile::Debug).await;
    let py = Worker::python(&cluster, "py-hb", "py.*", &["--lease-ms", "500"]).await;
    let run_id = submit(
        &cluster,
        tree(
            "workers-heartbeat",
            &["py.slow"],
            tool("crunch", "py.slow", json!({"ms": 2500}), "crunched"),
        ),
    )
    .await;

    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(bb["crunched"]["slept_ms"], json!(2500));
    // A heartbeat every lease/3: about 15 over 2.5 s; a few less on a loaded machine.
    let beats = bb["crunched"]["heartbeats"].as_u64().unwrap();
    assert!(beats >= 5, "only {beats} heartbeats in 2.5 s");
    assert_eq!(
        task_log(&cluster, &run_id).await,
        [
            "dispatched py.slow #1 to py-hb",
            "completed py.slow #1 by py-hb"
        ],
        "one attempt, never expired\n{}",
        py.transcript()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_run_makes_python_and_node_workers_stop_their_tasks() {
    let cluster = Cluster::start(Profile::Debug).await;
    // Short leases: heartbeats, which carry the cancellation, come every 300 ms.
    let py = Worker::python(&cluster, "py-c", "py.*", &["--lease-ms", "900"]).await;
    let node = Worker::node(&cluster, "node-c", "node.*", &["--lease-ms", "900"]).await;
    let run_id = submit(
        &cluster,
        tree(
            "workers-cancel",
            &["py.slow", "node.slow"],
            json!({"type": "parallel", "name": "both", "children": [
                tool("py-work", "py.slow", json!({"ms": 60000}), "py_out"),
                tool("node-work", "node.slow", json!({"ms": 60000}), "node_out"),
            ]}),
        ),
    )
    .await;
    let py_task = py.task_line("py.slow").await;
    let node_task = node.task_line("node.slow").await;

    let mut runner = cluster.runner_client().await;
    runner
        .cancel_run(rpb::CancelRunRequest {
            run_id: run_id.clone(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap();
    let bb = finished(&cluster, &run_id, rpb::RunStatus::Cancelled).await;
    assert!(bb.get("py_out").is_none() && bb.get("node_out").is_none());

    for (w, task) in [(&py, &py_task), (&node, &node_task)] {
        let cancelled = format!("cancelled id={}", task.id);
        let refused = format!("completed id={} accepted=false", task.id);
        w.line("its cancelled line", |l| l == cancelled).await;
        w.line("its refused completion", |l| l == refused).await;
        let lines = w.lines();
        let at = |want: &str| lines.iter().position(|l| l == want).unwrap();
        assert!(at(&cancelled) < at(&refused), "{}", w.transcript());
    }
    let tasks = tasks_of(&cluster, &run_id).await;
    assert_eq!(tasks.len(), 2);
    for t in &tasks {
        assert_eq!(state(t), rpb::TaskState::Cancelled, "{t:?}");
    }
    let log = task_log(&cluster, &run_id).await;
    assert!(!log.iter().any(|l| l.starts_with("completed")), "{log:?}");
    // What the event log says instead: both suspensions (ids = task ids) were withdrawn.
    let mut withdrawn: Vec<String> = flow::events_of(&cluster, &run_id)
        .await
        .into_iter()
        .filter_map(|e| match e.detail? {
            Detail::SuspensionWithdrawn(w) => Some(w.request_id),
            _ => None,
        })
        .collect();
    withdrawn.sort();
    let mut ids = vec![py_task.id.clone(), node_task.id.clone()];
    ids.sort();
    assert_eq!(withdrawn, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_foreign_lease_token_is_aborted_and_changes_nothing() {
    let cluster = Cluster::start(Profile::Debug).await;
    let mut w = Hand(workers(&cluster).await);
    let doc = tree(
        "workers-tokens",
        &["rs.echo"],
        tool("call", "rs.echo", json!({"n": 1}), "out"),
    );

    let run_id = submit(&cluster, doc.clone()).await;
    let task = w.take(30_000).await;
    assert_eq!(task.run_id, run_id);
    let (id, token) = (task.task_id.as_str(), task.lease_token.as_str());
    let wrong = w
        .complete(id, "not-the-token", json!({"forged": true}))
        .await;
    assert_eq!(wrong.unwrap_err().code(), Code::Aborted);
    let unknown = w.complete("no-such-task", token, json!({})).await;
    assert_eq!(unknown.unwrap_err().code(), Code::NotFound);
    // Still waiting for the one real worker.
    let run = flow::wait_run(&cluster, &run_id, rpb::RunStatus::Suspended).await;
    let waits_on: Vec<&str> = run
        .suspensions
        .iter()
        .map(|s| s.request_id.as_str())
        .collect();
    assert_eq!(waits_on, [id]);
    let tasks = tasks_of(&cluster, &run_id).await;
    assert_eq!(state(&tasks[0]), rpb::TaskState::Leased);
    assert_eq!(tasks[0].worker_id, "rust-1");

    assert!(
        w.complete(id, token, json!({"n": 2}))
            .await
            .unwrap()
            .accepted
    );
    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(bb["out"], json!({"n": 2}));
    let events = flow::events_of(&cluster, &run_id).await.len();
    // A repeat (say, after a lost reply) is accepted and changes nothing, not even the output.
    assert!(
        w.complete(id, token, json!({"n": 3}))
            .await
            .unwrap()
            .accepted
    );
    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(bb["out"], json!({"n": 2}));
    assert_eq!(flow::events_of(&cluster, &run_id).await.len(), events);
    assert_eq!(
        task_log(&cluster, &run_id).await,
        [
            "dispatched rs.echo #1 to rust-1",
            "completed rs.echo #1 by rust-1"
        ]
    );

    // A lease that ran out (no heartbeats): its token is dead once attempt 2 is out.
    let run_id = submit(&cluster, doc).await;
    let first = w.take(100).await;
    let second = w.take(30_000).await;
    assert_eq!(
        (second.task_id.as_str(), second.attempt),
        (first.task_id.as_str(), 2)
    );
    let late = w
        .complete(&first.task_id, &first.lease_token, json!({"late": true}))
        .await;
    assert_eq!(late.unwrap_err().code(), Code::Aborted);
    let beat = w.0.heartbeat(rpb::HeartbeatRequest {
        task_id: first.task_id.clone(),
        lease_token: first.lease_token.clone(),
        details: None,
    });
    assert_eq!(beat.await.unwrap_err().code(), Code::Aborted);
    let tasks = tasks_of(&cluster, &run_id).await;
    assert_eq!(
        (state(&tasks[0]), tasks[0].attempt),
        (rpb::TaskState::Leased, 2)
    );
    let done = w
        .complete(&second.task_id, &second.lease_token, json!({"n": 4}))
        .await;
    assert!(done.unwrap().accepted);
    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(bb["out"], json!({"n": 4}));
    assert_eq!(
        task_log(&cluster, &run_id).await,
        [
            "dispatched rs.echo #1 to rust-1",
            "failed rs.echo #1 by rust-1: lease_expired code= retry=true",
            "dispatched rs.echo #2 to rust-1",
            "completed rs.echo #2 by rust-1",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thrown_error_routes_a_selector_to_the_branch_for_its_code() {
    let cluster = Cluster::start(Profile::Debug).await;
    let py = Worker::python(&cluster, "py-throw", "py.*", &[]).await;
    // A call that throws `code`; had it succeeded, `{name}_done` would be set.
    let attempt = |name: &str, code: &str, extra: Json| {
        json!({"type": "sequence", "name": format!("try-{name}"), "children": [
            with(tool(name, "py.raise", json!({"code": code, "message": "no"}), name), extra),
            {"type": "set", "name": format!("{name}-done"), "key": format!("{name}_done"), "value": true},
        ]})
    };
    // A fallback branch taken only when `key` holds `code`: it writes `name` to `route`.
    let on_code = |name: &str, key: &str, code: &str, route: &str| {
        json!({"type": "sequence", "name": format!("on-{name}"), "children": [
            {"type": "condition", "name": format!("is-{name}"), "key": key, "op": "eq", "value": code},
            {"type": "set", "name": format!("route-{name}"), "key": route, "value": name},
        ]})
    };
    let run_id = submit(
        &cluster,
        tree(
            "workers-throw",
            &["py.raise"],
            json!({"type": "sequence", "name": "both", "children": [
                {"type": "selector", "name": "charge-or-explain", "children": [
                    attempt("charge", "E_DECLINED", json!({"error_output": "charge_error"})),
                    on_code("charge-quota", "charge_error.code", "E_QUOTA", "charge_route"),
                    on_code("charge-declined", "charge_error.code", "E_DECLINED", "charge_route"),
                ]},
                // No error_output: the code lands in `last_error`.
                {"type": "selector", "name": "ship-or-explain", "children": [
                    attempt("ship", "E_QUOTA", json!({})),
                    on_code("ship-declined", "last_error.code", "E_DECLINED", "ship_route"),
                    on_code("ship-quota", "last_error.code", "E_QUOTA", "ship_route"),
                ]},
            ]}),
        ),
    )
    .await;

    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(
        bb["charge_error"],
        json!({"code": "E_DECLINED", "message": "no", "node": "charge"})
    );
    assert_eq!(
        bb["last_error"],
        json!({"code": "E_QUOTA", "message": "no", "node": "ship"})
    );
    assert_eq!(bb["charge_route"], "charge-declined");
    assert_eq!(bb["ship_route"], "ship-quota");
    assert!(bb.get("charge_done").is_none() && bb.get("ship_done").is_none());

    let charge = py.task_line("py.raise").await;
    py.line("its throw", |l| {
        l == format!("threw id={} code=E_DECLINED", charge.id)
    })
    .await;
    // A business error is not retried, even with attempts left.
    assert_eq!(
        task_log(&cluster, &run_id).await,
        [
            "dispatched py.raise #1 to py-throw",
            "failed py.raise #1 by py-throw: error code=E_DECLINED retry=false",
            "dispatched py.raise #1 to py-throw",
            "failed py.raise #1 by py-throw: error code=E_QUOTA retry=false",
        ]
    );
    let tasks = tasks_of(&cluster, &run_id).await;
    assert_eq!(tasks.len(), 2);
    assert!(tasks.iter().all(|t| state(t) == rpb::TaskState::Errored));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_retry_within_attempts_and_then_fail_the_run_as_a_dead_letter() {
    let cluster = Cluster::start(Profile::Debug).await;
    let _py = Worker::python(&cluster, "py-flaky", "py.*", &[]).await;
    let flaky = |id: &str, attempts: u32| {
        tree(
            id,
            &["py.flaky"],
            with(
                tool("wobble", "py.flaky", json!({"succeed_on": 2}), "wobbled"),
                json!({"attempts": attempts}),
            ),
        )
    };

    let run_id = submit(&cluster, flaky("workers-flaky-3", 3)).await;
    let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(bb["wobbled"], json!({"attempt": 2}));
    assert_eq!(
        task_log(&cluster, &run_id).await,
        [
            "dispatched py.flaky #1 to py-flaky",
            "failed py.flaky #1 by py-flaky: failed code= retry=true",
            "dispatched py.flaky #2 to py-flaky",
            "completed py.flaky #2 by py-flaky",
        ]
    );

    let dead = submit(&cluster, flaky("workers-flaky-1", 1)).await;
    let run = flow::wait_run(&cluster, &dead, rpb::RunStatus::Failed).await;
    assert!(run.error.contains("flaky attempt 1"), "{}", run.error);
    assert_eq!(
        task_log(&cluster, &dead).await,
        [
            "dispatched py.flaky #1 to py-flaky",
            "failed py.flaky #1 by py-flaky: failed code= retry=false",
        ]
    );
    let tasks = tasks_of(&cluster, &dead).await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(state(&tasks[0]), rpb::TaskState::Failed);
    let dead_task = tasks[0].task_id.clone();

    // What an operator sees: the CLI lists the dead letter, and only it.
    let out = Command::new(Binaries::get(Profile::Debug).runner)
        .args([
            "tasks",
            "--state",
            "FAILED",
            "--addr",
            &cluster.runner.url(),
        ])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "runner-svc tasks: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("    ")).collect();
    assert_eq!(rows.len(), 2, "a header and one task:\n{stdout}");
    for want in [
        dead_task.as_str(),
        "py.flaky",
        "FAILED",
        "1/1",
        "py-flaky",
        &dead,
    ] {
        assert!(rows[1].contains(want), "{want:?} missing in:\n{stdout}");
    }
    assert!(stdout.contains("last error: flaky attempt 1"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_tool_is_refused_unless_the_runner_serves_it_as_a_task_type() {
    // Declares py.upper, but its second call misspells it.
    let doc = tree(
        "workers-typo",
        &["py.upper"],
        json!({"type": "sequence", "name": "main", "children": [
            tool("one", "py.upper", json!({"text": "a"}), "one"),
            tool("two", "py.uper", json!({"text": "b"}), "two"),
        ]}),
    )
    .to_string();
    let register = |document: String| rpb::RegisterTreeRequest {
        document,
        format: rpb::TreeFormat::Json as i32,
    };

    let plain = Cluster::start(Profile::Debug).await;
    let mut runner = plain.runner_client().await;
    let err = runner
        .register_tree(register(doc.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    let violations = arbor_shared::status::field_violations(&err);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].field, "$.root.children[1].tool");
    assert!(
        violations[0].description.contains("unknown tool 'py.uper'")
            && violations[0].description.contains("py.upper"),
        "{}",
        violations[0].description
    );
    let missing = runner
        .get_tree(rpb::GetTreeRequest {
            tree_id: "workers-typo".into(),
            version: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // A runner that serves `py.uper` as a task type takes the same tree, and runs it.
    let served = Cluster::start_with(
        Profile::Debug,
        vec!["--task-type".into(), "py.uper".into()],
        Vec::new(),
    )
    .await;
    let _py = Worker::python(&served, "py-typo", "py.*", &[]).await;
    let run_id = flow::submit(&served, doc, None).await.run_id;
    let bb = finished(&served, &run_id, rpb::RunStatus::Succeeded).await;
    assert_eq!(bb["one"]["text"], "A");
    // `uper` is no behaviour of the test worker: it echoes the args back.
    assert_eq!(bb["two"], json!({"text": "b"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_node_workers_finish_their_task_on_sigterm_and_exit_cleanly() {
    let cluster = Cluster::start(Profile::Debug).await;
    for lang in ["py", "node"] {
        let id = format!("{lang}-term");
        let types = format!("{lang}.*");
        let mut worker = match lang {
            "py" => Worker::python(&cluster, &id, &types, &[]).await,
            _ => Worker::node(&cluster, &id, &types, &[]).await,
        };
        let slow = format!("{lang}.slow");
        let run_id = submit(
            &cluster,
            tree(
                &format!("workers-sigterm-{lang}"),
                &[slow.as_str()],
                tool("finish", &slow, json!({"ms": 1000}), "finished"),
            ),
        )
        .await;
        let task = worker.task_line(&slow).await;
        worker.signal(Signal::SIGTERM);

        assert_eq!(worker.exit_code().await, Some(0), "{}", worker.transcript());
        let lines = worker.lines();
        let done = format!("completed id={} accepted=true", task.id);
        let tail: Vec<&str> = lines
            .iter()
            .rev()
            .take(2)
            .rev()
            .map(String::as_str)
            .collect();
        assert_eq!(tail, [done.as_str(), "stopped"], "{}", worker.transcript());
        let bb = finished(&cluster, &run_id, rpb::RunStatus::Succeeded).await;
        assert_eq!(bb["finished"]["slept_ms"], json!(1000));
        assert_eq!(
            task_log(&cluster, &run_id).await,
            [
                format!("dispatched {slow} #1 to {id}"),
                format!("completed {slow} #1 by {id}")
            ]
        );
    }
}
