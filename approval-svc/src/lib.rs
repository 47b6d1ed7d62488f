//! Arbor's approval service: it subscribes to the runner's event log, keeps every approval in a
//! durable store, applies the approval policy, lets people and bots decide, and delivers each
//! decision back to the runner exactly once.

pub mod approvals;
pub mod config;
pub mod convert;
pub mod deadline;
pub mod error;
pub mod governance;
pub mod grpc;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod model;
pub mod outbox;
pub mod policy;
pub mod ratelog;
pub mod retention;
pub mod runner;
pub mod server;
pub mod store;
pub mod voting;
pub mod web;
pub mod webhooks;

pub use config::{ServeConfig, Tuning};
pub use error::Error;
pub use server::{ServeError, run, run_with_web};
pub use store::ApprovalStore;
