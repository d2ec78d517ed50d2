//! `cargo xtask bench --only fabric-native --spdk-target PATH --spdk-perf PATH`: NVMe/TCP
//! natively over loopback, SPDK beside us in one run, no VM. Targets: `usnvme serve` against
//! SPDK's `nvmf_tgt` under the same initiator (`usnvme perf`), IOPS per target core.
//! Initiators: `usnvme perf` against `spdk_nvme_perf` in front of the same target, IOPS per
//! initiator core. Both targets export 8 null namespaces of 1 GiB in 512-byte blocks (`sim:`
//! null drives; SPDK null bdevs); 4 KiB random reads at QD 32 and 1 per namespace; each round
//! runs every case, the two sides of a comparison in alternating order.
//!
//! Then what each initiator costs per I/O on its core, in front of each target: system calls
//! (`perf stat` counting the syscall tracepoints over a run) and user-space instructions
//! (callgrind: two runs of N and 2N I/Os per namespace, the difference divided by 8N, so that
//! set-up cancels), and where `usnvme perf`'s instructions go.
//!
//! Placement follows the machine's cores. With 16 or more: targets on 1 and 4 cores with the
//! initiator on cores 8-15, and initiators on core 8 in front of targets on cores 0-7. With
//! fewer: target on core 0, initiator on core 1 (the version that runs anywhere: on a small
//! machine the kernel's loopback work of both sides shares two cores, so it gives ratios, not
//! figures to quote).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::spdk::{first_error, median, spdk_figures, usnvme_figures};
use super::{versus, Headlines, Section};

const SERVE_PORT: u16 = 4420;
const SPDK_PORT: u16 = 4421;
const SERVE_NQN: &str = "nqn.2024-01.io.usnvme:bench";
const SPDK_NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const NAMESPACES: u32 = 8;
/// How long a target may take to start listening.
const START_LIMIT: Duration = Duration::from_secs(60);

/// SPDK's programs: the target, the initiator, the RPC client, and the folder of shared
/// libraries beside them (`lib/`, in a relocated build) if there is one.
#[derive(Debug, Clone)]
pub struct Spdk {
    target: PathBuf,
    perf: PathBuf,
    rpc: PathBuf,
    lib: Option<PathBuf>,
    /// `spdk_nvme_perf`'s memory flags on this machine.
    memory: String,
}

impl Spdk {
    /// `nvmf_tgt` and `spdk_nvme_perf`; `rpc.py` given, or found in the SPDK tree they were
    /// built in (`build/bin/` → `scripts/`) or beside their folder (`bin/` → `scripts/`).
    pub fn find(target: &Path, perf: &Path, rpc: Option<&Path>) -> Result<Spdk> {
        for (flag, p) in [("--spdk-target", target), ("--spdk-perf", perf)] {
            if !p.is_file() {
                bail!("{flag} {}: no such file", p.display());
            }
        }
        let target = std::fs::canonicalize(target)?;
        let perf = std::fs::canonicalize(perf)?;
        let bin = target.parent().unwrap_or(Path::new("/"));
        let rpc = match rpc {
            Some(p) if p.is_file() => p.to_path_buf(),
            Some(p) => bail!("--spdk-rpc {}: no such file", p.display()),
            None => ["../scripts/rpc.py", "../../scripts/rpc.py"]
                .iter()
                .map(|r| bin.join(r))
                .find(|p| p.is_file())
                .with_context(|| {
                    format!(
                        "no scripts/rpc.py near {}: give SPDK's with --spdk-rpc PATH",
                        target.display()
                    )
                })?,
        };
        let lib = Some(bin.join("../lib")).filter(|l| l.is_dir());
        let mut spdk = Spdk {
            target,
            perf,
            rpc,
            lib,
            memory: String::new(),
        };
        // checked now, not after the other sections' half hour
        spdk.memory = spdk_perf_memory(&spdk)?;
        Ok(spdk)
    }

    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        if let Some(lib) = &self.lib {
            c.env("LD_LIBRARY_PATH", lib);
        }
        c
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Serve,
    NvmfTgt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initiator {
    UsnvmePerf,
    SpdkPerf,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Serve => "usnvme serve",
            Target::NvmfTgt => "nvmf_tgt",
        }
    }
}

impl Initiator {
    fn name(self) -> &'static str {
        match self {
            Initiator::UsnvmePerf => "usnvme perf",
            Initiator::SpdkPerf => "spdk_nvme_perf",
        }
    }
}

/// One measured case: an initiator on its cores in front of a target on its cores.
#[derive(Debug, Clone)]
pub struct Case {
    pub target: Target,
    pub target_cores: Vec<u32>,
    pub initiator: Initiator,
    pub initiator_cores: Vec<u32>,
    pub qd: u32,
    /// IOPS of each round that gave figures.
    pub iops: Vec<f64>,
    /// Why a round gave none (the first such).
    pub error: Option<String>,
    pub command: String,
}

#[derive(Debug)]
pub struct NativeResults {
    pub cases: Vec<Case>,
    pub seconds: u32,
    pub rounds: u32,
    /// How `spdk_nvme_perf` got its memory.
    pub spdk_memory: String,
    pub target_commands: Vec<String>,
    /// What each initiator costs per I/O, on one core.
    pub costs: Vec<Cost>,
    /// Where `usnvme perf`'s instructions go in front of nvmf_tgt at QD 32: (part, per I/O).
    pub split: Option<std::result::Result<Vec<(&'static str, f64)>, String>>,
}

/// What one initiator costs per I/O on one core in front of a target, at a QD.
#[derive(Debug, Clone)]
pub struct Cost {
    pub target: Target,
    pub initiator: Initiator,
    pub qd: u32,
    pub syscalls: std::result::Result<Syscalls, String>,
    /// User-space instructions (callgrind).
    pub instructions: std::result::Result<f64, String>,
}

/// System calls per I/O, by what they do.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Syscalls {
    pub total: f64,
    /// `readv`, `recvmsg`, `recvfrom`, `read`.
    pub receive: f64,
    /// `writev`, `sendmsg`, `sendto`, `write`.
    pub send: f64,
    /// Readiness: `epoll_wait`, `epoll_pwait`, `poll`, `ppoll`.
    pub wait: f64,
}

/// `a-b` / `a` as the tools take core lists.
pub(super) fn list(cores: &[u32]) -> String {
    match (cores.first(), cores.last()) {
        (Some(a), Some(b)) if a != b => format!("{a}-{b}"),
        (Some(a), _) => a.to_string(),
        _ => String::new(),
    }
}

fn mask(cores: &[u32]) -> String {
    format!("{:#x}", cores.iter().fold(0u64, |m, &c| m | 1 << c))
}

/// A target's cores, and the initiators run in front of it (each on its cores).
type Session = (Vec<u32>, Vec<(Initiator, Vec<u32>)>);

/// The target sessions of a round.
fn plan(cores: usize) -> Vec<Session> {
    use Initiator::*;
    if cores >= 16 {
        let many: Vec<u32> = (8..16).collect();
        let both = vec![(UsnvmePerf, many.clone()), (SpdkPerf, many)];
        vec![
            (vec![0], both.clone()),
            ((0..4).collect(), both),
            (
                (0..8).collect(),
                vec![(UsnvmePerf, vec![8]), (SpdkPerf, vec![8])],
            ),
        ]
    } else {
        vec![(vec![0], vec![(UsnvmePerf, vec![1]), (SpdkPerf, vec![1])])]
    }
}

/// Rounds of a run: 1 with `--quick`; 3 on a machine of 16 cores or more, 5 on a smaller
/// one (its two sides share two cores with whatever else runs there, so pairs vary more).
pub fn rounds(quick: bool) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match (quick, cores >= 16) {
        (true, _) => 1,
        (false, true) => 3,
        (false, false) => 5,
    }
}

/// A running target.
struct Running {
    child: Child,
    target: Target,
    rpc_socket: PathBuf,
}

pub fn run(usnvme: &Path, spdk: &Spdk, seconds: u32, rounds: u32) -> Result<NativeResults> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        bail!("the native fabric bench needs 2 cores at least (a target's and an initiator's)");
    }
    let work = crate::target_dir().join("bench-native");
    std::fs::create_dir_all(&work)?;
    let spdk_memory = spdk.memory.clone();
    let mut cases: Vec<Case> = Vec::new();
    let mut target_commands = Vec::new();
    for round in 0..rounds {
        for (target_cores, initiators) in plan(cores) {
            let mut order = [Target::Serve, Target::NvmfTgt];
            if round % 2 == 1 {
                order.reverse();
            }
            for target in order {
                println!(
                    "bench: round {}/{rounds}: {} on cores {}",
                    round + 1,
                    target.name(),
                    list(&target_cores)
                );
                let (running, command) = start(target, &target_cores, usnvme, spdk, &work)?;
                if round == 0 {
                    target_commands.push(command);
                }
                let mut initiators = initiators.clone();
                if round % 2 == 1 {
                    initiators.reverse();
                }
                // the two initiators back to back at each QD, their order alternating
                for qd in [32, 1] {
                    for (initiator, initiator_cores) in &initiators {
                        let (command, result) = measure(
                            *initiator,
                            initiator_cores,
                            target,
                            qd,
                            seconds,
                            usnvme,
                            spdk,
                            &work,
                        );
                        let at = cases.iter().position(|c| {
                            c.target == target
                                && c.target_cores == target_cores
                                && c.initiator == *initiator
                                && c.initiator_cores == *initiator_cores
                                && c.qd == qd
                        });
                        let case = match at {
                            Some(i) => &mut cases[i],
                            None => {
                                cases.push(Case {
                                    target,
                                    target_cores: target_cores.clone(),
                                    initiator: *initiator,
                                    initiator_cores: initiator_cores.clone(),
                                    qd,
                                    iops: Vec::new(),
                                    error: None,
                                    command,
                                });
                                cases.last_mut().expect("just pushed")
                            }
                        };
                        match result {
                            Ok(iops) => case.iops.push(iops),
                            Err(e) => {
                                println!("bench:   {e}");
                                case.error.get_or_insert(e);
                            }
                        }
                    }
                }
                stop(running, spdk);
            }
        }
    }
    let mut costs = Vec::new();
    let mut split = None;
    // on one initiator core, in front of the target on the most cores (it keeps up best)
    if let Some((target_cores, initiators)) = plan(cores)
        .into_iter()
        .rfind(|(_, i)| i.iter().all(|(_, c)| c.len() == 1))
    {
        for target in [Target::Serve, Target::NvmfTgt] {
            println!(
                "bench: cost per I/O: {} on cores {}",
                target.name(),
                list(&target_cores)
            );
            let (running, _) = start(target, &target_cores, usnvme, spdk, &work)?;
            for (initiator, initiator_cores) in &initiators {
                for qd in [32, 1] {
                    let run = |ios| {
                        initiator_command(
                            *initiator,
                            initiator_cores,
                            target,
                            qd,
                            Length::Ios(ios),
                            usnvme,
                            spdk,
                        )
                    };
                    let cost = Cost {
                        target,
                        initiator: *initiator,
                        qd,
                        syscalls: syscalls_per_io(run, &work),
                        instructions: instructions_per_io(run, &work),
                    };
                    // where ours go, in front of SPDK's target (its runs' profiles are there)
                    let split_this = target == Target::NvmfTgt
                        && *initiator == Initiator::UsnvmePerf
                        && qd == 32;
                    if split_this && cost.instructions.is_ok() {
                        split = Some(instruction_split(&work));
                    }
                    costs.push(cost);
                }
            }
            stop(running, spdk);
        }
    }
    Ok(NativeResults {
        cases,
        seconds,
        rounds,
        spdk_memory,
        target_commands,
        costs,
        split,
    })
}

/// `spdk_nvme_perf`'s memory flags on this machine (see [`perf_memory_flags`]).
fn spdk_perf_memory(spdk: &Spdk) -> Result<String> {
    let free_pages = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("HugePages_Free:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let hugetlbfs = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
    });
    // its usage text lists the options it takes (`-h` prints it)
    let usage = spdk.command(&spdk.perf).arg("-h").output();
    let takes_no_huge = usage.is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout).contains("--no-huge")
            || String::from_utf8_lossy(&o.stderr).contains("--no-huge")
    });
    perf_memory_flags(free_pages, hugetlbfs, takes_no_huge)
        .map_err(|why| anyhow::anyhow!("--spdk-perf {}: {why}", spdk.perf.display()))
}

/// `spdk_nvme_perf`'s memory flags: hugepages where 1 GiB of them is free on a mounted
/// hugetlbfs, else `--no-huge` where the perf takes it (SPDK v24.01 on); else, before any run,
/// what to do (an SPDK v23.01 perf without hugepages fails every run).
fn perf_memory_flags(
    free_pages: u64,
    hugetlbfs: bool,
    takes_no_huge: bool,
) -> Result<String, String> {
    if free_pages >= 512 && hugetlbfs {
        return Ok("-s 1024 --iova-mode va".into());
    }
    if takes_no_huge {
        return Ok("--no-huge -s 1024 --iova-mode va".into());
    }
    Err(format!(
        "this spdk_nvme_perf takes no --no-huge (SPDK before v24.01), so it needs 1 GiB of free \
         hugepages on a mounted hugetlbfs; this machine has {free_pages} free 2 MiB pages{}: \
         echo 768 > /proc/sys/vm/nr_hugepages; mount -t hugetlbfs nodev /dev/hugepages",
        if hugetlbfs {
            ""
        } else {
            " and no hugetlbfs mounted"
        }
    ))
}

fn start(
    target: Target,
    cores: &[u32],
    usnvme: &Path,
    spdk: &Spdk,
    work: &Path,
) -> Result<(Running, String)> {
    let rpc_socket = work.join("spdk.sock");
    match target {
        Target::Serve => {
            let devices = format!("sim:0-{}", NAMESPACES - 1);
            let (child, command) = start_serve(usnvme, &devices, cores)?;
            let running = Running {
                child,
                target,
                rpc_socket,
            };
            Ok((running, command))
        }
        Target::NvmfTgt => {
            let _ = std::fs::remove_file(&rpc_socket);
            let args = [
                "-m".to_string(),
                mask(cores),
                "-s".into(),
                "4096".into(),
                "-u".into(),
                "--iova-mode".into(),
                "va".into(),
                "--env-context=--no-huge --legacy-mem".into(),
                "-r".into(),
                rpc_socket.display().to_string(),
            ];
            let child = spdk
                .command(&spdk.target)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("nvmf_tgt")?;
            let running = Running {
                child,
                target,
                rpc_socket: rpc_socket.clone(),
            };
            let since = Instant::now();
            while !rpc_socket.exists() && since.elapsed() < START_LIMIT {
                std::thread::sleep(Duration::from_millis(100));
            }
            let sock = rpc_socket.display().to_string();
            let mut setup: Vec<Vec<String>> = vec![
                vec!["framework_wait_init".into()],
                vec!["nvmf_create_transport".into(), "-t".into(), "TCP".into()],
            ];
            for i in 0..NAMESPACES {
                setup.push(
                    ["bdev_null_create", &format!("Null{i}"), "1024", "512"]
                        .map(String::from)
                        .to_vec(),
                );
            }
            setup.push(
                [
                    "nvmf_create_subsystem",
                    SPDK_NQN,
                    "-a",
                    "-s",
                    "SPDK0001",
                    "-m",
                    "32",
                ]
                .map(String::from)
                .to_vec(),
            );
            for i in 0..NAMESPACES {
                setup.push(
                    ["nvmf_subsystem_add_ns", SPDK_NQN, &format!("Null{i}")]
                        .map(String::from)
                        .to_vec(),
                );
            }
            setup.push(
                [
                    "nvmf_subsystem_add_listener",
                    SPDK_NQN,
                    "-t",
                    "tcp",
                    "-a",
                    "127.0.0.1",
                    "-s",
                    &SPDK_PORT.to_string(),
                ]
                .map(String::from)
                .to_vec(),
            );
            let mut described = format!(
                "nvmf_tgt -m {} -s 4096 -u --iova-mode va --env-context=\"--no-huge --legacy-mem\"; then rpc.py:",
                mask(cores)
            );
            for call in &setup {
                let ok = Command::new("python3")
                    .arg(&spdk.rpc)
                    .args(["-s", &sock, "-t", "60"])
                    .args(call)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    stop(running, spdk);
                    bail!("nvmf_tgt: rpc.py {} failed", call.join(" "));
                }
                if call[0] != "framework_wait_init" {
                    write!(described, " `{}`;", call.join(" "))?;
                }
            }
            Ok((running, described))
        }
    }
}

fn stop(mut running: Running, spdk: &Spdk) {
    match running.target {
        Target::Serve => stop_serve(running.child),
        Target::NvmfTgt => {
            let _ = Command::new("python3")
                .arg(&spdk.rpc)
                .args(["-s", &running.rpc_socket.display().to_string()])
                .args(["spdk_kill_instance", "SIGTERM"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            wait_or_kill(&mut running.child);
        }
    }
}

/// How long an initiator runs.
#[derive(Debug, Clone, Copy)]
enum Length {
    Seconds(u32),
    /// This many I/Os per namespace.
    Ios(u64),
}

/// An initiator's command on `cores` in front of `target` at `qd`, for `length`.
fn initiator_command(
    initiator: Initiator,
    cores: &[u32],
    target: Target,
    qd: u32,
    length: Length,
    usnvme: &Path,
    spdk: &Spdk,
) -> Command {
    let (port, nqn) = match target {
        Target::Serve => (SERVE_PORT, SERVE_NQN),
        Target::NvmfTgt => (SPDK_PORT, SPDK_NQN),
    };
    let (seconds, ios) = match length {
        Length::Seconds(s) => (s, None),
        Length::Ios(n) => (3600, Some(n)),
    };
    match initiator {
        Initiator::UsnvmePerf => {
            let mut c = Command::new(usnvme);
            c.args(["perf", "-r", &format!("tcp://127.0.0.1:{port}/{nqn}")])
                .args(["-c", &list(cores), "-q", &qd.to_string()])
                .args(["-o", "4k", "-w", "randread", "-t", &seconds.to_string()]);
            if let Some(n) = ios {
                c.args(["--io-count", &n.to_string()]);
            }
            c
        }
        Initiator::SpdkPerf => {
            let mut c = spdk.command(&spdk.perf);
            c.arg("-r")
                .arg(format!(
                    "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"
                ))
                .args(["-q", &qd.to_string(), "-o", "4096", "-w", "randread"])
                .args(["-t", &seconds.to_string(), "-c", &mask(cores)])
                .args(spdk.memory.split_whitespace());
            if let Some(n) = ios {
                c.args(["-d", &n.to_string()]);
            }
            c
        }
    }
}

/// `wrapper` (timeout, perf stat, valgrind) running `program`: its arguments and environment
/// after the wrapper's own.
fn under(mut wrapper: Command, program: &Command) -> Command {
    wrapper
        .arg(program.get_program())
        .args(program.get_args())
        .envs(program.get_envs().filter_map(|(k, v)| Some((k, v?))));
    wrapper
}

/// A command as a shell line (the SPDK transport ID quoted).
fn shell_line(c: &Command) -> String {
    let name = Path::new(c.get_program())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let args: Vec<String> = c
        .get_args()
        .map(|a| {
            let a = a.to_string_lossy();
            if a.contains(' ') {
                format!("'{a}'")
            } else {
                a.into_owned()
            }
        })
        .collect();
    format!("{name} {}", args.join(" "))
}

/// One initiator run: its command line, and its IOPS or why there are none.
#[allow(clippy::too_many_arguments)]
fn measure(
    initiator: Initiator,
    cores: &[u32],
    target: Target,
    qd: u32,
    seconds: u32,
    usnvme: &Path,
    spdk: &Spdk,
    work: &Path,
) -> (String, std::result::Result<f64, String>) {
    let command = initiator_command(
        initiator,
        cores,
        target,
        qd,
        Length::Seconds(seconds),
        usnvme,
        spdk,
    );
    let line = shell_line(&command);
    match initiator {
        Initiator::UsnvmePerf => {
            let args: Vec<String> = command
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let result = usnvme_perf(usnvme, &args, &work.join("perf.json"), seconds);
            (line, result)
        }
        Initiator::SpdkPerf => {
            let mut timed = Command::new("timeout");
            timed.arg((seconds + 60).to_string());
            let result = match under(timed, &command).output() {
                Ok(o) => {
                    let text = String::from_utf8_lossy(&o.stdout);
                    spdk_figures(&text).map(|f| f.iops).ok_or_else(|| {
                        first_error(&String::from_utf8_lossy(&o.stderr)).replace("no output", &text)
                    })
                }
                Err(e) => Err(e.to_string()),
            };
            (line, result)
        }
    }
}

/// I/Os per namespace of the run whose system calls are counted.
const COST_IOS: u64 = 100_000;
/// The same under callgrind (about 50 times slower).
const CALLGRIND_IOS: u64 = 5_000;

/// Where a syscall's count goes.
type Field = fn(&mut Syscalls) -> &mut f64;

/// The syscall tracepoints counted: (event, what it does).
const SYSCALLS: &[(&str, Field)] = &[
    ("raw_syscalls:sys_enter", |s| &mut s.total),
    ("syscalls:sys_enter_readv", |s| &mut s.receive),
    ("syscalls:sys_enter_recvmsg", |s| &mut s.receive),
    ("syscalls:sys_enter_recvfrom", |s| &mut s.receive),
    ("syscalls:sys_enter_read", |s| &mut s.receive),
    ("syscalls:sys_enter_writev", |s| &mut s.send),
    ("syscalls:sys_enter_sendmsg", |s| &mut s.send),
    ("syscalls:sys_enter_sendto", |s| &mut s.send),
    ("syscalls:sys_enter_write", |s| &mut s.send),
    ("syscalls:sys_enter_epoll_wait", |s| &mut s.wait),
    ("syscalls:sys_enter_epoll_pwait", |s| &mut s.wait),
    ("syscalls:sys_enter_poll", |s| &mut s.wait),
    ("syscalls:sys_enter_ppoll", |s| &mut s.wait),
];

/// System calls per I/O of the run `run(ios)` makes of [`COST_IOS`] I/Os per namespace,
/// counted by `perf stat` (its set-up included: a few hundred calls, under 0.001 per I/O; not
/// the difference of two runs, which the turns that wait make unsteady: they count as many as
/// the initiator waits on the target).
fn syscalls_per_io(
    run: impl Fn(u64) -> Command,
    work: &Path,
) -> std::result::Result<Syscalls, String> {
    let events: Vec<&str> = SYSCALLS.iter().map(|(e, _)| *e).collect();
    let out = work.join("perf-stat.csv");
    let program = run(COST_IOS);
    let mut perf = Command::new("perf");
    perf.args(["stat", "-x", ",", "-e", &events.join(","), "-o"])
        .arg(&out)
        .arg("--");
    let status = under(perf, &program)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("perf stat: {e} (apt-get install linux-perf)"))?;
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    if !status.success() {
        return Err(format!(
            "perf stat {}: {}",
            shell_line(&program),
            first_error(&text)
        ));
    }
    let counts = parse_perf_stat(&text)?;
    let ios = (COST_IOS * u64::from(NAMESPACES)) as f64;
    let mut per_io = Syscalls::default();
    for ((_, field), count) in SYSCALLS.iter().zip(counts) {
        *field(&mut per_io) += count / ios;
    }
    Ok(per_io)
}

/// The counts of `perf stat -x ,` output, in [`SYSCALLS`] order.
fn parse_perf_stat(text: &str) -> std::result::Result<Vec<f64>, String> {
    SYSCALLS
        .iter()
        .map(|(event, _)| {
            text.lines()
                .map(|l| l.split(',').collect::<Vec<_>>())
                .find(|f| f.get(2) == Some(event))
                .and_then(|f| f[0].parse::<f64>().ok())
                .ok_or_else(|| format!("perf stat counted no {event} (are tracepoints readable?)"))
        })
        .collect()
}

/// User-space instructions per I/O of the runs `run(ios)` makes (callgrind, [`CALLGRIND_IOS`]
/// and twice as many I/Os per namespace; the difference over the I/Os).
fn instructions_per_io(
    run: impl Fn(u64) -> Command,
    work: &Path,
) -> std::result::Result<f64, String> {
    let mut totals = Vec::new();
    for ios in [CALLGRIND_IOS, 2 * CALLGRIND_IOS] {
        let program = run(ios);
        let mut valgrind = Command::new("valgrind");
        valgrind
            .args(["--tool=callgrind", "--dump-instr=no"])
            .arg(format!(
                "--callgrind-out-file={}",
                work.join(format!("callgrind.initiator.{ios}")).display()
            ));
        let out = under(valgrind, &program)
            .stdout(Stdio::null())
            .output()
            .map_err(|e| format!("valgrind: {e} (apt-get install valgrind)"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let total = log
            .lines()
            .find_map(|l| l.split("Collected : ").nth(1))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .ok_or_else(|| format!("callgrind {}: {}", shell_line(&program), first_error(&log)))?;
        totals.push(total);
    }
    Ok((totals[1] - totals[0]) / (CALLGRIND_IOS * u64::from(NAMESPACES)) as f64)
}

/// The parts of an NVMe/TCP read on the host, by the source file of each instruction (inlined
/// code keeps its own): the first part whose pattern the file (or, outside our code, the
/// function) contains.
const PARTS: &[(&str, &[&str])] = &[
    (
        "receive: PDUs read, headers checked, data placed (framing, session)",
        &["fabric/framing/receive.rs", "initiator/session/receive.rs"],
    ),
    (
        "submit: capsules built and gathered for `writev` (session, framing)",
        &["initiator/session/submit.rs", "fabric/framing/transmit.rs"],
    ),
    ("completion (session)", &["initiator/session/complete.rs"]),
    ("PDU headers parsed and built", &["fabric/pdu.rs"]),
    (
        "queue poll, paths, readiness watch",
        &[
            "initiator/queue.rs",
            "initiator/readiness.rs",
            "tcp/queues.rs",
        ],
    ),
    (
        "memcpy: read data into its DMA buffer (one copy)",
        &["memmove", "memcpy"],
    ),
    ("engine: channels, shared queues, reactor", &["engine/src/"]),
    ("perf's workload", &["tools/src/"]),
    ("vm-memory: IOVA to buffer", &["vm_memory::", "vm-memory"]),
    ("libc: system call wrappers", &["libc", "sysdeps", "nptl"]),
];

/// The index in [`PARTS`] of an instruction of `symbol` from source `file` (`PARTS.len()`:
/// the rest).
fn part_of(file: &str, symbol: &str) -> usize {
    PARTS
        .iter()
        .position(|(_, patterns)| {
            patterns
                .iter()
                .any(|p| file.contains(p) || symbol.contains(p))
        })
        .unwrap_or(PARTS.len())
}

/// Where the instructions of the last [`instructions_per_io`] go, per I/O, by [`PARTS`] (the
/// rest: standard library and dependency code inlined into ours).
fn instruction_split(work: &Path) -> std::result::Result<Vec<(&'static str, f64)>, String> {
    let mut profiles = Vec::new();
    for ios in [CALLGRIND_IOS, 2 * CALLGRIND_IOS] {
        let out = Command::new("callgrind_annotate")
            .args([
                "--inclusive=no",
                "--tree=caller",
                "--auto=no",
                "--threshold=100",
            ])
            .arg(work.join(format!("callgrind.initiator.{ios}")))
            .output()
            .map_err(|e| format!("callgrind_annotate: {e}"))?;
        profiles.push(super::host::parse_profile(&String::from_utf8_lossy(
            &out.stdout,
        )));
    }
    let ios = (CALLGRIND_IOS * u64::from(NAMESPACES)) as f64;
    let mut parts: Vec<(&'static str, f64)> = PARTS.iter().map(|(p, _)| (*p, 0.0)).collect();
    parts.push(("rest: standard library and dependencies inlined", 0.0));
    for (sign, profile) in [(-1.0, &profiles[0]), (1.0, &profiles[1])] {
        for e in &profile.entries {
            parts[part_of(&e.file, &e.symbol)].1 += sign * e.cost as f64 / ios;
        }
    }
    Ok(parts)
}

/// `usnvme serve` exporting `devices` on `cores` (polling, any host) at [`serve_address`],
/// once it listens; its command line.
pub(super) fn start_serve(usnvme: &Path, devices: &str, cores: &[u32]) -> Result<(Child, String)> {
    let listen = format!("127.0.0.1:{SERVE_PORT}");
    let args = [
        "serve",
        "-r",
        devices,
        "-c",
        &list(cores),
        "--idle",
        "poll",
        "--allow-any-host",
        "--nqn",
        SERVE_NQN,
        "--listen",
        &listen,
    ];
    let mut child = Command::new(usnvme)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("usnvme serve")?;
    let stdout = child.stdout.take().context("serve's output")?;
    // it says which hosts may connect once it listens
    let listening = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("hosts:"));
    if !listening {
        stop_serve(child);
        bail!(
            "usnvme serve did not start (run `usnvme {}`)",
            args.join(" ")
        );
    }
    Ok((child, format!("usnvme {}", args.join(" "))))
}

/// The subsystem [`start_serve`] exports.
pub(super) fn serve_address() -> String {
    format!("tcp://127.0.0.1:{SERVE_PORT}/{SERVE_NQN}")
}

/// Stops a target `usnvme serve` (SIGINT; killed after 10 s).
pub(super) fn stop_serve(mut child: Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    wait_or_kill(&mut child);
}

fn wait_or_kill(child: &mut Child) {
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(10) {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `usnvme ARGS --json JSON` (at most `seconds` + 60 s): its IOPS, or why there are none.
pub(super) fn usnvme_perf(
    usnvme: &Path,
    args: &[String],
    json: &Path,
    seconds: u32,
) -> std::result::Result<f64, String> {
    let _ = std::fs::remove_file(json);
    let out = Command::new("timeout")
        .arg((seconds + 60).to_string())
        .arg(usnvme)
        .args(args)
        .arg("--json")
        .arg(json)
        .output();
    let figures = std::fs::read_to_string(json)
        .ok()
        .and_then(|j| usnvme_figures(&j));
    match (figures, out) {
        (Some(f), _) => Ok(f.iops),
        (None, Ok(o)) => Err(first_error(&String::from_utf8_lossy(&o.stderr))),
        (None, Err(e)) => Err(e.to_string()),
    }
}

fn fmt_iops(v: Option<f64>) -> String {
    v.map_or("-".into(), |i| format!("{:.0} k", i / 1e3))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

/// The section's heading.
pub const HEADING: &str = "NVMe/TCP natively: serve against nvmf_tgt, perf against spdk_nvme_perf";

/// The median IOPS of `initiator` on `ic` in front of `target` on `tc` at `qd`.
fn median_iops(
    r: &NativeResults,
    target: Target,
    tc: &[u32],
    initiator: Initiator,
    ic: &[u32],
    qd: u32,
) -> Option<f64> {
    r.cases
        .iter()
        .find(|c| {
            c.target == target
                && c.target_cores == tc
                && c.initiator == initiator
                && c.initiator_cores == ic
                && c.qd == qd
        })
        .and_then(|c| median(c.iops.clone()))
}

/// The median of the rounds' ratios of `usnvme perf` to `spdk_nvme_perf` on `ic` in front of
/// `target` on `tc` at `qd` (each round runs the two back to back); only where every round of
/// both gave figures.
fn paired_ratio(r: &NativeResults, target: Target, tc: &[u32], ic: &[u32], qd: u32) -> Option<f64> {
    let rounds = |initiator| {
        r.cases.iter().find(|c| {
            c.target == target
                && c.target_cores == tc
                && c.initiator == initiator
                && c.initiator_cores == ic
                && c.qd == qd
        })
    };
    let (ours, theirs) = (rounds(Initiator::UsnvmePerf)?, rounds(Initiator::SpdkPerf)?);
    if ours.iops.len() != theirs.iops.len() {
        return None;
    }
    median(
        ours.iops
            .iter()
            .zip(&theirs.iops)
            .map(|(a, b)| a / b)
            .collect(),
    )
}

/// The section's headline figures at QD 32: the targets on their fewest cores with `usnvme
/// perf` in front, and the initiators on one core in front of nvmf_tgt.
fn headlines(h: &mut Headlines, r: &NativeResults) {
    let command = h.rerun(Section::FabricNative);
    let serve = r
        .cases
        .iter()
        .find(|c| c.target == Target::Serve && c.initiator == Initiator::UsnvmePerf && c.qd == 32);
    if let Some(c) = serve {
        let (tc, ic) = (&c.target_cores, &c.initiator_cores);
        h.add(
            HEADING,
            format!(
                "`usnvme serve` ÷ `nvmf_tgt`, IOPS, target on core(s) {}, `usnvme perf` on {} in \
                 front, 4 KiB randread QD 32 per namespace (loopback, no VM; medians)",
                list(tc),
                list(ic)
            ),
            versus(
                median(c.iops.clone()),
                median_iops(r, Target::NvmfTgt, tc, c.initiator, ic, 32),
            ),
            command.clone(),
        );
    }
    let perf = r.cases.iter().find(|c| {
        c.target == Target::NvmfTgt
            && c.initiator == Initiator::SpdkPerf
            && c.initiator_cores.len() == 1
            && c.qd == 32
    });
    if let Some(c) = perf {
        let (tc, ic) = (&c.target_cores, &c.initiator_cores);
        h.add(
            HEADING,
            format!(
                "`usnvme perf` ÷ `spdk_nvme_perf`, IOPS on core {} in front of `nvmf_tgt` on {}, \
                 4 KiB randread QD 32 per namespace (loopback, no VM; the median of the rounds' \
                 ratios, the two back to back in each; medians of the IOPS in brackets)",
                list(ic),
                list(tc)
            ),
            match (
                paired_ratio(r, c.target, tc, ic, 32),
                median_iops(r, c.target, tc, Initiator::UsnvmePerf, ic, 32),
                median(c.iops.clone()),
            ) {
                (Some(p), Some(us), Some(them)) => format!(
                    "{p:.2} × (medians {:.1} k against {:.1} k IOPS)",
                    us / 1e3,
                    them / 1e3
                ),
                _ => super::MISSING.into(),
            },
            command,
        );
    }
}

/// What the initiators cost per I/O on their core.
fn costs_table(m: &mut String, r: &NativeResults) -> Result<()> {
    if r.costs.is_empty() {
        return Ok(());
    }
    writeln!(
        m,
        "\n**Initiators' cost per I/O** (one core; 4 KiB random reads; system calls counted by \
         `perf stat` on the syscall tracepoints over a run of {COST_IOS} I/Os per namespace, \
         user-space instructions by callgrind: the difference of a run of {CALLGRIND_IOS} and \
         one of twice as many I/Os per namespace, over the I/Os. *Receive*: `readv`, \
         `recvmsg`, `recvfrom`, `read`; *send*: `writev`, `sendmsg`, `sendto`, `write`: the \
         work. *Readiness*: `epoll_wait`, `poll` and kin, one per turn of a polling loop, \
         counted also in the turns that find nothing: as many per I/O as the initiator waits on \
         its target, so they say how busy the target was as much as what the initiator costs)\n\n| target | QD | initiator | system calls / I/O | receive | send | readiness \
         | instructions / I/O |\n|---|---:|---|---:|---:|---:|---:|---:|"
    )?;
    let mut failures = Vec::new();
    for c in &r.costs {
        let calls = |f: fn(&Syscalls) -> f64| {
            c.syscalls
                .as_ref()
                .map_or("-".to_string(), |s| format!("{:.2}", f(s)))
        };
        writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            c.target.name(),
            c.qd,
            c.initiator.name(),
            calls(|s| s.total),
            calls(|s| s.receive),
            calls(|s| s.send),
            calls(|s| s.wait),
            c.instructions
                .as_ref()
                .map_or("-".to_string(), |i| format!("{i:.0}")),
        )?;
        for e in [c.syscalls.as_ref().err(), c.instructions.as_ref().err()]
            .into_iter()
            .flatten()
        {
            failures.push(format!("{} at QD {}: {e}", c.initiator.name(), c.qd));
        }
    }
    for f in failures {
        writeln!(m, "\n- not measured: {f}")?;
    }
    match &r.split {
        Some(Ok(parts)) => {
            writeln!(
                m,
                "\n**Where `usnvme perf`'s instructions go** in front of nvmf_tgt at QD 32 (the \
                 same two callgrind runs, each instruction charged by the source file it comes \
                 from, inlined code keeping its own, as the PCIe split above does by crate)\n\n\
                 | part | instructions / I/O |\n|---|---:|"
            )?;
            for (part, per_io) in parts {
                writeln!(m, "| {part} | {per_io:.0} |")?;
            }
            let total: f64 = parts.iter().map(|(_, v)| v).sum();
            writeln!(m, "| **total** | **{total:.0}** |")?;
        }
        Some(Err(e)) => writeln!(m, "\n- no split of the instructions: {e}")?,
        None => {}
    }
    Ok(())
}

/// The report's section.
pub fn section(
    m: &mut String,
    results: Option<&NativeResults>,
    why_not: &str,
    h: &mut Headlines,
) -> Result<()> {
    writeln!(m, "\n## {HEADING}\n")?;
    let Some(r) = results else {
        writeln!(
            m,
            "Not run ({why_not}; it needs `--spdk-target PATH/nvmf_tgt --spdk-perf \
             PATH/spdk_nvme_perf`)."
        )?;
        return Ok(());
    };
    writeln!(
        m,
        "Over loopback on this machine, no VM. Both targets export {NAMESPACES} null namespaces \
         of 1 GiB in 512-byte blocks (`sim:` null drives behind serve, null bdevs behind \
         nvmf_tgt); 4 KiB random reads, QD per namespace, {} s per run, the median of {} rounds \
         (the two sides of each comparison in alternating order). `spdk_nvme_perf` memory: `{}`. \
         Per core: the IOPS divided by the cores of the side compared.\n",
        r.seconds, r.rounds, r.spdk_memory
    )?;
    headlines(h, r);
    // Targets compared: the same initiator in front of each.
    for initiator in [Initiator::UsnvmePerf, Initiator::SpdkPerf] {
        let rows: Vec<&Case> = r
            .cases
            .iter()
            .filter(|c| c.initiator == initiator && c.target == Target::Serve)
            .collect();
        if rows.is_empty() {
            continue;
        }
        writeln!(
            m,
            "**Targets** (initiator: `{}`)\n\n| target cores | initiator cores | QD | serve IOPS \
             | nvmf_tgt IOPS | serve per core | nvmf_tgt per core | serve / nvmf_tgt |\n\
             |---|---|---:|---:|---:|---:|---:|---:|",
            initiator.name()
        )?;
        for c in rows {
            let (tc, ic) = (&c.target_cores, &c.initiator_cores);
            let us = median(c.iops.clone());
            let them = median_iops(r, Target::NvmfTgt, tc, initiator, ic, c.qd);
            let n = tc.len() as f64;
            writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                list(tc),
                list(ic),
                c.qd,
                fmt_iops(us),
                fmt_iops(them),
                fmt_iops(us.map(|v| v / n)),
                fmt_iops(them.map(|v| v / n)),
                ratio(us, them)
            )?;
        }
        writeln!(m)?;
    }
    // Initiators compared: each in front of the same target, on one core.
    let single: Vec<&Case> = r
        .cases
        .iter()
        .filter(|c| c.initiator == Initiator::SpdkPerf && c.initiator_cores.len() == 1)
        .collect();
    if !single.is_empty() {
        writeln!(
            m,
            "**Initiators** (one core each; each round runs the two back to back, so the median \
             of the rounds' ratios is the steadier figure on a shared machine)\n\n| target \
             (cores) | initiator core | QD | usnvme perf IOPS | spdk_nvme_perf IOPS | usnvme perf \
             / spdk_nvme_perf | median of the rounds' ratios |\n|---|---|---:|---:|---:|---:|---:|"
        )?;
        for c in single {
            let us = median_iops(
                r,
                c.target,
                &c.target_cores,
                Initiator::UsnvmePerf,
                &c.initiator_cores,
                c.qd,
            );
            let them = median(c.iops.clone());
            let paired = paired_ratio(r, c.target, &c.target_cores, &c.initiator_cores, c.qd);
            writeln!(
                m,
                "| {} ({}) | {} | {} | {} | {} | {} | {} |",
                c.target.name(),
                list(&c.target_cores),
                list(&c.initiator_cores),
                c.qd,
                fmt_iops(us),
                fmt_iops(them),
                ratio(us, them),
                paired.map_or("-".into(), |p| format!("{p:.2}"))
            )?;
        }
    }
    costs_table(m, r)?;
    let errors: Vec<&Case> = r.cases.iter().filter(|c| c.error.is_some()).collect();
    if !errors.is_empty() {
        writeln!(m, "\nRuns without figures:\n")?;
        for c in errors {
            writeln!(
                m,
                "- {} on {} in front of {}: {}",
                c.initiator.name(),
                list(&c.initiator_cores),
                c.target.name(),
                c.error.as_deref().unwrap_or("")
            )?;
        }
    }
    writeln!(m, "\nCommands (one of each):\n")?;
    for c in &r.target_commands {
        writeln!(m, "- `{}`", c.replace('`', "'"))?;
    }
    let mut commands: Vec<&str> = r.cases.iter().map(|c| c.command.as_str()).collect();
    commands.dedup();
    for c in commands {
        writeln!(m, "- `{c}`")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdk_perf_gets_hugepages_or_no_huge_or_the_fix_before_any_run() {
        assert_eq!(
            perf_memory_flags(768, true, false).as_deref(),
            Ok("-s 1024 --iova-mode va")
        );
        assert_eq!(
            perf_memory_flags(768, false, true).as_deref(),
            Ok("--no-huge -s 1024 --iova-mode va"),
            "pages but no hugetlbfs: without them"
        );
        let why = perf_memory_flags(768, false, false).expect_err("v23.01 without hugetlbfs");
        assert!(why.contains("no hugetlbfs mounted"), "{why}");
        assert!(why.contains("mount -t hugetlbfs"), "{why}");
        let why = perf_memory_flags(0, true, false).expect_err("no free pages");
        assert!(why.contains("0 free 2 MiB pages:"), "{why}");
        assert!(why.contains("nr_hugepages"), "{why}");
    }

    #[test]
    fn the_headlines_compare_targets_and_initiators_at_qd_32() {
        use Initiator::{SpdkPerf, UsnvmePerf};
        use Target::{NvmfTgt, Serve};
        let case = |target, initiator, iops| Case {
            target,
            target_cores: vec![0],
            initiator,
            initiator_cores: vec![1],
            qd: 32,
            iops: vec![iops],
            error: None,
            command: String::new(),
        };
        let r = NativeResults {
            cases: vec![
                case(Serve, UsnvmePerf, 120_000.0),
                case(Serve, SpdkPerf, 100_000.0),
                case(NvmfTgt, UsnvmePerf, 100_000.0),
                case(NvmfTgt, SpdkPerf, 80_000.0),
            ],
            seconds: 3,
            rounds: 1,
            spdk_memory: "--no-huge".into(),
            target_commands: vec![],
            costs: vec![],
            split: None,
        };
        let mut h = Headlines::new(String::new());
        section(&mut String::new(), Some(&r), "", &mut h).expect("section");
        let t = h.table();
        assert!(
            t.contains(
                "| `usnvme serve` ÷ `nvmf_tgt`, IOPS, target on core(s) 0, `usnvme perf` on 1 in \
                 front, 4 KiB randread QD 32 per namespace (loopback, no VM; medians) | 1.20 × \
                 (120.0 k against 100.0 k IOPS) | `cargo xtask bench --only fabric-native` |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| `usnvme perf` ÷ `spdk_nvme_perf`, IOPS on core 1 in front of `nvmf_tgt` on 0, \
                 4 KiB randread QD 32 per namespace (loopback, no VM; the median of the rounds' \
                 ratios, the two back to back in each; medians of the IOPS in brackets) | 1.25 × \
                 (medians 100.0 k against 80.0 k IOPS) |"
            ),
            "{t}"
        );
    }

    #[test]
    fn perf_stat_counts_are_read_by_event_and_a_missing_one_is_named() {
        let mut text = String::from("# started on Sat Dec  5\n\n");
        for (i, (event, _)) in SYSCALLS.iter().enumerate() {
            text.push_str(&format!("{},,{event},2955765006,100.00,,\n", i * 10));
        }
        let counts = parse_perf_stat(&text).expect("every event");
        assert_eq!(counts.len(), SYSCALLS.len());
        assert_eq!(counts[1], 10.0, "readv");
        let without_poll = text.replace("syscalls:sys_enter_poll,", "x,");
        let why = parse_perf_stat(&without_poll).expect_err("poll missing");
        assert!(why.contains("syscalls:sys_enter_poll"), "{why}");
    }

    #[test]
    fn the_cost_table_has_a_row_per_initiator_and_says_what_was_not_measured() {
        let cost = |initiator, syscalls, instructions| Cost {
            target: Target::NvmfTgt,
            initiator,
            qd: 32,
            syscalls,
            instructions,
        };
        let calls = Syscalls {
            total: 0.55,
            receive: 0.49,
            send: 0.06,
            wait: 0.0,
        };
        let r = NativeResults {
            cases: vec![],
            seconds: 3,
            rounds: 1,
            spdk_memory: String::new(),
            target_commands: vec![],
            split: Some(Ok(vec![("receive", 355.2), ("memcpy", 431.0)])),
            costs: vec![
                cost(Initiator::UsnvmePerf, Ok(calls), Ok(1902.4)),
                cost(
                    Initiator::SpdkPerf,
                    Err("perf stat: no such file".into()),
                    Ok(2622.0),
                ),
            ],
        };
        let mut m = String::new();
        costs_table(&mut m, &r).expect("table");
        assert!(
            m.contains("| nvmf_tgt | 32 | usnvme perf | 0.55 | 0.49 | 0.06 | 0.00 | 1902 |"),
            "{m}"
        );
        assert!(
            m.contains("| nvmf_tgt | 32 | spdk_nvme_perf | - | - | - | - | 2622 |"),
            "{m}"
        );
        assert!(
            m.contains("- not measured: spdk_nvme_perf at QD 32: perf stat: no such file"),
            "{m}"
        );
        assert!(
            m.contains("| receive | 355 |\n| memcpy | 431 |\n| **total** | **786** |"),
            "{m}"
        );
    }

    #[test]
    fn instructions_go_to_the_part_their_source_file_says() {
        let name = |file, symbol| PARTS.get(part_of(file, symbol)).map_or("rest", |p| p.0);
        assert!(name("engine/src/fabric/framing/receive.rs", "x").starts_with("receive"));
        assert!(name("engine/src/transport/tcp/queues.rs", "x").starts_with("queue poll"));
        assert!(name("engine/src/transport/queues.rs", "x").starts_with("engine"));
        let memmove = "./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S";
        assert!(name(memmove, "__memcpy_avx_unaligned_erms").starts_with("memcpy"));
        assert!(name("./nptl/cancellation.c", "__pthread_enable_asynccancel").starts_with("libc"));
        let slice = "/rustc/5980/library/core/src/slice/mod.rs";
        assert!(name(
            slice,
            "vm_memory::guest_memory::GuestMemoryBackend::to_region_addr"
        )
        .starts_with("vm-memory"));
        assert_eq!(name(slice, "usnvme_engine::block::Channel::poll"), "rest");
    }

    #[test]
    fn core_lists_and_masks_are_as_the_tools_take_them() {
        assert_eq!(list(&[0]), "0");
        assert_eq!(list(&[8, 9, 10, 11, 12, 13, 14, 15]), "8-15");
        assert_eq!(mask(&[0, 1, 2, 3]), "0xf");
        assert_eq!(mask(&[8]), "0x100");
    }

    #[test]
    fn a_small_machine_runs_one_target_core_in_front_of_one_initiator_core() {
        let small = plan(2);
        assert_eq!(small.len(), 1);
        assert_eq!(small[0].0, [0]);
        assert!(small[0].1.iter().all(|(_, c)| c == &[1]));
        let big = plan(16);
        let target_cores: Vec<usize> = big.iter().map(|(t, _)| t.len()).collect();
        assert_eq!(target_cores, [1, 4, 8]);
        assert!(big
            .iter()
            .flat_map(|(t, i)| i.iter().map(move |(_, c)| (t, c)))
            .all(|(t, c)| c.iter().all(|x| !t.contains(x))));
    }
}
