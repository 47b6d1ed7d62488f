//! `arbor-bench`: end-to-end performance of the system as it ships (release binaries,
//! durability and authentication on), side by side with LangGraph. See BENCHMARKS.md.

pub mod cluster;
pub mod cycle;
pub mod fanout;
pub mod langgraph;
pub mod parked;
pub mod procstat;

use std::time::Duration;

use cycle::{CycleResult, Decider};
use procstat::pct_ms;

/// What both services' `/metrics` say so far, from one scrape of each: fsyncs of both, and
/// approval-svc's decision latency histogram for `source` (sum of seconds, count).
#[derive(Debug, Clone, Copy, Default)]
pub struct Meters {
    pub fsyncs: Option<f64>,
    pub decided: Option<(f64, f64)>,
}

impl Meters {
    pub async fn read(cluster: &cluster::BenchCluster, source: &str) -> Self {
        let runner = crate::scrape::scrape(&cluster.runner.metrics_url()).await;
        let approval = crate::scrape::scrape(&cluster.approval.metrics_url()).await;
        let labels = [("source", source)];
        Self {
            fsyncs: runner
                .get("arbor_runner_fsyncs_total", &[])
                .zip(approval.get("arbor_approval_fsyncs_total", &[]))
                .map(|(r, a)| r + a),
            decided: approval
                .get("arbor_approval_decision_latency_seconds_sum", &labels)
                .zip(approval.get("arbor_approval_decision_latency_seconds_count", &labels)),
        }
    }

    /// fsyncs since `before`.
    pub fn fsyncs_since(&self, before: &Self) -> Option<u64> {
        let (a, b) = before.fsyncs.zip(self.fsyncs)?;
        Some((b - a).max(0.0) as u64)
    }

    /// Mean decision latency (ms) of the decisions taken since `before`.
    pub fn decide_ms_since(&self, before: &Self) -> Option<f64> {
        let ((s0, n0), (s1, n1)) = before.decided.zip(self.decided)?;
        (n1 > n0).then(|| (s1 - s0) / (n1 - n0) * 1e3)
    }
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
        if let Some(ms) = r.decide_ms {
            println!("        approval-svc: request arrival → decision, mean {ms:.2} ms");
        }
        if !r.stages[0].is_empty() {
            let q = |v: &[i64], p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
            let [a, b, c] = &r.stages;
            println!(
                "        suspended → resumed, p50 / p99 ms: runner → stored at approval-svc {} / {}, \
                 → decided {} / {}, → resumed {} / {}",
                q(a, 0.5),
                q(a, 0.99),
                q(b, 0.5),
                q(b, 0.99),
                q(c, 0.5),
                q(c, 0.99)
            );
        }
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

/// Arbor next to LangGraph for the same N and K, with the ratio.
pub fn print_langgraph_table(arbor: &[CycleResult], lg: &[langgraph::LangGraphResult]) {
    println!(
        "\nside by side (policy path for Arbor; LangGraph 1.x, SQLite checkpointer, durability=\"sync\", \
         in-process: no network, no second service, no auth)"
    );
    println!(
        "{:>3} {:>7} {:>14} {:>16} {:>8} {:>16} {:>18}",
        "K", "N", "Arbor cycles/s", "LangGraph cyc/s", "ratio", "Arbor p50 ms", "LangGraph p50 ms"
    );
    for l in lg {
        let Some(a) = arbor
            .iter()
            .find(|a| a.decider == Decider::Policy && a.concurrency == l.concurrency)
        else {
            continue;
        };
        println!(
            "{:>3} {:>7} {:>14.0} {:>16.1} {:>7.1}× {:>16.2} {:>18.2}",
            l.concurrency,
            l.cycles,
            a.cycles_per_s(),
            l.cycles_per_s,
            a.cycles_per_s() / l.cycles_per_s,
            pct_ms(&a.submit_to_done, 0.5),
            l.total_p50_ms,
        );
    }
}

pub fn print_parked(p: &parked::ParkedResult) {
    println!(
        "\nparked runs ({} runs suspended at a gate at once)",
        p.runs
    );
    println!(
        "  submitted and parked in         {:>8.1} s",
        p.park_elapsed.as_secs_f64()
    );
    println!(
        "  runner RSS while parked         {:>8.1} MiB",
        mib(p.runner_rss_parked)
    );
    println!(
        "  one /metrics scrape while parked {:>7.0} ms",
        p.metrics_scrape.as_secs_f64() * 1e3
    );
    println!(
        "  restart (SIGKILL) to SERVING    {:>8.2} s",
        p.restart_to_serving.as_secs_f64()
    );
    println!(
        "  runner RSS after the restart    {:>8.1} MiB",
        mib(p.runner_rss_after_restart)
    );
    println!(
        "  drain (BulkResolve → succeeded) {:>8.0} runs/s ({:.1} s)",
        p.drain_per_s(),
        p.drain_elapsed.as_secs_f64()
    );
    println!(
        "  runner data dir                 {:>8.1} MiB",
        mib(p.runner_bytes)
    );
}

pub fn print_fanout(f: &fanout::FanoutResult) {
    println!(
        "\nevent fan-out ({} live subscribers; {} policy cycles submitted at {}/s)",
        f.subscribers, f.cycles, f.rate
    );
    println!("  events delivered                {:>10}", f.delivered);
    println!(
        "  events/s delivered (all subs)   {:>10.0}",
        f.events_per_s()
    );
    println!(
        "  append → receipt p50 / p99 / max  {} / {} / {} ms (event timestamps have ms resolution)",
        f.pct_ms(0.5),
        f.pct_ms(0.99),
        f.latencies_ms.last().copied().unwrap_or(0)
    );
}

/// The machine, so a table can be read against it.
pub fn print_machine() {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0);
    println!(
        "machine: {cpus} CPUs ({model}), {:.0} GiB RAM",
        mem as f64 / 1048576.0
    );
    println!("build: release binaries, authentication on, every OK durable (group commit)");
}
