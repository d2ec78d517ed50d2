//! The exit path: every open device's BAR0 in a process-wide table, which a signal handler
//! walks to disable the controllers of a process about to `_exit` (a second Ctrl-C).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use crate::mmio::Bar;
use crate::regs::Registers;
use crate::spec::registers::reg;

/// Most VFIO devices [`disable_all_for_exit`] knows of at once.
const MAX_LIVE: usize = 256;

/// BAR0 of every open VFIO device. A slot is taken by a swap to null, by whoever needs the
/// pointer last: the device's drop (then the mapping is unmapped) or the signal handler (then the
/// process exits): never both.
static LIVE: [AtomicPtr<Bar>; MAX_LIVE] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_LIVE];

pub(super) fn register_live(bar: &Arc<Bar>) -> Option<usize> {
    let ptr = Arc::as_ptr(bar).cast_mut();
    let slot = LIVE.iter().position(|s| {
        s.compare_exchange(
            std::ptr::null_mut(),
            ptr,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
    });
    if slot.is_none() {
        log::warn!("more than {MAX_LIVE} VFIO devices: a second Ctrl-C will not disable the rest");
    }
    slot
}

pub(super) fn unregister_live(slot: usize, bar: &Arc<Bar>) {
    let ptr = Arc::as_ptr(bar).cast_mut();
    let taken = LIVE[slot].compare_exchange(
        ptr,
        std::ptr::null_mut(),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    if taken.is_err() {
        // The exit path took this BAR: it writes CC and ends the process; the mapping must stay
        // until then.
        loop {
            std::thread::park();
        }
    }
}

/// Disables (CC.EN = 0) the controller of every VFIO device this process has open, for a process
/// about to `_exit` without shutting them down (a second Ctrl-C). Async-signal-safe: atomic swaps
/// and one volatile MMIO store per device, nothing else. Devices dropped afterwards wait for the
/// exit instead of unmapping their BAR under this function.
pub fn disable_all_for_exit() -> usize {
    let mut disabled = 0;
    for slot in &LIVE {
        let ptr = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if ptr.is_null() {
            continue;
        }
        // SAFETY: a non-null slot points to a live Bar: its device's drop clears the slot before
        // the Bar can be dropped, and once this swap took the pointer, that drop waits forever
        // instead (see `unregister_live`).
        let bar = unsafe { &*ptr };
        bar.write32(reg::CC, 0);
        disabled += 1;
    }
    disabled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_path_disables_every_live_bar_once() {
        let path = std::env::temp_dir().join(format!("usnvme-live-bar-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 8192]).expect("a file to map");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let bar = Arc::new(Bar::map(&file, 0, 8192).expect("map"));
        bar.write32(reg::CC, 0x46_0001); // enabled
        let slot = register_live(&bar).expect("a slot");
        assert!(disable_all_for_exit() >= 1);
        assert_eq!(bar.read32(reg::CC), 0, "CC.EN cleared");
        assert!(LIVE[slot].load(Ordering::Acquire).is_null(), "taken once");
        // (unregistering now would wait for the exit: the slot is gone, as the protocol says)
        let _ = std::fs::remove_file(&path);
    }
}
