//! Unit tests of the engine, one file per concept, over a shared harness.

mod checkpoint;
mod composites;
mod gates;
mod harness;
mod tools;
mod validation;
