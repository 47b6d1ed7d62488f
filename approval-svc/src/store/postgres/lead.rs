//! Leadership among the replicas on one database: a session-level advisory lock, taken with
//! `pg_try_advisory_lock` on a connection of its own that is taken out of the pool and held for
//! as long as the leadership lasts. The lock goes when its session goes: released by the leader
//! on purpose (the connection is closed), or by PostgreSQL when the leader's process or its
//! connection dies. The leader checks its session every [`CHECK_EVERY`] and gives the
//! leadership up when the check fails or takes longer than [`CHECK_TIMEOUT`], so a leader cut
//! off from the database stops acting as one.

use std::time::Duration;

use arbor_shared::postgres::{Database, Object};
use tokio_util::sync::CancellationToken;

use super::db_error;
use crate::{error::Result, store::Leadership};

/// The advisory lock's key ("arborapp"); other users of the database must not take it.
const LEADER_LOCK: i64 = 0x6172_626f_7261_7070;
/// How often the leader checks that its session is alive.
const CHECK_EVERY: Duration = Duration::from_millis(500);
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// The leader's session, as `pg_stat_activity` shows it.
pub const LEADER_APPLICATION: &str = "arbor-approval-leader";

/// Takes the lock if no other session holds it.
pub async fn try_lead(db: &Database) -> Result<Option<Leadership>> {
    let client = db.client().await?;
    let row = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&LEADER_LOCK])
        .await
        .map_err(db_error)?;
    if !row.get::<_, bool>(0) {
        // Back to the pool: it holds nothing.
        return Ok(None);
    }
    // The session now holds the lock: it must never serve anyone else.
    let session = Object::take(client);
    if let Err(e) = session
        .batch_execute(&format!("SET application_name = '{LEADER_APPLICATION}'"))
        .await
    {
        return Err(db_error(e));
    }
    let lost = CancellationToken::new();
    let release = CancellationToken::new();
    let (on_lost, on_release) = (lost.clone(), release.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = on_release.cancelled() => break,
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            let check = tokio::time::timeout(CHECK_TIMEOUT, session.simple_query("SELECT 1"));
            match check.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the leader's database session is gone");
                    break;
                }
                Err(_) => {
                    tracing::warn!("the leader's database session does not answer");
                    break;
                }
            }
        }
        on_lost.cancel();
        // Closing the session releases the lock.
        drop(session);
    });
    Ok(Some(Leadership::new(lost, release)))
}
