//! Every end-to-end test runs the debug binaries that `cargo test --workspace` builds for the
//! services' own tests: a test that asked for release binaries would compile both services a
//! second time, optimised, inside the test run (minutes of CI on two cores). The soak, ignored
//! by default and run by hand with `--release`, measures the memory of release binaries.

use std::path::Path;

use arbor_tests::process::workspace_root;

/// Files allowed to ask for release binaries, relative to the e2e folder.
const RELEASE_ALLOWED: &[&str] = &["soak.rs"];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the e2e folder is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn end_to_end_tests_use_the_one_build_of_the_binaries() {
    let e2e = workspace_root().join("tests/tests/e2e");
    let mut files = Vec::new();
    rust_files(&e2e, &mut files);
    let release = ["Profile::", "Release"].concat();
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| f.file_name().is_none_or(|n| n != "one_build.rs"))
        .filter_map(|f| {
            let rel = f.strip_prefix(&e2e).ok()?.to_string_lossy().into_owned();
            let text = std::fs::read_to_string(f).ok()?;
            (text.contains(&release) && !RELEASE_ALLOWED.contains(&rel.as_str())).then_some(rel)
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "these end-to-end tests ask for release binaries, a second build of the services: \
         {offenders:?}; use Profile::Debug"
    );
}
