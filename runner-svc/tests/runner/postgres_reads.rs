//! On PostgreSQL, a batch of durable commits reads the rows its bodies named when they were
//! queued (`Store::commit_reading`) with one statement, before its first body runs, instead of
//! one round trip per body while the batch holds the event log's writer lock; an interrupt
//! names every row it reads, however many runs its thread has; a worker's look at the queue
//! reads the rows of the threads it looks at, however many jobs are running; streams on one
//! replica read another replica's events from the store once between them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use arbor_runner_svc::store::{Abort, T};
use arbor_testkit::PgCluster;

/// A cluster of its own that counts its statements (a reset would clear another test's
/// counts), and a fresh database `name` in it.
fn counting_cluster(name: &str) -> (PgCluster, String) {
    let cluster = PgCluster::start_with(&["shared_preload_libraries=pg_stat_statements"]);
    let url = cluster.fresh_database(name);
    cluster
        .psql(&url, "CREATE EXTENSION pg_stat_statements")
        .unwrap();
    (cluster, url)
}

/// The sum of `column` of this database's statements (as `pg_stat_statements` counts them
/// since the last reset) that match `which`.
fn statements_sum(cluster: &PgCluster, url: &str, column: &str, which: &str) -> u64 {
    let sum = cluster
        .psql(
            url,
            &format!(
                "SELECT coalesce(sum({column}), 0) FROM pg_stat_statements \
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND ({which})"
            ),
        )
        .unwrap();
    sum.trim().parse().unwrap()
}

/// Calls of the store's row reads (of several keys, and of one) since the last reset.
fn row_reads(cluster: &PgCluster, url: &str) -> u64 {
    statements_sum(
        cluster,
        url,
        "calls",
        "query LIKE 'SELECT u.i, r.v FROM unnest%' \
         OR query LIKE 'SELECT v FROM runner_kv WHERE t = $1 AND k = $2%'",
    )
}

/// Rows the store's reads (`SELECT`s of the runner's table) returned since the last reset.
fn rows_read(cluster: &PgCluster, url: &str) -> u64 {
    statements_sum(cluster, url, "rows", "query LIKE 'SELECT%runner_kv%'")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_reads_the_rows_its_bodies_named_in_one_statement() {
    const BODIES: usize = 24;
    let (cluster, url) = counting_cluster("batch_reads");
    let store = common::open_postgres(&url);
    store
        .transact(|t| {
            for i in 0..BODIES {
                t.tree(T::Runs).insert(format!("run-{i}"), b"record")?;
            }
            Ok::<_, Abort<()>>(())
        })
        .unwrap();
    cluster
        .psql(&url, "SELECT pg_stat_statements_reset()")
        .unwrap();

    // A commit that holds the durable lane, while BODIES commits queue behind it; each reads
    // its run and its checkpoint, and writes the checkpoint.
    let before = store.stats();
    let queued = common::with_lane_held(&store, async {
        let each = (0..BODIES).map(|i| {
            let run = format!("run-{i}").into_bytes();
            let reads = vec![(T::Runs, run.clone()), (T::Checkpoints, run.clone())];
            store.commit_reading(reads, move |t| {
                let seen = (
                    t.tree(T::Runs).get(&run)?,
                    t.tree(T::Checkpoints).get(&run)?,
                );
                if seen != (Some(b"record".to_vec()), None) {
                    return Err(Abort::Domain(format!("read {seen:?}")));
                }
                t.tree(T::Checkpoints).insert(&run, b"checkpoint")?;
                Ok(())
            })
        });
        futures_util::future::join_all(each).await
    })
    .await;
    for done in queued {
        done.unwrap();
    }

    let stats = store.stats();
    assert_eq!(
        (stats.batches - before.batches, stats.bodies - before.bodies),
        (2, 1 + BODIES as u64),
        "the commits queued behind the held lane did not share a transaction"
    );
    assert_eq!(
        row_reads(&cluster, &url),
        1,
        "{BODIES} bodies that named their rows took more than one read"
    );
    for i in 0..BODIES {
        let run = format!("run-{i}");
        assert_eq!(
            store.tree(T::Checkpoints).get(&run).unwrap().as_deref(),
            Some(&b"checkpoint"[..])
        );
    }
}

/// An interrupt reads the thread's jobs in one statement before it commits, and the rows its
/// commit changes (the thread's generation and claimed job, each queued job, each run with its
/// checkpoint, trace context and cancel key) with its batch's first statement: not one round
/// trip per job and per run, most of them while its batch holds the event log's writer lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_reads_its_thread_s_rows_in_one_statement() {
    const RUNS: usize = 20;
    let (cluster, url) = counting_cluster("interrupt_reads");
    let dir = tempfile::tempdir().unwrap();
    let runner = arbor_runner_svc::open_runner(&arbor_runner_svc::ServeConfig {
        data_dir: dir.path().to_path_buf(),
        store_url: Some(url.clone()),
        ..arbor_runner_svc::ServeConfig::default()
    })
    .await
    .unwrap();
    runner
        .register_tree(
            r#"{"id": "quick", "version": 1, "root": {"type": "set", "name": "s", "key": "x", "value": 1}}"#,
            arbor_runner_svc::engine::TreeFormat::Json,
        )
        .await
        .unwrap();
    for _ in 0..RUNS {
        runner
            .submit(arbor_runner_svc::runs::SubmitInput {
                tree_id: "quick".into(),
                thread_id: "chat".into(),
                submitted_by: "alice".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    cluster
        .psql(&url, "SELECT pg_stat_statements_reset()")
        .unwrap();
    let before = row_reads(&cluster, &url);

    let (intr, _) = runner.interrupt("chat", "new message", None).await.unwrap();
    assert_eq!(intr.superseded_count, RUNS as u32);
    let reads = row_reads(&cluster, &url) - before;
    // Two: the look at the thread's jobs, and the batch's first read. A few more may be the
    // runner's own looks (about one a second) falling in the window; one read per job or per
    // run would be over 40.
    assert!(
        reads <= 6,
        "an interrupt of {RUNS} queued runs took {reads} row reads"
    );
}

/// A worker's look at the queue reads the claimed-job rows of the threads of the jobs it looks
/// at, not every thread's: with 200 jobs running, claiming the one queued job reads a handful of
/// rows, as it does with none running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_at_the_queue_reads_only_the_threads_it_looks_at() {
    use arbor_runner_svc::mailbox::{
        EnqueueRequest, Mailbox, MailboxConfig, MailboxStore, SystemClock,
    };
    const RUNNING: usize = 200;
    let (cluster, url) = counting_cluster("look_reads");
    let (mailbox, _) = Mailbox::open(
        common::open_postgres(&url),
        std::sync::Arc::new(SystemClock::default()),
        MailboxConfig::default(),
    )
    .unwrap();
    let enqueue = |job: &str, thread: &str| {
        mailbox
            .enqueue(EnqueueRequest {
                job_id: job.into(),
                mailbox_id: thread.into(),
                run_id: format!("run-of-{job}"),
                ..Default::default()
            })
            .unwrap();
    };
    for i in 0..RUNNING {
        enqueue(&format!("running-{i}"), &format!("thread-{i}"));
        assert!(mailbox.claim(&format!("w-{i}")).unwrap().is_some());
    }
    enqueue("waiting", "thread-new");
    cluster
        .psql(&url, "SELECT pg_stat_statements_reset()")
        .unwrap();

    let claim = mailbox.claim("w-new").unwrap().unwrap();
    assert_eq!(claim.job.job_id, "waiting");
    let rows = rows_read(&cluster, &url);
    // The queued job, its thread's rows, the claim's reads of its job: three. Reading every
    // running job's thread would be over 200.
    assert!(
        rows <= 10,
        "claiming one job with {RUNNING} running read {rows} rows"
    );
}

/// Streams that follow one replica's log read each event another replica committed from the
/// store once between them, however many they are: the first that wants it reads it and
/// keeps it for the others, which wait their turn and read it from memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_on_one_replica_read_another_replica_s_events_from_the_store_once() {
    use arbor_runner_svc::{ServeConfig, engine::TreeFormat, open_runner, pool, runs::SubmitInput};
    use arbor_shared::domain::RunStatus;
    use tokio_util::sync::CancellationToken;

    const STREAMS: usize = 4;
    const RUNS: usize = 12;
    const ROUNDS: usize = 4;
    let url = arbor_testkit::PgCluster::shared().fresh_database("shared_reads");
    let replica = |workers: usize| {
        let (dir, url) = (tempfile::tempdir().unwrap(), url.clone());
        async move {
            let runner = open_runner(&ServeConfig {
                data_dir: dir.path().to_path_buf(),
                store_url: Some(url),
                workers,
                ..ServeConfig::default()
            })
            .await
            .unwrap();
            (runner, dir)
        }
    };
    // Replica `a` only serves the streams; `b` takes the runs and runs them.
    let ((a, _a_dir), (b, _b_dir)) = (replica(0).await, replica(4).await);
    let tree = serde_json::json!({"id": "steps", "version": 1,
        "root": {"type": "sequence", "name": "s", "children": [
            {"type": "set", "name": "x", "key": "x", "value": 1},
            {"type": "set", "name": "y", "key": "y", "value": 2}]}});
    b.register_tree(&tree.to_string(), TreeFormat::Json)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(b.clone(), 4, stop.clone());

    let log = a.events().clone();
    let (start, read_before) = (log.durable_seq(), log.events_read());
    let followers: Vec<_> = (0..STREAMS)
        .map(|_| common::follow_log(log.clone(), start).1)
        .collect();

    for _ in 0..ROUNDS {
        let each = (0..RUNS).map(|_| {
            b.submit(SubmitInput {
                tree_id: "steps".into(),
                ..Default::default()
            })
        });
        for run in futures_util::future::join_all(each).await {
            common::wait_status(&b, &run.unwrap().run.run_id, RunStatus::Succeeded).await;
        }
    }
    let last = b.events().last_seq().unwrap();
    let committed = last - start;
    assert!(
        committed >= (4 * RUNS * ROUNDS) as u64,
        "{committed} events"
    );
    for mut read_up_to in followers {
        common::wait_read_up_to(&mut read_up_to, last).await;
    }
    stop.cancel();

    let read = a.events().events_read();
    let (memory, store) = (read.0 - read_before.0, read.1 - read_before.1);
    assert_eq!(
        (store, memory),
        (committed, (STREAMS as u64 - 1) * committed),
        "{STREAMS} streams read the {committed} events of the other replica {store} times \
         from the store"
    );
}
