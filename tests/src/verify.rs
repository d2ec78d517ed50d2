//! A reactor job that writes and reads back random blocks, checking every read against a model
//! of what it wrote: the data check of the engine suites, on `sim` and in the VM.

use std::collections::HashMap;

use usnvme_driver::IoBuffer;
use usnvme_engine::{BlockError, Job, Op, ReactorContext, ReactorInfo};
use usnvme_hugepages::{BufferPool, DmaBuffer};

/// A job that writes and reads back random blocks in its own part of each device, checking
/// every read against its model of what it wrote.
#[derive(Debug)]
pub struct Verify {
    ios: u64,
    io_sizes: Vec<u64>,
    state: Vec<DeviceState>,
    rng: u64,
    reactor: usize,
    reactors: usize,
    mismatches: u64,
    errors: Vec<String>,
}

#[derive(Debug)]
struct DeviceState {
    pool: BufferPool,
    free: Vec<DmaBuffer>,
    in_flight: HashMap<u64, (DmaBuffer, Op, u64, u64)>,
    /// seed written per block offset (0: never written: reads must be zeroes)
    model: HashMap<u64, u64>,
    done: u64,
    submitted: u64,
}

/// What a read buffer holds before the read.
const POISON: u8 = 0xff;

fn fill(seed: u64, block: u64, bs: u64) -> Vec<u8> {
    (0..bs)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(block * 7 + i) % 251) as u8)
        .collect()
}

impl Verify {
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }
}

impl Job for Verify {
    type Output = (u64, u64, Vec<String>);

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        for (d, dev) in ctx.devices.iter_mut().enumerate() {
            if self.state.len() <= d {
                let pool = dev.buffer_pool(256 << 10, 16).expect("buffers");
                let mut st = DeviceState {
                    pool,
                    free: Vec::new(),
                    in_flight: HashMap::new(),
                    model: HashMap::new(),
                    done: 0,
                    submitted: 0,
                };
                while let Some(b) = st.pool.alloc() {
                    st.free.push(b);
                }
                self.state.push(st);
            }
            let bs = dev.info.block_size as u64;
            // each reactor owns one slice of every device
            // the upper half of the device only: the VM suite checks the lower half's bytes
            // in the image files after the run
            let half = dev.info.size_bytes / 2 / bs * bs;
            let slice = half / self.reactors as u64 / bs * bs;
            let base = half + slice * self.reactor as u64;
            while self.state[d].submitted < self.ios
                && !self.state[d].free.is_empty()
                && dev.has_room()
            {
                let r = self.next();
                let len = self.io_sizes[(r % self.io_sizes.len() as u64) as usize];
                let offset = base + (self.next() % ((slice - len) / bs)) * bs;
                let op = if self.next().is_multiple_of(2) {
                    Op::Write
                } else {
                    Op::Read
                };
                let seed = (self.next() & 0xffff_ffff) | 1; // packed with the length below
                let st = &mut self.state[d];
                // I/Os in flight together never overlap: their order would be undefined
                let overlaps = st.in_flight.values().any(|&(_, _, o, packed)| {
                    let l = packed & 0xffff_ffff;
                    offset < o + l && o < offset + len
                });
                if overlaps {
                    continue;
                }
                let Some(buf) = st.free.pop() else { break };
                if op == Op::Write {
                    for b in 0..len / bs {
                        buf.write_from(&fill(seed, (offset / bs) + b, bs), (b * bs) as usize)
                            .expect("fill");
                    }
                } else {
                    // A read that completes but brings no data must not pass for what the
                    // buffer held before (it may be this very block's last write): 0xff is a
                    // byte `fill` never makes (mod 251).
                    buf.fill(POISON);
                }
                let io = IoBuffer {
                    iova: buf.iova(),
                    len: len as u32,
                };
                let token = st.submitted;
                match dev.submit(op, offset, len, Some(io), token) {
                    Ok(()) => {
                        st.in_flight
                            .insert(token, (buf, op, offset, len ^ (seed << 32)));
                        st.submitted += 1;
                    }
                    Err(e) => {
                        // nothing else should refuse an I/O here: report it and end the job
                        st.free.push(buf);
                        if !matches!(e, BlockError::Busy { .. }) {
                            self.errors.push(e.to_string());
                        }
                        break;
                    }
                }
            }
            let st = &mut self.state[d];
            let (mut mismatches, mut errors) = (0u64, Vec::new());
            dev.poll(|c| {
                let (buf, op, offset, packed) =
                    st.in_flight.remove(&c.token).expect("a token given once");
                let (len, seed) = (packed & 0xffff_ffff, packed >> 32);
                match c.result() {
                    Err(e) => errors.push(e.to_string()),
                    Ok(()) if op == Op::Write => {
                        for b in 0..len / bs {
                            st.model.insert(offset / bs + b, seed);
                        }
                    }
                    Ok(()) => {
                        let mut got = vec![0u8; bs as usize];
                        for b in 0..len / bs {
                            buf.read_into(&mut got, (b * bs) as usize)
                                .expect("read back");
                            // a block this job has not written holds whatever was there
                            // before (zeroes on a fresh drive, an earlier test's data)
                            let Some(&seed) = st.model.get(&(offset / bs + b)) else {
                                continue;
                            };
                            let want = fill(seed, offset / bs + b, bs);
                            if got != want {
                                mismatches += 1;
                            }
                        }
                    }
                }
                st.free.push(buf);
                st.done += 1;
            });
            self.mismatches += mismatches;
            self.errors.extend(errors);
        }
        self.errors.is_empty()
            && (self.state.len() < ctx.devices.len()
                || self.state.iter().any(|s| s.done < self.ios))
    }

    fn finish(self, _ctx: &mut ReactorContext) -> Self::Output {
        let done = self.state.iter().map(|s| s.done).sum();
        (done, self.mismatches, self.errors)
    }
}

/// `ios` I/Os per device of the given sizes; `reactors`: how many reactors share each device
/// (each takes its own slice of it).
pub fn verify_job(
    ios: u64,
    reactors: usize,
    io_sizes: Vec<u64>,
) -> impl Fn(&ReactorInfo) -> Verify {
    move |info| Verify {
        ios,
        io_sizes: io_sizes.clone(),
        state: Vec::new(),
        rng: 0x9e37_79b9_7f4a_7c15 ^ (info.cpu as u64 + 1),
        // with one reactor per device, it owns all of it
        reactor: if reactors == 1 { 0 } else { info.index },
        reactors,
        mismatches: 0,
        errors: Vec::new(),
    }
}
