//! `arbor-bench`: end-to-end performance of the system as it ships (release binaries,
//! durability and authentication on), side by side with LangGraph. See BENCHMARKS.md.

pub mod cluster;
pub mod cycle;
pub mod procstat;

use std::time::Duration;

use cycle::{CycleResult, Decider};
use procstat::pct_ms;

/// fsyncs issued by both services so far, from their `/metrics`.
pub async fn fsyncs(cluster: &cluster::BenchCluster) -> Option<u64> {
    let runner = crate::scrape::scrape(&cluster.runner.metrics_url()).await;
    let approval = crate::scrape::scrape(&cluster.approval.metrics_url()).await;
    let r = runner.get("arbor_runner_fsyncs_total", &[])?;
    let a = approval.get("arbor_approval_fsyncs_total", &[])?;
    Some((r + a) as u64)
}

/// Options of one benchmark invocation.
#[derive(Debug, Clone)]
pub struct Options {
    pub cycles: usize,
    pub concurrency: Vec<usize>,
    pub deciders: Vec<Decider>,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub fn print_cycle_table(rows: &[CycleResult]) {
    println!(
        "\n{:<7} {:>3} {:>7} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8}",
        "decider",
        "K",
        "cycles",
        "cycles/s",
        "s→d p50",
        "p95",
        "p99",
        "sus→res50",
        "p99",
        "run CPU",
        "appr CPU",
        "run RSS",
        "appr RSS",
        "B/run",
        "fsync/c"
    );
    for r in rows {
        let per_run = (r.runner_bytes + r.approval_bytes) as f64 / r.cycles.max(1) as f64;
        println!(
            "{:<7} {:>3} {:>7} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>9.2} {:>7.1}s {:>7.1}s {:>6.0}Mi {:>7.0}Mi {:>9.0} {:>8}",
            r.decider.label(),
            r.concurrency,
            r.cycles,
            r.cycles_per_s(),
            pct_ms(&r.submit_to_done, 0.50),
            pct_ms(&r.submit_to_done, 0.95),
            pct_ms(&r.submit_to_done, 0.99),
            pct_ms(&r.suspend_to_resume, 0.50),
            pct_ms(&r.suspend_to_resume, 0.99),
            r.runner_cpu,
            r.approval_cpu,
            mib(r.runner_peak_rss),
            mib(r.approval_peak_rss),
            per_run,
            r.fsyncs
                .map(|f| format!("{:.2}", f as f64 / r.cycles.max(1) as f64))
                .unwrap_or_else(|| "n/a".into()),
        );
        if r.failed > 0 {
            println!("        ({} runs FAILED)", r.failed);
        }
    }
    println!(
        "(latencies in ms; s→d = SubmitRun → RUN_SUCCEEDED seen by the client; sus→res = EXECUTION_SUSPENDED → EXECUTION_RESUMED as streamed)"
    );
}

pub async fn cycles(opts: &Options) -> Vec<CycleResult> {
    let mut rows = Vec::new();
    for decider in &opts.deciders {
        for k in &opts.concurrency {
            eprintln!("cycle: {} K={k} N={} …", decider.label(), opts.cycles);
            rows.push(cycle::run(*decider, opts.cycles, *k).await);
        }
    }
    rows
}

/// A short pause so the machine settles between sections.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}
