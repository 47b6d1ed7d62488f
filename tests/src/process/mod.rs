//! Starting, stopping and killing the real service binaries.

mod binaries;
mod cluster;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
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

pub use arbor_testkit::free_port;
pub use binaries::{Binaries, Profile, workspace_root};
pub use cluster::{Cluster, Replicas};

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
