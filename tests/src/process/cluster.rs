//! Both services wired together: one pair on sled, or replicas of each on one PostgreSQL.

use super::*;

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
        Self::start_secure_people(profile, &[], runner_args, approval_args).await
    }

    /// [`start_secure_with`](Self::start_secure_with), with `people` added to the tokens file.
    pub async fn start_secure_people(
        profile: Profile,
        people: &[crate::auth::Person],
        runner_args: Vec<String>,
        approval_args: Vec<String>,
    ) -> (Cluster, crate::auth::Tokens) {
        let mut cluster = Self::prepare(profile, runner_args, approval_args);
        let tokens = crate::auth::Tokens::write_with(cluster.dir.path(), people);
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
