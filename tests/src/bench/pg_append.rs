//! The event log's serialised append rate on PostgreSQL: every transaction that appends events
//! reads and writes the log's counter row, so that row bounds how many such transactions commit
//! per second, whatever the number of replicas. K clients submit N runs of a one-node tree
//! (each submit appends its run's first events in one transaction; each run's execution appends
//! the rest) round-robin over the runner replicas, until every run has succeeded.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use arbor_shared::proto::runner::v1 as rpb;

use super::{
    cluster::{BenchCluster, SUBMITTER, Spec, Store},
    procstat::{self, pct_ms},
};

const TREE: &str = r#"{"id": "bench-append", "version": 1,
  "root": {"type": "set", "name": "mark", "key": "mark", "value": true}}"#;

/// How long the runs may take to finish after the last submit; past it the row is marked.
const PATIENCE: Duration = Duration::from_secs(60);

pub struct AppendResult {
    pub replicas: usize,
    pub concurrency: usize,
    pub runs: usize,
    /// Runs that succeeded before the deadline.
    pub succeeded: usize,
    /// First submit → last submit answered.
    pub submit_elapsed: Duration,
    /// First submit → every run succeeded.
    pub elapsed: Duration,
    pub submit_latency: Vec<Duration>,
    /// Events appended (the log's last seq moved by this much).
    pub events: u64,
    /// Batch transactions the runner replicas committed (their `arbor_runner_fsyncs_total`).
    pub transactions: u64,
    /// Transactions PostgreSQL committed in the database (read-only ones too).
    pub db_transactions: f64,
    pub runner_cpu: f64,
    pub db_cpu: f64,
}

impl AppendResult {
    pub fn events_per_s(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }

    pub fn transactions_per_s(&self) -> f64 {
        self.transactions as f64 / self.elapsed.as_secs_f64()
    }

    pub fn submits_per_s(&self) -> f64 {
        self.runs as f64 / self.submit_elapsed.as_secs_f64()
    }
}

struct Log {
    last_seq: f64,
    flushes: f64,
    succeeded: f64,
}

/// The log's last seq (the highest any replica has seen durable), the runners' commits summed,
/// and the runs succeeded (a count in the database: any replica answers the same).
async fn read(cluster: &BenchCluster) -> Log {
    let mut log = Log {
        last_seq: 0.0,
        flushes: 0.0,
        succeeded: 0.0,
    };
    for r in &cluster.runners {
        let s = crate::scrape::scrape(&r.metrics_url()).await;
        log.last_seq = log
            .last_seq
            .max(s.value("arbor_runner_event_last_seq", &[]));
        log.flushes += s.value("arbor_runner_fsyncs_total", &[]);
        log.succeeded = log
            .succeeded
            .max(s.value("arbor_runner_runs", &[("status", "succeeded")]));
    }
    log
}

pub async fn run(store: &Store, replicas: usize, runs: usize, concurrency: usize) -> AppendResult {
    let name = format!("append_r{replicas}_k{concurrency}");
    let cluster = BenchCluster::start_spec(&Spec {
        store,
        replicas,
        approval: false,
        rules: super::cluster::Rules::Ask,
        runner_args: &[],
        approval_args: &[],
        name: &name,
    })
    .await;
    let db = cluster.db.as_ref().expect("pg-append runs on PostgreSQL");
    let mut clients = Vec::new();
    for i in 0..replicas {
        clients.push(cluster.runner_at(i, SUBMITTER).await);
    }
    clients[0]
        .clone()
        .register_tree(rpb::RegisterTreeRequest {
            document: TREE.into(),
            format: 0,
        })
        .await
        .expect("register the append tree");

    let pids = cluster.runner_pids();
    let cpu = || pids.iter().map(|p| procstat::cpu_seconds(*p)).sum::<f64>();
    let before = read(&cluster).await;
    let (cpu0, db_cpu0, xact0) = (cpu(), db.server_cpu(), db.xact_commits());
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut submitters = Vec::new();
    for i in 0..concurrency {
        let (mut client, next) = (clients[i % replicas].clone(), next.clone());
        submitters.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                let t0 = Instant::now();
                client
                    .submit_run(rpb::SubmitRunRequest {
                        tree_id: "bench-append".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("submit");
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut submit_latency = Vec::new();
    for s in submitters {
        submit_latency.extend(s.await.expect("submitter"));
    }
    let submit_elapsed = start.elapsed();
    let deadline = Instant::now() + PATIENCE;
    let after = loop {
        let log = read(&cluster).await;
        if log.succeeded - before.succeeded >= runs as f64 || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elapsed = start.elapsed();
    let runner_cpu = cpu() - cpu0;
    let db_cpu = db.server_cpu() - db_cpu0;
    // The statistics of the last transactions reach pg_stat_database within a second or so.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let db_transactions = db.xact_commits() - xact0;
    submit_latency.sort();
    let result = AppendResult {
        replicas,
        concurrency,
        runs,
        succeeded: (after.succeeded - before.succeeded).max(0.0) as usize,
        submit_elapsed,
        elapsed,
        submit_latency,
        events: (after.last_seq - before.last_seq).max(0.0) as u64,
        transactions: (after.flushes - before.flushes).max(0.0) as u64,
        db_transactions,
        runner_cpu,
        db_cpu,
    };
    cluster.stop().await;
    result
}

pub fn print(rows: &[AppendResult]) {
    println!(
        "\nevent-log appends on PostgreSQL (K clients submit N one-node runs, round-robin over R runner \
         replicas; until every run succeeded)"
    );
    println!(
        "{:>1} {:>3} {:>6} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8}",
        "R",
        "K",
        "runs",
        "submits/s",
        "sub p50",
        "sub p99",
        "events",
        "events/s",
        "txn/s",
        "ev/txn",
        "pg xact/s",
        "run CPU",
        "pg CPU"
    );
    for r in rows {
        println!(
            "{:>1} {:>3} {:>6} {:>9.0} {:>8.2} {:>8.2} {:>8} {:>9.0} {:>8.0} {:>8.2} {:>9.0} {:>7.1}s {:>7.1}s",
            r.replicas,
            r.concurrency,
            r.runs,
            r.submits_per_s(),
            pct_ms(&r.submit_latency, 0.5),
            pct_ms(&r.submit_latency, 0.99),
            r.events,
            r.events_per_s(),
            r.transactions_per_s(),
            r.events as f64 / r.transactions.max(1) as f64,
            r.db_transactions / r.elapsed.as_secs_f64(),
            r.runner_cpu,
            r.db_cpu,
        );
        if r.succeeded < r.runs {
            println!(
                "  (only {} of {} runs succeeded within {} s of the last submit)",
                r.succeeded,
                r.runs,
                PATIENCE.as_secs()
            );
        }
    }
    println!(
        "(sub = SubmitRun latency, ms; txn/s = batch transactions the runners committed (each appends \
         for every body it ran); pg xact/s = every transaction PostgreSQL committed in the database, \
         read-only ones included)"
    );
}
