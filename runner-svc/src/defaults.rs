//! The one source of runner-svc's defaults: `ServeConfig::default()`, `MailboxConfig::default()`,
//! `RetentionConfig::default()` and the `runner-svc serve` flags all read these, so tests run
//! the service users run.

use std::time::Duration;

/// Jobs the in-process pool works on at once (`--workers`). Each has at most one claim or ack
/// in a commit batch, so the pool bounds how many commits share one transaction and one flush:
/// 32 measured ~1.3× the durable mailbox cycles of 16 on this project's 2-core machine
/// (BENCHMARKS.md), with the full suspend/resume cycle no slower.
pub const POOL_SIZE: usize = 32;

/// How long a claim holds its job without an extension (`--lease-ms`).
pub const LEASE: Duration = Duration::from_secs(30);

/// Attempts of a job before it is dead-lettered, unless its request says (`--max-attempts`).
pub const MAX_ATTEMPTS: u32 = 5;

/// Backoff before the first retry; it doubles per attempt up to [`MAX_BACKOFF`].
pub const BASE_BACKOFF: Duration = Duration::from_millis(200);

/// The longest backoff between two attempts of a job.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Page-cache bound of the embedded store, in MiB (`--cache-mb`).
pub const CACHE_MB: u64 = 64;

/// Where the embedded store lives (`--data-dir`).
pub const DATA_DIR: &str = "data/runner";

/// Keep events every durable subscriber has acked this long (`--event-retention-acked-ms`).
pub const EVENTS_ACKED_RETENTION: Duration = Duration::from_secs(3600);

/// Drop events older than this even if a subscriber has not acked them
/// (`--event-retention-max-ms`).
pub const EVENTS_MAX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Keep finished runs and final jobs this long (`--finished-retention-ms`).
pub const FINISHED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How often retention runs (`--compact-interval-ms`).
pub const COMPACT_INTERVAL: Duration = Duration::from_secs(60);

/// How long shutdown waits for in-flight work before giving up.
pub const DRAIN: Duration = Duration::from_secs(10);

/// How long health says NOT_SERVING before shutdown closes anything (`--drain-grace-ms`).
pub const DRAIN_GRACE: Duration = Duration::ZERO;

/// A stream subscriber whose buffer stays full this long is dropped
/// (`--stream-lag-timeout-ms`).
pub const STREAM_LAG_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests handled at once before new ones are shed (`--max-in-flight`).
pub const MAX_IN_FLIGHT: usize = arbor_shared::limits::DEFAULT_MAX_IN_FLIGHT;

/// A duration as the whole milliseconds the `*-ms` flags take.
pub const fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}
