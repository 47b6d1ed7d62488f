//! The test host: free ports for servers that bind later, and the Debian packages the tests
//! install for themselves when they run as root.

use std::{
    net::TcpListener,
    process::Command,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
    },
};

use crate::bins;

/// A free TCP port on 127.0.0.1 for a server that binds it later (a service process, the
/// PostgreSQL server), after a restart too.
///
/// `bind(0)` would draw it from the kernel's ephemeral range, where a port released again can
/// be handed to anything in the meantime: another `bind(0)`, or the local end of an outgoing
/// connection (a pool connecting to PostgreSQL), and the server then fails to start with the
/// address in use. So the port is taken below that range, from a counter of this process that
/// starts at a place set by its id, and checked by binding it once: this process never hands
/// the same port out twice, and no outgoing connection can take it.
pub fn free_port() -> u16 {
    const FIRST: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // How many ports lie below the ephemeral range, and where this process starts among them.
    static RANGE: OnceLock<(u32, u32)> = OnceLock::new();
    let &(span, start) = RANGE.get_or_init(|| {
        // The ephemeral range's first port (Linux's default when it cannot be read).
        let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768);
        let span = ephemeral.saturating_sub(FIRST).max(1_000);
        (span, std::process::id().wrapping_mul(7_919) % span)
    });
    for _ in 0..span {
        let port = FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {FIRST}..{}", FIRST + span)
}

/// Installs Debian `packages` with `apt-get` when the tests run as root and `apt-get` is there
/// (a fresh machine or container, as CI's): the test command sets up what its tests need.
/// Anywhere else it installs nothing, and the caller fails naming the command. One install at
/// a time in a test process.
pub fn apt_install(packages: &[&str]) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    if !running_as_root() || bins::on_path("apt-get").is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    eprintln!("installing {} with apt-get (missing)", packages.join(" "));
    let apt = |args: &[&str]| {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("apt-get {} failed: {status:?}", args.join(" "));
        }
    };
    apt(&["update", "-qq"]);
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(packages);
    apt(&install);
}

/// Whether this process's effective uid is 0 (`Uid:` real, effective, saved, fs).
pub(crate) fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}
