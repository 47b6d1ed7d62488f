//! What both services' sled backends share: the settings they open their database with, the
//! flush that makes a commit durable, group and batched commit ([`commit`]) and damage detection
//! at start-up ([`integrity`]).
//!
//! The log segment size matters for disk use. sled 0.34 reuses a segment only after every page
//! written to it has moved on; with small segments (its default is 512 KiB) and a group-commit
//! flush after nearly every transaction, segments that retention has emptied are hardly ever
//! reclaimed, and the `db` file grows with every write even though the live data stays the same
//! size. With 8 MiB segments the file levels off at a few times the live data (measured by the
//! soak test and by a synthetic workload of the runner's shape). Values larger than a quarter of
//! a segment (2 MiB) go to blob files.

pub mod commit;
pub mod integrity;

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// Log segment size of the databases.
pub const SEGMENT_SIZE: usize = 8 << 20;

/// A sled configuration for the database in `dir`: [`SEGMENT_SIZE`] segments and a page cache of
/// at most `cache_bytes`.
pub fn sled_config(dir: &Path, cache_bytes: u64) -> sled::Config {
    sled::Config::new()
        .path(dir)
        .cache_capacity(cache_bytes)
        .segment_size(SEGMENT_SIZE)
}

/// Puts everything committed to the database in `dir` so far on the device.
///
/// sled's own `flush` writes its log buffers out with `sync_file_range`, which waits for the
/// data pages but neither for the file's size nor for the device's write cache, and it writes
/// values too big for the log (over a quarter of a segment) to blob files that it never syncs.
/// So after `flush` the log file is `fdatasync`ed (its data and its size, and the device's
/// cache flushed), and the blob files modified since `blobs_since` (with two seconds of slack
/// for coarse timestamps) and their directory are `fsync`ed.
pub fn flush_and_sync(
    db: &sled::Db,
    dir: &Path,
    blobs_since: SystemTime,
) -> Result<(), sled::Error> {
    db.flush()?;
    std::fs::File::open(dir.join("db")).and_then(|f| f.sync_data())?;
    let sync = |path: &Path| std::fs::File::open(path).and_then(|f| f.sync_all());
    let blobs = dir.join("blobs");
    let after = blobs_since
        .checked_sub(Duration::from_secs(2))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let Ok(entries) = std::fs::read_dir(&blobs) else {
        return Ok(());
    };
    let mut synced = false;
    for entry in entries.flatten() {
        let recent = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|m| m >= after);
        if recent {
            match sync(&entry.path()) {
                // sled removed it meanwhile (its value was replaced or deleted).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
            synced = true;
        }
    }
    // The directory entries of the new files.
    if synced {
        sync(&blobs)?;
    }
    Ok(())
}

/// [`flush_and_sync`] again and again, each time syncing only the blob files written since the
/// previous call began.
#[derive(Debug)]
pub struct Syncer {
    db: sled::Db,
    dir: PathBuf,
    since: SystemTime,
}

impl Syncer {
    pub fn new(db: sled::Db, dir: PathBuf) -> Self {
        Self {
            db,
            dir,
            since: SystemTime::UNIX_EPOCH,
        }
    }

    pub fn sync(&mut self) -> Result<(), sled::Error> {
        let started = SystemTime::now();
        flush_and_sync(&self.db, &self.dir, self.since)?;
        self.since = started;
        Ok(())
    }
}
