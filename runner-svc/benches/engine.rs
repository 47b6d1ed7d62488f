//! Engine throughput and checkpoint cost, next to py_trees 2.x running the same tree shapes.
//! Run with `cargo bench -p arbor-runner-svc --bench engine`. The py_trees side lives in
//! `py_trees_bench.py` and runs in a venv under the target directory; without python or pip the
//! bench says so and prints Arbor's figures alone.
//!
//! The loop case (`-- loop` runs it alone) steps a `repeat` of tool calls the way the runner
//! does (decode the checkpoint, tick, encode) and shows the step cost and checkpoint size at
//! iteration 10, 1,000 and 10,000: a long-running loop must not slow down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use arbor_runner_svc::engine::{
    Checkpoint, GuardConfig, LedgerTool, TickEnv, TickStatus, ToolRegistry, TreeFormat, TreeSpec,
    parse_tree, tick,
};
use arbor_shared::domain::RunMode;
use serde_json::{Map, Value as Json, json};

/// 9 nodes: a selector whose first child fails and whose second runs six leaves.
fn block(i: usize) -> Json {
    let mut work = Vec::new();
    for key in ["a", "b", "c"] {
        let key = format!("{key}{i}");
        work.push(json!({"type": "set", "key": key, "value": i}));
        work.push(json!({"type": "condition", "key": key, "op": "eq", "value": i}));
    }
    json!({"type": "selector", "children": [
        {"type": "condition", "key": "never", "op": "exists"},
        {"type": "sequence", "children": work}
    ]})
}

fn parse(root: Json) -> TreeSpec {
    let doc = json!({"id": "bench", "version": 1, "root": root});
    parse_tree(&doc.to_string(), TreeFormat::Json).unwrap()
}

/// 1,000 nodes: a sequence of 111 blocks.
fn big_tree() -> TreeSpec {
    parse(json!({"type": "sequence", "children": (0..111).map(block).collect::<Vec<_>>()}))
}

/// 10 nodes.
fn small_tree() -> TreeSpec {
    parse(json!({"type": "sequence", "children": [
        {"type": "set", "key": "x", "value": 1},
        {"type": "condition", "key": "x", "op": "eq", "value": 1},
        {"type": "selector", "children": [
            {"type": "condition", "key": "never", "op": "exists"},
            {"type": "set", "key": "y", "value": 2}
        ]},
        {"type": "sequence", "children": [
            {"type": "set", "key": "z", "value": 3},
            {"type": "condition", "key": "z", "op": "eq", "value": 3},
            {"type": "set", "key": "w", "value": 4}
        ]}
    ]}))
}

/// `n` nodes that stop mid-run at an approval gate, after filling the blackboard.
fn suspended_tree(n: usize) -> TreeSpec {
    let blocks = (n - 3) / 9;
    let mut children: Vec<Json> = (0..blocks).map(block).collect();
    for i in 0..(n - 3 - blocks * 9) {
        children.push(json!({"type": "set", "key": format!("pad{i}"), "value": i}));
    }
    children.push(
        json!({"type": "approval", "name": "gate", "title": "Go on?",
        "context": ["a0"], "child": {"type": "succeed"}}),
    );
    let spec = parse(json!({"type": "sequence", "children": children}));
    assert_eq!(spec.node_count(), n);
    spec
}

struct Bench {
    tools: ToolRegistry,
    _dir: tempfile::TempDir,
}

impl Bench {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = arbor_runner_svc::store::OpenConfig {
            url: None,
            data_dir: dir.path().to_path_buf(),
            cache_bytes: 1 << 20,
            lock_wait: Duration::ZERO,
            wait_always: false,
        };
        let store = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(arbor_runner_svc::store::open(&config))
            .unwrap();
        let ledger = LedgerTool::new(store).unwrap();
        Self {
            tools: ToolRegistry::with_builtins(ledger, GuardConfig::default()),
            _dir: dir,
        }
    }

    fn env(&self) -> TickEnv<'_> {
        TickEnv {
            run_id: "run",
            thread_id: "thread",
            tree_id: "bench",
            tree_version: 1,
            submitted_by: "bench",
            now_ms: 1_700_000_000_000,
            mode: RunMode::Yield,
            tools: &self.tools,
        }
    }

    /// Ticks fresh runs of `spec` to completion (one tick each) for at least `min` and at least
    /// `at_least` runs; returns ticks per second.
    fn rate(&self, spec: &TreeSpec, at_least: u64, min: Duration) -> f64 {
        let env = self.env();
        let start = Instant::now();
        let mut ticks = 0u64;
        while ticks < at_least || start.elapsed() < min {
            let mut ck = Checkpoint::new(spec, "thread", Map::new());
            let out = tick(spec, &mut ck, Vec::new(), &env);
            assert_eq!(out.status, TickStatus::Success, "{}", out.error);
            ticks += 1;
        }
        ticks as f64 / start.elapsed().as_secs_f64()
    }

    /// Size of a mid-run checkpoint of an `n`-node tree and the mean encode+decode time.
    fn checkpoint(&self, n: usize) -> (usize, Duration) {
        let spec = suspended_tree(n);
        let mut ck = Checkpoint::new(&spec, "thread", Map::new());
        let out = tick(&spec, &mut ck, Vec::new(), &self.env());
        assert_eq!(out.status, TickStatus::Running);
        let size = ck.encode().len();
        let rounds = (200_000 / n).max(20) as u32;
        let start = Instant::now();
        for _ in 0..rounds {
            let bytes = ck.encode();
            let back = Checkpoint::decode(&bytes).unwrap();
            std::hint::black_box(back);
        }
        (size, start.elapsed() / rounds)
    }
}

/// A `repeat` whose every iteration is one `echo` call and a 1 ms wait: one step per iteration.
fn loop_tree(iterations: u32) -> TreeSpec {
    parse(
        json!({"type": "repeat", "count": iterations, "child": {"type": "sequence", "children": [
            {"type": "tool", "name": "call", "tool": "echo", "args": {"n": 1}, "output": "out"},
            {"type": "wait", "ms": 1}
        ]}}),
    )
}

/// Iterations at which the loop case reports, and how many steps each window averages.
const LOOP_AT: [usize; 3] = [10, 1_000, 10_000];
const LOOP_WINDOW: usize = 200;

impl Bench {
    /// Steps one run of [`loop_tree`] through its iterations; for each of `LOOP_AT`, the mean
    /// step time (decode + tick + encode) over the window starting there and the checkpoint size
    /// at its start.
    fn loop_steps(&self) -> Vec<(Duration, usize)> {
        let last = LOOP_AT[LOOP_AT.len() - 1] + LOOP_WINDOW;
        let spec = loop_tree(last as u32 + 1);
        let mut env = self.env();
        let t0 = env.now_ms;
        let mut bytes = Checkpoint::new(&spec, "thread", Map::new()).encode();
        let mut rows = vec![(Duration::ZERO, 0); LOOP_AT.len()];
        for step in 0..last {
            env.now_ms = t0 + step as u64;
            let window = LOOP_AT
                .iter()
                .position(|&at| (at..at + LOOP_WINDOW).contains(&step));
            let start = Instant::now();
            let mut ck = Checkpoint::decode(&bytes).unwrap();
            let out = tick(&spec, &mut ck, Vec::new(), &env);
            bytes = ck.encode();
            let took = start.elapsed();
            assert_eq!(out.status, TickStatus::Running, "{}", out.error);
            if let Some(i) = window {
                if step == LOOP_AT[i] {
                    rows[i].1 = bytes.len();
                }
                rows[i].0 += took;
            }
        }
        rows.into_iter()
            .map(|(total, size)| (total / LOOP_WINDOW as u32, size))
            .collect()
    }
}

/// The loop table: the median of five runs per row.
fn print_loop(bench: &Bench) {
    let runs: Vec<Vec<(Duration, usize)>> = (0..5).map(|_| bench.loop_steps()).collect();
    println!("loop (repeat of echo + 1 ms wait; one step = decode + tick + encode, as the runner)");
    println!(
        "{:<12} {:>18} {:>12}",
        "iteration", "step (µs, median)", "ckpt bytes"
    );
    for (i, at) in LOOP_AT.iter().enumerate() {
        let mut times: Vec<Duration> = runs.iter().map(|r| r[i].0).collect();
        times.sort();
        let size = runs[0][i].1;
        println!(
            "{at:<12} {:>18.2} {size:>12}",
            times[times.len() / 2].as_secs_f64() * 1e6
        );
    }
}

struct PyTrees {
    big: f64,
    small: f64,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(format!("{cmd:?} failed: {}", tail.join(" | ")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates the venv (once), installs py_trees, runs the Python side of the bench.
fn py_trees() -> Result<PyTrees, String> {
    let venv = target_dir().join("bench-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    if run(Command::new(&python).args(["-c", "import py_trees"])).is_err() {
        run(Command::new(&python).args(["-m", "pip", "install", "-q", "py_trees>=2,<3"]))?;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/py_trees_bench.py");
    let line = run(Command::new(&python).arg(script))?;
    let v: Json =
        serde_json::from_str(line.trim()).map_err(|e| format!("bad output {line}: {e}"))?;
    let field = |k: &str| v[k].as_f64().ok_or_else(|| format!("no {k} in {line}"));
    Ok(PyTrees {
        big: field("big_ticks_per_s")?,
        small: field("small_ticks_per_s")?,
    })
}

fn main() {
    let bench = Bench::new();
    if std::env::args().any(|a| a == "loop") {
        print_loop(&bench);
        return;
    }
    let big = big_tree();
    let small = small_tree();
    // Warm-up, then measure.
    bench.rate(&big, 100, Duration::from_millis(200));
    let arbor_big = bench.rate(&big, 1_000, Duration::from_secs(2));
    let arbor_small = (0..3)
        .map(|_| bench.rate(&small, 10_000, Duration::ZERO))
        .fold(0.0, f64::max);

    println!("engine throughput (one tick runs the tree to completion; fresh checkpoint each run)");
    let py = py_trees();
    println!(
        "{:<40} {:>16} {:>16} {:>9}",
        "shape", "arbor ticks/s", "py_trees ticks/s", "ratio"
    );
    let rows = [
        (
            "(a) 1,000-node tree",
            arbor_big,
            py.as_ref().ok().map(|p| p.big),
        ),
        (
            "(b) 10-node tree, 10,000 runs",
            arbor_small,
            py.as_ref().ok().map(|p| p.small),
        ),
    ];
    for (name, arbor, theirs) in rows {
        match theirs {
            Some(t) => println!("{name:<40} {arbor:>16.0} {t:>16.0} {:>8.0}x", arbor / t),
            None => println!("{name:<40} {arbor:>16.0} {:>16} {:>9}", "n/a", "n/a"),
        }
    }
    if let Err(e) = &py {
        println!("py_trees unavailable, only Arbor's figures are shown: {e}");
    }

    println!();
    println!("checkpoint (mid-run: suspended at a gate after filling the blackboard)");
    println!(
        "{:<12} {:>12} {:>22}",
        "nodes", "bytes", "encode+decode (µs)"
    );
    for n in [100, 1_000, 10_000] {
        let (size, time) = bench.checkpoint(n);
        println!("{n:<12} {size:>12} {:>22.1}", time.as_secs_f64() * 1e6);
    }

    println!();
    print_loop(&bench);
}
