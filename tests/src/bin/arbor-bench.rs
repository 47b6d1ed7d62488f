//! `cargo run --release -p arbor-tests --bin arbor-bench -- [--cycles N] [--only cycle]`

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
    let cycles = value("--cycles")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let concurrency = value("--concurrency")
        .map(|v| v.split(',').filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 64]);
    let opts = bench::Options {
        cycles,
        concurrency,
        deciders: vec![Decider::Policy, Decider::Person],
    };
    let rows = bench::cycles(&opts).await;
    bench::print_cycle_table(&rows);
}
