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
    sync_blobs(dir, blobs_since)?;
    Ok(())
}

/// `fsync`s the blob files modified since `since` (with two seconds of slack for coarse
/// timestamps) and, if there were any, their directory.
fn sync_blobs(dir: &Path, since: SystemTime) -> std::io::Result<()> {
    let sync = |path: &Path| std::fs::File::open(path).and_then(|f| f.sync_all());
    let blobs = dir.join("blobs");
    let after = since
        .checked_sub(BLOB_SLACK)
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

/// How much older than the last sync a blob file's timestamp may be and still be synced again.
const BLOB_SLACK: Duration = Duration::from_secs(2);

/// [`flush_and_sync`] again and again, each time syncing only the blob files written since the
/// previous call began. It keeps the log file open, and reads the blob directory only when its
/// modification time says a blob file may have been written since (sled writes each blob as a
/// new file, which changes the directory): a flush costs sled's flush and one `fdatasync`, not
/// an open, a directory read and a close besides.
#[derive(Debug)]
pub struct Syncer {
    db: sled::Db,
    dir: PathBuf,
    since: SystemTime,
    log: Option<std::fs::File>,
}

impl Syncer {
    pub fn new(db: sled::Db, dir: PathBuf) -> Self {
        Self {
            db,
            dir,
            since: SystemTime::UNIX_EPOCH,
            log: None,
        }
    }

    pub fn sync(&mut self) -> Result<(), sled::Error> {
        let started = SystemTime::now();
        self.db.flush()?;
        let log = match &self.log {
            Some(log) => log,
            None => self.log.insert(std::fs::File::open(self.dir.join("db"))?),
        };
        log.sync_data()?;
        let after = self
            .since
            .checked_sub(BLOB_SLACK)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let blobs_changed = std::fs::metadata(self.dir.join("blobs"))
            .and_then(|m| m.modified())
            .map_or_else(|e| e.kind() != std::io::ErrorKind::NotFound, |m| m >= after);
        if blobs_changed {
            sync_blobs(&self.dir, self.since)?;
        }
        self.since = started;
        Ok(())
    }
}
