//! fio with usnvme's engine against `usnvme perf` on the same drives in one boot: locally (a
//! drive on vfio-pci) and over NVMe/TCP (`usnvme serve -c 1` exporting another drive), every
//! initiator on core 0; and SPDK's fio plugin (`--spdk-fio`) on the same drives where it was
//! built. Rounds alternate which tool runs first; the ratios of one boot are what count.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::spdk::{median, usnvme_figures, Figures};
use super::{open_section, times, Companions, Headlines, Section};
use crate::cmd::sh_quote;
use crate::vm::run;

const NQN: &str = "nqn.2024-01.io.usnvme:bench-fio";

/// One workload: 4 KiB random reads at `qd` on one drive, local or through `serve`; `batched`:
/// fio submits and reaps in batches (`iodepth_batch_submit`, `iodepth_batch_complete_min`),
/// where by default it commits and reaps every I/O (usnvme perf runs as it always does).
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub key: &'static str,
    pub qd: u32,
    pub remote: bool,
    pub batched: bool,
}

/// Local cases first: `serve` starts (and polls a core) only for the TCP ones.
pub const CASES: [Case; 4] = [
    Case {
        key: "local QD 32",
        qd: 32,
        remote: false,
        batched: false,
    },
    Case {
        key: "local QD 32, fio batched",
        qd: 32,
        remote: false,
        batched: true,
    },
    Case {
        key: "local QD 1",
        qd: 1,
        remote: false,
        batched: false,
    },
    Case {
        key: "TCP QD 32",
        qd: 32,
        remote: true,
        batched: false,
    },
];

impl Case {
    /// fio's flags beyond the common ones.
    fn fio_flags(&self) -> String {
        let mut f = format!("--iodepth={}", self.qd);
        if self.batched {
            f += &format!(
                " --iodepth_batch_submit={} --iodepth_batch_complete_min={}",
                self.qd,
                (self.qd / 2).max(1)
            );
        }
        f
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Perf,
    Engine,
    SpdkPlugin,
}

impl Tool {
    fn key(self) -> &'static str {
        match self {
            Tool::Perf => "perf",
            Tool::Engine => "engine",
            Tool::SpdkPlugin => "spdk-plugin",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Run {
    pub case: usize,
    pub tool: Tool,
    pub round: u32,
    pub figures: Option<Figures>,
}

impl Run {
    fn file(&self) -> String {
        format!("{}-{}-{}.json", self.case, self.tool.key(), self.round)
    }
}

#[derive(Debug)]
pub struct FioResults {
    /// The same tools on the host, on a `sim` null drive (what each costs a core).
    pub host: Vec<(String, Option<Figures>)>,
    pub runs: Vec<Run>,
    pub seconds: u32,
    pub rounds: u32,
    pub fio_version: String,
    pub plugin: Option<PathBuf>,
    pub exit_code: u8,
    pub script: String,
}

/// Case by case, round by round, the tools in an order that turns each round.
fn plan(rounds: u32, plugin: bool) -> Vec<Run> {
    let mut tools = vec![Tool::Perf, Tool::Engine];
    if plugin {
        tools.push(Tool::SpdkPlugin);
    }
    let mut runs = Vec::new();
    for case in 0..CASES.len() {
        for round in 1..=rounds {
            for i in 0..tools.len() {
                let tool = tools[(i + round as usize - 1) % tools.len()];
                runs.push(Run {
                    case,
                    tool,
                    round,
                    figures: None,
                });
            }
        }
    }
    runs
}

/// The guest script: one command per run; `serve` on the second drive before the first TCP run.
fn script(
    runs: &[Run],
    usnvme: &str,
    engine: &str,
    plugin: Option<&str>,
    out: &str,
    seconds: u32,
) -> String {
    let limit = seconds * 2 + 60;
    let nqn_fio = NQN.replace(':', "\\:");
    let mut s = format!(
        "VDEVS=$(ls /sys/bus/pci/drivers/vfio-pci | grep '^0000:' | sort)\n\
         LOCAL=$(echo \"$VDEVS\" | sed -n 1p); REMOTE=$(echo \"$VDEVS\" | sed -n 2p)\n\
         LOCAL_FIO=$(echo \"$LOCAL\" | tr : .)\n\
         # SPDK wants a writable /var/tmp and /var/run/dpdk (the guest sees the host's root read-only)\n\
         mount -t tmpfs tmpfs /var/tmp 2>/dev/null; mkdir -p /var/run/dpdk\n\
         run_perf() {{ o=$1; t=$2; qd=$3; timeout -s INT {limit} {usnvme} perf -r \"$t\" -q $qd -o 4096 -w randread -t {seconds} -c 0x1 --json \"$o\" > \"$o.log\" 2>&1 || echo FAILED; }}\n\
         # run_fio OUTPUT PRELOAD ENGINE FILE FLAGS...\n\
         run_fio() {{ o=$1; p=$2; e=$3; f=$4; shift 4; timeout -s INT {limit} env LD_PRELOAD=\"$p\" fio --name=bench --thread --ioengine=\"$e\" --filename=\"$f\" --rw=randread --bs=4k \"$@\" --time_based --runtime={seconds} --cpus_allowed=0 --output-format=json --output=\"$o\" > \"$o.log\" 2>&1 || echo FAILED; rm -f /dev/hugepages/spdk*map_* /dev/hugepages/rtemap_*; }}\n"
    );
    let mut serving = false;
    for r in runs {
        let c = &CASES[r.case];
        if c.remote && !serving {
            serving = true;
            s += &format!(
                "{usnvme} serve -c 1 --nqn {NQN} --allow-any-host --listen 127.0.0.1:4420 -r \"$REMOTE\" > {out}/serve.log 2>&1 &\n\
                 i=0; until grep -q '^hosts:' {out}/serve.log || [ $i -ge 1200 ]; do sleep 0.1; i=$((i+1)); done\n"
            );
        }
        let o = sh_quote(&format!("{out}/{}", r.file()));
        let flags = c.fio_flags();
        let line = match (r.tool, c.remote) {
            (Tool::Perf, false) => format!("run_perf {o} \"$LOCAL\" {}", c.qd),
            (Tool::Perf, true) => format!("run_perf {o} tcp://127.0.0.1:4420/{NQN} {}", c.qd),
            (Tool::Engine, false) => {
                format!("run_fio {o} '' external:{engine} \"$LOCAL_FIO\" {flags}")
            }
            (Tool::Engine, true) => format!(
                "run_fio {o} '' external:{engine} 'tcp\\://127.0.0.1\\:4420/{nqn_fio}' {flags}"
            ),
            (Tool::SpdkPlugin, false) => format!(
                "run_fio {o} {} spdk \"trtype=PCIe traddr=$LOCAL_FIO ns=1\" {flags}",
                plugin.unwrap_or("")
            ),
            (Tool::SpdkPlugin, true) => format!(
                "run_fio {o} {} spdk 'trtype=tcp adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn={nqn_fio} ns=1' {flags}",
                plugin.unwrap_or("")
            ),
        };
        s += &format!(
            "echo 'round {}: {} {}'; {line}\n",
            r.round,
            c.key,
            r.tool.key()
        );
    }
    s
}

/// IOPS and mean latency from fio's JSON (the first job; fio may print notes before it).
fn fio_figures(text: &str) -> Option<Figures> {
    let doc: serde_json::Value = serde_json::from_str(&text[text.find('{')?..]).ok()?;
    let read = &doc["jobs"][0]["read"];
    let iops = read["iops"].as_f64().filter(|&i| i > 0.0)?;
    Some(Figures {
        iops,
        mib_s: read["bw"].as_f64().unwrap_or(0.0) / 1024.0,
        mean_us: read["lat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1e3,
    })
}

/// Boots the guest once (two drives on vfio-pci: one local, one behind `serve`) and runs every
/// case with every tool.
pub fn same_boot(
    usnvme: &Path,
    engine: &crate::fio_engine::Engine,
    plugin: Option<&Path>,
    seconds: u32,
    rounds: u32,
) -> Result<FioResults> {
    let out = crate::vm::vm_dir().join("work/bench-fio");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    // the guest sees the host's root but not its /tmp: the plugin goes on the work share
    let plugin_copy = match plugin {
        Some(p) => {
            let copy = out.join("spdk_nvme");
            std::fs::copy(p, &copy).with_context(|| format!("bench: copying {}", p.display()))?;
            Some(copy)
        }
        None => None,
    };
    let mut runs = plan(rounds, plugin.is_some());
    let body = script(
        &runs,
        &sh_quote(&usnvme.display().to_string()),
        &sh_quote(&engine.library.display().to_string()),
        plugin_copy
            .as_ref()
            .map(|p| sh_quote(&p.display().to_string()))
            .as_deref(),
        &out.display().to_string(),
        seconds,
    );
    let mut args = super::guest_script(&out, &body)?;
    args.drives = 2;
    args.timeout = 600 + runs.len() as u64 * (u64::from(seconds) * 2 + 60);
    let exit_code = run::run(&args)?;
    for r in &mut runs {
        let text = std::fs::read_to_string(out.join(r.file())).unwrap_or_default();
        r.figures = match r.tool {
            Tool::Perf => usnvme_figures(&text),
            Tool::Engine | Tool::SpdkPlugin => fio_figures(&text),
        };
    }
    let host = host_side(usnvme, engine, seconds);
    Ok(FioResults {
        host,
        runs,
        seconds,
        rounds,
        fio_version: engine.fio_version.clone(),
        plugin: plugin.map(Path::to_path_buf),
        exit_code,
        script: body,
    })
}

/// `usnvme perf` and fio with the engine, as they run in the VM (QD 32; fio also batched), on
/// the host on core 0 against an inline `sim` null drive: where the device costs nothing, what
/// each tool costs a core.
fn host_side(
    usnvme: &Path,
    engine: &crate::fio_engine::Engine,
    seconds: u32,
) -> Vec<(String, Option<Figures>)> {
    let drive = "sim:0,backend=null,mode=inline,size=1T";
    let runtime = format!("--runtime={seconds}");
    let mut rows = Vec::new();
    let json = crate::target_dir().join("fio/bench-host-perf.json");
    let _ = std::fs::remove_file(&json);
    let _ = std::process::Command::new("taskset")
        .args(["-c", "0"])
        .arg(usnvme)
        .args([
            "perf", "-r", drive, "-c", "0", "-q", "32", "-o", "4k", "-w", "randread",
        ])
        .args(["-t", &seconds.to_string(), "--json"])
        .arg(&json)
        .output();
    let text = std::fs::read_to_string(&json).unwrap_or_default();
    rows.push((
        format!("usnvme perf -q 32 -c 0 -r {drive}"),
        usnvme_figures(&text),
    ));
    for case in [&CASES[0], &CASES[1]] {
        let flags = case.fio_flags();
        let fio = std::process::Command::new("taskset")
            .args(["-c", "0", "fio", "--name=bench", "--thread"])
            .arg(format!("--ioengine=external:{}", engine.library.display()))
            .arg(format!("--filename={}", drive.replace(':', "\\:")))
            .args(["--rw=randread", "--bs=4k", "--time_based", &runtime])
            .args(flags.split_whitespace())
            .arg("--output-format=json")
            .output();
        let text = fio.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        rows.push((
            format!("fio + engine {flags}"),
            text.ok().and_then(|t| fio_figures(&t)),
        ));
    }
    rows
}

/// `tool`'s IOPS on `case`, round by round (None where it gave no figures).
fn iops(r: &FioResults, case: usize, tool: Tool) -> Vec<Option<f64>> {
    (1..=r.rounds)
        .map(|round| {
            r.runs
                .iter()
                .find(|x| x.case == case && x.tool == tool && x.round == round)
                .and_then(|x| x.figures)
                .map(|f| f.iops)
        })
        .collect()
}

/// The median of `tool`'s IOPS on `case`.
fn median_iops(r: &FioResults, case: usize, tool: Tool) -> Option<f64> {
    median(iops(r, case, tool).into_iter().flatten().collect())
}

/// The median over rounds of `tool` ÷ `base` on `case`.
fn ratio(r: &FioResults, case: usize, tool: Tool, base: Tool) -> Option<f64> {
    let (own, other) = (iops(r, case, tool), iops(r, case, base));
    median(
        own.iter()
            .zip(&other)
            .filter_map(|(a, b)| Some((*a)? / (*b)?))
            .collect(),
    )
}

/// The section's heading.
pub const HEADING: &str = "fio with usnvme's engine (one boot)";

pub fn section(
    m: &mut String,
    results: Option<&FioResults>,
    why_not: &str,
    companions: &Companions,
    h: &mut Headlines,
) -> Result<()> {
    let Some(r) = open_section(m, HEADING, results, why_not)? else {
        return Ok(());
    };
    let script = companions.file("fio.sh", &r.script)?;
    writeln!(
        m,
        "{} with `libusnvme_fio.so` (`cargo xtask fio-engine`) against `usnvme perf` on the same \
         drive: 4 KiB random reads, {} s per run, {} rounds alternating which tool runs first, \
         every initiator on core 0 (`--cpus_allowed=0`, `-c 0x1`); TCP: `usnvme serve -c 1` on \
         another drive, on loopback. {}Medians over the rounds; ratios are the median of each \
         round's ratio.\n",
        r.fio_version,
        r.seconds,
        r.rounds,
        match &r.plugin {
            Some(p) => format!("SPDK's fio plugin ({}) on the same drives. ", p.display()),
            None => "SPDK's fio plugin: not run (`--spdk-fio PATH`, built from an SPDK tree configured `--with-fio` on this fio's source). ".into(),
        }
    )?;
    writeln!(
        m,
        "| case | usnvme perf IOPS | fio + engine IOPS | engine ÷ perf | SPDK plugin IOPS | engine ÷ plugin |\n|---|---|---|---|---|---|"
    )?;
    let num = |v: Option<f64>, f: fn(f64) -> String| v.map_or("—".to_string(), f);
    let whole = |v: f64| format!("{v:.0}");
    let two_places = |v: f64| format!("{v:.2}");
    let mut goal_perf = None;
    let mut goal_plugin = None;
    for (i, c) in CASES.iter().enumerate() {
        let perf = median_iops(r, i, Tool::Perf);
        let engine = median_iops(r, i, Tool::Engine);
        let plugin = median_iops(r, i, Tool::SpdkPlugin);
        let vs_perf = ratio(r, i, Tool::Engine, Tool::Perf);
        let vs_plugin = ratio(r, i, Tool::Engine, Tool::SpdkPlugin);
        writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} |",
            c.key,
            num(perf, whole),
            num(engine, whole),
            num(vs_perf, two_places),
            num(plugin, whole),
            num(vs_plugin, two_places)
        )?;
        if i == 0 {
            (goal_perf, goal_plugin) = (vs_perf, vs_plugin);
        }
    }
    let verdict = |v: Option<f64>, ok: fn(f64) -> bool| match v {
        Some(v) if ok(v) => format!("met ({v:.2})"),
        Some(v) => format!("not met ({v:.2})"),
        None => "not measured".to_string(),
    };
    writeln!(
        m,
        "\nGoals (issue 26, local QD 32, one core; fio at its defaults): fio + engine within 10 % of `usnvme perf`: {}; at or above SPDK's fio plugin: {}.",
        verdict(goal_perf, |v| v >= 0.9),
        verdict(goal_plugin, |v| v >= 1.0)
    )?;
    let mut value = times(goal_perf);
    if r.plugin.is_some() {
        value += &format!("; ÷ SPDK's fio plugin: {}", times(goal_plugin));
    }
    h.add(
        HEADING,
        "fio + usnvme's engine ÷ `usnvme perf`, IOPS, 4 KiB randread QD 32, local drive, one core \
         (VM; fio at its defaults; the median of the rounds' ratios)",
        value,
        format!("{} (guest script: {script})", h.rerun(Section::Fio)),
    );
    writeln!(
        m,
        "\nOn the host, core 0, an inline `sim` null drive (no device time: what each tool costs a core):\n\n| command | IOPS |\n|---|---|"
    )?;
    for (label, f) in &r.host {
        writeln!(m, "| `{label}` | {} |", num(f.map(|f| f.iops), whole))?;
    }
    let failed: Vec<String> = r
        .runs
        .iter()
        .filter(|x| x.figures.is_none())
        .map(|x| format!("{} {} round {}", CASES[x.case].key, x.tool.key(), x.round))
        .collect();
    if !failed.is_empty() {
        writeln!(
            m,
            "\nRuns that gave no figures (their logs are in target/vm/work/bench-fio): {}.",
            failed.join(", ")
        )?;
    }
    if r.exit_code != 0 {
        writeln!(m, "\nThe guest ended with exit code {}.", r.exit_code)?;
    }
    writeln!(
        m,
        "\nThe guest script (run by `cargo xtask bench` through `cargo xtask vm-run`, 2 drives \
         on vfio-pci): {script}."
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_links_its_script_and_gives_the_engines_ratio_to_perf() {
        let mut runs = plan(1, false);
        for run in &mut runs {
            let iops = if run.tool == Tool::Perf { 200.0 } else { 190.0 };
            run.figures = Some(Figures {
                iops,
                mib_s: 1.0,
                mean_us: 1.0,
            });
        }
        let r = FioResults {
            host: Vec::new(),
            runs,
            seconds: 3,
            rounds: 1,
            fio_version: "fio-3.33".into(),
            plugin: None,
            exit_code: 0,
            script: "echo fio\n".into(),
        };
        let (companions, mut h) = (Companions::for_test("fio"), Headlines::new(String::new()));
        let mut m = String::new();
        section(&mut m, Some(&r), "", &companions, &mut h).expect("section");
        assert!(
            m.contains(
                "The guest script (run by `cargo xtask bench` through `cargo xtask vm-run`, 2 \
                 drives on vfio-pci): [benchmarks/fio.sh](benchmarks/fio.sh)."
            ),
            "{m}"
        );
        assert!(!m.contains("<details>"), "{m}");
        assert_eq!(companions.read("fio.sh"), "echo fio\n");
        companions.remove();
        let t = h.table();
        assert!(
            t.contains(
                "| 0.95 × | `cargo xtask bench --only fio` (guest script: \
                 [benchmarks/fio.sh](benchmarks/fio.sh)) |"
            ),
            "{t}"
        );
    }
}
