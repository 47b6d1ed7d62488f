//! placeholder

pub mod engine;
