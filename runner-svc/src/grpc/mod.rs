//! The `arbor.runner.v1.RunnerService` handlers: thin adapters that check roles, convert at the
//! edge and call `Runner`.

pub mod access;
mod convert;
pub mod worker;

use std::{pin::Pin, sync::Arc, time::Duration};

use arbor_shared::{
    auth::{Role, principal_of},
    domain::{DecisionSource, EventKind, JobStatus, Verdict},
    json::from_optional_value,
    proto::runner::v1::{self as pb, runner_service_server::RunnerService},
    trace::TraceContext,
};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::{
    engine::TreeFormat,
    error::RunnerError,
    events::EventFilter,
    mailbox::JobFilter,
    runs::{ResolveInput, RunFilter, Runner},
};

/// Events read from the store per batch when a stream catches up.
const STREAM_BATCH: usize = 512;
/// Events buffered per stream before the reader waits for the client.
const STREAM_BUFFER: usize = 1024;

/// The error for a cursor whose next events were compacted away.
fn compacted(cursor: u64, first: u64) -> RunnerError {
    RunnerError::CursorCompacted { cursor, first }
}

#[derive(Clone)]
pub struct RunnerGrpc {
    runner: Arc<Runner>,
    shutdown: CancellationToken,
    lag_timeout: Duration,
}

impl RunnerGrpc {
    pub fn new(runner: Arc<Runner>, shutdown: CancellationToken, lag_timeout: Duration) -> Self {
        Self {
            runner,
            shutdown,
            lag_timeout,
        }
    }

    /// A run as GetRun shows it: never ahead of what StreamEvents can return.
    async fn view(&self, run_id: &str) -> Result<crate::runs::RunView, RunnerError> {
        let view = self.runner.get_run(run_id)?;
        self.runner.caught_up().await?;
        Ok(view)
    }
}

type StreamItem = Result<pb::StreamEventsResponse, Status>;

/// Sends one item, keeping one buffer slot free for a final error. A subscriber that leaves its
/// buffer full for `lag` is dropped with RESOURCE_EXHAUSTED: the runner never waits on it, and
/// it resumes from its cursor.
async fn send_or_drop(
    tx: &tokio::sync::mpsc::Sender<StreamItem>,
    item: pb::StreamEventsResponse,
    lag: Duration,
) -> bool {
    match tokio::time::timeout(lag, tx.reserve_many(2)).await {
        Ok(Ok(mut permits)) => {
            if let Some(permit) = permits.next() {
                permit.send(Ok(item));
            }
            true
        }
        Ok(Err(_)) => false,
        Err(_) => {
            let _ = tx.try_send(Err(Status::resource_exhausted(format!(
                "subscriber read nothing for {lag:?} with its buffer full; dropped — resume from \
                 your cursor"
            ))));
            false
        }
    }
}

type Res<T> = Result<Response<T>, Status>;

fn ok<T>(t: T) -> Res<T> {
    Ok(Response::new(t))
}

#[tonic::async_trait]
impl RunnerService for RunnerGrpc {
    async fn register_tree(
        &self,
        req: Request<pb::RegisterTreeRequest>,
    ) -> Res<pb::RegisterTreeResponse> {
        principal_of(&req).require(&[Role::Submitter, Role::Operator], "register trees")?;
        let r = req.into_inner();
        let format = match pb::TreeFormat::try_from(r.format) {
            Ok(pb::TreeFormat::Unspecified | pb::TreeFormat::Json) => TreeFormat::Json,
            Ok(pb::TreeFormat::Yaml) => TreeFormat::Yaml,
            Err(_) => {
                return Err(
                    RunnerError::invalid("format", format!("unknown format {}", r.format)).into(),
                );
            }
        };
        let (tree, already_registered) = self.runner.register_tree(&r.document, format).await?;
        ok(pb::RegisterTreeResponse {
            tree: Some(convert::tree(&tree)),
            already_registered,
        })
    }

    async fn get_tree(&self, req: Request<pb::GetTreeRequest>) -> Res<pb::GetTreeResponse> {
        principal_of(&req).require(access::TREE_READERS, "read trees")?;
        let r = req.into_inner();
        // Tree ids are at most 128 bytes (parse_tree enforces it), so a longer one is malformed,
        // not merely unknown.
        if r.tree_id.is_empty() || r.tree_id.len() > 128 {
            return Err(RunnerError::invalid("tree_id", "must be 1-128 bytes").into());
        }
        let tree = self.runner.tree_record(&r.tree_id, r.version)?;
        ok(pb::GetTreeResponse {
            tree: Some(convert::tree(&tree)),
        })
    }

    async fn submit_run(&self, req: Request<pb::SubmitRunRequest>) -> Res<pb::SubmitRunResponse> {
        let principal = principal_of(&req);
        principal.require(&[Role::Submitter, Role::Operator], "submit runs")?;
        let mut input =
            convert::submit_input(req.get_ref(), &principal.name).map_err(RunnerError::from)?;
        input.trace = incoming_trace(req.metadata());
        let initial_blackboard = input.input.clone();
        let may_exist = !input.run_id.is_empty();
        // Resubmitting an existing run id resumes that run and answers with it: only a caller
        // who may read it does either.
        let reads = access::RunReads::of(&principal)?;
        if may_exist && !reads.is_all() {
            match self.runner.get_run(&input.run_id) {
                Ok(existing) => reads.check(&existing)?,
                Err(RunnerError::RunNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let submitted = self.runner.submit(input).await?;
        tracing::info!(run_id = %submitted.run.run_id, deduplicated = submitted.deduplicated,
            trace_id = %submitted.trace_id, "run submitted");
        // A new run is exactly its record and its input: no need to read the checkpoint back.
        let view = if submitted.deduplicated || may_exist {
            let view = self.view(&submitted.run.run_id).await?;
            // A dedupe key another principal used answers with that principal's run; nothing
            // was written, and the caller does not get to see it.
            reads.check(&view)?;
            view
        } else {
            crate::runs::RunView {
                run: submitted.run.clone(),
                blackboard: initial_blackboard,
                suspensions: Vec::new(),
            }
        };
        ok(pb::SubmitRunResponse {
            run: Some(convert::run(&view)),
            job_id: submitted.job_id,
            deduplicated: submitted.deduplicated,
        })
    }

    async fn get_run(&self, req: Request<pb::GetRunRequest>) -> Res<pb::GetRunResponse> {
        let reads = access::RunReads::of(&principal_of(&req))?;
        let view = self.view(&req.get_ref().run_id).await?;
        reads.check(&view)?;
        ok(pb::GetRunResponse {
            run: Some(convert::run(&view)),
        })
    }

    async fn get_run_nodes(
        &self,
        req: Request<pb::GetRunNodesRequest>,
    ) -> Res<pb::GetRunNodesResponse> {
        // Same rule as GetRun: the node statuses show as much of the run as GetRun does.
        let reads = access::RunReads::of(&principal_of(&req))?;
        let run_id = &req.get_ref().run_id;
        let view = self.view(run_id).await?;
        reads.check(&view)?;
        let nodes = self.runner.run_nodes(run_id)?;
        ok(pb::GetRunNodesResponse {
            nodes: nodes.iter().map(convert::run_node).collect(),
        })
    }

    async fn list_runs(&self, req: Request<pb::ListRunsRequest>) -> Res<pb::ListRunsResponse> {
        // A submitter or approver is not refused: it gets the runs it may read.
        let reads = access::RunReads::of(&principal_of(&req))?;
        let r = req.into_inner();
        let filter = RunFilter {
            thread_id: r.thread_id,
            tree_id: r.tree_id,
            statuses: convert::statuses(&r.statuses).map_err(RunnerError::from)?,
            visible: reads.visible(),
        };
        let page = self.runner.list_runs(&filter, r.page_size, &r.page_token)?;
        self.runner.caught_up().await?;
        ok(pb::ListRunsResponse {
            runs: page.runs.iter().map(convert::run).collect(),
            next_page_token: page.next_page_token,
        })
    }

    async fn cancel_run(&self, req: Request<pb::CancelRunRequest>) -> Res<pb::CancelRunResponse> {
        let principal = principal_of(&req);
        let r = req.into_inner();
        if !principal.has(Role::Operator) {
            principal.require(&[Role::Submitter], "cancel runs")?;
            let run = self.runner.get_run(&r.run_id)?;
            if run.run.submitted_by != principal.name {
                return Err(Status::permission_denied(format!(
                    "principal '{}' may only cancel runs it submitted",
                    principal.name
                )));
            }
        }
        let view = self.runner.cancel_run(&r.run_id, &r.reason).await?;
        self.runner.caught_up().await?;
        ok(pb::CancelRunResponse {
            run: Some(convert::run(&view)),
        })
    }

    async fn interrupt_thread(
        &self,
        req: Request<pb::InterruptThreadRequest>,
    ) -> Res<pb::InterruptThreadResponse> {
        let principal = principal_of(&req);
        principal.require(&[Role::Submitter, Role::Operator], "interrupt threads")?;
        let trace = incoming_trace(req.metadata());
        let r = req.into_inner();
        // An interrupt cancels every run of the thread, so a submitter may interrupt only a
        // thread whose runs are all its own (as with CancelRun); operators may interrupt any.
        if !principal.has(Role::Operator) {
            for run_id in self.runner.thread_runs(&r.thread_id)? {
                let run = self.runner.run_record(&run_id)?;
                if run.submitted_by != principal.name {
                    return Err(Status::permission_denied(format!(
                        "principal '{}' may only interrupt threads whose runs it submitted",
                        principal.name
                    )));
                }
            }
        }
        let next = match &r.next {
            Some(n) => {
                let mut input =
                    convert::submit_input(n, &principal.name).map_err(RunnerError::from)?;
                input.trace = trace;
                Some(input)
            }
            None => None,
        };
        let (intr, next_run) = self.runner.interrupt(&r.thread_id, &r.reason, next).await?;
        let next_run = match next_run {
            Some(s) => Some(convert::run(&self.view(&s.run.run_id).await?)),
            None => None,
        };
        ok(pb::InterruptThreadResponse {
            interrupt: Some(pb::MailboxInterrupt {
                new_generation: intr.new_generation,
                active_job: intr.active_job.as_ref().map(convert::job),
                superseded_count: intr.superseded_count,
            }),
            next_run,
        })
    }

    type StreamEventsStream =
        Pin<Box<dyn Stream<Item = Result<pb::StreamEventsResponse, Status>> + Send>>;

    async fn stream_events(
        &self,
        req: Request<pb::StreamEventsRequest>,
    ) -> Res<Self::StreamEventsStream> {
        let principal = principal_of(&req);
        let r = req.into_inner();
        let filter = EventFilter {
            run_id: r
                .filter
                .as_ref()
                .map(|f| f.run_id.clone())
                .unwrap_or_default(),
            thread_id: r
                .filter
                .as_ref()
                .map(|f| f.thread_id.clone())
                .unwrap_or_default(),
            kinds: r
                .filter
                .as_ref()
                .map(|f| {
                    f.kinds
                        .iter()
                        .map(|k| EventKind::from_wire(*k, "filter.kinds"))
                        .collect::<Result<Vec<_>, _>>()
                })
                .transpose()
                .map_err(RunnerError::from)?
                .unwrap_or_default(),
        };
        if r.subscriber_id.len() > 128 {
            return Err(RunnerError::invalid("subscriber_id", "at most 128 bytes").into());
        }
        let mut reads = access::StreamReads::of(
            &principal,
            &self.runner,
            &r.subscriber_id,
            &filter.run_id,
            &filter.thread_id,
        )?;
        let events = self.runner.events().clone();
        let cursor = match r.after_seq {
            Some(seq) => seq,
            None if !r.subscriber_id.is_empty() => events
                .cursor(&r.subscriber_id)
                .map_err(RunnerError::from)?
                .unwrap_or(0),
            None => 0,
        };
        let first = events.first_seq().map_err(RunnerError::from)?;
        if cursor + 1 < first {
            return Err(compacted(cursor, first).into());
        }
        // A cursor past the end claims events this log never had (a runner restored from an
        // older backup, or a cursor meant for another runner). Following it would skip the
        // next events silently; refuse, like a compacted cursor, so the subscriber reconciles.
        let last = events.last_seq().map_err(RunnerError::from)?;
        if cursor > last {
            return Err(RunnerError::CursorAhead { cursor, last }.into());
        }
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        let shutdown = self.shutdown.clone();
        let lag = self.lag_timeout;
        let runner = self.runner.clone();
        tokio::spawn(async move {
            let mut watch = events.watch();
            let mut cursor = cursor;
            loop {
                let batch = match events.read_after(cursor, STREAM_BATCH).await {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(RunnerError::from(e)))).await;
                        return;
                    }
                };
                let caught_up = batch.len() < STREAM_BATCH;
                // Retention may have compacted events this stream has not read yet: say so
                // rather than skip them silently.
                if batch.first().is_none_or(|e| e.seq != cursor + 1) {
                    match events.first_seq() {
                        Ok(first) if cursor + 1 < first => {
                            let _ = tx.send(Err(Status::from(compacted(cursor, first)))).await;
                            return;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            let _ = tx.send(Err(Status::from(RunnerError::from(e)))).await;
                            return;
                        }
                    }
                }
                for event in batch {
                    cursor = event.seq;
                    if !filter.matches(&event) {
                        continue;
                    }
                    match reads.shows(&runner, &event.run_id) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => {
                            let _ = tx.send(Err(Status::from(e))).await;
                            return;
                        }
                    }
                    let item = pb::StreamEventsResponse {
                        event: Some(pb::Event::from(&event)),
                    };
                    if !send_or_drop(&tx, item, lag).await {
                        return;
                    }
                }
                if !caught_up {
                    continue;
                }
                if !r.follow {
                    return;
                }
                tokio::select! {
                    changed = watch.changed() => if changed.is_err() { return },
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("runner is shutting down; resume from your cursor"))).await;
                        return;
                    }
                    _ = tx.closed() => return,
                }
            }
        });
        ok(Box::pin(ReceiverStream::new(rx)))
    }

    async fn resolve(&self, req: Request<pb::ResolveRequest>) -> Res<pb::ResolveResponse> {
        let principal = principal_of(&req);
        principal.require(
            &[
                Role::Submitter,
                Role::Approver,
                Role::Operator,
                Role::Service,
            ],
            "resolve suspensions",
        )?;
        let trace = incoming_trace(req.metadata());
        let r = req.into_inner();
        let action = Verdict::from_wire(r.action, r.decision_kind, ("action", "decision_kind"))
            .map_err(RunnerError::from)?;
        let source = DecisionSource::from_wire_opt(r.source, "source")
            .map_err(RunnerError::from)?
            .unwrap_or_default();
        let decided_by = if principal.has(Role::Service) && !r.decided_by.is_empty() {
            r.decided_by.clone()
        } else {
            principal.name.clone()
        };
        let span = tracing::info_span!("resolve", run_id = %r.run_id, request_id = %r.request_id,
            trace_id = %trace.as_ref().map(|t| t.trace_id()).unwrap_or_default());
        let decision_id = r.decision_id.clone();
        let resolved = self
            .runner
            .resolve(ResolveInput {
                run_id: r.run_id,
                request_id: r.request_id,
                decision_id: r.decision_id,
                action,
                result: from_optional_value(r.result.as_ref()),
                reason: r.reason,
                decided_by,
                source,
                may_resolve_approvals: principal.has(Role::Service),
                answerer: access::Answerer::of(&principal),
                trace,
                args_digest: r.args_digest,
            })
            .instrument(span.clone())
            .await?;
        span.in_scope(|| {
            tracing::info!(
                decision_id,
                duplicate = resolved.duplicate,
                "decision accepted"
            )
        });
        ok(pb::ResolveResponse {
            duplicate: resolved.duplicate,
            run: Some(convert::run(&resolved.run)),
        })
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Res<pb::AckResponse> {
        // A durable cursor decides which events its subscriber will never be sent again: anyone
        // who could move approval-svc's cursor could make it skip approval requests. Only
        // service identities and operators move cursors.
        principal_of(&req).require(&[Role::Service, Role::Operator], "ack subscriber cursors")?;
        let r = req.into_inner();
        let acked_seq = self.runner.ack_cursor(&r.subscriber_id, r.seq).await?;
        ok(pb::AckResponse { acked_seq })
    }

    async fn list_jobs(&self, req: Request<pb::ListJobsRequest>) -> Res<pb::ListJobsResponse> {
        principal_of(&req).require(access::JOB_READERS, "list jobs")?;
        let r = req.into_inner();
        let filter = JobFilter {
            mailbox_id: r.thread_id,
            run_id: r.run_id,
            statuses: r
                .statuses
                .iter()
                .map(|s| JobStatus::from_wire(*s, "statuses"))
                .collect::<Result<_, _>>()
                .map_err(RunnerError::from)?,
        };
        let page = self.runner.list_jobs(&filter, r.page_size, &r.page_token)?;
        ok(pb::ListJobsResponse {
            jobs: page.jobs.iter().map(convert::job).collect(),
            next_page_token: page.next_page_token,
        })
    }

    async fn requeue_job(
        &self,
        req: Request<pb::RequeueJobRequest>,
    ) -> Res<pb::RequeueJobResponse> {
        principal_of(&req).require(&[Role::Operator], "requeue jobs")?;
        let job = self.runner.requeue_job(&req.get_ref().job_id).await?;
        ok(pb::RequeueJobResponse {
            job: Some(convert::job(&job)),
        })
    }
}

/// The trace a call's work continues: the call's own span while spans are exported (its parent
/// is the caller's `traceparent`), else the caller's `traceparent` as sent.
fn incoming_trace(metadata: &tonic::metadata::MetadataMap) -> Option<TraceContext> {
    TraceContext::of_span(&tracing::Span::current())
        .or_else(|| TraceContext::from_metadata(metadata))
}
