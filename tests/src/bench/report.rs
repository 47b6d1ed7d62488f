//! The tables `arbor-bench` prints: one per section, and the machine they were measured on.

use super::{
    cluster,
    cycle::{self, CycleResult, Decider},
    fanout, inbox, langgraph, parked,
    procstat::pct_ms,
};

/// Each table's row writes per cycle (see [`cluster::Db::table_writes`]).
pub fn print_table_writes(cycles: usize, tables: &[(String, [f64; 4])]) {
    let per = |v: f64| v / cycles.max(1) as f64;
    println!("  rows per cycle (inserted, updated, of which HOT, deleted), by table:");
    for (name, [ins, upd, hot, del]) in tables {
        println!(
            "  {:>7.2} {:>7.2} {:>7.2} {:>7.2}  {name}",
            per(*ins),
            per(*upd),
            per(*hot),
            per(*del)
        );
    }
}

/// The statements of one configuration per cycle, most frequent first, with their total.
pub fn print_statements(name: &str, cycles: usize, statements: &[cluster::Statement]) {
    let per = |v: f64| v / cycles.max(1) as f64;
    let total: f64 = statements.iter().map(|s| s.calls).sum();
    println!(
        "\nstatements of {name}: {:.1} per cycle, planned {:.1} times per cycle \
         (calls/cycle, rows/call, buffers/call, mean ms, plans/call, text)",
        per(total),
        per(statements.iter().map(|s| s.plans).sum())
    );
    for s in statements.iter().take(30) {
        let text: String = s.text.chars().take(140).collect();
        println!(
            "  {:>7.2} {:>7.2} {:>8.1} {:>7.3} {:>5.2}  {text}",
            per(s.calls),
            s.rows / s.calls.max(1.0),
            s.buffers / s.calls.max(1.0),
            s.mean_ms,
            s.plans / s.calls.max(1.0),
        );
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub fn print_cycle_table(rows: &[CycleResult]) {
    println!(
        "\n{:<8} {:>1} {:<7} {:>3} {:>7} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8}",
        "store",
        "R",
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
        "pg CPU",
        "CPU ms/c",
        "run RSS",
        "appr RSS",
        "B/run",
        "fsync/c"
    );
    for r in rows {
        let per_run = (r.runner_bytes + r.approval_bytes) as f64 / r.cycles.max(1) as f64;
        println!(
            "{:<8} {:>1} {:<7} {:>3} {:>7} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>9.2} {:>7.1}s {:>7.1}s {:>8} {:>8.2} {:>6.0}Mi {:>6.0}Mi {:>9.0} {:>8}",
            r.store,
            r.replicas,
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
            r.db_cpu
                .map(|c| format!("{c:.1}s"))
                .unwrap_or_else(|| "-".into()),
            r.cpu_ms_per_cycle(),
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
        if let Some(bytes) = r.wal_bytes {
            let cycles = r.cycles.max(1) as f64;
            let per = bytes / cycles / 1024.0;
            let conflicts = r
                .conflicts
                .map(|c| {
                    format!(
                        ", runner transactions run again after a conflict: {:.3} per cycle",
                        c as f64 / cycles
                    )
                })
                .unwrap_or_default();
            println!("        PostgreSQL: {per:.1} KB of WAL per cycle{conflicts}");
        }
        if let Some(n) = r.streamed_from_store {
            println!(
                "        events the runners' streams read from the store (not from memory): {:.2} per cycle",
                n as f64 / r.cycles.max(1) as f64
            );
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
        if r.unfinished > 0 {
            println!(
                "        ({} runs UNFINISHED: no end seen within {} s each)",
                r.unfinished,
                cycle::RUN_PATIENCE.as_secs()
            );
        }
    }
    println!(
        "(R = replicas of each service; latencies in ms; s→d = SubmitRun → RUN_SUCCEEDED seen on the client's \
         one stream (open on replica 0); sus→res = EXECUTION_SUSPENDED → EXECUTION_RESUMED as streamed; CPU summed over \
         replicas; CPU ms/c = runner + approval + PostgreSQL server per cycle; B/run on PostgreSQL = growth of \
         the database; fsync/c on PostgreSQL = committed batch transactions of the services per cycle)"
    );
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
        let Some(a) = arbor.iter().find(|a| {
            a.store == "sled"
                && a.replicas == 1
                && a.decider == Decider::Policy
                && a.concurrency == l.concurrency
        }) else {
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

pub fn print_inbox(r: &inbox::InboxResult) {
    use inbox::pct_ms;
    println!(
        "\nweb inbox ({} pending approvals; {} requests of each page, one at a time, on loopback)",
        r.pending, r.samples
    );
    println!(
        "  for me, first page   p50 / p99   {:>7.1} / {:>7.1} ms",
        pct_ms(&r.queue, 0.5),
        pct_ms(&r.queue, 0.99)
    );
    println!(
        "  item page            p50 / p99   {:>7.1} / {:>7.1} ms",
        pct_ms(&r.item, 0.5),
        pct_ms(&r.item, 0.99)
    );
    println!(
        "  run events (after)   p50 / p99   {:>7.1} / {:>7.1} ms",
        pct_ms(&r.timeline, 0.5),
        pct_ms(&r.timeline, 0.99)
    );
    println!(
        "  decision → SSE event p50 / p99   {:>7.1} / {:>7.1} ms ({} decisions through gRPC)",
        pct_ms(&r.decision_to_event, 0.5),
        pct_ms(&r.decision_to_event, 0.99),
        r.decision_to_event.len()
    );
    let (html, css, js) = r.page_bytes;
    println!(
        "  page weight          {:>7.1} KB (HTML {html} B + CSS {css} B + JS {js} B; target < 150 KB)",
        (html + css + js) as f64 / 1024.0
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
