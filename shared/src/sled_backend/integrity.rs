//! Refusing to start on a damaged database. sled recovers from a damaged log by keeping the
//! longest valid prefix: a deleted, truncated or garbled `db` file opens as an empty or older
//! database, silently. So each service keeps a marker file next to its database naming the
//! store (an id also written inside the database) and a progress counter that only grows (the
//! runner's event seq, approval-svc's audit id), recorded only once that progress is durable.
//! At start-up the database must carry the marker's id and at least its progress, and every
//! value must be readable (which also reads every blob file); otherwise the service stops with
//! an error that says what is wrong.
//!
//! What it cannot see: loss of data made durable after the last record (the record interval),
//! and damage to a database whose marker file was lost too.

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The marker file in the data directory.
pub const MARKER_FILE: &str = "arbor-integrity.toml";

/// Key of the store id in the database's default tree.
const STORE_ID_KEY: &[u8] = b"arbor:store_id";

#[derive(Debug, thiserror::Error)]
pub enum IntegrityError {
    #[error(
        "the database in {dir} has lost its data: {marker} says it is store {store_id} with \
         {what} at {progress}, but the database is empty or is not that store (its files were \
         deleted, truncated or damaged). Restore the directory from a backup; to start over with \
         an empty database, move the directory away"
    )]
    Missing {
        dir: String,
        marker: String,
        store_id: String,
        what: &'static str,
        progress: u64,
    },
    #[error(
        "the database in {dir} is store {found}, but {marker} names store {expected}: the data \
         directory holds files of two different databases. Restore it from a backup"
    )]
    Mismatch {
        dir: String,
        marker: String,
        expected: String,
        found: String,
    },
    #[error(
        "the database in {dir} has lost durable data: its {what} is {found}, but {expected} was \
         durable before (recorded in {marker}); its files were truncated or damaged. Restore the \
         directory from a backup"
    )]
    Regressed {
        dir: String,
        marker: String,
        what: &'static str,
        expected: u64,
        found: u64,
    },
    #[error(
        "the database in {dir} is damaged: reading tree '{tree}' failed: {message}. Restore the \
         directory from a backup"
    )]
    Unreadable {
        dir: String,
        tree: String,
        message: String,
    },
    #[error(
        "the database file {path} is {problem}, but {marker} says the directory holds a \
         database: it was deleted or damaged. Restore the directory from a backup"
    )]
    FileDamaged {
        path: String,
        problem: &'static str,
        marker: String,
    },
    #[error("the database in {dir} is damaged: {message}. Restore the directory from a backup")]
    Inconsistent { dir: String, message: String },
    #[error("the integrity marker {path} is damaged ({message}); restore it from a backup")]
    BadMarker { path: String, message: String },
    #[error("cannot {action} the integrity marker {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("the database in {dir} cannot be read: {source}")]
    Storage { dir: String, source: sled::Error },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Marker {
    store_id: String,
    /// The largest progress value known to be durable in the database.
    progress: u64,
}

/// The checked marker of an open database; records progress as it becomes durable.
#[derive(Debug)]
pub struct Integrity {
    path: PathBuf,
    store_id: String,
    recorded: AtomicU64,
}

/// sled's own files, which it would silently recreate empty.
const SLED_FILES: [&str; 2] = ["conf", "db"];

impl Integrity {
    /// Checks the files of a database that has a marker, before sled opens it: sled would
    /// recreate a missing or emptied `conf` or `db` file and carry on with an empty database.
    pub fn precheck(dir: &Path) -> Result<(), IntegrityError> {
        let marker = dir.join(MARKER_FILE);
        if !marker.exists() {
            return Ok(());
        }
        for name in SLED_FILES {
            let path = dir.join(name);
            let problem = match std::fs::metadata(&path) {
                Ok(m) if m.len() == 0 => "empty",
                Ok(_) if name == "conf" && !looks_like_sled_conf(&path) => {
                    "damaged (not a sled configuration)"
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing",
                Err(e) => {
                    return Err(IntegrityError::Io {
                        action: "inspect the database file next to",
                        path: marker.display().to_string(),
                        source: e,
                    });
                }
            };
            return Err(IntegrityError::FileDamaged {
                path: path.display().to_string(),
                problem,
                marker: marker.display().to_string(),
            });
        }
        Ok(())
    }

    /// Checks the open database `db` in `dir` against its marker, before anything writes to it.
    /// `progress` is the database's current value of a counter that never decreases (`what`
    /// names it in errors). A database without a marker (new, or from a build without markers)
    /// gets one.
    pub fn check(
        dir: &Path,
        db: &sled::Db,
        what: &'static str,
        progress: u64,
    ) -> Result<Integrity, IntegrityError> {
        verify_readable(dir, db)?;
        Self::check_marker(dir, db, what, progress)
    }

    /// [`check`](Self::check) without reading every value: the store id and the progress only,
    /// so it takes the same time however much the database holds. A service that uses it runs
    /// [`verify_readable`] later (in the background).
    pub fn check_marker(
        dir: &Path,
        db: &sled::Db,
        what: &'static str,
        progress: u64,
    ) -> Result<Integrity, IntegrityError> {
        let path = dir.join(MARKER_FILE);
        let dir_s = dir.display().to_string();
        let storage = |source| IntegrityError::Storage {
            dir: dir_s.clone(),
            source,
        };
        let found = db
            .get(STORE_ID_KEY)
            .map_err(storage)?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let marker = read_marker(&path)?;
        let store_id = match (marker, found) {
            (Some(m), None) => {
                return Err(IntegrityError::Missing {
                    dir: dir_s,
                    marker: path.display().to_string(),
                    store_id: m.store_id,
                    what,
                    progress: m.progress,
                });
            }
            (Some(m), Some(found)) if found != m.store_id => {
                return Err(IntegrityError::Mismatch {
                    dir: dir_s,
                    marker: path.display().to_string(),
                    expected: m.store_id,
                    found,
                });
            }
            (Some(m), Some(_)) if progress < m.progress => {
                return Err(IntegrityError::Regressed {
                    dir: dir_s,
                    marker: path.display().to_string(),
                    what,
                    expected: m.progress,
                    found: progress,
                });
            }
            (Some(m), Some(_)) => m.store_id,
            (None, Some(found)) => {
                tracing::warn!(marker = %path.display(), "integrity marker missing; writing a new one");
                found
            }
            (None, None) => {
                let id = new_store_id(dir);
                db.insert(STORE_ID_KEY, id.as_bytes()).map_err(storage)?;
                // The id is on disk, and the new files are in the directory, before the marker
                // names it.
                crate::sled_backend::flush_and_sync(db, dir, std::time::SystemTime::UNIX_EPOCH)
                    .and_then(|()| Ok(std::fs::File::open(dir).and_then(|d| d.sync_all())?))
                    .map_err(storage)?;
                id
            }
        };
        let integrity = Integrity {
            path,
            store_id,
            recorded: AtomicU64::new(0),
        };
        integrity.write(progress)?;
        Ok(integrity)
    }

    /// Records `progress`, which the caller has made durable in the database first. Lower or
    /// equal values than the last record are ignored.
    pub fn record(&self, progress: u64) -> Result<(), IntegrityError> {
        if progress <= self.recorded.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.write(progress)
    }

    /// [`record`](Self::record) on a blocking thread: writing the marker takes two fsyncs, which
    /// must not stall an async worker thread (and every task queued behind it).
    pub async fn record_blocking(
        self: std::sync::Arc<Self>,
        progress: u64,
    ) -> Result<(), IntegrityError> {
        let path = self.path.display().to_string();
        tokio::task::spawn_blocking(move || self.record(progress))
            .await
            .unwrap_or_else(|e| {
                Err(IntegrityError::Io {
                    action: "write",
                    path,
                    source: std::io::Error::other(e),
                })
            })
    }

    pub fn store_id(&self) -> &str {
        &self.store_id
    }

    /// Write to a temporary file, fsync, rename over the marker, fsync the directory: the
    /// marker is always either the old or the new record, never half of one.
    fn write(&self, progress: u64) -> Result<(), IntegrityError> {
        let io = |action, source| IntegrityError::Io {
            action,
            path: self.path.display().to_string(),
            source,
        };
        let text = toml::to_string(&Marker {
            store_id: self.store_id.clone(),
            progress,
        })
        .map_err(|e| IntegrityError::BadMarker {
            path: self.path.display().to_string(),
            message: e.to_string(),
        })?;
        let tmp = self.path.with_extension("toml.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("write", e))?;
        f.write_all(text.as_bytes()).map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("sync", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io("replace", e))?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("sync the directory of", e))?;
        }
        self.recorded.fetch_max(progress, Ordering::Relaxed);
        Ok(())
    }
}

fn read_marker(path: &Path) -> Result<Option<Marker>, IntegrityError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(IntegrityError::Io {
                action: "read",
                path: path.display().to_string(),
                source: e,
            });
        }
    };
    toml::from_str(&text)
        .map(Some)
        .map_err(|e| IntegrityError::BadMarker {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// sled's `conf` is `key: value` lines (`segment_size`, `use_compression`, `version`) followed by
/// a 4-byte checksum. sled reports a garbled one as "created using a sled version earlier than
/// 0.29", which sends an operator the wrong way; this recognises the damage first.
fn looks_like_sled_conf(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let body = &bytes[..bytes.len().saturating_sub(4)];
    std::str::from_utf8(body)
        .is_ok_and(|text| text.contains("segment_size: ") && text.contains("version: "))
}

/// Runs a read-only start-up check, turning a sled panic into a damage report.
///
/// sled 0.34 panics instead of returning an error on some damage (a page whose blob file is
/// gone: "cannot find pid … in view_for_key"). While the check runs, panics on its thread are
/// kept out of the log: they are the finding, not a bug. `check` returns what is wrong, if
/// anything; `place` names where it was looking when it stopped.
pub fn guarded(
    dir: &Path,
    check: impl FnOnce(&std::sync::Mutex<String>) -> Result<(), String>,
) -> Result<(), IntegrityError> {
    let place = std::sync::Mutex::new(String::new());
    let checker = std::thread::current().id();
    let previous = std::sync::Arc::new(std::panic::take_hook());
    let forward = previous.clone();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() != checker {
            forward(info);
        }
    }));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&place)));
    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| previous(info)));
    let place = place.lock().map(|p| p.clone()).unwrap_or_default();
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(IntegrityError::Inconsistent {
            dir: dir.display().to_string(),
            message,
        }),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("sled panicked");
            // sled's messages can quote megabytes of key bytes.
            let short: String = message.chars().take(120).collect();
            Err(IntegrityError::Unreadable {
                dir: dir.display().to_string(),
                tree: place,
                message: format!("sled could not read it ({short}…)"),
            })
        }
    }
}

/// Reads every key and value of every tree, forwards and backwards: sled reads blob files and
/// cold pages lazily, so damage would otherwise surface only when a request happens to touch it.
/// Reads every value of every tree, forwards and backwards (which also reads every blob file),
/// turning a read error or a sled panic into a damage report.
pub fn verify_readable(dir: &Path, db: &sled::Db) -> Result<(), IntegrityError> {
    guarded(dir, |place| {
        scan(db, place).map_err(|e| {
            let tree = place.lock().map(|p| p.clone()).unwrap_or_default();
            format!("reading tree '{tree}' failed: {e}")
        })
    })
}

fn scan(db: &sled::Db, current: &std::sync::Mutex<String>) -> Result<(), sled::Error> {
    for name in db.tree_names() {
        if let Ok(mut c) = current.lock() {
            *c = String::from_utf8_lossy(&name).into_owned();
        }
        let tree = db.open_tree(&name)?;
        for entry in tree.iter() {
            entry?;
        }
        for entry in tree.iter().rev() {
            entry?;
        }
    }
    Ok(())
}

fn new_store_id(dir: &Path) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = Sha256::new();
    h.update(now.to_be_bytes());
    h.update(std::process::id().to_be_bytes());
    h.update(dir.display().to_string().as_bytes());
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> sled::Db {
        sled::Config::new().path(dir).open().unwrap()
    }

    #[test]
    fn a_fresh_database_gets_a_marker_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        let first = Integrity::check(dir.path(), &db, "seq", 0).unwrap();
        first.record(5).unwrap();
        drop(db);
        let db = open(dir.path());
        let again = Integrity::check(dir.path(), &db, "seq", 7).unwrap();
        assert_eq!(again.store_id(), first.store_id());
    }

    #[test]
    fn lost_or_regressed_or_foreign_databases_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        Integrity::check(dir.path(), &db, "seq", 0)
            .unwrap()
            .record(10)
            .unwrap();
        let regressed = Integrity::check(dir.path(), &db, "seq", 9).unwrap_err();
        assert!(matches!(
            regressed,
            IntegrityError::Regressed {
                expected: 10,
                found: 9,
                ..
            }
        ));
        drop(db);

        // The database files are gone; the marker is not.
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let p = entry.unwrap().path();
            if p.file_name().unwrap() != MARKER_FILE {
                if p.is_dir() {
                    std::fs::remove_dir_all(&p).unwrap();
                } else {
                    std::fs::remove_file(&p).unwrap();
                }
            }
        }
        let db = open(dir.path());
        let missing = Integrity::check(dir.path(), &db, "seq", 0).unwrap_err();
        assert!(
            matches!(missing, IntegrityError::Missing { .. }),
            "{missing}"
        );
        assert!(missing.to_string().contains("lost its data"));

        db.insert(STORE_ID_KEY, &b"someone-else"[..]).unwrap();
        let foreign = Integrity::check(dir.path(), &db, "seq", 10).unwrap_err();
        assert!(matches!(foreign, IntegrityError::Mismatch { .. }));
    }

    #[test]
    fn missing_or_emptied_sled_files_are_reported_before_sled_opens() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            Integrity::precheck(dir.path()).is_ok(),
            "no marker: a new database"
        );
        let db = open(dir.path());
        Integrity::check(dir.path(), &db, "seq", 0).unwrap();
        db.flush().unwrap();
        drop(db);
        assert!(Integrity::precheck(dir.path()).is_ok());
        std::fs::write(dir.path().join("db"), b"").unwrap();
        let err = Integrity::precheck(dir.path()).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
        std::fs::remove_file(dir.path().join("conf")).unwrap();
        let err = Integrity::precheck(dir.path()).unwrap_err();
        assert!(err.to_string().contains("conf is missing"), "{err}");
    }

    #[test]
    fn a_damaged_marker_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        std::fs::write(dir.path().join(MARKER_FILE), "garbage = [").unwrap();
        let err = Integrity::check(dir.path(), &db, "seq", 0).unwrap_err();
        assert!(matches!(err, IntegrityError::BadMarker { .. }));
    }
}
