//! The Python task worker processes of the workload: started on one shared effects file,
//! SIGKILLed and restarted in their slots under fresh worker ids, stopped with SIGTERM at the
//! end, and everything they printed, kept with the id of the process that printed it.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    task::JoinHandle,
};

/// A line a worker process printed, with the id of the process that printed it.
#[derive(Debug, Clone)]
pub struct Said {
    pub worker: String,
    pub line: String,
}

/// Python task workers sharing one effects file, each restartable in its slot under a new
/// worker id (`w{slot}-{start}`), so every lease and line names the process it came from.
pub struct WorkerPool {
    python: PathBuf,
    script: PathBuf,
    runner: String,
    pub effects: PathBuf,
    dir: PathBuf,
    slots: Vec<Option<(String, Child)>>,
    starts: Vec<u32>,
    lines: Arc<Mutex<Vec<Said>>>,
    readers: Vec<JoinHandle<()>>,
    /// Worker ids of every process started.
    pub started: Vec<String>,
}

impl WorkerPool {
    /// Starts `n` workers serving `py.*` with 1 s leases against `runner` (`host:port`); their
    /// stderr goes to `worker-{slot}.log` in `dir`, the effects file is `dir/effects.txt`.
    pub fn start(python: &Path, runner: &str, dir: &Path, n: usize) -> WorkerPool {
        let mut pool = WorkerPool {
            python: python.to_path_buf(),
            script: crate::process::workspace_root().join("tests/clients/python/task_worker.py"),
            runner: runner.to_string(),
            effects: dir.join("effects.txt"),
            dir: dir.to_path_buf(),
            slots: (0..n).map(|_| None).collect(),
            starts: vec![0; n],
            lines: Arc::default(),
            readers: Vec::new(),
            started: Vec::new(),
        };
        for slot in 0..n {
            pool.spawn(slot);
        }
        pool
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn spawn(&mut self, slot: usize) {
        self.starts[slot] += 1;
        let id = format!("w{slot}-{}", self.starts[slot]);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("worker-{slot}.log")))
            .expect("worker log file");
        let mut child = Command::new(&self.python)
            .arg(&self.script)
            .args([
                "--runner",
                &self.runner,
                "--worker-id",
                &id,
                "--types",
                "py.*",
            ])
            .args(["--max-in-flight", "4", "--lease-ms", "1000", "--effects"])
            .arg(&self.effects)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.python.display()));
        let stdout = child.stdout.take().expect("stdout piped");
        let (lines, worker) = (self.lines.clone(), id.clone());
        self.readers.push(tokio::spawn(async move {
            let mut stdout = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = stdout.next_line().await {
                let said = Said {
                    worker: worker.clone(),
                    line,
                };
                lines.lock().expect("worker lines").push(said);
            }
        }));
        self.started.push(id.clone());
        self.slots[slot] = Some((id, child));
    }

    /// SIGKILLs the worker in `slot` and starts a new one there; returns the killed one's id.
    pub async fn kill_and_restart(&mut self, slot: usize) -> String {
        let (id, mut child) = self.slots[slot].take().expect("a worker in the slot");
        let _ = child.start_kill();
        let _ = child.wait().await;
        self.spawn(slot);
        id
    }

    /// Whether worker `id` has printed `ready` (it has installed its SIGTERM handler and issued
    /// its first StreamTasks call).
    fn is_ready(&self, id: &str) -> bool {
        let lines = self.lines.lock().expect("worker lines");
        lines.iter().any(|s| s.worker == id && s.line == "ready")
    }

    /// SIGTERMs every worker (once it is ready: a Python process still importing would just
    /// die of the signal) and waits for each; returns what did not exit cleanly.
    pub async fn stop(&mut self) -> Vec<String> {
        let mut unclean = Vec::new();
        let ids: Vec<String> = self
            .slots
            .iter()
            .flatten()
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            let ready = tokio::time::timeout(Duration::from_secs(30), async {
                while !self.is_ready(id) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            if ready.await.is_err() {
                unclean.push(format!("worker {id} never printed ready"));
            }
        }
        for (id, mut child) in self.slots.iter_mut().filter_map(Option::take) {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            match tokio::time::timeout(Duration::from_secs(20), child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(status) => unclean.push(format!("worker {id} exited {status:?}")),
                Err(_) => {
                    let _ = child.start_kill();
                    unclean.push(format!("worker {id} did not stop within 20 s of SIGTERM"));
                }
            }
        }
        unclean
    }

    /// Everything the workers printed (call after [`WorkerPool::stop`]: waits for every pipe
    /// to close).
    pub async fn transcript(&mut self) -> Vec<Said> {
        for reader in self.readers.drain(..) {
            let _ = reader.await;
        }
        self.lines.lock().expect("worker lines").clone()
    }

    /// The worker processes' stderr, for a failure's diagnosis.
    pub fn logs_tail(&self) -> String {
        (0..self.len())
            .map(|slot| {
                let text = std::fs::read_to_string(self.dir.join(format!("worker-{slot}.log")))
                    .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- worker-{slot}.log (last 15 lines)\n{}",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
