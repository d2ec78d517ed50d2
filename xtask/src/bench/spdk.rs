//! `usnvme perf` against SPDK's `spdk_nvme_perf` in one boot of the test bed: 24 null-backed
//! drives, all on vfio-pci, one core (`-c 0x1`), the same workloads with the same flags, a few
//! rounds that alternate which tool runs first. Absolute figures depend on the host (and on how
//! busy it is); the ratios of one boot are what count.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{Companions, Headlines, Section};
use crate::cmd::sh_quote;
use crate::vm::run;
use crate::vm::trace::{self, Counts};

/// One workload, run by both tools with these flags.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub key: &'static str,
    pub io_size: u32,
    pub pattern: &'static str,
    pub qd: u32,
    pub drives: u32,
}

/// Issue 13's workloads.
pub const WORKLOADS: [Workload; 5] = [
    Workload {
        key: "A",
        io_size: 4096,
        pattern: "randread",
        qd: 32,
        drives: 1,
    },
    Workload {
        key: "Q1",
        io_size: 4096,
        pattern: "randread",
        qd: 1,
        drives: 1,
    },
    Workload {
        key: "B",
        io_size: 4096,
        pattern: "randread",
        qd: 128,
        drives: 24,
    },
    Workload {
        key: "D",
        io_size: 4096,
        pattern: "randwrite",
        qd: 32,
        drives: 1,
    },
    Workload {
        key: "E",
        io_size: 128 << 10,
        pattern: "read",
        qd: 32,
        drives: 1,
    },
];

impl Workload {
    fn describe(&self) -> String {
        let size = if self.io_size >= 1024 {
            format!("{} KiB", self.io_size / 1024)
        } else {
            format!("{} B", self.io_size)
        };
        let drives = if self.drives == 1 {
            "1 drive".to_string()
        } else {
            format!("{} drives", self.drives)
        };
        format!("{size} {} QD {}, {drives}", self.pattern, self.qd)
    }

    /// The flags both tools take (`spdk_nvme_perf`'s, which `usnvme perf` speaks).
    fn flags(&self, seconds: u32) -> String {
        format!(
            "-q {} -o {} -w {} -t {seconds} -c 0x1",
            self.qd, self.io_size, self.pattern
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Usnvme,
    Spdk,
}

impl Tool {
    fn key(self) -> &'static str {
        match self {
            Tool::Usnvme => "usnvme",
            Tool::Spdk => "spdk",
        }
    }
}

/// What one run reported (latencies in microseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub iops: f64,
    pub mib_s: f64,
    pub mean_us: f64,
}

#[derive(Debug, Clone)]
pub struct Run {
    pub workload: usize,
    pub tool: Tool,
    pub round: u32,
    /// None when the run failed or printed nothing usable.
    pub figures: Option<Figures>,
    /// Why a run that gave no figures failed: the first error line of its output.
    pub error: Option<String>,
}

impl Run {
    fn file(&self) -> String {
        let ext = match self.tool {
            Tool::Usnvme => "json",
            Tool::Spdk => "txt",
        };
        format!(
            "{}-{}-{}.{ext}",
            WORKLOADS[self.workload].key,
            self.tool.key(),
            self.round
        )
    }
}

/// The round of the counted runs: after the timed ones, each workload once per tool with QEMU's
/// nvme trace events on (see [`trace`]), which slow the device: counted, not timed.
const COUNTED: u32 = 0;

/// Seconds of each counted run.
const COUNTED_SECONDS: u32 = 2;

/// Everything the boot measured.
#[derive(Debug)]
pub struct SpdkResults {
    pub runs: Vec<Run>,
    /// What each counted run made the devices do, by `{workload}-{tool}`.
    pub device_ops: Counts,
    pub seconds: u32,
    pub rounds: u32,
    pub binary: PathBuf,
    /// "v23.01.1 git sha1 ...", from SPDK's start-up banner.
    pub version: Option<String>,
    /// The guest's exit status (124: vm-run's time limit ended it).
    pub exit_code: u8,
    pub script: String,
}

/// The runs in order: round by round, every workload, the first tool alternating by round;
/// then the counted runs.
fn plan(rounds: u32) -> Vec<Run> {
    let mut runs = Vec::new();
    for round in (1..=rounds).chain([COUNTED]) {
        let order = if round % 2 == 1 {
            [Tool::Usnvme, Tool::Spdk]
        } else {
            [Tool::Spdk, Tool::Usnvme]
        };
        for workload in 0..WORKLOADS.len() {
            for tool in order {
                runs.push(Run {
                    workload,
                    tool,
                    round,
                    figures: None,
                    error: None,
                });
            }
        }
    }
    runs
}

/// Seconds one run may take before it is stopped like Ctrl-C: DPDK's start-up under TCG with 24
/// controllers takes a while.
fn limit(seconds: u32) -> u32 {
    seconds * 2 + 90
}

/// The guest script: one command per run, each writing its output into `out`.
fn script(runs: &[Run], usnvme: &str, spdk: &str, out: &str, seconds: u32) -> String {
    let limit = limit(seconds);
    let mut s = format!(
        "# SPDK wants a writable /var/tmp and /var/run/dpdk: the guest sees the host's root read-only,\n\
         # with its own tmpfs on /tmp and /run (where /var/run leads); hugetlbfs is on /dev/hugepages\n\
         mount -t tmpfs tmpfs /var/tmp || echo 'cannot mount a tmpfs on /var/tmp'\n\
         mkdir -p /var/run/dpdk\n\
         VDEVS=$(ls /sys/bus/pci/drivers/vfio-pci | grep '^0000:' | sort)\n\
         first() {{ echo \"$1\" | head -n \"$2\"; }}\n\
         # run_usnvme OUTPUT DRIVES FLAGS...: usnvme perf on the first DRIVES controllers\n\
         run_usnvme() {{\n  out=$1; n=$2; shift 2\n  for d in $(first \"$VDEVS\" \"$n\"); do set -- \"$@\" -r \"$d\"; done\n  \
         timeout -s INT {limit} {usnvme} perf \"$@\" --json \"$out\" > \"$out.log\" 2>&1 || echo FAILED\n}}\n\
         # run_spdk OUTPUT DRIVES FLAGS...: spdk_nvme_perf on the same controllers\n\
         run_spdk() {{\n  out=$1; n=$2; shift 2\n  for d in $(first \"$VDEVS\" \"$n\"); do set -- \"$@\" -r \"trtype:PCIe traddr:$d\"; done\n  \
         timeout -s INT {limit} {spdk} \"$@\" > \"$out\" 2>&1 || echo FAILED\n  \
         # hugepage files DPDK may leave behind would keep their pages from usnvme\n  \
         rm -f /dev/hugepages/spdk*map_* /dev/hugepages/rtemap_*\n}}\n"
    );
    s.push_str(&format!(
        "# the counted runs ask the host to count QEMU's nvme trace events\nTRACE_DIR={}\n{}",
        sh_quote(out),
        trace::GUEST_FUNCTION
    ));
    for r in runs {
        let w = &WORKLOADS[r.workload];
        let file = sh_quote(&format!("{out}/{}", r.file()));
        let (tool, drives) = (r.tool.key(), w.drives);
        if r.round == COUNTED {
            s.push_str(&format!(
                "echo 'counted: {key} {tool}'; count_device_ops {key}-{tool}; \
                 run_{tool} {file} {drives} {}; count_device_ops off\n",
                w.flags(COUNTED_SECONDS),
                key = w.key,
            ));
        } else {
            s.push_str(&format!(
                "echo 'round {}: {} {tool}'; run_{tool} {file} {drives} {}\n",
                r.round,
                w.key,
                w.flags(seconds)
            ));
        }
    }
    s
}

/// Boots the guest once (24 null drives on vfio-pci) and runs every workload with both tools.
pub fn same_boot(usnvme: &Path, spdk: &Path, seconds: u32, rounds: u32) -> Result<SpdkResults> {
    let out = crate::vm::vm_dir().join("work/bench-spdk");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    // The guest sees the host's root, but not what is under the host's /tmp: the work share it
    // sees at the same path.
    let binary = out.join("spdk_nvme_perf");
    std::fs::copy(spdk, &binary)
        .with_context(|| format!("bench: copying {} to {}", spdk.display(), binary.display()))?;
    let mut runs = plan(rounds);
    let body = script(
        &runs,
        &sh_quote(&usnvme.display().to_string()),
        &sh_quote(&binary.display().to_string()),
        &out.display().to_string(),
        seconds,
    );
    let mut args = super::guest_script(&out, &body)?;
    args.timeout = 600 + runs.len() as u64 * (u64::from(seconds) * 2 + 30);
    let qmp = std::env::temp_dir().join(format!("usnvme-bench-spdk-{}.qmp", std::process::id()));
    args.qmp = Some(qmp.clone());
    args.trace_log = Some(out.join("qemu-trace.log"));
    let counter = trace::Counter::start(out.clone(), qmp.clone(), out.join("qemu-trace.log"));
    // Whatever finished counts, also when the guest did not end cleanly.
    let exit_code = run::run(&args)?;
    let _ = std::fs::remove_file(&qmp);
    let device_ops = counter.finish().unwrap_or_else(|e| {
        eprintln!("bench: counting the devices' work: {e:#}");
        Counts::new()
    });
    let mut version = None;
    for r in &mut runs {
        let file = out.join(r.file());
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        r.figures = match r.tool {
            Tool::Usnvme => usnvme_figures(&text),
            Tool::Spdk => {
                version = version.or_else(|| spdk_version(&text));
                spdk_figures(&text)
            }
        };
        if r.figures.is_none() {
            // usnvme's messages are in its log, SPDK's in its output
            let log = match r.tool {
                Tool::Usnvme => std::fs::read_to_string(format!("{}.log", file.display())),
                Tool::Spdk => Ok(text),
            };
            r.error = Some(first_error(&log.unwrap_or_default()));
        }
    }
    Ok(SpdkResults {
        runs,
        device_ops,
        seconds,
        rounds,
        binary: spdk.to_path_buf(),
        version,
        exit_code,
        script: body,
    })
}

/// IOPS, MiB/s and mean latency from spdk_nvme_perf's `Total` line:
/// `Total                                  :  123456.78     482.25     259.17      20.10    1234.00`
/// (IOPS, MiB/s, average, min and max latency in microseconds).
pub(super) fn spdk_figures(output: &str) -> Option<Figures> {
    let line = output
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("Total"))?;
    let (_, numbers) = line.split_once(':')?;
    let n: Vec<f64> = numbers
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    match n[..] {
        [iops, mib_s, mean_us, _, _] => Some(Figures {
            iops,
            mib_s,
            mean_us,
        }),
        _ => None,
    }
}

/// The first line that says what went wrong (or the last line, or that there was no output).
pub(super) fn first_error(output: &str) -> String {
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| {
            let l = l.to_lowercase();
            l.contains("error") || l.contains("fatal") || l.contains("failed")
        })
        .or(lines.last())
        .map_or("no output".to_string(), |l| l.to_string())
}

/// "v23.01.1 git sha1 ..." from `Starting SPDK v23.01.1 git sha1 186986cf1 / DPDK 22.11.1 ...`.
fn spdk_version(output: &str) -> Option<String> {
    let line = output.lines().find(|l| l.contains("Starting SPDK "))?;
    let (_, v) = line.split_once("Starting SPDK ")?;
    Some(v.split(" / ").next().unwrap_or(v).trim().to_string())
}

/// The same from usnvme perf's JSON: reads and writes of the total.
pub(super) fn usnvme_figures(json: &str) -> Option<Figures> {
    let doc: serde_json::Value = serde_json::from_str(json).ok()?;
    let (mut iops, mut kib_s, mut weighted_ns) = (0.0, 0.0, 0.0);
    for kind in ["read", "write"] {
        let k = &doc["total"][kind];
        let i = k["iops"].as_f64().unwrap_or(0.0);
        iops += i;
        kib_s += k["bw"].as_f64().unwrap_or(0.0);
        weighted_ns += i * k["lat_ns"]["mean"].as_f64().unwrap_or(0.0);
    }
    (iops > 0.0).then(|| Figures {
        iops,
        mib_s: kib_s / 1024.0,
        mean_us: weighted_ns / iops / 1e3,
    })
}

pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// One workload's figures over the rounds.
struct Summary {
    usnvme: Vec<Figures>,
    spdk: Vec<Figures>,
    /// usnvme ÷ SPDK IOPS of each round where both ran.
    pairs: Vec<f64>,
}

fn summary(r: &SpdkResults, workload: usize) -> Summary {
    let get = |tool: Tool, round: u32| {
        r.runs
            .iter()
            .find(|x| x.workload == workload && x.tool == tool && x.round == round)
            .and_then(|x| x.figures)
    };
    let mut s = Summary {
        usnvme: Vec::new(),
        spdk: Vec::new(),
        pairs: Vec::new(),
    };
    for round in 1..=r.rounds {
        let (u, p) = (get(Tool::Usnvme, round), get(Tool::Spdk, round));
        s.usnvme.extend(u);
        s.spdk.extend(p);
        if let (Some(u), Some(p)) = (u, p) {
            if p.iops > 0.0 {
                s.pairs.push(u.iops / p.iops);
            }
        }
    }
    s
}

fn med(f: &[Figures], field: impl Fn(&Figures) -> f64) -> Option<f64> {
    median(f.iter().map(field).collect())
}

/// "min / median / max" of one figure over the rounds, or "failed".
fn spread(f: &[Figures], field: impl Fn(&Figures) -> f64, unit: &str) -> String {
    let v: Vec<f64> = f.iter().map(&field).collect();
    let (Some(min), Some(max), Some(mid)) = (
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
        median(v.clone()),
    ) else {
        return "failed".into();
    };
    format!("{min:.1} / {mid:.1} / {max:.1}{unit}")
}

/// What each tool made the devices do per I/O command, from the counted runs.
fn device_ops_table(m: &mut String, r: &SpdkResults) -> std::fmt::Result {
    writeln!(
        m,
        "\nWhat each tool makes the devices do, per I/O command in steady state (from its first \
         I/O command to its last): QEMU's nvme trace events over one counted run per workload \
         and tool ({COUNTED_SECONDS} s, after the timed rounds, in the same boot; the events \
         slow the device while on, so these runs are counted, not timed). The last column is \
         the register reads of the whole run, start-up and shutdown included. On hardware a \
         doorbell is a posted PCIe write and a register read a round trip: fewer of both is \
         better everywhere, not only under emulation.\n"
    )?;
    if r.device_ops.is_empty() {
        return writeln!(m, "Not counted (see the bench's output for why).");
    }
    let columns = &trace::EVENTS[1..];
    write!(m, "| workload | tool | I/O commands |")?;
    for (_, what) in columns {
        write!(m, " {what} |")?;
    }
    write!(m, " {} |\n|---|---|---:|", trace::READS_WHOLE_RUN)?;
    for _ in columns {
        write!(m, "---:|")?;
    }
    writeln!(m, "---:|")?;
    for w in WORKLOADS {
        for tool in [Tool::Usnvme, Tool::Spdk] {
            let Some(counts) = r.device_ops.get(&format!("{}-{}", w.key, tool.key())) else {
                continue;
            };
            let commands = counts.get(trace::EVENTS[0].0).copied().unwrap_or(0);
            write!(m, "| {} | {} | {commands} |", w.key, tool.key())?;
            for (event, _) in columns {
                let n = counts.get(*event).copied().unwrap_or(0);
                if commands == 0 {
                    write!(m, " {n} |")?;
                } else {
                    write!(m, " {:.3} |", n as f64 / commands as f64)?;
                }
            }
            let reads = counts.get(trace::READS_WHOLE_RUN).copied().unwrap_or(0);
            writeln!(m, " {reads} |")?;
        }
    }
    Ok(())
}

/// The section's heading.
pub const HEADING: &str = "Same boot as SPDK's spdk_nvme_perf";

/// usnvme ÷ SPDK of a workload: the median of the rounds' ratios.
fn ratio(s: &Summary) -> String {
    median(s.pairs.clone()).map_or("–".into(), |x| format!("{x:.2}"))
}

/// The report's section; `None`: not run.
pub fn section(
    m: &mut String,
    results: Option<&SpdkResults>,
    companions: &Companions,
    h: &mut Headlines,
) -> Result<()> {
    writeln!(m, "\n## {HEADING}\n")?;
    let Some(r) = results else {
        writeln!(
            m,
            "Not run: `cargo xtask bench --spdk PATH` (a `spdk_nvme_perf` binary) runs issue 13's \
             workloads with both tools in one boot."
        )?;
        return Ok(());
    };
    let script = companions.file("spdk.sh", &r.script)?;
    let ratios: Vec<String> = (0..WORKLOADS.len())
        .map(|i| format!("{} {}", WORKLOADS[i].key, ratio(&summary(r, i))))
        .collect();
    h.add(
        HEADING,
        "`usnvme perf` ÷ `spdk_nvme_perf`, IOPS on one core, per workload of issue 13 (VM; the \
         median of the rounds' ratios)",
        ratios.join(", "),
        format!(
            "{} (the same flags for both, e.g. `{}`; guest script: {script})",
            h.rerun(Section::Spdk),
            WORKLOADS[0].flags(r.seconds)
        ),
    );
    writeln!(
        m,
        "One boot of the test bed (QEMU, 24 null-backed emulated drives, all on vfio-pci), one \
         core (`-c 0x1`), {} s per run, no warm-up, {} rounds; odd rounds run usnvme first, even \
         rounds SPDK first. The same flags for both (`usnvme perf` speaks `spdk_nvme_perf`'s); \
         QD is per drive. SPDK: `{}`{}. Absolute figures depend on the host; the ratios of one \
         boot are what count. Goals (issue 13): usnvme ÷ SPDK ≥ 1.10 on A, B and D, ≥ 1.0 on E; \
         Q1 mean latency ≤ SPDK's; B keeps every requested I/O in flight.\n",
        r.seconds,
        r.rounds,
        r.binary.display(),
        r.version
            .as_ref()
            .map(|v| format!(" ({v})"))
            .unwrap_or_default()
    )?;
    if r.exit_code != 0 {
        writeln!(
            m,
            "**The guest exited {} (124: time limit, 123: DMA faults, 125: QEMU died); runs that \
             did not finish show as \"failed\".**\n",
            r.exit_code
        )?;
    }
    writeln!(
        m,
        "| workload (1 core) | usnvme IOPS (min / median / max) | SPDK IOPS (min / median / max) | usnvme ÷ SPDK | each round | notes |\n\
         |---|---:|---:|---:|---|---|"
    )?;
    for (i, w) in WORKLOADS.iter().enumerate() {
        let s = summary(r, i);
        let (u, p) = (
            spread(&s.usnvme, |f| f.iops / 1e3, " k"),
            spread(&s.spdk, |f| f.iops / 1e3, " k"),
        );
        let ratio = ratio(&s);
        let rounds = s
            .pairs
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let notes = match w.key {
            "Q1" => format!(
                "mean latency (min / median / max) {} vs {}",
                spread(&s.usnvme, |f| f.mean_us, " µs"),
                spread(&s.spdk, |f| f.mean_us, " µs")
            ),
            "B" => {
                // Little's law: I/Os in flight = IOPS × mean latency.
                let requested = f64::from(w.qd * w.drives);
                let in_flight = |f: &Figures| 100.0 * f.iops * f.mean_us / 1e6 / requested;
                match (med(&s.usnvme, in_flight), med(&s.spdk, in_flight)) {
                    (Some(a), Some(b)) => format!(
                        "in flight (IOPS × mean latency), % of the {requested:.0} requested: \
                         usnvme {a:.0} %, SPDK {b:.0} %"
                    ),
                    _ => String::new(),
                }
            }
            "E" => match (med(&s.usnvme, |f| f.mib_s), med(&s.spdk, |f| f.mib_s)) {
                (Some(a), Some(b)) => format!("{a:.0} MiB/s vs {b:.0} MiB/s"),
                _ => String::new(),
            },
            _ => String::new(),
        };
        writeln!(
            m,
            "| {}: {} | {u} | {p} | {ratio} | {rounds} | {notes} |",
            w.key,
            w.describe(),
        )?;
    }
    // Why runs failed, each reason once.
    let mut failures: Vec<(String, Vec<String>)> = Vec::new();
    for run in r.runs.iter().filter(|x| x.figures.is_none()) {
        let why = format!(
            "{}: {}",
            run.tool.key(),
            run.error.as_deref().unwrap_or("no figures")
        );
        let name = match run.round {
            COUNTED => format!("{} counted", WORKLOADS[run.workload].key),
            round => format!("{} round {round}", WORKLOADS[run.workload].key),
        };
        match failures.iter_mut().find(|(w, _)| *w == why) {
            Some((_, names)) => names.push(name),
            None => failures.push((why, vec![name])),
        }
    }
    if !failures.is_empty() {
        writeln!(m, "\nFailed runs:\n")?;
        for (why, names) in &failures {
            writeln!(m, "- {} — `{why}`", names.join(", "))?;
        }
    }
    writeln!(
        m,
        "\nusnvme ÷ SPDK is the median of the rounds' ratios (each round's pair ran back to back)."
    )?;
    device_ops_table(m, r)?;
    writeln!(
        m,
        "\nThe guest script (run by `cargo xtask bench` through `cargo xtask vm-run`, 24 drives \
         on vfio-pci): {script}."
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The end of a spdk_nvme_perf v23.01 run.
    const SPDK: &str = "\
[2024-01-01 00:00:00.000000] Starting SPDK v23.01.1 git sha1 186986cf1 / DPDK 22.11.1 initialization...
Initializing NVMe Controllers
Attached to NVMe Controller at 0000:01:00.0 [1b36:0010]
Associating PCIE (0000:01:00.0) NSID 1 with lcore 0
Initialization complete. Launching workers.
========================================================
                                                                           Latency(us)
Device Information                                     :       IOPS      MiB/s    Average        min        max
PCIE (0000:01:00.0) NSID 1 from core  0:  123456.78     482.25     259.17      20.10    1234.00
========================================================
Total                                                  :  123456.78     482.25     259.17      20.10    1234.00
";

    #[test]
    fn reads_spdk_perf_total_line_and_version() {
        assert_eq!(
            spdk_figures(SPDK),
            Some(Figures {
                iops: 123_456.78,
                mib_s: 482.25,
                mean_us: 259.17
            })
        );
        assert_eq!(
            spdk_version(SPDK).as_deref(),
            Some("v23.01.1 git sha1 186986cf1")
        );
        assert_eq!(spdk_figures("EAL: No free 2048 kB hugepages\n"), None);
    }

    #[test]
    fn reads_usnvme_json_reads_and_writes() {
        let json = r#"{"total": {"read": {"iops": 300.0, "bw": 1200, "lat_ns": {"mean": 1000.0}},
                        "write": {"iops": 100.0, "bw": 400, "lat_ns": {"mean": 5000.0}}}}"#;
        let f = usnvme_figures(json).unwrap_or_else(|| panic!("no figures"));
        assert_eq!(f.iops, 400.0);
        assert_eq!(f.mib_s, 1600.0 / 1024.0);
        assert_eq!(f.mean_us, 2.0);
        assert_eq!(usnvme_figures("{}"), None);
    }

    #[test]
    fn rounds_alternate_which_tool_runs_first() {
        let runs = plan(2);
        // two timed rounds and the counted one
        assert_eq!(runs.len(), 3 * 2 * WORKLOADS.len());
        assert!(runs[4 * WORKLOADS.len()..]
            .iter()
            .all(|r| r.round == COUNTED));
        assert_eq!((runs[0].tool, runs[1].tool), (Tool::Usnvme, Tool::Spdk));
        let second = &runs[2 * WORKLOADS.len()..];
        assert_eq!((second[0].tool, second[1].tool), (Tool::Spdk, Tool::Usnvme));
    }

    #[test]
    fn both_tools_get_the_same_flags() {
        let runs = plan(1);
        let s = script(&runs[4..6], "/u", "/s", "/o", 10);
        assert!(
            s.contains("run_usnvme /o/B-usnvme-1.json 24 -q 128 -o 4096 -w randread -t 10 -c 0x1"),
            "{s}"
        );
        assert!(
            s.contains("run_spdk /o/B-spdk-1.txt 24 -q 128 -o 4096 -w randread -t 10 -c 0x1"),
            "{s}"
        );
        assert!(s.contains("mount -t tmpfs tmpfs /var/tmp"), "{s}");
        let counted = plan(1).split_off(2 * WORKLOADS.len());
        let s = script(&counted[..1], "/u", "/s", "/o", 10);
        assert!(
            s.contains(
                "count_device_ops A-spdk; run_spdk /o/A-spdk-0.txt 1 -q 32 -o 4096 -w randread -t 2 -c 0x1; count_device_ops off"
            ),
            "{s}"
        );
    }

    #[test]
    fn failed_runs_say_why() {
        let out = "Starting SPDK\nERROR: This system does not support \"RDSEED\".\nEAL: FATAL: x\n";
        assert_eq!(
            first_error(out),
            "ERROR: This system does not support \"RDSEED\"."
        );
        assert_eq!(first_error("a\nlast\n\n"), "last");
        assert_eq!(first_error(""), "no output");
    }

    #[test]
    fn the_section_links_its_script_and_gives_each_workloads_ratio() {
        let mut runs = plan(1);
        for run in &mut runs {
            let iops = match run.tool {
                Tool::Usnvme => 1100.0,
                Tool::Spdk => 1000.0,
            };
            run.figures = Some(Figures {
                iops,
                mib_s: 1.0,
                mean_us: 10.0,
            });
        }
        let r = SpdkResults {
            runs,
            device_ops: Counts::new(),
            seconds: 10,
            rounds: 1,
            binary: PathBuf::from("/s"),
            version: None,
            exit_code: 0,
            script: "echo spdk\n".into(),
        };
        let (companions, mut h) = (Companions::for_test("spdk"), Headlines::new(String::new()));
        let mut m = String::new();
        section(&mut m, Some(&r), &companions, &mut h).expect("section");
        assert!(
            m.contains(
                "The guest script (run by `cargo xtask bench` through `cargo xtask vm-run`, 24 \
                 drives on vfio-pci): [benchmarks/spdk.sh](benchmarks/spdk.sh)."
            ),
            "{m}"
        );
        assert_eq!(companions.read("spdk.sh"), "echo spdk\n");
        companions.remove();
        let t = h.table();
        assert!(
            t.contains(
                "| A 1.10, Q1 1.10, B 1.10, D 1.10, E 1.10 | `cargo xtask bench --only spdk` (the \
                 same flags for both, e.g. `-q 32 -o 4096 -w randread -t 10 -c 0x1`; guest \
                 script: [benchmarks/spdk.sh](benchmarks/spdk.sh)) | [Same boot as SPDK's \
                 spdk_nvme_perf](#same-boot-as-spdks-spdk_nvme_perf) |"
            ),
            "{t}"
        );
    }

    #[test]
    fn medians_and_pairs() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }
}
