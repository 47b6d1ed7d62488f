//! End-to-end harness: starts the real binaries on free ports with fresh data dirs.
