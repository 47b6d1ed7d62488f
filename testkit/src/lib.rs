//! A throwaway PostgreSQL cluster for tests, run with the server's own programs (`initdb`,
//! `pg_ctl`, `createdb`, `psql`, `pg_isready`): no client crate, no Docker, no running service.
//!
//! - [`PgCluster::shared`] is one cluster per test process; each test takes a database of its
//!   own with [`PgCluster::fresh_database`].
//! - [`PgCluster::start`] is a cluster of your own, for tests that crash and restart the server
//!   ([`PgCluster::restart_immediate`], [`PgCluster::stop_immediate`], [`PgCluster::start_again`]).
//!
//! The server listens on `127.0.0.1` on a free port with `trust` authentication for the user
//! `arbor`, with `fsync=on` so that crash tests test what production does. PostgreSQL refuses to
//! run as root; when the tests do (as here and in CI), `initdb` and the server run as `nobody`
//! (`runuser`), in a directory under `/tmp` owned by `nobody`.
//!
//! The calls block; they are fine from a `#[tokio::test]` (they take well under a second each,
//! `start` a few seconds). Everything fails loudly: a missing server panics with the command
//! that installs it, a server that does not come up panics with the tail of its log.

#![allow(clippy::panic)] // a test fixture: failing the test is its error path

mod bins;
mod host;
pub mod proxy;
pub mod webhooks;

use std::{
    io::Read as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bins::PgBins;
use host::running_as_root;
pub use host::{apt_install, free_port};

/// The database role every cluster is created with (`initdb --username`).
pub const USER: &str = "arbor";
/// The database [`PgCluster::url`] points at, created at start.
pub const DATABASE: &str = "arbor";

/// How long the server may take to accept connections after a start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Who runs `initdb` and the server when the tests run as root.
const SERVER_USER: &str = "nobody";

/// One PostgreSQL server with its own data directory, port and log.
///
/// Dropping it stops the server (`-m immediate`) and removes its directory. It also has a
/// watchdog: a detached shell that waits for end-of-file on a pipe only this process holds, then
/// does the same. The pipe closes however the process ends (normally, panic, `SIGKILL`), so the
/// server of [`PgCluster::shared`] — a static, never dropped — dies with the test process too.
#[derive(Debug)]
pub struct PgCluster {
    bins: PgBins,
    /// Holds `data/` (the cluster), `server.log` and the server's Unix socket.
    dir: tempfile::TempDir,
    port: u16,
    /// `Some("nobody")` when this process is root.
    server_user: Option<&'static str>,
    shared: bool,
    /// Serialises stops and starts.
    control: Mutex<()>,
    next_db: AtomicU64,
    /// The watchdog; its stdin is the pipe whose end-of-file means "this process is gone".
    watchdog: Option<Child>,
    /// Server settings beyond ours (`name=value`).
    settings: Vec<String>,
}

impl PgCluster {
    /// Creates and starts a new cluster of your own (with database [`DATABASE`]).
    ///
    /// Panics when PostgreSQL is not installed (naming `apt-get install -y postgresql`), or
    /// when `initdb` or the server fail (with their output and the server log).
    pub fn start() -> PgCluster {
        PgCluster::create(false, &[])
    }

    /// [`start`](Self::start) with extra server settings, each `name=value` as `postgres -c`
    /// takes it (for example `shared_preload_libraries=pg_stat_statements`).
    pub fn start_with(settings: &[&str]) -> PgCluster {
        PgCluster::create(false, settings)
    }

    /// The cluster of this test process, started on first use. Tests share it and take a
    /// database each ([`PgCluster::fresh_database`]); stopping it is refused.
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(|| PgCluster::create(true, &[]))
    }

    /// `postgres://arbor@127.0.0.1:PORT/arbor`.
    pub fn url(&self) -> String {
        self.url_of(DATABASE)
    }

    /// Creates a new, empty, uniquely named database (`createdb`) and returns its URL. The name
    /// starts with `name_hint` (lowercased, other characters than `[a-z0-9_]` replaced), so a
    /// failing test's database can be found in the server log.
    pub fn fresh_database(&self, name_hint: &str) -> String {
        let mut hint: String = name_hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        if hint.is_empty() {
            hint.push_str("db");
        }
        let name = format!("{hint}_{}", self.next_db.fetch_add(1, Ordering::Relaxed));
        let out = self
            .client(&self.bins.createdb)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .arg(&name)
            .output();
        self.check(out, &format!("createdb {name}"));
        self.url_of(&name)
    }

    /// `url` (one of this cluster's, as [`url`](Self::url) or
    /// [`fresh_database`](Self::fresh_database) return them) reached through the server's Unix
    /// socket instead of TCP: how a service on the database's own host connects.
    pub fn over_socket(&self, url: &str) -> String {
        let host = self.dir.path().to_string_lossy().replace('/', "%2F");
        url.replacen("@127.0.0.1:", &format!("@{host}:"), 1)
    }

    /// `url` (one of this cluster's) reached at `addr` instead: a [`proxy`] in front of
    /// [`addr`](Self::addr).
    pub fn through(&self, url: &str, addr: std::net::SocketAddr) -> String {
        let own = format!("@{}/", self.addr());
        assert!(
            url.contains(&own),
            "{url} is not one of this cluster's URLs"
        );
        url.replacen(&own, &format!("@{addr}/"), 1)
    }

    /// The server's TCP address, on `127.0.0.1`; the same across restarts.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The TCP port on `127.0.0.1`; the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's data directory (`postmaster.pid` is in there while the server runs).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The last 50 lines of the server log, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(self.log_file()) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(50)..].join("\n")
    }

    /// Runs `sql` with `psql` against `url` (`ON_ERROR_STOP`, unaligned, tuples only): the
    /// output, or psql's error text when it fails (for example, when the server is down).
    pub fn psql(&self, url: &str, sql: &str) -> Result<String, String> {
        let out = self
            .client(&self.bins.psql)
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                url,
                "-c",
                sql,
            ])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.bins.psql.display()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
        } else {
            Err(format!(
                "psql {sql:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            ))
        }
    }

    /// How one run of `statement` goes: prepared (its parameters of the `types` given, after
    /// the session `settings`, `name`, `value`) and executed with `args` under
    /// `EXPLAIN (ANALYZE, BUFFERS)`. Answers the plan's top node, with what it and the nodes
    /// under it read (see [`pages`]).
    pub fn explain(
        &self,
        url: &str,
        settings: &[(&str, &str)],
        statement: &str,
        types: &str,
        args: &str,
    ) -> serde_json::Value {
        self.explain_after(url, settings, statement, types, "", args)
    }

    /// [`explain`](Self::explain), with the SQL `meanwhile` run in the same session between the
    /// preparation of `statement` (named `measured` there) and its explained run: an `EXECUTE
    /// measured (…)` in it makes the plan that the explained run then keeps, as a connection
    /// keeps the plan of a statement's first use.
    pub fn explain_after(
        &self,
        url: &str,
        settings: &[(&str, &str)],
        statement: &str,
        types: &str,
        meanwhile: &str,
        args: &str,
    ) -> serde_json::Value {
        let set: String = settings
            .iter()
            .map(|(name, value)| format!("SET {name} = {value}; "))
            .collect();
        let plan = self
            .psql(
                url,
                &format!(
                    "{set}PREPARE measured ({types}) AS {statement}; {meanwhile}; \
                     EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE measured ({args});"
                ),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let plan: serde_json::Value =
            serde_json::from_str(&plan).unwrap_or_else(|e| panic!("{e}: {plan}"));
        plan[0]["Plan"].clone()
    }

    /// Kills the server as a crash would (`pg_ctl stop -m immediate`: no checkpoint, recovery
    /// from the WAL on the next start). Connections fail until [`PgCluster::start_again`].
    pub fn stop_immediate(&self) {
        self.refuse_if_shared("stop_immediate");
        let _guard = self.lock();
        self.stop();
    }

    /// Starts the stopped server again, on the same directory and port, and waits until it
    /// accepts connections.
    pub fn start_again(&self) {
        self.refuse_if_shared("start_again");
        let _guard = self.lock();
        self.try_start()
            .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", self.log_tail()));
    }

    /// [`PgCluster::stop_immediate`] then [`PgCluster::start_again`].
    pub fn restart_immediate(&self) {
        self.refuse_if_shared("restart_immediate");
        let _guard = self.lock();
        self.stop();
        self.try_start()
            .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", self.log_tail()));
    }

    fn create(shared: bool, settings: &[&str]) -> PgCluster {
        let bins = PgBins::find();
        let server_user = running_as_root().then_some(SERVER_USER);
        // Under /tmp when root: the server user must be able to reach its directory, which a
        // TMPDIR under /root would not allow.
        let base = match server_user {
            Some(_) => PathBuf::from("/tmp"),
            None => std::env::temp_dir(),
        };
        let dir = tempfile::Builder::new()
            .prefix("arbor-pg-")
            .tempdir_in(&base)
            .unwrap_or_else(|e| panic!("cannot create a directory in {}: {e}", base.display()));
        let mut cluster = PgCluster {
            bins,
            dir,
            port: 0,
            server_user,
            shared,
            control: Mutex::new(()),
            next_db: AtomicU64::new(1),
            watchdog: None,
            settings: settings.iter().map(|s| s.to_string()).collect(),
        };
        if let Some(user) = server_user {
            if bins::on_path("runuser").is_none() {
                panic!(
                    "running as root, the PostgreSQL server must run as `{user}` through \
                     `runuser`, which is missing; install it with `apt-get install -y util-linux`"
                );
            }
            let out = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(cluster.dir.path())
                .output();
            cluster.check(out, "chown of the cluster directory");
        }
        let out = cluster
            .server_cmd(&cluster.bins.initdb)
            .arg("-D")
            .arg(cluster.data_dir())
            .args([
                "--auth=trust",
                &format!("--username={USER}"),
                "-E",
                "UTF8",
                // C collation is what UTF8 works with on any machine, locales installed or not.
                "--locale=C",
                // The files initdb writes are synced by the first checkpoint instead; only an
                // OS crash during a test could tell the difference.
                "--no-sync",
            ])
            .output();
        cluster.check(out, "initdb");
        cluster.watchdog = Some(cluster.spawn_watchdog());

        // A free port can be taken by someone else before the server binds it: try another.
        let mut last = String::new();
        for _ in 0..5 {
            cluster.port = free_port();
            match cluster.try_start() {
                Ok(()) => {
                    last.clear();
                    break;
                }
                Err(e) if cluster.log_tail().contains("could not bind") => last = e,
                Err(e) => panic!("{e}\nserver log:\n{}", cluster.log_tail()),
            }
        }
        if !last.is_empty() {
            panic!("{last}\nserver log:\n{}", cluster.log_tail());
        }
        let out = cluster
            .client(&cluster.bins.createdb)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &cluster.port.to_string(),
                "-U",
                USER,
            ])
            .arg(DATABASE)
            .output();
        cluster.check(out, "createdb arbor");
        cluster
    }

    fn url_of(&self, database: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// `pg_ctl -w start` with our settings, then a connection check.
    fn try_start(&self) -> Result<(), String> {
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} -c fsync=on \
             -c max_connections=300 -c shared_buffers=64MB",
            self.port,
            shell_quote(&self.dir.path().to_string_lossy()),
        );
        for setting in &self.settings {
            options.push_str(&format!(" -c {}", shell_quote(setting)));
        }
        let out = self
            .server_cmd(&self.bins.pg_ctl)
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_file())
            .args([
                "-w",
                "-t",
                &START_TIMEOUT.as_secs().to_string(),
                "-o",
                &options,
            ])
            .arg("start")
            .output();
        describe_failure(out, "pg_ctl start")?;
        self.wait_accepting()
    }

    /// Polls `pg_isready` until the server accepts connections or the start timeout passes.
    fn wait_accepting(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let out = self
                .client(&self.bins.pg_isready)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
                .args(["-d", DATABASE, "-t", "1"])
                .output();
            // Exit 0: accepting. 1 (rejecting, e.g. still recovering) and 2 (no answer) may pass.
            match describe_failure(out, "pg_isready") {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "the server did not accept connections within {START_TIMEOUT:?}: {e}"
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn stop(&self) {
        let out = self
            .server_cmd(&self.bins.pg_ctl)
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-m", "immediate", "stop"])
            .output();
        self.check(out, "pg_ctl stop -m immediate");
    }

    /// Starts the watchdog as the server user (its `pg_ctl` must be), in a process group of its
    /// own so that a Ctrl-C of the test run does not kill it before it has cleaned up.
    fn spawn_watchdog(&self) -> Child {
        let script = format!(
            "cat >/dev/null; {} -D {} -m immediate -w stop; rm -rf {}",
            shell_quote(&self.bins.pg_ctl.to_string_lossy()),
            shell_quote(&self.data_dir().to_string_lossy()),
            shell_quote(&self.dir.path().to_string_lossy()),
        );
        self.server_cmd(Path::new("sh"))
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the cluster's watchdog (sh): {e}"))
    }

    /// A command for the server's programs: as the server user when we are root.
    fn server_cmd(&self, program: &Path) -> Command {
        let mut cmd = match self.server_user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        };
        // Its own directory: the server user may not be allowed into our working directory.
        cmd.current_dir(self.dir.path());
        cmd
    }

    /// A command for a client program; libpq's environment must not redirect it elsewhere.
    fn client(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        for var in [
            "PGHOST",
            "PGHOSTADDR",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGSERVICE",
            "PGOPTIONS",
        ] {
            cmd.env_remove(var);
        }
        cmd
    }

    /// Panics unless `out` is a successful run, with its output and the server log.
    fn check(&self, out: std::io::Result<Output>, what: &str) {
        if let Err(e) = describe_failure(out, what) {
            panic!("{e}\nserver log:\n{}", self.log_tail());
        }
    }

    fn refuse_if_shared(&self, what: &str) {
        if self.shared {
            panic!(
                "{what} on PgCluster::shared() would break every other test of this process; \
                 use PgCluster::start() for a cluster of your own"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Stopped already (stop_immediate without start_again) is fine here.
        let _ = self
            .server_cmd(&self.bins.pg_ctl)
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-m", "immediate", "stop"])
            .output();
        // Closing the pipe sets the watchdog off: it removes the directory (it may own files
        // we, without root, could not remove) and exits; `dir` then finds nothing left.
        if let Some(mut child) = self.watchdog.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// `Err` with the command's status and output unless it ran and succeeded.
fn describe_failure(out: std::io::Result<Output>, what: &str) -> Result<Output, String> {
    match out {
        Err(e) => Err(format!("{what}: cannot run it: {e}")),
        Ok(o) if o.status.success() => Ok(o),
        Ok(o) => Err(format!(
            "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout).trim_end(),
            String::from_utf8_lossy(&o.stderr).trim_end()
        )),
    }
}

/// The shared pages (of tables and indexes) a node of an [`PgCluster::explain`]ed plan and the
/// nodes under it hit or read.
pub fn pages(node: &serde_json::Value) -> u64 {
    let count = |key: &str| {
        node[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no {key}: {node:#}"))
    };
    count("Shared Hit Blocks") + count("Shared Read Blocks")
}

/// `'text'` for `sh`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
