//! The non-Rust tools the polyglot, worker, client, manifest and browser tests run, installed by
//! the tests themselves on first use under `target/` (never committed): Python virtual
//! environments from pinned requirement files, the client packages of `clients/` built from their
//! directories (a venv with `arbor-client` installed, a `node_modules` with the packed Node
//! package), `npm ci` of the browser tests, and Debian's Chromium (installed with apt-get as
//! PostgreSQL is).
//! A missing interpreter or a failed install fails the test with the command and its output —
//! no test skips silently.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use arbor_shared::auth::hash_token;

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

/// A digest of every file under `dirs` (relative to the workspace), skipping `skip` names:
/// what a package install was made from.
fn tree_stamp(dirs: &[&str], skip: &[&str]) -> String {
    fn walk(dir: &Path, skip: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if skip.iter().any(|s| *s == name) {
                continue;
            }
            if path.is_dir() {
                walk(&path, skip, out);
            } else {
                out.push(path);
            }
        }
    }
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in dirs {
        walk(&root.join(dir), skip, &mut files);
    }
    files.sort();
    let mut all = String::new();
    for f in files {
        all.push_str(&f.strip_prefix(&root).unwrap_or(&f).to_string_lossy());
        all.push_str(&String::from_utf8_lossy(
            &std::fs::read(&f).unwrap_or_default(),
        ));
    }
    hash_token(&all)
}

/// The Python client package (`clients/python`) installed from its directory, with the `otel`
/// extra, into a fresh virtualenv `target/py-client` that also holds its pinned tools
/// (`requirements-dev.txt`: pytest, mypy, grpcio-tools…); returns its python. Reinstalled when
/// the package's files change.
pub fn python_client() -> PathBuf {
    let root = workspace_root();
    let dir = root.join("clients/python");
    let python = python_venv("py-client", &dir.join("requirements-dev.txt"));
    let _guard = install_lock();
    let marker = target_dir().join("py-client").join(".arbor-package");
    let stamp = tree_stamp(
        &["clients/python"],
        &[
            "tests",
            "__pycache__",
            "build",
            ".mypy_cache",
            ".pytest_cache",
        ],
    );
    if !installed(&marker, &stamp) {
        // Its build backend (setuptools) is pinned in the venv: no isolated build env to fetch.
        run(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(["--no-build-isolation", "--force-reinstall", "--no-deps"])
                .arg(format!("{}[otel]", dir.display())),
            "pip install ./clients/python (the arbor-client package)",
        );
        run(
            Command::new(&python).args(["-m", "pip", "check"]),
            "pip check: arbor-client's dependencies are installed",
        );
        // The package's build leaves `build/` and an egg-info next to its sources.
        let _ = std::fs::remove_dir_all(dir.join("build"));
        let _ = std::fs::remove_dir_all(dir.join("src/arbor_client.egg-info"));
        std::fs::write(&marker, stamp).unwrap();
    }
    python
}

/// The Node client package (`clients/node`): its devDependencies installed (`npm ci`), built
/// with `tsc`, packed with `npm pack` and installed from the tarball into a fresh
/// `target/node-client` project; returns that project's `node_modules` (for `NODE_PATH`).
/// Redone when the package's files change.
pub fn node_client() -> PathBuf {
    let dir = workspace_root().join("clients/node");
    let lock = std::fs::read_to_string(dir.join("package-lock.json"))
        .unwrap_or_else(|e| panic!("{}: no package-lock.json: {e}", dir.display()));
    let _guard = install_lock();
    let marker = dir.join("node_modules").join(".arbor-installed");
    if !installed(&marker, &lock) {
        run(
            Command::new("npm")
                .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
                .args(["--loglevel=error"])
                .current_dir(&dir),
            "npm ci in clients/node (needs node and npm, and the npm registry)",
        );
        std::fs::write(&marker, &lock).unwrap();
    }
    let project = target_dir().join("node-client");
    let modules = project.join("node_modules");
    let marker = project.join(".arbor-package");
    let stamp = tree_stamp(&["clients/node"], &["node_modules", "dist"]);
    let built = dir.join("dist/src/index.js").exists() && dir.join("dist/test").exists();
    if installed(&marker, &stamp) && built && modules.join("arbor-client").exists() {
        return modules;
    }
    let _ = std::fs::remove_dir_all(&project);
    std::fs::create_dir_all(&project).unwrap();
    run(
        Command::new("npm")
            .args(["run", "build", "--silent"])
            .current_dir(&dir),
        "tsc: building clients/node",
    );
    let packed = run(
        Command::new("npm")
            .args(["pack", "--ignore-scripts", "--silent", "--pack-destination"])
            .arg(&project)
            .current_dir(&dir),
        "npm pack of clients/node",
    );
    let tarball = project.join(packed.trim().lines().last().unwrap_or_default());
    std::fs::write(
        project.join("package.json"),
        r#"{"name": "arbor-client-consumer", "private": true}"#,
    )
    .unwrap();
    // @opentelemetry/api: the optional peer a traced application brings along.
    run(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .arg(&tarball)
            .arg("@opentelemetry/api@1.10.0")
            .current_dir(&project),
        "npm install of the packed arbor-client into a fresh project",
    );
    std::fs::write(&marker, stamp).unwrap();
    modules
}

/// `npm ci` in `dir` (from its committed package-lock.json) unless node_modules already
/// matches it; returns `dir`. Playwright is never let download a browser.
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
