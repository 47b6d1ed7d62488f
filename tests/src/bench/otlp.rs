//! What exporting traces costs (`--otlp`): each cycle configuration is run again with both
//! services exporting over OTLP/gRPC to a collector inside the bench, and the difference per
//! cycle is reported next to the run without it.

use std::sync::{Mutex, PoisonError};

use super::{
    cluster::Store,
    cycle::{self, CycleResult, Decider},
};
use crate::otlp::Collector;

/// While set, the services of every bench cluster export their spans to this endpoint.
static ENDPOINT: Mutex<Option<String>> = Mutex::new(None);

/// `--otlp-endpoint` for a bench service while a run with export is on (else nothing).
pub fn args() -> Vec<String> {
    match &*ENDPOINT.lock().unwrap_or_else(PoisonError::into_inner) {
        Some(endpoint) => vec!["--otlp-endpoint".into(), endpoint.clone()],
        None => Vec::new(),
    }
}

/// Runs the configuration of `off` again with export on; the line that says what it cost.
pub async fn cost(
    store: &Store,
    decider: Decider,
    warmup: usize,
    off: &CycleResult,
) -> (CycleResult, String) {
    let collector = Collector::counting().await;
    *ENDPOINT.lock().unwrap_or_else(PoisonError::into_inner) = Some(collector.endpoint());
    let on = cycle::run(
        store,
        off.replicas,
        decider,
        off.cycles,
        warmup,
        off.concurrency,
    )
    .await;
    *ENDPOINT.lock().unwrap_or_else(PoisonError::into_inner) = None;
    // The services stopped cleanly at the end of the run, so every batch has arrived.
    let spans = collector.received() as f64 / (off.cycles + warmup).max(1) as f64;
    let line = format!(
        "OTLP on, {} R={} {} K={}: {:.0} cycles/s ({:+.1} % against off), {:.3} ms CPU per \
         cycle ({:+.3} ms), {:.1} spans exported per cycle, {} unfinished",
        store.label(),
        off.replicas,
        decider.label(),
        off.concurrency,
        on.cycles_per_s(),
        (on.cycles_per_s() / off.cycles_per_s() - 1.0) * 100.0,
        on.cpu_ms_per_cycle(),
        on.cpu_ms_per_cycle() - off.cpu_ms_per_cycle(),
        spans,
        on.unfinished,
    );
    (on, line)
}
