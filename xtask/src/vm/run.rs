//! `cargo xtask vm-run [options] -- PROGRAM [ARGS…]`: boot the guest, bind the NVMe controllers,
//! run PROGRAM in `chroot` of the host root, stream its output, exit with its exit code.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use super::hotplug::Hotplug;
use super::qemu::{self, Backend, KernelNvme, TcgThreads, VmConfig};
use super::watchdog::{self, IdleWatch, StuckWatch};
use super::{setup, vm_dir};
use crate::cmd::sh_quote;

/// Exit codes of vm-run itself (any other code is the program's).
pub const EXIT_HUNG: u8 = 122;
pub const EXIT_DMA_FAULT: u8 = 123;
pub const EXIT_TIMEOUT: u8 = 124;
pub const EXIT_VM_FAILED: u8 = 125;

#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Exit codes: the program's own; 122 the guest hung idle (--hang-after; QEMU \
killed); 123 DMA fault (unless --allow-dma-faults); 124 timeout (QEMU killed); 125 the guest never \
reported an exit code (kernel panic, QEMU error)."
)]
pub struct RunArgs {
    /// Emulated NVMe controllers, each behind its own PCIe root port.
    #[arg(long, default_value_t = 24)]
    pub drives: usize,
    /// Where the drives keep data: null (dropped, reads zeroes) or file (sparse images under target/).
    #[arg(long, value_enum, default_value_t = Backend::Null)]
    pub backend: Backend,
    /// Size of each drive, e.g. 1G or 512M.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub disk_size: u64,
    /// 512 or 4096, or a list spread over the drives in order (512,4096: first half 512).
    #[arg(long, default_value = "512", value_delimiter = ',')]
    pub logical_block_size: Vec<u32>,
    /// Leave the first K drives (all without K) on the kernel nvme driver.
    #[arg(long, value_name = "K", num_args = 0..=1, default_missing_value = "all")]
    pub kernel_nvme: Option<String>,
    /// Extra QEMU properties for every controller, e.g. mdts=2,max_ioqpairs=1.
    #[arg(long, value_name = "PROPS")]
    pub nvme_opts: Option<String>,
    /// A namespace of every controller (repeatable: NSIDs 1, 2, ... in order), as QEMU's
    /// nvme-ns: bs=512|4096, size=SIZE, ms=0|8|16|64, mset=0|1, pi=0-3, pil=0|1, pif=0|2,
    /// detached=0|1 (in the controller's NVM subsystem, attached to none); e.g.
    /// `--ns bs=512 --ns bs=4096,ms=8,pi=1`. Default: one namespace, the whole disk.
    #[arg(long = "ns", value_name = "SPEC")]
    pub namespaces: Vec<super::namespaces::NsSpec>,
    /// 2: a guest with two NUMA nodes, half the drives on each.
    #[arg(long, default_value_t = 1)]
    pub numa_nodes: usize,
    /// 2 MiB hugepages to reserve in the guest, as a size.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub hugepages: u64,
    /// Guest CPUs.
    #[arg(long, default_value_t = 2)]
    pub cpus: usize,
    /// How TCG runs the vCPUs: single (one host thread, the default: multi-threaded TCG loses
    /// interrupts and hangs the guest when the host is busy) or multi (a thread per vCPU).
    #[arg(long, value_enum, default_value_t = TcgThreads::Single, env = "USNVME_VM_TCG_THREADS")]
    pub tcg_threads: TcgThreads,
    /// Give the guest x2APIC (its EOI an MSR write, not xAPIC MMIO): issue 22's lead against
    /// multi-threaded TCG's lost interrupts.
    #[arg(long, env = "USNVME_VM_X2APIC", value_parser = clap::builder::BoolishValueParser::new())]
    pub x2apic: bool,
    /// Guest memory.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub mem: u64,
    /// Seconds before QEMU is killed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Seconds of an idle guest (QEMU using under 20 % of a core) after which it is taken for
    /// hung: its blocked tasks and CPUs are dumped on the console, then QEMU is killed. 0: never
    /// (a program may sleep that long).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    pub hang_after: u64,
    /// A QMP socket, e.g. to hot-remove a drive with device_del while I/O runs (default: one
    /// of vm-run's own, for its hang watchdog and the guest's hot-plug requests).
    #[arg(long, value_name = "SOCKET")]
    pub qmp: Option<PathBuf>,
    /// Do not fail the run on DMA faults (still reported).
    #[arg(long)]
    pub allow_dma_faults: bool,
    /// Keep (and reuse) the image files of the file backend.
    #[arg(long)]
    pub keep_disks: bool,
    /// Folder of the image files (default target/vm/disks).
    #[arg(long)]
    pub disk_dir: Option<PathBuf>,
    /// QEMU trace events to log from the start (repeatable; QEMU's patterns, e.g. pci_nvme_mmio_*).
    #[arg(long = "trace", value_name = "EVENT")]
    pub trace: Vec<String>,
    /// Where QEMU logs its trace events (default: qemu-trace.log in the run's folder).
    #[arg(long, value_name = "FILE")]
    pub trace_log: Option<PathBuf>,
    /// Environment for the program, NAME=VALUE (repeatable). RUST_LOG and RUST_BACKTRACE pass through.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// The program (a host path) and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub program: Vec<String>,
}

pub fn main(args: RunArgs) -> Result<ExitCode> {
    Ok(ExitCode::from(run(&args)?))
}

impl RunArgs {
    /// The command line's defaults (24 null drives, 2 CPUs, 4G, 1G of hugepages) for `program`.
    pub fn for_program(program: Vec<String>) -> RunArgs {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            args: RunArgs,
        }
        let argv = ["vm-run".to_string(), "--".to_string()]
            .into_iter()
            .chain(program);
        <Defaults as clap::Parser>::parse_from(argv).args
    }

    pub fn config(&self) -> Result<VmConfig> {
        let kernel_nvme = match self.kernel_nvme.as_deref() {
            None => KernelNvme::First(0),
            Some("all") => KernelNvme::All,
            Some(k) => KernelNvme::First(k.parse().with_context(|| {
                format!("--kernel-nvme {k}: a number of drives, or no value for all")
            })?),
        };
        let work_dir = vm_dir().join("work");
        let config = VmConfig {
            drives: self.drives,
            backend: self.backend,
            disk_size: self.disk_size,
            logical_block_sizes: self.logical_block_size.clone(),
            kernel_nvme,
            nvme_opts: self.nvme_opts.clone(),
            namespaces: self.namespaces.clone(),
            numa_nodes: self.numa_nodes,
            hugepages_bytes: self.hugepages,
            cpus: self.cpus,
            tcg_threads: self.tcg_threads,
            x2apic: self.x2apic,
            mem_bytes: self.mem,
            qmp: self.qmp.clone(),
            trace: self.trace.clone(),
            disk_dir: self
                .disk_dir
                .clone()
                .unwrap_or_else(|| vm_dir().join("disks")),
            work_dir,
            keep: Vec::new(),
        };
        config.validate()?;
        Ok(config)
    }
}

/// Boots, runs, reports; returns vm-run's exit code: the program's, or one of the EXIT_ codes.
/// Errors are failures of the harness itself, before the guest runs.
pub fn run(args: &RunArgs) -> Result<u8> {
    let mut config = args.config()?;
    for e in &args.env {
        if !e.contains('=') {
            bail!("--env {e}: use NAME=VALUE");
        }
    }
    std::fs::create_dir_all(&config.work_dir)
        .with_context(|| format!("vm-run: creating {}", config.work_dir.display()))?;
    // The guest mounts the work share at this path: a symlink on the way would lead into the
    // guest's own root, not the host's.
    config.work_dir = std::fs::canonicalize(&config.work_dir)?;
    config.keep = hidden_in_guest(
        [
            Some(crate::workspace_root()),
            Some(crate::target_dir()),
            std::env::current_dir().ok(),
            program_dir(&args.program),
        ]
        .into_iter()
        .flatten()
        .filter_map(|d| std::fs::canonicalize(d).ok()),
    );
    let run_dir = config
        .work_dir
        .join(format!("run-{}-{}", std::process::id(), unique()));
    // Refused paths are refused before anything is downloaded or booted.
    config.check_paths(&run_dir.join("cmd.sh"))?;
    let (assets, _) = setup::ensure()?;
    std::fs::create_dir_all(&run_dir)?;
    let script = run_dir.join("cmd.sh");
    std::fs::write(&script, guest_script(args, &config, &run_dir)?)?;
    if config.backend == Backend::File {
        prepare_disks(&config, args.keep_disks)?;
    }
    let trace_log = args
        .trace_log
        .clone()
        .unwrap_or_else(|| run_dir.join("qemu-trace.log"));
    // Every run has a QMP socket: the hang watchdog asks a hung guest why through it, and guest
    // tests have drives hot-plugged through it. Our own unless the caller gave one; under the
    // host's /tmp: a clone's deep path could outgrow a socket name.
    let own_qmp = config.qmp.is_none();
    let qmp = config
        .qmp
        .get_or_insert_with(|| {
            std::env::temp_dir().join(format!("usnvme-vm-{}-{}.qmp", std::process::id(), unique()))
        })
        .clone();
    let qemu_args = config.qemu_args(&assets, Some(&script), &trace_log);
    let _ = std::fs::remove_file(&qmp);

    let started = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args(&qemu_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("vm-run: cannot start qemu-system-x86_64. Fix: cargo xtask vm-setup")?;
    let qemu_pid = child.id();
    let accel = if qemu::kvm_usable() { "kvm" } else { "tcg" };
    eprintln!(
        "vm-run: booting {} drives ({accel}), qemu pid {qemu_pid}",
        config.drives
    );

    let stdout = child.stdout.take().context("qemu stdout")?;
    let mut stderr = child.stderr.take().context("qemu stderr")?;
    // The console is also kept in the run folder (with a hung guest's task dump in it).
    let console_log = std::fs::File::create(run_dir.join("console.log")).ok();
    let last_output = Arc::new(Mutex::new(started));
    // The guest's hot-plug requests, carried out in order on a thread of their own: a removal
    // waits for the guest, and the console must be read meanwhile.
    let (hotplug_requests, requests) = std::sync::mpsc::channel::<String>();
    let hotplug = {
        let hotplug = Hotplug {
            socket: qmp.clone(),
            run_dir: run_dir.clone(),
        };
        std::thread::spawn(move || requests.iter().for_each(|r| hotplug.handle(&r)))
    };
    let console = {
        let last_output = last_output.clone();
        std::thread::spawn(move || {
            stream_console(
                stdout,
                started,
                console_log,
                &last_output,
                &hotplug_requests,
            )
        })
    };
    let qemu_errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let deadline = started + Duration::from_secs(args.timeout);
    let window = Duration::from_secs(args.hang_after.max(1));
    let mut idle_watch = IdleWatch::new(qemu_pid, window);
    let mut stuck_watch = StuckWatch::new(&qmp, window);
    let mut last_sample = started;
    let mut last_registers = started;
    let mut hung = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        let now = Instant::now();
        if now >= deadline || hung {
            // Only our own QEMU, by PID.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        if args.hang_after > 0 && now.duration_since(last_sample) >= Duration::from_secs(1) {
            last_sample = now;
            // the registers, through QMP, every few seconds: a dozen samples a window
            let registers_due = now.duration_since(last_registers) >= window / 12;
            if registers_due {
                last_registers = now;
            }
            let stuck = registers_due && stuck_watch.stuck(now);
            if idle_watch.idle(now) || stuck {
                hung = true;
                report_hang(args.hang_after, &qmp, &last_output);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let console = console.join().unwrap_or_default();
    // (the console's end closed the requests: this ends with the one under way)
    let _ = hotplug.join();
    if own_qmp {
        let _ = std::fs::remove_file(&qmp);
    }
    let qemu_errors = qemu_errors.join().unwrap_or_default();
    let dma_faults = qemu::dma_faults(&std::fs::read_to_string(&trace_log).unwrap_or_default());

    let guest_rc = std::fs::read_to_string(run_dir.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok());
    let mut exit_code = match (status, guest_rc) {
        // (a hung guest made to panic by the watchdog's NMI has QEMU exit: still hung)
        (_, _) if hung => {
            eprintln!(
                "vm-run: the guest hung (idle, or a vCPU in its kernel with interrupts off, for {} s with its program running); QEMU (pid {qemu_pid}) killed",
                args.hang_after
            );
            EXIT_HUNG
        }
        (None, _) => {
            eprintln!(
                "vm-run: timed out after {} s; QEMU (pid {qemu_pid}) killed",
                args.timeout
            );
            EXIT_TIMEOUT
        }
        (Some(_), Some(rc)) => rc,
        // isa-debug-exit: QEMU exits with (rc << 1) | 1
        (Some(st), None) if st.code().is_some_and(|c| c & 1 == 1 && c > 1) => {
            ((st.code().unwrap_or(0) >> 1) & 0x7f) as u8
        }
        (Some(st), None) => {
            if console.kernel_panic {
                eprintln!("vm-run: the guest kernel panicked (see the output above)");
            } else {
                eprintln!("vm-run: the guest ended without reporting an exit code (QEMU {st})");
            }
            if !qemu_errors.trim().is_empty() {
                eprintln!("vm-run: QEMU said:\n{}", qemu_errors.trim());
            }
            EXIT_VM_FAILED
        }
    };
    if !dma_faults.is_empty() {
        eprintln!(
            "vm-run: {} DMA fault(s) blocked by the IOMMU:",
            dma_faults.len()
        );
        for (device, faults) in qemu::group_by_device(&dma_faults) {
            eprintln!(
                "vm-run:   device {device}: {} fault(s), first: {}",
                faults.len(),
                faults[0]
            );
        }
        if !args.allow_dma_faults && exit_code != EXIT_TIMEOUT && exit_code != EXIT_HUNG {
            exit_code = EXIT_DMA_FAULT;
        }
    }
    if config.backend == Backend::File && !args.keep_disks {
        for (path, _) in config.images() {
            let _ = std::fs::remove_file(path);
        }
    }
    if [EXIT_VM_FAILED, EXIT_TIMEOUT, EXIT_HUNG].contains(&exit_code) {
        eprintln!(
            "vm-run: run files kept in {} (console.log: the guest's console)",
            run_dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&run_dir);
    }
    Ok(exit_code)
}

/// Says that the guest looks hung and has it dump its blocked tasks and CPUs on the console,
/// then waits for the dump to come out: until the console has been quiet for a few seconds.
fn report_hang(idle_secs: u64, qmp: &Path, last_output: &Mutex<Instant>) {
    eprintln!(
        "vm-run: the guest has been idle, or a vCPU of it in its kernel with interrupts off, \
         for {idle_secs} s while its program runs: asking its kernel for its blocked tasks and \
         every task's stack (SysRq 9, w, t) before killing it"
    );
    match watchdog::ask_why(qmp) {
        Ok(state) => eprintln!("vm-run: {state}"),
        Err(e) => eprintln!("vm-run: QMP: {e:#}"),
    }
    // A guest whose timers stopped still prints: the console is driven by its keyboard and
    // serial interrupts. Done once the dump has begun and the console has then been quiet
    // for QUIET, or LONGEST after the keys (a guest that answers nothing).
    const QUIET: Duration = Duration::from_secs(5);
    const LONGEST: Duration = Duration::from_secs(60);
    let dumped = |asked: Instant| loop {
        std::thread::sleep(Duration::from_millis(200));
        let last = *last_output.lock().unwrap_or_else(|e| e.into_inner());
        if last > asked && last.elapsed() >= QUIET {
            return true;
        }
        if asked.elapsed() >= LONGEST {
            return false;
        }
    };
    if dumped(Instant::now()) {
        return;
    }
    // Nothing came: the guest takes no interrupt, not even the keyboard's. An NMI still
    // reaches it, and it panics with every task's stack.
    eprintln!(
        "vm-run: the guest answered no SysRq key: injecting an NMI (it panics with a task dump)"
    );
    match watchdog::inject_nmi(qmp) {
        Ok(()) => {
            dumped(Instant::now());
        }
        Err(e) => eprintln!("vm-run: QMP: {e:#}"),
    }
}

/// The guest mounts its own file systems on these host folders (a tmpfs on /tmp and /run, its
/// devtmpfs on /dev): what the host has below them is hidden unless vm-run names it.
const GUEST_MOUNTS: &[&str] = &["/tmp", "/run", "/dev"];

/// Of `dirs` (the folders a run needs, canonical), those the guest's own mounts would hide,
/// without the ones inside another (they come with it), parents first.
fn hidden_in_guest(dirs: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    let mut hidden: Vec<PathBuf> = dirs
        .into_iter()
        .filter(|d| {
            GUEST_MOUNTS
                .iter()
                .any(|m| d.starts_with(m) && d.as_path() != Path::new(m))
        })
        .collect();
    hidden.sort();
    let mut kept: Vec<PathBuf> = Vec::new();
    for d in hidden {
        if !kept.iter().any(|k| d.starts_with(k)) {
            kept.push(d);
        }
    }
    kept
}

/// The folder of a program given by absolute path (one in the current folder comes with it).
fn program_dir(program: &[String]) -> Option<PathBuf> {
    let path = Path::new(program.first()?);
    path.is_absolute()
        .then(|| path.parent().map(Path::to_path_buf))
        .flatten()
}

/// What the console told us.
#[derive(Debug, Default)]
struct Console {
    ready: Option<Duration>,
    kernel_panic: bool,
}

/// Prints the program's output as it comes; interprets and hides the harness's own lines, and
/// passes the guest's hot-plug requests (`hotplug add N`, `port N K`, `del N`) on to `hotplug`.
fn stream_console(
    stdout: impl Read,
    started: Instant,
    mut log: Option<std::fs::File>,
    last_output: &Mutex<Instant>,
    hotplug: &std::sync::mpsc::Sender<String>,
) -> Console {
    let mut console = Console::default();
    let reader = BufReader::new(stdout);
    for line in reader.split(b'\n') {
        let Ok(line) = line else { break };
        *last_output.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches('\r');
        if let Some(f) = log.as_mut() {
            let _ = writeln!(f, "{line}");
        }
        if let Some(msg) = line.strip_prefix("USNVME-VM: ") {
            if let Some(ready) = msg.strip_prefix("ready ") {
                let elapsed = started.elapsed();
                console.ready = Some(elapsed);
                let field = |k: &str| {
                    ready
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix(k))
                        .unwrap_or("?")
                };
                eprintln!(
                    "vm-run: {} drives bound to vfio-pci, {} to nvme, {:.1} s after QEMU started \
                     (guest: kernel {} s, modules loaded {} s, ready {} s)",
                    field("vfio="),
                    field("nvme="),
                    elapsed.as_secs_f64(),
                    field("init="),
                    field("modules="),
                    field("uptime=")
                );
            } else if let Some(request) = msg.strip_prefix("hotplug ") {
                if hotplug.send(request.to_string()).is_err() {
                    eprintln!("vm-run: hotplug: {request} FAILED: the hot-plug thread is gone");
                }
            } else if !msg.starts_with("exit code") {
                eprintln!("vm-run: guest: {msg}");
            }
            continue;
        }
        if line.contains("Kernel panic - not syncing") {
            console.kernel_panic = true;
        }
        println!("{line}");
    }
    console
}

/// The script the guest runs in `chroot` of the host root: the caller's folder, environment, the
/// program, and its exit code into `rc` on the work share.
fn guest_script(args: &RunArgs, config: &VmConfig, run_dir: &Path) -> Result<String> {
    let cwd = std::env::current_dir()?;
    let mut s = String::from("# written by cargo xtask vm-run\n");
    s += &format!(
        "cd {} 2>/dev/null || cd /\n",
        sh_quote(&cwd.display().to_string())
    );
    let mut env: Vec<(String, String)> = ["RUST_LOG", "RUST_BACKTRACE", "RUST_TEST_THREADS"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    let lbs: Vec<String> = config
        .logical_block_sizes
        .iter()
        .map(u32::to_string)
        .collect();
    env.extend([
        ("USNVME_VM".into(), "1".into()),
        ("USNVME_VM_DRIVES".into(), config.drives.to_string()),
        (
            "USNVME_VM_KERNEL_DRIVES".into(),
            config.kernel_drives().to_string(),
        ),
        ("USNVME_VM_NUMA_NODES".into(), config.numa_nodes.to_string()),
        (
            "USNVME_VM_BACKEND".into(),
            format!("{:?}", config.backend).to_lowercase(),
        ),
        ("USNVME_VM_LOGICAL_BLOCK_SIZES".into(), lbs.join(",")),
        ("USNVME_VM_DISK_SIZE".into(), config.disk_size.to_string()),
        (
            "USNVME_VM_WORK".into(),
            config.work_dir.display().to_string(),
        ),
        ("USNVME_VM_RUN".into(), run_dir.display().to_string()),
        ("HOME".into(), "/tmp".into()),
        // The console is a terminal, but what it shows is a log: no live progress lines
        // (`usnvme` perf, sweep); `--env USNVME_PROGRESS=1` brings them back.
        ("USNVME_PROGRESS".into(), "0".into()),
    ]);
    for e in &args.env {
        if let Some((k, v)) = e.split_once('=') {
            env.push((k.to_string(), v.to_string()));
        }
    }
    for (k, v) in env {
        s += &format!("export {k}={}\n", sh_quote(&v));
    }
    let program: Vec<String> = args.program.iter().map(|a| sh_quote(a)).collect();
    s += &program.join(" ");
    s += "\nrc=$?\n";
    s += &format!(
        "echo $rc > {}\n",
        sh_quote(&run_dir.join("rc").display().to_string())
    );
    s += "exit $rc\n";
    Ok(s)
}

/// Fresh sparse images, or the kept ones when asked to keep (and they have the right size).
fn prepare_disks(config: &VmConfig, keep: bool) -> Result<()> {
    std::fs::create_dir_all(&config.disk_dir)
        .with_context(|| format!("creating {}", config.disk_dir.display()))?;
    for (path, size) in config.images() {
        let reuse = keep && std::fs::metadata(&path).is_ok_and(|m| m.len() == size);
        if !reuse {
            let _ = std::fs::remove_file(&path);
            let f = std::fs::File::create(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            f.set_len(size)?;
        }
    }
    Ok(())
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// `1G`, `512M`, `64K`, `4096` (bytes); binary units, as every usnvme tool reads sizes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|_| format!("'{s}' is not a size: use bytes or K, M, G, T (e.g. 512M)"))
}

#[cfg(test)]
mod tests {
    use super::{hidden_in_guest, parse_size, program_dir, stream_console, RunArgs};
    use std::path::PathBuf;
    use std::sync::Mutex;
    use std::time::Instant;

    #[test]
    fn the_guests_hotplug_requests_are_passed_on_in_order() {
        // as a guest test writes them: after the harness's `test NAME ... `, on a line of its own
        let console =
            "test t ... \r\nUSNVME-VM: hotplug add 0\r\nUSNVME-VM: hotplug del 1\r\nok\r\n";
        let (tx, rx) = std::sync::mpsc::channel();
        let last_output = Mutex::new(Instant::now());
        stream_console(console.as_bytes(), Instant::now(), None, &last_output, &tx);
        drop(tx);
        assert_eq!(rx.iter().collect::<Vec<_>>(), ["add 0", "del 1"]);
    }

    #[test]
    fn folders_under_the_guests_own_mounts_are_kept_visible_parents_first() {
        let dirs = [
            "/work/main",
            "/tmp/clone/target",
            "/tmp/clone",
            "/tmp",
            "/run/user/0/ws",
            "/tmpfoo/x",
            "/dev/shm/ws",
        ]
        .map(PathBuf::from);
        let kept = hidden_in_guest(dirs);
        assert_eq!(
            kept,
            ["/dev/shm/ws", "/run/user/0/ws", "/tmp/clone"].map(PathBuf::from)
        );
        assert_eq!(
            program_dir(&["/tmp/x/bin/prog".into()]),
            Some(PathBuf::from("/tmp/x/bin"))
        );
        assert_eq!(program_dir(&["target/debug/usnvme".into()]), None);
    }

    #[test]
    fn programmatic_runs_get_the_command_line_defaults() {
        let a = RunArgs::for_program(vec!["/bin/true".into(), "--drives".into()]);
        assert_eq!(a.program, ["/bin/true", "--drives"]);
        assert_eq!(
            (a.drives, a.disk_size, a.cpus, a.timeout),
            (24, 1 << 30, 2, 600)
        );
        assert_eq!(a.logical_block_size, [512]);
        assert!(a.config().is_ok());
    }

    #[test]
    fn sizes_in_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
