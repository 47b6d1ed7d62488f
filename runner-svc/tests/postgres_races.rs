//! Races that only PostgreSQL lets overlap (on sled, transactions run one at a time): claimers
//! racing for the same queue entries take different ones without waiting for each other
//! (`Txn::lock_first` is `FOR UPDATE SKIP LOCKED`), a wake-up never folds into a job that
//! a concurrent claim took, and a replica tells the others about the jobs it queued only when
//! it has no idle worker for them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

use arbor_runner_svc::{
    mailbox::{EnqueueRequest, Mailbox, MailboxConfig, SystemClock, tx as mtx},
    store::{Change, T, TxError},
};

/// While one transaction holds the first candidate, another takes the second at once, and both
/// commit: each removed the entry it took.
#[test]
fn a_second_claimer_takes_the_next_entry_while_the_first_is_held() {
    let cluster = arbor_testkit::PgCluster::shared();
    let store = common::open_postgres(&cluster.fresh_database("skip_locked"));
    let keys: Vec<Vec<u8>> = ["q1", "q2", "q3"].map(|k| k.as_bytes().to_vec()).into();
    store
        .transact(|t| {
            for k in &keys {
                t.tree(T::Queue).insert(k, b"job")?;
            }
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();

    let (held_tx, held_rx) = mpsc::channel::<Vec<u8>>();
    let (second_tx, second_rx) = mpsc::channel::<Vec<u8>>();
    let second_rx = Mutex::new(second_rx);
    let attempts = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            store
                .transact(|t| {
                    let got = t.tree(T::Queue).lock_first(&keys, 1)?;
                    let (key, _) = got.first().cloned().expect("an entry");
                    // Only the first attempt waits for the other claimer; a retry after a
                    // serialisation failure just finishes.
                    if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                        held_tx.send(key.clone()).unwrap();
                        let other = second_rx
                            .lock()
                            .unwrap()
                            .recv_timeout(Duration::from_secs(20))
                            .expect("the second claimer finished while this one held its entry");
                        assert_ne!(other, key);
                    }
                    t.tree(T::Queue).remove(&key)?;
                    Ok::<_, arbor_runner_svc::store::Abort<()>>(key)
                })
                .unwrap()
        });
        let held = held_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(held, b"q1");
        let second: Result<Vec<u8>, TxError<()>> = store.transact(|t| {
            let got = t.tree(T::Queue).lock_first(&keys, 1)?;
            let (key, _) = got
                .first()
                .cloned()
                .expect("an entry not held by the first");
            t.tree(T::Queue).remove(&key)?;
            Ok(key)
        });
        let second = second.unwrap();
        assert_eq!(second, b"q2");
        second_tx.send(second).unwrap();
        assert_eq!(first.join().unwrap(), b"q1");
    });
    let left: Vec<Vec<u8>> = store
        .tree(T::Queue)
        .iter()
        .keys()
        .map(Result::unwrap)
        .collect();
    assert_eq!(left, vec![b"q3".to_vec()]);
}

/// A wake-up whose transaction read a queued job as its duplicate while a claim took that job
/// and committed must not fold into it: the claimed job's worker may already have read the
/// run's inbox, so the decision the wake-up is for would wait with no job to deliver it. It
/// gets a job of its own instead.
#[test]
fn a_wake_up_never_folds_into_a_job_a_concurrent_claim_took() {
    let cluster = arbor_testkit::PgCluster::shared();
    let store = common::open_postgres(&cluster.fresh_database("wake_vs_claim"));
    let (mailbox, _) = Mailbox::open(
        store.clone(),
        std::sync::Arc::new(SystemClock::default()),
        MailboxConfig::default(),
    )
    .unwrap();
    let wake = |job_id: &str| EnqueueRequest {
        job_id: job_id.into(),
        mailbox_id: "thread-1".into(),
        run_id: "run-1".into(),
        dedupe_key: "wake:run-1".into(),
        ..Default::default()
    };
    let first = store
        .transact(|t| mtx::enqueue(t, &wake("wake-1"), 1, 0, 3))
        .unwrap();
    assert!(!first.deduplicated);

    let (read_tx, read_rx) = mpsc::channel::<()>();
    let (claimed_tx, claimed_rx) = mpsc::channel::<()>();
    let claimed_rx = Mutex::new(claimed_rx);
    let attempts = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let waking = s.spawn(|| {
            store
                .transact(|t| {
                    let enqueued = mtx::enqueue(t, &wake("wake-2"), 2, 0, 3)?;
                    // The first attempt saw the queued job; it waits for the claim to commit.
                    if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                        assert!(enqueued.deduplicated);
                        read_tx.send(()).unwrap();
                        claimed_rx
                            .lock()
                            .unwrap()
                            .recv_timeout(Duration::from_secs(20))
                            .expect("the claim committed");
                    }
                    Ok(enqueued)
                })
                .unwrap()
        });
        read_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        let claim = mailbox.claim_or_next("worker").unwrap().0.expect("a claim");
        assert_eq!(claim.job.job_id, "wake-1");
        claimed_tx.send(()).unwrap();
        let enqueued = waking.join().unwrap();
        assert!(
            !enqueued.deduplicated && enqueued.job.job_id == "wake-2",
            "the wake-up folded into the claimed job: {enqueued:?}"
        );
    });
}

/// Jobs a replica queued while it had a worker idle for each are its own workers' to take:
/// the other replicas are not told (each of theirs would look, and all but one find the job
/// taken). Jobs queued while every worker there is busy are announced, so that another
/// replica takes them at once rather than at its next regular look.
#[test]
fn queued_jobs_are_announced_only_when_no_worker_of_the_replica_is_idle() {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("work_hints");
    let (here, there) = (common::open_postgres(&url), common::open_postgres(&url));
    let idle = Arc::new(AtomicUsize::new(0));
    here.idle_workers(idle.clone());
    let (heard_tx, heard) = mpsc::channel::<Change>();
    let heard_tx = Mutex::new(heard_tx);
    there.subscribe(move |change| {
        let _ = heard_tx.lock().unwrap().send(change);
    });
    // Jobs `ids`, each of a thread and run of its own, queued in one transaction.
    let queue = |ids: &[&str]| {
        here.transact(|t| {
            for id in ids {
                let job = EnqueueRequest {
                    job_id: (*id).into(),
                    mailbox_id: format!("thread-{id}"),
                    run_id: format!("run-{id}"),
                    ..Default::default()
                };
                mtx::enqueue(t, &job, 1, 0, 3)?;
            }
            Ok::<_, arbor_runner_svc::store::Abort<_>>(())
        })
        .unwrap();
    };
    // An appended event is announced whatever the workers do: it marks a point in the order
    // in which the other replica hears of commits (that of the commits).
    let mark = |n: u64| {
        here.transact(|t| {
            t.tree(T::Events).insert(n.to_be_bytes(), b"mark")?;
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();
    };
    let until_mark = |n: u64| -> Vec<Change> {
        let mut before = Vec::new();
        loop {
            match heard.recv_timeout(Duration::from_secs(10)) {
                // The notification names the mark's seq: the other replica need not read it.
                Ok(Change::Appended(seq)) if seq == n => return before,
                Ok(change) => before.push(change),
                Err(e) => panic!("the other replica never heard of the mark: {e}"),
            }
        }
    };
    // Until the other replica listens, marks go unheard.
    let mut n = 0;
    loop {
        n += 1;
        mark(n);
        match heard.recv_timeout(Duration::from_secs(5)) {
            Ok(Change::Appended(seq)) if seq == n => break,
            Ok(_) => {}
            Err(_) => assert!(n < 6, "the other replica never listened"),
        }
    }

    idle.store(1, Ordering::SeqCst);
    queue(&["taken-here"]);
    mark(100);
    assert_eq!(
        until_mark(100),
        vec![],
        "a job an idle worker here takes is not announced"
    );

    idle.store(0, Ordering::SeqCst);
    queue(&["busy-here"]);
    mark(101);
    assert_eq!(
        until_mark(101),
        vec![Change::Work],
        "a job no worker here is free for is announced"
    );

    // Two jobs in one transaction and one idle worker: the second needs another replica.
    idle.store(1, Ordering::SeqCst);
    queue(&["pair-1", "pair-2"]);
    mark(102);
    assert_eq!(
        until_mark(102),
        vec![Change::Work],
        "more jobs than idle workers here"
    );
}

/// Notifications go to the whole database, and runners in several schemas of one database each
/// have an event log of their own: a replica trusts the seq a notification names only when it
/// names its own log; another log's notification only makes it look at its own log's head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_of_events_names_its_log() {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("two_logs");
    for schema in ["one", "two"] {
        cluster
            .psql(&url, &format!("CREATE SCHEMA {schema}"))
            .unwrap();
    }
    let in_schema =
        |schema: &str| common::open_postgres(&format!("{url}?options=-c%20search_path%3D{schema}"));
    let (writer, reader, stranger) = (in_schema("one"), in_schema("one"), in_schema("two"));
    let listen = |store: &arbor_runner_svc::store::Store| {
        let (heard_tx, heard) = mpsc::channel::<Change>();
        let heard_tx = Mutex::new(heard_tx);
        store.subscribe(move |change| {
            let _ = heard_tx.lock().unwrap().send(change);
        });
        heard
    };
    let (same_log, other_log) = (listen(&reader), listen(&stranger));
    // An append of event `n` (a durable batch).
    let append = |n: u64| {
        writer.commit(move |t| {
            t.tree(T::Events).insert(n.to_be_bytes(), b"mark")?;
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
    };
    // Until the reader listens, appends go unheard.
    let mut n = 0u64;
    let first = loop {
        n += 1;
        append(n).await.unwrap();
        match same_log.recv_timeout(Duration::from_secs(5)) {
            Ok(change) => break change,
            Err(_) => assert!(n < 6, "the reader never listened"),
        }
    };
    assert_eq!(first, Change::Appended(n), "the reader's own log");
    // The other schema's runner listens on a connection of its own, which may start listening
    // later than the reader's: appends go on until it hears one.
    loop {
        match other_log.recv_timeout(Duration::from_secs(2)) {
            Ok(Change::Events) => break,
            Ok(Change::Appended(seq)) => panic!("a seq of another log was trusted: {seq}"),
            Ok(_) => {}
            Err(e) => {
                assert!(n < 12, "the other schema's runner never heard: {e}");
                n += 1;
                append(n).await.unwrap();
            }
        }
    }
}
