//! The guest's QEMU command line: q35 with an emulated Intel IOMMU, one PCIe root port per NVMe
//! controller (optionally on two NUMA nodes through `pxb-pcie` expander bridges), the host root and
//! a work folder over virtio-9p, and `isa-debug-exit` as a fallback exit-code channel.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use super::namespaces::{self, NsSpec};
use super::setup::{Assets, QBOOT, SEABIOS};

/// Where each emulated drive keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// QEMU `null-co`: reads return zeroes, writes are dropped (fast, for throughput).
    Null,
    /// Sparse raw image files on the host (for data checks).
    File,
}

/// How TCG runs the guest's vCPUs on the host (no effect under KVM).
///
/// Single-threaded is the default. Multi-threaded TCG loses local APIC interrupts when the host
/// is busy: a hung guest's LAPIC (HMP `info lapic`) held its timer vector in service with no
/// EOI (ISR 236, PPR 0xe0), so the next tick (IRR 236) and device interrupts (IRR 52) were
/// never delivered, and both vCPUs sat halted while every task slept on a timer. With two busy
/// loops on a 2-core host, `vm-test --guest-only` hung in 3 of 3 boots (issue 22), the
/// open/close reproducer in 4 of 6; single-threaded, 0 (the numbers are in the README).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TcgThreads {
    /// One host thread runs every vCPU in turn (`-accel tcg,thread=single`).
    Single,
    /// One host thread per vCPU (`thread=multi`): faster on a quiet host, hangs on a busy one.
    Multi,
}

/// How many controllers stay on the kernel `nvme` driver (the rest go to vfio-pci).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelNvme {
    First(usize),
    All,
}

/// One guest.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub drives: usize,
    pub backend: Backend,
    pub disk_size: u64,
    /// Logical block sizes, spread over the drives in order (see `logical_block_size`).
    pub logical_block_sizes: Vec<u32>,
    pub kernel_nvme: KernelNvme,
    pub nvme_opts: Option<String>,
    /// Each controller's namespaces (`--ns`); empty: one, the whole disk, on the controller.
    pub namespaces: Vec<NsSpec>,
    pub numa_nodes: usize,
    pub hugepages_bytes: u64,
    pub cpus: usize,
    pub tcg_threads: TcgThreads,
    /// x2APIC (`-cpu max,+x2apic`, the IOMMU's extended interrupt mode): the guest's EOI and
    /// timer are MSR writes, not xAPIC MMIO (issue 22's lead against multi-threaded TCG's hang).
    pub x2apic: bool,
    pub mem_bytes: u64,
    pub qmp: Option<PathBuf>,
    /// QEMU trace events logged from the start, beside the IOMMU's DMA faults.
    pub trace: Vec<String>,
    /// The images of the file backend: `nvme{k}.img`.
    pub disk_dir: PathBuf,
    /// Shared read-write with the guest at the same path.
    pub work_dir: PathBuf,
    /// Host folders under the guest's own /tmp, /run or /dev (a workspace cloned into /tmp) that
    /// the guest shows anyway, read-only like the rest of the host root.
    pub keep: Vec<PathBuf>,
}

pub const MAX_DRIVES: usize = 64;
/// The first slot of the drives' root ports on pcie.0 (8 ports a slot).
const FIRST_DRIVE_SLOT: usize = 0x10;
/// Empty root ports that a guest test fills by asking vm-run to hot-add a drive (`hotplug add N`).
pub const SPARE_PORTS: usize = 2;
/// Their slot on pcie.0: below the drives'. Bridges are given bus numbers from the highest
/// address down (seen under qboot: ports 10.1, 10.0 get buses 1, 2), so the spare ports come
/// last and the drives keep their buses (with two NUMA nodes the drives' buses are fixed anyway).
const SPARE_SLOT: usize = FIRST_DRIVE_SLOT - 1;
const MIB: u64 = 1 << 20;
/// x86's COMMAND_LINE_SIZE, with its NUL: the kernel cuts a longer command line.
const MAX_CMDLINE: usize = 2047;

impl VmConfig {
    /// Checks the combination before anything boots.
    pub fn validate(&self) -> Result<()> {
        if self.drives > MAX_DRIVES {
            bail!("--drives {}: at most {MAX_DRIVES} drives", self.drives);
        }
        if !(1..=2).contains(&self.numa_nodes) {
            bail!("--numa-nodes {}: 1 or 2", self.numa_nodes);
        }
        if self.cpus == 0 || self.cpus < self.numa_nodes {
            bail!(
                "--cpus {}: at least 1, and at least one per NUMA node ({})",
                self.cpus,
                self.numa_nodes
            );
        }
        if let Some(bad) = self
            .logical_block_sizes
            .iter()
            .find(|s| **s != 512 && **s != 4096)
        {
            bail!("--logical-block-size {bad}: 512 or 4096");
        }
        if self.logical_block_sizes.is_empty() {
            bail!("--logical-block-size: give 512, 4096 or a list such as 512,4096");
        }
        if self.disk_size < MIB || !self.disk_size.is_multiple_of(4096) {
            bail!(
                "--disk-size {}: at least 1M and a multiple of 4 KiB",
                self.disk_size
            );
        }
        self.namespace_sizes()?;
        if !self.hugepages_bytes.is_multiple_of(2 * MIB) {
            bail!("--hugepages: a multiple of 2M");
        }
        if self.mem_bytes < 512 * MIB || self.hugepages_bytes + 256 * MIB > self.mem_bytes {
            bail!(
                "--mem {} MiB with --hugepages {} MiB: the guest needs at least 256 MiB beyond its hugepages",
                self.mem_bytes / MIB,
                self.hugepages_bytes / MIB
            );
        }
        if !self.mem_bytes.is_multiple_of(self.numa_nodes as u64 * MIB) {
            bail!(
                "--mem must split evenly in MiB over {} NUMA nodes",
                self.numa_nodes
            );
        }
        Ok(())
    }

    /// Checks, before anything is downloaded or booted, that the guest can be told the paths on
    /// the kernel command line (`run`: the guest script).
    pub fn check_paths(&self, run: &Path) -> Result<()> {
        for path in std::iter::once(&self.work_dir)
            .chain(&self.keep)
            .chain([&run.to_path_buf()])
        {
            // The kernel splits its command line at white space, and the guest's shell
            // splits the words again: such a path would reach the guest cut in pieces.
            let plain = path.to_str().is_some_and(|p| {
                !p.chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == '"')
            });
            if !plain {
                bail!(
                    "vm-run: the test bed cannot use {:?}: the guest learns this path from its \
                     kernel command line, which cannot carry spaces, quotes, control characters or \
                     non-UTF-8 bytes. Fix: clone the workspace to a plain path (or set \
                     CARGO_TARGET_DIR to one) and run from there",
                    path.display()
                );
            }
        }
        let len = self.kernel_cmdline(Some(run)).len();
        if len > MAX_CMDLINE {
            bail!(
                "vm-run: the guest kernel command line would be {len} bytes, more than the \
                 {MAX_CMDLINE} the kernel takes: the workspace path is too long. Fix: clone the \
                 workspace to a shorter path (or set CARGO_TARGET_DIR to one)"
            );
        }
        Ok(())
    }

    pub fn drive_image(&self, k: usize) -> PathBuf {
        self.disk_dir.join(format!("nvme{k}.img"))
    }

    /// The image of namespace `nsid` of drive `k` (with `--ns`).
    fn namespace_image(&self, k: usize, nsid: usize) -> PathBuf {
        self.disk_dir.join(format!("nvme{k}n{nsid}.img"))
    }

    /// Every image file of the file backend and its size.
    pub fn images(&self) -> Vec<(PathBuf, u64)> {
        let sizes = self.namespace_sizes().unwrap_or_default();
        (0..self.drives)
            .flat_map(|k| match sizes.is_empty() {
                true => vec![(self.drive_image(k), self.disk_size)],
                false => (1..=sizes.len())
                    .map(|n| (self.namespace_image(k, n), sizes[n - 1]))
                    .collect(),
            })
            .collect()
    }

    /// The block size of namespace `spec` of drive `k`: its own, else the drive's.
    fn namespace_block_size(&self, spec: &NsSpec, k: usize) -> u32 {
        spec.block_size
            .unwrap_or_else(|| self.logical_block_size(k))
    }

    /// Each `--ns` namespace's size (empty without `--ns`).
    fn namespace_sizes(&self) -> Result<Vec<u64>> {
        // a size must suit every drive's block size: 4096 covers both
        namespaces::sizes(&self.namespaces, self.disk_size, |s| {
            s.block_size.unwrap_or(4096)
        })
    }

    /// A list of sizes is spread over the drives in order: with `512,4096`, the first half of
    /// the drives (node 0's, with two nodes) get 512 and the second half 4096.
    pub fn logical_block_size(&self, k: usize) -> u32 {
        let sizes = &self.logical_block_sizes;
        sizes[(k * sizes.len() / self.drives.max(1)).min(sizes.len() - 1)]
    }

    /// Drives on the kernel driver, a count.
    pub fn kernel_drives(&self) -> usize {
        match self.kernel_nvme {
            KernelNvme::First(k) => k.min(self.drives),
            KernelNvme::All => self.drives,
        }
    }

    /// The NUMA node of drive `k`: the first half on node 0.
    pub fn drive_node(&self, k: usize) -> usize {
        if self.numa_nodes == 2 && k >= self.drives.div_ceil(2) {
            1
        } else {
            0
        }
    }

    /// The kernel command line. `run` is the guest script, `debug` keeps kernel messages.
    pub fn kernel_cmdline(&self, run: Option<&Path>) -> String {
        let mut s =
            String::from("console=ttyS0 panic=-1 quiet loglevel=1 init_on_alloc=0 intel_iommu=on");
        // Under TCG the guest kernel finds the TSC "unstable" and falls back to the HPET, which
        // makes every clock read a system call plus an emulated MMIO access (microseconds):
        // both usnvme and fio read the clock per I/O. Servers use the TSC; so does the guest.
        s += " tsc=reliable clocksource=tsc";
        // Linux 6.1's nvme-tcp initiator sends multi-page buffers with sendpage; received over
        // loopback by a userspace target (usnvme serve), hardened usercopy takes the copy out
        // for a kernel memory exposure and oopses the receiving thread (seen in the guest,
        // `usercopy_abort` from `tcp_recvmsg`). The check guards the kernel, not our code.
        s += " hardened_usercopy=off";
        // vm-run's hang watchdog presses SysRq (w, t) on the emulated keyboard to learn where a
        // hung guest is stuck. A guest that takes no interrupt any more (its local APIC stuck)
        // cannot read the keys: the watchdog then injects an NMI, which such a guest panics on,
        // printing every task's stack and the timers (panic_print 0x5) by polling the console.
        s += " sysrq_always_enabled unknown_nmi_panic panic_print=0x5";
        if self.hugepages_bytes > 0 {
            s += &format!(
                " hugepagesz=2M hugepages={}",
                self.hugepages_bytes / (2 * MIB)
            );
        }
        let k = match self.kernel_nvme {
            KernelNvme::All => -1,
            KernelNvme::First(k) => k as i64,
        };
        s += &format!(
            " usnvme.kernel_nvme={k} usnvme.work={}",
            self.work_dir.display()
        );
        for dir in &self.keep {
            s += &format!(" usnvme.keep={}", dir.display());
        }
        if let Some(run) = run {
            s += &format!(" usnvme.run={}", run.display());
        }
        s
    }

    /// The full QEMU argument list.
    pub fn qemu_args(&self, assets: &Assets, run: Option<&Path>, trace_log: &Path) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |args: &[&str]| a.extend(args.iter().map(|s| s.to_string()));
        push(&[
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-no-reboot",
        ]);
        if kvm_usable() {
            push(&[
                "-M",
                "q35,kernel-irqchip=split",
                "-accel",
                "kvm",
                "-cpu",
                "host",
            ]);
        } else {
            let accel = match self.tcg_threads {
                TcgThreads::Single => "tcg,thread=single",
                TcgThreads::Multi => "tcg,thread=multi",
            };
            let cpu = if self.x2apic { "max,+x2apic" } else { "max" };
            push(&["-M", "q35", "-accel", accel, "-cpu", cpu]);
        }
        let smp = self.cpus.to_string();
        let mem = format!("{}M", self.mem_bytes / MIB);
        push(&["-smp", &smp, "-m", &mem]);
        let eim = if self.x2apic { ",eim=on" } else { "" };
        push(&[
            "-device",
            &format!("intel-iommu,intremap=on,caching-mode=on,aw-bits=48{eim}"),
        ]);
        let vmlinux = assets.vmlinux.display().to_string();
        let initrd = assets.initramfs.display().to_string();
        let cmdline = self.kernel_cmdline(run);
        push(&["-kernel", &vmlinux, "-initrd", &initrd, "-append", &cmdline]);
        // 9p devices sit on pcie.0 explicitly: with expander bridges QEMU would otherwise pick one.
        let work = qemu_escape(&self.work_dir);
        push(&[
            "-fsdev",
            "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
        ]);
        push(&[
            "-device",
            "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot,bus=pcie.0,addr=0x2",
        ]);
        push(&[
            "-fsdev",
            &format!("local,id=work,path={work},security_model=none,multidevs=remap"),
        ]);
        push(&[
            "-device",
            "virtio-9p-pci,fsdev=work,mount_tag=work,bus=pcie.0,addr=0x3",
        ]);
        push(&["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"]);
        let trace = trace_log.display().to_string();
        // each trace line stamped with its time (pid@seconds.micros:event ...)
        push(&["-msg", "timestamp=on"]);
        push(&["-trace", "vtd_dmar_fault", "-D", &trace]);
        for event in &self.trace {
            push(&["-trace", event]);
        }
        if let Some(qmp) = &self.qmp {
            push(&[
                "-qmp",
                &format!("unix:{},server=on,wait=off", qmp.display()),
            ]);
        }
        if self.numa_nodes == 2 {
            // qboot does not enumerate expander buses: the drives would vanish.
            push(&["-bios", SEABIOS]);
            let half = format!("{}M", self.mem_bytes / 2 / MIB);
            let cpus0 = self.cpus / 2;
            for node in 0..2 {
                let (first, last) = if node == 0 {
                    (0, cpus0 - 1)
                } else {
                    (cpus0, self.cpus - 1)
                };
                push(&[
                    "-object",
                    &format!("memory-backend-ram,id=mem{node},size={half}"),
                ]);
                push(&[
                    "-numa",
                    &format!("node,nodeid={node},cpus={first}-{last},memdev=mem{node}"),
                ]);
                let bus_nr = 64 * (node + 1);
                push(&[
                    "-device",
                    &format!("pxb-pcie,id=pxb{node},bus_nr={bus_nr},numa_node={node},bus=pcie.0,addr=0x{:x}", 8 + node),
                ]);
            }
        } else {
            push(&["-bios", QBOOT]);
        }
        for k in 0..self.drives {
            a.extend(self.drive_args(k));
        }
        for n in 0..SPARE_PORTS {
            let multifunction = if n == 0 { ",multifunction=on" } else { "" };
            a.push("-device".into());
            a.push(format!(
                "pcie-root-port,id={},chassis={},bus=pcie.0,addr={SPARE_SLOT:x}.{n}{multifunction},hotplug=on",
                spare_port(n),
                MAX_DRIVES + 1 + n
            ));
        }
        a
    }

    fn drive_args(&self, k: usize) -> Vec<String> {
        let mut a = Vec::new();
        if !self.namespaces.is_empty() {
            a.extend(self.controller_args(k, None));
            let sizes = self.namespace_sizes().unwrap_or_default();
            for (i, (spec, size)) in self.namespaces.iter().zip(sizes).enumerate() {
                let (nsid, node) = (i + 1, format!("nvm{k}n{}", i + 1));
                a.extend(self.blockdev_args(&node, size, &self.namespace_image(k, nsid)));
                a.push("-device".into());
                a.push(format!(
                    "nvme-ns,id=nvme{k}n{nsid},drive={node},bus=nvme{k},nsid={nsid},{}",
                    spec.qemu_props(self.namespace_block_size(spec, k))
                ));
            }
            return a;
        }
        a.extend(self.blockdev_args(&format!("nvm{k}"), self.disk_size, &self.drive_image(k)));
        a.extend(self.controller_args(k, Some(&format!("nvm{k}"))));
        a
    }

    /// The block device `node` of `size` bytes: null, or the image `image`.
    fn blockdev_args(&self, node: &str, size: u64, image: &Path) -> Vec<String> {
        let mut a = Vec::new();
        match self.backend {
            Backend::Null => {
                a.push("-blockdev".into());
                a.push(format!(
                    "driver=null-co,node-name={node},size={size},read-zeroes=on"
                ));
            }
            Backend::File => {
                a.push("-blockdev".into());
                a.push(format!(
                    "driver=file,node-name={node}-img,filename={},cache.direct=on,aio=threads,discard=unmap",
                    qemu_escape(image)
                ));
                a.push("-blockdev".into());
                // discard=unmap: Dataset Management deallocate really punches holes
                a.push(format!(
                    "driver=raw,node-name={node},file={node}-img,discard=unmap"
                ));
            }
        }
        a
    }

    /// Drive `k`'s root port and controller, with its one namespace on `drive` when given.
    fn controller_args(&self, k: usize, drive: Option<&str>) -> Vec<String> {
        let mut a = Vec::new();
        // One root port per drive, 8 functions per slot: on pcie.0 from slot 0x10, or on the
        // drive's node's expander bridge from slot 0.
        let (bus, index) = if self.numa_nodes == 2 {
            let node = self.drive_node(k);
            let first = if node == 0 {
                0
            } else {
                self.drives.div_ceil(2)
            };
            (format!("pxb{node}"), k - first)
        } else {
            ("pcie.0".to_string(), k + FIRST_DRIVE_SLOT * 8)
        };
        let (slot, function) = (index / 8, index % 8);
        let multifunction = if function == 0 {
            ",multifunction=on"
        } else {
            ""
        };
        a.push("-device".into());
        a.push(format!(
            "pcie-root-port,id=rp{k},chassis={},bus={bus},addr={slot:x}.{function}{multifunction}",
            k + 1
        ));
        let mut nvme = format!("nvme,id=nvme{k},serial=usnvme{k},bus=rp{k}");
        // a detached namespace lives in an NVM subsystem, where namespace attachment works
        if self.namespaces.iter().any(|ns| ns.detached) {
            a.push("-device".into());
            a.push(format!(
                "nvme-subsys,id=subsys{k},nqn=nqn.2024-01.io.usnvme:vm-subsys{k}"
            ));
            nvme += &format!(",subsys=subsys{k}");
        }
        let lbs = self.logical_block_size(k);
        if let Some(drive) = drive {
            nvme += &format!(",drive={drive}");
            if lbs != 512 {
                nvme += &format!(",logical_block_size={lbs},physical_block_size={lbs}");
            }
        }
        if let Some(opts) = &self.nvme_opts {
            nvme += &format!(",{opts}");
        }
        a.push("-device".into());
        a.push(nvme);
        a
    }
}

/// The QEMU id of spare root port `n` (`n < SPARE_PORTS`).
pub fn spare_port(n: usize) -> String {
    format!("spare{n}")
}

/// A path inside a QEMU option list, where a comma is written twice.
fn qemu_escape(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

/// KVM only where the real kvm_intel / kvm_amd module is loaded (here `/dev/kvm` can belong to
/// something that cannot run a stock kernel).
pub fn kvm_usable() -> bool {
    let module =
        Path::new("/sys/module/kvm_intel").exists() || Path::new("/sys/module/kvm_amd").exists();
    module
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok()
}

/// PCI address of a requester id (the `sid` of a DMA fault).
pub fn sid_to_bdf(sid: u16) -> String {
    format!(
        "0000:{:02x}:{:02x}.{:x}",
        sid >> 8,
        (sid >> 3) & 0x1f,
        sid & 7
    )
}

/// DMA faults in QEMU's trace log: (faulting device, the trace line).
pub fn dma_faults(trace_log: &str) -> Vec<(String, String)> {
    trace_log
        .lines()
        .filter(|l| l.contains("vtd_dmar_fault"))
        .map(|l| {
            let sid = l
                .split_whitespace()
                .skip_while(|w| *w != "sid")
                .nth(1)
                .and_then(|s| u16::from_str_radix(s.trim_start_matches("0x"), 16).ok());
            (
                sid.map(sid_to_bdf)
                    .unwrap_or_else(|| "unknown device".into()),
                l.trim().to_string(),
            )
        })
        .collect()
}

/// Faults per device, in order of first appearance.
pub fn group_by_device(faults: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for (device, line) in faults {
        match groups.iter_mut().find(|(d, _)| d == device) {
            Some((_, lines)) => lines.push(line.clone()),
            None => groups.push((device.clone(), vec![line.clone()])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(drives: usize, numa: usize) -> VmConfig {
        VmConfig {
            drives,
            backend: Backend::Null,
            disk_size: 1 << 30,
            logical_block_sizes: vec![512, 4096],
            kernel_nvme: KernelNvme::First(0),
            nvme_opts: Some("mdts=2".into()),
            namespaces: Vec::new(),
            numa_nodes: numa,
            hugepages_bytes: 1 << 30,
            cpus: 2,
            tcg_threads: TcgThreads::Single,
            x2apic: false,
            mem_bytes: 4 << 30,
            qmp: None,
            trace: Vec::new(),
            disk_dir: "/d".into(),
            work_dir: "/w".into(),
            keep: Vec::new(),
        }
    }

    fn assets() -> Assets {
        Assets {
            vmlinux: "/v".into(),
            initramfs: "/i".into(),
            kernel_release: "r".into(),
        }
    }

    #[test]
    fn one_root_port_per_drive_with_block_sizes_spread_in_order() {
        let args = config(24, 1).qemu_args(&assets(), None, Path::new("/t"));
        let ports: Vec<&String> = args
            .iter()
            .filter(|a| a.starts_with("pcie-root-port,id=rp"))
            .collect();
        assert_eq!(ports.len(), 24);
        assert!(ports[0].contains("bus=pcie.0,addr=10.0,multifunction=on"));
        assert!(ports[9].contains("addr=11.1") && !ports[9].contains("multifunction"));
        let nvme: Vec<&String> = args.iter().filter(|a| a.starts_with("nvme,")).collect();
        assert_eq!(nvme.len(), 24);
        // 512,4096 over 24 drives: 0-11 get 512, 12-23 get 4096
        assert!(!nvme[11].contains("logical_block_size"));
        assert!(nvme[12].contains("logical_block_size=4096") && nvme[12].ends_with(",mdts=2"));
        assert!(args.contains(&QBOOT.to_string()));
    }

    #[test]
    fn x2apic_gives_the_cpu_x2apic_and_the_iommu_extended_interrupts() {
        let plain = config(2, 1).qemu_args(&assets(), None, Path::new("/t"));
        assert!(!plain
            .iter()
            .any(|a| a.contains("x2apic") || a.contains("eim=on")));
        let mut c = config(2, 1);
        c.x2apic = true;
        let args = c.qemu_args(&assets(), None, Path::new("/t"));
        assert!(args
            .iter()
            .any(|a| a.starts_with("intel-iommu,") && a.ends_with(",eim=on")));
        if !kvm_usable() {
            assert!(args.contains(&"max,+x2apic".to_string()), "{args:?}");
        }
    }

    #[test]
    fn namespaces_given_become_nvme_ns_devices_of_every_controller() {
        let mut c = config(2, 1);
        c.backend = Backend::File;
        c.namespaces = vec![
            "bs=4096".parse().expect("valid"),
            "ms=8,pi=1,size=64M".parse().expect("valid"),
        ];
        let args = c.qemu_args(&assets(), None, Path::new("/t"));
        let nvme: Vec<&String> = args.iter().filter(|a| a.starts_with("nvme,")).collect();
        assert_eq!(nvme[1], "nvme,id=nvme1,serial=usnvme1,bus=rp1,mdts=2");
        let ns: Vec<&String> = args.iter().filter(|a| a.starts_with("nvme-ns,")).collect();
        assert_eq!(ns.len(), 4);
        // drive 1 is a 4096-byte drive (512,4096 spread): its second namespace keeps that size
        assert_eq!(
            ns[3],
            "nvme-ns,id=nvme1n2,drive=nvm1n2,bus=nvme1,nsid=2,logical_block_size=4096,\
             physical_block_size=4096,ms=8,mset=0,pi=1,pil=0,pif=0"
        );
        assert!(ns[0].contains("nsid=1,logical_block_size=4096"));
        // one image per namespace: the one given its size, the other the rest
        let images = c.images();
        assert_eq!(images.len(), 4);
        assert_eq!(images[1], (PathBuf::from("/d/nvme0n2.img"), 64 << 20));
        assert_eq!(images[0].1, (1 << 30) - (64 << 20));
        assert!(args.iter().any(|a| a.contains("filename=/d/nvme1n2.img")));
        assert!(!args.iter().any(|a| a.contains("subsys")));

        // a detached namespace: each controller in a subsystem of its own
        c.namespaces[1] = "ms=8,pi=1,size=64M,detached=1".parse().expect("valid");
        let args = c.qemu_args(&assets(), None, Path::new("/t"));
        assert!(args
            .contains(&"nvme-subsys,id=subsys1,nqn=nqn.2024-01.io.usnvme:vm-subsys1".to_string()));
        assert!(args
            .contains(&"nvme,id=nvme1,serial=usnvme1,bus=rp1,subsys=subsys1,mdts=2".to_string()));
        assert!(args
            .iter()
            .any(|a| a.starts_with("nvme-ns,id=nvme1n2,") && a.ends_with(",detached=on")));
    }

    #[test]
    fn two_numa_nodes_put_half_the_drives_on_each_expander_bridge() {
        let c = config(24, 2);
        let args = c.qemu_args(&assets(), None, Path::new("/t"));
        let ports: Vec<&String> = args
            .iter()
            .filter(|a| a.starts_with("pcie-root-port"))
            .collect();
        assert_eq!(ports.iter().filter(|p| p.contains("bus=pxb0")).count(), 12);
        assert_eq!(ports.iter().filter(|p| p.contains("bus=pxb1")).count(), 12);
        assert!(ports[12].contains("bus=pxb1,addr=0.0"));
        assert!(args
            .iter()
            .any(|a| a.contains("pxb-pcie,id=pxb1,bus_nr=128,numa_node=1")));
        assert!(args.contains(&SEABIOS.to_string()));
        assert_eq!((c.drive_node(11), c.drive_node(12)), (0, 1));
    }

    #[test]
    fn spare_hotplug_ports_sit_below_every_drive_port_on_pcie0() {
        for (drives, numa) in [(24, 1), (MAX_DRIVES, 1), (24, 2)] {
            let args = config(drives, numa).qemu_args(&assets(), None, Path::new("/t"));
            let ports: Vec<&String> = args
                .iter()
                .filter(|a| a.starts_with("pcie-root-port"))
                .collect();
            assert_eq!(ports.len(), drives + SPARE_PORTS);
            // the drives' ports first and where they always were (bus numbers follow this order)
            assert!(ports[..drives]
                .iter()
                .all(|p| p.starts_with("pcie-root-port,id=rp")));
            assert_eq!(
                &ports[drives..],
                [
                    "pcie-root-port,id=spare0,chassis=65,bus=pcie.0,addr=f.0,multifunction=on,hotplug=on",
                    "pcie-root-port,id=spare1,chassis=66,bus=pcie.0,addr=f.1,hotplug=on",
                ]
            );
            // every port its own chassis, every pcie.0 address used once
            let field = |p: &str, k: &str| {
                p.split(',')
                    .find_map(|f| f.strip_prefix(k))
                    .map(str::to_owned)
            };
            let mut chassis: Vec<_> = ports.iter().filter_map(|p| field(p, "chassis=")).collect();
            chassis.sort();
            chassis.dedup();
            assert_eq!(chassis.len(), ports.len());
            let mut on_root: Vec<_> = ports
                .iter()
                .filter(|p| p.contains("bus=pcie.0,"))
                .filter_map(|p| field(p, "addr="))
                .collect();
            let n = on_root.len();
            on_root.sort();
            on_root.dedup();
            assert_eq!(on_root.len(), n);
        }
        assert_eq!(spare_port(1), "spare1");
    }

    #[test]
    fn rejects_impossible_configurations() {
        let mut c = config(65, 1);
        assert!(c.validate().is_err());
        c.drives = 4;
        assert!(c.validate().is_ok());
        c.logical_block_sizes = vec![1024];
        assert!(c.validate().is_err());
        c.logical_block_sizes = vec![512];
        c.hugepages_bytes = 4 << 30;
        assert!(c.validate().is_err());
    }

    #[test]
    fn hidden_folders_are_named_to_the_guest_and_odd_paths_refused_before_booting() {
        let mut c = config(1, 1);
        c.work_dir = "/tmp/a,b/target/vm/work".into();
        c.keep = vec!["/tmp/a,b".into()];
        let run = Path::new("/tmp/a,b/target/vm/work/run-1/cmd.sh");
        assert!(c.check_paths(run).is_ok());
        let cmdline = c.kernel_cmdline(Some(run));
        assert!(
            cmdline
                .contains(" usnvme.work=/tmp/a,b/target/vm/work usnvme.keep=/tmp/a,b usnvme.run="),
            "{cmdline}"
        );
        let args = c.qemu_args(&assets(), Some(run), Path::new("/t"));
        assert!(
            args.iter()
                .any(|a| a.starts_with("local,id=work,path=/tmp/a,,b/target/vm/work,")),
            "{args:?}"
        );
        for bad in ["/tmp/my clone", "/tmp/tab\there", "/tmp/\"q\""] {
            c.keep = vec![bad.into()];
            let e = c.check_paths(run).expect_err(bad).to_string();
            assert!(e.contains("cannot use") && e.contains("Fix:"), "{e}");
        }
        c.keep = vec![format!("/tmp/{}", "x".repeat(2000)).into()];
        let e = c.check_paths(run).expect_err("too long").to_string();
        assert!(e.contains("too long"), "{e}");
    }

    #[test]
    fn decodes_dma_faults_from_the_trace_log() {
        let log = "1234@1.5:vtd_dmar_fault sid 0x0100 fault 6 addr 0x1000 write 0\nother\n";
        let faults = dma_faults(log);
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].0, "0000:01:00.0");
        let two = [
            faults[0].clone(),
            ("0000:02:00.0".into(), "x".into()),
            faults[0].clone(),
        ];
        let groups = group_by_device(&two);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].1.len(), 2);
        assert_eq!(sid_to_bdf(0x4119), "0000:41:03.1");
    }
}
