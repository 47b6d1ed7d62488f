//! The task-worker section's tables: latency one task at a time, throughput at 64 in flight,
//! and the ratios against the approval cycle.

use super::*;

pub fn print(rows: &[TaskRow], repeat: usize) {
    println!(
        "\ntask workers, one task in flight (runs of repeat×{repeat} over one remote tool, one run \
         at a time; python = bench_worker.py on the arbor-client package's Worker, max_in_flight=1; \
         rust = the bench's own worker, max_in_flight=1)"
    );
    println!(
        "{:<8} {:<6} {:>6} {:>11} {:>7} {:>14} {:>7} {:>12} {:>7} {:>10} {:>9} {:>7}",
        "store",
        "worker",
        "tasks",
        "act→ack p50",
        "p99",
        "round trip p50",
        "p99",
        "ack→next p50",
        "p99",
        "queue wait",
        "mean/task",
        "refused"
    );
    for r in rows {
        for l in &r.latency {
            println!(
                "{:<8} {:<6} {:>6} {:>11.2} {:>7.2} {:>14.2} {:>7.2} {:>12.2} {:>7.2} {:>10.2} {:>9.2} {:>7}{}",
                r.store,
                l.worker,
                l.tasks,
                pct_ms(&l.act_ack, 0.5),
                pct_ms(&l.act_ack, 0.99),
                pct_ms(&l.round_trip, 0.5),
                pct_ms(&l.round_trip, 0.99),
                pct_ms(&l.ack_next, 0.5),
                pct_ms(&l.ack_next, 0.99),
                l.queue_wait_ms,
                l.mean.as_secs_f64() * 1e3,
                l.refused,
                if l.unfinished { "  UNFINISHED" } else { "" }
            );
        }
    }
    for r in rows {
        for l in r.latency.iter().filter(|l| !l.handoff.is_empty()) {
            println!(
                "         {} {}: activation → its handler, in the Worker: p50 {:.2} ms, p99 {:.2} ms",
                r.store,
                l.worker,
                pct_ms(&l.handoff, 0.5),
                pct_ms(&l.handoff, 0.99)
            );
        }
    }
    println!(
        "(ms, on the worker's clock. act→ack = activation received → CompleteTask OK: dispatch → \
         completion (the TASK_DISPATCHED commit precedes the send; the completion's commit \
         precedes the OK). round trip = activation → the next activation of the same run: \
         CompleteTask, the run resumes and queues its next task, the dispatch commit. ack→next = \
         the runner's share of it. queue wait = queued → dispatched, mean of the runner's \
         counters (ms resolution). mean/task = wall time / tasks, a new run every {repeat} tasks \
         included)"
    );
    println!(
        "\ntask workers, {IN_FLIGHT} in flight (the bench's Rust worker: one StreamTasks stream, \
         max_in_flight={IN_FLIGHT}, each activation completed at once; {RUNS_AT_ONCE} runs of \
         repeat×{repeat} kept going)"
    );
    println!(
        "{:<8} {:>7} {:>8} {:>11} {:>7} {:>6} {:>10} {:>8} {:>8} {:>8} {:>11} {:>10} {:>12} {:>7}",
        "store",
        "tasks",
        "tasks/s",
        "act→ack p50",
        "p99",
        "held",
        "queue wait",
        "run CPU",
        "appr CPU",
        "pg CPU",
        "CPU ms/task",
        "fsync/task",
        "policy cyc/s",
        "ratio"
    );
    for r in rows {
        let t = &r.throughput;
        let per_task = |f: u64| format!("{:.2}", f as f64 / t.tasks.max(1) as f64);
        println!(
            "{:<8} {:>7} {:>8.0} {:>11.2} {:>7.2} {:>6.1} {:>10.2} {:>7.1}s {:>7.1}s {:>8} {:>11.3} {:>10} {:>12.0} {:>6.2}×{}",
            r.store,
            t.tasks,
            t.tasks_per_s(),
            pct_ms(&t.act_ack, 0.5),
            pct_ms(&t.act_ack, 0.99),
            t.held(),
            t.queue_wait_ms,
            t.runner_cpu,
            t.approval_cpu,
            t.db_cpu.map_or_else(|| "-".into(), |c| format!("{c:.1}s")),
            t.cpu_ms_per_task(),
            t.fsyncs.map_or_else(|| "n/a".into(), per_task),
            r.policy_cycles_per_s,
            t.tasks_per_s() / r.policy_cycles_per_s,
            if t.unfinished { "  UNFINISHED" } else { "" }
        );
        let w = &t.whereabouts;
        println!(
            "         the {RUNS_AT_ONCE} runs on average: {:.1} tasks leased, {:.1} queued; {:.1} runs \
             waiting for a step, {:.1} being stepped; {} completions refused",
            w.tasks_leased, w.tasks_queued, w.steps_waiting, w.steps_running, t.refused
        );
    }
    println!(
        "(act→ack in ms, as above; held = tasks the worker held on average (rate × hold time); \
         fsync/task = flushes of both services per task (on PostgreSQL: committed batch \
         transactions); the runs' whereabouts are the runner's gauges scraped every 200 ms; policy cyc/s = the \
         policy-path approval cycle at K={IN_FLIGHT} on the same store in this run; ratio = \
         tasks/s ÷ policy cyc/s)"
    );
    print_ratios(rows);
}

/// The targets are set on sled; PostgreSQL's figures are held against them too, marked
/// as such, and divided by sled's.
fn print_ratios(rows: &[TaskRow]) {
    println!(
        "\nratios against the targets (task workers; Zeebe publishes p50 14 ms / p99 390 ms for job push activation)"
    );
    for r in rows {
        let verdict = |ok: bool| {
            let mark = if ok { "PASS" } else { "FAIL" };
            match r.store {
                "sled" => mark.to_string(),
                _ => format!("({mark}; the targets are set on sled)"),
            }
        };
        let Some(py) = r.latency.first() else {
            continue;
        };
        let (p50, p99) = (pct_ms(&py.act_ack, 0.5), pct_ms(&py.act_ack, 0.99));
        let (tps, cps) = (r.throughput.tasks_per_s(), r.policy_cycles_per_s);
        let x = tps / cps;
        let s = r.store;
        println!(
            "  {s:<8} python, one in flight: act→ack p50 {p50:.2} ms (target ≤ 3 ms) {}",
            verdict(p50 <= 3.0)
        );
        println!(
            "  {s:<8} python, one in flight: act→ack p99 {p99:.2} ms (target ≤ 15 ms) {}",
            verdict(p99 <= 15.0)
        );
        println!(
            "  {s:<8} tasks/s at {IN_FLIGHT} in flight ÷ policy cycles/s at K={IN_FLIGHT}: {tps:.0} / {cps:.0} = {x:.2}×  (target ≥ 2.00×) {}",
            verdict(x >= 2.0)
        );
    }
    let find = |s: &str| rows.iter().find(|r| r.store == s);
    if let (Some(pg), Some(sl)) = (find("postgres"), find("sled")) {
        let (a, b) = (pg.throughput.tasks_per_s(), sl.throughput.tasks_per_s());
        println!(
            "  postgres/sled tasks/s at {IN_FLIGHT} in flight: {a:.0} / {b:.0} = {:.2}×",
            a / b
        );
        for (i, l) in sl.latency.iter().enumerate() {
            let Some(p) = pg.latency.get(i) else { continue };
            for (what, pv, sv) in [
                ("act→ack", &p.act_ack, &l.act_ack),
                ("round trip", &p.round_trip, &l.round_trip),
            ] {
                let (a, b) = (pct_ms(pv, 0.5), pct_ms(sv, 0.5));
                println!(
                    "  postgres/sled {} {what} p50, one in flight: {a:.2} / {b:.2} ms = {:.2}×",
                    l.worker,
                    a / b
                );
            }
        }
    }
}
