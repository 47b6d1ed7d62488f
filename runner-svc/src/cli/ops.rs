//! Operators' views from the command line: `jobs`, `requeue` and `tasks` (the task workers'
//! queue, leases and dead letters).

use arbor_shared::proto::runner::v1::{self as pb, worker_service_client::WorkerServiceClient};
use clap::Args;

use super::{ClientArgs, connect, connect_channel, status_err};

// `runner-svc tasks`' flags (its help text is on `Command::Tasks`).
#[derive(Debug, Args)]
pub struct TasksArgs {
    /// Only tasks in this state (QUEUED, LEASED, COMPLETED, FAILED, ERRORED, CANCELLED,
    /// RESOLVED); may be repeated.
    #[arg(long)]
    pub state: Vec<String>,
    /// Only task types matching this glob.
    #[arg(long = "type")]
    pub task_type: Option<String>,
    /// Only tasks leased (last) by this worker.
    #[arg(long)]
    pub worker: Option<String>,
    #[arg(long)]
    pub run: Option<String>,
    /// Counts by state and type instead of one line per task.
    #[arg(long)]
    pub summary: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Lists mailbox jobs.
pub async fn jobs(
    thread: Option<String>,
    status: Option<String>,
    client: &ClientArgs,
) -> Result<(), String> {
    let statuses = match status {
        Some(s) => vec![
            pb::JobStatus::from_str_name(&format!("JOB_STATUS_{}", s.to_uppercase()))
                .ok_or_else(|| format!("unknown job status {s}"))? as i32,
        ],
        None => Vec::new(),
    };
    let resp = connect(client)
        .await?
        .list_jobs(pb::ListJobsRequest {
            thread_id: thread.unwrap_or_default(),
            statuses,
            page_size: 1000,
            ..Default::default()
        })
        .await
        .map_err(status_err)?
        .into_inner();
    println!(
        "{:<44} {:<12} {:<8} {:>8}  RUN",
        "JOB", "STATUS", "KIND", "ATTEMPTS"
    );
    for j in resp.jobs {
        println!(
            "{:<44} {:<12} {:<8} {:>8}  {}",
            j.job_id,
            pb::JobStatus::try_from(j.status)
                .map(|s| s
                    .as_str_name()
                    .trim_start_matches("JOB_STATUS_")
                    .to_string())
                .unwrap_or_default(),
            pb::JobKind::try_from(j.kind)
                .map(|s| s.as_str_name().trim_start_matches("JOB_KIND_").to_string())
                .unwrap_or_default(),
            format!("{}/{}", j.attempt_count, j.max_attempts),
            j.run_id
        );
    }
    Ok(())
}

/// Requeues a dead-lettered job.
pub async fn requeue(job_id: String, client: &ClientArgs) -> Result<(), String> {
    let job = connect(client)
        .await?
        .requeue_job(pb::RequeueJobRequest { job_id })
        .await
        .map_err(status_err)?
        .into_inner()
        .job
        .unwrap_or_default();
    println!("job {} requeued", job.job_id);
    Ok(())
}

/// Lists tasks of task workers, one line each or counted by type and state.
pub async fn tasks(args: TasksArgs) -> Result<(), String> {
    let states = args
        .state
        .iter()
        .map(|s| {
            pb::TaskState::from_str_name(&format!("TASK_STATE_{}", s.to_uppercase()))
                .map(|s| s as i32)
                .ok_or_else(|| format!("unknown task state {s}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tasks = fetch_tasks(&args, states).await?;
    match args.summary {
        true => print_task_summary(&tasks),
        false => print_tasks(tasks),
    }
    Ok(())
}

/// Every task the filters select, page after page.
async fn fetch_tasks(args: &TasksArgs, states: Vec<i32>) -> Result<Vec<pb::Task>, String> {
    let (channel, token) = connect_channel(&args.client).await?;
    let mut workers = WorkerServiceClient::with_interceptor(channel, token)
        .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES);
    let mut tasks = Vec::new();
    let mut page_token = String::new();
    loop {
        let resp = workers
            .list_tasks(pb::ListTasksRequest {
                states: states.clone(),
                task_type: args.task_type.clone().unwrap_or_default(),
                worker_id: args.worker.clone().unwrap_or_default(),
                run_id: args.run.clone().unwrap_or_default(),
                page_size: 1000,
                page_token,
            })
            .await
            .map_err(status_err)?
            .into_inner();
        tasks.extend(resp.tasks);
        if resp.next_page_token.is_empty() {
            return Ok(tasks);
        }
        page_token = resp.next_page_token;
    }
}

fn state_name(s: i32) -> String {
    pb::TaskState::try_from(s)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("TASK_STATE_")
                .to_string()
        })
        .unwrap_or_default()
}

fn print_task_summary(tasks: &[pb::Task]) {
    let mut counts: std::collections::BTreeMap<(String, String), usize> = Default::default();
    for t in tasks {
        *counts
            .entry((t.task_type.clone(), state_name(t.state)))
            .or_default() += 1;
    }
    println!("{:<32} {:<10} {:>8}", "TYPE", "STATE", "TASKS");
    for ((ty, st), n) in counts {
        println!("{ty:<32} {st:<10} {n:>8}");
    }
}

fn print_tasks(tasks: Vec<pb::Task>) {
    println!(
        "{:<42} {:<20} {:<10} {:>7}  {:<16} {:<24} RUN",
        "TASK", "TYPE", "STATE", "ATTEMPT", "WORKER", "LEASE ENDS"
    );
    for t in tasks {
        let until = t
            .lease_until
            .as_ref()
            .filter(|_| t.state == pb::TaskState::Leased as i32)
            .map(|ts| {
                let left = arbor_shared::time::from_timestamp(ts) as i64
                    - arbor_shared::time::now_ms() as i64;
                format!("in {:.1} s", left as f64 / 1000.0)
            })
            .unwrap_or_else(|| "-".into());
        let state = match (state_name(t.state), t.cancel_requested) {
            (s, true) if s == "LEASED" => "CANCELLING".to_string(),
            (s, _) => s,
        };
        println!(
            "{:<42} {:<20} {:<10} {:>7}  {:<16} {:<24} {}",
            t.task_id,
            t.task_type,
            state,
            format!("{}/{}", t.attempt, t.max_attempts),
            if t.worker_id.is_empty() {
                "-"
            } else {
                &t.worker_id
            },
            until,
            t.run_id
        );
        if !t.last_error.is_empty() {
            println!("    last error: {}", t.last_error);
        }
    }
}
