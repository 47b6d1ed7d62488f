//! A small in-test RunnerService with the contract semantics approval-svc relies on: a durable
//! event log with named-subscriber cursors (replay then follow, OUT_OF_RANGE past compaction),
//! Ack, and Resolve (idempotent by decision id, NOT_FOUND / FAILED_PRECONDITION for unknown or
//! dead requests). Tests script failures and duplicates on it.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use arbor_shared::proto::runner::v1::{
    self as pb,
    event::Detail,
    runner_service_server::{RunnerService, RunnerServiceServer},
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

#[derive(Default)]
pub struct State {
    pub events: Vec<pb::Event>,
    pub cursors: HashMap<String, u64>,
    /// Events with seq <= this were compacted away.
    pub compacted_through: u64,
    /// Every Resolve received, in order.
    pub resolves: Vec<pb::ResolveRequest>,
    /// request id → accepted decision id.
    pub accepted: HashMap<String, String>,
    /// Request ids the runner treats as withdrawn.
    pub dead: HashSet<String>,
    /// Errors the next Resolve calls answer with, in order.
    pub resolve_script: VecDeque<Code>,
    /// Send every event twice.
    pub duplicate_events: bool,
    /// On an accepted Resolve, emit APPROVAL_CONSUMED like a run that resumes at once.
    pub auto_consume: bool,
    pub stream_calls: u32,
    pub acks: Vec<u64>,
    /// The authorization header of every Resolve/Ack/StreamEvents call.
    pub tokens: Vec<Option<String>>,
}

#[derive(Clone)]
pub struct FakeRunner {
    pub state: Arc<Mutex<State>>,
    head: Arc<watch::Sender<u64>>,
    kick: Arc<watch::Sender<u64>>,
    pub addr: SocketAddr,
}

impl FakeRunner {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let runner = Self {
            state: Arc::default(),
            head: Arc::new(watch::channel(0).0),
            kick: Arc::new(watch::channel(0).0),
            addr,
        };
        let service = RunnerServiceServer::new(runner.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        runner
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Appends an event to the log; returns its seq.
    pub fn push(&self, run_id: &str, kind: pb::EventKind, detail: Option<Detail>) -> u64 {
        let seq = self.with(|s| {
            let seq = s.events.last().map_or(s.compacted_through, |e| e.seq) + 1;
            s.events.push(pb::Event {
                seq,
                run_id: run_id.into(),
                thread_id: format!("thread-{run_id}"),
                time: Some(arbor_shared::time::timestamp(arbor_shared::time::now_ms())),
                kind: kind as i32,
                detail,
                traceparent: String::new(),
            });
            seq
        });
        self.head.send_replace(seq);
        seq
    }

    pub fn push_request(&self, r: pb::ApprovalRequested) -> u64 {
        let run = r.run_id.clone();
        self.push(
            &run,
            pb::EventKind::ApprovalRequested,
            Some(Detail::ApprovalRequested(r)),
        )
    }

    pub fn push_consumed(&self, run_id: &str, request_id: &str, decision_id: &str) -> u64 {
        self.push(
            run_id,
            pb::EventKind::ApprovalConsumed,
            Some(Detail::ApprovalConsumed(pb::ApprovalConsumed {
                request_id: request_id.into(),
                decision_id: decision_id.into(),
            })),
        )
    }

    pub fn push_withdrawn(&self, run_id: &str, request_id: &str) -> u64 {
        self.with(|s| s.dead.insert(request_id.to_string()));
        self.push(
            run_id,
            pb::EventKind::SuspensionWithdrawn,
            Some(Detail::SuspensionWithdrawn(pb::SuspensionWithdrawn {
                request_id: request_id.into(),
                reason: "halted by a timeout".into(),
            })),
        )
    }

    pub fn push_run_finished(&self, run_id: &str, status: pb::RunStatus) -> u64 {
        let kind = match status {
            pb::RunStatus::Superseded => pb::EventKind::RunSuperseded,
            pb::RunStatus::Cancelled => pb::EventKind::RunCancelled,
            pb::RunStatus::Failed => pb::EventKind::RunFailed,
            _ => pb::EventKind::RunSucceeded,
        };
        self.push(
            run_id,
            kind,
            Some(Detail::RunFinished(pb::RunFinished {
                status: status as i32,
                error: String::new(),
                blackboard: None,
            })),
        )
    }

    /// Forgets every event up to `through`, as log compaction would.
    pub fn compact(&self, through: u64) {
        self.with(|s| {
            s.events.retain(|e| e.seq > through);
            s.compacted_through = s.compacted_through.max(through);
        });
    }

    /// Drops every open event stream with UNAVAILABLE, as a runner restart would.
    pub fn kick_streams(&self) {
        self.kick.send_modify(|k| *k += 1);
    }

    pub fn cursor(&self, subscriber: &str) -> u64 {
        self.with(|s| s.cursors.get(subscriber).copied().unwrap_or(0))
    }

    pub fn resolves_for(&self, request_id: &str) -> Vec<pb::ResolveRequest> {
        self.with(|s| {
            s.resolves
                .iter()
                .filter(|r| r.request_id == request_id)
                .cloned()
                .collect()
        })
    }

    fn note_token<T>(&self, req: &Request<T>) {
        let token = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        self.with(|s| s.tokens.push(token));
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not part of the fake runner"))
}

#[tonic::async_trait]
impl RunnerService for FakeRunner {
    async fn register_tree(
        &self,
        _: Request<pb::RegisterTreeRequest>,
    ) -> Result<Response<pb::RegisterTreeResponse>, Status> {
        unimplemented()
    }
    async fn get_tree(
        &self,
        _: Request<pb::GetTreeRequest>,
    ) -> Result<Response<pb::GetTreeResponse>, Status> {
        unimplemented()
    }
    async fn submit_run(
        &self,
        _: Request<pb::SubmitRunRequest>,
    ) -> Result<Response<pb::SubmitRunResponse>, Status> {
        unimplemented()
    }
    async fn get_run(
        &self,
        _: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::GetRunResponse>, Status> {
        unimplemented()
    }
    async fn get_run_nodes(
        &self,
        _: Request<pb::GetRunNodesRequest>,
    ) -> Result<Response<pb::GetRunNodesResponse>, Status> {
        unimplemented()
    }
    async fn list_runs(
        &self,
        _: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        unimplemented()
    }
    async fn cancel_run(
        &self,
        _: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        unimplemented()
    }
    async fn interrupt_thread(
        &self,
        _: Request<pb::InterruptThreadRequest>,
    ) -> Result<Response<pb::InterruptThreadResponse>, Status> {
        unimplemented()
    }
    async fn list_jobs(
        &self,
        _: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        unimplemented()
    }
    async fn requeue_job(
        &self,
        _: Request<pb::RequeueJobRequest>,
    ) -> Result<Response<pb::RequeueJobResponse>, Status> {
        unimplemented()
    }

    type StreamEventsStream = ReceiverStream<Result<pb::StreamEventsResponse, Status>>;

    async fn stream_events(
        &self,
        req: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        self.note_token(&req);
        let r = req.into_inner();
        let (mut next, compacted, dup) = self.with(|s| {
            s.stream_calls += 1;
            let cursor = r
                .after_seq
                .unwrap_or_else(|| s.cursors.get(&r.subscriber_id).copied().unwrap_or(0));
            (cursor, s.compacted_through, s.duplicate_events)
        });
        if next < compacted {
            return Err(Status::out_of_range(format!(
                "cursor {next} is older than the oldest retained event {}",
                compacted + 1
            )));
        }
        let (tx, rx) = mpsc::channel(256);
        let state = self.state.clone();
        let mut head = self.head.subscribe();
        let mut kick = self.kick.subscribe();
        kick.mark_unchanged();
        tokio::spawn(async move {
            loop {
                let batch: Vec<pb::Event> = state
                    .lock()
                    .unwrap()
                    .events
                    .iter()
                    .filter(|e| e.seq > next)
                    .cloned()
                    .collect();
                for event in batch {
                    next = event.seq;
                    let copies = if dup { 2 } else { 1 };
                    for _ in 0..copies {
                        let item = pb::StreamEventsResponse {
                            event: Some(event.clone()),
                        };
                        if tx.send(Ok(item)).await.is_err() {
                            return;
                        }
                    }
                }
                if !r.follow {
                    return;
                }
                tokio::select! {
                    _ = head.changed() => {}
                    _ = kick.changed() => {
                        let _ = tx.send(Err(Status::unavailable("runner restarting"))).await;
                        return;
                    }
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn resolve(
        &self,
        req: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        self.note_token(&req);
        let r = req.into_inner();
        let (outcome, consume) = self.with(|s| {
            s.resolves.push(r.clone());
            if let Some(code) = s.resolve_script.pop_front() {
                return (Err(Status::new(code, "scripted failure")), false);
            }
            if s.dead.contains(&r.request_id) {
                return (
                    Err(Status::failed_precondition("suspension withdrawn")),
                    false,
                );
            }
            let known = s.events.iter().any(|e| {
                matches!(&e.detail, Some(Detail::ApprovalRequested(a)) if a.request_id == r.request_id)
            });
            if !known {
                return (Err(Status::not_found("unknown request")), false);
            }
            match s.accepted.get(&r.request_id) {
                Some(d) if *d == r.decision_id => (Ok(true), false),
                Some(_) => (
                    Err(Status::failed_precondition("decided with another decision")),
                    false,
                ),
                None => {
                    s.accepted
                        .insert(r.request_id.clone(), r.decision_id.clone());
                    (Ok(false), s.auto_consume)
                }
            }
        });
        if consume {
            self.push_consumed(&r.run_id, &r.request_id, &r.decision_id);
        }
        outcome.map(|duplicate| {
            Response::new(pb::ResolveResponse {
                duplicate,
                run: None,
            })
        })
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        self.note_token(&req);
        let r = req.into_inner();
        let acked = self.with(|s| {
            s.acks.push(r.seq);
            let c = s.cursors.entry(r.subscriber_id).or_insert(0);
            *c = (*c).max(r.seq);
            *c
        });
        Ok(Response::new(pb::AckResponse { acked_seq: acked }))
    }
}
