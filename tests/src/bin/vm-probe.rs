//! A probe program for the VM harness's own tests: exits with a given code, panics, panics the
//! guest kernel, streams output slowly, or provokes a DMA fault on purpose.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use usnvme_driver::regs::Registers;
use usnvme_driver::vfio::Vfio;

const USAGE: &str = "usage: vm-probe exit N | panic | kernel-panic | stream | dma-fault [BDF]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["exit", code] => match code.parse::<u8>() {
            Ok(code) => {
                println!("vm-probe: exiting with {code}");
                ExitCode::from(code)
            }
            Err(_) => usage(),
        },
        ["panic"] => panic!("vm-probe: panicking on purpose"),
        ["kernel-panic"] => {
            // sysrq 'c' crashes the kernel: the harness must report a dead guest, not hang.
            match std::fs::write("/proc/sysrq-trigger", "c") {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("vm-probe: cannot write /proc/sysrq-trigger: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        ["stream"] => {
            println!("vm-probe: first line");
            std::thread::sleep(Duration::from_secs(3));
            println!("vm-probe: second line");
            ExitCode::SUCCESS
        }
        ["dma-fault"] => dma_fault(None),
        ["dma-fault", bdf] => dma_fault(Some(bdf)),
        _ => usage(),
    }
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

/// Enables a controller with its admin queues at an IOVA that was never mapped and rings the admin
/// doorbell: the controller's fetch of the command is blocked by the IOMMU.
fn dma_fault(bdf: Option<&str>) -> ExitCode {
    let sysfs = Path::new("/sys");
    let addr = match bdf {
        Some(b) => b.to_string(),
        None => match first_vfio_nvme(sysfs) {
            Some(a) => a,
            None => {
                eprintln!("vm-probe: no NVMe controller bound to vfio-pci");
                return ExitCode::FAILURE;
            }
        },
    };
    let opened = addr.parse().map_err(|e| format!("{e}")).and_then(|a| {
        Vfio::new(sysfs)
            .and_then(|v| v.open(a))
            .map_err(|e| e.to_string())
    });
    let dev = match opened {
        Ok(d) => d,
        Err(e) => {
            eprintln!("vm-probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bar = dev.bar0().clone();
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        const CC: usize = 0x14;
        const CSTS: usize = 0x1c;
        const UNMAPPED_IOVA: u64 = 0x4000_0000;
        bar.write32(CC, 0);
        wait("CSTS.RDY to clear", || Ok(bar.read32(CSTS) & 1 == 0))?;
        bar.write32(0x24, (15 << 16) | 15); // AQA: 16-entry admin queues
        bar.write64(0x28, UNMAPPED_IOVA); // ASQ
        bar.write64(0x30, UNMAPPED_IOVA + 0x1000); // ACQ
        bar.write32(CC, (4 << 20) | (6 << 16) | 1); // IOCQES 4, IOSQES 6, EN
        wait("CSTS.RDY", || Ok(bar.read32(CSTS) & 1 == 1))?;
        bar.write32(0x1000, 1); // admin SQ tail doorbell: fetch one command
                                // the fetch the IOMMU blocks is a fatal controller error (QEMU sets CSTS.CFS)
        wait("CSTS.CFS after the blocked fetch", || {
            Ok(bar.read32(CSTS) & 2 == 2)
        })?;
        bar.write32(CC, 0);
        Ok(())
    })();
    match result {
        Ok(()) => {
            println!("vm-probe: {addr}: admin command fetched from unmapped IOVA");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vm-probe: {addr}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Waits for the controller's `what` (a busy host can slow the emulated one a lot: 60 s).
fn wait(
    what: &str,
    mut done: impl FnMut() -> Result<bool, Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    while !done()? {
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("the controller showed no {what} within 60 s").into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn first_vfio_nvme(sysfs: &Path) -> Option<String> {
    let mut addrs: Vec<String> = std::fs::read_dir(sysfs.join("bus/pci/drivers/vfio-pci"))
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            std::fs::read_to_string(sysfs.join("bus/pci/devices").join(name).join("class"))
                .is_ok_and(|c| c.trim().starts_with("0x0108"))
        })
        .collect();
    addrs.sort();
    addrs.into_iter().next()
}
