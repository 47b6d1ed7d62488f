//! The runner's table in PostgreSQL: its migrations, the session settings every connection
//! runs with, how each kind of transaction begins, and the statements the backend runs.

use std::time::Duration;

use arbor_shared::postgres::Schema;

use super::super::Sequence;

/// The runner's schema, oldest migration first. Never edit a released migration.
pub(super) const SCHEMA: Schema = Schema {
    component: "runner",
    migrations: &[
        "CREATE TABLE runner_kv (
             t smallint NOT NULL,
             k bytea NOT NULL,
             v bytea NOT NULL,
             PRIMARY KEY (t, k)
         );
         CREATE SEQUENCE runner_ids INCREMENT BY 64;",
        // Locked by every batched commit before it reads anything (see `WRITER_BEGIN`).
        "CREATE TABLE runner_writer ();",
        // Room on each page for a row's next version: a run's record, checkpoint and job are
        // rewritten a few times soon after they are written, and a new version that fits on
        // its row's page is heap-only (no new index entry; pruned in place).
        "ALTER TABLE runner_kv SET (fillfactor = 80);",
        // The ledger's `seq` (`Sequence::Ledger`), taken with `nextval` instead of a row every
        // append rewrote. It goes on from that row (`meta` = table 6, `ledger_seq`, the last
        // `seq` written, 8 bytes big-endian) where a ledger has one.
        "CREATE SEQUENCE runner_ledger_seq;
         SELECT setval('runner_ledger_seq', last)
             FROM (SELECT ('x' || encode(v, 'hex'))::bit(64)::bigint AS last
                       FROM runner_kv
                       WHERE t = 6 AND k = 'ledger_seq'::bytea AND length(v) = 8) AS row
             WHERE last > 0;",
    ],
};

/// How a durable batch begins: the lock on `runner_writer` is taken before the transaction's
/// snapshot (a `LOCK` statement takes none), so the durable batches of all replicas take turns
/// and each sees every one before it (see the module's documentation for why `REPEATABLE READ`).
pub(super) const WRITER_BEGIN: &str =
    "BEGIN ISOLATION LEVEL REPEATABLE READ; LOCK TABLE runner_writer IN EXCLUSIVE MODE";

/// How a durable batch that holds a [`Commit::Serializable`] body begins again after a
/// conflict; its first try, begun as `WRITER_BEGIN`, is raised to `SERIALIZABLE` by
/// `TO_SERIALIZABLE` before its first read (the `LOCK` took no snapshot, so it may).
pub(super) const WRITER_BEGIN_SERIALIZABLE: &str =
    "BEGIN ISOLATION LEVEL SERIALIZABLE; LOCK TABLE runner_writer IN EXCLUSIVE MODE";

/// Raises a durable batch's transaction, begun and holding the writer lock, to `SERIALIZABLE`
/// before its first read: for a batch that holds a [`Commit::Serializable`] body (an interrupt
/// of a thread). That body reads a row a concurrent claim writes (the thread's claimed job)
/// and writes a row the claim reads (the thread's generation), and no row is written by both,
/// so at `REPEATABLE READ` both would commit, each blind to the other. Only predicate locks,
/// which PostgreSQL takes at `SERIALIZABLE` alone, refuse the pair. One more round trip, for
/// the batches that need it.
pub(super) const TO_SERIALIZABLE: &str = "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE";

/// How any other transaction begins.
pub(super) const BEGIN: &str = "BEGIN ISOLATION LEVEL SERIALIZABLE";

/// How a commit that need not be durable begins (a claim: one lost in a crash leaves its job
/// queued, as if never claimed): it answers without waiting for the WAL flush.
pub(super) const ASYNC_BEGIN: &str =
    "BEGIN ISOLATION LEVEL SERIALIZABLE; SET LOCAL synchronous_commit TO off";

/// Rows a counter may be spread over beyond its own: a transaction outside the batched
/// commit adds to one of them, picked at random, so that it rarely moves the row a batch (or
/// another such transaction) moves at the same time, which under `SERIALIZABLE` would fail
/// one of the two. `Backend::counter` sums them.
pub(super) const STRIPES: u8 = 16;

/// Every statement here is written for a generic plan: its index conditions are on its
/// parameters alone (a bounded and an unbounded range are two statements, never one with
/// `$n IS NULL OR`, whose generic plan would walk the rest of the table). A statement is
/// planned once per connection, not on every call as PostgreSQL would do with the batched
/// lookup (it plans a custom plan whenever the generic plan's guessed row counts look
/// costlier, and an `unnest` of a parameter guesses 100 rows).
///
/// Bitmap scans are off. A connection keeps the generic plan it made at a statement's first
/// use, and for a table that was small then (a fresh database: every replica's first minutes,
/// every benchmark) PostgreSQL planned a delete or a claim of a few keys (`k = ANY($2)`) as a
/// bitmap scan of the whole table `t`, filtered by key. That plan stayed while the table grew,
/// until an analyze happened to invalidate it: a delete of three queue entries read every
/// queued job. Every statement here reads rows by their key or a key range, which an index
/// scan does in key order; without bitmap scans, that is the plan at any size.
pub const SESSION: &[(&str, &str)] = &[
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_bitmapscan", "off"),
];

/// Rows the first round trip of a scan fetches: most scans stop early (a claim looks at the
/// first few queued jobs), so pages start small and grow to `SCAN_PAGE`.
pub(super) const FIRST_PAGE: i64 = 16;

/// Rows fetched per round trip of a long scan.
pub(super) const SCAN_PAGE: i64 = 512;

/// Ids a replica takes from the sequence at once (the sequence's increment).
pub(super) const ID_BLOCK: u64 = 64;

/// The PostgreSQL sequence of each of the store's sequences.
pub(super) fn sequence_name(sequence: Sequence) -> &'static str {
    match sequence {
        Sequence::Ledger => "runner_ledger_seq",
    }
}

/// Raises the sequence `{0}` so that `nextval` answers above `{1}`, as one transaction (a
/// simple query of several statements is one): `ALTER SEQUENCE` takes a lock that blocks
/// `nextval` and `setval` until the transaction ends, so no value is taken between the look and
/// the `setval`, which would then be taken again.
pub(super) fn raise_sequence(name: &str, at_least: u64) -> String {
    format!(
        "ALTER SEQUENCE {name} NO CYCLE;
         SELECT setval('{name}', {at_least}) FROM {name}
             WHERE last_value < {at_least} OR (NOT is_called AND last_value = {at_least})"
    )
}

/// How long start-up waits for an unreachable database.
pub const OPEN_PATIENCE: Duration = Duration::from_secs(30);

/// The lookups of [`read_many`]: the keys `$2` of the tables `$1`, each numbered `u.i` from 1,
/// with its value `r.v` (a key that is absent has no row).
macro_rules! keys_looked_up {
    () => {
        "FROM unnest($1::smallint[], $2::bytea[]) WITH ORDINALITY AS u(t, k, i) \
         CROSS JOIN LATERAL \
         (SELECT v FROM runner_kv WHERE runner_kv.t = u.t AND runner_kv.k = u.k LIMIT 1) r"
    };
}

pub(super) use keys_looked_up;

/// The keys `$2` of the tables `$1` read as [`read_many`] reads them (numbered from 1, with no
/// key), and every entry of table `$3` from `$4` up to `$5` (excluded), numbered 0, in one
/// statement and one snapshot.
pub(super) const READ_MANY_AND_RANGE: &str = concat!(
    "SELECT u.i, NULL::bytea, r.v ",
    keys_looked_up!(),
    " UNION ALL SELECT 0, k, v FROM runner_kv WHERE t = $3 AND k >= $4 AND k < $5"
);

/// The rows of a counter: the key `$2` of table `$1` and its stripes, from `$3` up to `$4`
/// (excluded). Two index scans: one scan cannot take `k = $2 OR (k >= $3 AND k < $4)` as its
/// condition, and without bitmap scans (see [`SESSION`]) the `OR` would walk the whole table.
pub const COUNTER_ROWS: &str = "SELECT v FROM runner_kv WHERE t = $1 AND k = $2 \
     UNION ALL SELECT v FROM runner_kv WHERE t = $1 AND k >= $3 AND k < $4";

/// Deletes the keys `$2` of table `$1`.
pub const DELETE_KEYS: &str = "DELETE FROM runner_kv WHERE t = $1 AND k = ANY($2)";

/// Of the keys `$2` of table `$1`, the first `$3` that no other transaction holds, locked.
pub const LOCK_FIRST: &str = "SELECT k, v FROM runner_kv WHERE t = $1 AND k = ANY($2) \
     ORDER BY k LIMIT $3 FOR UPDATE SKIP LOCKED";

/// One page of the keys of table `$1` from `$2` up to `$3` (excluded), `$4` rows at most.
pub const SCAN_RANGE: &str =
    "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 AND k < $3 ORDER BY k LIMIT $4";

/// [`SCAN_RANGE`] without an upper bound, `$3` rows at most.
pub(super) const SCAN_FROM: &str =
    "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 ORDER BY k LIMIT $3";

/// The last key of table `$1` from `$2` up to `$3` (excluded).
pub const LAST_IN_RANGE: &str =
    "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 AND k < $3 ORDER BY k DESC LIMIT 1";

/// [`LAST_IN_RANGE`] without an upper bound.
pub(super) const LAST_FROM: &str =
    "SELECT k, v FROM runner_kv WHERE t = $1 AND k >= $2 ORDER BY k DESC LIMIT 1";
