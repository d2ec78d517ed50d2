//! The embedding example of the README: open drives, build a stripe, run a job on the
//! reactors, collect statistics. `cargo run -p usnvme-engine --example embed` (on simulated
//! drives; name BDFs bound to vfio-pci instead to use real ones).

use std::sync::Arc;

use usnvme_driver::{pci::Sysfs, ControllerOptions, DeviceSpec, IoBuffer, Opener};
use usnvme_engine::stats::{OpKind, Snapshot};
use usnvme_engine::topology::Topology;
use usnvme_engine::{
    attach, BlockDevice, Engine, EngineOptions, Job, Op, ReactorContext, StripeDevice,
};
use usnvme_hugepages::{BufferPool, DmaBuffer};

/// Each reactor writes `left` 4 KiB blocks, 32 at a time, to every device it serves.
struct Writes {
    left: u64,
    buffer: Option<(BufferPool, DmaBuffer)>,
}

impl Job for Writes {
    type Output = ();

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        let dev = &mut ctx.devices[0];
        let (_, buf) = self.buffer.get_or_insert_with(|| {
            let mut pool = dev.buffer_pool(4096, 1).expect("DMA buffers");
            let buf = pool.alloc().expect("a buffer");
            (pool, buf)
        });
        let io = IoBuffer {
            iova: buf.iova(),
            len: 4096,
        };
        while self.left > 0 && dev.in_flight() < 32 {
            let offset = self.left * 4096 % dev.info.size_bytes;
            if dev
                .submit(Op::Write, offset, 4096, Some(io), self.left)
                .is_err()
            {
                break;
            }
            self.left -= 1;
        }
        dev.poll(|c| assert!(c.result().is_ok()));
        self.left > 0 || dev.in_flight() > 0
    }

    fn finish(self, _ctx: &mut ReactorContext) {}
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Open drives (BDFs bound to vfio-pci, or simulated ones) in parallel.
    let specs: Vec<DeviceSpec> = vec!["sim:0-3,backend=ram".parse()?];
    let drives = attach(
        &Opener::new("/sys"),
        &Sysfs::new(),
        &specs,
        &ControllerOptions::default(),
    )
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    // One pinned reactor per core, each drive served from its own NUMA node.
    let engine = Engine::new(
        Topology::from_sysfs("/".as_ref())?,
        drives,
        EngineOptions::default(),
    )?;
    println!("{}", engine.placement());
    // A stripe (RAID 0) over the four namespaces, 128 KiB chunks.
    let stripe: Arc<dyn BlockDevice> =
        Arc::new(StripeDevice::new("s0", engine.namespaces(), 128 << 10)?);
    // Run the job on every reactor that serves the stripe; collect the statistics.
    let run = engine.start(vec![stripe], |_| Writes {
        left: 1000,
        buffer: None,
    })?;
    let results = run.wait()?;
    let total = Snapshot::aggregate(results.iter().map(|r| &r.stats)).total();
    let lat = total.latency(OpKind::Write);
    println!(
        "{} writes, mean {:.0} ns, max {} ns",
        total.ios(OpKind::Write),
        lat.mean_ns,
        lat.max_ns
    );
    Ok(())
}
