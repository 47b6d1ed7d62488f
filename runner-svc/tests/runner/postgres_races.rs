//! Races that only PostgreSQL lets overlap (on sled, transactions run one at a time): claimers
//! racing for the same queue entries take different ones without waiting for each other
//! (`Txn::lock_first` is `FOR UPDATE SKIP LOCKED`), a wake-up never folds into a job that
//! a concurrent claim took, an interrupt and a claim of its thread's job see each other, a
//! transaction that conflicts runs again and is counted, a replica tells the others about the
//! jobs it queued only when it has no idle worker for them, a durable batch that waited for
//! another replica's turn of the event log takes every commit queued during the wait, and one
//! that rolls back tells no replica that its events are durable. The ledger's sequence is one for
//! all replicas, each `seq` above those of the appends that returned before it began (`ledger`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
#[path = "postgres_races/ledger.rs"]
pub mod ledger;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

use arbor_runner_svc::{
    mailbox::{EnqueueRequest, Mailbox, MailboxConfig, MailboxStore, SystemClock, tx as mtx},
    store::{Abort, Change, Store, T, TxError, Wake},
};
use arbor_shared::domain::JobStatus;

/// How long a race test waits for the other side.
const WAIT: Duration = Duration::from_secs(20);

/// A point a transaction body's first run stops at until the test lets it go on, so that
/// another transaction runs in between; a run after a conflict passes straight through.
struct Hold {
    reached: (mpsc::Sender<()>, Mutex<mpsc::Receiver<()>>),
    go_on: (mpsc::Sender<()>, Mutex<mpsc::Receiver<()>>),
    runs: AtomicUsize,
}

impl Hold {
    fn new() -> Arc<Self> {
        let ((reached, was_reached), (go_on, may_go_on)) = (mpsc::channel(), mpsc::channel());
        Arc::new(Self {
            reached: (reached, Mutex::new(was_reached)),
            go_on: (go_on, Mutex::new(may_go_on)),
            runs: AtomicUsize::new(0),
        })
    }

    /// In the body: on its first run, says it got here and waits to be let go on (without
    /// panicking, so that a body on a commit thread cannot take the thread down); answers
    /// whether this is the first run.
    fn here(&self) -> bool {
        if self.runs.fetch_add(1, Ordering::SeqCst) > 0 {
            return false;
        }
        let _ = self.reached.0.send(());
        let _ = self.go_on.1.lock().unwrap().recv_timeout(WAIT);
        true
    }

    /// In the test: waits until the body's first run stands at the hold.
    fn wait_reached(&self) {
        self.reached
            .1
            .lock()
            .unwrap()
            .recv_timeout(WAIT)
            .expect("the body reached its hold");
    }

    /// In the test: lets the body go on.
    fn release(&self) {
        let _ = self.go_on.0.send(());
    }

    /// How many times the body ran.
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

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

    let hold = Hold::new();
    std::thread::scope(|s| {
        let waking = s.spawn(|| {
            store
                .transact(|t| {
                    let enqueued = mtx::enqueue(t, &wake("wake-2"), 2, 0, 3)?;
                    // The first run saw the queued job; it waits for the claim to commit.
                    if hold.here() {
                        assert!(enqueued.deduplicated);
                    }
                    Ok(enqueued)
                })
                .unwrap()
        });
        hold.wait_reached();
        let claim = mailbox.claim_or_next("worker").unwrap().0.expect("a claim");
        assert_eq!(claim.job.job_id, "wake-1");
        hold.release();
        let enqueued = waking.join().unwrap();
        assert!(
            !enqueued.deduplicated && enqueued.job.job_id == "wake-2",
            "the wake-up folded into the claimed job: {enqueued:?}"
        );
    });
}

/// What one replica (`there`) hears of another's (`here`) commits, in commit order: a mark (an
/// appended event, announced whatever else happens) committed by `here` bounds what was heard
/// before it.
struct Ears {
    heard: mpsc::Receiver<Change>,
    marks: u64,
}

impl Ears {
    /// `there` listening; answers once it hears `here`'s marks.
    fn listen(here: &Store, there: &Store) -> Ears {
        let (heard_tx, heard) = mpsc::channel::<Change>();
        let heard_tx = Mutex::new(heard_tx);
        there.subscribe(move |change| {
            let _ = heard_tx.lock().unwrap().send(change);
        });
        let mut ears = Ears { heard, marks: 0 };
        // Until the other replica listens, marks go unheard.
        loop {
            let n = ears.mark(here);
            match ears.heard.recv_timeout(Duration::from_secs(5)) {
                Ok(Change::Appended(seq)) if seq == n => return ears,
                Ok(_) => {}
                Err(_) => assert!(n < 6, "the other replica never listened"),
            }
        }
    }

    /// Commits the next mark on `here`; answers its number.
    fn mark(&mut self, here: &Store) -> u64 {
        self.marks += 1;
        let n = self.marks;
        here.transact(|t| {
            t.tree(T::Events).insert(n.to_be_bytes(), b"mark")?;
            t.wake(Wake::Events(n));
            Ok::<_, arbor_runner_svc::store::Abort<()>>(())
        })
        .unwrap();
        n
    }

    /// What was heard before the mark `n`.
    fn until_mark(&self, n: u64) -> Vec<Change> {
        let mut before = Vec::new();
        loop {
            match self.heard.recv_timeout(Duration::from_secs(10)) {
                // The notification names the mark's seq: the other replica need not read it.
                Ok(Change::Appended(seq)) if seq == n => return before,
                Ok(change) => before.push(change),
                Err(e) => panic!("the other replica never heard of the mark: {e}"),
            }
        }
    }

    /// Commits a mark on `here` and answers what was heard before it.
    fn heard_before_mark(&mut self, here: &Store) -> Vec<Change> {
        let n = self.mark(here);
        self.until_mark(n)
    }
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
    let mut ears = Ears::listen(&here, &there);

    idle.store(1, Ordering::SeqCst);
    queue(&["taken-here"]);
    assert_eq!(
        ears.heard_before_mark(&here),
        vec![],
        "a job an idle worker here takes is not announced"
    );

    idle.store(0, Ordering::SeqCst);
    queue(&["busy-here"]);
    assert_eq!(
        ears.heard_before_mark(&here),
        vec![Change::Work],
        "a job no worker here is free for is announced"
    );

    // Two jobs in one transaction and one idle worker: the second needs another replica.
    idle.store(1, Ordering::SeqCst);
    queue(&["pair-1", "pair-2"]);
    assert_eq!(
        ears.heard_before_mark(&here),
        vec![Change::Work],
        "more jobs than idle workers here"
    );
}

/// A look at the queue that passes over a due job because its thread's job is claimed leaves it
/// to whoever holds that claim: when a worker of this replica holds it, that worker looks once
/// it is done (nothing is announced); when another replica's does, that replica is told, so
/// that its own look notes the job for the worker that finishes the thread's job. Without the
/// announcement the job would wait for the next regular look, which nothing bounds but the
/// idle workers' poll.
#[test]
fn a_job_passed_over_for_another_replica_s_claim_is_announced_to_it() {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("passed_over");
    let (here, there) = (common::open_postgres(&url), common::open_postgres(&url));
    // Jobs queued here are taken by an idle worker here: queuing announces nothing.
    here.idle_workers(Arc::new(AtomicUsize::new(1)));
    let open = |store: &Store| {
        let clock = Arc::new(SystemClock::default());
        Mailbox::open(store.clone(), clock, MailboxConfig::default())
            .unwrap()
            .0
    };
    let (mailbox_here, mailbox_there) = (open(&here), open(&there));
    let job = |id: &str, thread: &str| EnqueueRequest {
        job_id: id.into(),
        mailbox_id: thread.into(),
        run_id: format!("run-{id}"),
        ..Default::default()
    };
    let mut ears = Ears::listen(&here, &there);

    // Its own worker holds the thread's first job: the look notes the second for that worker.
    mailbox_here.enqueue(job("ours-1", "t-ours")).unwrap();
    let ours = mailbox_here.claim("worker-here").unwrap().expect("a claim");
    assert_eq!(ours.job.job_id, "ours-1");
    mailbox_here.enqueue(job("ours-2", "t-ours")).unwrap();
    assert!(mailbox_here.claim("worker-here").unwrap().is_none());
    assert_eq!(
        ears.heard_before_mark(&here),
        vec![],
        "a job passed over for this replica's own claim is not announced"
    );
    assert!(
        mailbox_here.finished(&ours.job),
        "the worker that finishes the thread's job looks at the queue"
    );

    // The other replica's worker holds the thread's first job; here, the second is passed over.
    mailbox_here.enqueue(job("theirs-1", "t-theirs")).unwrap();
    let held = mailbox_there
        .claim("worker-there")
        .unwrap()
        .expect("a claim");
    assert_eq!(held.job.job_id, "theirs-1");
    mailbox_here.enqueue(job("theirs-2", "t-theirs")).unwrap();
    assert_eq!(
        ears.heard_before_mark(&here),
        vec![],
        "queued, not announced"
    );
    assert!(mailbox_here.claim("worker-here").unwrap().is_none());
    assert_eq!(
        ears.heard_before_mark(&here),
        vec![Change::Work],
        "a job passed over for another replica's claim is announced"
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
            t.wake(Wake::Events(n));
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

/// A durable batch whose write fails (here a serialisation failure: a row it read was changed
/// by another transaction since) is rolled back, and its `COMMIT` answers OK all the same. The
/// other replicas must not hear that its events are durable: a stream there would read the log
/// up to seqs nobody committed, find nothing, and wait for the log's head to move again, which
/// on a quiet log may take until the next commit of anything.
#[test]
fn a_batch_that_rolls_back_tells_no_replica_its_events_are_durable() {
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("rolled_back_batch");
    let (here, there) = (common::open_postgres(&url), common::open_postgres(&url));
    let mut ears = Ears::listen(&here, &there);
    let row = |t: &arbor_runner_svc::store::Tx<'_>, v: u8| -> Result<(), Abort<()>> {
        t.tree(T::Ledger).insert(b"row", [v])?;
        Ok(())
    };
    here.transact(|t| row(t, 0)).unwrap();
    // The event the batch appends, past every mark: only a notification of it could name it.
    let seq = ears.marks + 100;

    // The batch reads the row, appends the event and, once the other replica has changed the
    // row, writes it: the write fails, the batch rolls back. Its body's run after the conflict
    // gives up, so nothing commits the event.
    let hold = Hold::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let in_body = hold.clone();
        let batch = s.spawn(|| {
            rt.block_on(here.commit(move |t| {
                t.tree(T::Ledger).get(b"row")?;
                t.tree(T::Events)
                    .insert(seq.to_be_bytes(), b"rolled back")?;
                t.wake(Wake::Events(seq));
                if !in_body.here() {
                    return Err(Abort::Domain(()));
                }
                row(t, 1)
            }))
        });
        hold.wait_reached();
        there.transact(|t| row(t, 2)).unwrap();
        hold.release();
        assert!(
            matches!(batch.join().unwrap(), Err(TxError::Abort(()))),
            "the batch's run after the conflict gave up"
        );
    });
    assert_eq!(hold.runs(), 2, "the batch ran again after its write failed");
    assert_eq!(
        here.tree(T::Events).get(seq.to_be_bytes()).unwrap(),
        None,
        "the event was committed"
    );
    assert_eq!(
        ears.heard_before_mark(&here),
        vec![],
        "another replica heard of the rolled-back batch"
    );
}

/// A durable batch waits for its turn of the event log (the writer lock, held by another
/// replica's batch) before it takes the commits queued behind it: everything queued during the
/// wait goes into the batch that waited, not into one more transaction and WAL flush after it,
/// which would be one more turn of the log for every replica to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_queued_while_another_replica_has_the_log_go_in_the_batch_that_waited() {
    const QUEUED: usize = 16;
    let cluster = arbor_testkit::PgCluster::shared();
    let url = cluster.fresh_database("turn_of_the_log");
    let (here, there) = (common::open_postgres(&url), common::open_postgres(&url));

    // The other replica's batch has read (so it holds the writer lock) and waits to be released.
    let (holding_tx, holding_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let held = tokio::spawn(async move {
        there
            .commit(move |t| {
                t.tree(T::Runs).get(b"anything")?;
                let _ = holding_tx.send(());
                let _ = release_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(20));
                Ok::<_, arbor_runner_svc::store::Abort<()>>(())
            })
            .await
    });
    tokio::task::spawn_blocking(move || holding_rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the other replica's batch began");

    // A commit here waits for the lock; then more queue behind it.
    let before = here.stats();
    let write = |key: String| {
        let here = here.clone();
        async move {
            here.commit(move |t| {
                t.tree(T::Checkpoints)
                    .insert(key.as_bytes(), b"checkpoint")?;
                Ok::<_, arbor_runner_svc::store::Abort<()>>(())
            })
            .await
        }
    };
    let first = tokio::spawn(write("first".into()));
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    arbor_shared::testing::eventually(
        "the commit here to wait for the writer lock",
        Duration::from_secs(20),
        || async { (cluster.psql(&url, waiting).unwrap().trim() == "1").then_some(()) },
    )
    .await;
    let queued: Vec<_> = (0..QUEUED)
        .map(|i| tokio::spawn(write(format!("queued-{i}"))))
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    release_tx.send(()).unwrap();

    held.await.unwrap().unwrap();
    first.await.unwrap().unwrap();
    for q in queued {
        q.await.unwrap().unwrap();
    }
    let stats = here.stats();
    assert_eq!(
        (stats.batches - before.batches, stats.bodies - before.bodies),
        (1, 1 + QUEUED as u64),
        "the commits queued during the wait did not go into the batch that waited"
    );
    for key in
        std::iter::once("first".to_string()).chain((0..QUEUED).map(|i| format!("queued-{i}")))
    {
        assert_eq!(
            here.tree(T::Checkpoints).get(&key).unwrap().as_deref(),
            Some(&b"checkpoint"[..]),
            "{key}"
        );
    }
}

/// An interrupt (committed in the durable batch as `InterruptThread` commits it) and a
/// worker's claim of a job of the same thread (the claim batch) that overlap must come out as
/// if one ran after the other: either the claim saw the new generation and superseded the job,
/// or the interrupt saw the claim and names the claimed job as the thread's running one. Here
/// the interrupt's list of queued jobs was read before the job was queued, so nothing but
/// the thread's own rows tells the two about each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_and_a_claim_of_its_thread_see_each_other() {
    let cluster = arbor_testkit::PgCluster::shared();
    let store = common::open_postgres(&cluster.fresh_database("interrupt_vs_claim"));
    let (mailbox, _) = Mailbox::open(
        store.clone(),
        Arc::new(SystemClock::default()),
        MailboxConfig::default(),
    )
    .unwrap();
    mailbox
        .enqueue_durable(EnqueueRequest {
            job_id: "job-1".into(),
            mailbox_id: "thread-1".into(),
            run_id: "run-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let hold = Hold::new();
    let interrupting = tokio::spawn({
        let (store, hold) = (store.clone(), hold.clone());
        async move {
            store
                .commit_as(Vec::new(), mtx::INTERRUPT_COMMIT, move |t| {
                    let intr = mtx::interrupt(t, "thread-1", &[], 1)?;
                    // The first run has read the thread; it waits for the claim to commit.
                    hold.here();
                    Ok(intr)
                })
                .await
        }
    });
    tokio::task::spawn_blocking({
        let hold = hold.clone();
        move || hold.wait_reached()
    })
    .await
    .unwrap();
    let (claim, _) = mailbox.claim_next("worker").await.unwrap();
    hold.release();
    let intr = interrupting.await.unwrap().unwrap();

    let job = mailbox.get("job-1").unwrap().unwrap();
    match claim {
        Some(claim) => assert_eq!(
            intr.active_job.map(|j| j.job_id),
            Some(claim.job.job_id),
            "the job was claimed at the old generation and the interrupt did not see the claim \
             (job: {job:?})"
        ),
        None => assert_eq!(job.status, JobStatus::Superseded, "{job:?}"),
    }
}

/// A transaction whose read another transaction changes before it commits runs again, sees
/// the change, and is counted once as a conflict (`Stats::conflicts`, the metric
/// `arbor_runner_store_conflicts_total`): the increment it made is not lost.
#[test]
fn a_transaction_that_conflicts_runs_again_and_is_counted() {
    let cluster = arbor_testkit::PgCluster::shared();
    let store = common::open_postgres(&cluster.fresh_database("counted_conflict"));
    let read = |t: &arbor_runner_svc::store::Tx<'_>| -> Result<u8, Abort<()>> {
        Ok(t.tree(T::Ledger).get(b"n")?.map_or(0, |v| v[0]))
    };
    let write = |t: &arbor_runner_svc::store::Tx<'_>, n: u8| -> Result<(), Abort<()>> {
        t.tree(T::Ledger).insert(b"n", [n])?;
        Ok(())
    };
    store.transact(|t| write(t, 0)).unwrap();
    let before = store.stats().conflicts;

    let hold = Hold::new();
    std::thread::scope(|s| {
        let slow = s.spawn(|| {
            store
                .transact(|t| {
                    let n = read(t)?;
                    // The first run waits, having read, for the other writer to commit.
                    hold.here();
                    write(t, n + 1)
                })
                .unwrap();
        });
        hold.wait_reached();
        store.transact(|t| write(t, read(t)? + 10)).unwrap();
        hold.release();
        slow.join().unwrap();
    });
    assert_eq!(
        store.tree(T::Ledger).get(b"n").unwrap().as_deref(),
        Some(&[11][..]),
        "an increment was lost"
    );
    assert_eq!(hold.runs(), 2, "the conflicting transaction ran again");
    assert_eq!(store.stats().conflicts - before, 1);
}
