//! A stream that follows the log's head reads the events this process has just committed from
//! its memory, not from the store: also when many commits share a batch and their callers wake
//! in any order, since each commit's events are remembered, in commit order, before any caller
//! of its batch is answered.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{self, Backend};

use arbor_runner_svc::{ServeConfig, engine::TreeFormat, open_runner, pool, runs::SubmitInput};
use arbor_shared::domain::RunStatus;
use tokio_util::sync::CancellationToken;

/// Runs submitted at once, in each of the rounds.
const RUNS: usize = 48;
const ROUNDS: usize = 3;

pub async fn a_stream_reads_the_events_this_process_just_committed_from_memory(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let runner = open_runner(&ServeConfig {
        data_dir: dir.path().to_path_buf(),
        store_url: b.store_url(dir.path()),
        workers: 8,
        ..ServeConfig::default()
    })
    .await
    .unwrap();
    let tree = serde_json::json!({"id": "steps", "version": 1,
        "root": {"type": "sequence", "name": "s", "children": [
            {"type": "set", "name": "a", "key": "a", "value": 1},
            {"type": "set", "name": "b", "key": "b", "value": 2}]}});
    runner
        .register_tree(&tree.to_string(), TreeFormat::Json)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let _workers = pool::spawn(runner.clone(), 8, stop.clone());

    // A follower of the log's head, as `StreamEvents` follows it: every event once, in order.
    let log = runner.events().clone();
    let (start, read_before) = (log.durable_seq(), log.events_read());
    let (follower, mut read_up_to) = common::follow_log(log, start);

    for _ in 0..ROUNDS {
        // The submissions share one batch; the steps after them share others.
        let submitted = common::with_lane_held(runner.store(), async {
            let each = (0..RUNS).map(|_| {
                runner.submit(SubmitInput {
                    tree_id: "steps".into(),
                    ..Default::default()
                })
            });
            futures_util::future::join_all(each).await
        })
        .await;
        for run in submitted {
            common::wait_status(&runner, &run.unwrap().run.run_id, RunStatus::Succeeded).await;
        }
    }
    let last = runner.events().last_seq().unwrap();
    let committed = last - start;
    assert!(
        committed >= (4 * RUNS * ROUNDS) as u64,
        "{committed} events"
    );
    common::wait_read_up_to(&mut read_up_to, last).await;
    follower.abort();
    stop.cancel();

    let read = runner.events().events_read();
    let (memory, store) = (read.0 - read_before.0, read.1 - read_before.1);
    assert_eq!(
        (memory, store),
        (committed, 0),
        "of the {committed} events this process had just committed, the stream read {store} from the store"
    );
}
