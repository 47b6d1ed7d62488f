//! The journal is what makes a runner commit durable; sled's own files are synced only at
//! checkpoints. So a database whose sled files lost everything written after some point (what a
//! power cut does to log writes sled had not synced yet) must get all of it back from the
//! journal when it opens: every tree byte for byte as the database that never lost anything,
//! the `ledger.append` tool's records included.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{approve_first, wait_status};

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use arbor_runner_svc::{
    engine::{GuardConfig, ToolRegistry, TreeFormat},
    mailbox::SystemClock,
    runs::{Runner, RunnerOptions, SubmitInput},
    store::{Store, T},
    worker,
};
use arbor_shared::domain::RunStatus;
use tokio_util::sync::CancellationToken;

const QUICK: &str = r#"{"id": "quick", "version": 1, "root": {"type": "set", "name": "s", "key": "x", "value": 1}}"#;
const GATED: &str = r#"{"id": "gated", "version": 1, "root":
  {"type": "approval", "name": "ok", "title": "Continue?", "child": {"type": "succeed", "name": "go"}}}"#;

/// A tool call: its `ledger.append` record is written outside the run's own commits.
const TOOLED: &str = r#"{"id": "tooled", "version": 1, "root":
  {"type": "tool", "name": "book", "tool": "ledger.append", "args": {"entry": "booked"}, "output": "receipt"}}"#;

const TREES: [T; 15] = [
    T::Trees,
    T::Runs,
    T::ThreadRuns,
    T::Checkpoints,
    T::Inbox,
    T::Events,
    T::Meta,
    T::Jobs,
    T::Queue,
    T::Active,
    T::Dedupe,
    T::Mailboxes,
    T::MailboxJobs,
    T::Finished,
    T::Ledger,
];

/// Opens the store, waiting for the threads of a dropped one to let go of the files.
async fn open(dir: &Path) -> Store {
    Store::open_waiting(dir, 16 << 20, Duration::from_secs(10))
        .await
        .unwrap()
}

type Contents = Vec<BTreeMap<Vec<u8>, Vec<u8>>>;

fn contents(store: &Store) -> Contents {
    TREES
        .iter()
        .map(|t| {
            store
                .tree(*t)
                .iter()
                .map(|kv| {
                    let (k, v) = kv.unwrap();
                    (k.to_vec(), v.to_vec())
                })
                .collect()
        })
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

async fn runner_on(store: &Store) -> Arc<Runner> {
    let ledger = store.ledger();
    let tools = ToolRegistry::with_builtins(ledger, GuardConfig::default());
    Runner::open(
        store.clone(),
        Arc::new(SystemClock::default()),
        Arc::new(tools),
        RunnerOptions::default(),
    )
    .await
    .unwrap()
}

fn submit(tree: &str) -> SubmitInput {
    SubmitInput {
        tree_id: tree.into(),
        submitted_by: "alice".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_files_that_lost_the_last_commits_get_them_back_from_the_journal() {
    let live = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();

    // Before the "power cut": trees registered, three runs done.
    {
        let store = open(live.path()).await;
        let runner = runner_on(&store).await;
        runner.register_tree(QUICK, TreeFormat::Json).await.unwrap();
        runner.register_tree(GATED, TreeFormat::Json).await.unwrap();
        runner
            .register_tree(TOOLED, TreeFormat::Json)
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let _workers = worker::spawn(runner.clone(), 2, stop.clone());
        for _ in 0..3 {
            let id = runner.submit(submit("quick")).await.unwrap().run.run_id;
            wait_status(&runner, &id, RunStatus::Succeeded).await;
        }
        stop.cancel();
    }
    // The sled files as they were then.
    let before = {
        let store = open(live.path()).await;
        contents(&store)
    };
    copy_dir(live.path(), crashed.path());

    // After it: more runs, suspensions, a decision, a resume, a cancel.
    {
        let store = open(live.path()).await;
        let runner = runner_on(&store).await;
        let stop = CancellationToken::new();
        let _workers = worker::spawn(runner.clone(), 2, stop.clone());
        let mut gated = Vec::new();
        for _ in 0..3 {
            gated.push(runner.submit(submit("gated")).await.unwrap().run.run_id);
        }
        for tree in ["quick", "tooled", "quick", "tooled", "quick"] {
            let id = runner.submit(submit(tree)).await.unwrap().run.run_id;
            wait_status(&runner, &id, RunStatus::Succeeded).await;
        }
        for id in &gated {
            wait_status(&runner, id, RunStatus::Suspended).await;
        }
        approve_first(&runner, &gated[0], "d-1").await;
        wait_status(&runner, &gated[0], RunStatus::Succeeded).await;
        runner.cancel_run(&gated[1], "not needed").await.unwrap();
        wait_status(&runner, &gated[1], RunStatus::Cancelled).await;
        stop.cancel();
    }
    // What a power cut leaves: sled's files from before, the journal that was synced after.
    std::fs::remove_dir_all(crashed.path().join("journal")).unwrap();
    copy_dir(
        &live.path().join("journal"),
        &crashed.path().join("journal"),
    );

    let want = contents(&open(live.path()).await);
    assert_ne!(want, before, "the second phase changed nothing");
    let got = contents(&open(crashed.path()).await);
    for (i, t) in TREES.iter().enumerate() {
        assert_eq!(
            got[i].len(),
            want[i].len(),
            "{t:?}: {} keys after replay, {} in the database that lost nothing",
            got[i].len(),
            want[i].len()
        );
        assert!(got[i] == want[i], "{t:?} differs after replay");
    }
    let store = open(crashed.path()).await;
    assert_eq!(store.counts().unwrap(), store.count_by_scan().unwrap());
    assert_eq!(
        store.tree(T::Ledger).len(),
        2,
        "each tool call's ledger record is back"
    );
}
