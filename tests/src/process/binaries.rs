//! Where the service binaries come from: the debug build `cargo test` made, or a cargo build.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// Which build of the binaries to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Debug,
    Release,
}

/// Paths of the two binaries, built once per test process.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub runner: PathBuf,
    pub approval: PathBuf,
}

/// The repository root (where `Cargo.toml`, `proto/` and `deploy/` live).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

impl Binaries {
    /// Builds `runner-svc` and `approval-svc` (once per process and profile) with cargo and
    /// returns their paths. `ARBOR_BIN_DIR` points at prebuilt binaries instead.
    pub fn get(profile: Profile) -> Binaries {
        static DEBUG: OnceLock<Binaries> = OnceLock::new();
        static RELEASE: OnceLock<Binaries> = OnceLock::new();
        let cell = match profile {
            Profile::Debug => &DEBUG,
            Profile::Release => &RELEASE,
        };
        cell.get_or_init(|| Self::build(profile)).clone()
    }

    fn build(profile: Profile) -> Binaries {
        if let Ok(dir) = std::env::var("ARBOR_BIN_DIR") {
            let dir = PathBuf::from(dir);
            return Binaries {
                runner: dir.join("runner-svc"),
                approval: dir.join("approval-svc"),
            };
        }
        let root = workspace_root();
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("target"));
        if profile == Profile::Debug
            && let Some(built) = Self::built_with_this_test(&root)
        {
            return built;
        }
        let mut cmd =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&root).args([
            "build",
            "--quiet",
            "-p",
            "arbor-runner-svc",
            "-p",
            "arbor-approval-svc",
            "--bins",
        ]);
        if profile == Profile::Release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building the service binaries failed");
        let dir = target.join(match profile {
            Profile::Debug => "debug",
            Profile::Release => "release",
        });
        Binaries {
            runner: dir.join("runner-svc"),
            approval: dir.join("approval-svc"),
        }
    }

    /// The debug binaries `cargo test --workspace` built beside this test executable (it builds
    /// them for the services' own integration tests), when none of their sources changed since:
    /// asking cargo again would build them a second time whenever its selection of packages
    /// resolves their dependencies' features differently from the whole workspace's.
    fn built_with_this_test(root: &Path) -> Option<Binaries> {
        let dir = std::env::current_exe()
            .ok()?
            .parent()?
            .parent()?
            .to_path_buf();
        let bins = Binaries {
            runner: dir.join("runner-svc"),
            approval: dir.join("approval-svc"),
        };
        let built = [&bins.runner, &bins.approval]
            .into_iter()
            .map(|b| std::fs::metadata(b).and_then(|m| m.modified()).ok())
            .min()??;
        let sources = [
            "Cargo.toml",
            "Cargo.lock",
            "proto",
            "shared",
            "runner-svc/Cargo.toml",
            "runner-svc/src",
            "approval-svc/Cargo.toml",
            "approval-svc/src",
        ];
        let newest = sources
            .iter()
            .filter_map(|s| newest_modification(&root.join(s)))
            .max()?;
        (newest <= built).then_some(bins)
    }
}

/// The latest modification time of `path` or of anything under it (`shared/tests` and
/// `shared/target`-like folders included: erring towards a build is safe).
fn newest_modification(path: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    let own = meta.modified().ok();
    if !meta.is_dir() {
        return own;
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| newest_modification(&e.path()))
        .chain(own)
        .max()
}
