//! `arbor-bench`: end-to-end performance of the system as it ships (release binaries,
//! durability and authentication on), side by side with LangGraph. See BENCHMARKS.md.

pub mod cluster;
pub mod cycle;
pub mod fanout;
pub mod inbox;
pub mod langgraph;
pub mod otlp;
pub mod parked;
pub mod pg_append;
pub mod procstat;
pub mod tasks;

use std::{sync::atomic::AtomicBool, time::Duration};

use cycle::{CycleResult, Decider};
use procstat::pct_ms;

/// What both services' `/metrics` say so far, from one scrape of each replica: fsyncs of both,
/// the runners' transactions run again after a conflict, the events their streams read from
/// the store, and approval-svc's decision latency histogram for `source` (sum of seconds,
/// count).
#[derive(Debug, Clone, Copy, Default)]
pub struct Meters {
    pub fsyncs: Option<f64>,
    pub conflicts: Option<f64>,
    pub streamed_from_store: Option<f64>,
    pub decided: Option<(f64, f64)>,
}

impl Meters {
    /// Summed over every replica: each counts its own flushes, and the leader of approval-svc
    /// takes the policy decisions (a follower's histogram stays empty).
    pub async fn read(cluster: &cluster::BenchCluster, source: &str) -> Self {
        let labels = [("source", source)];
        let (mut fsyncs, mut conflicts, mut streamed_from_store) =
            (Some(0.0), Some(0.0), Some(0.0));
        let mut decided = None::<(f64, f64)>;
        for r in &cluster.runners {
            let runner = crate::scrape::scrape(&r.metrics_url()).await;
            fsyncs = fsyncs
                .zip(runner.get("arbor_runner_fsyncs_total", &[]))
                .map(|(a, b)| a + b);
            conflicts = conflicts
                .zip(runner.get("arbor_runner_store_conflicts_total", &[]))
                .map(|(a, b)| a + b);
            let from_store = [("from", "store")];
            streamed_from_store = streamed_from_store
                .zip(runner.get("arbor_runner_stream_events_read_total", &from_store))
                .map(|(a, b)| a + b);
        }
        for a in &cluster.approvals {
            let approval = crate::scrape::scrape(&a.metrics_url()).await;
            fsyncs = fsyncs
                .zip(approval.get("arbor_approval_fsyncs_total", &[]))
                .map(|(a, b)| a + b);
            if let Some((s, n)) = approval
                .get("arbor_approval_decision_latency_seconds_sum", &labels)
                .zip(approval.get("arbor_approval_decision_latency_seconds_count", &labels))
            {
                let (s0, n0) = decided.unwrap_or_default();
                decided = Some((s0 + s, n0 + n));
            }
        }
        Self {
            fsyncs,
            conflicts,
            streamed_from_store,
            decided,
        }
    }

    /// fsyncs since `before`.
    pub fn fsyncs_since(&self, before: &Self) -> Option<u64> {
        counted_since(before.fsyncs, self.fsyncs)
    }

    /// The runners' conflicts since `before`.
    pub fn conflicts_since(&self, before: &Self) -> Option<u64> {
        counted_since(before.conflicts, self.conflicts)
    }

    /// Events the runners' streams read from the store since `before`.
    pub fn streamed_from_store_since(&self, before: &Self) -> Option<u64> {
        counted_since(before.streamed_from_store, self.streamed_from_store)
    }

    /// Mean decision latency (ms) of the decisions taken since `before`.
    pub fn decide_ms_since(&self, before: &Self) -> Option<f64> {
        let ((s0, n0), (s1, n1)) = before.decided.zip(self.decided)?;
        (n1 > n0).then(|| (s1 - s0) / (n1 - n0) * 1e3)
    }
}

/// How far a counter moved from `then` to `now`, when both were read.
fn counted_since(then: Option<f64>, now: Option<f64>) -> Option<u64> {
    let (a, b) = then.zip(now)?;
    Some((b - a).max(0.0) as u64)
}

/// Whether PostgreSQL configurations print the statements they ran (`--pg-stats`).
pub static PG_STATS: AtomicBool = AtomicBool::new(false);

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

/// Options of one benchmark invocation.
#[derive(Debug, Clone)]
pub struct Options {
    pub cycles: usize,
    /// Cycles each configuration runs, at its concurrency, before the measured ones.
    pub warmup: usize,
    pub concurrency: Vec<usize>,
    pub deciders: Vec<Decider>,
    pub stores: Vec<cluster::Store>,
    /// Replicas of each service (more than one only on a shared store).
    pub replicas: Vec<usize>,
    /// Times every configuration is measured, round after round.
    pub rounds: usize,
    /// Run each configuration again exporting traces over OTLP, and say what that cost.
    pub otlp: bool,
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

/// The row of one configuration (store, replicas, decider, K), if it ran.
fn config<'a>(
    rows: &'a [CycleResult],
    store: &str,
    replicas: usize,
    d: Decider,
    k: usize,
) -> Option<&'a CycleResult> {
    rows.iter().find(|r| {
        r.store == store && r.replicas == replicas && r.decider == d && r.concurrency == k
    })
}

/// The ratios the PostgreSQL targets are stated in, one line each. Each ratio is taken within
/// one round (its two configurations measured minutes apart, not a whole run apart, as this
/// machine's speed drifts); with several rounds, the line gives the median over the rounds,
/// with the lowest and highest, and judges the median.
pub fn cycle_ratios(rounds: &[Vec<CycleResult>]) -> Vec<String> {
    let (Some(lo), Some(hi)) = (
        rounds.iter().flatten().map(|r| r.concurrency).min(),
        rounds.iter().flatten().map(|r| r.concurrency).max(),
    ) else {
        return Vec::new();
    };
    let find = |rows: &'_ [CycleResult], store: &str, replicas: usize, d: Decider, k: usize| {
        config(rows, store, replicas, d, k)
            .map(|r| (r.cycles_per_s(), pct_ms(&r.submit_to_done, 0.5)))
    };
    let mark = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let mut lines = Vec::new();
    for d in [Decider::Policy, Decider::Person] {
        let label = d.label();
        let (pg1, pg2, sled) = (("postgres", 1), ("postgres", 2), ("sled", 1));
        // (what, the configuration (store, replicas) over the one it is compared to, K, the
        // figure compared, the target)
        let targets = [
            (
                format!("postgres/sled cycles/s at K={hi}"),
                pg1,
                sled,
                hi,
                Figure::CyclesPerS,
                0.5,
            ),
            (
                format!("postgres/sled p50 at K={lo}"),
                pg1,
                sled,
                lo,
                Figure::P50,
                3.0,
            ),
            (
                format!("postgres 2 runners/1 runner cycles/s at K={hi}"),
                pg2,
                pg1,
                hi,
                Figure::CyclesPerS,
                1.0,
            ),
        ];
        for (what, (a_store, a_r), (b_store, b_r), k, figure, target) in targets {
            let pairs: Vec<(f64, f64)> = rounds
                .iter()
                .filter_map(|rows| {
                    let a = find(rows, a_store, a_r, d, k)?;
                    let b = find(rows, b_store, b_r, d, k)?;
                    Some((figure.of(a), figure.of(b)))
                })
                .collect();
            let mut ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
            if ratios.is_empty() {
                continue;
            }
            ratios.sort_by(f64::total_cmp);
            let x = ratios[ratios.len() / 2];
            let (met, sign, digits, unit) = match figure {
                Figure::CyclesPerS => (x >= target, "≥", 0, ""),
                Figure::P50 => (x <= target, "≤", 2, " ms"),
            };
            let figures = match pairs.as_slice() {
                [(a, b)] => format!("{a:.digits$} / {b:.digits$}{unit} = "),
                _ => format!("median of {} rounds ", ratios.len()),
            };
            let range = match ratios.as_slice() {
                [first, .., last] => format!(" ({first:.2}×–{last:.2}×)"),
                _ => String::new(),
            };
            lines.push(format!(
                "  {label:<7} {what}: {figures}{x:.2}×{range}  (target {sign} {target:.2}×) {}",
                mark(met)
            ));
        }
    }
    lines
}

/// What a second replica of each service costs, per decider at the highest K: the CPU per
/// cycle of two replicas over one on PostgreSQL, in all and for each process kind, the median
/// over the rounds. Not a target but what the replica target depends on: where the processes
/// share the machine's cores and keep them busy, cycles/s is those cores over the CPU per
/// cycle, so two replicas keep up with one only as far as they cost no more CPU per cycle.
pub fn replica_cost(rounds: &[Vec<CycleResult>]) -> Vec<String> {
    let Some(k) = rounds.iter().flatten().map(|r| r.concurrency).max() else {
        return Vec::new();
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let mut lines = Vec::new();
    for d in [Decider::Policy, Decider::Person] {
        // A configuration's CPU per cycle: (all, runner, approval, PostgreSQL).
        let per_cycle = |rows: &[CycleResult], replicas: usize| {
            let r = config(rows, "postgres", replicas, d, k)?;
            let n = r.cycles.max(1) as f64;
            Some([
                r.cpu_ms_per_cycle(),
                r.runner_cpu / n,
                r.approval_cpu / n,
                r.db_cpu.unwrap_or(0.0) / n,
            ])
        };
        // Per round: each of them, two replicas over one.
        let per_round: Vec<[f64; 4]> = rounds
            .iter()
            .filter_map(|rows| {
                let (two, one) = (per_cycle(rows, 2)?, per_cycle(rows, 1)?);
                Some([0, 1, 2, 3].map(|i| two[i] / one[i]))
            })
            .collect();
        let column = |i: usize| median(per_round.iter().map(|r| r[i]).collect());
        let (Some(all), Some(runner), Some(approval), Some(db)) =
            (column(0), column(1), column(2), column(3))
        else {
            continue;
        };
        lines.push(format!(
            "  {:<7} postgres 2 runners/1 runner CPU per cycle at K={k}: {all:.2}× \
             (runner-svc {runner:.2}×, approval-svc {approval:.2}×, PostgreSQL {db:.2}×; \
             median of {} round{})",
            d.label(),
            per_round.len(),
            if per_round.len() == 1 { "" } else { "s" }
        ));
    }
    lines
}

/// The figure a target compares: cycles/s must reach it, the p50 latency stay under it.
#[derive(Clone, Copy)]
enum Figure {
    CyclesPerS,
    P50,
}

impl Figure {
    /// This figure of (cycles/s, p50 ms).
    fn of(self, (cycles_per_s, p50): (f64, f64)) -> f64 {
        match self {
            Figure::CyclesPerS => cycles_per_s,
            Figure::P50 => p50,
        }
    }
}

/// One row per configuration: of its rounds, the one with the median cycles/s.
pub fn median_rows(rounds: Vec<Vec<CycleResult>>) -> Vec<CycleResult> {
    let mut by_config: Vec<Vec<CycleResult>> = Vec::new();
    for round in rounds {
        for (i, row) in round.into_iter().enumerate() {
            match by_config.get_mut(i) {
                Some(rows) => rows.push(row),
                None => by_config.push(vec![row]),
            }
        }
    }
    by_config
        .into_iter()
        .filter_map(|mut rows| {
            rows.sort_by(|a, b| a.cycles_per_s().total_cmp(&b.cycles_per_s()));
            let middle = rows.len() / 2;
            rows.into_iter().nth(middle)
        })
        .collect()
}

/// Every (store, replicas, decider, K) of `opts`, one fresh cluster (and, on PostgreSQL, one
/// fresh database) each. Returns the rows and the combinations skipped, with why.
pub async fn cycles(opts: &Options) -> (Vec<Vec<CycleResult>>, Vec<String>) {
    let mut rounds = Vec::new();
    let mut skipped = Vec::new();
    for round in 1..=opts.rounds.max(1) {
        // Every round skips the same combinations: they are said once.
        let said = if round == 1 { Some(&mut skipped) } else { None };
        rounds.push(cycles_round(opts, round, said).await);
    }
    (rounds, skipped)
}

/// One round of [`cycles`]: every configuration once, in a fixed order.
async fn cycles_round(
    opts: &Options,
    round: usize,
    mut skipped: Option<&mut Vec<String>>,
) -> Vec<CycleResult> {
    let mut rows = Vec::new();
    for store in &opts.stores {
        for &replicas in &opts.replicas {
            if replicas > 1 && !store.shared() {
                if let Some(skipped) = skipped.as_deref_mut() {
                    skipped.push(format!(
                        "{} × {replicas} runners skipped: the embedded store belongs to one \
                         process",
                        store.label()
                    ));
                }
                continue;
            }
            for decider in &opts.deciders {
                for k in &opts.concurrency {
                    eprintln!(
                        "cycle: {} R={replicas} {} K={k} N={} (round {round} of {}) …",
                        store.label(),
                        decider.label(),
                        opts.cycles,
                        opts.rounds.max(1)
                    );
                    let row =
                        cycle::run(store, replicas, *decider, opts.cycles, opts.warmup, *k).await;
                    // Each row as it comes, so a run cut short still says what it measured.
                    eprintln!(
                        "  {:.0} cycles/s, p50 {:.2} ms, p99 {:.2} ms, {} unfinished",
                        row.cycles_per_s(),
                        pct_ms(&row.submit_to_done, 0.5),
                        pct_ms(&row.submit_to_done, 0.99),
                        row.unfinished
                    );
                    if opts.otlp {
                        let (_, line) = otlp::cost(store, *decider, opts.warmup, &row).await;
                        println!("{line}");
                    }
                    rows.push(row);
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(replicas: usize, decider: Decider, cpu: [f64; 3]) -> CycleResult {
        CycleResult {
            store: "postgres",
            replicas,
            decider,
            concurrency: 64,
            cycles: 1000,
            elapsed: Duration::from_secs(2),
            submit_to_done: vec![Duration::from_millis(100)],
            suspend_to_resume: Vec::new(),
            runner_cpu: cpu[0],
            approval_cpu: cpu[1],
            db_cpu: Some(cpu[2]),
            runner_peak_rss: 0,
            approval_peak_rss: 0,
            runner_bytes: 0,
            approval_bytes: 0,
            failed: 0,
            unfinished: 0,
            fsyncs: None,
            conflicts: None,
            streamed_from_store: None,
            wal_bytes: None,
            stages: Default::default(),
            decide_ms: None,
        }
    }

    #[test]
    fn replica_cost_is_the_median_cpu_per_cycle_of_two_replicas_over_one() {
        // Three rounds; the person decider's second replica costs 10 %, 40 % and 20 % more in
        // all (runner-svc 2.0 → 2.4, 3.6, 2.8 s), approval-svc and PostgreSQL nothing.
        let round = |extra: f64| {
            vec![
                row(1, Decider::Policy, [2.0, 1.0, 1.0]),
                row(1, Decider::Person, [2.0, 1.0, 1.0]),
                row(2, Decider::Policy, [2.0, 1.0, 1.0]),
                row(2, Decider::Person, [2.0 + 4.0 * extra, 1.0, 1.0]),
            ]
        };
        let lines = replica_cost(&[round(0.1), round(0.4), round(0.2)]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("  policy  "), "{}", lines[0]);
        assert!(
            lines[0].contains(": 1.00× (runner-svc 1.00×"),
            "{}",
            lines[0]
        );
        assert!(lines[1].starts_with("  person  "), "{}", lines[1]);
        assert!(
            lines[1].contains(
                ": 1.20× (runner-svc 1.40×, approval-svc 1.00×, PostgreSQL 1.00×; median of 3 rounds)"
            ),
            "{}",
            lines[1]
        );
        // Without a configuration of two replicas there is nothing to say.
        assert!(replica_cost(&[vec![row(1, Decider::Policy, [1.0; 3])]]).is_empty());
    }
}
