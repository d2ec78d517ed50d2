//! Host benchmarks on `sim` null drives: the driver's and the engine's cost per I/O, counted by
//! callgrind (instructions do not depend on how busy the machine is) and timed natively.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd;

/// Function names whose inclusive cost callgrind reports: the benchmark's two driver calls
/// (kept out of line in null_bench.rs) and the simulated controller's register writes (the
/// doorbells, where the inline sim does all its work).
const DRIVER_SUBMIT: &str = "null_bench.rs:null_bench::submit ";
const DRIVER_POLL: &str = "null_bench.rs:null_bench::poll ";
const SIM: &str = "SimController as usnvme_driver::regs::Registers>::write32 ";
/// The engine's clock calibration (once per process, but it spins for a wall-clock time, so its
/// instruction count differs from run to run): left out of the total.
const CALIBRATION: &str = "quanta-0.12";

/// One program's cost per I/O, split by callgrind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Split {
    pub total: f64,
    pub sim: f64,
    /// Submit + poll of the driver (only where the program exposes them).
    pub driver: Option<f64>,
}

impl Split {
    /// Everything that is not the simulated controller: driver, engine, benchmark loop.
    pub fn host_side(&self) -> f64 {
        self.total - self.sim
    }
}

/// A native run's figures, parsed from the `key=value` line the benchmark prints.
#[derive(Debug, Clone, Default)]
pub struct Native {
    pub iops: f64,
    pub line: String,
}

impl Native {
    pub fn value(&self, key: &str) -> Option<f64> {
        self.line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
    }
}

/// `args` with the `{ios}` placeholder replaced by the I/O count `n`.
pub fn with_ios(args: &[String], n: u64) -> Vec<String> {
    args.iter()
        .map(|a| a.replace("{ios}", &n.to_string()))
        .collect()
}

pub fn example(name: &str) -> PathBuf {
    crate::target_dir().join("release/examples").join(name)
}

/// Runs `program args` natively `runs` times; the run with the median IOPS.
pub fn native(program: &Path, args: &[String], runs: usize) -> Result<Native> {
    let mut results = Vec::new();
    for _ in 0..runs {
        let line = cmd::output(
            &format!("bench: {}", program.display()),
            Command::new(program).args(args),
            "see the benchmark's error above",
        )?;
        let line = line.lines().last().unwrap_or_default().to_string();
        let mut n = Native { iops: 0.0, line };
        n.iops = n
            .value("iops")
            .with_context(|| format!("no iops= in `{}`", n.line))?;
        results.push(n);
    }
    results.sort_by(|a, b| a.iops.total_cmp(&b.iops));
    Ok(results.swap_remove(runs / 2))
}

/// Instructions per I/O: callgrind runs the benchmark with `ios` and with `2 * ios` I/Os and
/// divides the difference, so set-up and tear-down cancel out. `args` gets the I/O count
/// substituted for the `{ios}` placeholder.
pub fn callgrind(program: &Path, args: &[String], ios: u64) -> Result<Split> {
    let dir = crate::target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let mut costs = Vec::new();
    for n in [ios, 2 * ios] {
        let out = dir.join(format!(
            "callgrind.{}.{n}",
            program.file_name().unwrap_or_default().to_string_lossy()
        ));
        let args = with_ios(args, n);
        cmd::output(
            "bench: valgrind --tool=callgrind",
            Command::new("valgrind")
                .arg("--tool=callgrind")
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(program)
                .args(&args),
            "install valgrind (apt-get install valgrind)",
        )?;
        let annotated = cmd::output(
            "bench: callgrind_annotate",
            Command::new("callgrind_annotate")
                .args(["--inclusive=yes", "--threshold=100"])
                .arg(&out),
            "callgrind_annotate comes with valgrind",
        )?;
        costs.push(inclusive_costs(&annotated));
    }
    let per_io = |key: &str| -> Option<f64> {
        let (a, b) = (costs[0].get(key)?, costs[1].get(key)?);
        Some((*b as f64 - *a as f64) / ios as f64)
    };
    let total = per_io("PROGRAM TOTALS").context("callgrind reported no total")?
        - per_io(CALIBRATION).unwrap_or(0.0);
    let sim = per_io(SIM).unwrap_or(0.0);
    let driver = match (per_io(DRIVER_SUBMIT), per_io(DRIVER_POLL)) {
        (Some(s), Some(p)) => Some(s + p - sim),
        _ => None,
    };
    Ok(Split { total, sim, driver })
}

/// The inclusive instruction counts of the functions we look for, by key.
fn inclusive_costs(annotated: &str) -> std::collections::HashMap<&'static str, u64> {
    let mut found = std::collections::HashMap::new();
    for line in annotated.lines() {
        // "  1,234 (12.3%)  file:function [object]"; lines starting with "=>" are call edges
        let trimmed = line.trim_start();
        let Some((count, rest)) = trimmed.split_once(' ') else {
            continue;
        };
        let Ok(count) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        if rest.contains("=>") {
            continue;
        }
        for key in ["PROGRAM TOTALS", DRIVER_SUBMIT, DRIVER_POLL, SIM] {
            if rest.contains(key) {
                found.entry(key).or_insert(count);
            }
        }
        if rest.contains(CALIBRATION) && rest.contains("OnceCell") {
            let c = found.entry(CALIBRATION).or_insert(0);
            *c = (*c).max(count);
        }
    }
    found
}

/// Cycles per I/O from `perf stat`, where the machine exposes the counters.
pub fn cycles(program: &Path, args: &[String], ios: u64) -> Result<Option<f64>> {
    let probe = Command::new("perf")
        .args(["stat", "-x,", "-e", "cycles", "true"])
        .output();
    let supported = probe.is_ok_and(|o| {
        o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("not supported")
    });
    if !supported {
        return Ok(None);
    }
    let mut counts = Vec::new();
    for n in [ios, 2 * ios] {
        let args = with_ios(args, n);
        let out = Command::new("perf")
            .args(["stat", "-x,", "-e", "cycles"])
            .arg(program)
            .args(&args)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let Some(count) = stderr
            .lines()
            .find(|l| l.contains("cycles"))
            .and_then(|l| l.split(',').next()?.parse::<f64>().ok())
        else {
            bail!("perf stat printed no cycle count: {stderr}");
        };
        counts.push(count);
    }
    Ok(Some((counts[1] - counts[0]) / ios as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_inclusive_costs_and_skips_call_edges() {
        let text = "\
302,839,826 (100.0%)  PROGRAM TOTALS
258,764,909 (85.45%)  /x/driver/examples/null_bench.rs:null_bench::poll [/x/null_bench]
244,299,930 (80.67%)  => /x/driver/src/sim/mod.rs:<usnvme_driver::sim::SimController as usnvme_driver::regs::Registers>::write32 (3,132x)
244,312,027 (80.67%)  /x/driver/src/sim/mod.rs:<usnvme_driver::sim::SimController as usnvme_driver::regs::Registers>::write32 [/x/null_bench]
 34,409,378 (11.36%)  /x/driver/examples/null_bench.rs:null_bench::submit [/x/null_bench]
";
        let c = inclusive_costs(text);
        assert_eq!(c["PROGRAM TOTALS"], 302_839_826);
        assert_eq!(c[DRIVER_POLL], 258_764_909);
        assert_eq!(c[SIM], 244_312_027);
        assert_eq!(c[DRIVER_SUBMIT], 34_409_378);
    }

    #[test]
    fn native_values_come_from_key_value_pairs() {
        let n = Native {
            iops: 0.0,
            line: "drives=1 qd=128 iops=6559746 qp_dma_bytes=282624".into(),
        };
        assert_eq!(n.value("iops"), Some(6_559_746.0));
        assert_eq!(n.value("qp_dma_bytes"), Some(282_624.0));
        assert_eq!(n.value("qd_missing"), None);
    }
}
