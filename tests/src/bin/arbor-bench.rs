//! Arbor's end-to-end benchmark; see BENCHMARKS.md.
//!
//! `cargo run --release -p arbor-tests --bin arbor-bench -- [--cycles N] [--concurrency 1,64]
//!  [--parked N] [--fanout S] [--fanout-cycles N] [--only cycle,langgraph,parked,fanout]`

use arbor_tests::bench::{self, cycle::Decider};

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
    let concurrency: Vec<usize> = value("--concurrency")
        .map(|v| v.split(',').filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 64]);

    bench::print_machine();
    let mut rows = Vec::new();
    if wants("cycle") {
        let opts = bench::Options {
            cycles,
            concurrency: concurrency.clone(),
            deciders: vec![Decider::Policy, Decider::Person],
        };
        rows = bench::cycles(&opts).await;
        bench::print_cycle_table(&rows);
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
}
