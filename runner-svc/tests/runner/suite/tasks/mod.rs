//! Task workers over gRPC, against a runner served on an ephemeral port, with a worker written
//! here over `WorkerServiceClient`: StreamTasks' flow control, fencing by lease token, lease
//! expiry and retries, business errors, cancellation, `external` nodes as tasks, a runner restart
//! under leased and queued tasks, exactly-once completion, PollTasks' long poll, ReleaseTask and
//! ListTasks' page sizes. Part of the storage conformance suite: every case runs on each backend.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod cancellation;
pub mod dispatch;
pub mod external;
pub mod failures;
pub mod fencing;
pub mod release;
pub mod restart;
mod rig;
