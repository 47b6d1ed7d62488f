//! The whole-store check runs while the runner serves: writes that land while it reads (new
//! runs, their checkpoints, jobs and events) must never look like damage, and a real loss must.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::Backend;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use arbor_runner_svc::{
    engine::TreeFormat,
    runs::SubmitInput,
    store::{Abort, T},
};

const GATED: &str = r#"{"id": "gated", "version": 1, "root":
  {"type": "approval", "name": "ok", "title": "Continue?", "child": {"type": "succeed", "name": "go"}}}"#;

fn submit() -> SubmitInput {
    SubmitInput {
        tree_id: "gated".into(),
        submitted_by: "alice".into(),
        ..Default::default()
    }
}

pub async fn the_store_check_sees_no_damage_in_writes_made_while_it_reads(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let runner = b.open_runner(dir.path(), |_| {}).await;
    runner.register_tree(GATED, TreeFormat::Json).await.unwrap();
    for _ in 0..300 {
        runner.submit(submit()).await.unwrap();
    }

    // Submissions keep appending runs, checkpoints, jobs and events while the check reads.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = tokio::spawn({
        let (runner, writing) = (runner.clone(), writing.clone());
        async move {
            let mut n = 0;
            while writing.load(Ordering::Relaxed) {
                runner.submit(submit()).await.unwrap();
                n += 1;
            }
            n
        }
    });
    let store = runner.store().clone();
    let checks =
        tokio::task::spawn_blocking(move || (0..20).map(|_| store.verify()).collect::<Vec<_>>())
            .await
            .unwrap();
    writing.store(false, Ordering::Relaxed);
    let written = writer.await.unwrap();
    assert!(written > 0, "no write landed during the checks");
    for (i, check) in checks.into_iter().enumerate() {
        check.unwrap_or_else(|e| panic!("check {i} reported damage in a healthy store: {e}"));
    }

    // A real loss is still found: an event gone from the middle of the log.
    let store = runner.store();
    store
        .transact(|tx| {
            tx.tree(T::Events).remove(10u64.to_be_bytes())?;
            Ok::<_, Abort<()>>(())
        })
        .unwrap();
    let damage = store.verify().expect_err("a lost event is damage");
    assert!(damage.to_string().contains("seq 10 is missing"), "{damage}");
}
