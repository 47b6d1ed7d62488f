//! CPU time and peak memory of a process, read from /proc.

pub use arbor_shared::procstat::cpu_seconds;

/// CPU seconds of `root` and its live children, plus what its reaped children used (a
/// PostgreSQL server: the postmaster forks a process per connection and per background task).
pub fn tree_cpu_seconds(root: u32) -> f64 {
    let mut total = cpu_seconds(root) + reaped_children_cpu(root);
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if stat_field(pid, 1) == Some(f64::from(root)) {
                total += cpu_seconds(pid);
            }
        }
    }
    total
}

/// cutime + cstime: CPU of children `pid` has waited for.
fn reaped_children_cpu(pid: u32) -> f64 {
    (stat_field(pid, 13).unwrap_or(0.0) + stat_field(pid, 14).unwrap_or(0.0)) / 100.0
}

/// Field `i` of /proc/<pid>/stat counted from the one after the command name (0 = state,
/// 1 = ppid, 11/12 = utime/stime, 13/14 = cutime/cstime, in clock ticks).
fn stat_field(pid: u32, i: usize) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(i)?.parse().ok()
}

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
