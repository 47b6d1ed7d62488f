//! Task workers over gRPC, against a runner served on an ephemeral port, with a worker written
//! here over `WorkerServiceClient`: StreamTasks' flow control, fencing by lease token, lease
//! expiry and retries, business errors, cancellation, `external` nodes as tasks, a runner restart
//! under leased and queued tasks, exactly-once completion, PollTasks' long poll, ReleaseTask and
//! ListTasks' page sizes. Part of the storage conformance suite: `tests/runner_postgres` runs the
//! same tests on PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

#[path = "tasks/cancellation.rs"]
mod cancellation;
#[path = "tasks/dispatch.rs"]
mod dispatch;
#[path = "tasks/external.rs"]
mod external;
#[path = "tasks/failures.rs"]
mod failures;
#[path = "tasks/fencing.rs"]
mod fencing;
#[path = "tasks/release.rs"]
mod release;
#[path = "tasks/restart.rs"]
mod restart;
#[path = "tasks/rig.rs"]
mod rig;
