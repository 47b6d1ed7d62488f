//! Fuzzes tree validation (`parse_tree`) with arbitrary documents, as JSON and as YAML: every
//! input gets a tree or a list of violations, never a panic, and a valid tree round-trips
//! through its canonical JSON.

#![no_main]

use arbor_runner_svc::engine::TreeFormat;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the format so one corpus serves both parsers.
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = if selector & 1 == 0 {
        TreeFormat::Json
    } else {
        TreeFormat::Yaml
    };
    arbor_runner_fuzz::exercise_tree(text, format);
});
