//! Leadership among the replicas on one database: a session-level advisory lock, taken with
//! `pg_try_advisory_lock` on a connection of its own that is taken out of the pool and held for
//! as long as the leadership lasts. The lock goes when its session goes: released by the leader
//! on purpose (the connection is closed), or by PostgreSQL when the leader's process or its
//! connection dies. The leader checks its session every [`CHECK_EVERY`] and gives the
//! leadership up when the check fails or takes longer than [`CHECK_TIMEOUT`], so a leader cut
//! off from the database stops acting as one.
//!
//! The leader's session is named `arbor-approval-leader <replica>` (its `application_name`), so
//! any replica, and an operator, can tell from `pg_stat_activity` which replica leads.

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

/// Takes the lock if no other session holds it; the session then names `replica` as the leader.
pub async fn try_lead(db: &Database, replica: Option<&str>) -> Result<Option<Leadership>> {
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
    let name = match replica {
        Some(replica) => format!("{LEADER_APPLICATION} {replica}"),
        None => LEADER_APPLICATION.to_string(),
    };
    // A parameter, not SQL text: the name is the operator's to choose.
    if let Err(e) = session
        .query_one("SELECT set_config('application_name', $1, false)", &[&name])
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

/// The replica whose session holds the leader's lock now, by the name it gave; `None` when no
/// session of this database holds it (or its leader gave no name).
pub async fn leader(db: &Database) -> Result<Option<String>> {
    let client = db.client().await?;
    let prefix = format!("{LEADER_APPLICATION} ");
    let row = client
        .query_opt(
            "SELECT a.application_name FROM pg_stat_activity a \
             JOIN pg_locks l ON l.pid = a.pid \
             WHERE a.datname = current_database() AND l.database = a.datid \
             AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
             AND (l.classid::bigint << 32) + l.objid::bigint = $1 \
             AND starts_with(a.application_name, $2)",
            &[&LEADER_LOCK, &prefix],
        )
        .await
        .map_err(db_error)?;
    Ok(row.and_then(|r| {
        r.get::<_, String>(0)
            .strip_prefix(&prefix)
            .map(str::to_string)
    }))
}
