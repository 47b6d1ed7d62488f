//! The sled settings both services open their database with.
//!
//! The log segment size matters for disk use. sled 0.34 reuses a segment only after every page
//! written to it has moved on; with small segments (its default is 512 KiB) and a group-commit
//! flush after nearly every transaction, segments that retention has emptied are hardly ever
//! reclaimed, and the `db` file grows with every write even though the live data stays the same
//! size. With 8 MiB segments the file levels off at a few times the live data (measured by the
//! soak test and by a synthetic workload of the runner's shape). Values larger than a quarter of
//! a segment (2 MiB) go to blob files.

use std::path::Path;

/// Log segment size of new databases.
pub const SEGMENT_SIZE: usize = 8 << 20;

/// The segment size to open the database in `dir` with: what an existing database was created
/// with (sled refuses to open it with another), [`SEGMENT_SIZE`] for a new one.
pub fn segment_size(dir: &Path) -> usize {
    std::fs::read(dir.join("conf"))
        .ok()
        .and_then(|bytes| {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            text.lines()
                .find_map(|l| l.strip_prefix("segment_size: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(SEGMENT_SIZE)
}

/// A sled configuration for the database in `dir`: its segment size and a page cache of at most
/// `cache_bytes`.
pub fn sled_config(dir: &Path, cache_bytes: u64) -> sled::Config {
    sled::Config::new()
        .path(dir)
        .cache_capacity(cache_bytes)
        .segment_size(segment_size(dir))
}

/// Writes out sled's log buffers and `fsync`s its log file. sled's `flush` alone does not put
/// anything on the device when the database was opened with `sync_log_writes(false)` (and only
/// `sync_file_range`s otherwise).
pub fn flush_and_sync(db: &sled::Db, dir: &Path) -> Result<(), sled::Error> {
    db.flush()?;
    std::fs::File::open(dir.join("db"))
        .and_then(|f| f.sync_all())
        .map_err(sled::Error::Io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_databases_get_big_segments_old_ones_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(segment_size(dir.path()), SEGMENT_SIZE);
        let old = dir.path().join("old");
        drop(sled::Config::new().path(&old).open().unwrap());
        assert_eq!(segment_size(&old), 512 * 1024);
        drop(sled_config(&old, 1 << 20).open().unwrap());
        let new = dir.path().join("new");
        drop(sled_config(&new, 1 << 20).open().unwrap());
        assert_eq!(segment_size(&new), SEGMENT_SIZE);
        drop(sled_config(&new, 1 << 20).open().unwrap());
    }
}
