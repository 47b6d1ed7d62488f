//! The harness of the task worker tests: a runner served on an ephemeral port, its RunnerService
//! and WorkerService clients, the worker calls the tests make, and readers of the runner's state.

pub use crate::common::Backend;
pub use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

pub use arbor_runner_svc::runs::{RunView, Runner};
pub use arbor_shared::{
    domain::{Event, EventDetail, EventKind, RunStatus, TaskFailure},
    json::{from_optional_value, to_proto_struct_any, to_proto_value},
    proto::runner::v1::{
        self as pb, runner_service_client::RunnerServiceClient,
        worker_service_client::WorkerServiceClient,
    },
    testing::eventually,
    time::from_timestamp,
};
pub use pb::TaskState as S;
pub use serde_json::{Value as Json, json};
pub use tonic::{Code, Status, transport::Channel};

pub const WAIT: Duration = Duration::from_secs(20);
/// The remote tool most trees call; the tests' worker answers it with [`doubled`].
pub const WORK: &str = "rs.work";

pub type Workers = WorkerServiceClient<Channel>;

/// A served runner, its clients, and the runner itself for reading state.
pub struct Rig {
    pub served: crate::common::Served,
    pub runs: RunnerServiceClient<Channel>,
    pub workers: Workers,
}

impl Rig {
    pub async fn start(b: Backend, dir: &std::path::Path) -> Self {
        let served = b.serve(dir).await;
        let runs = RunnerServiceClient::connect(served.url()).await.unwrap();
        let workers = WorkerServiceClient::connect(served.url()).await.unwrap();
        Self {
            served,
            runs,
            workers,
        }
    }

    pub fn runner(&self) -> &Runner {
        &self.served.runner
    }

    pub fn w(&self) -> Workers {
        self.workers.clone()
    }

    pub async fn register(&self, doc: Json) {
        self.runs
            .clone()
            .register_tree(pb::RegisterTreeRequest {
                document: doc.to_string(),
                format: pb::TreeFormat::Json.into(),
            })
            .await
            .unwrap();
    }

    pub async fn submit_on(&self, tree: &str, thread: &str, input: Json) -> String {
        let run = self
            .runs
            .clone()
            .submit_run(pb::SubmitRunRequest {
                tree_id: tree.into(),
                thread_id: thread.into(),
                input: Some(to_proto_struct_any(&input)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .run
            .unwrap();
        run.run_id
    }

    pub async fn submit(&self, tree: &str, input: Json) -> String {
        self.submit_on(tree, "", input).await
    }

    /// The run once it has ended.
    pub async fn finished(&self, run_id: &str) -> RunView {
        eventually(&format!("run {run_id} to end"), WAIT, || async {
            let view = self.runner().get_run(run_id).unwrap();
            view.run.status.is_terminal().then_some(view)
        })
        .await
    }

    pub async fn list(&self, filter: pb::ListTasksRequest) -> Vec<pb::Task> {
        self.w()
            .list_tasks(filter)
            .await
            .unwrap()
            .into_inner()
            .tasks
    }

    pub async fn in_states(&self, states: &[S]) -> Vec<pb::Task> {
        let states = states.iter().map(|s| *s as i32).collect();
        self.list(pb::ListTasksRequest {
            states,
            ..Default::default()
        })
        .await
    }

    /// The run's one task, as ListTasks shows it.
    pub async fn task(&self, run_id: &str) -> pb::Task {
        let mut tasks = self
            .list(pb::ListTasksRequest {
                run_id: run_id.into(),
                ..Default::default()
            })
            .await;
        assert_eq!(tasks.len(), 1, "run {run_id} has one task: {tasks:?}");
        tasks.remove(0)
    }

    /// The run's task once it is in `state` (the run may not have asked for it yet).
    pub async fn task_becomes(&self, run_id: &str, state: S) -> pb::Task {
        eventually(
            &format!("the task of {run_id} to be {state:?}"),
            WAIT,
            || async {
                let filter = pb::ListTasksRequest {
                    run_id: run_id.into(),
                    ..Default::default()
                };
                let mut tasks = self.list(filter).await;
                (tasks.len() == 1 && tasks[0].state == state as i32).then(|| tasks.remove(0))
            },
        )
        .await
    }

    /// One activation of `types`, long-polled for as long as it takes (within WAIT).
    pub async fn take(&self, worker: &str, types: &[&str], lease_ms: u32) -> pb::TaskActivation {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut got = self.poll(worker, types, lease_ms, 5_000).await;
            if let Some(task) = got.pop() {
                return task;
            }
            assert!(Instant::now() < deadline, "no task of {types:?} came");
        }
    }

    pub async fn poll(
        &self,
        worker: &str,
        types: &[&str],
        lease_ms: u32,
        wait_ms: u32,
    ) -> Vec<pb::TaskActivation> {
        self.w()
            .poll_tasks(poll_req(worker, types, lease_ms, wait_ms))
            .await
            .unwrap()
            .into_inner()
            .tasks
    }

    /// The run's events, every one committed so far (a run read as ended may show a step whose
    /// events are still being made streamable).
    pub async fn events(&self, run_id: &str) -> Vec<Event> {
        self.runner().caught_up().await.unwrap();
        let all = self.runner().events().read_after(0, 100_000).await.unwrap();
        all.into_iter().filter(|e| e.run_id == run_id).collect()
    }

    pub async fn count(&self, run_id: &str, kind: EventKind) -> usize {
        self.events(run_id)
            .await
            .iter()
            .filter(|e| e.kind() == kind)
            .count()
    }

    /// The run's TASK_FAILED events: (attempt, cause, will_retry, retry_at_ms, code, error).
    pub async fn failures(
        &self,
        run_id: &str,
    ) -> Vec<(u32, TaskFailure, bool, u64, String, String)> {
        self.events(run_id)
            .await
            .into_iter()
            .filter_map(|e| match e.detail {
                EventDetail::TaskFailed {
                    task,
                    error,
                    cause,
                    code,
                    will_retry,
                    retry_at_ms,
                } => Some((task.attempt, cause, will_retry, retry_at_ms, code, error)),
                _ => None,
            })
            .collect()
    }

    pub async fn task_event_count(&self, run_id: &str) -> usize {
        let task_kinds = [
            EventKind::TaskDispatched,
            EventKind::TaskCompleted,
            EventKind::TaskFailed,
            EventKind::TaskReleased,
        ];
        let events = self.events(run_id).await;
        events
            .iter()
            .filter(|e| task_kinds.contains(&e.kind()))
            .count()
    }
}

pub fn poll_req(worker: &str, types: &[&str], lease_ms: u32, wait_ms: u32) -> pb::PollTasksRequest {
    pb::PollTasksRequest {
        worker_id: worker.into(),
        task_types: types.iter().map(|t| t.to_string()).collect(),
        max_tasks: 1,
        lease_ms,
        wait_ms,
    }
}

/// A tree document that declares the remote tools the tests call.
pub fn tree(id: &str, root: Json) -> Json {
    json!({"id": id, "version": 1,
           "task_types": [WORK, "rs.reserve", "rs.expire", "rs.later"],
           "root": root})
}

/// A remote `tool` node of `tool` with args `{n: $n}` writing to `result`, plus `extra` fields.
pub fn remote(tool: &str, extra: Json) -> Json {
    let mut node = json!({"type": "tool", "name": "work", "tool": tool,
                          "args": {"n": {"$ref": "n"}}, "output": "result"});
    node.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    node
}

pub fn val(json: Json) -> Option<prost_types::Value> {
    Some(to_proto_value(&json))
}

/// What the test's worker returns for an activation.
pub fn doubled(a: &pb::TaskActivation) -> Json {
    let n = from_optional_value(a.args.as_ref())["n"].as_i64().unwrap();
    json!({"doubled": n * 2})
}

pub fn code<T: std::fmt::Debug>(r: Result<T, Status>) -> Code {
    r.expect_err("the call was refused").code()
}

pub fn complete_req(a: &pb::TaskActivation, token: &str, output: Json) -> pb::CompleteTaskRequest {
    pb::CompleteTaskRequest {
        task_id: a.task_id.clone(),
        lease_token: token.into(),
        output: val(output),
    }
}

pub async fn complete(
    w: &mut Workers,
    a: &pb::TaskActivation,
    output: Json,
) -> pb::CompleteTaskResponse {
    w.complete_task(complete_req(a, &a.lease_token, output))
        .await
        .unwrap()
        .into_inner()
}

pub async fn heartbeat(
    w: &mut Workers,
    a: &pb::TaskActivation,
    token: &str,
    details: Option<Json>,
) -> Result<pb::HeartbeatResponse, Status> {
    w.heartbeat(pb::HeartbeatRequest {
        task_id: a.task_id.clone(),
        lease_token: token.into(),
        details: details.and_then(val),
    })
    .await
    .map(tonic::Response::into_inner)
}

/// ReleaseTask of `a` with `token`.
pub async fn release(
    w: &mut Workers,
    a: &pb::TaskActivation,
    token: &str,
    reason: &str,
) -> Result<pb::ReleaseTaskResponse, Status> {
    w.release_task(pb::ReleaseTaskRequest {
        task_id: a.task_id.clone(),
        lease_token: token.into(),
        reason: reason.into(),
    })
    .await
    .map(tonic::Response::into_inner)
}

pub async fn next_activation(
    stream: &mut tonic::Streaming<pb::StreamTasksResponse>,
) -> pb::TaskActivation {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("an activation in time")
        .unwrap()
        .expect("the stream is open")
        .task
        .unwrap()
}
