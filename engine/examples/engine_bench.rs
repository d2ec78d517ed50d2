//! Engine overhead benchmark: the null_bench workload (4 KiB random reads at a fixed queue depth
//! on `sim` null drives, inline mode) through the engine: reactors, channels, latency stamps and
//! statistics, and the block layer — a namespace per drive, or one stripe over all drives.
//! `cargo xtask bench` runs it natively for IOPS and under callgrind for instructions per I/O.
//!
//! usage: engine_bench namespace|stripe DRIVES QUEUE_DEPTH IOS [CORES, e.g. 0 or 0-1]

use std::sync::Arc;
use std::time::Instant;

use usnvme_driver::{pci::Sysfs, ControllerOptions, DeviceSpec, IoBuffer, Opener};
use usnvme_engine::topology::{parse_cores, Topology};
use usnvme_engine::{
    attach, BlockDevice, ChannelOptions, Engine, EngineOptions, Job, Op, ReactorContext,
    StripeDevice,
};
use usnvme_hugepages::{BufferPool, DmaBuffer};

const IO_SIZE: u64 = 4096;

fn main() {
    if let Err(e) = run() {
        eprintln!("engine_bench: {e}");
        std::process::exit(2);
    }
}

/// Keeps `depth` reads in flight on every device of the reactor until `left` were submitted.
struct RandomReads {
    depth: usize,
    left: u64,
    done: u64,
    failed: u64,
    rng: u64,
    buffer: Option<(BufferPool, DmaBuffer)>,
}

impl RandomReads {
    fn next_offset(&mut self, size: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % (size / IO_SIZE)) * IO_SIZE
    }
}

impl Job for RandomReads {
    type Output = (u64, u64);

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        if self.buffer.is_none() {
            let Ok(mut pool) = ctx.devices[0].buffer_pool(IO_SIZE as usize, 1) else {
                return false;
            };
            let Some(buf) = pool.alloc() else {
                return false;
            };
            self.buffer = Some((pool, buf));
        }
        let Some((_, buf)) = &self.buffer else {
            return false;
        };
        // Reads of a null device: every command may share one buffer.
        let io = IoBuffer {
            iova: buf.iova(),
            len: IO_SIZE as u32,
        };
        let mut busy = false;
        for i in 0..ctx.devices.len() {
            let size = ctx.devices[i].info.size_bytes;
            while self.left > 0 && ctx.devices[i].in_flight() < self.depth {
                let offset = self.next_offset(size);
                if ctx.devices[i]
                    .submit(Op::Read, offset, IO_SIZE, Some(io), 0)
                    .is_err()
                {
                    break;
                }
                self.left -= 1;
            }
            let (done, failed) = (&mut self.done, &mut self.failed);
            ctx.devices[i].poll(|c| {
                *done += 1;
                *failed += u64::from(c.result().is_err());
            });
            busy |= ctx.devices[i].in_flight() > 0;
        }
        self.left > 0 || busy
    }

    fn finish(self, _ctx: &mut ReactorContext) -> (u64, u64) {
        (self.done, self.failed)
    }
}

fn arg(n: usize, default: &str) -> String {
    std::env::args()
        .nth(n)
        .unwrap_or_else(|| default.to_string())
}

fn number<T: std::str::FromStr>(n: usize, default: &str) -> Result<T, String> {
    let s = arg(n, default);
    s.parse().map_err(|_| format!("bad argument {n}: `{s}`"))
}

fn run() -> Result<(), String> {
    let layer = arg(1, "namespace");
    let drives: u32 = number(2, "1")?;
    let depth: u16 = number(3, "128")?;
    let ios: u64 = number(4, "1000000")?;
    let cores = parse_cores(&arg(5, "0")).map_err(|e| e.to_string())?;
    if drives == 0 || depth < 1 {
        return Err("need at least one drive and a queue depth of 1".into());
    }
    let spec: DeviceSpec = format!("sim:0-{},backend=null,mode=inline,size=1T", drives - 1)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let attach_start = Instant::now();
    let attached = attach(
        &Opener::new("/sys"),
        &Sysfs::new(),
        &[spec],
        &ControllerOptions::default(),
    )
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| e.to_string())?;
    let attach_ms = attach_start.elapsed().as_secs_f64() * 1e3;
    let topology = Topology::from_sysfs("/".as_ref()).map_err(|e| e.to_string())?;
    let engine = Engine::new(
        topology,
        attached,
        EngineOptions {
            cores: cores.clone(),
            channel: ChannelOptions {
                depth: depth + 1,
                // production's command timeout (30 s): its checks are part of the cost
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let devices: Vec<Arc<dyn BlockDevice>> = match layer.as_str() {
        "namespace" => engine.namespaces(),
        "stripe" => vec![Arc::new(
            StripeDevice::new("stripe", engine.namespaces(), 128 << 10)
                .map_err(|e| e.to_string())?,
        )],
        other => return Err(format!("unknown layer `{other}`: namespace or stripe")),
    };
    // Every reactor submits its share.
    let per_reactor = ios / cores.len() as u64;
    let start = Instant::now();
    let run = engine
        .start(devices, move |_| RandomReads {
            depth: depth as usize,
            left: per_reactor,
            done: 0,
            failed: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
            buffer: None,
        })
        .map_err(|e| e.to_string())?;
    let results = run.wait().map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    let (done, failed) = results
        .iter()
        .fold((0, 0), |(d, f), r| (d + r.output.0, f + r.output.1));
    println!(
        "layer={layer} drives={drives} qd={depth} cores={} ios={done} failed={failed} seconds={secs:.3} iops={:.0} attach_ms={attach_ms:.1}",
        cores.len(),
        done as f64 / secs
    );
    if failed > 0 || done == 0 {
        return Err(format!("{failed} of {done} reads failed"));
    }
    Ok(())
}
