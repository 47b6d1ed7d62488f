//! `arbor-bench`: end-to-end performance of the system as it ships (release binaries,
//! durability and authentication on), side by side with LangGraph. See BENCHMARKS.md.

pub mod cluster;
pub mod cycle;
pub mod fanout;
pub mod inbox;
pub mod langgraph;
mod meters;
pub mod otlp;
pub mod parked;
pub mod pg_append;
pub mod procstat;
mod report;
mod targets;
pub mod tasks;

use std::{sync::atomic::AtomicBool, time::Duration};

use cycle::{CycleResult, Decider};
pub use meters::Meters;
use procstat::pct_ms;
pub use report::{
    print_cycle_table, print_fanout, print_inbox, print_langgraph_table, print_machine,
    print_parked, print_statements, print_table_writes,
};
pub use targets::{cycle_ratios, median_rows, replica_cost};

/// Whether PostgreSQL configurations print the statements they ran (`--pg-stats`).
pub static PG_STATS: AtomicBool = AtomicBool::new(false);
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
