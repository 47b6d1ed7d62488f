//! Arbor's end-to-end benchmark; see BENCHMARKS.md.
//!
//! `cargo run --release -p arbor-tests --bin arbor-bench -- [--cycles N] [--concurrency 1,64]
//!  [--store sled,postgres] [--runners 1,2] [--rounds N] [--parked N] [--fanout S]
//!  [--fanout-cycles N]
//!  [--appends N] [--append-concurrency K] [--task-latency N] [--tasks N] [--task-repeat M]
//!  [--only cycle,langgraph,parked,fanout,pg-append,tasks]`
//!
//! - `--store` (cycle, tasks): the stores to run on, a list; default `sled`. `postgres`
//!   starts one private PostgreSQL server for the whole run (`fsync=on`) and gives every
//!   configuration a fresh database.
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
//!   PostgreSQL configuration prints the statements it ran per cycle, most frequent first.
//! - `--only tasks` (not in the default set; on every `--store`): task workers. `--task-latency`
//!   tasks one at a time through a Python worker (default 2000), `--tasks` tasks at 64 in flight
//!   through a Rust worker in the bench (default 20000), runs of `--task-repeat` tasks each
//!   (default 20), next to the policy cycle at K=64 (`--cycles` of them, unless the cycle section
//!   of the same invocation measured it).

use std::sync::Arc;

use arbor_tests::bench::{self, cluster::Store, cycle::Decider};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let number =
        |flag: &str, default: usize| value(flag).and_then(|v| v.parse().ok()).unwrap_or(default);
    let only: Vec<String> = value("--only")
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| {
            ["cycle", "langgraph", "parked", "fanout"]
                .map(String::from)
                .to_vec()
        });
    let wants = |s: &str| only.iter().any(|o| o == s);
    let cycles = number("--cycles", 10_000);
    let list = |flag: &str, default: &[usize]| -> Vec<usize> {
        value(flag)
            .map(|v| v.split(',').filter_map(|k| k.parse().ok()).collect())
            .unwrap_or_else(|| default.to_vec())
    };
    let concurrency = list("--concurrency", &[1, 64]);
    let store_names: Vec<String> = value("--store")
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| vec!["sled".into()]);
    if let Some(bad) = store_names
        .iter()
        .find(|s| !matches!(s.as_str(), "sled" | "postgres"))
    {
        eprintln!("--store: unknown store {bad:?} (sled, postgres)");
        std::process::exit(2);
    }
    // One PostgreSQL server for the whole run, started only when something needs it.
    let needs_pg = wants("pg-append")
        || ((wants("cycle") || wants("tasks")) && store_names.iter().any(|s| s == "postgres"));
    let pg_stats = args.iter().any(|a| a == "--pg-stats");
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
        .map(|s| match (s.as_str(), &pg) {
            ("postgres", Some(pg)) => Store::Postgres(pg.clone()),
            _ => Store::Sled,
        })
        .collect();

    bench::print_machine();
    let mut rows = Vec::new();
    if wants("cycle") {
        let opts = bench::Options {
            cycles,
            concurrency: concurrency.clone(),
            deciders: vec![Decider::Policy, Decider::Person],
            stores: stores.clone(),
            replicas: list("--runners", &[1]),
            rounds: number("--rounds", 1).max(1),
        };
        let (rounds, skipped) = bench::cycles(&opts).await;
        let ratios = bench::cycle_ratios(&rounds);
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
    }
    if wants("tasks") {
        let opts = bench::tasks::TaskOptions {
            latency_tasks: number("--task-latency", 2_000),
            throughput_tasks: number("--tasks", 20_000),
            repeat: number("--task-repeat", 20).max(1),
            cycles,
        };
        let tasks = bench::tasks::run(&stores, &opts, &rows).await;
        bench::tasks::print(&tasks, opts.repeat);
    }
    if wants("langgraph") {
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
    if wants("parked") {
        let n = number("--parked", 100_000);
        eprintln!("parked: {n} runs …");
        bench::print_parked(&bench::parked::run(n).await);
    }
    if wants("fanout") {
        let s = number("--fanout", 100);
        let n = number("--fanout-cycles", 2_000);
        let rate = number("--fanout-rate", 100);
        eprintln!("fan-out: {s} subscribers, {n} cycles at {rate}/s …");
        bench::print_fanout(&bench::fanout::run(s, n, rate).await);
    }
    if wants("pg-append")
        && let Some(pg) = &pg
    {
        let store = Store::Postgres(pg.clone());
        let (n, k) = (
            number("--appends", 3_000),
            number("--append-concurrency", 64),
        );
        let mut appends = Vec::new();
        for r in list("--runners", &[1, 2]) {
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
