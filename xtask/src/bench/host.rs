//! Host benchmarks on `sim` null drives: the driver's, the engine's and `usnvme perf`'s cost per
//! I/O, counted by callgrind (instructions do not depend on how busy the machine is) and timed
//! natively.
//!
//! The split follows the code, not a list of function names, so it survives refactoring: every
//! instruction is charged to the crate whose source line it comes from (the release build's line
//! tables follow inlining, so driver code that LTO inlined into the engine still counts as the
//! driver's), and the instructions of standard-library and dependency functions that run out of
//! line (vm-memory lookups, clock reads, memcpy) are charged to their callers, in proportion to
//! the inclusive cost of each caller's calls.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd;

/// Where an instruction is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `usnvme_driver` but its `sim` module, and `usnvme_hugepages`.
    Driver,
    /// The simulated controller (`usnvme_driver::sim`): in inline mode it runs inside the
    /// doorbell writes, on the benchmark's core.
    Sim,
    /// `usnvme_engine`: reactors, channels, statistics, the block layer.
    Engine,
    /// `usnvme perf`'s own code (`usnvme_tools`, the `usnvme` binary, `usnvme_stamp`).
    Perf,
    /// Everything else: a benchmark's own loop, and library code no caller of ours ran.
    Rest,
}

impl Part {
    /// As the report's columns name it.
    pub fn name(self) -> &'static str {
        match self {
            Part::Driver => "driver",
            Part::Sim => "sim controller",
            Part::Engine => "engine",
            Part::Perf => "perf",
            Part::Rest => "rest",
        }
    }
}

/// Our code, by source folder (relative to the workspace root) and by symbol prefix (for code of
/// the standard library or a dependency that was inlined into one of our functions). The first
/// match wins: the simulated controller before the rest of the driver.
const OURS: &[(&str, &str, Part)] = &[
    ("driver/src/sim/", "usnvme_driver::sim::", Part::Sim),
    ("driver/src/", "usnvme_driver::", Part::Driver),
    ("hugepages/src/", "usnvme_hugepages::", Part::Driver),
    ("engine/src/", "usnvme_engine::", Part::Engine),
    ("tools/src/", "usnvme_tools::", Part::Perf),
    ("tools/src/", "usnvme::", Part::Perf),
    ("tools/stamp/src/", "usnvme_stamp::", Part::Perf),
];

/// Lazily initialised statics run once per process; quanta's clock calibration is one and spins
/// for a wall-clock time, so its instruction count differs from run to run: left out.
fn runs_once(symbol: &str) -> bool {
    (symbol.contains("OnceCell<") || symbol.contains("OnceLock<")) && symbol.contains("initialize")
}

/// Where the code of `file` / `symbol` is charged; None for a function of the standard library
/// or a dependency (charged to its callers). What runs inside a function of the simulated
/// controller is the device's work, whatever file it came from: the protocol's definitions
/// (`driver/src/spec/`: command and completion fields, statuses) serve both sides, and the
/// lines the sim inlined from them are the sim's, not the driver's.
fn part_of(root: &str, file: &str, symbol: &str) -> Option<Part> {
    if part_of_symbol(symbol) == Some(Part::Sim) {
        return Some(Part::Sim);
    }
    if let Some(rel) = in_workspace(root, file) {
        let part = OURS.iter().find(|(dir, _, _)| rel.starts_with(dir));
        // in the workspace but no library of ours: a benchmark's loop
        return Some(part.map_or(Part::Rest, |p| p.2));
    }
    part_of_symbol(symbol)
}

/// The part a function of ours belongs to, by its name (`<usnvme_driver::sim::X as …>::f`
/// counts as the type's crate); None for anyone else's.
fn part_of_symbol(symbol: &str) -> Option<Part> {
    let symbol = symbol.trim_start_matches('<');
    OURS.iter()
        .find(|(_, prefix, _)| symbol.starts_with(prefix))
        .map(|p| p.2)
}

/// `file` relative to the workspace root, if it is in the workspace. Cargo names the files of
/// workspace members relative to the root when it builds from there, and absolute otherwise;
/// the standard library's and dependencies' are absolute, glibc's start with "./".
fn in_workspace<'a>(root: &str, file: &'a str) -> Option<&'a str> {
    if let Some(rel) = file.strip_prefix(root) {
        return Some(rel);
    }
    let relative = !file.is_empty() && !file.starts_with(['/', '.', '?']);
    relative.then_some(file)
}

/// One program's cost per I/O, split by [`Part`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Split {
    pub total: f64,
    pub driver: f64,
    pub sim: f64,
    pub engine: f64,
    pub perf: f64,
    pub rest: f64,
}

impl Split {
    /// Everything that is not the simulated controller.
    pub fn host_side(&self) -> f64 {
        self.total - self.sim
    }

    fn add(&mut self, part: Part, cost: f64) {
        match part {
            Part::Driver => self.driver += cost,
            Part::Sim => self.sim += cost,
            Part::Engine => self.engine += cost,
            Part::Perf => self.perf += cost,
            Part::Rest => self.rest += cost,
        }
    }

    /// The sum of the parts.
    fn placed(&self) -> f64 {
        self.driver + self.sim + self.engine + self.perf + self.rest
    }

    /// Adds `amount`, shared between the parts as `mix` shares its own.
    fn share(&mut self, mix: &Split, amount: f64) {
        let f = amount / mix.placed();
        self.driver += mix.driver * f;
        self.sim += mix.sim * f;
        self.engine += mix.engine * f;
        self.perf += mix.perf * f;
        self.rest += mix.rest * f;
    }

    /// `(later - self) / ios`, part by part.
    fn per_io(&self, later: &Split, ios: u64) -> Split {
        let d = |a: f64, b: f64| (b - a) / ios as f64;
        Split {
            total: d(self.total, later.total),
            driver: d(self.driver, later.driver),
            sim: d(self.sim, later.sim),
            engine: d(self.engine, later.engine),
            perf: d(self.perf, later.perf),
            rest: d(self.rest, later.rest),
        }
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

/// Runs `program args` natively `runs` times; the run with the median IOPS. An example prints
/// `key=value` pairs (`iops=` among them); `usnvme perf` gets `--json` and prints its table,
/// of which its `Total` row is kept.
pub fn native(program: &Path, args: &[String], runs: usize) -> Result<Native> {
    let is_perf = args.first().is_some_and(|a| a == "perf");
    let json = crate::target_dir().join("bench/native-perf.json");
    let mut results = Vec::new();
    for _ in 0..runs {
        let mut command = Command::new(program);
        command.args(args);
        if is_perf {
            std::fs::create_dir_all(json.parent().unwrap_or(Path::new(".")))?;
            command.arg("--json").arg(&json);
        }
        let out = cmd::output(
            &format!("bench: {}", program.display()),
            &mut command,
            "see the benchmark's error above",
        )?;
        let n = if is_perf {
            let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)
                .with_context(|| format!("{}: not JSON", json.display()))?;
            let total = out
                .lines()
                .find(|l| l.starts_with("Total"))
                .unwrap_or_default();
            Native {
                iops: doc["total"]["read"]["iops"]
                    .as_f64()
                    .with_context(|| format!("{}: no total.read.iops", json.display()))?,
                line: total.split_whitespace().collect::<Vec<_>>().join(" "),
            }
        } else {
            let line = out.lines().last().unwrap_or_default().to_string();
            let mut n = Native { iops: 0.0, line };
            n.iops = n
                .value("iops")
                .with_context(|| format!("no iops= in `{}`", n.line))?;
            n
        };
        results.push(n);
    }
    results.sort_by(|a, b| a.iops.total_cmp(&b.iops));
    Ok(results.swap_remove(runs / 2))
}

/// One function of ours in the inclusive profile, per I/O: everything it ran including what it
/// called (`inclusive`), and the instructions of its own code, with what LTO inlined into it
/// (`own`).
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCost {
    pub symbol: String,
    pub part: Part,
    pub inclusive: f64,
    pub own: f64,
}

/// Functions of ours a profile keeps: the most expensive, inclusive.
pub const PROFILE_FUNCTIONS: usize = 25;

/// What callgrind measured of one benchmark: its split, and (when asked for) the functions of
/// ours that cost the most per I/O, inclusive.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub split: Split,
    pub functions: Vec<FunctionCost>,
}

/// Instructions per I/O: callgrind runs the benchmark with `ios` and with `2 * ios` I/Os per
/// device (`args` gets the count for its `{ios}` placeholder) on `devices` devices and divides
/// the difference, so set-up and tear-down cancel out. `tag` names the profile files. With
/// `profile_functions`, the inclusive cost of each function of ours too (see [`functions_per_io`]).
pub fn callgrind(
    program: &Path,
    args: &[String],
    ios: u64,
    devices: u64,
    tag: &str,
    profile_functions: bool,
) -> Result<Measured> {
    let dir = crate::target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let root = format!("{}/", crate::workspace_root().display());
    let mut splits = Vec::new();
    let mut own = Vec::new();
    let mut inclusive = Vec::new();
    for n in [ios, 2 * ios] {
        let out = dir.join(format!("callgrind.{tag}.{n}"));
        cmd::output(
            "bench: valgrind --tool=callgrind",
            Command::new("valgrind")
                .args(["--tool=callgrind", "--dump-instr=no"])
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(program)
                .args(with_ios(args, n)),
            "install valgrind (apt-get install valgrind)",
        )?;
        // Self cost per function and source file, each function with its callers.
        let annotated = cmd::output(
            "bench: callgrind_annotate",
            Command::new("callgrind_annotate")
                .args(["--inclusive=no", "--tree=caller", "--auto=no"])
                .arg("--threshold=100")
                .arg(&out),
            "callgrind_annotate comes with valgrind",
        )?;
        let profile = parse_profile(&annotated);
        if profile.total == 0 {
            bail!(
                "callgrind_annotate printed no PROGRAM TOTALS for {}",
                out.display()
            );
        }
        splits.push(attribute(&profile, &root));
        if profile_functions {
            own.push(own_costs(&profile));
            let annotated = cmd::output(
                "bench: callgrind_annotate --inclusive=yes",
                Command::new("callgrind_annotate")
                    .args(["--inclusive=yes", "--auto=no", "--threshold=100"])
                    .arg(&out),
                "callgrind_annotate comes with valgrind",
            )?;
            let mut costs = parse_inclusive(&annotated);
            leave_out_runs_once(&mut costs, &profile);
            inclusive.push(costs);
        }
    }
    let functions = if profile_functions {
        functions_per_io(
            &inclusive[0],
            &inclusive[1],
            &own[0],
            &own[1],
            ios * devices,
        )
    } else {
        Vec::new()
    };
    Ok(Measured {
        split: splits[0].per_io(&splits[1], ios * devices),
        functions,
    })
}

/// Each function's own cost: the sum of its entries (one per source file its code came from).
fn own_costs(profile: &Profile) -> HashMap<String, u64> {
    let mut costs = HashMap::new();
    for e in &profile.entries {
        *costs.entry(e.symbol.clone()).or_default() += e.cost;
    }
    costs
}

/// Parses `callgrind_annotate --inclusive=yes` output (`  N (P%)  file:function [object]`
/// lines): each function's inclusive cost. callgrind_annotate lists a function once per source
/// file its code came from; the entry under its own file is what its callers' calls cost, all
/// of it, and each other entry (the lines LTO inlined from another file, with their calls) a
/// part of that: the largest is the function's.
fn parse_inclusive(text: &str) -> HashMap<String, u64> {
    let mut costs: HashMap<String, u64> = HashMap::new();
    for line in text.lines() {
        let Some((count, rest)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(count) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        let Some((_, rest)) = rest.split_once(')') else {
            continue;
        };
        let rest = rest.trim_start();
        if rest.is_empty() || rest.starts_with("PROGRAM TOTALS") {
            continue;
        }
        let (_, symbol) = file_and_symbol(rest);
        let cost = costs.entry(symbol).or_default();
        *cost = (*cost).max(count);
    }
    costs
}

/// What runs once (see `runs_once`) takes a wall-clock time, not a count of instructions: its
/// inclusive cost is taken out of every function that calls it, directly or not (found up the
/// caller tree), so that the profile is the same from run to run.
fn leave_out_runs_once(inclusive: &mut HashMap<String, u64>, profile: &Profile) {
    let once: Vec<&str> = inclusive
        .keys()
        .filter(|s| runs_once(s))
        .map(String::as_str)
        .collect();
    // the outermost initialisation holds the others
    let cost = once.iter().map(|s| inclusive[*s]).max().unwrap_or(0);
    let mut callers: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in &profile.entries {
        let list = callers.entry(e.symbol.as_str()).or_default();
        list.extend(e.callers.iter().map(|(_, caller, _)| caller.as_str()));
    }
    let mut above: Vec<&str> = Vec::new();
    let mut next = once.clone();
    while let Some(symbol) = next.pop() {
        for &caller in callers.get(symbol).into_iter().flatten() {
            if !runs_once(caller) && !above.contains(&caller) {
                above.push(caller);
                next.push(caller);
            }
        }
    }
    let above: Vec<String> = above.into_iter().map(str::to_string).collect();
    for symbol in above {
        if let Some(c) = inclusive.get_mut(&symbol) {
            *c = c.saturating_sub(cost);
        }
    }
}

/// The functions of ours that cost the most per I/O, inclusive: the difference between the
/// run of `ios` more I/Os (`inclusive_2`, `own_2`) and the other, divided by `ios`. What runs
/// less than half an instruction per I/O is left out; ties go by name, so the list is the
/// same from run to run.
fn functions_per_io(
    inclusive_1: &HashMap<String, u64>,
    inclusive_2: &HashMap<String, u64>,
    own_1: &HashMap<String, u64>,
    own_2: &HashMap<String, u64>,
    ios: u64,
) -> Vec<FunctionCost> {
    let per_io = |a: Option<&u64>, b: Option<&u64>| {
        (b.copied().unwrap_or(0) as f64 - a.copied().unwrap_or(0) as f64) / ios as f64
    };
    let mut functions: Vec<FunctionCost> = inclusive_2
        .keys()
        .filter_map(|symbol| {
            let part = part_of_symbol(symbol)?;
            Some(FunctionCost {
                symbol: symbol.clone(),
                part,
                inclusive: per_io(inclusive_1.get(symbol), inclusive_2.get(symbol)),
                own: per_io(own_1.get(symbol), own_2.get(symbol)),
            })
        })
        .filter(|f| f.inclusive >= 0.5)
        .collect();
    functions.sort_by(|a, b| {
        b.inclusive
            .total_cmp(&a.inclusive)
            .then_with(|| a.symbol.cmp(&b.symbol))
    });
    functions.truncate(PROFILE_FUNCTIONS);
    functions
}

/// What callgrind_annotate's caller tree says.
#[derive(Debug, Default)]
pub(super) struct Profile {
    pub(super) total: u64,
    pub(super) entries: Vec<Entry>,
}

/// One function's self cost in one source file (inlined code keeps its own file), and, on one
/// of a function's entries, the functions that call it with the inclusive cost of their calls.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) file: String,
    pub(super) symbol: String,
    pub(super) cost: u64,
    callers: Vec<(String, String, u64)>,
}

/// Parses `callgrind_annotate --tree=caller` output: blocks of `  N (P%)  < file:caller (Kx)`
/// lines, each block closed by `  N (P%)  *  file:function [object]`.
pub(super) fn parse_profile(text: &str) -> Profile {
    let mut profile = Profile::default();
    let mut callers = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let Some((count, rest)) = trimmed.split_once(' ') else {
            callers.clear();
            continue;
        };
        let Ok(count) = count.replace(',', "").parse::<u64>() else {
            callers.clear();
            continue;
        };
        // skip "(12.3%)"
        let Some((_, rest)) = rest.split_once(')') else {
            continue;
        };
        let rest = rest.trim_start();
        if rest.starts_with("PROGRAM TOTALS") {
            profile.total = count;
        } else if let Some(caller) = rest.strip_prefix('<') {
            let (file, symbol) = file_and_symbol(caller);
            callers.push((file, symbol, count));
        } else if let Some(function) = rest.strip_prefix('*') {
            let (file, symbol) = file_and_symbol(function);
            profile.entries.push(Entry {
                file,
                symbol,
                cost: count,
                callers: std::mem::take(&mut callers),
            });
        }
    }
    profile
}

/// `file:symbol (123x) [object]` → (file, symbol).
fn file_and_symbol(s: &str) -> (String, String) {
    let mut s = s.trim();
    if s.ends_with(']') {
        if let Some(i) = s.rfind(" [") {
            s = &s[..i];
        }
    }
    if s.ends_with("x)") {
        if let Some(i) = s.rfind(" (") {
            s = &s[..i];
        }
    }
    match s.split_once(':') {
        Some((file, symbol)) => (file.to_string(), symbol.to_string()),
        None => (String::new(), s.to_string()),
    }
}

/// Charges every instruction of `profile` to a [`Part`]. Code of ours goes to its part. Code
/// that neither its file nor its function places (library code run out of line, or inlined into
/// a benchmark's own function) is shared like the rest of its function where some of that was
/// placed (a benchmark's `submit` is mostly inlined driver code), and otherwise passed up to the
/// function's callers in proportion to the inclusive cost of their calls, until it reaches code
/// of ours (or, after a few levels or at a function nobody calls, stays in the rest). What runs
/// once (see `runs_once`) is left out.
fn attribute(profile: &Profile, root: &str) -> Split {
    let mut split = Split::default();
    let mut once = 0.0;
    let mut pending: HashMap<&str, f64> = HashMap::new();
    // per function, how its placed instructions were charged
    let mut placed: HashMap<&str, Split> = HashMap::new();
    let mut callers: HashMap<&str, &[(String, String, u64)]> = HashMap::new();
    for e in &profile.entries {
        match part_of(root, &e.file, &e.symbol) {
            Some(part) => {
                split.add(part, e.cost as f64);
                placed
                    .entry(&e.symbol)
                    .or_default()
                    .add(part, e.cost as f64);
            }
            None if runs_once(&e.symbol) => once += e.cost as f64,
            None => *pending.entry(&e.symbol).or_default() += e.cost as f64,
        }
        if !e.callers.is_empty() {
            callers.insert(&e.symbol, &e.callers);
        }
    }
    // Library code calls library code (Instant::now → clock_gettime): a few levels up.
    for _ in 0..16 {
        let mut next: HashMap<&str, f64> = HashMap::new();
        for (symbol, amount) in pending.drain() {
            if let Some(mix) = placed.get(symbol).filter(|m| m.placed() > 0.0) {
                split.share(mix, amount);
                continue;
            }
            let edges: Vec<_> = callers
                .get(symbol)
                .into_iter()
                .flat_map(|e| e.iter())
                .filter(|(_, s, _)| s != symbol)
                .collect();
            let sum: u64 = edges.iter().map(|(_, _, c)| c).sum();
            if sum == 0 {
                split.rest += amount;
                continue;
            }
            for (file, caller, cost) in edges {
                let share = amount * *cost as f64 / sum as f64;
                match part_of(root, file, caller) {
                    Some(part) => split.add(part, share),
                    None if runs_once(caller) => once += share,
                    None => *next.entry(caller).or_default() += share,
                }
            }
        }
        pending = next;
        if pending.is_empty() {
            break;
        }
    }
    split.rest += pending.values().sum::<f64>();
    split.total = profile.total as f64 - once;
    split
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

    // Trimmed from `callgrind_annotate --inclusive=no --tree=caller --auto=no` of usnvme perf.
    const TREE: &str = "\
--------------------------------------------------------------------------------
Ir                  
--------------------------------------------------------------------------------
50,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
 9,000 (18.00%)  *  /w/driver/src/queue/mod.rs:<usnvme_engine::block::namespace::NamespaceChannel as usnvme_engine::block::Channel>::poll
 5,000 (10.00%)  *  /w/engine/src/block/namespace.rs:<usnvme_engine::block::namespace::NamespaceChannel as usnvme_engine::block::Channel>::poll [/w/target/release/usnvme]

 7,000 (14.00%)  *  tools/src/cli/perf/workload.rs:usnvme_engine::engine::reactor
 3,000 ( 6.00%)  *  /rustc/abc/library/alloc/src/vec/mod.rs:usnvme_engine::engine::reactor

 6,000 (12.00%)  < /r/vm-memory-0.18.0/src/guest_memory.rs:usnvme_driver::sim::queue::Cq::write (40,016x)
 2,000 ( 4.00%)  < /w/driver/src/queue/mod.rs:usnvme_driver::queue::QueuePair::submit_data (20,000x) [/w/target/release/usnvme]
 4,000 ( 8.00%)  *  /r/vm-memory-0.18.0/src/guest_memory.rs:vm_memory::guest_memory::GuestMemoryBackend::to_region_addr [/w/target/release/usnvme]
 8,000 (16.00%)  *  /w/driver/src/sim/queue.rs:usnvme_driver::sim::queue::Cq::write [/w/target/release/usnvme]
   800 ( 1.60%)  *  /w/driver/src/spec/command.rs:usnvme_driver::sim::queue::Cq::write

 1,000 ( 2.00%)  < /r/quanta-0.12.6/src/clocks/monotonic/unix.rs:once_cell::imp::OnceCell<T>::initialize::{{closure}} (82,210x)
 1,000 ( 2.00%)  < /rustc/abc/library/std/src/sys/pal/unix/time.rs:<std::sys::pal::unix::time::Timespec>::now (20,827x) [/w/target/release/usnvme]
 2,000 ( 4.00%)  *  ./time/../sysdeps/unix/sysv/linux/clock_gettime.c:clock_gettime@@GLIBC_2.17 [/usr/lib/x86_64-linux-gnu/libc.so.6]

 3,000 ( 6.00%)  < /w/engine/src/engine.rs:usnvme_engine::engine::reactor (20,000x)
   500 ( 1.00%)  *  /rustc/abc/library/std/src/sys/pal/unix/time.rs:<std::sys::pal::unix::time::Timespec>::now [/w/target/release/usnvme]

 1,500 ( 3.00%)  *  /r/quanta-0.12.6/src/lib.rs:once_cell::imp::OnceCell<T>::initialize::{{closure}}
 1,000 ( 2.00%)  *  /w/driver/examples/null_bench.rs:null_bench::run
   700 ( 1.40%)  *  engine/examples/engine_bench.rs:usnvme_engine::engine::reactor
   600 ( 1.20%)  *  /w/driver/src/queue/mod.rs:null_bench::submit
   200 ( 0.40%)  *  /w/driver/examples/null_bench.rs:null_bench::submit [/w/null_bench]
   400 ( 0.80%)  *  /rustc/abc/library/core/src/ptr/mod.rs:null_bench::submit
";

    #[test]
    fn charges_source_lines_to_their_crate_and_library_code_to_its_callers() {
        let p = parse_profile(TREE);
        assert_eq!(p.total, 50_000);
        assert_eq!(p.entries.len(), 15);
        let vm = &p.entries[4];
        assert_eq!(
            vm.symbol,
            "vm_memory::guest_memory::GuestMemoryBackend::to_region_addr"
        );
        assert_eq!(vm.callers.len(), 2);
        assert_eq!(vm.callers[1].2, 2_000);
        let s = attribute(&p, "/w/");
        // driver code inlined into the engine's channel counts as the driver's
        // and so do the standard library's lines inlined into a benchmark's function that is
        // mostly driver code, in the same proportion (600 of 800)
        assert_eq!(s.driver, 9_000.0 + 1_000.0 + 600.0 + 300.0);
        // std code inlined into the engine counts where LTO put it; Timespec::now goes to its
        // caller with half of clock_gettime (the other half was the calibration's)
        assert_eq!(s.engine, 5_000.0 + 3_000.0 + 500.0 + 1_000.0);
        // perf's job, inlined into the engine's reactor
        assert_eq!(s.perf, 7_000.0);
        // the protocol's shared definitions, inlined into the sim, are the sim's work
        assert_eq!(s.sim, 8_000.0 + 800.0 + 3_000.0);
        // a benchmark's own loop, also where cargo named its files relative to the root
        assert_eq!(s.rest, 1_000.0 + 700.0 + 200.0 + 100.0);
        // the calibration's own cost and its clock reads are left out
        assert_eq!(s.total, 50_000.0 - 1_500.0 - 1_000.0);
    }

    // Trimmed from `callgrind_annotate --inclusive=yes --auto=no` of usnvme perf: a function
    // appears once per source file its code came from.
    const INCLUSIVE: &str = "\
--------------------------------------------------------------------------------
Ir                  
--------------------------------------------------------------------------------
64,866,202 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
64,318,843 (99.16%)  /rustc/abc/library/std/src/sys/backtrace.rs:std::sys::backtrace::__rust_begin_short_backtrace [/w/target/release/usnvme]
61,604,009 (94.97%)  /w/engine/src/engine/reactor.rs:usnvme_engine::engine::reactor::reactor [/w/target/release/usnvme]
33,642,201 (51.86%)  /w/engine/src/block/namespace.rs:usnvme_engine::engine::reactor::reactor
33,062,899 (50.97%)  /w/driver/src/sim/mod.rs:<usnvme_driver::sim::SimController as usnvme_driver::regs::Registers>::write32 [/w/target/release/usnvme]
 9,490,749 (14.63%)  /w/engine/src/engine/channel.rs:usnvme_engine::engine::reactor::reactor
 5,407,825 ( 8.34%)  /w/engine/src/block/namespace.rs:usnvme_engine::block::namespace::NamespaceChannel::poll::{{closure}} [/w/target/release/usnvme]
    12,000 ( 0.02%)  /w/tools/src/cli/perf/session.rs:usnvme::perf::session::Session::measure [/w/target/release/usnvme]
";

    #[test]
    fn a_functions_inclusive_cost_is_its_largest_entry() {
        let costs = parse_inclusive(INCLUSIVE);
        assert_eq!(costs.len(), 5);
        assert_eq!(
            costs["usnvme_engine::engine::reactor::reactor"], 61_604_009,
            "the entry under its own file holds its inlined parts"
        );
        assert_eq!(
            costs["<usnvme_driver::sim::SimController as usnvme_driver::regs::Registers>::write32"],
            33_062_899
        );
        assert!(!costs.contains_key("PROGRAM TOTALS"));
    }

    #[test]
    fn what_runs_once_is_taken_out_of_its_callers_inclusive_cost() {
        // reactor -> ReactorClock::new -> OnceCell::initialize (the calibration)
        let tree = "\
 5,000 (10.00%)  < /w/engine/src/engine/reactor.rs:usnvme_engine::engine::reactor::ReactorClock::new (1x)
 1,000 ( 2.00%)  *  /r/once_cell/src/imp_std.rs:once_cell::imp::OnceCell<T>::initialize [/w/usnvme]

 5,100 (10.20%)  < /w/engine/src/engine/reactor.rs:usnvme_engine::engine::reactor::reactor (1x)
   100 ( 0.20%)  *  /w/engine/src/engine/reactor.rs:usnvme_engine::engine::reactor::ReactorClock::new [/w/usnvme]

   900 ( 1.80%)  *  /w/engine/src/engine/reactor.rs:usnvme_engine::engine::reactor::reactor [/w/usnvme]
";
        let profile = parse_profile(tree);
        let clock = "usnvme_engine::engine::reactor::ReactorClock::new";
        let reactor = "usnvme_engine::engine::reactor::reactor";
        let mut inclusive: HashMap<String, u64> = [
            ("once_cell::imp::OnceCell<T>::initialize", 5_000),
            (clock, 5_100),
            (reactor, 9_000),
        ]
        .into_iter()
        .map(|(s, c)| (s.to_string(), c))
        .collect();
        leave_out_runs_once(&mut inclusive, &profile);
        assert_eq!((inclusive[clock], inclusive[reactor]), (100, 4_000));
    }

    #[test]
    fn the_function_profile_is_per_io_ours_only_and_sorted() {
        let one = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
            pairs.iter().map(|(s, c)| (s.to_string(), *c)).collect()
        };
        let reactor = "usnvme_engine::engine::reactor::reactor";
        let write32 =
            "<usnvme_driver::sim::SimController as usnvme_driver::regs::Registers>::write32";
        let clock = "<std::sys::pal::unix::time::Timespec>::now";
        let set_up = "usnvme::perf::session::Session::measure";
        let poll = "usnvme_engine::block::Channel::poll";
        let tie = "usnvme_engine::block::Channel::flush";
        let inclusive_1 = one(&[
            (reactor, 10_000),
            (write32, 4_000),
            (clock, 900),
            (set_up, 5_000),
            (poll, 1_000),
            (tie, 1_000),
        ]);
        let inclusive_2 = one(&[
            (reactor, 30_000),
            (write32, 12_000),
            (clock, 1_800),
            (set_up, 5_002),
            (poll, 3_000),
            (tie, 3_000),
        ]);
        let own_1 = one(&[(reactor, 2_000), (write32, 100)]);
        let own_2 = one(&[(reactor, 6_000), (write32, 300)]);
        let f = functions_per_io(&inclusive_1, &inclusive_2, &own_1, &own_2, 100);
        let got: Vec<_> = f
            .iter()
            .map(|f| (f.symbol.as_str(), f.part, f.inclusive, f.own))
            .collect();
        // the standard library's clock is no function of ours; set-up does not grow with the
        // I/O count (0.02 per I/O); equal costs go by name
        assert_eq!(
            got,
            [
                (reactor, Part::Engine, 200.0, 40.0),
                (write32, Part::Sim, 80.0, 2.0),
                (tie, Part::Engine, 20.0, 0.0),
                (poll, Part::Engine, 20.0, 0.0),
            ]
        );
    }

    #[test]
    fn per_io_is_the_difference_of_two_runs() {
        let a = Split {
            total: 1000.0,
            sim: 500.0,
            ..Default::default()
        };
        let b = Split {
            total: 3000.0,
            sim: 1300.0,
            ..Default::default()
        };
        let d = a.per_io(&b, 10);
        assert_eq!((d.total, d.sim, d.host_side()), (200.0, 80.0, 120.0));
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
