//! The fabric section: in one boot, the same initiator against two NVMe/TCP targets on loopback:
//! `usnvme serve` on drives bound to vfio-pci, and the kernel's own target (nvmet-tcp,
//! configured through configfs) on drives left on the kernel's nvme driver. The initiator is
//! the guest kernel's nvme-tcp host driver (`nvme connect`) with fio and io_uring on top, and
//! `usnvme perf -r tcp://…` (and `spdk_nvme_perf -r 'trtype:TCP …'` when given), each polling
//! one core: the [`Initiator`]s.
//!
//! Besides fio's IOPS and latency, each run samples /proc/stat (every CPU of the guest) and the
//! block devices' read counters before and after, so the CPU the kernel target used can be
//! estimated (see [`kernel_target_cores`]): `usnvme serve` polls, its cores are its reactors.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::spdk::median;
use super::{open_section, times, Companions, Headlines, Section};
use crate::cmd::sh_quote;
use crate::vm::run;

const NVME: &str = "/usr/sbin/nvme";
const FIO: &str = "/usr/bin/fio";
/// The host NQN the kernel initiator connects with (both targets admit any host).
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-62656e636866";
/// The guest CPU the initiator (fio) runs on, and the one `usnvme serve`'s reactor gets.
pub(crate) const INITIATOR_CPU: u32 = 0;
pub(crate) const TARGET_CPU: u32 = 1;
/// `usnvme serve -c 1`: one reactor, which polls its core whole.
const SERVE_REACTORS: u32 = 1;
/// Where `usnvme serve` keeps its `--json-status` (reactor time and busy time), every 0.1 s:
/// the guest's own tmpfs, not the work share (a 9p write costs the guest's CPUs).
const SERVE_STATUS: &str = "/tmp/usnvme-serve-status.json";
/// Below this, an estimate of the kernel target's cores is shown but not used: the initiator's
/// cost measured against serve then overstates its cost against the kernel.
const MIN_CORES: f64 = 0.1;

/// An NVMe/TCP target in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `usnvme serve` on drives bound to vfio-pci.
    Usnvme,
    /// The kernel's nvmet-tcp, with the block devices of drives on the kernel's nvme driver.
    Kernel,
}

impl Target {
    pub const ALL: [Target; 2] = [Target::Usnvme, Target::Kernel];

    pub(crate) fn key(self) -> &'static str {
        match self {
            Target::Usnvme => "serve",
            Target::Kernel => "nvmet",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Target::Usnvme => "usnvme serve",
            Target::Kernel => "kernel nvmet-tcp",
        }
    }

    fn port(self) -> u16 {
        match self {
            Target::Usnvme => 4420,
            Target::Kernel => 4421,
        }
    }

    fn nqn(self) -> &'static str {
        match self {
            Target::Usnvme => "nqn.2014-08.org.usnvme:bench",
            Target::Kernel => "nqn.2014-08.org.usnvme:bench-nvmet",
        }
    }
}

/// What drives I/O against a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initiator {
    /// The guest kernel's nvme-tcp host (`nvme connect`), fio with io_uring on its block
    /// devices.
    KernelFio,
    /// `usnvme perf -r tcp://…`: one reactor polling the initiator's CPU.
    UsnvmePerf,
    /// `spdk_nvme_perf -r 'trtype:TCP …'` (with `--spdk`): one core, polling.
    Spdk,
}

impl Initiator {
    /// The initiators of a boot: SPDK's only when its binary was given.
    pub fn all(spdk: bool) -> Vec<Initiator> {
        let mut all = vec![Initiator::KernelFio, Initiator::UsnvmePerf];
        if spdk {
            all.push(Initiator::Spdk);
        }
        all
    }

    pub(crate) fn key(self) -> &'static str {
        match self {
            Initiator::KernelFio => "kfio",
            Initiator::UsnvmePerf => "perf",
            Initiator::Spdk => "spdk",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Initiator::KernelFio => "Linux nvme-tcp + fio io_uring",
            Initiator::UsnvmePerf => "usnvme perf",
            Initiator::Spdk => "spdk_nvme_perf",
        }
    }

    /// Whether it polls its core (`-c`): the rest of the guest's busy time is the target's.
    fn polls(self) -> bool {
        match self {
            Initiator::KernelFio => false,
            Initiator::UsnvmePerf | Initiator::Spdk => true,
        }
    }

    /// Shell lines that make the initiator ready for `target`'s subsystem of `drives`
    /// namespaces, leaving what it runs on in `$DEVS` (empty when that failed).
    fn attach(self, target: Target, drives: u32) -> String {
        let (port, nqn) = (target.port(), target.nqn());
        match self {
            Initiator::KernelFio => format!(
                "DEVS=\n\
                 timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s {port} -n {nqn} --hostnqn $HOSTNQN \
                 && wait_devs {nqn} {drives} && DEVS=$(fabric_devs {nqn} | head -n {drives}) \
                 || echo 'FAILED: nvme connect to {nqn}'\n\
                 FILES=$(echo $DEVS | tr ' ' :)\n\
                 echo \"devices: $FILES\"\n"
            ),
            // the polled initiators connect in each run; the target serves `drives` namespaces
            Initiator::UsnvmePerf | Initiator::Spdk => {
                format!("DEVS=tcp://127.0.0.1:{port}/{nqn}\n")
            }
        }
    }

    fn detach(self, target: Target) -> String {
        match self {
            Initiator::KernelFio => format!("$NVME disconnect -n {}\n", target.nqn()),
            Initiator::UsnvmePerf | Initiator::Spdk => String::new(),
        }
    }

    /// The command of one run, writing its figures into `{stem}.json` (the polled initiators'
    /// output into `{stem}.log`) and its snapshots of /proc/stat into `{stem}.before` and
    /// `{stem}.after`. Everyone runs 4 KiB random reads, one second of ramp-up, QD per
    /// namespace.
    /// A run that does not finish within `limit` seconds is stopped like Ctrl-C.
    pub(crate) fn command(self, case: &Case, seconds: u32, stem: &str, limit: u32) -> String {
        let (port, nqn) = (case.target.port(), case.target.nqn());
        // the polled initiators' window holds their connection and exit too (under a second)
        let between = |run: String| {
            format!(
                "/bin/sh $OUT/snap.sh {stem}.before '' && timeout -s INT {limit} {run} \
                 > {stem}.log 2>&1 && /bin/sh $OUT/snap.sh {stem}.after ''"
            )
        };
        match self {
            Initiator::KernelFio => format!(
                "timeout -s INT {limit} $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k \
                 --iodepth={depth} --numjobs=1 --cpus_allowed={INITIATOR_CPU} --time_based \
                 --runtime={seconds} --ramp_time=1 --output-format=json --output={stem}.json \
                 --filename=$FILES \"--exec_prerun=/bin/sh $OUT/snap.sh {stem}.before $FILES\" \
                 \"--exec_postrun=/bin/sh $OUT/snap.sh {stem}.after $FILES\" > /dev/null",
                // QD per namespace, as everywhere in the benchmarks
                depth = case.qd * case.drives,
            ),
            Initiator::UsnvmePerf => between(format!(
                "$USNVME perf -r $DEVS --hostnqn $HOSTNQN -c {INITIATOR_CPU} -q {qd} -o 4k \
                 -w randread -t {seconds} -a 1 --json {stem}.json",
                qd = case.qd,
            )),
            Initiator::Spdk => between(format!(
                "$SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} \
                 hostnqn:'$HOSTNQN -c {mask:#x} -q {qd} -o 4096 -w randread -t {seconds} -a 1",
                mask = 1u32 << INITIATOR_CPU,
                qd = case.qd,
            )),
        }
    }
}

/// One run: an initiator against a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub round: u32,
    pub target: Target,
    pub initiator: Initiator,
    pub qd: u32,
    pub drives: u32,
}

impl Case {
    fn stem(&self) -> String {
        format!(
            "r{}-{}-{}-qd{}-d{}",
            self.round,
            self.target.key(),
            self.initiator.key(),
            self.qd,
            self.drives
        )
    }
}

/// The (drives, QDs per namespace) of the full run: one namespace at QD 32 and 1 (issue 15's
/// goals), and 12 at QD 8 each: 96 in flight, within the 128 entries of the one nvme-tcp I/O
/// queue fio's CPU submits to (at QD 32 each, the initiator's queue would cap it).
const FULL: [(u32, &[u32]); 2] = [(1, &[32, 1]), (12, &[8])];
const FULL_ROUNDS: u32 = 3;

/// The runs of one boot, in order: per round and drive count, each target (odd rounds `usnvme
/// serve` first, even rounds the kernel's), each initiator (SPDK's with `spdk`), each QD.
pub fn cases(quick: bool, spdk: bool) -> Vec<Case> {
    let (shapes, rounds): (&[(u32, &[u32])], u32) = if quick {
        (&[(1, &[32])], 1)
    } else {
        (&FULL, FULL_ROUNDS)
    };
    let mut out = Vec::new();
    for round in 1..=rounds {
        for &(d, qds) in shapes {
            let mut targets = Target::ALL;
            if round % 2 == 0 {
                targets.reverse();
            }
            for target in targets {
                for &initiator in &Initiator::all(spdk) {
                    for &qd in qds {
                        out.push(Case {
                            round,
                            target,
                            initiator,
                            qd,
                            drives: d,
                        });
                    }
                }
            }
        }
    }
    out
}

/// Shell functions and variables every block uses, and `snap.sh`, which fio runs right before
/// and after each job (`--exec_prerun`, `--exec_postrun`), so that a run's window holds its
/// ramp-up and measured time and not fio's start and exit.
const PRELUDE: &str = r#"# fabric benchmark, written by cargo xtask bench
NVME=@NVME@
FIO=@FIO@
USNVME=@USNVME@
SPDK=@SPDK@
OUT=@OUT@
HOSTNQN=@HOSTNQN@
CFS=/sys/kernel/config/nvmet
# fio's exec_prerun/postrun write their output into the working directory
cd $OUT
# before any fabric connection: the kernel's nvme block devices are the PCIe drives'
KDEVS=$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | sort -V)
VDEVS=$(ls /sys/bus/pci/drivers/vfio-pci | grep '^0000:' | sort)
first() { echo "$1" | head -n "$2"; }
# the kernel's block devices (heads) of subsystem $1, by NSID
fabric_devs() {
  for s in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat $s/subsysnqn 2>/dev/null)" = "$1" ] && ls $s | grep -E '^nvme[0-9]+n[0-9]+$' | sort -V | sed 's|^|/dev/|'
  done
}
wait_devs() { # NQN COUNT: until the kernel shows COUNT namespaces of NQN (30 s)
  i=0
  while [ $i -lt 60 ]; do
    [ $(fabric_devs "$1" | wc -l) -ge "$2" ] && return 0
    sleep 0.5; i=$((i + 1))
  done
  return 1
}
# spdk_nvme_perf wants a writable /var/tmp and /var/run/dpdk (the guest's root is read-only)
[ -n "$SPDK" ] && { mount -t tmpfs tmpfs /var/tmp; mkdir -p /var/run/dpdk; }
cat > $OUT/snap.sh <<'SNAP'
# snap.sh FILE DEV[:DEV...]: reads completed on the devices (their paths' counters, nvmeXcYnZ,
# under native multipath, else the head's), uptime, clock ticks per second, every CPU's
# /proc/stat line
n=0
for d in $(echo "$2" | tr : ' '); do
  b=${d#/dev/}; found=0
  for p in /sys/class/block/$(echo "$b" | sed 's/^\(nvme[0-9]*\)n/\1c*n/'); do
    [ -e "$p/stat" ] && { read r rest < "$p/stat"; n=$((n + r)); found=1; }
  done
  [ $found = 1 ] || { read r rest < /sys/block/$b/stat; n=$((n + r)); }
done
{ echo "ios $n"; echo "hz $(getconf CLK_TCK)"; echo "up $(cut -d' ' -f1 /proc/uptime)"; grep '^cpu' /proc/stat
  # usnvme serve's reactor time and the part of it in turns that did work, when it runs
  if [ -f @STATUS@ ]; then sed -n 's/^ *"reactor_seconds": \([0-9.e+-]*\),*$/serve_reactor \1/p; s/^ *"reactor_busy_seconds": \([0-9.e+-]*\),*$/serve_busy \1/p' @STATUS@; fi
} > "$1"
SNAP
grep -c ^processor /proc/cpuinfo | sed 's/^/guest CPUs: /'
"#;

pub(crate) fn prelude(usnvme: &str, spdk: &str, out: &str) -> String {
    PRELUDE
        .replace("@NVME@", NVME)
        .replace("@FIO@", FIO)
        .replace("@USNVME@", usnvme)
        .replace("@SPDK@", spdk)
        .replace("@OUT@", out)
        .replace("@HOSTNQN@", HOSTNQN)
        .replace("@STATUS@", SERVE_STATUS)
}

/// Shell lines that start `usnvme serve` on the first `drives` drives bound to vfio-pci, one
/// reactor on [`TARGET_CPU`], listening on `listen` (`ADDR:PORT`, or `rdma:ADDR:PORT`) for the
/// subsystem `nqn`, its output in `$OUT/{tag}.log` and its PID in `$SERVE`; `$READY` = 1 once it
/// prints that it listens. `discover` is the shell command whose output must name `nqn`
/// (`nvme discover` over the listener's transport).
pub(super) fn start_serve(
    drives: u32,
    listen: &str,
    nqn: &str,
    tag: &str,
    discover: &str,
) -> String {
    format!(
        "READY=0\n\
         : > $OUT/{tag}.log\n\
         rm -f {SERVE_STATUS}\n\
         $USNVME serve $(first \"$VDEVS\" {drives} | sed 's/^/-r /') -c {TARGET_CPU} \
         --listen {listen} --nqn {nqn} --allow-any-host \
         --json-status {SERVE_STATUS} --json-status-every 0.1 > $OUT/{tag}.log 2>&1 &\n\
         SERVE=$!\n\
         # it prints what it serves, then \"hosts: any\", once listening\n\
         i=0\n\
         while [ $i -lt 120 ] && kill -0 $SERVE 2>/dev/null; do\n\
         \x20 grep -q '^hosts:' $OUT/{tag}.log && {{ READY=1; break; }}\n\
         \x20 sleep 0.5; i=$((i + 1))\n\
         done\n\
         cat $OUT/{tag}.log\n\
         [ $READY = 1 ] && {discover} \
         | grep -q {nqn} || {{ READY=0; echo 'FAILED: usnvme serve does not serve'; }}\n"
    )
}

/// Shell lines that start `target` exporting `drives` drives (`$READY` = 1 once it serves).
fn start_target(target: Target, drives: u32, tag: &str) -> String {
    let nqn = target.nqn();
    let port = target.port();
    match target {
        Target::Usnvme => start_serve(
            drives,
            &format!("127.0.0.1:{port}"),
            nqn,
            tag,
            &format!("$NVME discover -t tcp -a 127.0.0.1 -s {port} --hostnqn $HOSTNQN"),
        ),
        Target::Kernel => format!(
            "READY=0\n\
             S=$CFS/subsystems/{nqn}\n\
             P=$CFS/ports/1\n\
             mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1\n\
             i=1\n\
             for d in $(first \"$KDEVS\" {drives}); do\n\
             \x20 mkdir $S/namespaces/$i && echo /dev/$d > $S/namespaces/$i/device_path \
             && echo 1 > $S/namespaces/$i/enable || READY=0\n\
             \x20 i=$((i + 1))\n\
             done\n\
             mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam \
             && echo 127.0.0.1 > $P/addr_traddr && echo {port} > $P/addr_trsvcid \
             && ln -s $S $P/subsystems/{nqn} || READY=0\n\
             for f in $S/namespaces/*/device_path; do echo \"$f: $(cat $f)\"; done\n\
             [ $READY = 1 ] || echo 'FAILED: nvmet configuration'\n"
        ),
    }
}

/// Shell lines that stop `target`: `usnvme serve` by SIGTERM (SIGKILL after 30 s), its exit
/// status appended to `$OUT/{tag}.log`; nvmet's configfs entries removed.
pub(super) fn stop_target(target: Target, tag: &str) -> String {
    let nqn = target.nqn();
    match target {
        Target::Usnvme => format!(
            "kill -TERM $SERVE 2>/dev/null\n\
             i=0\n\
             while [ $i -lt 30 ] && kill -0 $SERVE 2>/dev/null; do sleep 1; i=$((i + 1)); done\n\
             kill -0 $SERVE 2>/dev/null && {{ echo 'usnvme serve still runs 30 s after SIGTERM: SIGKILL'; kill -KILL $SERVE; }}\n\
             wait $SERVE; echo \"usnvme serve exited $?\" | tee -a $OUT/{tag}.log\n\
             rm -f {SERVE_STATUS}\n"
        ),
        Target::Kernel => format!(
            "rm -f $P/subsystems/{nqn}\n\
             rmdir $P\n\
             for n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done\n\
             rmdir $S\n"
        ),
    }
}

/// The guest script: per block of runs (round, drive count, target), the target up, each
/// initiator attached, each run between two snapshots, everything torn down again.
fn script(cases: &[Case], usnvme: &str, spdk: &str, out: &str, seconds: u32) -> String {
    let limit = seconds * 3 + 30;
    let mut s = prelude(usnvme, spdk, out);
    let mut i = 0;
    while i < cases.len() {
        let block = cases[i];
        let same = |c: &Case| {
            c.round == block.round && c.drives == block.drives && c.target == block.target
        };
        let end = i + cases[i..].iter().take_while(|c| same(c)).count();
        let tag = format!("r{}-{}-d{}", block.round, block.target.key(), block.drives);
        s += &format!(
            "\necho '== round {}: {}, {} drive(s)'\n",
            block.round,
            block.target.label(),
            block.drives
        );
        s += &start_target(block.target, block.drives, &tag);
        let mut j = i;
        while j < end {
            let initiator = cases[j].initiator;
            let k = j + cases[j..end]
                .iter()
                .take_while(|c| c.initiator == initiator)
                .count();
            s += "if [ $READY = 1 ]; then\n";
            s += &initiator.attach(block.target, block.drives);
            for c in &cases[j..k] {
                let stem = format!("$OUT/{}", c.stem());
                // a run that fails or does not finish in time (stopped like Ctrl-C) records
                // nothing, and the next one runs
                s += &format!(
                    "echo '{}: {} against {}, qd {}, {} drive(s)'\n\
                     [ -n \"$DEVS\" ] && {} || {{ echo FAILED; rm -f {stem}.json; }}\n",
                    c.stem(),
                    c.initiator.label(),
                    c.target.label(),
                    c.qd,
                    c.drives,
                    c.initiator.command(c, seconds, &stem, limit),
                );
            }
            s += &initiator.detach(block.target);
            s += "fi\n";
            j = k;
        }
        s += &stop_target(block.target, &tag);
        i = end;
    }
    s += "dmesg > $OUT/dmesg.txt; grep -iE 'nvme|tcp' $OUT/dmesg.txt | tail -n 40\n";
    s
}

/// One /proc/stat (and block counter) snapshot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    uptime: f64,
    hz: f64,
    ios: u64,
    /// (name, busy ticks, all ticks), the "cpu" line first, then cpu0, cpu1…
    cpus: Vec<(String, u64, u64)>,
    /// `usnvme serve`'s reactor seconds and busy seconds so far (its --json-status), if it ran.
    serve: Option<(f64, f64)>,
}

pub(crate) fn parse_snapshot(text: &str) -> Option<Snapshot> {
    let mut snap = Snapshot {
        uptime: f64::NAN,
        hz: 100.0,
        ios: 0,
        cpus: Vec::new(),
        serve: None,
    };
    let mut ios = None;
    let (mut reactor, mut busy) = (None, None);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("up") => snap.uptime = words.next()?.parse().ok()?,
            Some("hz") => snap.hz = words.next()?.parse().ok()?,
            Some("ios") => ios = Some(words.next()?.parse().ok()?),
            Some("serve_reactor") => reactor = words.next().and_then(|w| w.parse().ok()),
            Some("serve_busy") => busy = words.next().and_then(|w| w.parse().ok()),
            Some(name) if name.starts_with("cpu") => {
                // user nice system idle iowait irq softirq steal (guest time is in user)
                let v: Vec<u64> = words
                    .take(8)
                    .map(|w| w.parse().ok())
                    .collect::<Option<_>>()?;
                if v.len() < 8 {
                    return None;
                }
                let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
                snap.cpus.push((name.to_string(), busy, v.iter().sum()));
            }
            _ => {}
        }
    }
    snap.ios = ios?;
    snap.serve = reactor.zip(busy);
    (snap.uptime.is_finite() && !snap.cpus.is_empty()).then_some(snap)
}

/// What the guest spent between two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub wall_s: f64,
    /// CPU-seconds busy, all CPUs.
    pub busy_s: f64,
    /// Each CPU's busy share of the window, in % (cpu0, cpu1…).
    pub per_cpu_pct: Vec<f64>,
    /// Reads the initiator's block devices completed (ramp-up included).
    pub ios: u64,
    /// `usnvme serve`'s busy cores: its reactors' share of time in turns that did work, times
    /// the reactors (its status, read with each snapshot).
    pub serve_busy_cores: Option<f64>,
}

pub(crate) fn window(before: &Snapshot, after: &Snapshot) -> Option<Window> {
    let wall_s = after.uptime - before.uptime;
    if wall_s <= 0.0 || after.cpus.len() != before.cpus.len() {
        return None;
    }
    let ticks = |i: usize| {
        let (b, a) = (&before.cpus[i], &after.cpus[i]);
        (
            a.1.saturating_sub(b.1) as f64,
            a.2.saturating_sub(b.2) as f64,
        )
    };
    let busy_s = ticks(0).0 / after.hz;
    let per_cpu_pct = (1..after.cpus.len())
        .map(|i| {
            let (busy, all) = ticks(i);
            if all > 0.0 {
                100.0 * busy / all
            } else {
                0.0
            }
        })
        .collect();
    let serve_busy_cores = match (before.serve, after.serve) {
        (Some((r0, b0)), Some((r1, b1))) if r1 > r0 => {
            Some((b1 - b0) / (r1 - r0) * f64::from(SERVE_REACTORS))
        }
        _ => None,
    };
    Some(Window {
        wall_s,
        busy_s,
        per_cpu_pct,
        ios: after.ios.saturating_sub(before.ios),
        serve_busy_cores,
    })
}

/// What fio reported (latencies in microseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub iops: f64,
    /// Submission to completion.
    pub lat_us: f64,
    /// Completion latency (from when the kernel had the command).
    pub clat_us: f64,
    /// I/Os after the ramp.
    pub ios: u64,
    /// The cores the initiator's own threads used (usnvme perf's `usr_cpu` + `sys_cpu`).
    pub cpu_cores: Option<f64>,
}

pub(crate) fn parse_fio(json: &str) -> Option<Figures> {
    // fio may print warnings before its JSON
    let doc: serde_json::Value = serde_json::from_str(&json[json.find('{')?..]).ok()?;
    let jobs = doc["jobs"].as_array()?;
    let (mut iops, mut ios, mut lat, mut clat) = (0.0, 0u64, 0.0, 0.0);
    for j in jobs {
        let r = &j["read"];
        let n = r["total_ios"].as_u64()?;
        iops += r["iops"].as_f64()?;
        lat += r["lat_ns"]["mean"].as_f64()? * n as f64;
        clat += r["clat_ns"]["mean"].as_f64()? * n as f64;
        ios += n;
    }
    if ios == 0 {
        return None;
    }
    Some(Figures {
        iops,
        lat_us: lat / ios as f64 / 1e3,
        clat_us: clat / ios as f64 / 1e3,
        ios,
        cpu_cores: None,
    })
}

/// usnvme perf's JSON: fio's fields, and the CPU time of its reactors (the total's `usr_cpu` +
/// `sys_cpu`, in % of one core).
pub(crate) fn parse_perf(json: &str) -> Option<Figures> {
    let doc: serde_json::Value = serde_json::from_str(json).ok()?;
    let total = &doc["total"];
    let cpu = total["usr_cpu"].as_f64()? + total["sys_cpu"].as_f64()?;
    Some(Figures {
        cpu_cores: (cpu > 0.0).then_some(cpu / 100.0),
        ..parse_fio(json)?
    })
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
pub struct FabricResults {
    pub runs: Vec<Run>,
    pub seconds: u32,
    /// The guest's exit status (124: vm-run's time limit ended it).
    pub exit_code: u8,
    pub script: String,
    /// `usnvme serve`'s output, per block (tag, text).
    pub serve_logs: Vec<(String, String)>,
    /// The host's /proc/loadavg before and after the boot (it shares its cores).
    pub host_load: (String, String),
}

/// Boots the guest once and runs every case (`spdk`: a `spdk_nvme_perf` binary, an initiator
/// too).
pub fn same_boot(
    usnvme: &Path,
    spdk: Option<&Path>,
    quick: bool,
    seconds: u32,
) -> Result<FabricResults> {
    let out = crate::vm::vm_dir().join("work/bench-fabric");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    // the guest sees the host's root but not its /tmp: the binary goes onto the work share
    let spdk_copy = match spdk {
        Some(binary) => {
            let copy = out.join("spdk_nvme_perf");
            std::fs::copy(binary, &copy).with_context(|| {
                format!("bench: copying {} to {}", binary.display(), copy.display())
            })?;
            sh_quote(&copy.display().to_string())
        }
        None => "''".to_string(),
    };
    let cases = cases(quick, spdk.is_some());
    let body = script(
        &cases,
        &sh_quote(&usnvme.display().to_string()),
        &spdk_copy,
        &out.display().to_string(),
        seconds,
    );
    std::fs::write(out.join("fabric.sh"), &body)?;
    let mut args = super::bench_boot(vec![
        "/bin/sh".into(),
        out.join("fabric.sh").display().to_string(),
    ]);
    args.kernel_nvme = Some("12".into());
    args.timeout = 600 + cases.len() as u64 * (u64::from(seconds) * 3 + 60);
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
            let figures = match case.initiator {
                Initiator::KernelFio => read(format!("{stem}.json")).and_then(|j| parse_fio(&j)),
                Initiator::UsnvmePerf => read(format!("{stem}.json")).and_then(|j| parse_perf(&j)),
                Initiator::Spdk => read(format!("{stem}.log"))
                    .and_then(|t| super::spdk::spdk_figures(&t))
                    .map(|f| Figures {
                        iops: f.iops,
                        lat_us: f.mean_us,
                        clat_us: f.mean_us,
                        ios: (f.iops * f64::from(seconds)) as u64,
                        cpu_cores: None,
                    }),
            };
            let snap = |ext| read(format!("{stem}.{ext}")).and_then(|t| parse_snapshot(&t));
            let window = match (snap("before"), snap("after")) {
                (Some(b), Some(a)) if figures.is_some() => window(&b, &a),
                _ => None,
            };
            Run {
                case,
                figures: figures.filter(|_| window.is_some()),
                window,
            }
        })
        .collect();
    let mut serve_logs = Vec::new();
    let mut seen = Vec::new();
    for c in cases.iter().filter(|c| c.target == Target::Usnvme) {
        let tag = format!("r{}-serve-d{}", c.round, c.drives);
        if !seen.contains(&tag) {
            if let Some(text) = read(format!("{tag}.log")) {
                serve_logs.push((tag.clone(), text));
            }
            seen.push(tag);
        }
    }
    Ok(FabricResults {
        runs,
        seconds,
        exit_code,
        script: body,
        serve_logs,
        host_load,
    })
}

/// The initiator's CPU-seconds per I/O, from a run against `usnvme serve`: all the guest's busy
/// time less the reactors' cores (they poll: busy the whole window), per I/O.
pub fn initiator_cpu_per_io(serve: &Window) -> Option<f64> {
    if serve.ios == 0 {
        return None;
    }
    let v = (serve.busy_s - f64::from(SERVE_REACTORS) * serve.wall_s) / serve.ios as f64;
    (v > 0.0).then_some(v)
}

/// The cores the kernel target used in a run: the guest's busy time less what the initiator
/// spent (its CPU per I/O, measured against `usnvme serve` in the same case, times this run's
/// I/Os), over the wall time.
pub fn kernel_target_cores(kernel: &Window, initiator_per_io: f64) -> f64 {
    (kernel.busy_s - initiator_per_io * kernel.ios as f64) / kernel.wall_s
}

/// One (round, case shape, initiator): both targets and the derived figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub round: u32,
    pub qd: u32,
    pub drives: u32,
    pub initiator: Initiator,
    pub serve: Option<Figures>,
    pub kernel: Option<Figures>,
    /// The initiator's CPU per I/O, µs.
    pub initiator_us_per_io: Option<f64>,
    pub kernel_cores: Option<f64>,
    /// The share of its reactor's core `usnvme serve` spent in turns that did work.
    pub serve_busy_cores: Option<f64>,
}

impl Pair {
    pub fn serve_iops_per_core(&self) -> Option<f64> {
        self.serve.map(|f| f.iops / f64::from(SERVE_REACTORS))
    }

    pub fn kernel_iops_per_core(&self) -> Option<f64> {
        match (self.kernel, self.kernel_cores) {
            (Some(f), Some(c)) if c >= MIN_CORES => Some(f.iops / c),
            _ => None,
        }
    }

    /// usnvme serve's IOPS per target core ÷ the kernel target's.
    pub fn per_core_ratio(&self) -> Option<f64> {
        Some(self.serve_iops_per_core()? / self.kernel_iops_per_core()?)
    }

    /// usnvme serve's IOPS per busy core (the share of its reactor's time that did work, as
    /// the kernel target's cores are the CPU time it used).
    pub fn serve_iops_per_busy_core(&self) -> Option<f64> {
        let busy = self.serve_busy_cores.filter(|&c| c > 0.0)?;
        Some(self.serve?.iops / busy)
    }

    /// usnvme serve's IOPS per busy core ÷ the kernel target's IOPS per core.
    pub fn busy_core_ratio(&self) -> Option<f64> {
        Some(self.serve_iops_per_busy_core()? / self.kernel_iops_per_core()?)
    }

    fn figures(&self, target: Target) -> Option<Figures> {
        match target {
            Target::Usnvme => self.serve,
            Target::Kernel => self.kernel,
        }
    }

    /// The initiator's cores in the run against `target`: usnvme perf's CPU time (its
    /// reactor's, from its JSON: the kernel target's work on the same CPU is not its own);
    /// spdk_nvme_perf's core, whole; fio's and the kernel host's CPU per I/O (measured
    /// against `usnvme serve`) times the IOPS.
    pub fn initiator_cores(&self, target: Target) -> Option<f64> {
        let f = self.figures(target)?;
        match self.initiator {
            Initiator::UsnvmePerf => f.cpu_cores,
            Initiator::Spdk => Some(1.0),
            Initiator::KernelFio => Some(self.initiator_us_per_io? * 1e-6 * f.iops),
        }
    }

    /// IOPS per initiator core against `target`.
    pub fn iops_per_initiator_core(&self, target: Target) -> Option<f64> {
        let cores = self.initiator_cores(target).filter(|&c| c > 0.0)?;
        Some(self.figures(target)?.iops / cores)
    }
}

pub fn pairs(r: &FabricResults) -> Vec<Pair> {
    let mut out: Vec<Pair> = Vec::new();
    for run in &r.runs {
        let c = run.case;
        if out.iter().any(|p| {
            p.round == c.round && p.qd == c.qd && p.drives == c.drives && p.initiator == c.initiator
        }) {
            continue;
        }
        let find = |t: Target| r.runs.iter().find(|x| x.case == Case { target: t, ..c });
        let (s, k) = (find(Target::Usnvme), find(Target::Kernel));
        let per_io = s
            .and_then(|s| s.figures.and(s.window.as_ref()))
            .and_then(initiator_cpu_per_io);
        let kernel_window = k.and_then(|k| k.figures.and(k.window.as_ref()));
        let kernel_cores = match (kernel_window, c.initiator.polls(), per_io) {
            // a polling initiator keeps its core busy the whole window
            (Some(w), true, _) => Some((w.busy_s - w.wall_s) / w.wall_s),
            (Some(w), false, Some(p)) => Some(kernel_target_cores(w, p)),
            _ => None,
        };
        out.push(Pair {
            round: c.round,
            qd: c.qd,
            drives: c.drives,
            initiator: c.initiator,
            serve: s.and_then(|s| s.figures),
            kernel: k.and_then(|k| k.figures),
            initiator_us_per_io: per_io.map(|p| p * 1e6),
            kernel_cores,
            serve_busy_cores: s
                .and_then(|s| s.window.as_ref())
                .and_then(|w| w.serve_busy_cores),
        });
    }
    out
}

/// The pair of `initiator` in `round` at QD 32 on one namespace.
fn qd32(pairs: &[Pair], initiator: Initiator, round: u32) -> Option<&Pair> {
    pairs
        .iter()
        .find(|p| p.initiator == initiator && p.round == round && p.qd == 32 && p.drives == 1)
}

/// The rounds usnvme perf ran in at QD 32 on one namespace.
fn perf_rounds(pairs: &[Pair]) -> Vec<u32> {
    pairs
        .iter()
        .filter(|p| p.initiator == Initiator::UsnvmePerf && p.qd == 32 && p.drives == 1)
        .map(|p| p.round)
        .collect()
}

/// usnvme perf ÷ `other` in front of `target` at QD 32 on one namespace, round by round: IOPS
/// per initiator core; IOPS alone against spdk_nvme_perf (both poll the same CPU, which the
/// kernel target's work shares).
fn initiator_ratios(pairs: &[Pair], other: Initiator, target: Target) -> Vec<f64> {
    perf_rounds(pairs)
        .iter()
        .filter_map(|&r| {
            let (ours, theirs) = (
                qd32(pairs, Initiator::UsnvmePerf, r)?,
                qd32(pairs, other, r)?,
            );
            match other {
                Initiator::Spdk => Some(ours.figures(target)?.iops / theirs.figures(target)?.iops),
                _ => Some(
                    ours.iops_per_initiator_core(target)?
                        / theirs.iops_per_initiator_core(target)?,
                ),
            }
        })
        .collect()
}

/// Issue 16's goals, on one namespace at QD 32, per target: usnvme perf's IOPS per initiator
/// core ≥ 3 × fio's with the kernel's host, and ≥ 1.1 × spdk_nvme_perf's (when it ran: IOPS on
/// the same polled CPU); judged on the median over the rounds (each shown).
fn initiator_goals(m: &mut String, pairs: &[Pair]) -> Result<()> {
    let rounds = perf_rounds(pairs);
    for (other, goal) in [(Initiator::KernelFio, 3.0), (Initiator::Spdk, 1.1)] {
        for target in Target::ALL {
            let ratios = initiator_ratios(pairs, other, target);
            if ratios.is_empty() && !pairs.iter().any(|p| p.initiator == other) {
                continue; // spdk_nvme_perf was not given
            }
            let each = ratios
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ");
            // against fio, also with perf's polling core counted whole
            let whole: Vec<f64> = rounds
                .iter()
                .filter_map(|&r| {
                    let ours = qd32(pairs, Initiator::UsnvmePerf, r)?.figures(target)?.iops;
                    Some(ours / qd32(pairs, other, r)?.iops_per_initiator_core(target)?)
                })
                .collect();
            let whole = match (other, median(whole)) {
                (Initiator::KernelFio, Some(w)) => {
                    format!(" Counting perf's polling core whole: {w:.2} ×.")
                }
                _ => String::new(),
            };
            match median(ratios) {
                Some(x) => writeln!(
                    m,
                    "- **Goal (issue 16), against {}: usnvme perf ≥ {goal} × {}'s {} at 4 KiB \
                     randread QD 32, one namespace: {x:.2} × (median; each round: {each}): \
                     {}.**{whole}",
                    target.label(),
                    other.label(),
                    match other {
                        Initiator::Spdk => "IOPS, both polling CPU 0",
                        _ => "IOPS per initiator core",
                    },
                    if x >= goal { "met" } else { "not met" }
                )?,
                None => writeln!(
                    m,
                    "- Goal (issue 16), against {}: usnvme perf against {}: not measured (a \
                     run failed).",
                    target.label(),
                    other.label()
                )?,
            }
        }
    }
    Ok(())
}

/// The section's heading.
pub const HEADING: &str = "Fabric: NVMe/TCP targets and initiators (one boot, on loopback)";

/// The section's headline figures: usnvme serve against the kernel target, and usnvme perf
/// against the kernel's initiator, at QD 32 on one namespace (medians over the rounds).
fn headlines(h: &mut Headlines, pairs: &[Pair], script: &str) {
    let command = format!("{} (guest script: {script})", h.rerun(Section::Fabric));
    let fio: Vec<&Pair> = pairs
        .iter()
        .filter(|p| p.qd == 32 && p.drives == 1 && p.initiator == Initiator::KernelFio)
        .collect();
    let iops = median(
        fio.iter()
            .filter_map(|p| Some(p.serve?.iops / p.kernel?.iops))
            .collect(),
    );
    let per_core = median(fio.iter().filter_map(|p| p.per_core_ratio()).collect());
    h.add(
        HEADING,
        "`usnvme serve` ÷ the kernel's nvmet-tcp, 4 KiB randread QD 32, 1 namespace, Linux \
         nvme-tcp + fio in front (VM under TCG; median of the rounds)",
        match (iops, per_core) {
            (Some(a), Some(c)) => format!("{a:.2} × IOPS; {c:.2} × IOPS per target core"),
            (Some(a), None) => format!("{a:.2} × IOPS"),
            _ => times(None),
        },
        command.clone(),
    );
    h.add(
        HEADING,
        "`usnvme perf` ÷ Linux nvme-tcp + fio, IOPS per initiator core, in front of `usnvme \
         serve`, 4 KiB randread QD 32, 1 namespace (VM under TCG; median of the rounds)",
        times(median(initiator_ratios(
            pairs,
            Initiator::KernelFio,
            Target::Usnvme,
        ))),
        command,
    );
}

pub fn section(
    m: &mut String,
    results: Option<&FabricResults>,
    why_not: &str,
    companions: &Companions,
    h: &mut Headlines,
) -> Result<()> {
    let Some(r) = open_section(m, HEADING, results, why_not)? else {
        return Ok(());
    };
    let script = companions.file("fabric.sh", &r.script)?;
    let rounds = r.runs.iter().map(|x| x.case.round).max().unwrap_or(0);
    writeln!(
        m,
        "One boot of the test bed (QEMU under software emulation, TCG, 2 vCPUs; 24 null-backed \
         emulated drives, the first 12 on the kernel's nvme driver, the other 12 on vfio-pci): \
         **emulation-ceiling figures** — every doorbell and DMA of the emulated drives and every \
         instruction of both vCPUs is emulated in software, on a host whose cores QEMU's device \
         emulation shares with the vCPUs — not hardware ones; only the comparison within the \
         boot means something. The same initiators against both targets: the guest kernel's \
         nvme-tcp host (`nvme connect -t tcp -a 127.0.0.1`, 2 I/O queues of 128 entries) and \
         fio with io_uring (`--direct=1`) on the block devices it creates, pinned to CPU \
         {INITIATOR_CPU}; `usnvme perf -r tcp://127.0.0.1:PORT/NQN -c {INITIATOR_CPU}` (one \
         reactor polling CPU {INITIATOR_CPU}, one I/O queue its namespaces share); and, when a binary \
         is given (`--spdk`), `spdk_nvme_perf -r 'trtype:TCP …' -c {INITIATOR_CPU:#x}`. \
         Targets: `usnvme serve -c {TARGET_CPU}` (one reactor, polling CPU \
         {TARGET_CPU}) on vfio-pci drives, port 4420; the kernel's nvmet-tcp on the block \
         devices of drives left on the nvme driver, port 4421, set up through configfs. The \
         kernel target cannot be pinned: its work runs in nvmet-tcp's per-CPU workers, queued \
         on the CPU where its socket's packets arrive, which on loopback is the CPU that sent \
         them — fio's CPU {INITIATOR_CPU} — and in the nvme driver's interrupts. 4 KiB random \
         reads, QD per namespace (fio's iodepth = QD × namespaces, one job), {} s per run after \
         1 s of ramp-up, {rounds} round(s): odd rounds run `usnvme serve` first, even rounds \
         the kernel's.\n",
        r.seconds
    )?;
    writeln!(
        m,
        "*Target cores.* `usnvme serve` polls: its cores are its reactors, {SERVE_REACTORS}, \
         busy or not. The kernel target's are estimated: around each run the script samples \
         /proc/stat (all CPUs; busy = user + nice + system + irq + softirq + steal) and the \
         reads completed on the initiator's block devices (ramp-up included, like the CPU \
         time). Against `usnvme serve`, the initiator's CPU per I/O is (guest busy − \
         {SERVE_REACTORS} core × wall) ÷ I/Os; against the kernel target in the same round and \
         case, kernel target cores ≈ (guest busy − initiator CPU per I/O × I/Os) ÷ wall. \
         Assumptions: the initiator (fio, io_uring, the nvme-tcp host) costs the same per I/O \
         against either target; loopback delivers a packet in the sender's context, so each \
         side's share includes the TCP receive work of what it sends — for both targets alike, \
         as the serve's core also carries the delivery of its responses to the initiator; the \
         rest of the guest (serve's accept thread, which sleeps 2 ms between polls, kernel \
         housekeeping) is small against a run; the guest's tick-based CPU accounting is right \
         on average under TCG. One more bias, against `usnvme serve`: its polling vCPU keeps a \
         host core busy that QEMU's emulation of the drives would otherwise use, and the guest \
         has no steal time under TCG: while the host runs something else, a vCPU's time is \
         charged to whatever it was doing. An estimate below {MIN_CORES} core is shown but not \
         used (at QD 1 the initiator's cost per I/O against `usnvme serve`, which waits on a \
         polling target, overstates it). `usnvme serve` also counts its reactor's time in \
         turns that did work (bytes arrived, commands completed, responses went out; its \
         `--json-status`, every 0.1 s, read with each snapshot): its *busy* cores, the part of \
         its polling core it needed, shown in brackets with its IOPS per busy core.\n\n\
         *Initiator cores.* `usnvme perf`'s are its reactor's CPU time over the measured window \
         (its JSON's `usr_cpu` + `sys_cpu`): it polls, so against `usnvme serve` that is its \
         core whole; against the kernel target, whose work runs on the CPU its packets come \
         from — on loopback, the initiator's — the target's share of that CPU is not perf's. \
         fio's and the kernel host's are its CPU per I/O, measured against `usnvme serve` as \
         above, times the IOPS: its IOPS per initiator core are the same against both targets. \
         `spdk_nvme_perf` polls the same CPU as `usnvme perf` and is compared with it by IOPS.\n\n\
         *Mean latency* is fio's `lat` (submission to completion); `clat` leaves the \
         submission out, which for the kernel target holds much of the round trip: the nvme-tcp \
         host sends inline on fio's CPU, and loopback runs the target's receive path within \
         that send. Host load average (1, 5, 15 min) before the boot: {}; after: {}.\n",
        r.host_load.0, r.host_load.1
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
        "| round | drives | QD | target | initiator | IOPS | mean latency (µs) | clat mean (µs) | target cores | IOPS per target core | initiator cores | IOPS per initiator core | guest CPU busy (cpu0 / cpu1) |\n\
         |---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
    )?;
    let pairs = pairs(r);
    let k = |v: f64| format!("{:.2} k", v / 1e3);
    for run in &r.runs {
        let c = run.case;
        let pair = pairs.iter().find(|p| {
            p.round == c.round && p.qd == c.qd && p.drives == c.drives && p.initiator == c.initiator
        });
        let (cores, per_core) = match (c.target, pair) {
            (Target::Usnvme, Some(p)) => (Some(f64::from(SERVE_REACTORS)), p.serve_iops_per_core()),
            (Target::Kernel, Some(p)) => (p.kernel_cores, p.kernel_iops_per_core()),
            (_, None) => (None, None),
        };
        // usnvme serve's busy share of its core, and its IOPS per busy core
        let (busy_cores, per_busy_core) = match (c.target, pair) {
            (Target::Usnvme, Some(p)) => (
                p.serve_busy_cores
                    .map_or(String::new(), |b| format!(" (busy {b:.2})")),
                p.serve_iops_per_busy_core()
                    .map_or(String::new(), |v| format!(" ({} per busy core)", k(v))),
            ),
            _ => (String::new(), String::new()),
        };
        let busy = run.window.as_ref().map_or("–".into(), |w| {
            w.per_cpu_pct
                .iter()
                .map(|p| format!("{p:.0} %"))
                .collect::<Vec<_>>()
                .join(" / ")
        });
        let head = format!(
            "| {} | {} | {} | {} | {} |",
            c.round,
            c.drives,
            c.qd,
            c.target.label(),
            c.initiator.label()
        );
        let (initiator_cores, per_initiator_core) = pair.map_or((None, None), |p| {
            (
                p.initiator_cores(c.target),
                p.iops_per_initiator_core(c.target),
            )
        });
        match run.figures {
            Some(f) => writeln!(
                m,
                "{head} {} | {:.1} | {:.1} | {}{busy_cores} | {}{per_busy_core} | {} | {} | {busy} |",
                k(f.iops),
                f.lat_us,
                f.clat_us,
                cores.map_or("–".into(), |c| if c < MIN_CORES {
                    format!("{c:.2} (unusable)")
                } else {
                    format!("{c:.2}")
                }),
                per_core.map_or("–".into(), k),
                initiator_cores.map_or("–".into(), |c| format!("{c:.2}")),
                per_initiator_core.map_or("–".into(), k),
            )?,
            None => writeln!(m, "{head} failed | | | | | | | |")?,
        }
    }
    writeln!(m)?;
    for p in &pairs {
        if let Some(us) = p.initiator_us_per_io {
            writeln!(
                m,
                "- Round {}, {} drive(s), QD {}: initiator CPU per I/O {us:.0} µs (from the \
                 `usnvme serve` run); kernel target cores ≈ {}; IOPS per target core, usnvme \
                 serve ÷ kernel: {}; per busy core of usnvme serve ({}): {}.",
                p.round,
                p.drives,
                p.qd,
                p.kernel_cores.map_or("–".into(), |c| format!("{c:.2}")),
                p.per_core_ratio()
                    .map_or("–".into(), |x| format!("{x:.2} ×")),
                p.serve_busy_cores
                    .map_or("–".into(), |c| format!("{c:.2} busy")),
                p.busy_core_ratio()
                    .map_or("–".into(), |x| format!("{x:.2} ×")),
            )?;
        }
    }
    initiator_goals(m, &pairs)?;
    // issue 15's goals, on one namespace; judged on the median over the rounds (each shown)
    let mut initiators: Vec<Initiator> = Vec::new();
    for p in &pairs {
        if !initiators.contains(&p.initiator) {
            initiators.push(p.initiator);
        }
    }
    for initiator in initiators {
        let of = |qd: u32| -> Vec<&Pair> {
            pairs
                .iter()
                .filter(|p| p.qd == qd && p.drives == 1 && p.initiator == initiator)
                .collect()
        };
        let qd32 = of(32);
        let ratios: Vec<f64> = qd32.iter().filter_map(|p| p.per_core_ratio()).collect();
        let each = ratios
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let busy: Vec<f64> = qd32.iter().filter_map(|p| p.busy_core_ratio()).collect();
        let busy_each = busy
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let busy_verdict = median(busy).map_or(String::new(), |b| {
            format!(
                " Counting usnvme serve's cores as the share of its reactor's time in turns \
                 that did work, as the kernel target's are the CPU time it used: {b:.2} × \
                 (median; each round: {busy_each}): {}.",
                if b >= 2.0 { "met" } else { "not met" }
            )
        });
        match median(ratios.clone()) {
            Some(x) => writeln!(
                m,
                "- **Goal (issue 15), {}: usnvme serve ≥ 2 × the kernel target's IOPS per target \
                 core at 4 KiB randread QD 32, one namespace: {x:.2} × (median; each round: \
                 {each}), counting its polling core whole: {}.**{busy_verdict}",
                initiator.label(),
                if x >= 2.0 { "met" } else { "not met" }
            )?,
            None if qd32.is_empty() => {}
            None if initiator.polls() => writeln!(
                m,
                "- Goal (issue 15), {}: IOPS per target core at QD 32: not measurable (the \
                 kernel target's work runs on the CPU the initiator polls).",
                initiator.label()
            )?,
            None => writeln!(
                m,
                "- Goal (issue 15), {}: IOPS per target core at QD 32: not measured (a run \
                 failed).",
                initiator.label()
            )?,
        }
        let qd1 = of(1);
        let lat: Vec<(f64, f64)> = qd1
            .iter()
            .filter_map(|p| Some((p.serve?.lat_us, p.kernel?.lat_us)))
            .collect();
        let (ours, theirs): (Vec<f64>, Vec<f64>) = lat.iter().copied().unzip();
        match (median(ours), median(theirs)) {
            (Some(a), Some(b)) => writeln!(
                m,
                "- **Goal (issue 15), {}: lower mean latency than the kernel target at 4 KiB \
                 randread QD 1: {a:.1} µs against {b:.1} µs (medians; each round: {}): {}.**",
                initiator.label(),
                lat.iter()
                    .map(|(a, b)| format!("{a:.1} vs {b:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if a < b { "met" } else { "not met" }
            )?,
            _ if qd1.is_empty() => writeln!(
                m,
                "- Goal (issue 15), {}: mean latency at QD 1: not run (`--quick`).",
                initiator.label()
            )?,
            _ => writeln!(
                m,
                "- Goal (issue 15), {}: mean latency at QD 1: not measured (a run failed).",
                initiator.label()
            )?,
        }
    }
    writeln!(
        m,
        "\nThe guest script (run by `cargo xtask bench` through `cargo xtask vm-run \
         --kernel-nvme 12`): {script}."
    )?;
    serve_logs(m, companions, "fabric-serve", &r.serve_logs)?;
    headlines(h, &pairs, &script);
    Ok(())
}

/// What `usnvme serve` printed per block of runs (`(tag, text)`), kept as companion files
/// `{prefix}-{tag}.log` and named in the section.
pub(super) fn serve_logs(
    m: &mut String,
    companions: &Companions,
    prefix: &str,
    logs: &[(String, String)],
) -> Result<()> {
    let files = logs
        .iter()
        .map(|(tag, log)| companions.file(&format!("{prefix}-{tag}.log"), log))
        .collect::<Result<Vec<_>>>()?;
    if !files.is_empty() {
        writeln!(
            m,
            "\nWhat `usnvme serve` printed, per block of runs: {}.",
            files.join(", ")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "up 100.50\nhz 100\nios 1000\n\
        cpu  200 0 300 5000 10 0 50 0 0 0\n\
        cpu0 100 0 150 2500 5 0 25 0 0 0\n\
        cpu1 100 0 150 2500 5 0 25 0 0 0\n";

    #[test]
    fn reads_a_snapshot_and_the_window_between_two() {
        let before = parse_snapshot(STAT).expect("parsed");
        assert_eq!(before.uptime, 100.5);
        assert_eq!(before.ios, 1000);
        assert_eq!(before.cpus[0], ("cpu".to_string(), 550, 5560));
        let after = parse_snapshot(
            "up 110.50\nhz 100\nios 51000\n\
             cpu  1200 0 800 5500 10 0 50 0 0 0\n\
             cpu0 200 0 550 2750 5 0 25 0 0 0\n\
             cpu1 1000 0 250 2750 5 0 25 0 0 0\n",
        )
        .expect("parsed");
        let w = window(&before, &after).expect("a window");
        assert_eq!(w.serve_busy_cores, None);
        assert_eq!(w.wall_s, 10.0);
        assert_eq!(w.busy_s, 15.0);
        assert_eq!(w.ios, 50_000);
        assert_eq!(w.per_cpu_pct.len(), 2);
        assert!((w.per_cpu_pct[0] - 100.0 * 500.0 / 750.0).abs() < 1e-9);
        assert!((w.per_cpu_pct[1] - 100.0 * 1000.0 / 1250.0).abs() < 1e-9);
        // with usnvme serve's status: 10 s of reactor time, 2.5 of them busy
        let with_serve =
            |text: &str, extra: &str| parse_snapshot(&format!("{text}{extra}")).expect("parsed");
        let b = with_serve(STAT, "serve_reactor 20.0\nserve_busy 4.0\n");
        assert_eq!(b.serve, Some((20.0, 4.0)));
        let a = with_serve(
            &STAT.replace("up 100.50", "up 110.50"),
            "serve_reactor 30.0\nserve_busy 6.5\n",
        );
        let w = window(&b, &a).expect("a window");
        assert!((w.serve_busy_cores.expect("busy") - 0.25).abs() < 1e-9);
        assert_eq!(parse_snapshot("up 1\nhz 100\ncpu 1 2 3\n"), None);
        assert_eq!(parse_snapshot("garbage"), None);
    }

    #[test]
    fn reads_fio_iops_and_mean_latencies() {
        let fio =
            "fio: some warning\n{\"jobs\": [{\"read\": {\"iops\": 1000.0, \"total_ios\": 3000, \
                   \"lat_ns\": {\"mean\": 31000.0}, \"clat_ns\": {\"mean\": 30000.0}}}]}";
        let f = parse_fio(fio).expect("parsed");
        assert_eq!(f.iops, 1000.0);
        assert_eq!(f.ios, 3000);
        assert!((f.lat_us - 31.0).abs() < 1e-9);
        assert!((f.clat_us - 30.0).abs() < 1e-9);
        assert_eq!(parse_fio("not json"), None);
        assert_eq!(
            parse_fio("{\"jobs\": [{\"read\": {\"iops\": 0.0, \"total_ios\": 0, \"lat_ns\": {\"mean\": 0.0}, \"clat_ns\": {\"mean\": 0.0}}}]}"),
            None
        );
    }

    #[test]
    fn estimates_the_kernel_targets_cores_from_the_initiators_cost_against_serve() {
        // against serve: 10 s, 15 CPU-s busy, 1 core is the reactor: 5 CPU-s for 50 000 I/Os
        let serve = Window {
            wall_s: 10.0,
            busy_s: 15.0,
            per_cpu_pct: vec![],
            ios: 50_000,
            serve_busy_cores: None,
        };
        let per_io = initiator_cpu_per_io(&serve).expect("positive");
        assert!((per_io - 100e-6).abs() < 1e-12);
        // against the kernel: 12 CPU-s for 40 000 I/Os: 4 for the initiator, 8 for the target
        let kernel = Window {
            wall_s: 10.0,
            busy_s: 12.0,
            per_cpu_pct: vec![],
            ios: 40_000,
            serve_busy_cores: None,
        };
        assert!((kernel_target_cores(&kernel, per_io) - 0.8).abs() < 1e-9);
        let idle = Window {
            busy_s: 9.0,
            ..serve
        };
        assert_eq!(initiator_cpu_per_io(&idle), None);
    }

    #[test]
    fn pairs_give_the_per_core_ratio() {
        let fig = |iops| Figures {
            iops,
            lat_us: 10.0,
            clat_us: 9.0,
            ios: 1,
            cpu_cores: None,
        };
        let case = |target| Case {
            round: 1,
            target,
            initiator: Initiator::KernelFio,
            qd: 32,
            drives: 1,
        };
        let results = FabricResults {
            runs: vec![
                Run {
                    case: case(Target::Usnvme),
                    figures: Some(fig(5000.0)),
                    window: Some(Window {
                        wall_s: 10.0,
                        busy_s: 15.0,
                        per_cpu_pct: vec![],
                        ios: 50_000,
                        serve_busy_cores: Some(0.5),
                    }),
                },
                Run {
                    case: case(Target::Kernel),
                    figures: Some(fig(4000.0)),
                    window: Some(Window {
                        wall_s: 10.0,
                        busy_s: 12.0,
                        per_cpu_pct: vec![],
                        ios: 40_000,
                        serve_busy_cores: None,
                    }),
                },
            ],
            seconds: 10,
            exit_code: 0,
            script: "echo fabric\n".into(),
            serve_logs: vec![("r1-serve-d1".into(), "hosts: any\n".into())],
            host_load: ("1.00 0.50 0.25".into(), "2.00 1.00 0.50".into()),
        };
        let p = pairs(&results);
        assert_eq!(p.len(), 1);
        assert!((p[0].initiator_us_per_io.unwrap() - 100.0).abs() < 1e-6);
        // 5000 per core against 4000 / 0.8 = 5000 per core
        assert!((p[0].per_core_ratio().unwrap() - 1.0).abs() < 1e-9);
        // busy half of its core: 10 000 per busy core, twice the kernel's
        assert!((p[0].busy_core_ratio().unwrap() - 2.0).abs() < 1e-9);
        let mut m = String::new();
        let (companions, mut h) = (
            Companions::for_test("fabric"),
            Headlines::new(String::new()),
        );
        section(&mut m, Some(&results), "", &companions, &mut h).unwrap();
        assert!(
            m.contains(
                "The guest script (run by `cargo xtask bench` through `cargo xtask vm-run \
                 --kernel-nvme 12`): [benchmarks/fabric.sh](benchmarks/fabric.sh).\n\n\
                 What `usnvme serve` printed, per block of runs: \
                 [benchmarks/fabric-serve-r1-serve-d1.log](benchmarks/fabric-serve-r1-serve-d1.log).\n"
            ),
            "{m}"
        );
        assert_eq!(companions.read("fabric.sh"), "echo fabric\n");
        assert_eq!(
            companions.read("fabric-serve-r1-serve-d1.log"),
            "hosts: any\n"
        );
        companions.remove();
        let t = h.table();
        assert!(
            t.contains("1 namespace, Linux nvme-tcp + fio in front (VM under TCG; median of the \
                        rounds) | 1.25 × IOPS; 1.00 × IOPS per target core | `cargo xtask bench \
                        --only fabric` (guest script: [benchmarks/fabric.sh](benchmarks/fabric.sh)) |"),
            "{t}"
        );
        assert!(
            t.contains("| no figure (a run failed; see the section) |"),
            "perf did not run: {t}"
        );
        assert!(m.contains("| 1 | 1 | 32 | usnvme serve | Linux nvme-tcp + fio io_uring | 5.00 k | 10.0 | 9.0 | 1.00 (busy 0.50) | 5.00 k (10.00 k per busy core) |"), "{m}");
        assert!(m.contains("| 1 | 1 | 32 | kernel nvmet-tcp | Linux nvme-tcp + fio io_uring | 4.00 k | 10.0 | 9.0 | 0.80 | 5.00 k |"), "{m}");
        assert!(
            m.contains("one namespace: 1.00 × (median; each round: 1.00), counting its polling core whole: not met.**"),
            "{m}"
        );
        assert!(
            m.contains("as the kernel target's are the CPU time it used: 2.00 × (median; each round: 2.00): met."),
            "{m}"
        );
        assert!(
            m.contains("mean latency at QD 1: not run (`--quick`)"),
            "{m}"
        );
    }

    #[test]
    fn perf_per_initiator_core_is_compared_with_fio_per_initiator_core() {
        let fig = |iops| Figures {
            iops,
            lat_us: 10.0,
            clat_us: 9.0,
            ios: 1,
            cpu_cores: None,
        };
        let window = |busy_s, ios| {
            Some(Window {
                wall_s: 10.0,
                busy_s,
                per_cpu_pct: vec![],
                ios,
                serve_busy_cores: None,
            })
        };
        let run = |target, initiator, iops, cpu, w| Run {
            case: Case {
                round: 1,
                target,
                initiator,
                qd: 32,
                drives: 1,
            },
            figures: Some(Figures {
                cpu_cores: cpu,
                ..fig(iops)
            }),
            window: w,
        };
        let results = FabricResults {
            runs: vec![
                // fio: 5 CPU-s for 50 000 I/Os against serve: 10 000 IOPS per initiator core
                run(
                    Target::Usnvme,
                    Initiator::KernelFio,
                    5000.0,
                    None,
                    window(15.0, 50_000),
                ),
                run(
                    Target::Kernel,
                    Initiator::KernelFio,
                    4000.0,
                    None,
                    window(12.0, 40_000),
                ),
                // perf had its core whole against serve; the kernel target's work took a fifth
                // of it: 35 000 and 25 000 / 0.8 IOPS per initiator core
                run(
                    Target::Usnvme,
                    Initiator::UsnvmePerf,
                    35000.0,
                    Some(1.0),
                    window(20.0, 0),
                ),
                run(
                    Target::Kernel,
                    Initiator::UsnvmePerf,
                    25000.0,
                    Some(0.8),
                    window(18.0, 0),
                ),
            ],
            seconds: 10,
            exit_code: 0,
            script: String::new(),
            serve_logs: vec![],
            host_load: (String::new(), String::new()),
        };
        let p = pairs(&results);
        let perf = p
            .iter()
            .find(|p| p.initiator == Initiator::UsnvmePerf)
            .expect("perf's pair");
        assert_eq!(perf.initiator_cores(Target::Kernel), Some(0.8));
        // the kernel target's cores: the guest's busy time less perf's polled core
        assert!((perf.kernel_cores.expect("cores") - 0.8).abs() < 1e-9);
        let fio = p
            .iter()
            .find(|p| p.initiator == Initiator::KernelFio)
            .expect("fio's pair");
        assert!(
            (fio.iops_per_initiator_core(Target::Kernel).expect("fio") - 10_000.0).abs() < 1e-6
        );
        let mut m = String::new();
        let (companions, mut h) = (
            Companions::for_test("fabric-perf"),
            Headlines::new(String::new()),
        );
        section(&mut m, Some(&results), "", &companions, &mut h).unwrap();
        companions.remove();
        assert!(
            h.table().contains(
                "in front of `usnvme serve`, 4 KiB randread QD 32, 1 namespace (VM under TCG; \
                 median of the rounds) | 3.50 × |"
            ),
            "{}",
            h.table()
        );
        assert!(
            m.contains("against usnvme serve: usnvme perf ≥ 3 × Linux nvme-tcp + fio io_uring's IOPS per initiator core at 4 KiB randread QD 32, one namespace: 3.50 × (median; each round: 3.50): met.**"),
            "{m}"
        );
        assert!(
            m.contains("against kernel nvmet-tcp: usnvme perf ≥ 3 × Linux nvme-tcp + fio io_uring's IOPS per initiator core at 4 KiB randread QD 32, one namespace: 3.12 × (median; each round: 3.12): met.** Counting perf's polling core whole: 2.50 ×."),
            "{m}"
        );
        assert!(!m.contains("spdk_nvme_perf's"), "not given: {m}");
    }

    #[test]
    fn the_quick_run_is_one_case_against_both_targets_and_the_full_run_alternates() {
        let quick = cases(true, false);
        assert_eq!(
            quick
                .iter()
                .map(|c| (c.target, c.initiator, c.qd))
                .collect::<Vec<_>>(),
            [
                (Target::Usnvme, Initiator::KernelFio, 32),
                (Target::Usnvme, Initiator::UsnvmePerf, 32),
                (Target::Kernel, Initiator::KernelFio, 32),
                (Target::Kernel, Initiator::UsnvmePerf, 32),
            ]
        );
        assert_eq!(cases(true, true).len(), 6, "spdk_nvme_perf joins");
        let full = cases(false, false);
        // 3 rounds of: each target at QD 32 and 1 on one namespace, then at QD 8 on twelve,
        // each initiator
        assert_eq!(full.len(), 36);
        use Initiator::{KernelFio as F, UsnvmePerf as P};
        assert_eq!(
            full[..12]
                .iter()
                .map(|c| (c.target, c.initiator, c.drives, c.qd))
                .collect::<Vec<_>>(),
            [
                (Target::Usnvme, F, 1, 32),
                (Target::Usnvme, F, 1, 1),
                (Target::Usnvme, P, 1, 32),
                (Target::Usnvme, P, 1, 1),
                (Target::Kernel, F, 1, 32),
                (Target::Kernel, F, 1, 1),
                (Target::Kernel, P, 1, 32),
                (Target::Kernel, P, 1, 1),
                (Target::Usnvme, F, 12, 8),
                (Target::Usnvme, P, 12, 8),
                (Target::Kernel, F, 12, 8),
                (Target::Kernel, P, 12, 8),
            ]
        );
        assert_eq!((full[12].round, full[12].target), (2, Target::Kernel));
        assert_eq!((full[24].round, full[24].target), (3, Target::Usnvme));
    }

    #[test]
    fn the_script_starts_both_targets_runs_fio_between_snapshots_and_tears_down() {
        let s = script(&cases(true, false), "/u", "''", "/o", 5);
        assert!(
            s.contains(
                "$USNVME serve $(first \"$VDEVS\" 1 | sed 's/^/-r /') -c 1 --listen 127.0.0.1:4420 \
                 --nqn nqn.2014-08.org.usnvme:bench --allow-any-host \
                 --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 \
                 > $OUT/r1-serve-d1.log 2>&1 &"
            ),
            "{s}"
        );
        assert!(s.contains("USNVME=/u\nSPDK=''\nOUT=/o\n"), "{s}");
        // usnvme perf polls the initiator's CPU, between two snapshots
        assert!(
            s.contains(
                "DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench\n\
                 echo 'r1-serve-perf-qd32-d1: usnvme perf against usnvme serve, qd 32, 1 drive(s)'\n\
                 [ -n \"$DEVS\" ] && /bin/sh $OUT/snap.sh $OUT/r1-serve-perf-qd32-d1.before '' \
                 && timeout -s INT 45 $USNVME perf -r $DEVS --hostnqn $HOSTNQN \
                 -c 0 -q 32 -o 4k -w randread -t 5 -a 1 --json $OUT/r1-serve-perf-qd32-d1.json \
                 > $OUT/r1-serve-perf-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh \
                 $OUT/r1-serve-perf-qd32-d1.after ''"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2014-08.org.usnvme:bench --hostnqn $HOSTNQN"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "[ -n \"$DEVS\" ] && timeout -s INT 45 $FIO --name=fabric --ioengine=io_uring \
                 --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 \
                 --time_based --runtime=5 --ramp_time=1 --output-format=json \
                 --output=$OUT/r1-serve-kfio-qd32-d1.json --filename=$FILES \
                 \"--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd32-d1.before $FILES\" \
                 \"--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd32-d1.after $FILES\" \
                 > /dev/null || { echo FAILED; rm -f $OUT/r1-serve-kfio-qd32-d1.json; }\n"
            ),
            "{s}"
        );
        assert!(s.contains("FILES=$(echo $DEVS | tr ' ' :)\n"), "{s}");
        assert!(s.contains("cd $OUT\n"), "{s}");
        assert!(s.contains("cat > $OUT/snap.sh <<'SNAP'\n"), "{s}");
        assert!(
            s.contains("$NVME disconnect -n nqn.2014-08.org.usnvme:bench\n"),
            "{s}"
        );
        assert!(s.contains("kill -TERM $SERVE"), "{s}");
        // the kernel target, on a kernel-bound drive, and torn down in reverse order
        for line in [
            "S=$CFS/subsystems/nqn.2014-08.org.usnvme:bench-nvmet\n",
            "mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1\n",
            "for d in $(first \"$KDEVS\" 1); do\n",
            "echo /dev/$d > $S/namespaces/$i/device_path && echo 1 > $S/namespaces/$i/enable",
            "echo 127.0.0.1 > $P/addr_traddr && echo 4421 > $P/addr_trsvcid && ln -s $S $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet",
            "-s 4421 -n nqn.2014-08.org.usnvme:bench-nvmet",
            "rm -f $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet\nrmdir $P\nfor n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done\nrmdir $S\n",
        ] {
            assert!(s.contains(line), "{line}\n---\n{s}");
        }
        // serve's block comes before the kernel's in round 1
        assert!(s.find("-s 4420").unwrap() < s.find("-s 4421").unwrap());
    }
}
