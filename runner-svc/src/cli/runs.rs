//! A run's life from the command line: `submit`, `runs`, `get`, `events`, `resolve`, `cancel`,
//! `interrupt`, and how runs and events print.

use std::path::PathBuf;

use arbor_shared::{
    domain::{EventDetail, RunStatus},
    json::{from_proto_struct, to_proto_struct, to_proto_value},
    proto::runner::v1 as pb,
};
use clap::Args;

use super::{ClientArgs, connect, parse_json, status_err};

// `runner-svc resolve`'s flags (its help text is on `Command::Resolve`).
#[derive(Debug, Args)]
pub struct ResolveArgs {
    pub run_id: String,
    pub request_id: String,
    /// User input as text.
    #[arg(long, conflicts_with_all = ["value", "result"])]
    pub text: Option<String>,
    /// User input as a JSON value.
    #[arg(long, conflicts_with = "result")]
    pub value: Option<String>,
    /// Raw result JSON (external results: {"status": "succeeded", "result": ...}).
    #[arg(long)]
    pub result: Option<String>,
    /// Refuse instead of resume.
    #[arg(long)]
    pub cancel: bool,
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Registers a tree file and submits a run of it.
pub async fn submit(
    file: PathBuf,
    input: Option<String>,
    thread: Option<String>,
    priority: i32,
    client: &ClientArgs,
) -> Result<(), String> {
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let yaml = file.extension().is_some_and(|e| e == "yaml" || e == "yml");
    let mut c = connect(client).await?;
    let tree = c
        .register_tree(pb::RegisterTreeRequest {
            document: text,
            format: if yaml {
                pb::TreeFormat::Yaml
            } else {
                pb::TreeFormat::Json
            } as i32,
        })
        .await
        .map_err(status_err)?
        .into_inner()
        .tree
        .unwrap_or_default();
    let input = match input {
        Some(text) => match parse_json("--input", &text)? {
            serde_json::Value::Object(map) => Some(to_proto_struct(&map)),
            _ => return Err("--input must be a JSON object".into()),
        },
        None => None,
    };
    let resp = c
        .submit_run(pb::SubmitRunRequest {
            tree_id: tree.id.clone(),
            tree_version: tree.version,
            thread_id: thread.unwrap_or_default(),
            input,
            priority,
            ..Default::default()
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let run = resp.run.unwrap_or_default();
    println!("tree {} v{} registered", tree.id, tree.version);
    println!("run {} submitted (thread {})", run.run_id, run.thread_id);
    Ok(())
}

/// Lists runs, a page at a time.
pub async fn list(
    status: Option<String>,
    thread: Option<String>,
    client: &ClientArgs,
) -> Result<(), String> {
    let statuses = match status {
        Some(s) => vec![parse_run_status(&s)? as i32],
        None => Vec::new(),
    };
    let mut c = connect(client).await?;
    let mut token = String::new();
    println!(
        "{:<38} {:<11} {:<24} {:>5}  WAITING ON",
        "RUN", "STATUS", "TREE", "STEP"
    );
    loop {
        let page = c
            .list_runs(pb::ListRunsRequest {
                thread_id: thread.clone().unwrap_or_default(),
                statuses: statuses.clone(),
                page_size: 500,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .map_err(status_err)?
            .into_inner();
        for r in &page.runs {
            let status = pb::RunStatus::try_from(r.status)
                .map(|s| {
                    s.as_str_name()
                        .trim_start_matches("RUN_STATUS_")
                        .to_string()
                })
                .unwrap_or_default();
            let waiting: Vec<String> = r
                .suspensions
                .iter()
                .map(|s| format!("{} ({})", s.request_id, s.node_locator))
                .collect();
            println!(
                "{:<38} {:<11} {:<24} {:>5}  {}",
                r.run_id,
                status,
                format!("{}@{}", r.tree_id, r.tree_version),
                r.step,
                waiting.join(", ")
            );
        }
        if page.next_page_token.is_empty() {
            return Ok(());
        }
        token = page.next_page_token;
    }
}

/// Prints one run as JSON.
pub async fn get(run_id: String, client: &ClientArgs) -> Result<(), String> {
    let run = connect(client)
        .await?
        .get_run(pb::GetRunRequest { run_id })
        .await
        .map_err(status_err)?
        .into_inner()
        .run
        .unwrap_or_default();
    println!(
        "{}",
        serde_json::to_string_pretty(&run_json(&run)).unwrap_or_default()
    );
    Ok(())
}

/// Prints the event log; acks as it prints for a durable subscriber.
pub async fn events(
    follow: bool,
    after: Option<u64>,
    run: Option<String>,
    subscriber: Option<String>,
    client: &ClientArgs,
) -> Result<(), String> {
    let mut c = connect(client).await?;
    let mut stream = c
        .stream_events(pb::StreamEventsRequest {
            subscriber_id: subscriber.clone().unwrap_or_default(),
            after_seq: after,
            filter: Some(pb::EventFilter {
                run_id: run.unwrap_or_default(),
                ..Default::default()
            }),
            follow,
        })
        .await
        .map_err(status_err)?
        .into_inner();
    while let Some(item) = stream.message().await.map_err(status_err)? {
        let Some(event) = item.event else { continue };
        println!("{}", event_line(&event));
        if let Some(sub) = &subscriber {
            c.ack(pb::AckRequest {
                subscriber_id: sub.clone(),
                seq: event.seq,
            })
            .await
            .map_err(status_err)?;
        }
    }
    Ok(())
}

/// Answers a user-input or external suspension.
pub async fn resolve(args: ResolveArgs) -> Result<(), String> {
    let ResolveArgs {
        run_id,
        request_id,
        text,
        value,
        result,
        cancel,
        reason,
        client,
    } = args;
    let result = if let Some(t) = text {
        serde_json::json!({"text": t})
    } else if let Some(v) = value {
        serde_json::json!({"value": parse_json("--value", &v)?})
    } else if let Some(r) = result {
        parse_json("--result", &r)?
    } else {
        serde_json::Value::Null
    };
    let resp = connect(&client)
        .await?
        .resolve(pb::ResolveRequest {
            run_id,
            request_id,
            decision_id: uuid::Uuid::now_v7().to_string(),
            action: if cancel {
                pb::ResolveAction::Cancel
            } else {
                pb::ResolveAction::Resume
            } as i32,
            result: Some(to_proto_value(&result)),
            reason,
            ..Default::default()
        })
        .await
        .map_err(status_err)?
        .into_inner();
    println!(
        "decision accepted{}",
        if resp.duplicate { " (duplicate)" } else { "" }
    );
    Ok(())
}

/// Cancels a run.
pub async fn cancel(run_id: String, reason: String, client: &ClientArgs) -> Result<(), String> {
    let run = connect(client)
        .await?
        .cancel_run(pb::CancelRunRequest { run_id, reason })
        .await
        .map_err(status_err)?
        .into_inner()
        .run
        .unwrap_or_default();
    println!("run {} is {}", run.run_id, status_name(run.status));
    Ok(())
}

/// Interrupts a thread.
pub async fn interrupt(
    thread_id: String,
    reason: String,
    client: &ClientArgs,
) -> Result<(), String> {
    let resp = connect(client)
        .await?
        .interrupt_thread(pb::InterruptThreadRequest {
            thread_id,
            reason,
            next: None,
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let i = resp.interrupt.unwrap_or_default();
    println!(
        "generation {}; superseded {} queued job(s); running job: {}",
        i.new_generation,
        i.superseded_count,
        i.active_job
            .map(|j| j.job_id)
            .unwrap_or_else(|| "none".into())
    );
    Ok(())
}

fn parse_run_status(s: &str) -> Result<pb::RunStatus, String> {
    pb::RunStatus::from_str_name(&format!("RUN_STATUS_{}", s.to_uppercase()))
        .ok_or_else(|| format!("unknown run status {s}"))
}

fn status_name(status: i32) -> &'static str {
    match RunStatus::from_wire(status, "status") {
        Ok(s) => s.as_str(),
        Err(_) => "UNKNOWN",
    }
}

fn run_json(r: &pb::Run) -> serde_json::Value {
    serde_json::json!({
        "run_id": r.run_id,
        "thread_id": r.thread_id,
        "tree": format!("{}@{}", r.tree_id, r.tree_version),
        "status": status_name(r.status),
        "error": r.error,
        "step": r.step,
        "submitted_by": r.submitted_by,
        "blackboard": r.blackboard.as_ref().map(from_proto_struct).unwrap_or_default(),
        "waiting_on": r.suspensions.iter().map(|s| serde_json::json!({
            "request_id": s.request_id,
            "node": s.node_locator,
            "category": pb::SuspensionCategory::try_from(s.category).map(|c| c.as_str_name()).unwrap_or(""),
            "message": s.message,
            "payload": arbor_shared::json::from_optional_value(s.payload.as_ref()),
        })).collect::<Vec<_>>(),
    })
}

fn event_line(e: &pb::Event) -> String {
    let kind = pb::EventKind::try_from(e.kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("EVENT_KIND_")
                .to_string()
        })
        .unwrap_or_default();
    let detail = match arbor_shared::domain::Event::try_from(e) {
        Ok(ev) => match ev.detail {
            EventDetail::ApprovalRequested(r) => {
                format!("request={} title={:?}", r.request_id, r.title)
            }
            EventDetail::ExecutionSuspended {
                request_id,
                category,
                ..
            } => format!("request={request_id} category={category:?}"),
            EventDetail::ApprovalResolved {
                request_id,
                action,
                decided_by,
                args_digest,
                ..
            } if !args_digest.is_empty() => {
                format!("request={request_id} action={action:?} by={decided_by} args={args_digest}")
            }
            EventDetail::ApprovalResolved {
                request_id,
                action,
                decided_by,
                ..
            }
            | EventDetail::ApprovalResolvedUnbound {
                request_id,
                action,
                decided_by,
                ..
            } => format!("request={request_id} action={action:?} by={decided_by}"),
            EventDetail::ApprovalConsumed { request_id, .. } => format!("request={request_id}"),
            EventDetail::RunFinished { error, .. } if !error.is_empty() => {
                format!("error={error:?}")
            }
            EventDetail::SuspensionWithdrawn { request_id, reason } => {
                format!("request={request_id} reason={reason:?}")
            }
            EventDetail::TaskDispatched { task, .. }
            | EventDetail::TaskCompleted { task }
            | EventDetail::TaskReleased { task, .. } => {
                format!(
                    "task={} type={} attempt={} worker={}",
                    task.task_id, task.task_type, task.attempt, task.worker_id
                )
            }
            EventDetail::TaskFailed {
                task,
                error,
                cause,
                will_retry,
                ..
            } => format!(
                "task={} type={} attempt={} worker={} cause={} retry={will_retry} error={error:?}",
                task.task_id,
                task.task_type,
                task.attempt,
                task.worker_id,
                cause.as_str()
            ),
            _ => String::new(),
        },
        Err(_) => String::new(),
    };
    format!("{:>6} {:<22} run={} {}", e.seq, kind, e.run_id, detail)
}
