//! Finding the PostgreSQL server's own programs: `initdb` and `pg_ctl` on `PATH` or under
//! `/usr/lib/postgresql/<highest version>/bin` (Debian's layout, which leaves them off `PATH`),
//! and the clients from the same directory so that server and clients are one version.

use std::path::{Path, PathBuf};

/// What a test does when the server is missing: fail, naming the install command.
pub(crate) const INSTALL_HINT: &str = "apt-get install -y postgresql";

/// The programs of one PostgreSQL installation.
#[derive(Debug, Clone)]
pub(crate) struct PgBins {
    pub(crate) initdb: PathBuf,
    pub(crate) pg_ctl: PathBuf,
    pub(crate) psql: PathBuf,
    pub(crate) createdb: PathBuf,
    pub(crate) pg_isready: PathBuf,
}

impl PgBins {
    /// Finds the installation, or panics with the command that installs one: a test that
    /// needs PostgreSQL must fail without it, never skip.
    pub(crate) fn find() -> PgBins {
        let find_initdb = || on_path("initdb").or_else(debian_initdb);
        let initdb = find_initdb().or_else(|| {
            // A fresh machine: the test command sets up what the tests need.
            crate::apt_install(&["postgresql", "util-linux"]);
            find_initdb()
        });
        let Some(initdb) = initdb else {
            panic!(
                "PostgreSQL's server programs (initdb, pg_ctl) are neither on PATH nor under \
                 /usr/lib/postgresql/*/bin; install them with `{INSTALL_HINT}`"
            );
        };
        // `/usr/local/bin/initdb` may be a link into the real bin directory: resolve it, so the
        // clients come from beside the server and not from a wrapper or another version.
        let dir = std::fs::canonicalize(&initdb)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let beside = |name: &str| {
            dir.as_ref()
                .map(|d| d.join(name))
                .filter(|p| is_executable(p))
                .or_else(|| on_path(name))
        };
        let Some(pg_ctl) = beside("pg_ctl") else {
            panic!(
                "found {} but no pg_ctl beside it or on PATH; install the server with \
                 `{INSTALL_HINT}`",
                initdb.display()
            );
        };
        let client = |name: &str| {
            beside(name).unwrap_or_else(|| {
                panic!(
                    "PostgreSQL's client `{name}` is not beside {} nor on PATH; install it with \
                     `{INSTALL_HINT}`",
                    initdb.display()
                )
            })
        };
        PgBins {
            psql: client("psql"),
            createdb: client("createdb"),
            pg_isready: client("pg_isready"),
            initdb,
            pg_ctl,
        }
    }
}

/// `name` in a directory of `PATH`, if it is an executable file there.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// `/usr/lib/postgresql/<v>/bin/initdb` of the highest version `v` installed.
fn debian_initdb() -> Option<PathBuf> {
    let root = Path::new("/usr/lib/postgresql");
    let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(root)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.to_string();
            let key: Vec<u32> = version
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let initdb = e.path().join("bin/initdb");
            is_executable(&initdb).then_some((key, initdb))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
