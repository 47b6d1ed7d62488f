//! The throwaway cluster does what the storage tests rely on: it answers on its URLs, each
//! fresh database is its own, the server never runs as root, committed data survives a crash,
//! a stopped server refuses connections until it is started again, and nothing outlives the
//! cluster — neither a dropped one nor the shared one of a process that has exited.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use arbor_testkit::PgCluster;

/// The postmaster's pid, from the first line of `postmaster.pid`.
fn postmaster_pid(data_dir: &Path) -> u32 {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    text.lines().next().unwrap().trim().parse().unwrap()
}

/// Real and effective uid of a process, from `/proc/PID/status`.
fn uids(pid: u32) -> (u32, u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let ids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (ids[0], ids[1])
}

fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn psql_answers_on_the_url_and_on_fresh_databases_of_their_own() {
    let pg = PgCluster::shared();
    assert_eq!(
        pg.url(),
        format!("postgres://arbor@127.0.0.1:{}/arbor", pg.port())
    );
    assert_eq!(pg.psql(&pg.url(), "select 1").unwrap(), "1");

    let a = pg.fresh_database("Fresh Case/A");
    let b = pg.fresh_database("Fresh Case/A");
    assert_ne!(a, b, "two calls, two databases");
    assert!(a.starts_with(&format!(
        "postgres://arbor@127.0.0.1:{}/fresh_case_a_",
        pg.port()
    )));
    pg.psql(&a, "create table t (v int); insert into t values (7)")
        .unwrap();
    assert_eq!(pg.psql(&a, "select v from t").unwrap(), "7");
    let err = pg.psql(&b, "select v from t").unwrap_err();
    assert!(err.contains("does not exist"), "{err}");
    assert_eq!(
        pg.psql(&b, "select current_database()").unwrap(),
        b.rsplit('/').next().unwrap()
    );
    assert_eq!(
        pg.psql(&a, "show max_connections; show fsync").unwrap(),
        "300\non"
    );
}

#[test]
fn a_database_answers_over_the_unix_socket_too() {
    let pg = PgCluster::shared();
    let tcp = pg.fresh_database("socket");
    let local = pg.over_socket(&tcp);
    assert_ne!(local, tcp);
    pg.psql(&tcp, "create table t (v int); insert into t values (7)")
        .unwrap();
    assert_eq!(pg.psql(&local, "select v from t").unwrap(), "7");
    // The server's address is NULL (psql prints nothing) on a Unix socket, 127.0.0.1 on TCP.
    assert_eq!(pg.psql(&local, "select inet_server_addr()").unwrap(), "");
    assert_eq!(
        pg.psql(&tcp, "select host(inet_server_addr())").unwrap(),
        "127.0.0.1"
    );
}

#[test]
fn the_server_does_not_run_as_root() {
    let pg = PgCluster::shared();
    let pid = postmaster_pid(&pg.data_dir());
    let (real, effective) = uids(pid);
    let (my_real, my_effective) = uids(std::process::id());
    if my_effective == 0 {
        assert!(
            real != 0 && effective != 0,
            "postmaster {pid} runs as uid {real}/{effective}"
        );
    } else {
        assert_eq!((real, effective), (my_real, my_effective));
    }
}

#[test]
fn committed_data_survives_an_immediate_restart() {
    let pg = PgCluster::start();
    let url = pg.fresh_database("crash");
    pg.psql(
        &url,
        "create table t (v text); insert into t values ('kept')",
    )
    .unwrap();
    let before = postmaster_pid(&pg.data_dir());
    pg.restart_immediate();
    assert_ne!(postmaster_pid(&pg.data_dir()), before, "a new server");
    assert_eq!(pg.psql(&url, "select v from t").unwrap(), "kept");
    assert!(
        pg.log_tail().contains("not properly shut down") || pg.log_tail().contains("redo"),
        "the restart recovered from a crash:\n{}",
        pg.log_tail()
    );
}

#[test]
fn a_stopped_server_refuses_connections_until_started_again() {
    let pg = PgCluster::start();
    let port = pg.port();
    pg.psql(
        &pg.url(),
        "create table t (v int); insert into t values (1)",
    )
    .unwrap();
    pg.stop_immediate();
    let err = pg.psql(&pg.url(), "select 1").unwrap_err();
    assert!(
        err.contains("127.0.0.1") || err.contains("connect"),
        "{err}"
    );
    pg.start_again();
    assert_eq!(pg.port(), port);
    assert_eq!(pg.psql(&pg.url(), "select count(*) from t").unwrap(), "1");
}

#[test]
fn the_shared_cluster_cannot_be_stopped() {
    let err = std::panic::catch_unwind(|| PgCluster::shared().stop_immediate()).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("PgCluster::start()"), "{msg}");
    assert_eq!(
        PgCluster::shared()
            .psql(&PgCluster::shared().url(), "select 1")
            .unwrap(),
        "1"
    );
}

#[test]
fn dropping_a_cluster_stops_its_server_and_removes_its_directory() {
    let pg = PgCluster::start();
    let dir = pg.data_dir();
    let pid = postmaster_pid(&dir);
    drop(pg);
    assert!(!dir.exists(), "{} is still there", dir.display());
    // pg_ctl waited for the exit; only init's reaping of the orphan may lag.
    eventually("the postmaster is gone", || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
}

/// Run by the next test in a child process: starts the shared cluster, says where it is, and
/// ends the process without dropping anything.
#[test]
#[ignore = "a helper process of the_shared_cluster_dies_with_its_process"]
fn helper_process_holding_the_shared_cluster() {
    let pg = PgCluster::shared();
    println!(
        "CLUSTER {} {}",
        postmaster_pid(&pg.data_dir()),
        pg.data_dir().display()
    );
    // SIGKILL: no destructors, no atexit, no chance to clean up.
    Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status()
        .unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn the_shared_cluster_dies_with_its_process() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "--nocapture"])
        .arg("helper_process_holding_the_shared_cluster")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CLUSTER "))
        .unwrap_or_else(|| {
            panic!(
                "the helper said nothing:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let (pid, dir) = line.split_once(' ').unwrap();
    let dir = PathBuf::from(dir);
    assert!(!out.status.success(), "the helper was killed");
    eventually("the orphaned postmaster exits", || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    eventually("its directory is removed", || !dir.exists());
}
