//! Helpers the runner's integration tests share.
//!
//! **The backends.** [`Backend`] names the store a test runs on: sled (the embedded store in a
//! directory) or PostgreSQL (a schema of its own per directory, on the throwaway cluster of
//! `arbor-testkit`). The storage conformance suite (`suite/`) is written against a `Backend`
//! passed in, and `suite!` instantiates it once per backend; tests outside it name one.

#![allow(clippy::unwrap_used, clippy::panic, dead_code)]

use std::time::Duration;

use arbor_runner_svc::runs::{ResolveInput, Runner};
use arbor_shared::{
    domain::{DecisionSource, RunStatus, Verdict},
    testing::eventually,
};

/// Waits (20 s at most) until the run has `want`; for `Suspended`, also until its request is out.
pub async fn wait_status(runner: &Runner, run_id: &str, want: RunStatus) {
    let what = format!("run {run_id} to become {want:?}");
    eventually(&what, Duration::from_secs(20), || async {
        let view = runner.get_run(run_id).unwrap();
        let settled = match want {
            RunStatus::Suspended => view.run.status == want && !view.suspensions.is_empty(),
            _ => view.run.status == want,
        };
        settled.then_some(())
    })
    .await
}

/// A person approves the run's first active suspension.
pub async fn approve_first(runner: &Runner, run_id: &str, decision_id: &str) {
    let request_id = runner.get_run(run_id).unwrap().suspensions[0]
        .request_id
        .clone();
    runner
        .resolve(ResolveInput {
            run_id: run_id.to_string(),
            request_id,
            decision_id: decision_id.into(),
            action: Verdict::Resume,
            result: serde_json::Value::Null,
            reason: "fine".into(),
            decided_by: "bob".into(),
            source: DecisionSource::Person,
            may_resolve_approvals: true,
            answerer: None,
            trace: None,
            args_digest: String::new(),
        })
        .await
        .unwrap();
}

/// A store the runner can run on; tests of the storage conformance suite are given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// sled, the embedded store, in the test's directory.
    Sled,
    /// PostgreSQL: a schema of its own per test directory, on the shared throwaway cluster.
    Postgres,
}

impl Backend {
    /// On PostgreSQL: the URL of the database standing for `dir` (a schema of its own, created
    /// the first time `dir` is named; the same one afterwards, like a reopened directory).
    /// `None` on sled.
    pub fn store_url(self, dir: &std::path::Path) -> Option<String> {
        use std::{collections::HashMap, path::PathBuf, sync::Mutex};
        static SCHEMAS: Mutex<Option<HashMap<PathBuf, String>>> = Mutex::new(None);
        if self == Self::Sled {
            return None;
        }
        let mut schemas = SCHEMAS.lock().unwrap();
        let schemas = schemas.get_or_insert_with(HashMap::new);
        Some(
            schemas
                .entry(dir.to_path_buf())
                .or_insert_with(|| {
                    let cluster = arbor_testkit::PgCluster::shared();
                    // Temporary directories have unique names, so the schema named after one
                    // is new too.
                    let name: String = dir
                        .to_string_lossy()
                        .chars()
                        .filter(char::is_ascii_alphanumeric)
                        .collect::<String>()
                        .to_lowercase();
                    let schema = format!("t{}_{name}", std::process::id());
                    cluster
                        .psql(&cluster.url(), &format!("CREATE SCHEMA {schema}"))
                        .unwrap();
                    format!("{}?options=-c%20search_path%3D{schema}", cluster.url())
                })
                .clone(),
        )
    }

    /// The store under test, on a new or existing database standing for `dir`.
    pub fn open_store(self, dir: &std::path::Path) -> arbor_runner_svc::store::Store {
        open_blocking(store_config(dir, self.store_url(dir), Duration::ZERO))
    }

    /// [`Backend::open_store`] on a database whose previous handle is still letting go of it.
    pub async fn reopen_store(self, dir: &std::path::Path) -> arbor_runner_svc::store::Store {
        let config = store_config(dir, self.store_url(dir), Duration::from_secs(10));
        arbor_runner_svc::store::open(&config).await.unwrap()
    }

    /// How many random sequences the mailbox model check runs: all of them on sled; a sample
    /// on PostgreSQL, where each one creates a schema (the logic above the seam is the same).
    pub fn model_cases(self) -> u32 {
        match self {
            Self::Sled => 256,
            Self::Postgres => 16,
        }
    }

    /// A runner on a new database standing for `dir`, with the built-in tools plus what
    /// `register` adds, and no workers: a test claims and processes jobs itself, or spawns
    /// workers.
    pub async fn open_runner(
        self,
        dir: &std::path::Path,
        register: impl FnOnce(&mut arbor_runner_svc::engine::ToolRegistry),
    ) -> std::sync::Arc<Runner> {
        self.open_runner_with(
            dir,
            register,
            arbor_runner_svc::runs::RunnerOptions::default(),
        )
        .await
    }

    /// [`Backend::open_runner`] with `options`.
    pub async fn open_runner_with(
        self,
        dir: &std::path::Path,
        register: impl FnOnce(&mut arbor_runner_svc::engine::ToolRegistry),
        options: arbor_runner_svc::runs::RunnerOptions,
    ) -> std::sync::Arc<Runner> {
        use arbor_runner_svc::{
            engine::{GuardConfig, LedgerTool, ToolRegistry},
            mailbox::SystemClock,
        };
        let store = self.open_store(dir);
        let mut tools = ToolRegistry::with_builtins(
            LedgerTool::new(store.clone()).unwrap(),
            GuardConfig::default(),
        );
        register(&mut tools);
        Runner::open(
            store,
            std::sync::Arc::new(SystemClock::default()),
            std::sync::Arc::new(tools),
            options,
        )
        .await
        .unwrap()
    }

    /// Serves the database standing for `dir` (new, or the one a stopped [`Served`] left).
    pub async fn serve(self, dir: &std::path::Path) -> Served {
        self.serve_with_auth(dir, arbor_shared::auth::Authenticator::disabled())
            .await
    }

    /// [`Backend::serve`] with authentication on: callers need a token of `auth`.
    pub async fn serve_with_auth(
        self,
        dir: &std::path::Path,
        auth: arbor_shared::auth::Authenticator,
    ) -> Served {
        let cfg = arbor_runner_svc::ServeConfig {
            data_dir: dir.to_path_buf(),
            store_url: self.store_url(dir),
            workers: 2,
            drain: Duration::from_secs(5),
            auth,
            ..arbor_runner_svc::ServeConfig::default()
        };
        let runner = arbor_runner_svc::open_runner(&cfg).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (health, health_svc) = tonic_health::server::health_reporter();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(arbor_runner_svc::serve_runner(
            cfg,
            runner.clone(),
            listener,
            async move {
                let _ = stopped.await;
            },
            health,
            health_svc,
        ));
        Served {
            runner,
            addr,
            stop,
            server,
        }
    }
}

/// What the runner's opener (`store::open`) is given for the store standing for `dir`: the
/// database `url` when given, else the embedded store in `dir`.
fn store_config(
    dir: &std::path::Path,
    url: Option<String>,
    lock_wait: Duration,
) -> arbor_runner_svc::store::OpenConfig {
    arbor_runner_svc::store::OpenConfig {
        url,
        data_dir: dir.to_path_buf(),
        cache_bytes: 16 << 20,
        lock_wait,
        wait_always: false,
    }
}

/// Opens the store `config` names from any thread: opening may wait on the network, so it
/// runs off the caller's runtime, on one of its own.
fn open_blocking(config: arbor_runner_svc::store::OpenConfig) -> arbor_runner_svc::store::Store {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(arbor_runner_svc::store::open(&config))
            .unwrap()
    })
    .join()
    .unwrap()
}

/// A store on the PostgreSQL database `url`, opened from any thread.
pub fn open_postgres(url: &str) -> arbor_runner_svc::store::Store {
    open_blocking(store_config(
        std::path::Path::new(""),
        Some(url.to_string()),
        Duration::ZERO,
    ))
}

/// A runner served over gRPC on an ephemeral port of 127.0.0.1 (RunnerService and
/// WorkerService on one port, run workers and the task lease reaper running), on the store
/// [`Backend::serve`] opened.
pub struct Served {
    pub runner: std::sync::Arc<Runner>,
    pub addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), arbor_runner_svc::ServeError>>,
}

impl Served {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts the server down (streams end, workers stop, the store is flushed) and lets go of
    /// the store, so that [`Backend::serve`] can open it again.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.server.await.unwrap().unwrap();
        drop(self.runner);
    }
}

/// The tool `hold`: every call tells the test it has started, then blocks until the test
/// releases it (one `release` per call).
pub struct Hold {
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Hold {
    /// The tool, the receiver of its "started" signals and the sender that releases a call.
    pub fn new() -> (
        Self,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (entered, started) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel();
        let hold = Self {
            entered: std::sync::Mutex::new(entered),
            release: std::sync::Mutex::new(released),
        };
        (hold, started, release)
    }
}

impl arbor_runner_svc::engine::Tool for Hold {
    fn name(&self) -> &str {
        "hold"
    }

    fn call(
        &self,
        _call: &arbor_runner_svc::engine::ToolCall,
    ) -> Result<serde_json::Value, arbor_runner_svc::engine::ToolError> {
        self.entered.lock().unwrap().send(()).unwrap();
        self.release.lock().unwrap().recv().unwrap();
        Ok(serde_json::json!("released"))
    }
}

/// Holds the durable commit lane for a moment, so that the commits queued meanwhile go into the
/// next batch together.
pub async fn with_lane_held<F: std::future::Future>(
    store: &arbor_runner_svc::store::Store,
    queued: F,
) -> F::Output {
    let held = store.commit(|_| {
        std::thread::sleep(Duration::from_millis(300));
        Ok::<_, arbor_runner_svc::store::Abort<()>>(())
    });
    let queued = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        queued.await
    };
    let (held, out) = tokio::join!(held, queued);
    held.unwrap();
    out
}

/// A follower of `log`'s head from seq `start`, as `StreamEvents` follows it: every event once,
/// in order (a gap fails it). The receiver holds the last seq it read.
pub fn follow_log(
    log: arbor_runner_svc::events::EventLog,
    start: u64,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Receiver<u64>,
) {
    let (reached, read_up_to) = tokio::sync::watch::channel(start);
    let follower = tokio::spawn(async move {
        let (mut durable, mut cursor) = (log.watch(), start);
        loop {
            for event in log.read_after(cursor, 512).await.unwrap() {
                assert_eq!(event.seq, cursor + 1, "the stream skipped an event");
                cursor = event.seq;
            }
            reached.send_replace(cursor);
            if durable.changed().await.is_err() {
                return;
            }
        }
    });
    (follower, read_up_to)
}

/// Waits, up to 20 s, until the follower of [`follow_log`] whose receiver is `read_up_to` has
/// read up to seq `last`.
pub async fn wait_read_up_to(read_up_to: &mut tokio::sync::watch::Receiver<u64>, last: u64) {
    tokio::time::timeout(
        Duration::from_secs(20),
        read_up_to.wait_for(|seq| *seq >= last),
    )
    .await
    .unwrap_or_else(|_| panic!("the stream did not reach seq {last}"))
    .unwrap();
}
