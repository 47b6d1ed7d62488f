//! Arbor's end-to-end benchmark; see BENCHMARKS.md.
//!
//! `cargo run --release -p arbor-tests --bin arbor-bench -- [--cycles N] [--concurrency 1,64]
//!  [--store sled,postgres] [--runners 1,2] [--rounds N] [--parked N] [--fanout S]
//!  [--fanout-cycles N]
//!  [--appends N] [--append-concurrency K] [--task-latency N] [--tasks N] [--task-repeat M]
//!  [--otlp] [--inbox-pending N] [--inbox-samples N]
//!  [--only cycle,langgraph,parked,fanout,pg-append,tasks,inbox]`
//!
//! `--help` lists every flag with its default; an unknown flag or value is refused.
//!
//! - `--store` (cycle, tasks): the stores to run on, a list; default `sled`. `postgres`
//!   starts one private PostgreSQL server for the whole run (`fsync=on`) and gives every
//!   configuration a fresh database; each PostgreSQL configuration also prints the WAL the
//!   server wrote per cycle.
//! - `--runners` (cycle, pg-append): replicas of each service, a list; default `1` (pg-append:
//!   `1,2`). With 2, two runner-svc replicas share the database, each with an approval-svc
//!   pointed at it, and the benchmark's clients submit round-robin over them; their one event
//!   stream is open on replica 0, whatever R is. Sled × 2 is skipped (the embedded store
//!   belongs to one process).
//! - `--only pg-append` (not in the default set): the event log's append rate on PostgreSQL,
//!   `--appends` one-node runs (default 3000) from `--append-concurrency` clients (default 64).
//! - `--rounds` (cycle): how many times to measure every configuration, round after round
//!   (default 1). The table shows, for each configuration, its round of median cycles/s; each
//!   target ratio is taken within each round and the median over the rounds is judged, so
//!   that a machine whose speed drifts during the run moves both sides of a ratio alike (an
//!   odd N has a true median; of an even N's two middle values, the higher is taken).
//! - `--pg-stats` (cycle): the PostgreSQL server loads `pg_stat_statements`, and each
//!   PostgreSQL configuration prints the statements it ran per cycle, most frequent first, and
//!   each table's rows written per cycle.
//! - `--otlp` (cycle): each configuration runs a second time with both services exporting their
//!   spans over OTLP/gRPC to a collector inside the bench; a line says what that costs per
//!   cycle (throughput and CPU against the run without export) and how many spans a cycle makes.
//! - `--only inbox` (not in the default set; sled): the web inbox with `--inbox-pending` runs
//!   waiting at a gate (default 10000): the *for me* queue's first page, an item page and the
//!   run's events the item page loads after it, each fetched `--inbox-samples` times (default
//!   200), p50/p99; the time from a decision through
//!   the gRPC API to its event on the inbox's stream; the page weight.
//! - `--only tasks` (not in the default set; on every `--store`): task workers. `--task-latency`
//!   tasks one at a time through a Python worker (default 2000), `--tasks` tasks at 64 in flight
//!   through a Rust worker in the bench (default 20000), runs of `--task-repeat` tasks each
//!   (default 20), next to the policy cycle at K=64 (`--cycles` of them, unless the cycle section
//!   of the same invocation measured it).

use std::sync::Arc;

use arbor_tests::bench::{self, cluster::Store, cycle::Decider};
use clap::{Parser, ValueEnum};

/// Arbor's end-to-end benchmark: the full approval cycle on sled and PostgreSQL, against
/// LangGraph, with parked runs, event fan-out, the event log's append rate and task workers
/// (BENCHMARKS.md).
#[derive(Parser)]
#[command(name = "arbor-bench")]
struct Args {
    /// The sections to run.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values = ["cycle", "langgraph", "parked", "fanout"])]
    only: Vec<Section>,
    /// Approval cycles per configuration (cycle, langgraph, tasks).
    #[arg(long, default_value_t = 10_000)]
    cycles: usize,
    /// Cycles each configuration runs before the measured ones, not measured (cycle, tasks).
    #[arg(long, default_value_t = 256)]
    warmup: usize,
    /// Runs in flight (cycle, langgraph).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 64])]
    concurrency: Vec<usize>,
    /// Who decides (cycle): a policy rule, one person, or two of three people under an
    /// approval rule (`two-of-three`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "policy,person"
    )]
    deciders: Vec<DeciderName>,
    /// The stores to run on (cycle, tasks).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sled")]
    store: Vec<StoreName>,
    /// Replicas of each service (cycle; default 1 — pg-append; default 1,2).
    #[arg(long, value_delimiter = ',')]
    runners: Option<Vec<usize>>,
    /// Times to measure every configuration, round after round (cycle).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Print each PostgreSQL configuration's statements and rows written per cycle (cycle).
    #[arg(long)]
    pg_stats: bool,
    /// Run each configuration again with both services exporting traces over OTLP to a
    /// collector in the bench, and print what that costs per cycle (cycle).
    #[arg(long)]
    otlp: bool,
    /// Parked runs (parked).
    #[arg(long, default_value_t = 100_000)]
    parked: usize,
    /// Subscribers (fanout).
    #[arg(long, default_value_t = 100)]
    fanout: usize,
    /// Cycles (fanout).
    #[arg(long, default_value_t = 2_000)]
    fanout_cycles: usize,
    /// Cycles started per second (fanout).
    #[arg(long, default_value_t = 100)]
    fanout_rate: usize,
    /// One-node runs (pg-append).
    #[arg(long, default_value_t = 3_000)]
    appends: usize,
    /// Clients (pg-append).
    #[arg(long, default_value_t = 64)]
    append_concurrency: usize,
    /// Tasks one at a time through a Python worker (tasks).
    #[arg(long, default_value_t = 2_000)]
    task_latency: usize,
    /// Tasks at 64 in flight through a Rust worker (tasks).
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// Runs waiting at a gate (inbox).
    #[arg(long, default_value_t = 10_000)]
    inbox_pending: usize,
    /// Requests of each page, and decisions timed to their event (inbox).
    #[arg(long, default_value_t = 200)]
    inbox_samples: usize,
    /// Tasks per run (tasks).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    task_repeat: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Cycle,
    Langgraph,
    Parked,
    Fanout,
    PgAppend,
    Tasks,
    Inbox,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeciderName {
    Policy,
    Person,
    TwoOfThree,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreName {
    Sled,
    Postgres,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let wants = |s: Section| args.only.contains(&s);
    let cycles = args.cycles;
    let concurrency = args.concurrency.clone();
    let store_names = args.store.clone();
    // One PostgreSQL server for the whole run, started only when something needs it.
    let needs_pg = wants(Section::PgAppend)
        || ((wants(Section::Cycle) || wants(Section::Tasks))
            && store_names.contains(&StoreName::Postgres));
    let pg_stats = args.pg_stats;
    bench::PG_STATS.store(pg_stats, std::sync::atomic::Ordering::Relaxed);
    let pg = needs_pg.then(|| {
        eprintln!("starting PostgreSQL …");
        let settings: &[&str] = match pg_stats {
            true => &[
                "shared_preload_libraries=pg_stat_statements",
                "pg_stat_statements.track_planning=on",
            ],
            false => &[],
        };
        Arc::new(arbor_testkit::PgCluster::start_with(settings))
    });
    let stores: Vec<Store> = store_names
        .iter()
        .map(|s| match (s, &pg) {
            (StoreName::Postgres, Some(pg)) => Store::Postgres(pg.clone()),
            _ => Store::Sled,
        })
        .collect();

    bench::print_machine();
    let mut rows = Vec::new();
    if wants(Section::Cycle) {
        let opts = bench::Options {
            cycles,
            warmup: args.warmup,
            concurrency: concurrency.clone(),
            deciders: args
                .deciders
                .iter()
                .map(|d| match d {
                    DeciderName::Policy => Decider::Policy,
                    DeciderName::Person => Decider::Person,
                    DeciderName::TwoOfThree => Decider::TwoOfThree,
                })
                .collect(),
            stores: stores.clone(),
            replicas: args.runners.clone().unwrap_or_else(|| vec![1]),
            rounds: args.rounds as usize,
            otlp: args.otlp,
        };
        let (rounds, skipped) = bench::cycles(&opts).await;
        let ratios = bench::cycle_ratios(&rounds);
        let cost = bench::replica_cost(&rounds);
        rows = bench::median_rows(rounds);
        bench::print_cycle_table(&rows);
        for s in &skipped {
            println!("({s})");
        }
        if opts.rounds > 1 {
            println!(
                "(each configuration measured in {} rounds, one after another; each row is its \
                 round of median cycles/s)",
                opts.rounds
            );
        }
        if !ratios.is_empty() {
            println!("\nratios against the targets");
            for line in ratios {
                println!("{line}");
            }
        }
        if !cost.is_empty() {
            println!(
                "\nwhat a second replica of each service costs (not a target: cycles/s follows it \
                 where every core is busy)"
            );
            for line in cost {
                println!("{line}");
            }
        }
    }
    if wants(Section::Tasks) {
        let opts = bench::tasks::TaskOptions {
            latency_tasks: args.task_latency,
            throughput_tasks: args.tasks,
            repeat: args.task_repeat as usize,
            cycles,
            warmup: args.warmup,
        };
        let tasks = bench::tasks::run(&stores, &opts, &rows).await;
        bench::tasks::print(&tasks, opts.repeat);
    }
    if wants(Section::Langgraph) {
        let mut lg = Vec::new();
        for k in &concurrency {
            eprintln!("langgraph: K={k} N={cycles} …");
            match tokio::task::spawn_blocking({
                let k = *k;
                move || bench::langgraph::run(cycles, k)
            })
            .await
            {
                Ok(Ok(r)) => lg.push(r),
                Ok(Err(e)) => println!("\nLangGraph comparison not run: {e}"),
                Err(e) => println!("\nLangGraph comparison failed: {e}"),
            }
        }
        if !lg.is_empty() {
            bench::print_langgraph_table(&rows, &lg);
            for l in &lg {
                println!(
                    "  LangGraph K={}: p95 {:.1} ms, p99 {:.1} ms, resume p50 {:.1} ms, {:.0} bytes/run, ledger records {}",
                    l.concurrency,
                    l.total_p95_ms,
                    l.total_p99_ms,
                    l.resume_p50_ms,
                    l.bytes_per_run,
                    l.ledger_records
                );
            }
        }
    }
    if wants(Section::Parked) {
        let n = args.parked;
        eprintln!("parked: {n} runs …");
        bench::print_parked(&bench::parked::run(n).await);
    }
    if wants(Section::Inbox) {
        let (n, k) = (args.inbox_pending, args.inbox_samples);
        eprintln!("inbox: {n} pending, {k} samples …");
        bench::print_inbox(&bench::inbox::run(n, k).await);
    }
    if wants(Section::Fanout) {
        let (s, n, rate) = (args.fanout, args.fanout_cycles, args.fanout_rate);
        eprintln!("fan-out: {s} subscribers, {n} cycles at {rate}/s …");
        bench::print_fanout(&bench::fanout::run(s, n, rate).await);
    }
    if wants(Section::PgAppend)
        && let Some(pg) = &pg
    {
        let store = Store::Postgres(pg.clone());
        let (n, k) = (args.appends, args.append_concurrency);
        let mut appends = Vec::new();
        for r in args.runners.clone().unwrap_or_else(|| vec![1, 2]) {
            eprintln!("pg-append: R={r} K={k} N={n} …");
            let row = bench::pg_append::run(&store, r, n, k).await;
            eprintln!(
                "  {:.0} events/s, {:.0} txn/s, {} of {n} runs succeeded",
                row.events_per_s(),
                row.transactions_per_s(),
                row.succeeded
            );
            appends.push(row);
        }
        bench::pg_append::print(&appends);
    }
}
