//! The schema and start-up on PostgreSQL, with real processes: replicas of both services starting
//! together on an empty database migrate it once and all serve; a database that a newer release
//! migrated is refused at start-up with a message naming both versions, and left as it was;
//! an older release's database is brought up to date. A login the server refuses (a wrong
//! password, a missing role) or a missing database ends start-up at once, non-zero, with a line
//! naming it, unless `--store-wait-always` asks to wait; a server that comes up late is waited
//! for, and then served.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_testkit::PgCluster;
use arbor_tests::{
    Profile, WAIT, eventually,
    process::{Replicas, Service},
};

/// The line a service logs for each migration it applies.
const MIGRATED: &str = "schema migrated";
/// The line a service logs while it waits for the database at start-up.
const WAITING: &str = "waiting for the database";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_migrate_once_a_newer_schema_is_refused_and_an_older_one_upgraded() {
    let cluster = PgCluster::shared();
    let url = cluster.fresh_database("schema_versions");
    let sql = |q: &str| cluster.psql(&url, q).unwrap().trim().to_string();
    let versions = || {
        sql(
            "SELECT string_agg(component || '=' || version, ' ' ORDER BY component) FROM arbor_schema",
        )
    };

    // Two replicas of each service, all started at once on the empty database.
    let mut r = Replicas::prepare(Profile::Debug, &url, (2, 2), Vec::new(), Vec::new());
    for s in r.runners.iter_mut().chain(r.approvals.iter_mut()) {
        s.spawn();
    }
    for s in r.runners.iter_mut().chain(r.approvals.iter_mut()) {
        s.wait_serving(WAIT).await;
    }
    // Each runner names the store it uses: PostgreSQL, not a data dir it never opens.
    for s in &r.runners {
        let log = s.log_since_start();
        assert!(
            log.contains("store=postgres") && !log.contains("data_dir"),
            "the runner's start-up log names another store:\n{log}"
        );
    }
    let current = versions();
    let known: Vec<(String, i32)> = current
        .split(' ')
        .map(|cv| {
            let (c, v) = cv.split_once('=').unwrap();
            (c.to_string(), v.parse().unwrap())
        })
        .collect();
    assert_eq!(
        known.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
        ["approval", "runner"],
        "{current}"
    );
    // Each migration applied once, by one of the four.
    let applied: usize = r
        .runners
        .iter()
        .chain(&r.approvals)
        .map(|s| s.log_since_start().matches(MIGRATED).count())
        .sum();
    let migrations: i32 = known.iter().map(|(_, v)| v).sum();
    assert_eq!(
        applied, migrations as usize,
        "migrations applied, all replicas"
    );
    assert!(r.stop_all().await.is_empty());

    // A newer release migrated the database since: neither service starts on it, and each
    // says which versions it found and knows.
    sql("UPDATE arbor_schema SET version = version + 1");
    let ahead = versions();
    let rows = || {
        sql(
            "SELECT (SELECT count(*) FROM runner_kv) || '/' || (SELECT count(*) FROM approval_records)",
        )
    };
    let rows_before = rows();
    for (s, (component, v)) in [&mut r.approvals[0], &mut r.runners[0]]
        .into_iter()
        .zip(&known)
    {
        s.spawn();
        let code = s.wait_exit(WAIT).await;
        assert!(
            matches!(code, Some(c) if c != 0),
            "{component}: exit {code:?}; log:\n{}",
            s.log_tail()
        );
        let said = format!(
            "the database's {component} schema is at version {}, newer than this binary's {v}",
            v + 1
        );
        assert!(
            s.log_since_start().contains(&said),
            "{component} did not say {said:?}; log:\n{}",
            s.log_tail()
        );
    }
    assert_eq!(versions(), ahead, "a refused start changed the versions");
    assert_eq!(rows(), rows_before, "a refused start changed the data");

    // An older release's database: each component one migration behind, with what its last
    // migration made undone (the runner's ledger sequence, the approvals' delegations).
    sql("UPDATE arbor_schema SET version = version - 2; \
         DROP SEQUENCE runner_ledger_seq; \
         DROP TABLE approval_delegations");
    r.runners[0].start().await;
    r.approvals[0].start().await;
    assert_eq!(versions(), current, "an older database brought up to date");
    assert_eq!(
        sql("SELECT count(*) FROM pg_class WHERE relname = 'runner_ledger_seq'"),
        "1"
    );
    assert_eq!(
        sql("SELECT count(*) FROM pg_class WHERE relname = 'approval_delegations'"),
        "1"
    );
    assert!(r.stop_all().await.is_empty());
}

/// One runner and one approval-svc on `url`, not started, with `args` besides.
fn pair(url: &str, args: &[&str]) -> Replicas {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    Replicas::prepare(Profile::Debug, url, (1, 1), args.clone(), args)
}

fn both(r: &mut Replicas) -> [&mut Service; 2] {
    let (runners, approvals) = (&mut r.runners, &mut r.approvals);
    [&mut runners[0], &mut approvals[0]]
}

/// Waits until `service` has logged `line` since its start.
async fn logged(service: &Service, line: &str) {
    let what = format!("{:?} to log {line:?}", service.kind);
    eventually(&what, WAIT, || async move {
        service.log_since_start().contains(line).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_or_a_missing_database_ends_start_up_at_once_unless_told_to_wait() {
    let cluster = PgCluster::shared();
    let url = cluster.fresh_database("misconfigured");
    let server = format!("127.0.0.1:{}", cluster.port());
    let db = url.rsplit('/').next().unwrap().to_string();
    // A role that logs in with a password: the cluster trusts every other login.
    cluster
        .psql(
            &url,
            "CREATE ROLE arbor_pw LOGIN SUPERUSER PASSWORD 'right'",
        )
        .unwrap();
    let hba = cluster.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all arbor_pw 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    cluster.psql(&url, "SELECT pg_reload_conf()").unwrap();
    let wrong_password = format!("postgres://arbor_pw:wrong@{server}/{db}");

    for (store, said) in [
        (
            wrong_password.clone(),
            "PostgreSQL refused the login of the store URL (check its user and password): \
             28P01: password authentication failed for user \"arbor_pw\"",
        ),
        (
            format!("postgres://nobody_here@{server}/{db}"),
            "PostgreSQL refused the login of the store URL (check its user and password): \
             28000: role \"nobody_here\" does not exist",
        ),
        (
            format!("postgres://arbor@{server}/no_such_database"),
            "the database in the store URL does not exist: 3D000: database \
             \"no_such_database\" does not exist",
        ),
    ] {
        let mut r = pair(&store, &[]);
        for s in both(&mut r) {
            s.spawn();
            let code = s.wait_exit(WAIT).await;
            let log = s.log_since_start();
            assert!(
                matches!(code, Some(c) if c != 0),
                "{:?}: exit {code:?}; log:\n{log}",
                s.kind
            );
            let last = log.lines().last().unwrap_or_default();
            assert!(
                last.starts_with("error: ") && last.ends_with(said),
                "{:?} did not end with {said:?}; log:\n{log}",
                s.kind
            );
            assert!(!log.contains(WAITING), "{:?} waited; log:\n{log}", s.kind);
        }
    }

    // Told to wait, both wait through the refusals, and serve once the password is right.
    let mut r = pair(&wrong_password, &["--store-wait-always"]);
    for s in both(&mut r) {
        s.spawn();
        logged(s, "28P01").await;
        logged(s, WAITING).await;
    }
    cluster
        .psql(&url, "ALTER ROLE arbor_pw PASSWORD 'wrong'")
        .unwrap();
    for s in both(&mut r) {
        s.wait_serving(WAIT).await;
    }
    assert!(r.stop_all().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_server_that_comes_up_late_is_waited_for_then_served() {
    let cluster = PgCluster::start();
    tokio::task::block_in_place(|| cluster.stop_immediate());
    let mut r = pair(&cluster.url(), &[]);
    for s in both(&mut r) {
        s.spawn();
        logged(s, WAITING).await;
    }
    tokio::task::block_in_place(|| cluster.start_again());
    for s in both(&mut r) {
        s.wait_serving(WAIT).await;
    }
    assert!(r.stop_all().await.is_empty());
}
