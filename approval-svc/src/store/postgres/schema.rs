//! The approval store's tables in PostgreSQL, as embedded migrations (oldest first; a released
//! migration is never edited, changes are new ones).
//!
//! An approval is one row: the record itself as JSON text (what `GetApproval` answers) and, next
//! to it, the columns the service looks things up by, each kept in step with the record by the
//! same statement that writes it. Partial indexes hold only what a loop reads: the PENDING
//! approvals (the count and the deadline timer), the decisions awaiting delivery (the outbox)
//! and the final ones (retention), and, by run, the ones that a run's end may still cancel.

use arbor_shared::postgres::Schema;

pub const SCHEMA: Schema = Schema {
    component: "approval",
    migrations: &[V1, V2, V3, super::webhooks::MIGRATION, V5],
};

const V1: &str = "
CREATE TABLE approval_records (
    request_id text PRIMARY KEY,
    run_id text NOT NULL,
    state text NOT NULL,
    created_at_ms bigint NOT NULL,
    arrival bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    deadline_ms bigint NOT NULL,
    awaiting_delivery boolean NOT NULL,
    record jsonb NOT NULL
);
CREATE INDEX approval_records_by_created ON approval_records (created_at_ms, arrival);
CREATE INDEX approval_records_by_state ON approval_records (state, created_at_ms, arrival);
CREATE INDEX approval_records_by_run ON approval_records (run_id);
CREATE INDEX approval_records_pending ON approval_records (request_id)
    WHERE state = 'PENDING';
CREATE INDEX approval_records_deadlines ON approval_records (deadline_ms, request_id)
    WHERE state = 'PENDING' AND deadline_ms > 0;
CREATE INDEX approval_records_outbox ON approval_records (arrival)
    WHERE awaiting_delivery;
CREATE INDEX approval_records_final ON approval_records (updated_at_ms)
    WHERE state IN ('PRUNED', 'CANCELLED');
CREATE SEQUENCE approval_arrivals;

CREATE TABLE approval_audit (
    id bigint PRIMARY KEY,
    request_id text NOT NULL,
    run_id text NOT NULL,
    time_ms bigint NOT NULL,
    action text NOT NULL,
    entry jsonb NOT NULL
);
CREATE INDEX approval_audit_by_request ON approval_audit (request_id, id);
CREATE INDEX approval_audit_by_run ON approval_audit (run_id, id);
CREATE SEQUENCE approval_audit_ids;

CREATE TABLE approval_meta (
    key text PRIMARY KEY,
    value bigint NOT NULL
);

CREATE TABLE approval_traces (
    request_id text PRIMARY KEY,
    traceparent text NOT NULL
);
";

/// The approvals a run's end may still cancel, by run, in the order they are locked in. Without
/// it, that lookup (once for every run that ends) could be planned as the run index ANDed with
/// the state index, which reads every entry the state index ever held for those states, dead
/// ones included: a cost that grows with the history until a vacuum.
const V2: &str = "
CREATE INDEX approval_records_open_by_run ON approval_records (run_id, request_id)
    WHERE state IN ('PENDING', 'RESOLVED', 'EXPIRED');
";

/// The record and the audit entry as the JSON text the service wrote, no longer `jsonb`: a
/// `jsonb` string cannot hold U+0000, so a title, a context value or a decision's reason with a
/// NUL character in it failed its write (and a request the runner had already suspended on
/// could never be stored). Text keeps every character, and the server no longer parses each
/// record it is given. An older binary still writes here during a rolling upgrade: its
/// `jsonb` values are assigned to `text` by PostgreSQL's I/O conversion, and its `::text` reads
/// are no-ops. The change rewrites both tables once, holding them locked while it does.
const V3: &str = "
ALTER TABLE approval_records ALTER COLUMN record TYPE text USING record::text;
ALTER TABLE approval_audit ALTER COLUMN entry TYPE text USING entry::text;
";

/// Delegations (approval governance): few rows, each the record as JSON text.
const V5: &str = "
CREATE TABLE approval_delegations (
    id text PRIMARY KEY,
    record text NOT NULL
);
";
