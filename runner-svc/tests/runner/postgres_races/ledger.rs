//! The ledger's sequence on one database shared by two runner replicas: appends from both at
//! once, with one replica reopened in between, get distinct `seq`s, each higher than those of
//! the appends that had returned when it began, and an append again under a key answers the
//! first receipt. `round` and `check` serve the same test on the embedded store (`ledger_seq`).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use arbor_runner_svc::engine::{LedgerTool, Tool, ToolCall};
use serde_json::{Value as Json, json};

use super::common;

/// Appender threads per replica, and appends each makes per round.
const THREADS: usize = 3;
const APPENDS: usize = 8;

/// One append as the test saw it.
pub struct Seen {
    seq: u64,
    /// Appends that had returned when it was called.
    returned_before: usize,
    /// Its place among the appends that returned (from 1).
    returned_as: usize,
}

pub fn call(key: &str) -> ToolCall {
    ToolCall {
        tool: "ledger.append".into(),
        args: json!({"entry": {"key": key}}),
        run_id: "ledger-race".into(),
        tool_call_id: key.into(),
        idempotency_key: format!("ledger-race:{key}"),
    }
}

/// Every replica's threads append at once; answers what each append saw.
pub fn round(replicas: &[LedgerTool], round: usize, returned: &Arc<AtomicUsize>) -> Vec<Seen> {
    let threads: Vec<_> = replicas
        .iter()
        .enumerate()
        .flat_map(|(r, ledger)| (0..THREADS).map(move |t| (r, t, ledger.clone())))
        .map(|(r, t, ledger)| {
            let returned = returned.clone();
            std::thread::spawn(move || {
                (0..APPENDS)
                    .map(|i| {
                        let returned_before = returned.load(Ordering::SeqCst);
                        let receipt = ledger.call(&call(&format!("{round}-{r}-{t}-{i}"))).unwrap();
                        Seen {
                            seq: receipt["seq"].as_u64().unwrap(),
                            returned_before,
                            returned_as: returned.fetch_add(1, Ordering::SeqCst) + 1,
                        }
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

#[test]
fn appends_from_two_replicas_get_distinct_seqs_in_the_order_they_began_across_a_reopen() {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("ledger_seq");
    let open = || LedgerTool::new(common::open_postgres(&url)).unwrap();
    let returned = Arc::new(AtomicUsize::new(0));
    let there = open();
    let mut seen = round(&[open(), there.clone()], 0, &returned);
    // One replica restarts: a new process on the same database, the other still running.
    seen.extend(round(&[open(), there.clone()], 1, &returned));

    check(&seen);

    // The same key again, on either replica: the first receipt, nothing written.
    let stored: Vec<(String, Json)> = there.entries();
    let again = open().call(&call("0-0-0-0")).unwrap();
    let first = stored
        .iter()
        .find(|(k, _)| k == "ledger-race:0-0-0-0")
        .map(|(_, v)| v.clone());
    assert_eq!(Some(again), first);
    assert_eq!(there.entries(), stored);
}

/// Every append has a `seq` of its own, and one called after another returned has a higher one.
pub fn check(seen: &[Seen]) {
    let mut seqs: Vec<u64> = seen.iter().map(|s| s.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), seen.len(), "every receipt has a seq of its own");
    // An append called after another returned took its number after it: a higher one.
    let mut by_return: Vec<&Seen> = seen.iter().collect();
    by_return.sort_by_key(|s| s.returned_as);
    let highest_so_far: Vec<u64> = by_return
        .iter()
        .scan(0, |high, s| {
            *high = s.seq.max(*high);
            Some(*high)
        })
        .collect();
    for s in seen {
        if let Some(before) = s.returned_before.checked_sub(1) {
            assert!(
                s.seq > highest_so_far[before],
                "seq {} was given after seq {} had returned",
                s.seq,
                highest_so_far[before]
            );
        }
    }
}
