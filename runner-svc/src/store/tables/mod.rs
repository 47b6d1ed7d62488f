//! Key layouts of the runner's tables ([`crate::store::T`]) in one typed place, one module per
//! table family, with the stored records the layers below `runs` share (as restate's storage API
//! keeps a table's keys and values together). Every key is built and parsed here; the bytes are
//! the on-disk format, so each module's tests pin a sample to its exact layout.
//!
//! | table | module |
//! |---|---|
//! | `trees` | [`trees`] |
//! | `runs`, `thread_runs`, `checkpoints`, `inbox` | [`runs`] |
//! | `jobs`, `queue`, `active`, `dedupe`, `mailboxes`, `mailbox_jobs` | [`jobs`] |
//! | `finished` | [`finished`] |
//! | `events`, `meta` | [`meta`] |
//! | `tasks`, `task_queue`, `task_leases` | [`tasks`] |
//!
//! Ids are validated to contain no NUL, so the `\0` separator keeps prefixes unambiguous; numbers
//! are big-endian so keys sort by them.

pub mod finished;
pub mod jobs;
pub mod meta;
pub mod runs;
pub mod tasks;
pub mod trees;
