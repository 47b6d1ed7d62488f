//! The runner's storage conformance suite on PostgreSQL: the suite files of `tests/runner` that
//! reach storage only through `store::Store`, compiled once more into this binary, in which
//! `common::open_store` and `common::store_url` give a PostgreSQL store (a schema per test
//! directory, on the throwaway cluster that `arbor-testkit` starts from Debian's `postgresql`
//! package).

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// The storage conformance suite of this binary runs on PostgreSQL (see `common::open_store`).
pub const ON_POSTGRES: bool = true;

#[path = "../runner/common/mod.rs"]
mod common;

#[path = "../runner/handoff.rs"]
mod handoff;
#[path = "../runner/interrupt.rs"]
mod interrupt;
#[path = "../runner/lease_takeover.rs"]
mod lease_takeover;
#[path = "../runner/mailbox_concurrency.rs"]
mod mailbox_concurrency;
#[path = "../runner/mailbox_model.rs"]
mod mailbox_model;
#[path = "../runner/retention.rs"]
mod retention;
#[path = "../runner/slow_subscriber.rs"]
mod slow_subscriber;
#[path = "../runner/state_counts.rs"]
mod state_counts;
#[path = "../runner/store_races.rs"]
mod store_races;
#[path = "../runner/stream_reads.rs"]
mod stream_reads;
#[path = "../runner/tasks.rs"]
mod tasks;
#[path = "../runner/verify.rs"]
mod verify;
