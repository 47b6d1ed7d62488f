//! End-to-end harness: builds and starts the real `runner-svc` and `approval-svc` binaries on
//! free ports with fresh data dirs, kills and restarts them, and gives tests gRPC clients.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod auth;
pub mod bench;
pub mod chaos;
pub mod clients;
pub mod deploy;
pub mod flow;
pub mod otlp;
pub mod process;
pub mod scrape;
pub mod secured;
pub mod snapshot;
pub mod tools;

use std::time::Duration;

pub use arbor_shared::testing::eventually;
pub use arbor_testkit::proxy;

pub use process::{Binaries, Cluster, Profile, Service, ServiceKind};

/// The demo tree of DESIGN §1a (gate around a ledger tool, then a user input).
pub fn demo_tree() -> String {
    include_str!("../../deploy/demo/deploy-service.json").to_string()
}

/// A tree with one approval gate around a ledger append; `on_reject` is `failure` or
/// `success_skip`.
pub fn gate_tree(id: &str, on_reject: &str) -> String {
    serde_json::json!({
        "id": id, "version": 1,
        "root": {"type": "sequence", "name": "main", "children": [
            {"type": "set", "name": "plan", "key": "plan", "value": {"service": "billing", "replicas": 3}},
            {"type": "approval", "name": "gate", "phase": "before", "on_reject": on_reject,
             "title": "Ship it?", "context": ["plan"],
             "child": {"type": "tool", "name": "ship", "tool": "ledger.append",
                       "args": {"entry": {"$ref": "plan"}}, "output": "receipt"}},
            {"type": "set", "name": "done", "key": "done", "value": true}
        ]}
    })
    .to_string()
}

/// Seconds to wait for anything in an end-to-end test before failing.
pub const WAIT: Duration = Duration::from_secs(30);
