//! Driver overhead benchmark: 4 KiB random reads at a fixed queue depth on `sim` drives with the
//! `null` backend in inline mode (the controller runs inside the doorbell write, so the device
//! costs almost nothing), one thread, one queue pair per drive. `cargo xtask bench` runs it
//! natively for IOPS and under callgrind for instructions per I/O.
//!
//! usage: null_bench [DRIVES] [QUEUE_DEPTH] [IOS] [sim options, e.g. dbbuf=off]

use std::time::Instant;

use usnvme_driver::sim::SimSpec;
use usnvme_driver::{sim, ControllerOptions, IoBuffer, QueuePair, QueuePairOptions};
use usnvme_hugepages::{BufferPool, PageSize};

const IO_SIZE: u32 = 4096;

fn main() {
    if let Err(e) = run() {
        eprintln!("null_bench: {e}");
        std::process::exit(2);
    }
}

fn arg<T: std::str::FromStr>(n: usize, default: T) -> Result<T, String> {
    match std::env::args().nth(n) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| format!("bad argument {n}: `{s}`")),
    }
}

// The driver's two calls stay out of line: the loop's own cost stays apart from theirs.
#[inline(never)]
fn submit(qp: &mut QueuePair, lba: u64, buf: IoBuffer, token: u64) -> Result<(), String> {
    qp.read(1, lba, buf, token).map_err(|e| e.to_string())
}

#[inline(never)]
fn poll(qp: &mut QueuePair, failed: &mut u64) -> u64 {
    let mut done = 0u64;
    qp.poll(|c| {
        done += 1;
        *failed += u64::from(!c.status.is_success());
    });
    done
}

fn run() -> Result<(), String> {
    let drives: u32 = arg(1, 1)?;
    let depth: u16 = arg(2, 128)?;
    let ios: u64 = arg(3, 10_000_000)?;
    let extra: String = arg(4, String::new())?;
    if drives == 0 || depth < 2 {
        return Err("need at least one drive and a queue depth of 2".into());
    }
    let mut spec = format!("sim:0-{},backend=null,mode=inline,size=1T", drives - 1);
    if !extra.is_empty() {
        spec = format!("{spec},{extra}");
    }
    let spec: SimSpec = spec.parse().map_err(|e| format!("{e}"))?;
    let ctrls = sim::open(&spec, ControllerOptions::default()).map_err(|e| e.to_string())?;
    let ns = ctrls[0].namespace(1).map_err(|e| e.to_string())?;
    let (blocks, bs) = (ns.blocks, ns.block_size);
    let mut qps: Vec<QueuePair> = ctrls
        .iter()
        .map(|c| {
            c.create_queue_pair(QueuePairOptions {
                // one more ring entry than commands in flight
                depth: depth + 1,
                // production's command timeout (30 s): its checks are part of the cost
                ..Default::default()
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let pool = BufferPool::new(
        ctrls[0].iova_space(),
        IO_SIZE as usize,
        depth as usize,
        PageSize::Small4K,
        None,
    )
    .map_err(|e| e.to_string())?;
    // Reads of a null device need distinct buffers only in spirit: all use buffer 0's IOVA.
    let buf = IoBuffer {
        iova: pool.region().iova(),
        len: IO_SIZE,
    };
    let span = blocks - (IO_SIZE / bs) as u64;
    let mut rng = fastrand::Rng::with_seed(0x9E37_79B9_7F4A_7C15);
    let mut next_lba = move || rng.u64(..span) & !((IO_SIZE / bs) as u64 - 1);
    let per_drive = ios / drives as u64;
    let start = Instant::now();
    let mut submitted = vec![0u64; qps.len()];
    let mut completed = 0u64;
    let mut failed = 0u64;
    for (qp, sub) in qps.iter_mut().zip(submitted.iter_mut()) {
        while *sub < per_drive.min(depth as u64) {
            submit(qp, next_lba(), buf, *sub)?;
            *sub += 1;
        }
    }
    let total = per_drive * drives as u64;
    while completed < total {
        for (qp, sub) in qps.iter_mut().zip(submitted.iter_mut()) {
            let done = poll(qp, &mut failed);
            completed += done;
            let refill = done.min(per_drive - *sub);
            for _ in 0..refill {
                submit(qp, next_lba(), buf, *sub)?;
                *sub += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let doorbells: u64 = qps
        .iter()
        .map(|q| q.stats().sq_doorbells + q.stats().cq_doorbells)
        .sum();
    let (dma, host) = qps[0].memory_bytes();
    println!(
        "drives={drives} qd={depth} ios={total} failed={failed} seconds={secs:.3} iops={:.0} mmio_doorbells={doorbells} qp_dma_bytes={dma} qp_host_bytes={host}",
        total as f64 / secs
    );
    if failed > 0 {
        return Err(format!("{failed} reads failed"));
    }
    Ok(())
}
