//! The runner's storage conformance suite on PostgreSQL: the same test files that run on sled,
//! compiled once more into this binary, in which `common::open_store` and `common::store_url`
//! give a PostgreSQL store (a schema per test directory, on the throwaway cluster that
//! `arbor-testkit` starts from Debian's `postgresql` package).

// Each suite file declares `mod common` for its own binary; here they share one binary, and the
// copies are the same helpers.
#![allow(clippy::duplicate_mod)]

#[path = "handoff.rs"]
mod handoff;
#[path = "interrupt.rs"]
mod interrupt;
#[path = "lease_takeover.rs"]
mod lease_takeover;
#[path = "mailbox_concurrency.rs"]
mod mailbox_concurrency;
#[path = "mailbox_model.rs"]
mod mailbox_model;
#[path = "retention.rs"]
mod retention;
#[path = "slow_subscriber.rs"]
mod slow_subscriber;
#[path = "state_counts.rs"]
mod state_counts;
#[path = "store_races.rs"]
mod store_races;
#[path = "stream_reads.rs"]
mod stream_reads;
#[path = "tasks.rs"]
mod tasks;
