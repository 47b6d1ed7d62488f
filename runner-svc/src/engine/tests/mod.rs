//! Unit tests of the engine, one file per concept, over a shared harness.

mod checkpoint;
mod composites;
mod decorators;
mod gates;
mod harness;
mod inputs;
mod loops;
mod parallel;
mod tools;
mod validation;
