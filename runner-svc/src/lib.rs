//! Arbor's runner: ticks behaviour trees, checkpoints every run to sled, keeps the durable
//! mailbox of run requests and serves the durable, resumable event log over gRPC.

pub mod mailbox;
pub mod store;
