//! Which replica leads: this replica's name and whether it leads now, for the
//! `arbor_approval_leader` gauge, the log and `GetLeader`. Only the leader follows the runner
//! and delivers decisions; on the embedded store the one process always leads.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Default)]
pub struct Replica {
    name: String,
    leading: AtomicBool,
}

impl Replica {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            leading: AtomicBool::new(false),
        }
    }

    /// The name this replica goes by (`--replica-name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Relaxed);
    }
}

/// The longest replica name: what PostgreSQL keeps of a session's name after the leader's
/// prefix (`arbor-approval-leader `, 63 bytes in all).
pub const MAX_NAME_BYTES: usize = 41;

/// Whether `name` can name a replica: printable ASCII (PostgreSQL shows other characters of a
/// session's name as `?`), not empty, at most [`MAX_NAME_BYTES`].
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "--replica-name must be 1 to {MAX_NAME_BYTES} bytes, not {}",
            name.len()
        ));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "--replica-name {name:?} must be printable ASCII without spaces"
        ));
    }
    Ok(())
}

/// The name a replica goes by unless told otherwise: its host's name and the port it serves,
/// which tells apart replicas on one host as well as replicas on many (a pod's host name is
/// the pod's name).
pub fn default_name(port: u16) -> String {
    let name: String = format!("{}:{port}", host_name())
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '-' })
        .collect();
    // A long host name keeps its end, where generated names (a pod's) differ.
    name[name.len().saturating_sub(MAX_NAME_BYTES)..].to_string()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_starts_not_leading_and_its_default_name_holds_its_port() {
        let r = Replica::new(default_name(50052));
        assert!(r.name().ends_with(":50052") && r.name().len() > ":50052".len());
        assert!(!r.is_leading());
        r.set_leading(true);
        assert!(r.is_leading());
        assert_eq!(check_name(r.name()), Ok(()));
        assert!(default_name(u16::MAX).len() <= MAX_NAME_BYTES);
    }

    #[test]
    fn a_name_postgres_would_mangle_is_refused() {
        assert_eq!(check_name("pod-7:50052"), Ok(()));
        for bad in ["", "with space", "naïve", &"x".repeat(MAX_NAME_BYTES + 1)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
