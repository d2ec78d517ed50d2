//! Ctrl-C and SIGTERM. The first asks the command to stop: work in progress finishes and every
//! controller is shut down as its owner drops it (queues deleted, CC.SHN, DMA unmapped); the
//! command then exits 130 (SIGINT) or 143 (SIGTERM). A second signal exits at once, after
//! disabling (CC.EN = 0) the controller of every drive the process has open through VFIO, so
//! that none is left running DMA into memory that is about to go away. (Simulated drives live in
//! the process: nothing to do for them.)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGINT, SIGTERM};

struct Received {
    any: Arc<AtomicBool>,
    which: Arc<AtomicUsize>,
}

static RECEIVED: OnceLock<Received> = OnceLock::new();

/// Installs the handlers (once).
pub fn install() -> std::io::Result<()> {
    let received = RECEIVED.get_or_init(|| Received {
        any: Arc::new(AtomicBool::new(false)),
        which: Arc::new(AtomicUsize::new(0)),
    });
    for signal in [SIGINT, SIGTERM] {
        let any = received.any.clone();
        // Registered first, so it sees the flag as the previous signal left it.
        // SAFETY: the action is async-signal-safe: an atomic load, then (on a second signal)
        // atomic swaps and volatile MMIO stores (`disable_all_for_exit`) and `_exit`.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                if any.load(Ordering::SeqCst) {
                    usnvme_driver::vfio::disable_all_for_exit();
                    signal_hook::low_level::exit(128 + signal);
                }
            })
        }?;
        signal_hook::flag::register(signal, received.any.clone())?;
        signal_hook::flag::register_usize(signal, received.which.clone(), signal as usize)?;
    }
    Ok(())
}

/// The signal received, if any.
pub fn received() -> Option<i32> {
    let r = RECEIVED.get()?;
    r.any
        .load(Ordering::SeqCst)
        .then(|| r.which.load(Ordering::SeqCst) as i32)
}

/// SIGHUP from now on (a target's "read your config again"): the flag is set at each, and the
/// process no longer ends on it.
pub fn hangups() -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, flag.clone())?;
    Ok(flag)
}

/// The conventional exit status after `signal`.
pub fn exit_status(signal: i32) -> u8 {
    (128 + signal).clamp(0, 255) as u8
}

pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
