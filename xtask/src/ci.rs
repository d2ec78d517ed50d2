//! `cargo xtask ci` and `cargo xtask demo`.
use std::process::ExitCode;

use anyhow::Result;

pub fn run() -> Result<()> {
    Ok(())
}

pub fn demo() -> Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
