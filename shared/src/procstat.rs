//! CPU time of a process, read from /proc: what the benchmarks (`arbor-bench`, the runner's
//! mailbox bench) report per row.

/// Clock ticks per second of /proc/<pid>/stat (USER_HZ is 100 on every Linux we run on).
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU seconds the process has used so far; 0 where /proc cannot tell.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 after the ')'.
    (ticks(11) + ticks(12)) / TICKS_PER_SECOND
}
