//! Replays the committed fuzz corpora (`runner-svc/fuzz/corpus`) through the same checks the
//! fuzz targets make, on stable and in every CI run: a parser change that panics on an input the
//! fuzzer once found interesting fails here, without nightly or libFuzzer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod fuzz;

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        files.len() >= 20,
        "{}: only {} corpus files; the corpus is missing",
        dir.display(),
        files.len()
    );
    files
}

#[test]
fn checkpoint_corpus_decodes_or_errs_without_panicking() {
    for file in corpus("checkpoint_decode") {
        let bytes = std::fs::read(&file).unwrap();
        let outcome = std::panic::catch_unwind(|| fuzz::exercise_checkpoint(&bytes));
        assert!(outcome.is_ok(), "{} panicked", file.display());
    }
}

#[test]
fn tree_corpus_parses_or_errs_without_panicking() {
    for file in corpus("tree_parse") {
        let data = std::fs::read(&file).unwrap();
        let outcome = std::panic::catch_unwind(|| fuzz::exercise_tree_input(&data));
        assert!(outcome.is_ok(), "{} panicked", file.display());
    }
}
