//! runner-svc's integration tests, one binary: the engine through its public API, the gRPC
//! service on ephemeral ports, PostgreSQL's own plans and races, and the storage conformance
//! suite (`suite/`), instantiated once on sled and once on PostgreSQL.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod answerers;
mod args_digest;
mod common;
mod docs_trees;
mod engine_api;
mod engine_replay;
mod fuzz_corpus;
mod ledger_seq;
mod postgres_plans;
mod postgres_races;
mod postgres_reads;
mod run_end_withdraws;
mod slow_tool;
mod suite;
