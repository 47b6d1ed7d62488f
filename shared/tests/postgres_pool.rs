//! The connection pool on a real PostgreSQL server: a process keeps its load on as few
//! server backends as the load needs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use arbor_shared::postgres::{Database, Object, Patience, Schema};
use arbor_testkit::PgCluster;

const SCHEMA: Schema = Schema {
    component: "pool",
    migrations: &[],
};

/// The server backend behind `client`.
async fn pid(client: &Object) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// After a burst has opened several connections, reads one at a time all go to the one
/// returned last: the server backends the burst woke go back to sleep instead of being woken
/// in turn, one per read, with cold caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_read_at_a_time_keeps_to_one_backend_after_a_burst() {
    let url = tokio::task::spawn_blocking(|| PgCluster::shared().fresh_database("pool"))
        .await
        .unwrap();
    let db = Database::open(
        &url,
        "arbor-pool-test",
        SCHEMA,
        &[],
        Patience::Reachable(Duration::from_secs(10)),
    )
    .await
    .unwrap();

    // A burst: four connections lent at once, so the pool holds four.
    let mut burst = Vec::new();
    for _ in 0..4 {
        burst.push(db.client().await.unwrap());
    }
    let mut pids = Vec::new();
    for client in &burst {
        pids.push(pid(client).await);
    }
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 4, "the burst holds four connections");
    drop(burst);

    // Then reads one at a time.
    let mut seen = Vec::new();
    for _ in 0..12 {
        seen.push(pid(&db.client().await.unwrap()).await);
    }
    assert!(
        seen.iter().all(|pid| *pid == seen[0]),
        "reads one at a time went to backends {seen:?}"
    );
}
