//! The system as it ships: both release binaries with authentication on (a tokens file with a
//! submitter, an approver, an operator, a task worker, a reader and approval-svc's service
//! identity) and, for the policy path, an approval policy that auto-approves the benchmark's
//! gate. On the embedded store, one process of each; on PostgreSQL, any number of replicas of
//! each on one fresh database.

use std::{path::Path, sync::Arc};

use arbor_shared::{
    auth::{BearerToken, hash_token},
    proto::{
        approval::v1::approval_service_client::ApprovalServiceClient,
        runner::v1::runner_service_client::RunnerServiceClient,
    },
};
use arbor_testkit::PgCluster;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use crate::{Binaries, Profile, Service, ServiceKind};

pub type Runner = RunnerServiceClient<InterceptedService<Channel, BearerToken>>;
pub type Approvals = ApprovalServiceClient<InterceptedService<Channel, BearerToken>>;

pub const SUBMITTER: &str = "bench-submitter-token";
pub const APPROVER: &str = "bench-approver-token";
/// The two other approvers of the `bench-approvers` group (the 2-of-3 rule).
pub const APPROVERS: [&str; 3] = [APPROVER, "bench-approver-2-token", "bench-approver-3-token"];
pub const OPERATOR: &str = "bench-operator-token";
pub const SERVICE: &str = "bench-approval-svc-token";
pub const WORKER: &str = "bench-worker-token";
/// Reads every run and the whole event log: what the benches' event followers use.
pub const READER: &str = "bench-reader-token";

/// Where the services of a bench cluster keep their state.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded store, in each service's data dir: one process per service.
    Sled,
    /// A fresh database of the bench run's one PostgreSQL server, shared by every replica.
    Postgres(Arc<PgCluster>),
}

impl Store {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Sled => "sled",
            Self::Postgres(_) => "postgres",
        }
    }

    /// Whether more than one replica of a service can share this store.
    pub fn shared(&self) -> bool {
        matches!(self, Self::Postgres(_))
    }
}

/// The database of one bench cluster.
pub struct Db {
    pub pg: Arc<PgCluster>,
    pub url: String,
}

impl Db {
    fn query(&self, sql: &str) -> f64 {
        self.number(sql).unwrap_or(0.0)
    }

    /// The number `sql` answers (`None`: it failed, or answered something else).
    fn number(&self, sql: &str) -> Option<f64> {
        self.pg.psql(&self.url, sql).ok()?.trim().parse().ok()
    }

    /// `pg_database_size` of this database.
    pub fn bytes(&self) -> u64 {
        self.query("SELECT pg_database_size(current_database())") as u64
    }

    /// Transactions committed in this database so far (all of them, read-only ones too), as
    /// the cumulative statistics count them (backends report them within a second or so).
    pub fn xact_commits(&self) -> f64 {
        self.query("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    }

    /// Starts counting statements afresh (`pg_stat_statements`, when the server loads it: see
    /// `arbor-bench --pg-stats`).
    pub fn reset_statements(&self) {
        if let Err(e) = self.pg.psql(
            &self.url,
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
        ) {
            eprintln!("pg_stat_statements: {e}");
        }
    }

    /// The statements this database ran since [`reset_statements`](Self::reset_statements),
    /// most called first.
    pub fn statements(&self) -> Vec<Statement> {
        let sql = "SELECT calls, rows, round(mean_exec_time::numeric, 3), \
                   shared_blks_hit + shared_blks_read, plans, \
                   regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements \
                   WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                   ORDER BY calls DESC";
        let out = self.pg.psql(&self.url, sql).unwrap_or_else(|e| {
            eprintln!("pg_stat_statements: {e}");
            String::new()
        });
        out.lines()
            .filter_map(|line| {
                let mut f = line.splitn(6, '|');
                let mut num = || f.next().and_then(|v| v.parse::<f64>().ok());
                let (calls, rows, mean_ms, buffers, plans) =
                    (num()?, num()?, num()?, num()?, num()?);
                Some(Statement {
                    calls,
                    rows,
                    mean_ms,
                    buffers,
                    plans,
                    text: f.next()?.to_string(),
                })
            })
            .collect()
    }

    /// Each table's row writes in this database so far, most written first: (table,
    /// inserts, updates, of which HOT, deletes), as the cumulative statistics count them.
    pub fn table_writes(&self) -> Vec<(String, [f64; 4])> {
        let sql = "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
                   FROM pg_stat_user_tables ORDER BY n_tup_ins + n_tup_upd + n_tup_del DESC";
        let out = self.pg.psql(&self.url, sql).unwrap_or_default();
        out.lines()
            .filter_map(|line| {
                let mut f = line.split('|');
                let name = f.next()?.to_string();
                let mut n = [0.0; 4];
                for v in &mut n {
                    *v = f.next()?.trim().parse().ok()?;
                }
                Some((name, n))
            })
            .collect()
    }

    /// Bytes of WAL the whole server has written so far (its WAL position as a number: exact
    /// at once, where the cumulative statistics lag by up to a second per backend). The bench
    /// runs one configuration at a time, so a difference is the configuration's.
    pub fn wal_bytes(&self) -> Option<f64> {
        self.number("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')")
    }

    /// CPU seconds of the whole server so far (postmaster, backends, background processes).
    pub fn server_cpu(&self) -> f64 {
        let pid = std::fs::read_to_string(self.pg.data_dir().join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()));
        pid.map_or(0.0, super::procstat::tree_cpu_seconds)
    }
}

/// One statement's totals in `pg_stat_statements`.
#[derive(Debug, Clone)]
pub struct Statement {
    pub calls: f64,
    pub rows: f64,
    pub mean_ms: f64,
    /// Shared buffers hit or read.
    pub buffers: f64,
    /// Times it was planned (a statement that uses a cached generic plan is planned once).
    pub plans: f64,
    pub text: String,
}

/// What to start.
pub struct Spec<'a> {
    pub store: &'a Store,
    /// Replicas of runner-svc (and of approval-svc, each following its own runner replica).
    pub replicas: usize,
    /// Start approval-svc at all.
    pub approval: bool,
    /// What the policy does with every `gate` node of `bench-*` trees.
    pub rules: Rules,
    pub runner_args: &'a [&'a str],
    /// More flags of each approval-svc (the inbox section turns the web inbox on).
    pub approval_args: &'a [&'a str],
    /// Names the database (PostgreSQL), so a slow configuration can be found in the server log.
    pub name: &'a str,
}

/// The approval policy of a bench cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// Every approval waits for a person.
    Ask,
    /// A rule approves every `gate` node of `bench-*` trees.
    AutoApprove,
    /// An approval rule asks two of the three principals of `bench-approvers`.
    TwoOfThree,
}

impl Rules {
    fn text(self) -> &'static str {
        match self {
            Self::Ask => "default = \"ask\"\n",
            Self::AutoApprove => {
                "default = \"ask\"\n\n[[node]]\nname = \"bench-auto-approve\"\ntree = \"bench-*\"\nnode = \"gate\"\naction = \"allow\"\n"
            }
            Self::TwoOfThree => {
                "default = \"ask\"\n\n[[approval]]\nname = \"bench-two-of-three\"\ntree = \"bench-*\"\nnode = \"gate\"\n[[approval.stage]]\nname = \"bench\"\napprovers = [\"group:bench-approvers\"]\nrequired = 2\n"
            }
        }
    }
}

pub struct BenchCluster {
    pub dir: tempfile::TempDir,
    pub runners: Vec<Service>,
    pub approvals: Vec<Service>,
    pub db: Option<Db>,
}

fn write_tokens(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tokens.toml");
    let entry = |name: &str, role: &str, token: &str| {
        let groups = match role {
            "approver" => "groups = [\"bench-approvers\"]\n",
            _ => "",
        };
        format!(
            "[[principal]]\nname = \"{name}\"\nroles = [\"{role}\"]\n{groups}token_sha256 = \"{}\"\n\n",
            hash_token(token)
        )
    };
    let text = [
        entry("bench", "submitter", SUBMITTER),
        entry("person", "approver", APPROVERS[0]),
        entry("person-2", "approver", APPROVERS[1]),
        entry("person-3", "approver", APPROVERS[2]),
        entry("ops", "operator", OPERATOR),
        entry("approval-svc", "service", SERVICE),
        entry("worker", "worker", WORKER),
        entry("dashboard", "reader", READER),
    ]
    .concat();
    std::fs::write(&path, text).expect("tokens file");
    path
}

impl BenchCluster {
    /// One runner-svc (with `runner_args`) and one approval-svc on the embedded store; with
    /// `auto_approve` the policy approves every `gate` node of `bench-*` trees.
    pub async fn start(auto_approve: bool, runner_args: &[&str]) -> BenchCluster {
        let rules = match auto_approve {
            true => Rules::AutoApprove,
            false => Rules::Ask,
        };
        Self::start_spec(&Spec {
            store: &Store::Sled,
            replicas: 1,
            approval: true,
            rules,
            runner_args,
            approval_args: &[],
            name: "bench",
        })
        .await
    }

    pub async fn start_spec(spec: &Spec<'_>) -> BenchCluster {
        assert!(
            spec.replicas == 1 || spec.store.shared(),
            "only a shared store takes more than one replica"
        );
        let bins = Binaries::get(Profile::Release);
        let dir = tempfile::tempdir().expect("temp dir");
        let tokens = write_tokens(dir.path());
        let service_token = dir.path().join("service.token");
        std::fs::write(&service_token, SERVICE).expect("service token");
        let policy = dir.path().join("policy.toml");
        std::fs::write(&policy, spec.rules.text()).expect("policy file");
        let db = match spec.store {
            Store::Sled => None,
            Store::Postgres(pg) => Some(Db {
                pg: pg.clone(),
                // Everything runs on one host, so the services reach PostgreSQL as they would
                // there: through its Unix socket.
                url: pg.over_socket(&pg.fresh_database(spec.name)),
            }),
        };
        let store_args: Vec<String> = db
            .as_ref()
            .map(|db| vec!["--store".into(), db.url.clone()])
            .unwrap_or_default();

        let mut runners = Vec::new();
        let mut approvals = Vec::new();
        for i in 0..spec.replicas.max(1) {
            let root = dir.path().join(format!("replica-{i}"));
            std::fs::create_dir_all(&root).expect("replica dir");
            let mut args: Vec<String> = vec!["--tokens".into(), tokens.display().to_string()];
            args.extend(store_args.iter().cloned());
            args.extend(spec.runner_args.iter().map(|s| s.to_string()));
            args.extend(super::otlp::args());
            let mut runner = Service::new(ServiceKind::Runner, bins.runner.clone(), &root, args);
            runner.env.push(("RUST_LOG".into(), "warn".into()));
            runner.start().await;
            if spec.approval {
                let mut args: Vec<String> = vec![
                    "--tokens".into(),
                    tokens.display().to_string(),
                    "--runner-token-file".into(),
                    service_token.display().to_string(),
                    "--policy".into(),
                    policy.display().to_string(),
                    "--runner".into(),
                    runner.url(),
                ];
                args.extend(store_args.iter().cloned());
                args.extend(super::otlp::args());
                args.extend(spec.approval_args.iter().map(|s| s.to_string()));
                let mut approval =
                    Service::new(ServiceKind::Approval, bins.approval.clone(), &root, args);
                approval.start().await;
                approvals.push(approval);
            }
            runners.push(runner);
        }
        BenchCluster {
            dir,
            runners,
            approvals,
            db,
        }
    }

    /// A client of runner replica 0.
    pub async fn runner_as(&self, token: &str) -> Runner {
        self.runner_at(0, token).await
    }

    pub async fn runner_at(&self, replica: usize, token: &str) -> Runner {
        RunnerServiceClient::with_interceptor(
            self.runners[replica].channel().await,
            BearerToken::new(Some(token)).expect("ascii token"),
        )
        .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES)
    }

    /// A client of approval-svc replica 0.
    pub async fn approvals_as(&self, token: &str) -> Approvals {
        self.approvals_at(0, token).await
    }

    pub async fn approvals_at(&self, replica: usize, token: &str) -> Approvals {
        ApprovalServiceClient::with_interceptor(
            self.approvals[replica].channel().await,
            BearerToken::new(Some(token)).expect("ascii token"),
        )
    }

    pub fn runner_pids(&self) -> Vec<u32> {
        self.runners.iter().filter_map(Service::pid).collect()
    }

    pub fn approval_pids(&self) -> Vec<u32> {
        self.approvals.iter().filter_map(Service::pid).collect()
    }

    /// Bytes the services have stored: their data dirs, or the growth of the database since
    /// `db_before` (an empty database is several MiB of catalogue).
    pub fn stored_bytes(&self, db_before: u64) -> (u64, u64) {
        match &self.db {
            Some(db) => (db.bytes().saturating_sub(db_before), 0),
            None => (
                self.runners
                    .iter()
                    .map(|s| super::procstat::dir_bytes(&s.data_dir))
                    .sum(),
                self.approvals
                    .iter()
                    .map(|s| super::procstat::dir_bytes(&s.data_dir))
                    .sum(),
            ),
        }
    }

    pub async fn stop(mut self) {
        for a in &mut self.approvals {
            a.stop().await;
        }
        for r in &mut self.runners {
            r.stop().await;
        }
    }
}
