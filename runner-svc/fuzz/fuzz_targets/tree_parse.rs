//! Fuzzes tree validation (`parse_tree`) with arbitrary documents, as JSON and as YAML: every
//! input gets a tree or a list of violations, never a panic, and a valid tree round-trips
//! through its canonical JSON.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    arbor_runner_fuzz::exercise_tree_input(data);
});
