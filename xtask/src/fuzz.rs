//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the cargo-fuzz targets of `driver/fuzz/`
//! (entry points in `usnvme_driver::fuzzing`), each for N seconds. Installs cargo-fuzz when it
//! is missing, uses a nightly toolchain when rustup has one (else the active one with
//! `RUSTC_BOOTSTRAP=1`: libFuzzer's sanitizer flags are unstable), keeps each target's corpus in
//! `driver/fuzz/corpus/TARGET` (it grows from run to run) and fails with the crashing input's
//! path when a target finds a crash. libFuzzer's output goes to `target/fuzz/logs/TARGET.log`.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cmd;

/// The fuzz targets, in the order they run.
pub const TARGETS: [&str; 7] = [
    "completions",
    "identify",
    "log_pages",
    "sim_faults",
    "nvme_tcp_target",
    "nvme_tcp_commands",
    "nvme_tcp_host",
];

#[derive(Args, Debug, Clone)]
pub struct FuzzArgs {
    /// Seconds to fuzz each target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Targets to run (default: all of them).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub targets: Vec<String>,
}

/// How to call `cargo fuzz`: `cargo +nightly`, or the active toolchain unlocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Toolchain {
    Nightly,
    Bootstrap,
}

impl Toolchain {
    fn detect() -> Toolchain {
        let list = Command::new("rustup")
            .args(["toolchain", "list"])
            .stdin(Stdio::null())
            .output();
        match list {
            Ok(out)
                if String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l.starts_with("nightly")) =>
            {
                Toolchain::Nightly
            }
            _ => Toolchain::Bootstrap,
        }
    }

    fn cargo(self) -> Command {
        let mut cmd = Command::new("cargo");
        match self {
            Toolchain::Nightly => {
                cmd.arg("+nightly");
            }
            Toolchain::Bootstrap => {
                cmd.env("RUSTC_BOOTSTRAP", "1");
            }
        }
        cmd
    }

    /// The same call, for a shell.
    fn shell(self) -> &'static str {
        match self {
            Toolchain::Nightly => "cargo +nightly",
            Toolchain::Bootstrap => "RUSTC_BOOTSTRAP=1 cargo",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Toolchain::Nightly => "nightly",
            Toolchain::Bootstrap => "the active toolchain with RUSTC_BOOTSTRAP=1",
        }
    }
}

/// libFuzzer flags per target: a run that passes 60 s on one input is a hang; structured
/// inputs skip libFuzzer's slow growth of input lengths.
fn libfuzzer_flags(target: &str, seconds: u64) -> Vec<String> {
    let mut flags = vec![
        format!("-max_total_time={seconds}"),
        "-timeout=60".into(),
        "-rss_limit_mb=4096".into(),
        "-print_final_stats=1".into(),
    ];
    match target {
        "identify" => flags.extend(["-max_len=4096".into(), "-len_control=0".into()]),
        "sim_faults" => flags.extend(["-max_len=512".into(), "-len_control=0".into()]),
        _ => flags.push("-max_len=4096".into()),
    }
    flags
}

/// Makes sure `cargo fuzz` runs: installs cargo-fuzz if it does not.
fn ensure_cargo_fuzz(toolchain: Toolchain) -> Result<()> {
    let works = |tc: Toolchain| {
        tc.cargo()
            .args(["fuzz", "--version"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works(toolchain) {
        return Ok(());
    }
    eprintln!("fuzz: cargo-fuzz is not installed: cargo install cargo-fuzz --locked");
    cmd::run(
        "fuzz: install cargo-fuzz",
        Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]),
        "install it by hand (`cargo install cargo-fuzz --locked`; it needs crates.io) and make sure \
         ~/.cargo/bin is on PATH",
    )?;
    if !works(toolchain) {
        bail!(
            "fuzz: `cargo fuzz --version` still fails after installing cargo-fuzz. Fix: put \
             ~/.cargo/bin on PATH, or run `cargo install cargo-fuzz --locked` by hand"
        );
    }
    Ok(())
}

/// The files in `dir` (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Where libFuzzer wrote the input that crashed, from its log.
fn crash_input(log: &str) -> Option<PathBuf> {
    log.lines()
        .rev()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// libFuzzer's final count of executions, from its `-print_final_stats` lines.
fn executions(log: &str) -> Option<u64> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|v| v.trim().parse().ok())
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let started = Instant::now();
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        args.targets.iter().map(String::as_str).collect()
    };
    let toolchain = Toolchain::detect();
    ensure_cargo_fuzz(toolchain)?;
    let dir = crate::workspace_root().join("driver/fuzz");
    let target_dir = crate::target_dir().join("fuzz");
    let logs = target_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    eprintln!("fuzz: cargo fuzz with {}", toolchain.describe());
    let t = Instant::now();
    cmd::run(
        "fuzz: build the targets",
        toolchain
            .cargo()
            .args(["fuzz", "build", "--target-dir"])
            .arg(&target_dir)
            .current_dir(&dir),
        "fix the build errors above (the fuzz crate is driver/fuzz, entry points in \
         driver/src/fuzzing.rs)",
    )?;
    eprintln!("fuzz: built in {:.0} s", t.elapsed().as_secs_f64());

    for target in targets {
        let corpus = dir.join("corpus").join(target);
        let artifacts = dir.join("artifacts").join(target);
        for d in [&corpus, &artifacts] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let before = files(&artifacts);
        let log_path = logs.join(format!("{target}.log"));
        let log =
            File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let t = Instant::now();
        let mut cmd = toolchain.cargo();
        cmd.args(["fuzz", "run", "--target-dir"])
            .arg(&target_dir)
            .arg(target)
            .arg(&corpus)
            .arg("--")
            .args(libfuzzer_flags(target, args.seconds))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let status = cmd
            .status()
            .with_context(|| format!("fuzz: cannot start {}", cmd::cmd_line(&cmd)))?;
        let output = fs::read_to_string(&log_path).unwrap_or_default();
        if !status.success() {
            eprintln!("{}", tail(&output, 60));
            // the input libFuzzer saved; else the newest file in the artifacts folder
            let crash = crash_input(&output)
                .or_else(|| files(&artifacts).into_iter().rfind(|f| !before.contains(f)));
            match crash {
                Some(crash) => bail!(
                    "fuzz: {target} failed: the input is {}. Reproduce: (cd driver/fuzz && \
                     {} fuzz run --target-dir {} {target} {}); the whole log: {}",
                    crash.display(),
                    toolchain.shell(),
                    target_dir.display(),
                    crash.display(),
                    log_path.display()
                ),
                None => bail!(
                    "fuzz: {target} failed ({status}) without a crashing input; the log: {}",
                    log_path.display()
                ),
            }
        }
        let runs = executions(&output).map_or_else(|| "?".into(), |n| n.to_string());
        eprintln!(
            "fuzz: {target}: {runs} inputs in {:.0} s, no crash (corpus: {} inputs)",
            t.elapsed().as_secs_f64(),
            files(&corpus).len()
        );
    }
    eprintln!(
        "fuzz: all targets clean in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_stats_and_tails() {
        let log =
            "#1000\tDONE cov: 5\nstat::number_of_executed_units: 1234\nstat::peak_rss_mb: 40\n";
        assert_eq!(executions(log), Some(1234));
        assert_eq!(executions("nothing"), None);
        let crash = "artifact_prefix='/a/'; Test unit written to /a/crash-12ab\nBase64: AA==";
        assert_eq!(crash_input(crash), Some(PathBuf::from("/a/crash-12ab")));
        assert_eq!(crash_input(log), None);
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        let flags = libfuzzer_flags("sim_faults", 20);
        assert!(flags.contains(&"-max_total_time=20".to_string()));
        assert!(flags.contains(&"-len_control=0".to_string()));
    }
}
