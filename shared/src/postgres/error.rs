//! What can go wrong with the database, sorted into what a caller does about it: try again
//! (a conflict), wait (the server is unreachable), or stop (misconfigured, failed).

use std::time::Duration;

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

/// What went wrong talking to PostgreSQL.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DbError {
    /// The database cannot be reached (down, restarting, network): retry later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A serialisation failure or deadlock: the transaction may be run again.
    #[error("transaction conflict: {0}")]
    Conflict(String),
    /// The schema in the database was written by a newer release.
    #[error(
        "the database's {component} schema is at version {found}, newer than this binary's \
         {known}: run a release that knows it"
    )]
    SchemaTooNew {
        component: &'static str,
        found: i32,
        known: i32,
    },
    /// The server refused this service's login or database for good (a wrong password, a
    /// missing role or database): waiting will not change it, a person has to.
    #[error("{0}")]
    Misconfigured(String),
    #[error("database error: {0}")]
    Failed(String),
}

/// How long [`Database::open`] waits for a database it cannot open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// Waits this long for a server that cannot be reached (refused connections, timeouts, a
    /// server starting or shutting down); fails at once when the server refuses the login or
    /// the database, or holds a newer schema.
    Reachable(Duration),
    /// Waits for as long as it takes, whatever the error: for deployments that start the
    /// services before their database, role or password is in place.
    Always,
}

impl DbError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict(_))
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        let text = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        };
        match e.code() {
            Some(c) if misconfigured_state(c) => Self::Misconfigured(misconfigured(c, &text)),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE => Self::Conflict(text),
            Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED => Self::Conflict(text),
            Some(c) if *c == SqlState::UNIQUE_VIOLATION => Self::Conflict(text),
            Some(c) if unreachable_state(c) => Self::Unavailable(text),
            Some(_) => Self::Failed(text),
            // No SQLSTATE: the connection itself failed or closed.
            None => Self::Unavailable(text),
        }
    }
}

/// SQLSTATEs of a login the server refuses for good: a wrong password (28P01), a role that does
/// not exist or may not log in, or no `pg_hba.conf` entry for it (28000), a database that does
/// not exist (3D000).
pub(super) fn misconfigured_state(c: &SqlState) -> bool {
    *c == SqlState::INVALID_PASSWORD
        || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        || *c == SqlState::INVALID_CATALOG_NAME
}

/// What a person reads of a refused login: what PostgreSQL said, and what to look at.
pub(super) fn misconfigured(c: &SqlState, said: &str) -> String {
    let what = match *c == SqlState::INVALID_CATALOG_NAME {
        true => "the database in the store URL does not exist",
        false => "PostgreSQL refused the login of the store URL (check its user and password)",
    };
    format!("{what}: {said}")
}

/// SQLSTATEs that mean the server is going away or not taking connections.
pub(super) fn unreachable_state(c: &SqlState) -> bool {
    c.code().starts_with("08")
        || *c == SqlState::ADMIN_SHUTDOWN
        || *c == SqlState::CRASH_SHUTDOWN
        || *c == SqlState::CANNOT_CONNECT_NOW
        || *c == SqlState::TOO_MANY_CONNECTIONS
        || *c == SqlState::READ_ONLY_SQL_TRANSACTION
}

impl From<PoolError> for DbError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Backend(e) => match DbError::from(e) {
                DbError::Failed(t) => DbError::Unavailable(t),
                other => other,
            },
            other => Self::Unavailable(other.to_string()),
        }
    }
}
