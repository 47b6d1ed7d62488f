//! CPU time and peak memory of a process, read from /proc.

pub use arbor_shared::procstat::cpu_seconds;

/// Peak resident set size (VmHWM) in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    status_kb(pid, "VmHWM:") * 1024
}

/// Current resident set size (VmRSS) in bytes.
pub fn rss(pid: u32) -> u64 {
    status_kb(pid, "VmRSS:") * 1024
}

fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Total size of the files under `dir`.
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_bytes(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Percentile (0.0–1.0) of sorted samples, in milliseconds.
pub fn pct_ms(sorted: &[std::time::Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}
