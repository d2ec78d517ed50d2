//! Firmware Image Download and Firmware Commit (QEMU's controller has neither): two slots, slot 1
//! read-only; an image's revision is its first 8 bytes (printable ASCII, as Identify's FR); a
//! committed image runs from the next controller reset, or at once (Commit Action 3).

use parking_lot::Mutex;

use super::{Ctx, Outcome};
use crate::spec::{put_ascii, FirmwareSlotLog, Sqe, Status};

/// FRMW: 2 slots (bits 3:1), slot 1 read-only (bit 0), activation without reset (bit 4).
pub(super) const FRMW: u8 = 0b1_0101;
const SLOTS: usize = 2;

#[derive(Debug)]
pub(crate) struct Firmware {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Each slot's revision (None: empty).
    slots: [Option<[u8; 8]>; SLOTS],
    active: usize,
    /// The slot to run from at the next reset.
    next: Option<usize>,
    /// What Firmware Image Download has put together so far.
    image: Vec<u8>,
}

impl Firmware {
    /// Slot 1 holds `revision` and runs.
    pub fn new(revision: &str) -> Firmware {
        let mut first = [0u8; 8];
        put_ascii(&mut first, revision);
        Firmware {
            state: Mutex::new(State {
                slots: [Some(first), None],
                active: 0,
                next: None,
                image: Vec::new(),
            }),
        }
    }

    /// The revision running (Identify Controller FR).
    pub fn revision(&self) -> [u8; 8] {
        let s = self.state.lock();
        s.slots[s.active].unwrap_or_default()
    }

    /// A controller reset: the slot committed for it runs from now on.
    pub fn on_reset(&self) {
        let mut s = self.state.lock();
        if let Some(next) = s.next.take() {
            s.active = next;
        }
    }

    pub fn slot_log(&self) -> FirmwareSlotLog {
        let s = self.state.lock();
        let mut log = FirmwareSlotLog::zeroed();
        log.afi = (s.active as u8 + 1) | s.next.map_or(0, |n| (n as u8 + 1) << 4);
        for (out, slot) in log.frs.iter_mut().zip(&s.slots) {
            *out = slot.unwrap_or_default();
        }
        log
    }
}

/// Firmware Image Download (admin 11h): `NUMD + 1` dwords at dword offset `OFST`, in order.
pub(super) fn download(ctx: &Ctx, sqe: &Sqe, data: &[u8]) -> Result<Outcome, Outcome> {
    let offset = sqe.cdw11 as usize * 4;
    let mut s = ctx.inner.firmware.state.lock();
    // a download starts at 0 and goes on where the last part ended
    if offset == 0 {
        s.image.clear();
    } else if offset != s.image.len() {
        return Err(Outcome::fail(Status::OVERLAPPING_RANGE).at(44));
    }
    s.image.extend_from_slice(data);
    Ok(Outcome::ok(0))
}

/// Bytes a Firmware Image Download carries.
pub(super) fn download_bytes(sqe: &Sqe) -> u64 {
    (u64::from(sqe.cdw10) + 1) * 4
}

/// Firmware Commit (admin 10h): Firmware Slot (bits 2:0; 0: the controller's choice) and
/// Commit Action (bits 5:3): 0 replace, 1 replace and activate at reset, 2 activate at reset,
/// 3 replace and activate now.
pub(super) fn commit(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let mut s = ctx.inner.firmware.state.lock();
    let action = (sqe.cdw10 >> 3) & 7;
    let slot = match (sqe.cdw10 & 7) as usize {
        0 => SLOTS, // the one writable slot
        n @ 1..=SLOTS => n,
        _ => return Err(Outcome::fail(Status::INVALID_FIRMWARE_SLOT).at(40)),
    } - 1;
    let replace = matches!(action, 0 | 1 | 3);
    if replace {
        if slot == 0 {
            return Err(Outcome::fail(Status::INVALID_FIRMWARE_SLOT).at(40)); // read-only
        }
        let revision: Option<[u8; 8]> = s
            .image
            .get(..8)
            .and_then(|r| r.try_into().ok())
            .filter(|r: &[u8; 8]| r.iter().all(|b| b.is_ascii_graphic() || *b == b' '));
        let Some(revision) = revision else {
            return Err(Outcome::fail(Status::INVALID_FIRMWARE_IMAGE));
        };
        s.slots[slot] = Some(revision);
        s.image.clear();
    }
    if s.slots[slot].is_none() {
        return Err(Outcome::fail(Status::INVALID_FIRMWARE_SLOT).at(40));
    }
    match action {
        0 => {}
        1 | 2 => s.next = Some(slot),
        3 => s.active = slot,
        _ => return Err(Outcome::fail(Status::INVALID_FIELD).at(40)),
    }
    Ok(Outcome::ok(0))
}
