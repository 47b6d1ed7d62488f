//! Fuzzes `Checkpoint::decode` with corrupted and truncated checkpoint bytes (the corpus starts
//! from real checkpoints of the demo and chaos trees), then ticks and halts whatever decodes
//! into a checkpoint of a known tree.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    arbor_runner_fuzz::exercise_checkpoint(data);
});
