//! Arbor's shared crate: the generated gRPC code, JSON/proto conversions, the one way errors
//! become statuses, authentication, what both services' embedded backends share (group commit,
//! fsync, damage detection), the serving plumbing both binaries use, Prometheus metrics, W3C trace context and
//! its OpenTelemetry export.

pub mod auth;
pub mod convert;
pub mod digest;
pub mod domain;
pub mod json;
pub mod limits;
pub mod metrics;
pub mod otel;
pub mod page;
pub mod postgres;
pub mod procstat;
pub mod proto;
pub mod server;
pub mod sled_backend;
pub mod status;
pub mod testing;
pub mod time;
pub mod tls;
pub mod trace;
