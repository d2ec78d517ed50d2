//! Fuzzing entry points (feature `fuzzing`): everything the driver takes from a device, fed with
//! arbitrary bytes, and the invariants that must hold whatever the bytes are. Each entry point
//! takes the fuzzer's bytes and panics only when an invariant breaks: no other panic, no hang
//! (every loop is bounded, every wait has a deadline), no unbounded memory.
//!
//! - [`completions`]: a queue pair over DMA memory the fuzzer writes completion entries into
//!   (phase tags, command ids, SQ heads, statuses), checked against a model of the rings.
//! - [`identify`]: Identify Controller / Namespace data and the Active Namespace ID list, parsed
//!   alone and through a whole bring-up (`Controller::init`) against a `sim` controller whose
//!   admin answers are replaced by the fuzzer's bytes.
//! - [`log_pages`]: SMART / Health, Error Information and Firmware Slot log pages, parsed alone
//!   and through `Controller::smart_log` / `error_log` / `firmware_log`.
//! - [`sim_faults`]: a sequence of I/O, fault injections (`sim::Fault`), resets and polls against
//!   a RAM-backed `sim` drive, checked against a model of the disk.
//!
//! `driver/fuzz/` holds the cargo-fuzz targets (one line each) and `cargo xtask fuzz` runs them;
//! the unit tests below run every entry point over handcrafted inputs in ordinary `cargo test`
//! (`cargo test -p usnvme-driver --features fuzzing fuzzing`).

mod cq;
mod faults;
mod identify;

/// Feeds `data` as completion queue entries to a queue pair and checks every completion against
/// a model: each hands back a token that was submitted and is not yet completed, entries naming
/// no command in flight are counted as garbage, `in_flight` matches, doorbells stay in the ring,
/// and the queue pair accepts commands again once nothing is in flight.
pub fn completions(data: &[u8]) {
    cq::run(data);
}

/// Parses `data` as Identify Controller / Namespace data and a namespace list, alone and through
/// a `Controller` bring-up, and checks what the driver makes of them.
pub fn identify(data: &[u8]) {
    identify::run_identify(data);
}

/// Parses `data` as SMART / Health, Error Information and Firmware Slot log pages, alone and
/// through the `Controller` log page calls.
pub fn log_pages(data: &[u8]) {
    identify::run_log_pages(data);
}

/// Decodes `data` into steps (I/O, injected faults, resets, polls) against a RAM-backed `sim`
/// drive: every command completes exactly once (or the queue pair reports the device dead), and
/// what was written and not overwritten reads back equal.
pub fn sim_faults(data: &[u8]) {
    faults::run(data);
}

/// The fuzzer's bytes as a stream of small numbers; zeroes once they run out.
#[derive(Debug, Clone)]
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }

    /// A number below `n` (0 when `n` is 0), from one byte when `n` is at most 256.
    fn below(&mut self, n: u32) -> u32 {
        let raw = if n <= 256 {
            u32::from(self.u8())
        } else {
            self.u32()
        };
        raw.checked_rem(n).unwrap_or(0)
    }

    /// Up to `n` bytes (fewer when the input runs out).
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }
}

/// `bytes` zero-padded (or cut) to exactly `N` bytes.
fn padded<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut page = [0u8; N];
    let n = bytes.len().min(N);
    page[..n].copy_from_slice(&bytes[..n]);
    page
}

/// A printable-ASCII string as the spec's string fields decode to: no control or non-ASCII
/// characters, no surrounding spaces, at most `max` characters.
fn assert_clean_ascii(what: &str, s: &str, max: usize) {
    assert!(
        s.len() <= max,
        "{what}: {} characters from {max} bytes",
        s.len()
    );
    assert!(
        s.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "{what}: {s:?} has non-printable characters"
    );
    assert_eq!(s, s.trim(), "{what}: surrounding spaces");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_reads_little_endian_and_zeroes_past_the_end() {
        let mut input = Input::new(&[1, 2, 3, 4, 5]);
        assert_eq!(input.u16(), 0x0201);
        assert_eq!(input.u32(), 0x0005_0403);
        assert!(input.is_empty());
        assert_eq!(input.u64(), 0);
        assert_eq!(input.below(0), 0);
        let mut input = Input::new(&[9, 1, 0, 0, 0]);
        assert_eq!(input.below(4), 1, "one byte");
        assert_eq!(input.below(1000), 1, "four bytes");
        let mut input = Input::new(&[7, 8, 9]);
        assert_eq!(input.bytes(2), &[7, 8]);
        assert_eq!(input.bytes(5), &[9]);
        assert_eq!(padded::<4>(&[1, 2]), [1, 2, 0, 0]);
        assert_eq!(padded::<1>(&[1, 2]), [1]);
    }

    #[test]
    #[should_panic(expected = "non-printable")]
    fn ascii_check_catches_control_characters() {
        assert_clean_ascii("model", "a\u{1}b", 40);
    }
}
