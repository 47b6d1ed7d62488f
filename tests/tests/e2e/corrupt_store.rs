//! A damaged database at start-up: each service, started on a copy of a real data directory
//! whose sled files were deleted, truncated or garbled (`db`, `conf`, blob files, the integrity
//! marker), must exit non-zero with an error that says what is wrong — never panic, and never
//! serve an emptier database than the one it had. The undamaged copy must still start and hold
//! every run, so the checks cost nothing on healthy data.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use arbor_shared::{
    json::to_proto_struct,
    proto::{approval::v1 as apb, runner::v1 as rpb},
};
use arbor_tests::{
    Cluster, Profile, Service, ServiceKind,
    clients::{approvals_as, runner_as},
    process::{free_port, run_to_exit},
    secured::{register, wait_approval, wait_run},
};
use serde_json::json;

/// A gate whose request copies two blackboard values into its context: run `corrupt-1` carries
/// a 1.2 MB input that `dup` doubles, so its checkpoint, its events and its approval (2.4 MB
/// each) are above sled's blob threshold (a quarter of the 8 MiB log segment) in both services,
/// while every response stays under the 4 MiB message limit. Its approval stays pending, so the
/// blob files hold live data (blobs of superseded versions may linger until sled reclaims their
/// segment; deleting only those loses nothing).
fn big_gate() -> String {
    json!({"id": "big-gate", "version": 1, "root": {"type": "sequence", "name": "root",
        "children": [
            {"type": "set", "name": "dup", "key": "big2", "value": {"$ref": "big"}},
            {"type": "approval", "name": "gate", "phase": "before", "on_reject": "failure",
             "title": "Big?", "context": ["big", "big2"],
             "child": {"type": "succeed", "name": "ok"}}]}})
    .to_string()
}

/// Builds real data directories for both services: runs waiting at a gate, one decided, values
/// big enough for blob files. Returns (runner dir, approval dir, run ids) after a clean stop.
async fn make_data() -> (tempfile::TempDir, PathBuf, PathBuf, Vec<String>) {
    let (mut cluster, t) = Cluster::start_secure(Profile::Debug).await;
    let mut sam = runner_as(&cluster.runner.url(), Some(&t.submitter));
    let alice = approvals_as(&cluster.approval.url(), Some(&t.approver));
    register(&mut sam, big_gate()).await;
    let mut runs = Vec::new();
    for i in 0..4 {
        let run_id = format!("corrupt-{i}");
        sam.submit_run(rpb::SubmitRunRequest {
            tree_id: "big-gate".into(),
            run_id: run_id.clone(),
            input: Some(to_proto_struct(
                json!({"big": "b".repeat(if i == 1 { 1_200_000 } else { 100 }), "i": i})
                    .as_object()
                    .unwrap(),
            )),
            ..Default::default()
        })
        .await
        .unwrap();
        wait_approval(&alice, &run_id, apb::ApprovalState::Pending).await;
        runs.push(run_id);
    }
    let first = wait_approval(&alice, &runs[0], apb::ApprovalState::Pending).await;
    alice
        .clone()
        .resolve(apb::ResolveRequest {
            request_id: first.request_id,
            decision: rpb::DecisionKind::Approve as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_run(&sam, &runs[0], rpb::RunStatus::Succeeded).await;
    wait_approval(&alice, &runs[0], apb::ApprovalState::Pruned).await;
    assert_eq!(cluster.approval.stop().await, Some(0));
    assert_eq!(cluster.runner.stop().await, Some(0));
    let runner_dir = cluster.runner.data_dir.clone();
    let approval_dir = cluster.approval.data_dir.clone();
    for dir in [&runner_dir, &approval_dir] {
        assert!(
            blobs(dir).next().is_some(),
            "no blob files in {}: the blob cases would test nothing",
            dir.display()
        );
    }
    (cluster.dir, runner_dir, approval_dir, runs)
}

fn blobs(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir.join("blobs"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn garble(path: &Path, offset: u64, len: usize) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    // Deterministic noise: the same damage every run.
    let noise: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(151).wrapping_add(7))
        .collect();
    f.write_all(&noise).unwrap();
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Damage done to a copied data directory.
type Damage = fn(&Path);

/// The damage, by name.
fn damages() -> Vec<(&'static str, Damage)> {
    vec![
        ("db deleted", |d| {
            std::fs::remove_file(d.join("db")).unwrap()
        }),
        ("db truncated to 0 bytes", |d| truncate(&d.join("db"), 0)),
        ("db truncated to half", |d| {
            truncate(&d.join("db"), len(&d.join("db")) / 2)
        }),
        ("db truncated by its last 4 KiB", |d| {
            truncate(&d.join("db"), len(&d.join("db")).saturating_sub(4096))
        }),
        ("db head garbled", |d| garble(&d.join("db"), 0, 4096)),
        ("db middle garbled", |d| {
            garble(&d.join("db"), len(&d.join("db")) / 2, 4096)
        }),
        ("conf deleted", |d| {
            std::fs::remove_file(d.join("conf")).unwrap()
        }),
        ("conf truncated to 0 bytes", |d| {
            truncate(&d.join("conf"), 0)
        }),
        ("conf garbled", |d| {
            garble(&d.join("conf"), 0, len(&d.join("conf")) as usize)
        }),
        ("blob files deleted", |d| {
            blobs(d).for_each(|b| std::fs::remove_file(b).unwrap())
        }),
        ("blob files truncated", |d| {
            blobs(d).for_each(|b| truncate(&b, len(&b) / 2))
        }),
        ("blob files garbled", |d| {
            blobs(d).for_each(|b| garble(&b, 64, 1024))
        }),
        ("integrity marker garbled", |d| {
            std::fs::write(d.join("arbor-integrity.toml"), "store_id = [").unwrap()
        }),
    ]
}

/// The runs as `make_data` left them: the first approved and done, the others waiting.
fn expected_status(i: usize) -> rpb::RunStatus {
    if i == 0 {
        rpb::RunStatus::Succeeded
    } else {
        rpb::RunStatus::Suspended
    }
}

/// Starts a runner on a copy of `data` and checks that it holds every run as `make_data` left
/// it, the 1.2 MB input of `corrupt-1` included.
async fn holds_every_run(
    binary: &Path,
    data: &Path,
    root: &Path,
    runs: &[String],
) -> Result<(), String> {
    let mut runner = Service::new(ServiceKind::Runner, binary.to_path_buf(), root, Vec::new());
    copy_dir(data, &runner.data_dir);
    runner.start().await;
    let mut client = runner_as(&runner.url(), None);
    let mut problems = Vec::new();
    for (i, run_id) in runs.iter().enumerate() {
        match client
            .get_run(rpb::GetRunRequest {
                run_id: run_id.clone(),
            })
            .await
        {
            Err(e) => problems.push(format!("{run_id}: {e}")),
            Ok(r) => {
                let run = r.into_inner().run.unwrap_or_default();
                if run.status != expected_status(i) as i32 {
                    problems.push(format!("{run_id}: status {}", run.status));
                }
                let big = run
                    .blackboard
                    .as_ref()
                    .and_then(|b| b.fields.get("big"))
                    .and_then(|v| match &v.kind {
                        Some(prost_types::value::Kind::StringValue(s)) => Some(s.len()),
                        _ => None,
                    });
                let want = if i == 1 { 1_200_000 } else { 100 };
                if big != Some(want) {
                    problems.push(format!(
                        "{run_id}: input 'big' is {big:?} bytes, not {want}"
                    ));
                }
            }
        }
    }
    assert_eq!(runner.stop().await, Some(0));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn serve_args(kind: ServiceKind, data_dir: &Path) -> Vec<String> {
    let mut args = vec![
        "serve".to_string(),
        "--listen".into(),
        format!("127.0.0.1:{}", free_port()),
        "--data-dir".into(),
        data_dir.display().to_string(),
    ];
    if kind == ServiceKind::Approval {
        // No runner needed to open the store; the connection is lazy.
        args.extend(["--runner".into(), "http://127.0.0.1:9".into()]);
    }
    args
}

async fn each_damage_is_refused(
    kind: ServiceKind,
    binary: &Path,
    pristine: &Path,
    scratch: &Path,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, (name, damage)) in damages().into_iter().enumerate() {
        let dir = scratch.join(format!("{kind:?}-{i}"));
        copy_dir(pristine, &dir);
        damage(&dir);
        // A refusal comes within a second or two.
        let exited = run_to_exit(binary, &serve_args(kind, &dir), Duration::from_secs(20)).await;
        let last_line = exited
            .stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("error:"))
            .unwrap_or("");
        let refused = !exited.timed_out
            && exited.code.is_some_and(|c| c != 0)
            && !last_line.is_empty()
            && !exited.stderr.contains("panicked");
        let ok = refused;
        println!(
            "{} {kind:?} {name:<32}: exit {:?}{} {}",
            if ok { "ok  " } else { "FAIL" },
            exited.code,
            if exited.timed_out {
                " (kept serving)"
            } else {
                ""
            },
            last_line
        );
        if !ok {
            // sled's panic messages can quote megabytes of key bytes.
            let lines: Vec<String> = exited
                .stderr
                .lines()
                .map(|l| l.chars().take(300).collect())
                .collect();
            println!(
                "---- stderr of {kind:?} {name}:\n{}\n----",
                lines[lines
                    .iter()
                    .position(|l| l.contains("panicked"))
                    .unwrap_or(lines.len().saturating_sub(30))..]
                    .iter()
                    .take(30)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            failures.push(format!("{kind:?}: {name}"));
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_databases_stop_start_up_with_a_clear_error() {
    let (dir, runner_dir, approval_dir, runs) = make_data().await;
    let bins = arbor_tests::Binaries::get(Profile::Debug);
    let scratch = dir.path().join("damaged");
    let mut failures = Vec::new();
    for (kind, binary, data) in [
        (ServiceKind::Runner, &bins.runner, &runner_dir),
        (ServiceKind::Approval, &bins.approval, &approval_dir),
    ] {
        failures.extend(each_damage_is_refused(kind, binary, data, &scratch).await);
    }
    // The undamaged data still opens, with every run and approval as they were.
    let healthy = dir.path().join("healthy");
    if let Err(e) = holds_every_run(&bins.runner, &runner_dir, &healthy, &runs).await {
        failures.push(format!("Runner: the healthy copy: {e}"));
    }
    let mut approval = Service::new(
        ServiceKind::Approval,
        bins.approval.clone(),
        &healthy,
        vec!["--runner".into(), "http://127.0.0.1:9".into()],
    );
    copy_dir(&approval_dir, &approval.data_dir);
    approval.start().await;
    let all = approvals_as(&approval.url(), None)
        .list_approvals(apb::ListApprovalsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(all.len(), runs.len(), "every approval is still there");
    assert_eq!(approval.stop().await, Some(0));
    assert!(
        failures.is_empty(),
        "damage not refused cleanly: {failures:#?}"
    );
}
