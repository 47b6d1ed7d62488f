//! The client packages of `clients/` as a user gets them: each is built from its directory into
//! a fresh virtualenv / `node_modules` under `target/`, type-checked (mypy strict; `tsc
//! --noEmit`), and its own tests (pytest; `node --test` on the built JS) run against the real
//! binaries with authentication on. The examples of each README run as written, a follow
//! iterator cut by SIGKILLing runner-svc resumes and yields every event once, in order, both
//! connect over TLS, and the committed stubs are what `proto/` generates.

mod generated;
mod node;
mod python;
mod tls;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_tests::{
    Cluster, WAIT, auth::Tokens, eventually, flow, gate_tree, process::workspace_root,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::{Child, Command},
    task::JoinHandle,
};

/// Lines a child process printed, collected as they arrive.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn snapshot(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn any(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.0.lock().unwrap().iter().any(|l| pred(l))
    }

    fn collect(&self, stream: impl AsyncRead + Unpin + Send + 'static) -> JoinHandle<()> {
        let lines = self.clone();
        tokio::spawn(async move {
            let mut stream = BufReader::new(stream).lines();
            while let Ok(Some(line)) = stream.next_line().await {
                lines.0.lock().unwrap().push(line);
            }
        })
    }
}

/// A child process with its stdout and stderr collected.
struct Running {
    child: Child,
    out: Lines,
    err: Lines,
    readers: Vec<JoinHandle<()>>,
}

impl Running {
    fn spawn(mut cmd: Command) -> Running {
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {shown}: {e} (is it installed?)"));
        let (out, err) = (Lines::default(), Lines::default());
        let readers = vec![
            out.collect(child.stdout.take().unwrap()),
            err.collect(child.stderr.take().unwrap()),
        ];
        Running {
            child,
            out,
            err,
            readers,
        }
    }

    fn transcript(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.out.snapshot().join("\n"),
            self.err.snapshot().join("\n")
        )
    }

    async fn line(&self, what: &str, pred: impl Fn(&str) -> bool) {
        // The outer deadline ends first, so the failure shows what the process printed.
        let found = eventually(what, WAIT + WAIT, || {
            let seen = self.out.any(&pred);
            async move { seen.then_some(()) }
        });
        if tokio::time::timeout(WAIT, found).await.is_err() {
            panic!("{what}: not seen\n{}", self.transcript());
        }
    }

    /// Waits for the exit; panics unless it is a success.
    async fn success(mut self, what: &str) -> Vec<String> {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{what}: still running\n{}", self.transcript()))
            .unwrap();
        // The readers finish with the pipes.
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(WAIT, reader).await;
        }
        assert!(
            status.success(),
            "{what} failed ({status}):\n{}",
            self.transcript()
        );
        self.out.snapshot()
    }

    /// Ends a process that runs until stopped and has no shutdown of its own to check.
    async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM: the process must exit with success (a clean shutdown).
    async fn terminate(mut self, what: &str) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{what}: did not stop on SIGTERM\n{}", self.transcript()))
            .unwrap();
        assert!(
            status.success(),
            "{what} did not exit cleanly on SIGTERM ({status}):\n{}",
            self.transcript()
        );
    }
}

/// Runs `cmd` (a package's own test suite) to completion; panics with its output on failure.
async fn suite(mut cmd: Command, what: &str) {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{what}: cannot run {shown}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("{what}:\n{stdout}");
    assert!(
        out.status.success(),
        "{what} failed ({}): {shown}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

/// The environment a package's tests read: addresses and one token per role.
fn service_env(cluster: &Cluster, tokens: &Tokens) -> Vec<(&'static str, String)> {
    vec![
        ("ARBOR_RUNNER", cluster.runner.addr.to_string()),
        ("ARBOR_APPROVAL", cluster.approval.addr.to_string()),
        ("ARBOR_SUBMITTER_TOKEN", tokens.submitter.clone()),
        ("ARBOR_APPROVER_TOKEN", tokens.approver.clone()),
        ("ARBOR_WORKER_TOKEN", tokens.worker.clone()),
    ]
}

/// The fenced code blocks of `readme` opened with "```{lang} example={name}": what the test
/// runs, as the README shows it. Panics when `names` are not all there.
fn readme_examples(readme: &Path, lang: &str, names: &[&str]) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(readme).unwrap();
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some((name, code)) = current.as_mut() {
            if line.trim_start().starts_with("```") {
                out.push((std::mem::take(name), std::mem::take(code)));
                current = None;
            } else {
                code.push_str(line);
                code.push('\n');
            }
        } else if let Some(rest) = line.strip_prefix(&format!("```{lang} example=")) {
            current = Some((rest.trim().to_string(), String::new()));
        }
    }
    let found: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(found, names, "the examples of {}", readme.display());
    out
}

/// A scratch directory under `target/` for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = arbor_tests::tools::target_dir()
        .join("clients-scratch")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn seqs(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("event seq="))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

/// A follower (`follow` builds its command from the runner's address, a subscriber id and the
/// run id) follows a suspended run; runner-svc is SIGKILLed and restarted under it, the run is
/// approved and ends. The follower must have seen every event of the run once, in order, some
/// of them after the restart, and have reconnected.
async fn follow_across_a_runner_kill(lang: &str, follow: impl Fn(&str, &str, &str) -> Command) {
    let mut cluster = Cluster::start(arbor_tests::Profile::Debug).await;
    let run = flow::submit(
        &cluster,
        gate_tree(&format!("{lang}-followed"), "failure"),
        None,
    )
    .await;
    let pending = flow::approval_of(&cluster, &run.run_id, apb::ApprovalState::Pending).await;
    let before = flow::events_of(&cluster, &run.run_id)
        .await
        .last()
        .unwrap()
        .seq;

    let subscriber = format!("{lang}-{}", uuid::Uuid::new_v4().simple());
    let addr = cluster.runner.addr.to_string();
    let follower = Running::spawn(follow(&addr, &subscriber, &run.run_id));
    follower
        .line("the follower to reach the suspension", |l| {
            l.starts_with(&format!("event seq={before} "))
        })
        .await;

    cluster.runner.kill().await;
    cluster.runner.start().await;
    follower
        .line("the follower to reconnect", |l| l.starts_with("reconnect"))
        .await;
    flow::approve(&cluster, &pending.request_id).await;
    flow::wait_run(&cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    let lines = follower.success(&format!("the {lang} follower")).await;
    assert_eq!(lines.last().map(String::as_str), Some("done"), "{lines:?}");

    let want: Vec<u64> = flow::events_of(&cluster, &run.run_id)
        .await
        .iter()
        .map(|e| e.seq)
        .collect();
    let got = seqs(&lines);
    assert_eq!(
        got, want,
        "every event of the run, once, in order:\n{lines:#?}"
    );
    assert!(
        got.iter().any(|s| *s > before),
        "events after the restart were seen"
    );
}

fn root() -> PathBuf {
    workspace_root()
}
