//! runner-svc's integration tests, one binary: the engine through its public API, the gRPC
//! service on ephemeral ports, and the storage conformance suite on sled (the same suite runs
//! on PostgreSQL in `tests/runner_postgres`).

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// The storage conformance suite of this binary runs on sled (see `common::open_store`).
pub const ON_POSTGRES: bool = false;

mod common;
mod docs_trees;
mod engine_api;
mod engine_replay;
mod fuzz_corpus;
mod handoff;
mod interrupt;
mod lease_takeover;
mod ledger_seq;
mod mailbox_concurrency;
mod mailbox_model;
mod postgres_plans;
mod postgres_races;
mod postgres_reads;
mod retention;
mod run_end_withdraws;
mod slow_subscriber;
mod slow_tool;
mod state_counts;
mod store_races;
mod stream_reads;
mod tasks;
mod verify;
