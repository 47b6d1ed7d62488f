//! The committed stubs of both packages are what `proto/` generates: `clients/generate.sh`
//! regenerates them into a temporary directory and every file must match.

use super::*;
use arbor_tests::tools::{node_client, python_client, run};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                if entry.file_name() != "__pycache__" {
                    stack.push(path);
                }
            } else {
                out.push(path.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_committed_stubs_are_what_proto_generates() {
    // The generators' tools: the Python package's venv and the Node package's node_modules.
    python_client();
    node_client();
    let tmp = tempfile::tempdir().unwrap();
    run(
        std::process::Command::new("bash")
            .arg(root().join("clients/generate.sh"))
            .arg(tmp.path()),
        "bash clients/generate.sh into a temporary directory",
    );
    for (fresh, committed) in [
        ("python", "clients/python/src/arbor_client/_gen"),
        ("node", "clients/node/src/gen"),
    ] {
        let (fresh, committed) = (tmp.path().join(fresh), root().join(committed));
        let want = files(&fresh);
        assert!(
            !want.is_empty(),
            "nothing generated into {}",
            fresh.display()
        );
        assert_eq!(
            files(&committed),
            want,
            "the files of {} differ from what proto/ generates: run `bash clients/generate.sh`",
            committed.display()
        );
        let stale: Vec<_> = want
            .iter()
            .filter(|f| std::fs::read(fresh.join(f)).ok() != std::fs::read(committed.join(f)).ok())
            .collect();
        assert!(
            stale.is_empty(),
            "stale generated code in {}: {stale:?}; run `bash clients/generate.sh`",
            committed.display()
        );
    }
}
