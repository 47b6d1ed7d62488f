//! approval-svc's integration tests, one binary: the gRPC API on ephemeral ports, the loop with a
//! runner, deadlines, retention, replicas, and the store conformance suite on sled and on
//! PostgreSQL.

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod conformance;
mod support;

mod api;
mod deadlines;
mod replicas_postgres;
mod retention;
mod runner_loop;
mod store_postgres;
mod store_sled;
mod web;
mod webhooks;
