//! The non-Rust tools the polyglot, manifest and browser tests run, installed by the tests
//! themselves on first use under `target/` (never committed): Python virtual environments from
//! pinned requirement files, Python stubs generated from `proto/`, `npm ci` of the Node clients
//! and the browser tests, and Debian's Chromium (installed with apt-get as PostgreSQL is).
//! A missing interpreter or a failed install fails the test with the command and its output —
//! no test skips silently.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
};

use crate::process::workspace_root;

/// `target/` of this workspace (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"))
}

/// Runs `cmd` to completion; panics with its output when it fails or cannot start.
pub fn run(cmd: &mut Command, what: &str) -> String {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{what}: cannot run {shown}: {e} (is the program installed and on PATH?)")
    });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}): {shown}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One install at a time per process: tests of one binary run in parallel threads.
fn install_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `marker` records exactly `stamp` (what the last successful install was made from).
fn installed(marker: &Path, stamp: &str) -> bool {
    std::fs::read_to_string(marker).is_ok_and(|s| s == stamp)
}

/// A virtualenv at `target/{name}` with the pinned `requirements` installed; returns its
/// python. Recreated when the requirements change or a previous install did not finish.
pub fn python_venv(name: &str, requirements: &Path) -> PathBuf {
    let _guard = install_lock();
    let venv = target_dir().join(name);
    let python = venv.join("bin").join("python");
    let marker = venv.join(".arbor-installed");
    let stamp = std::fs::read_to_string(requirements)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", requirements.display()));
    if installed(&marker, &stamp) && python.exists() {
        return python;
    }
    let python3 = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        Command::new(&python3)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        "creating a Python virtualenv (needs python3 with the venv module)",
    );
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(requirements),
        "installing pinned Python packages (needs the PyPI registry)",
    );
    std::fs::write(&marker, stamp).unwrap();
    python
}

/// Python stubs for every proto in `proto/`, generated with grpcio-tools into `target/py-gen`
/// (once per test process, so they always match the protos of this checkout).
pub fn python_stubs(python: &Path) -> PathBuf {
    static GEN: OnceLock<PathBuf> = OnceLock::new();
    GEN.get_or_init(|| {
        let out = target_dir().join("py-gen");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let proto = workspace_root().join("proto");
        let mut files = Vec::new();
        collect_protos(&proto, &proto, &mut files);
        assert!(
            !files.is_empty(),
            "no .proto files under {}",
            proto.display()
        );
        run(
            Command::new(python)
                .args(["-m", "grpc_tools.protoc", "-I"])
                .arg(&proto)
                .arg(format!("--python_out={}", out.display()))
                .arg(format!("--grpc_python_out={}", out.display()))
                .args(&files),
            "generating Python stubs from proto/",
        );
        out
    })
    .clone()
}

fn collect_protos(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_protos(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            let rel = path.strip_prefix(root).unwrap();
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// `npm ci` in `dir` (from its committed package-lock.json) unless node_modules already
/// matches it; returns `dir`.
pub fn npm_ci(dir: &Path) -> PathBuf {
    let _guard = install_lock();
    let lock = std::fs::read_to_string(dir.join("package-lock.json"))
        .unwrap_or_else(|e| panic!("{}: no package-lock.json: {e}", dir.display()));
    let marker = dir.join("node_modules").join(".arbor-installed");
    if !installed(&marker, &lock) {
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                // The browser tests use Debian's Chromium: never download one.
                .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
                .current_dir(dir),
            "npm ci (needs node and npm, and the npm registry)",
        );
        std::fs::write(&marker, lock).unwrap();
    }
    dir.to_path_buf()
}

/// What installs the browser the inbox tests drive.
pub const CHROMIUM_INSTALL: &str = "apt-get install -y chromium";

/// Debian's Chromium: `CHROMIUM` if set, else `chromium` on `PATH`. When it is missing and the
/// tests run as root with apt-get, it is installed; otherwise this panics naming the command.
/// Playwright is pointed at it (`executablePath`), so no browser is ever downloaded.
pub fn chromium() -> PathBuf {
    let find = || -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("CHROMIUM").map(PathBuf::from) {
            return p.is_file().then_some(p);
        }
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("chromium"))
                .find(|p| p.is_file())
        })
    };
    if let Some(found) = find() {
        return found;
    }
    {
        let _guard = install_lock();
        arbor_testkit::apt_install(&["chromium"]);
    }
    find().unwrap_or_else(|| {
        panic!(
            "Chromium is not installed (neither $CHROMIUM nor `chromium` on PATH); the browser \
             tests need Debian's package: `{CHROMIUM_INSTALL}`"
        )
    })
}
