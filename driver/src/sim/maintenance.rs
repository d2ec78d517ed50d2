//! Sanitize and Device Self-test: operations that go on after their command completed, their
//! progress and outcome reported by log pages (QEMU's controller has neither: the VM suite says
//! so). Each takes [`SimConfig::maintenance_time`](super::SimConfig) (or what a test sets);
//! I/O is refused with
//! "Sanitize In Progress" while a sanitize runs (the data is erased when it starts).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Ctx, Outcome};
use crate::spec::log::{SanitizeStatus, SELF_TEST_LOG_BYTES};
use crate::spec::{Sqe, Status};

/// SANICAP: Crypto Erase and Block Erase supported (not Overwrite).
pub(super) const SANICAP: u32 = 0b011;
/// Results the self-test log keeps.
const RESULTS: usize = 20;
const RESULT_BYTES: usize = 28;

/// The state of both operations (kept over controller resets, as a drive's is).
#[derive(Debug)]
pub(crate) struct Maintenance {
    /// Set while a sanitize runs: the I/O path reads only this.
    sanitizing: AtomicBool,
    /// How long each runs, in nanoseconds.
    took_ns: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The sanitize under way: when it started.
    sanitize: Option<Instant>,
    /// SSTAT of the last one (0: never).
    sanitize_state: u8,
    /// The self-test under way: its code (1 short, 2 extended) and when it started.
    self_test: Option<(u8, Instant)>,
    /// Results, newest first: code and result.
    results: VecDeque<(u8, u8)>,
}

impl State {
    /// Ends what has run its time.
    fn settle(&mut self, took: Duration) {
        if self.sanitize.is_some_and(|t| t.elapsed() >= took) {
            self.sanitize = None;
            self.sanitize_state = 1; // completed successfully
        }
        if let Some((code, t)) = self.self_test {
            if t.elapsed() >= took {
                self.self_test = None;
                self.record(code, 0); // completed without error
            }
        }
    }

    fn record(&mut self, code: u8, result: u8) {
        self.results.push_front((code, result));
        self.results.truncate(RESULTS);
    }
}

/// How far an operation that started at `t` is, of `took`, in `scale`ths.
fn progress(t: Instant, took: Duration, scale: u32) -> u32 {
    let done = t.elapsed().as_secs_f64() / took.as_secs_f64().max(1e-9);
    (done.min(1.0) * f64::from(scale)) as u32
}

impl Maintenance {
    pub fn new(took: Duration) -> Maintenance {
        let m = Maintenance {
            sanitizing: AtomicBool::new(false),
            took_ns: AtomicU64::new(0),
            state: Mutex::default(),
        };
        m.set_time(took);
        m
    }

    pub fn set_time(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.took_ns.store(ns, Ordering::Relaxed);
    }

    fn took(&self) -> Duration {
        Duration::from_nanos(self.took_ns.load(Ordering::Relaxed))
    }

    /// The state, with what has run its time ended.
    fn settled(&self) -> (parking_lot::MutexGuard<'_, State>, Duration) {
        let took = self.took();
        let mut state = self.state.lock();
        state.settle(took);
        (state, took)
    }

    /// Whether I/O is refused now (a sanitize runs); ends it when its time is up.
    pub fn sanitizing(&self) -> bool {
        if !self.sanitizing.load(Ordering::Relaxed) {
            return false;
        }
        let (state, _) = self.settled();
        let running = state.sanitize.is_some();
        self.sanitizing.store(running, Ordering::Relaxed);
        running
    }
}

/// Sanitize (admin 84h): SANACT 1 exits a failure, 2 Block Erase, 4 Crypto Erase (3, Overwrite,
/// is not supported). Erases every namespace and runs on for the maintenance time.
pub(super) fn sanitize(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let inner = ctx.inner;
    let (mut state, _) = inner.maintenance.settled();
    if state.sanitize.is_some() {
        return Err(Outcome::fail(Status::SANITIZE_IN_PROGRESS));
    }
    match sqe.cdw10 & 7 {
        1 => {
            if state.sanitize_state == 3 {
                state.sanitize_state = 1;
            }
            return Ok(Outcome::ok(0));
        }
        2 | 4 => {}
        _ => return Err(Outcome::fail(Status::INVALID_FIELD).at(40)),
    }
    for store in inner.stores.iter().chain(&inner.metadata_stores) {
        store.clear();
    }
    state.sanitize = Some(Instant::now());
    state.sanitize_state = 2;
    inner.maintenance.sanitizing.store(true, Ordering::Relaxed);
    Ok(Outcome::ok(0))
}

/// Device Self-test (admin 14h): STC 1 short, 2 extended, Fh aborts the one under way.
pub(super) fn self_test(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let (mut state, _) = ctx.inner.maintenance.settled();
    match (sqe.cdw10 & 0xf) as u8 {
        code @ (1 | 2) => {
            if state.self_test.is_some() {
                return Err(Outcome::fail(Status::SELF_TEST_IN_PROGRESS));
            }
            state.self_test = Some((code, Instant::now()));
        }
        0xf => {
            if let Some((code, _)) = state.self_test.take() {
                state.record(code, 1); // aborted by a Device Self-test command
            }
        }
        _ => return Err(Outcome::fail(Status::INVALID_FIELD).at(40)),
    }
    Ok(Outcome::ok(0))
}

/// The Sanitize Status log page (512 bytes).
pub(super) fn sanitize_log(ctx: &Ctx) -> Vec<u8> {
    let (state, took) = ctx.inner.maintenance.settled();
    let sprog = state
        .sanitize
        .map_or(0xffff, |t| progress(t, took, 0xffff).min(0xfffe) as u16);
    let mut log = vec![0u8; 512];
    log[..4].copy_from_slice(&SanitizeStatus::to_bytes(sprog, state.sanitize_state));
    log
}

/// The Device Self-test log page.
pub(super) fn self_test_log(ctx: &Ctx) -> Vec<u8> {
    let (state, took) = ctx.inner.maintenance.settled();
    let mut log = vec![0u8; SELF_TEST_LOG_BYTES];
    if let Some((code, t)) = state.self_test {
        log[0] = code;
        log[1] = progress(t, took, 100).min(99) as u8;
    }
    for (i, entry) in log[4..].chunks_exact_mut(RESULT_BYTES).enumerate() {
        entry[0] = match state.results.get(i) {
            Some(&(code, result)) => code << 4 | result,
            None => 0xf, // unused
        };
    }
    log
}
