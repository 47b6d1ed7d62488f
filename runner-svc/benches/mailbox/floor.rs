//! The floor under one run at a time: what one durable commit costs, one after the other with
//! nothing to share a flush with, through the runner's store on sled (a transaction in the
//! batched commit, sled's flush and the `fdatasync` after it), through a raw `pwrite` +
//! `fdatasync` of the same bytes, and through redb, a published embedded store that commits on
//! the calling thread (used directly, as published). Each writes a 128-byte value under a new
//! key per commit.

use std::{
    os::unix::fs::FileExt,
    time::{Duration, Instant},
};

use arbor_runner_svc::store::{self, T};
use arbor_shared::procstat::cpu_seconds;

/// How long each way of committing runs.
const WINDOW: Duration = Duration::from_secs(3);

const VALUE: [u8; 128] = [7u8; 128];

struct Floor {
    commits_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
}

/// Runs `commit(n)` for commit n = 0, 1, … serially for [`WINDOW`].
fn measure(mut commit: impl FnMut(u64)) -> Floor {
    let mut took = Vec::new();
    let cpu_before = cpu_seconds(std::process::id());
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < WINDOW {
        let at = Instant::now();
        commit(n);
        took.push(at.elapsed());
        n += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(std::process::id()) - cpu_before;
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    Floor {
        commits_per_s: n as f64 / elapsed,
        p50_us: at(0.50),
        p99_us: at(0.99),
        cpu_us: cpu / n.max(1) as f64 * 1e6,
    }
}

fn sled_store(rt: &tokio::runtime::Runtime, dir: &std::path::Path) -> Floor {
    let store = rt
        .block_on(store::open(&store::OpenConfig {
            url: None,
            data_dir: dir.to_path_buf(),
            cache_bytes: 64 << 20,
            lock_wait: Duration::ZERO,
            wait_always: false,
        }))
        .unwrap();
    measure(|n| {
        rt.block_on(store.commit(move |tx| -> store::TxResult<(), String> {
            tx.tree(T::Dedupe)
                .insert(format!("floor/{n:016}"), VALUE)
                .map_err(Into::into)
        }))
        .map_err(|e| format!("{e:?}"))
        .unwrap();
    })
}

fn raw(dir: &std::path::Path) -> Floor {
    let f = std::fs::File::create(dir.join("floor.raw")).unwrap();
    measure(|n| {
        f.write_all_at(&VALUE, n * VALUE.len() as u64).unwrap();
        f.sync_data().unwrap();
    })
}

fn redb(dir: &std::path::Path) -> Floor {
    const TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("floor");
    let db = redb::Database::create(dir.join("floor.redb")).unwrap();
    measure(|n| {
        let tx = db.begin_write().unwrap();
        {
            let mut table = tx.open_table(TABLE).unwrap();
            table.insert(n, &VALUE[..]).unwrap();
        }
        tx.commit().unwrap();
    })
}

/// Prints the three, each on a fresh directory, with the raw fsync rate measured before them.
pub fn print(rt: &tokio::runtime::Runtime) {
    println!(
        "\nthe floor: one durable commit at a time ({} s each, a 128-byte value under a new key)",
        WINDOW.as_secs()
    );
    println!(
        "{:<44} {:>10} {:>9} {:>9} {:>11}",
        "", "commits/s", "p50 µs", "p99 µs", "CPU µs/commit"
    );
    type Way<'a> = &'a dyn Fn(&std::path::Path) -> Floor;
    let ways: [(&str, Way<'_>); 3] = [
        ("runner store on sled (batched commit, flush)", &|d| {
            sled_store(rt, d)
        }),
        ("raw pwrite + fdatasync", &raw),
        ("redb, commit on the calling thread", &redb),
    ];
    for (name, way) in ways {
        let dir = tempfile::tempdir().unwrap();
        let f = way(dir.path());
        println!(
            "{name:<44} {:>10.0} {:>9.0} {:>9.0} {:>11.0}",
            f.commits_per_s, f.p50_us, f.p99_us, f.cpu_us
        );
    }
}
