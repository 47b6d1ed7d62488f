//! Arbor's shared crate: the generated gRPC code, JSON/proto conversions, the one way errors
//! become statuses, authentication, group commit for sled, and the serving plumbing both
//! binaries use.

pub mod auth;
pub mod convert;
pub mod domain;
pub mod durability;
pub mod json;
pub mod limits;
pub mod proto;
pub mod server;
pub mod status;
pub mod time;
