//! The fabric-rdma section: NVMe over RDMA in one boot on soft-RoCE (`rdma_rxe` on the guest's
//! `dummy0`, which /init makes and addresses), two comparisons:
//!
//! - **hosts**, in front of the kernel's nvmet-rdma (configured through configfs on the block
//!   device of a drive left on the kernel's nvme driver, as the fabric section's nvmet-tcp): the
//!   same workload from `usnvme perf -r rdma://…` and from the kernel's nvme-rdma host (`nvme
//!   connect -t rdma`) with fio and io_uring on the block device it creates;
//! - **targets**, with the kernel's nvme-rdma host and fio in front of each: `usnvme serve
//!   --listen rdma:…` on a drive bound to vfio-pci (one reactor, as in the fabric section, started
//!   for its block of runs and stopped after it) against that nvmet-rdma.
//!
//! The initiator runs on one guest CPU. Soft-RoCE under TCG emulation says nothing about RDMA
//! hardware: these are functional figures, and only the comparisons within the boot mean
//! anything. The workload's command lines are the fabric section's ([`Initiator::command`]), and
//! so are serve's start and stop ([`fabric::start_serve`], [`fabric::stop_target`]), the parsing
//! of the output and the /proc/stat windows around each run.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::fabric::{
    self, parse_fio, parse_perf, parse_snapshot, window, Figures, Initiator, Target, Window,
    INITIATOR_CPU, TARGET_CPU,
};
use super::spdk::median;
use super::{open_section, Companions, Headlines, Provenance, Section};
use crate::cmd::sh_quote;
use crate::vm::run;

/// iproute2's `rdma` (the guest runs the host's root).
const RDMA: &str = "/usr/bin/rdma";
/// The netdev /init makes for soft-RoCE, its address (tests/src/rdma.rs: RDMA_NETDEV,
/// RDMA_ADDRESS) and the rxe device the script adds on it.
const NETDEV: &str = "dummy0";
const ADDRESS: &str = "169.254.77.1";
const DEVICE: &str = "rxe0";
/// NVMe/RDMA's registered port: nvmet-rdma's; `usnvme serve` listens beside it.
const NVMET_PORT: u16 = 4420;
const SERVE_PORT: u16 = 4430;
const NVMET_NQN: &str = "nqn.2014-08.org.usnvme:bench-rdma";
const SERVE_NQN: &str = "nqn.2014-08.org.usnvme:bench-rdma-serve";
/// The queue depths of the full run (one namespace): throughput and latency.
const FULL_QDS: [u32; 2] = [32, 1];
const FULL_ROUNDS: u32 = 2;
/// The (target, initiator) blocks of a round, in odd rounds' order (even rounds reverse it):
/// the hosts' comparison against nvmet-rdma, then the targets' with the kernel's host, which
/// share the middle block.
const BLOCKS: [(Target, Initiator); 3] = [
    (Target::Kernel, Initiator::UsnvmePerf),
    (Target::Kernel, Initiator::KernelFio),
    (Target::Usnvme, Initiator::KernelFio),
];

fn port(t: Target) -> u16 {
    match t {
        Target::Usnvme => SERVE_PORT,
        Target::Kernel => NVMET_PORT,
    }
}

fn nqn(t: Target) -> &'static str {
    match t {
        Target::Usnvme => SERVE_NQN,
        Target::Kernel => NVMET_NQN,
    }
}

/// The targets, as the section names them.
pub fn target_label(t: Target) -> &'static str {
    match t {
        Target::Usnvme => "usnvme serve (RDMA)",
        Target::Kernel => "kernel nvmet-rdma",
    }
}

/// One run: an initiator against a target at a queue depth, on the one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub round: u32,
    pub target: Target,
    pub initiator: Initiator,
    pub qd: u32,
}

impl Case {
    fn stem(&self) -> String {
        format!(
            "r{}-{}-{}-qd{}",
            self.round,
            self.target.key(),
            self.initiator.key(),
            self.qd
        )
    }

    /// The fabric section's case of the same workload (its command lines are reused; its
    /// target only names the transport of SPDK's, which does not run here).
    fn fabric(&self) -> fabric::Case {
        fabric::Case {
            round: self.round,
            target: self.target,
            initiator: self.initiator,
            qd: self.qd,
            drives: 1,
        }
    }
}

/// The initiators, as the section names them.
pub fn label(i: Initiator) -> &'static str {
    match i {
        Initiator::KernelFio => "Linux nvme-rdma + fio io_uring",
        Initiator::UsnvmePerf => "usnvme perf",
        Initiator::Spdk => "spdk_nvme_perf",
    }
}

/// The runs of one boot, in order: per round, each of the [`BLOCKS`] (reversed in even rounds),
/// each QD.
pub fn cases(quick: bool) -> Vec<Case> {
    let (qds, rounds): (&[u32], u32) = if quick {
        (&[32], 1)
    } else {
        (&FULL_QDS, FULL_ROUNDS)
    };
    let mut out = Vec::new();
    for round in 1..=rounds {
        let mut blocks = BLOCKS;
        if round % 2 == 0 {
            blocks.reverse();
        }
        for (target, initiator) in blocks {
            for &qd in qds {
                out.push(Case {
                    round,
                    target,
                    initiator,
                    qd,
                });
            }
        }
    }
    out
}

/// The RoCE v2 GID of [`ADDRESS`] as sysfs writes it, its last two groups (`a9fe:4d01`).
fn gid_tail() -> String {
    let octets: Vec<u8> = ADDRESS.split('.').filter_map(|o| o.parse().ok()).collect();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}",
        octets[0], octets[1], octets[2], octets[3]
    )
}

/// Soft-RoCE up (`$RXE` = 1 once it is) and nvmet-rdma configured (`$NVMET` = 1 once it is).
fn setup() -> String {
    let ib = format!("/sys/class/infiniband/{DEVICE}/ports/1");
    let gid = gid_tail();
    format!(
        "RDMA={RDMA}\n\
         ADDR={ADDRESS}\n\
         NQN={NVMET_NQN}\n\
         echo '== soft-RoCE: {DEVICE} on {NETDEV} ({ADDRESS})'\n\
         RXE=0; NVMET=0\n\
         [ -d /sys/class/infiniband/{DEVICE} ] || $RDMA link add {DEVICE} type rxe netdev {NETDEV} \
         || echo 'FAILED: rdma link add {DEVICE} type rxe netdev {NETDEV}'\n\
         i=0\n\
         while [ $i -lt 60 ]; do\n\
         \x20 grep -q ACTIVE {ib}/state 2>/dev/null && cat {ib}/gids/* 2>/dev/null \
         | grep -q ':ffff:{gid}$' && {{ RXE=1; break; }}\n\
         \x20 sleep 0.5; i=$((i + 1))\n\
         done\n\
         [ $RXE = 1 ] && $RDMA link show {DEVICE}/1 || echo 'FAILED: {DEVICE} port 1 is not ACTIVE with {ADDRESS}'\n\
         # the kernel's target: nvmet-rdma on the drive left on the kernel's nvme driver\n\
         S=$CFS/subsystems/$NQN\n\
         P=$CFS/ports/1\n\
         if [ $RXE = 1 ]; then\n\
         \x20 D=$(first \"$KDEVS\" 1)\n\
         \x20 [ -n \"$D\" ] && mkdir $S && echo 1 > $S/attr_allow_any_host && mkdir $S/namespaces/1 \
         && echo /dev/$D > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable \
         && mkdir $P && echo rdma > $P/addr_trtype && echo ipv4 > $P/addr_adrfam \
         && echo $ADDR > $P/addr_traddr && echo {NVMET_PORT} > $P/addr_trsvcid \
         && ln -s $S $P/subsystems/$NQN && NVMET=1\n\
         \x20 [ $NVMET = 1 ] && echo \"nvmet-rdma: $ADDR:{NVMET_PORT} $NQN, namespace 1 on /dev/$D\" \
         || echo 'FAILED: nvmet-rdma configuration'\n\
         fi\n\
         echo \"for usnvme serve (vfio-pci): $(first \"$VDEVS\" 1)\"\n\
         counters() {{ for f in {ib}/hw_counters/*; do echo \"${{f##*/}} $(cat $f)\"; done; }}\n\
         [ $RXE = 1 ] && counters > $OUT/rxe-before.txt\n"
    )
}

/// The tag of a block's `usnvme serve` (its log: `$OUT/{tag}.log`).
fn serve_tag(round: u32) -> String {
    format!("r{round}-serve")
}

/// Shell lines that make `target` serve (`$READY` = 1 once it does): nvmet-rdma is up from the
/// start; `usnvme serve` starts on the drive bound to vfio-pci, listening over RDMA.
fn start(target: Target, round: u32) -> String {
    match target {
        Target::Kernel => "READY=$NVMET\n".into(),
        Target::Usnvme => format!(
            "READY=0\n\
             if [ $RXE = 1 ]; then\n{}fi\n",
            fabric::start_serve(
                1,
                &format!("rdma:$ADDR:{SERVE_PORT}"),
                SERVE_NQN,
                &serve_tag(round),
                &format!("$NVME discover -t rdma -a $ADDR -s {SERVE_PORT} --hostnqn $HOSTNQN"),
            )
        ),
    }
}

fn stop(target: Target, round: u32) -> String {
    match target {
        Target::Kernel => String::new(),
        Target::Usnvme => format!(
            "[ -n \"$SERVE\" ] && {{\n{}}}\nSERVE=\n",
            fabric::stop_target(Target::Usnvme, &serve_tag(round))
        ),
    }
}

/// Shell lines that make `initiator` ready for `target`, leaving what it runs on in `$DEVS`
/// (empty when that failed), and `$FILES` for fio.
fn attach(target: Target, initiator: Initiator) -> String {
    let (port, nqn) = (port(target), nqn(target));
    match initiator {
        Initiator::KernelFio => format!(
            "DEVS=\n\
             timeout 60 $NVME connect -t rdma -a $ADDR -s {port} -n {nqn} --hostnqn $HOSTNQN \
             && wait_devs {nqn} 1 && DEVS=$(fabric_devs {nqn} | head -n 1) \
             || echo 'FAILED: nvme connect -t rdma to {nqn}'\n\
             FILES=$(echo $DEVS | tr ' ' :)\n\
             echo \"devices: $FILES\"\n"
        ),
        // usnvme perf connects in each run
        _ => format!("DEVS=rdma://$ADDR:{port}/{nqn}\n"),
    }
}

fn detach(target: Target, initiator: Initiator) -> String {
    match initiator {
        Initiator::KernelFio => format!("$NVME disconnect -n {}\n", nqn(target)),
        _ => String::new(),
    }
}

/// The guest script: soft-RoCE and nvmet-rdma up, then per block of runs of one target and
/// initiator: the target started (`usnvme serve`), the initiator attached (the kernel's host
/// connects), each run between two snapshots, all undone; at the end nvmet-rdma torn down,
/// rxe's counters and the kernel's log kept.
fn script(cases: &[Case], usnvme: &str, out: &str, seconds: u32) -> String {
    let limit = seconds * 3 + 30;
    let mut s = fabric::prelude(usnvme, "''", out);
    s += &setup();
    s += "SERVE=\n";
    let mut i = 0;
    while i < cases.len() {
        let block = cases[i];
        let end = i + cases[i..]
            .iter()
            .take_while(|c| {
                c.round == block.round && c.target == block.target && c.initiator == block.initiator
            })
            .count();
        s += &format!(
            "\necho '== round {}: {} against {}'\n",
            block.round,
            label(block.initiator),
            target_label(block.target)
        );
        s += &start(block.target, block.round);
        s += "if [ $READY = 1 ]; then\n";
        s += &attach(block.target, block.initiator);
        for c in &cases[i..end] {
            let stem = format!("$OUT/{}", c.stem());
            s += &format!(
                "echo '{}: {} against {}, qd {}'\n\
                 [ -n \"$DEVS\" ] && {} || {{ echo FAILED; rm -f {stem}.json; \
                 tail -n 20 {stem}.log 2>/dev/null; }}\n",
                c.stem(),
                label(c.initiator),
                target_label(c.target),
                c.qd,
                c.initiator.command(&c.fabric(), seconds, &stem, limit),
            );
        }
        s += &detach(block.target, block.initiator);
        s += "else\n";
        for c in &cases[i..end] {
            s += &format!(
                "echo '{}: FAILED (not run: {} does not serve)'\n",
                c.stem(),
                target_label(c.target)
            );
        }
        s += "fi\n";
        s += &stop(block.target, block.round);
        i = end;
    }
    s += "\n[ -f $OUT/rxe-before.txt ] && counters > $OUT/rxe-after.txt\n\
          rm -f $P/subsystems/$NQN; rmdir $P\n\
          [ -d $S/namespaces/1 ] && { echo 0 > $S/namespaces/1/enable; rmdir $S/namespaces/1; }\n\
          rmdir $S\n\
          dmesg > $OUT/dmesg.txt; grep -iE 'rdma|rxe|nvme' $OUT/dmesg.txt | tail -n 40\n";
    s
}

#[derive(Debug, Clone)]
pub struct Run {
    pub case: Case,
    /// None when the run failed or wrote nothing usable.
    pub figures: Option<Figures>,
    pub window: Option<Window>,
}

/// Everything the boot measured.
#[derive(Debug)]
pub struct RdmaResults {
    pub runs: Vec<Run>,
    pub seconds: u32,
    /// The guest's exit status (124: vm-run's time limit ended it).
    pub exit_code: u8,
    pub script: String,
    /// rxe's port counters that changed over the boot's runs (name, increase).
    pub counters: Vec<(String, u64)>,
    /// The kernel's log lines of rdma, rxe and nvme.
    pub dmesg: Vec<String>,
    /// `usnvme serve`'s output, per block (tag, text).
    pub serve_logs: Vec<(String, String)>,
    /// The host's /proc/loadavg before and after the boot (it shares its cores).
    pub host_load: (String, String),
    /// Whether QEMU ran under KVM (else TCG).
    pub kvm: bool,
}

/// `name value` lines (rxe's hw_counters, as the script writes them).
fn parse_counters(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The counters that grew from `before` to `after`, by how much.
fn counter_increase(before: &str, after: &str) -> Vec<(String, u64)> {
    let before = parse_counters(before);
    parse_counters(after)
        .into_iter()
        .filter_map(|(name, a)| {
            let b = before
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, v)| *v);
            (a > b).then(|| (name, a - b))
        })
        .collect()
}

/// The kernel log's lines about rdma, rxe and nvme.
fn dmesg_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            ["rdma", "rxe", "nvme"].iter().any(|w| l.contains(w))
        })
        .map(str::to_string)
        .collect()
}

/// Boots the guest once (two drives: the first on the kernel's nvme driver for nvmet-rdma, the
/// second on vfio-pci for `usnvme serve`) and runs every case.
pub fn same_boot(usnvme: &Path, quick: bool, seconds: u32) -> Result<RdmaResults> {
    let out = crate::vm::vm_dir().join("work/bench-fabric-rdma");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let cases = cases(quick);
    let body = script(
        &cases,
        &sh_quote(&usnvme.display().to_string()),
        &out.display().to_string(),
        seconds,
    );
    std::fs::write(out.join("fabric-rdma.sh"), &body)?;
    let mut args = super::bench_boot(vec![
        "/bin/sh".into(),
        out.join("fabric-rdma.sh").display().to_string(),
    ]);
    args.drives = 2;
    args.kernel_nvme = Some("1".into());
    let serve_blocks = serve_tags(&cases).len() as u64;
    // each of serve's blocks: its start (up to a minute) and stop (up to 30 s)
    args.timeout = 300 + cases.len() as u64 * (u64::from(seconds) * 3 + 60) + serve_blocks * 120;
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    let load_before = load();
    // Whatever finished counts, also when the guest did not end cleanly.
    let exit_code = run::run(&args)?;
    let host_load = (load_before, load());
    let read = |name: String| std::fs::read_to_string(out.join(name)).ok();
    let runs = cases
        .iter()
        .map(|&case| {
            let stem = case.stem();
            let json = read(format!("{stem}.json"));
            let figures = match case.initiator {
                Initiator::UsnvmePerf => json.and_then(|j| parse_perf(&j)),
                _ => json.and_then(|j| parse_fio(&j)),
            };
            let snap = |ext| read(format!("{stem}.{ext}")).and_then(|t| parse_snapshot(&t));
            let window = match (snap("before"), snap("after")) {
                (Some(b), Some(a)) => window(&b, &a),
                _ => None,
            };
            Run {
                case,
                figures,
                window,
            }
        })
        .collect();
    let counters = match (read("rxe-before.txt".into()), read("rxe-after.txt".into())) {
        (Some(b), Some(a)) => counter_increase(&b, &a),
        _ => Vec::new(),
    };
    let serve_logs = serve_tags(&cases)
        .into_iter()
        .filter_map(|tag| Some((tag.clone(), read(format!("{tag}.log"))?)))
        .collect();
    Ok(RdmaResults {
        runs,
        seconds,
        exit_code,
        script: body,
        counters,
        dmesg: read("dmesg.txt".into())
            .map(|t| dmesg_lines(&t))
            .unwrap_or_default(),
        serve_logs,
        host_load,
        kvm: crate::vm::qemu::kvm_usable(),
    })
}

/// The tags of `usnvme serve`'s blocks, in order.
fn serve_tags(cases: &[Case]) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    for c in cases.iter().filter(|c| c.target == Target::Usnvme) {
        let tag = serve_tag(c.round);
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    tags
}

/// One side of a comparison: a target with an initiator in front.
type Side = (Target, Initiator);

/// `ours` ÷ `theirs` at `qd`, round by round: (round, IOPS ratio, our mean latency, theirs).
fn per_round(r: &RdmaResults, qd: u32, ours: Side, theirs: Side) -> Vec<(u32, f64, f64, f64)> {
    let get = |round, (target, initiator): Side| {
        r.runs
            .iter()
            .find(|x| {
                x.case.round == round
                    && x.case.qd == qd
                    && x.case.target == target
                    && x.case.initiator == initiator
            })
            .and_then(|x| x.figures)
    };
    let mut rounds: Vec<u32> = r.runs.iter().map(|x| x.case.round).collect();
    rounds.dedup();
    rounds
        .into_iter()
        .filter_map(|round| {
            let (o, t) = (get(round, ours)?, get(round, theirs)?);
            (t.iops > 0.0).then(|| (round, o.iops / t.iops, o.lat_us, t.lat_us))
        })
        .collect()
}

/// The comparisons of the section: (what is compared, ours, theirs). The kernel's host in front
/// of nvmet-rdma is the reference of both.
const COMPARISONS: [(&str, Side, Side); 2] = [
    (
        "hosts, against kernel nvmet-rdma",
        (Target::Kernel, Initiator::UsnvmePerf),
        (Target::Kernel, Initiator::KernelFio),
    ),
    (
        "targets, Linux nvme-rdma + fio io_uring in front of both",
        (Target::Usnvme, Initiator::KernelFio),
        (Target::Kernel, Initiator::KernelFio),
    ),
];

/// A side's name in a comparison: the initiator for the hosts', the target for the targets'.
fn side_label(ours: Side, theirs: Side, side: Side) -> &'static str {
    if ours.0 == theirs.0 {
        label(side.1)
    } else {
        target_label(side.0)
    }
}

/// MiB/s of 4 KiB I/Os at `iops`.
fn mib_s(iops: f64) -> f64 {
    iops * 4096.0 / f64::from(1u32 << 20)
}

/// The section's heading.
pub const HEADING: &str = "Fabric over RDMA: usnvme perf against the kernel's nvme-rdma host, usnvme serve against nvmet-rdma (one boot, soft-RoCE; functional figures)";

/// The section: the measured run's own command, date and machine first (it may be run alone and
/// its section kept beside others), then a row per run and the ratios per comparison and QD.
pub fn section(
    m: &mut String,
    results: Option<&RdmaResults>,
    why_not: &str,
    companions: &Companions,
    h: &Headlines,
    p: &Provenance,
) -> Result<()> {
    let Some(r) = open_section(m, HEADING, results, why_not)? else {
        return Ok(());
    };
    let script = companions.file("fabric-rdma.sh", &r.script)?;
    let rounds = r.runs.iter().map(|x| x.case.round).max().unwrap_or(0);
    writeln!(
        m,
        "**Functional figures, not RDMA ones:** soft-RoCE (`rdma_rxe`, RDMA in the guest kernel's \
         software, on a `dummy` netdev, looped back inside the guest) in a QEMU guest under {}, \
         2 vCPUs, on a host shared with other work. They show that `usnvme perf` and `usnvme \
         serve` run NVMe/RDMA end to end and how each compares with the kernel's host and target \
         *in this boot*; they say nothing about the speed of any of them on RDMA hardware, where \
         the NIC does the transport's work that rxe does here on the guest's CPUs.\n\n\
         Measured by {} on {}: machine {}, commit {}; host load average (1, 5, 15 min) before \
         the boot {}, after {}.\n",
        if r.kvm {
            "KVM"
        } else {
            "TCG emulation (no KVM)"
        },
        h.rerun(Section::FabricRdma),
        p.date,
        p.machine,
        p.commit,
        r.host_load.0,
        r.host_load.1,
    )?;
    writeln!(
        m,
        "One boot, two emulated null-backed drives, on `{DEVICE}` (on `{NETDEV}`, \
         {ADDRESS}). Targets: the kernel's nvmet-rdma (configfs), namespace 1 on the block \
         device of the drive left on the kernel's nvme driver, on port {NVMET_PORT}, up for the \
         whole boot; and `usnvme serve --listen rdma:{ADDRESS}:{SERVE_PORT} -c {TARGET_CPU}` on \
         the drive bound to vfio-pci (one reactor polling CPU {TARGET_CPU}), started for its \
         block of runs and stopped after it. Initiators: `usnvme perf -r \
         rdma://{ADDRESS}:{NVMET_PORT}/NQN -c {INITIATOR_CPU}` (one reactor polling CPU \
         {INITIATOR_CPU}, one I/O queue pair), and the kernel's nvme-rdma host (`nvme connect -t \
         rdma`) with fio and io_uring (`--direct=1`, one job pinned to CPU {INITIATOR_CPU}) on \
         the block device it creates. Two comparisons: the hosts (perf against the kernel's host, \
         both in front of nvmet-rdma), and the targets (serve against nvmet-rdma, the kernel's \
         host and fio in front of both). 4 KiB random reads, {} s per run after 1 s of ramp-up, \
         {rounds} round(s): odd rounds run perf against nvmet-rdma, then the kernel's host \
         against nvmet-rdma, then against serve; even rounds the other way round. Mean latency \
         is submission to completion (fio's `lat`; perf's the same). Guest CPU busy is each \
         vCPU's share of the run's window (ramp-up included, from /proc/stat): the transport's \
         work (rxe, nvmet-rdma, the nvme-rdma host) is the guest kernel's, on the same two vCPUs \
         as the initiator; serve's reactor polls CPU {TARGET_CPU} whole, so its share of turns \
         that did work (from its `--json-status`) is shown beside.\n",
        r.seconds
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
        "| round | QD | target | initiator | IOPS | MiB/s | mean latency (µs) | guest CPU busy (cpu0 / cpu1) |\n\
         |---:|---:|---|---|---:|---:|---:|---|"
    )?;
    for run in &r.runs {
        let c = run.case;
        let busy = run.window.as_ref().map_or("–".into(), |w| {
            let cpus = w
                .per_cpu_pct
                .iter()
                .map(|p| format!("{p:.0} %"))
                .collect::<Vec<_>>()
                .join(" / ");
            match w.serve_busy_cores {
                Some(b) => format!("{cpus} (serve's reactor busy {:.0} %)", b * 100.0),
                None => cpus,
            }
        });
        let head = format!(
            "| {} | {} | {} | {} |",
            c.round,
            c.qd,
            target_label(c.target),
            label(c.initiator)
        );
        match run.figures {
            Some(f) => writeln!(
                m,
                "{head} {:.2} k | {:.1} | {:.1} | {busy} |",
                f.iops / 1e3,
                mib_s(f.iops),
                f.lat_us
            )?,
            None => writeln!(m, "{head} failed | | | |")?,
        }
    }
    writeln!(m)?;
    let mut qds: Vec<u32> = Vec::new();
    for run in &r.runs {
        if !qds.contains(&run.case.qd) {
            qds.push(run.case.qd);
        }
    }
    for (what, ours, theirs) in COMPARISONS {
        let (a, b) = (
            side_label(ours, theirs, ours),
            side_label(ours, theirs, theirs),
        );
        for &qd in &qds {
            let rounds = per_round(r, qd, ours, theirs);
            let each = |f: fn(&(u32, f64, f64, f64)) -> String| {
                rounds.iter().map(f).collect::<Vec<_>>().join(", ")
            };
            match (
                median(rounds.iter().map(|x| x.1).collect()),
                median(rounds.iter().map(|x| x.2).collect()),
                median(rounds.iter().map(|x| x.3).collect()),
            ) {
                (Some(ratio), Some(ours), Some(theirs)) => writeln!(
                    m,
                    "- **QD {qd}, {what}: {a} ÷ {b}: {ratio:.2} × the IOPS; mean latency \
                     {ours:.1} µs against {theirs:.1} µs** (medians of the rounds; each round's \
                     ratio: {}; latencies: {}).",
                    each(|x| format!("{:.2}", x.1)),
                    each(|x| format!("{:.1} vs {:.1}", x.2, x.3)),
                )?,
                _ => writeln!(
                    m,
                    "- QD {qd}, {what}: {a} ÷ {b}: not measured (a run failed)."
                )?,
            }
        }
    }
    if r.counters.is_empty() {
        writeln!(m, "\nrxe's port counters: not read.")?;
    } else {
        writeln!(
            m,
            "\nrxe's port counters that grew over the runs (`{DEVICE}` port 1 `hw_counters`): {}.",
            r.counters
                .iter()
                .map(|(n, v)| format!("{n} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    let dmesg = companions.file("fabric-rdma-dmesg.txt", &(r.dmesg.join("\n") + "\n"))?;
    writeln!(
        m,
        "\nThe guest script (run by `cargo xtask bench` through `cargo xtask vm-run --drives 2 \
         --kernel-nvme 1`): {script}. The guest kernel's lines about rdma, rxe and nvme: {dmesg}."
    )?;
    fabric::serve_logs(m, companions, "fabric-rdma-serve", &r.serve_logs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_run_is_each_block_at_qd_32_and_the_full_run_alternates() {
        use Initiator::{KernelFio as F, UsnvmePerf as P};
        use Target::{Kernel as K, Usnvme as U};
        let pick = |cases: Vec<Case>| {
            cases
                .iter()
                .map(|c| (c.round, c.target, c.initiator, c.qd))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pick(cases(true)),
            [(1, K, P, 32), (1, K, F, 32), (1, U, F, 32)]
        );
        assert_eq!(
            pick(cases(false)),
            [
                (1, K, P, 32),
                (1, K, P, 1),
                (1, K, F, 32),
                (1, K, F, 1),
                (1, U, F, 32),
                (1, U, F, 1),
                (2, U, F, 32),
                (2, U, F, 1),
                (2, K, F, 32),
                (2, K, F, 1),
                (2, K, P, 32),
                (2, K, P, 1),
            ]
        );
        assert_eq!(cases(false)[1].stem(), "r1-nvmet-perf-qd1");
        assert_eq!(cases(false)[4].stem(), "r1-serve-kfio-qd32");
        assert_eq!(serve_tags(&cases(false)), ["r1-serve", "r2-serve"]);
    }

    #[test]
    fn the_script_brings_up_rxe_and_nvmet_rdma_and_runs_both_initiators_over_rdma() {
        let s = script(&cases(true), "/u", "/o", 5);
        assert!(s.contains("USNVME=/u\nSPDK=''\nOUT=/o\n"), "{s}");
        for line in [
            "[ -d /sys/class/infiniband/rxe0 ] || $RDMA link add rxe0 type rxe netdev dummy0",
            "grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && cat \
             /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | grep -q ':ffff:a9fe:4d01$' \
             && { RXE=1; break; }",
            "  D=$(first \"$KDEVS\" 1)\n",
            "echo /dev/$D > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable",
            "echo rdma > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo $ADDR > \
             $P/addr_traddr && echo 4420 > $P/addr_trsvcid && ln -s $S $P/subsystems/$NQN \
             && NVMET=1\n",
            "ADDR=169.254.77.1\nNQN=nqn.2014-08.org.usnvme:bench-rdma\n",
            // usnvme perf over RDMA to nvmet-rdma, polling CPU 0, between two snapshots
            "READY=$NVMET\nif [ $READY = 1 ]; then\n\
             DEVS=rdma://$ADDR:4420/nqn.2014-08.org.usnvme:bench-rdma\n\
             echo 'r1-nvmet-perf-qd32: usnvme perf against kernel nvmet-rdma, qd 32'\n\
             [ -n \"$DEVS\" ] && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-perf-qd32.before '' \
             && timeout -s INT 45 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k \
             -w randread -t 5 -a 1 --json $OUT/r1-nvmet-perf-qd32.json > \
             $OUT/r1-nvmet-perf-qd32.log 2>&1 && /bin/sh $OUT/snap.sh \
             $OUT/r1-nvmet-perf-qd32.after '' || { echo FAILED; \
             rm -f $OUT/r1-nvmet-perf-qd32.json; tail -n 20 $OUT/r1-nvmet-perf-qd32.log \
             2>/dev/null; }\n\
             else\necho 'r1-nvmet-perf-qd32: FAILED (not run: kernel nvmet-rdma does not serve)'\nfi\n",
            // the kernel's host over RDMA to nvmet-rdma, fio on its block device, on CPU 0
            "timeout 60 $NVME connect -t rdma -a $ADDR -s 4420 -n \
             nqn.2014-08.org.usnvme:bench-rdma --hostnqn $HOSTNQN && wait_devs \
             nqn.2014-08.org.usnvme:bench-rdma 1 && DEVS=$(fabric_devs \
             nqn.2014-08.org.usnvme:bench-rdma | head -n 1)",
            "timeout -s INT 45 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread \
             --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=5 \
             --ramp_time=1 --output-format=json --output=$OUT/r1-nvmet-kfio-qd32.json \
             --filename=$FILES",
            "$NVME disconnect -n nqn.2014-08.org.usnvme:bench-rdma\nelse\n",
            // usnvme serve over RDMA on the vfio-pci drive, one reactor on CPU 1
            "READY=0\nif [ $RXE = 1 ]; then\nREADY=0\n: > $OUT/r1-serve.log\n",
            "$USNVME serve $(first \"$VDEVS\" 1 | sed 's/^/-r /') -c 1 --listen \
             rdma:$ADDR:4430 --nqn nqn.2014-08.org.usnvme:bench-rdma-serve --allow-any-host \
             --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 > \
             $OUT/r1-serve.log 2>&1 &\nSERVE=$!\n",
            "[ $READY = 1 ] && $NVME discover -t rdma -a $ADDR -s 4430 --hostnqn $HOSTNQN | \
             grep -q nqn.2014-08.org.usnvme:bench-rdma-serve || { READY=0; echo 'FAILED: usnvme \
             serve does not serve'; }\nfi\n",
            // the kernel's host and fio in front of it
            "timeout 60 $NVME connect -t rdma -a $ADDR -s 4430 -n \
             nqn.2014-08.org.usnvme:bench-rdma-serve --hostnqn $HOSTNQN",
            "--output=$OUT/r1-serve-kfio-qd32.json --filename=$FILES",
            "$NVME disconnect -n nqn.2014-08.org.usnvme:bench-rdma-serve\nelse\n",
            "[ -n \"$SERVE\" ] && {\nkill -TERM $SERVE 2>/dev/null\n",
            "wait $SERVE; echo \"usnvme serve exited $?\" | tee -a $OUT/r1-serve.log\n\
             rm -f /tmp/usnvme-serve-status.json\n}\nSERVE=\n",
            "counters > $OUT/rxe-after.txt\nrm -f $P/subsystems/$NQN; rmdir $P\n",
            "dmesg > $OUT/dmesg.txt",
        ] {
            assert!(s.contains(line), "{line}\n---\n{s}");
        }
        // round 1: perf, then the kernel's host against nvmet-rdma, then against serve; nothing
        // speaks TCP
        let perf = s.find("$USNVME perf").unwrap();
        let nvmet = s.find("$NVME connect -t rdma -a $ADDR -s 4420").unwrap();
        let serve = s.find("$USNVME serve").unwrap();
        let fio_serve = s.find("$NVME connect -t rdma -a $ADDR -s 4430").unwrap();
        assert!(perf < nvmet && nvmet < serve && serve < fio_serve, "{s}");
        assert!(!s.contains("-t tcp"), "{s}");
        assert!(!s.contains("127.0.0.1"), "{s}");
    }

    #[test]
    fn reads_rxes_counters_and_the_kernels_rdma_lines() {
        let before = "sent_pkts 10\nrcvd_pkts 10\nretry_exceeded_err 0\nbogus\n";
        let after = "sent_pkts 110\nrcvd_pkts 90\nretry_exceeded_err 0\nrnr_nak_retry_err 2\n";
        assert_eq!(
            counter_increase(before, after),
            [
                ("sent_pkts".to_string(), 100),
                ("rcvd_pkts".to_string(), 80),
                ("rnr_nak_retry_err".to_string(), 2),
            ]
        );
        assert_eq!(
            dmesg_lines("[1.0] rdma_rxe: loaded\n[2.0] usb 1\n[3.0] nvme nvme1: new ctrl\n"),
            ["[1.0] rdma_rxe: loaded", "[3.0] nvme nvme1: new ctrl"]
        );
    }

    fn figures(iops: f64, lat_us: f64) -> Option<Figures> {
        Some(Figures {
            iops,
            lat_us,
            clat_us: lat_us,
            ios: 1,
            cpu_cores: None,
        })
    }

    #[test]
    fn the_section_is_marked_functional_and_gives_both_comparisons_per_qd() {
        let run = |round, target, initiator, qd, f| Run {
            case: Case {
                round,
                target,
                initiator,
                qd,
            },
            figures: f,
            window: Some(Window {
                wall_s: 6.0,
                busy_s: 12.0,
                per_cpu_pct: vec![100.0, 50.0],
                ios: 0,
                serve_busy_cores: (target == Target::Usnvme).then_some(0.25),
            }),
        };
        use Initiator::{KernelFio as F, UsnvmePerf as P};
        use Target::{Kernel as K, Usnvme as U};
        let r = RdmaResults {
            runs: vec![
                run(1, K, P, 32, figures(30_000.0, 1000.0)),
                run(1, K, P, 1, figures(2_000.0, 480.0)),
                run(1, K, F, 32, figures(10_000.0, 3200.0)),
                run(1, K, F, 1, None),
                run(1, U, F, 32, figures(15_000.0, 2100.0)),
                run(1, U, F, 1, figures(2_500.0, 400.0)),
                run(2, U, F, 32, figures(12_000.0, 2600.0)),
                run(2, K, F, 32, figures(10_000.0, 3000.0)),
                run(2, K, P, 32, figures(20_000.0, 1500.0)),
            ],
            seconds: 5,
            exit_code: 0,
            script: "echo rdma\n".into(),
            counters: vec![("sent_pkts".into(), 100)],
            dmesg: vec!["rdma_rxe: loaded".into()],
            serve_logs: vec![("r1-serve".into(), "hosts: any\n".into())],
            host_load: ("1.0 1.0 1.0".into(), "2.0 2.0 2.0".into()),
            kvm: false,
        };
        let p = Provenance {
            date: "D".into(),
            machine: "M".into(),
            commit: "C".into(),
        };
        let (companions, h) = (Companions::for_test("rdma"), Headlines::new(String::new()));
        let mut m = String::new();
        section(&mut m, Some(&r), "", &companions, &h, &p).unwrap();
        assert!(m.starts_with(&format!(
            "\n## {HEADING}\n\n**Functional figures, not RDMA ones:**"
        )));
        assert!(m.contains("under TCG emulation (no KVM), 2 vCPUs,"), "{m}");
        assert!(
            m.contains(
                "Measured by `cargo xtask bench --only fabric-rdma` on D: machine M, commit C;"
            ),
            "{m}"
        );
        for line in [
            "| 1 | 32 | kernel nvmet-rdma | usnvme perf | 30.00 k | 117.2 | 1000.0 | 100 % / 50 % |\n",
            "| 1 | 1 | kernel nvmet-rdma | Linux nvme-rdma + fio io_uring | failed | | | |\n",
            "| 1 | 32 | usnvme serve (RDMA) | Linux nvme-rdma + fio io_uring | 15.00 k | 58.6 | \
             2100.0 | 100 % / 50 % (serve's reactor busy 25 %) |\n",
            "- **QD 32, hosts, against kernel nvmet-rdma: usnvme perf ÷ Linux nvme-rdma + fio \
             io_uring: 2.50 × the IOPS; mean latency 1250.0 µs against 3100.0 µs** (medians of \
             the rounds; each round's ratio: 3.00, 2.00; latencies: 1000.0 vs 3200.0, 1500.0 vs \
             3000.0).\n",
            "- QD 1, hosts, against kernel nvmet-rdma: usnvme perf ÷ Linux nvme-rdma + fio \
             io_uring: not measured (a run failed).\n",
            "- **QD 32, targets, Linux nvme-rdma + fio io_uring in front of both: usnvme serve \
             (RDMA) ÷ kernel nvmet-rdma: 1.35 × the IOPS; mean latency 2350.0 µs against 3100.0 \
             µs** (medians of the rounds; each round's ratio: 1.50, 1.20; latencies: 2100.0 vs \
             3200.0, 2600.0 vs 3000.0).\n",
            "- QD 1, targets, Linux nvme-rdma + fio io_uring in front of both: usnvme serve \
             (RDMA) ÷ kernel nvmet-rdma: not measured (a run failed).\n",
            "counters that grew over the runs (`rxe0` port 1 `hw_counters`): sent_pkts 100.\n",
            "[benchmarks/fabric-rdma.sh](benchmarks/fabric-rdma.sh)",
            "[benchmarks/fabric-rdma-dmesg.txt](benchmarks/fabric-rdma-dmesg.txt)",
            "What `usnvme serve` printed, per block of runs: \
             [benchmarks/fabric-rdma-serve-r1-serve.log](benchmarks/fabric-rdma-serve-r1-serve.log).\n",
        ] {
            assert!(m.contains(line), "{line}\n---\n{m}");
        }
        assert_eq!(companions.read("fabric-rdma.sh"), "echo rdma\n");
        assert_eq!(
            companions.read("fabric-rdma-dmesg.txt"),
            "rdma_rxe: loaded\n"
        );
        assert_eq!(
            companions.read("fabric-rdma-serve-r1-serve.log"),
            "hosts: any\n"
        );
        let mut none = String::new();
        section(&mut none, None, "`--only`", &companions, &h, &p).unwrap();
        assert_eq!(none, format!("\n## {HEADING}\n\nNot run (`--only`).\n"));
        companions.remove();
    }
}
