//! What the rounds of the cycle section add up to: the ratios the PostgreSQL targets are
//! stated in, what a second replica costs, and the median row of each configuration.

use super::{
    cycle::{CycleResult, Decider},
    procstat::pct_ms,
};

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
#[cfg(test)]
mod tests {
    use std::time::Duration;

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
