//! The end-to-end suite: the real `runner-svc` and `approval-svc` binaries as processes, on sled
//! and on a throwaway PostgreSQL, driven over gRPC, the CLI and the client helpers — one test
//! binary, a module per concern.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod approval_loop;
mod auth;
mod bad_input;
mod chaos;
mod chaos_postgres;
mod chaos_workers;
mod clients;
mod corrupt_store;
mod database_stall;
mod decisions;
mod docs;
mod governance;
mod inbox;
mod interaction;
mod manifests;
mod observability;
mod one_build;
mod otlp;
mod partition;
mod polyglot;
mod postgres_clock;
mod postgres_schema;
mod read_your_events;
mod replicas;
mod run_end_withdraws;
mod soak;
mod submit_crash;
mod tls;
mod webhooks;
mod workers;
