//! The same cycle in LangGraph 1.x (SQLite checkpointer, durability="sync"), run in a venv this
//! benchmark creates under target/. LangGraph runs in-process: no network hop, no second service,
//! no authentication — the table says so.

use std::{path::PathBuf, process::Command};

#[derive(Debug, Clone)]
pub struct LangGraphResult {
    pub cycles: usize,
    pub concurrency: usize,
    pub cycles_per_s: f64,
    pub total_p50_ms: f64,
    pub total_p95_ms: f64,
    pub total_p99_ms: f64,
    pub resume_p50_ms: f64,
    pub resume_p99_ms: f64,
    pub ledger_records: u64,
    pub bytes_per_run: f64,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Creates (once) the venv with LangGraph and its SQLite checkpointer; returns its python.
pub fn venv() -> Result<PathBuf, String> {
    let dir = root().join("target/bench-venv-langgraph");
    let python = dir.join("bin/python");
    if python.exists() {
        return Ok(python);
    }
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&dir)
        .status()
        .map_err(|e| format!("python3 is needed for the LangGraph comparison: {e}"))?;
    if !status.success() {
        return Err("python3 -m venv failed".into());
    }
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "langgraph>=1,<2",
            "langgraph-checkpoint-sqlite>=2,<4",
        ])
        .status()
        .map_err(|e| format!("pip failed: {e}"))?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err("pip install langgraph langgraph-checkpoint-sqlite failed".into());
    }
    Ok(python)
}

pub fn run(cycles: usize, concurrency: usize) -> Result<LangGraphResult, String> {
    let python = venv()?;
    let script = root().join("tests/bench/langgraph_cycle.py");
    let out = Command::new(python)
        .arg(script)
        .arg(cycles.to_string())
        .arg(concurrency.to_string())
        .output()
        .map_err(|e| format!("running the LangGraph script failed: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the LangGraph script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("unreadable LangGraph output: {e}"))?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(LangGraphResult {
        cycles,
        concurrency,
        cycles_per_s: f("cycles_per_s"),
        total_p50_ms: f("total_p50_ms"),
        total_p95_ms: f("total_p95_ms"),
        total_p99_ms: f("total_p99_ms"),
        resume_p50_ms: f("resume_p50_ms"),
        resume_p99_ms: f("resume_p99_ms"),
        ledger_records: v["ledger_records"].as_u64().unwrap_or(0),
        bytes_per_run: f("bytes_per_run"),
    })
}
