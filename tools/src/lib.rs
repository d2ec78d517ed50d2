//! Library part of the `usnvme` tools: the pieces the `usnvme` binary reuses and tests on their own.

pub mod progress;
pub mod sweep;
