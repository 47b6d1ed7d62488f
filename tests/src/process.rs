//! Starting, stopping and killing the real service binaries.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::OnceLock,
    time::Duration,
};

use arbor_shared::proto::{
    approval::v1::approval_service_client::ApprovalServiceClient,
    runner::v1::runner_service_client::RunnerServiceClient,
};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::process::{Child, Command};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Which build of the binaries to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Debug,
    Release,
}

/// Paths of the two binaries, built once per test process.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub runner: PathBuf,
    pub approval: PathBuf,
}

/// The repository root (where `Cargo.toml`, `proto/` and `deploy/` live).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

impl Binaries {
    /// Builds `runner-svc` and `approval-svc` (once per process and profile) with cargo and
    /// returns their paths. `ARBOR_BIN_DIR` points at prebuilt binaries instead.
    pub fn get(profile: Profile) -> Binaries {
        static DEBUG: OnceLock<Binaries> = OnceLock::new();
        static RELEASE: OnceLock<Binaries> = OnceLock::new();
        let cell = match profile {
            Profile::Debug => &DEBUG,
            Profile::Release => &RELEASE,
        };
        cell.get_or_init(|| Self::build(profile)).clone()
    }

    fn build(profile: Profile) -> Binaries {
        if let Ok(dir) = std::env::var("ARBOR_BIN_DIR") {
            let dir = PathBuf::from(dir);
            return Binaries {
                runner: dir.join("runner-svc"),
                approval: dir.join("approval-svc"),
            };
        }
        let root = workspace_root();
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("target"));
        if profile == Profile::Debug
            && let Some(built) = Self::built_with_this_test(&root)
        {
            return built;
        }
        let mut cmd =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&root).args([
            "build",
            "--quiet",
            "-p",
            "arbor-runner-svc",
            "-p",
            "arbor-approval-svc",
            "--bins",
        ]);
        if profile == Profile::Release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building the service binaries failed");
        let dir = target.join(match profile {
            Profile::Debug => "debug",
            Profile::Release => "release",
        });
        Binaries {
            runner: dir.join("runner-svc"),
            approval: dir.join("approval-svc"),
        }
    }

    /// The debug binaries `cargo test --workspace` built beside this test executable (it builds
    /// them for the services' own integration tests), when none of their sources changed since:
    /// asking cargo again would build them a second time whenever its selection of packages
    /// resolves their dependencies' features differently from the whole workspace's.
    fn built_with_this_test(root: &Path) -> Option<Binaries> {
        let dir = std::env::current_exe()
            .ok()?
            .parent()?
            .parent()?
            .to_path_buf();
        let bins = Binaries {
            runner: dir.join("runner-svc"),
            approval: dir.join("approval-svc"),
        };
        let built = [&bins.runner, &bins.approval]
            .into_iter()
            .map(|b| std::fs::metadata(b).and_then(|m| m.modified()).ok())
            .min()??;
        let sources = [
            "Cargo.toml",
            "Cargo.lock",
            "proto",
            "shared",
            "runner-svc/Cargo.toml",
            "runner-svc/src",
            "approval-svc/Cargo.toml",
            "approval-svc/src",
        ];
        let newest = sources
            .iter()
            .filter_map(|s| newest_modification(&root.join(s)))
            .max()?;
        (newest <= built).then_some(bins)
    }
}

/// The latest modification time of `path` or of anything under it (`shared/tests` and
/// `shared/target`-like folders included: erring towards a build is safe).
fn newest_modification(path: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    let own = meta.modified().ok();
    if !meta.is_dir() {
        return own;
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| newest_modification(&e.path()))
        .chain(own)
        .max()
}

pub use arbor_testkit::free_port;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    Runner,
    Approval,
}

/// One running (or stopped) service process with a fixed address and data dir, so it can be
/// killed and restarted in place.
pub struct Service {
    pub kind: ServiceKind,
    pub binary: PathBuf,
    pub addr: SocketAddr,
    /// Where the service serves `/metrics` (a free port per service, so tests run in parallel).
    pub metrics_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub extra_args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The CA to trust when the service serves TLS (its URL is then `https://localhost:…`).
    pub tls_ca: Option<PathBuf>,
    child: Option<Child>,
    starts: u32,
    /// Length of the log when the current process was spawned: what it logged starts there.
    log_start: u64,
}

impl Service {
    pub fn new(kind: ServiceKind, binary: PathBuf, root: &Path, extra_args: Vec<String>) -> Self {
        let name = match kind {
            ServiceKind::Runner => "runner",
            ServiceKind::Approval => "approval",
        };
        Self::named(kind, binary, root, name, extra_args)
    }

    /// A service whose data dir and log are named `name` under `root` (replicas of one kind
    /// share a root).
    pub fn named(
        kind: ServiceKind,
        binary: PathBuf,
        root: &Path,
        name: &str,
        extra_args: Vec<String>,
    ) -> Self {
        Self {
            kind,
            binary,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            data_dir: root.join(name),
            log: root.join(format!("{name}.log")),
            extra_args,
            env: Vec::new(),
            tls_ca: None,
            child: None,
            starts: 0,
            log_start: 0,
        }
    }

    pub fn url(&self) -> String {
        match &self.tls_ca {
            Some(_) => format!("https://localhost:{}", self.addr.port()),
            None => format!("http://{}", self.addr),
        }
    }

    /// An endpoint for this service, with TLS when it serves TLS.
    pub fn endpoint(&self) -> tonic::transport::Endpoint {
        let endpoint = Channel::from_shared(self.url()).expect("url");
        match &self.tls_ca {
            Some(ca) => endpoint
                .tls_config(arbor_shared::tls::client_config(ca).expect("CA file"))
                .expect("TLS config"),
            None => endpoint,
        }
    }

    /// `http://…/metrics` of this service.
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics_addr)
    }

    /// Starts the process and waits until its health service says SERVING.
    pub async fn start(&mut self) {
        self.spawn();
        self.wait_serving(crate::WAIT).await;
    }

    /// Starts the process without waiting for it to be ready.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        self.log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = Command::new(&self.binary);
        cmd.arg("serve")
            .arg("--listen")
            .arg(self.addr.to_string())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--metrics-listen")
            .arg(self.metrics_addr.to_string())
            .args(&self.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("ARBOR_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        self.child = Some(cmd.spawn().expect("service binary starts"));
        self.starts += 1;
    }

    /// Polls the standard health service until SERVING.
    pub async fn wait_serving(&mut self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "{:?} exited with {status} during start; log:\n{}",
                    self.kind,
                    self.log_tail()
                );
            }
            if let Ok(channel) = self.endpoint().connect().await {
                let serving = HealthClient::new(channel)
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .map(|r| r.into_inner().status == 1)
                    .unwrap_or(false);
                if serving {
                    return;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "{:?} not SERVING after {timeout:?}; log:\n{}",
                    self.kind,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit code.
    pub async fn stop(&mut self) -> Option<i32> {
        self.terminate();
        self.wait_exit(Duration::from_secs(20)).await
    }

    /// SIGSTOP: the process freezes (its connections stay open) until [`Service::resume`].
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT after [`Service::pause`].
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), signal);
        }
    }

    /// Sends SIGTERM without waiting.
    pub fn terminate(&self) {
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }

    /// Whether the process has exited (it is then reaped and forgotten).
    pub fn has_exited(&mut self) -> bool {
        let exited = match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(Some(_))),
            None => true,
        };
        if exited {
            self.child = None;
        }
        exited
    }

    /// Waits up to `timeout` for the process to exit; returns its exit code (`None` when it
    /// was killed by a signal or had to be killed after the timeout).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = child.start_kill();
                None
            }
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// What the current (or last) process logged, from its start on.
    pub fn log_since_start(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let from = (self.log_start as usize).min(text.len());
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    /// Times started so far.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    pub async fn channel(&self) -> Channel {
        self.endpoint().connect().await.expect("service reachable")
    }
}

/// Both services wired together in one temp dir.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub runner: Service,
    pub approval: Service,
}

impl Cluster {
    /// Starts runner-svc, then approval-svc pointed at it, both with fresh data dirs.
    pub async fn start(profile: Profile) -> Cluster {
        Self::start_with(profile, Vec::new(), Vec::new()).await
    }

    pub async fn start_with(
        profile: Profile,
        runner_args: Vec<String>,
        approval_args: Vec<String>,
    ) -> Cluster {
        let mut cluster = Self::prepare(profile, runner_args, approval_args);
        let runner_url = cluster.runner.url();
        cluster.start_routed(&runner_url).await;
        cluster
    }

    /// Both services with authentication on (see [`crate::auth::Tokens`]); the tokens file
    /// lives in the cluster's temp dir.
    pub async fn start_secure(profile: Profile) -> (Cluster, crate::auth::Tokens) {
        Self::start_secure_with(profile, Vec::new(), Vec::new()).await
    }

    /// [`start_secure`](Self::start_secure) with more arguments for each service (a
    /// `--store`, say).
    pub async fn start_secure_with(
        profile: Profile,
        runner_args: Vec<String>,
        approval_args: Vec<String>,
    ) -> (Cluster, crate::auth::Tokens) {
        let mut cluster = Self::prepare(profile, runner_args, approval_args);
        let tokens = crate::auth::Tokens::write(cluster.dir.path());
        cluster.runner.extra_args.extend(tokens.runner_args());
        cluster.approval.extra_args.extend(tokens.approval_args());
        let runner_url = cluster.runner.url();
        cluster.start_routed(&runner_url).await;
        (cluster, tokens)
    }

    /// Both services set up (fixed ports, data dirs in a fresh temp dir) but not started, so a
    /// test can add arguments or put something between them first.
    pub fn prepare(
        profile: Profile,
        runner_args: Vec<String>,
        approval_args: Vec<String>,
    ) -> Cluster {
        let bins = Binaries::get(profile);
        let dir = tempfile::tempdir().expect("temp dir");
        let runner = Service::new(ServiceKind::Runner, bins.runner, dir.path(), runner_args);
        let approval = Service::new(
            ServiceKind::Approval,
            bins.approval,
            dir.path(),
            approval_args,
        );
        Cluster {
            dir,
            runner,
            approval,
        }
    }

    /// Starts runner-svc, then approval-svc with `--runner runner_url` (the runner itself, or a
    /// proxy in front of it).
    pub async fn start_routed(&mut self, runner_url: &str) {
        self.approval
            .extra_args
            .extend(["--runner".to_string(), runner_url.to_string()]);
        self.runner.start().await;
        self.approval.start().await;
    }

    pub async fn runner_client(&self) -> RunnerServiceClient<Channel> {
        RunnerServiceClient::new(self.runner.channel().await)
    }

    pub async fn approval_client(&self) -> ApprovalServiceClient<Channel> {
        ApprovalServiceClient::new(self.approval.channel().await)
    }
}

/// Several replicas of each service sharing one PostgreSQL database (`--store`), each with its
/// own port, log and (unused) data dir in one temp dir. approval-svc's `--runner` names one
/// runner, so approval replica `i` talks to runner replica `i % runners`.
pub struct Replicas {
    pub dir: tempfile::TempDir,
    pub store_url: String,
    pub runners: Vec<Service>,
    pub approvals: Vec<Service>,
}

/// The line approval-svc logs when it takes the leadership.
const LEADING: &str = "leading: following the runner";
/// The line it logs when it loses it.
const LEADERSHIP_LOST: &str = "leadership lost";

impl Replicas {
    /// Sets up `runners` runner replicas and `approvals` approval replicas on `store_url`, not
    /// started. `runner_args` and `approval_args` go to every replica of that kind.
    pub fn prepare(
        profile: Profile,
        store_url: &str,
        (runners, approvals): (usize, usize),
        runner_args: Vec<String>,
        approval_args: Vec<String>,
    ) -> Replicas {
        assert!(runners > 0, "at least one runner replica");
        let bins = Binaries::get(profile);
        let dir = tempfile::tempdir().expect("temp dir");
        let store = ["--store".to_string(), store_url.to_string()];
        let runners: Vec<Service> = (0..runners)
            .map(|i| {
                let mut args = store.to_vec();
                args.extend(runner_args.iter().cloned());
                Service::named(
                    ServiceKind::Runner,
                    bins.runner.clone(),
                    dir.path(),
                    &format!("runner-{i}"),
                    args,
                )
            })
            .collect();
        let approvals = (0..approvals)
            .map(|i| {
                let mut args = store.to_vec();
                args.extend(["--runner".to_string(), runners[i % runners.len()].url()]);
                args.extend(approval_args.iter().cloned());
                Service::named(
                    ServiceKind::Approval,
                    bins.approval.clone(),
                    dir.path(),
                    &format!("approval-{i}"),
                    args,
                )
            })
            .collect();
        Replicas {
            dir,
            store_url: store_url.to_string(),
            runners,
            approvals,
        }
    }

    /// Starts every runner replica, then every approval replica in order, each one SERVING
    /// before the next starts (so approval replica 0 is the first to try to lead).
    pub async fn start_all(&mut self) {
        for r in &mut self.runners {
            r.start().await;
        }
        for a in &mut self.approvals {
            a.start().await;
        }
    }

    /// The running approval replica that leads now, by what each one logged since its start.
    pub fn leader(&self) -> Option<usize> {
        self.approvals.iter().position(|a| {
            let log = a.log_since_start();
            a.is_running()
                && log
                    .rfind(LEADING)
                    .is_some_and(|at| log.rfind(LEADERSHIP_LOST).is_none_or(|lost| lost < at))
        })
    }

    /// Waits until some running approval replica leads; returns its index.
    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(i) = self.leader() {
                return i;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no approval replica leads after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM to every replica (approvals first), then waits for each; returns what did not
    /// exit with 0, as `name: code`.
    pub async fn stop_all(&mut self) -> Vec<String> {
        let mut unclean = Vec::new();
        for s in self.approvals.iter_mut().chain(self.runners.iter_mut()) {
            if !s.is_running() {
                continue;
            }
            let code = s.stop().await;
            if code != Some(0) {
                unclean.push(format!("{}: exited {code:?}", s.log.display()));
            }
        }
        unclean
    }

    pub fn runner_urls(&self) -> Vec<String> {
        self.runners.iter().map(Service::url).collect()
    }

    pub fn approval_urls(&self) -> Vec<String> {
        self.approvals.iter().map(Service::url).collect()
    }
}

impl Drop for Replicas {
    /// A failing test's replicas say what they logged last, before their temp dir goes.
    fn drop(&mut self) {
        if std::thread::panicking() {
            for s in self.runners.iter().chain(&self.approvals) {
                let text = std::fs::read_to_string(&s.log).unwrap_or_default();
                let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
                eprintln!(
                    "--- {}: {} ERROR lines (first 20):\n{}\n--- last 40 lines:\n{}",
                    s.log.display(),
                    errors.len(),
                    errors[..errors.len().min(20)].join("\n"),
                    s.log_tail()
                );
            }
        }
    }
}

/// How a process that was expected to stop by itself ended.
#[derive(Debug, Clone)]
pub struct Exited {
    /// `None`: killed by a signal, or still running at the deadline (then killed).
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stderr: String,
}

/// Runs `binary args…` until it exits or `timeout` passes (then kills it); returns its exit code
/// and stderr.
pub async fn run_to_exit(binary: &Path, args: &[String], timeout: Duration) -> Exited {
    let mut child = Command::new(binary)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("binary starts");
    let mut stderr = child.stderr.take().expect("stderr piped");
    let read = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
    let (code, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => (status.code(), false),
        _ => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            (None, true)
        }
    };
    Exited {
        code,
        timed_out,
        stderr: read.await.unwrap_or_default(),
    }
}

impl Service {
    /// Resident set size of the running process in KiB (Linux).
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }
}

/// Bytes of all files under `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
