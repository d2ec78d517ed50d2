//! `cargo xtask vm-test`: placeholder until the suites exist.
use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct VmTestArgs {}

pub fn run(_args: VmTestArgs) -> Result<()> {
    Ok(())
}
