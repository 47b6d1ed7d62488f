//! Mailbox benchmark: the disk's raw serial fsync rate, then durable enqueue → claim → ack cycles
//! per second through the mailbox over the embedded store with group commit, for 1 and 8
//! concurrent producers. Every enqueue and every ack waits for the flush that covers it before
//! the next step,
//! exactly as an RPC answering OK would. The load is a closed loop: each producer lane keeps one job in
//! flight and enqueues the next only once the last one's ack is durable, so "in-flight" is the
//! number of jobs outstanding at any moment. Last, the floor under one run at a time: one
//! durable commit after another on the runner's store against a raw `pwrite` + `fdatasync` and
//! against redb (`floor`). Run: `cargo bench -p arbor-runner-svc --bench mailbox`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "mailbox/floor.rs"]
mod floor;

use std::{
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use arbor_runner_svc::{
    mailbox::{EnqueueRequest, Mailbox, MailboxConfig, SystemClock},
    store::{self, Store},
};
use arbor_shared::procstat::cpu_seconds;
use tokio::sync::Notify;

const RUN_FOR: Duration = Duration::from_secs(3);

/// The headline row runs this many more times, for its spread.
const HEADLINE_RUNS: usize = 5;

/// One small append + `fsync`, serially, for `window`: what a store that syncs every write
/// could do on this disk.
fn raw_fsync_rate(dir: &std::path::Path, window: Duration) -> f64 {
    let mut f = std::fs::File::create(dir.join("fsync.probe")).unwrap();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < window {
        f.write_all(&[0u8; 64]).unwrap();
        f.sync_all().unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Transactions the committer thread has run, and the commits they carried.
fn batch_stats(store: &Store) -> (u64, u64) {
    let stats = store.stats();
    (stats.batches, stats.bodies)
}

struct Outcome {
    cycles_per_s: f64,
    fsyncs_per_cycle: f64,
    commits_per_tx: f64,
    p50_ms: f64,
    p99_ms: f64,
    bytes_per_cycle: f64,
    cores_busy: f64,
}

/// Bytes the disk holding `dir` has written so far (sectors written, from its sysfs `stat`):
/// what reached the device, whoever wrote it. (`write_bytes` of /proc/self/io counts a whole
/// page range again for every sync of a page that is overwritten in place, so it overstates
/// what small appends cost by orders of magnitude.)
fn written_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).map(|m| m.dev()).unwrap_or(0);
    let (major, minor) = (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    );
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat"))
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(6)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |sectors| sectors * 512)
}

async fn cycles(workers: usize, producers: usize, window: usize) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let store = store::open(&store::OpenConfig {
        url: None,
        data_dir: dir.path().to_path_buf(),
        cache_bytes: 64 << 20,
        lock_wait: Duration::ZERO,
        wait_always: false,
    })
    .await
    .unwrap();
    let (mailbox, _) = Mailbox::open(
        store.clone(),
        Arc::new(SystemClock::default()),
        MailboxConfig::default(),
    )
    .unwrap();
    let mailbox = Arc::new(mailbox);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let work = Arc::new(Notify::new());
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let enqueued_at = Arc::new(dashmap_like::Map::default());

    let mut tasks = Vec::new();
    for w in 0..workers {
        let (mailbox, stop, acked, work, latencies, enqueued_at) = (
            mailbox.clone(),
            stop.clone(),
            acked.clone(),
            work.clone(),
            latencies.clone(),
            enqueued_at.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let me = format!("w{w}");
            while !stop.load(Ordering::Relaxed) {
                let notified = work.notified();
                match mailbox.claim_next(&me).await.unwrap().0 {
                    Some(claim) => {
                        mailbox
                            .ack_durable(&claim.job.job_id, &claim.token)
                            .await
                            .unwrap();
                        if let Some((t, done)) = enqueued_at.take(&claim.job.job_id) {
                            latencies.lock().unwrap().push(t.elapsed());
                            let _ = done.send(());
                        }
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        let _ = tokio::time::timeout(Duration::from_millis(5), notified).await;
                    }
                }
            }
        }));
    }
    let flushes_before = store.flush_count();
    let (tx_before, bodies_before) = batch_stats(&store);
    let written_before = written_bytes(dir.path());
    let cpu_before = cpu_seconds(std::process::id());
    let start = Instant::now();
    for p in 0..producers {
        for lane in 0..window {
            let (mailbox, stop, work, enqueued_at) = (
                mailbox.clone(),
                stop.clone(),
                work.clone(),
                enqueued_at.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let job_id = format!("p{p}-l{lane}-{i}");
                    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
                    enqueued_at.put(job_id.clone(), (Instant::now(), done_tx));
                    mailbox
                        .enqueue_durable(EnqueueRequest {
                            job_id,
                            mailbox_id: format!("thread-{p}-{lane}-{}", i % 4),
                            run_id: format!("run-{p}-{lane}-{i}"),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    work.notify_one();
                    // Closed loop: a lane has one job in flight and waits for its durable ack.
                    while !stop.load(Ordering::Relaxed)
                        && tokio::time::timeout(Duration::from_millis(50), &mut done_rx)
                            .await
                            .is_err()
                    {}
                    i += 1;
                }
            }));
        }
    }
    tokio::time::sleep(RUN_FOR).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let cpu = cpu_seconds(std::process::id()) - cpu_before;
    let done = acked.load(Ordering::Relaxed);
    let flushes = store.flush_count() - flushes_before;
    let (tx_after, bodies_after) = batch_stats(&store);
    let written = written_bytes(dir.path()) - written_before;
    for t in tasks {
        t.await.unwrap();
    }
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort();
    let pct = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    };
    Outcome {
        cycles_per_s: done as f64 / elapsed.as_secs_f64(),
        fsyncs_per_cycle: flushes as f64 / done.max(1) as f64,
        commits_per_tx: (bodies_after - bodies_before) as f64
            / (tx_after - tx_before).max(1) as f64,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        bytes_per_cycle: written as f64 / done.max(1) as f64,
        cores_busy: cpu / elapsed.as_secs_f64(),
    }
}

/// A tiny concurrent map: enqueue time and the lane's "acked" signal per job (keeps the bench
/// free of extra dependencies).
mod dashmap_like {
    use std::{collections::HashMap, sync::Mutex, time::Instant};

    type Entry = (Instant, tokio::sync::oneshot::Sender<()>);

    #[derive(Default)]
    pub struct Map(Mutex<HashMap<String, Entry>>);

    impl Map {
        pub fn put(&self, k: String, v: Entry) {
            self.0.lock().unwrap().insert(k, v);
        }
        pub fn take(&self, k: &str) -> Option<Entry> {
            self.0.lock().unwrap().remove(k)
        }
    }
}

/// One row of the table: the disk's raw fsync rate measured just before it (the rate drifts on a
/// shared machine, so each row is compared with the disk as it was then), and the row itself.
fn row(
    rt: &tokio::runtime::Runtime,
    probe: &std::path::Path,
    (workers, producers, window): (usize, usize, usize),
) -> f64 {
    let fsync = raw_fsync_rate(probe, Duration::from_secs(1));
    let o = rt.block_on(cycles(workers, producers, window));
    let ratio = o.cycles_per_s / fsync;
    println!(
        "{:>7} {:>9} {:>8} {:>10.0} {:>10.0} {:>9.2}× {:>13.2} {:>12.2} {:>9.2} {:>9.2} {:>9.1} {:>6.2} {:>8.0}",
        workers,
        producers,
        producers * window,
        fsync,
        o.cycles_per_s,
        ratio,
        o.fsyncs_per_cycle,
        o.commits_per_tx,
        o.p50_ms,
        o.p99_ms,
        o.bytes_per_cycle / 1024.0,
        o.cores_busy,
        o.cores_busy * 1e6 / o.cycles_per_s.max(1.0)
    );
    ratio
}

fn main() {
    use arbor_runner_svc::pool::DEFAULT_SIZE as DEFAULT_WORKERS;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    println!(
        "\nArbor mailbox benchmark ({} s per row; {DEFAULT_WORKERS} workers is the runner's default pool)\n",
        RUN_FOR.as_secs()
    );
    println!(
        "raw serial fsync rate of this disk (2 s): {:.0} fsyncs/s; each row measures it again for 1 s just before it\n",
        raw_fsync_rate(dir.path(), Duration::from_secs(2))
    );
    println!(
        "{:>7} {:>9} {:>8} {:>10} {:>10} {:>10} {:>13} {:>12} {:>9} {:>9} {:>9} {:>6} {:>8}",
        "workers",
        "producers",
        "in-flight",
        "fsyncs/s",
        "cycles/s",
        "× fsync/s",
        "fsyncs/cycle",
        "commits/tx",
        "p50 ms",
        "p99 ms",
        "KB/cycle",
        "cores",
        "µs/cycle"
    );
    // Each worker has at most one claim or ack in a batch, so the pool bounds how large a batch
    // gets: the 16-worker rows show what the smaller pool gives.
    let d = DEFAULT_WORKERS;
    let rows = [
        (d, 1, 1),
        (d, 1, 8),
        (d, 8, 1),
        (d, 8, 8),
        (d, 8, 32),
        (16, 8, 8),
        (16, 8, 32),
    ];
    // `ARBOR_MAILBOX_ROW=32,8,8` runs one row alone (workers, producers, lanes per producer),
    // for a profiler; `ARBOR_MAILBOX_ROW=floor` the floor alone.
    if std::env::var("ARBOR_MAILBOX_ROW").as_deref() == Ok("floor") {
        floor::print(&rt);
        return;
    }
    if let Ok(only) = std::env::var("ARBOR_MAILBOX_ROW") {
        let n: Vec<usize> = only
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        match n[..] {
            [w, p, l] if w > 0 && p > 0 && l > 0 => {
                row(&rt, dir.path(), (w, p, l));
            }
            _ => eprintln!(
                "ARBOR_MAILBOX_ROW wants workers,producers,lanes (three positive numbers)"
            ),
        }
        return;
    }
    for r in rows {
        row(&rt, dir.path(), r);
    }
    // The headline row again, to show its spread on this machine.
    println!("\nthe default pool with 8 producers × 64 in flight, {HEADLINE_RUNS} more runs:");
    let mut ratios: Vec<f64> = (0..HEADLINE_RUNS)
        .map(|_| row(&rt, dir.path(), (d, 8, 8)))
        .collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "\ntarget with 8 producers: max(5,000, 2 × raw fsync rate) durable cycles/s; \
         the default pool's 8 × 64 runs reached {:.2}× the raw fsync rate (median), {:.2}× to {:.2}×",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
    floor::print(&rt);
}
