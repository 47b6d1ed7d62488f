//! The bench's task workers: the Python package's worker process and the bench's own Rust
//! worker, each reporting every finished task, and the keeper that keeps runs asking for tasks.

use super::*;

/// One finished task as its worker saw it: times on the worker's monotonic clock, in ns.
pub(super) struct Done {
    pub(super) run_id: String,
    pub(super) recv_ns: u64,
    /// When the handler returned (the Python Worker's hand-off to its handler thread before).
    pub(super) handled_ns: Option<u64>,
    pub(super) ack_ns: u64,
    pub(super) accepted: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Worker {
    Python,
    Rust,
}

/// Keeps runs going: submits `n` at the start, and another each time a run's last task is
/// done, so the number of runs asking for tasks stays the same.
pub(super) struct Keeper {
    runner: Runner,
    repeat: usize,
    done_per_run: HashMap<String, usize>,
}

impl Keeper {
    pub(super) fn new(runner: Runner, repeat: usize, n: usize) -> Self {
        let keeper = Self {
            runner,
            repeat,
            done_per_run: HashMap::new(),
        };
        (0..n).for_each(|_| keeper.submit());
        keeper
    }

    pub(super) fn submit(&self) {
        let mut runner = self.runner.clone();
        tokio::spawn(async move {
            let tree_id = TREE_ID.into();
            let req = rpb::SubmitRunRequest {
                tree_id,
                ..Default::default()
            };
            if let Err(e) = runner.submit_run(req).await {
                eprintln!("  submit failed: {e}");
            }
        });
    }

    pub(super) fn task_done(&mut self, run_id: &str) {
        let n = self.done_per_run.entry(run_id.to_string()).or_default();
        *n += 1;
        if *n == self.repeat {
            self.done_per_run.remove(run_id);
            self.submit();
        }
    }
}

/// The python of the virtualenv that has the `arbor-client` package (clients/python) installed.
pub(super) fn python_setup() -> PathBuf {
    tools::python_client()
}

/// One `done run=… recv=… ack=… accepted=…` line of bench_worker.py.
pub(super) fn parse_done(line: &str) -> Option<Done> {
    let (mut run_id, mut recv_ns, mut handled_ns, mut ack_ns) = (None, None, None, None);
    let mut accepted = false;
    for field in line.strip_prefix("done ")?.split_whitespace() {
        match field.split_once('=')? {
            ("run", v) => run_id = Some(v.to_string()),
            ("recv", v) => recv_ns = v.parse().ok(),
            ("handled", v) => handled_ns = v.parse().ok(),
            ("ack", v) => ack_ns = v.parse().ok(),
            ("accepted", v) => accepted = v == "true",
            _ => {}
        }
    }
    Some(Done {
        run_id: run_id?,
        recv_ns: recv_ns?,
        handled_ns,
        ack_ns: ack_ns?,
        accepted,
    })
}

/// bench_worker.py with max_in_flight=1; its `done` lines arrive on the returned channel once
/// it has issued StreamTasks.
pub(super) async fn python_worker(
    cluster: &BenchCluster,
    python: &PathBuf,
) -> (tokio::process::Child, mpsc::UnboundedReceiver<Done>) {
    let mut child = tokio::process::Command::new(python)
        .arg(workspace_root().join("tests/clients/python/bench_worker.py"))
        .args(["--runner", &cluster.runners[0].addr.to_string()])
        .args([
            "--token",
            WORKER,
            "--types",
            TASK_TYPE,
            "--max-in-flight",
            "1",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start bench_worker.py");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(PATIENCE, lines.next_line()).await {
        if line == "ready" {
            break;
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(done) = parse_done(&line)
                && tx.send(done).is_err()
            {
                return;
            }
        }
    });
    (child, rx)
}

/// One StreamTasks stream; each activation is completed at once on its own tokio task, so up
/// to `max_in_flight` CompleteTask calls are in flight together on the one channel.
pub(super) async fn rust_worker(
    cluster: &BenchCluster,
    max_in_flight: usize,
) -> mpsc::UnboundedReceiver<Done> {
    let token = BearerToken::new(Some(WORKER)).expect("ascii token");
    let mut workers =
        WorkerServiceClient::with_interceptor(cluster.runners[0].channel().await, token);
    let request = rpb::StreamTasksRequest {
        worker_id: "bench-rust".into(),
        task_types: vec![TASK_TYPE.into()],
        max_in_flight: max_in_flight as u32,
        lease_ms: 30_000,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let origin = Instant::now();
    let ns = move || origin.elapsed().as_nanos() as u64;
    tokio::spawn(async move {
        let mut stream = match workers.stream_tasks(request).await {
            Ok(s) => s.into_inner(),
            Err(e) => return eprintln!("  StreamTasks refused: {e}"),
        };
        let output = to_proto_value(&json!({"ok": true}));
        loop {
            let task = match stream.message().await {
                Ok(Some(rpb::StreamTasksResponse { task: Some(task) })) => task,
                Ok(Some(_)) => continue,
                // Once the measurement has dropped its receiver the end is expected.
                _ if tx.is_closed() => return,
                Ok(None) => return eprintln!("  the runner ended the task stream"),
                Err(e) => return eprintln!("  task stream broke: {e}"),
            };
            let recv_ns = ns();
            let (mut workers, tx, output) = (workers.clone(), tx.clone(), output.clone());
            tokio::spawn(async move {
                let req = rpb::CompleteTaskRequest {
                    task_id: task.task_id,
                    lease_token: task.lease_token,
                    output: Some(output),
                };
                let reply = workers.complete_task(req).await;
                let _ = tx.send(Done {
                    run_id: task.run_id,
                    recv_ns,
                    handled_ns: None,
                    ack_ns: ns(),
                    accepted: reply.is_ok_and(|r| r.into_inner().accepted),
                });
            });
        }
    });
    rx
}
