//! The `identify` and `log_pages` targets. The bytes are parsed alone (the `spec` types and their
//! accessors) and then through the `Controller` that consumes them: a `sim` controller answers
//! every admin command, and a register-level stand-in ([`Scripted`]) replaces the data of its
//! Identify and Get Log Page answers with the fuzzer's bytes before the driver reads them, so the
//! real bring-up and log page code runs on them.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use usnvme_hugepages::{BufferPool, IovaSpace, PageSize};
use vm_memory::{Bytes, GuestAddress};

use super::{assert_clean_ascii, padded, Input};
use crate::controller::{Controller, ControllerOptions, QueuePairOptions};
use crate::error::Error;
use crate::prp::PAGE;
use crate::regs::Registers;
use crate::sim::{SimConfig, SimController};
use crate::spec::command::Cns;
use crate::spec::identify::SglSupport;
use crate::spec::log::CriticalWarning;
use crate::spec::registers::{reg, sq_tail_doorbell};
use crate::spec::{
    AdminOpcode, ErrorLogEntry, FirmwareSlotLog, IdentifyController, IdentifyNamespace, LogPageId,
    NamespaceList, SmartLog, Sqe,
};
use crate::{IoBuffer, SubmitError};

/// The driver's own cap on one transfer, and the largest namespace ID it uses (see
/// `bringup::max_transfer` and `namespaces::MAX_NSID`).
const DRIVER_MAX_TRANSFER: u64 = 2 << 20;
const MAX_NSID: u32 = 4096;
/// Bytes of Identify Controller the fuzzer gives (the rest is zero): every field the driver
/// reads lies below.
const CONTROLLER_BYTES: usize = 1024;
/// Bytes of each Identify Namespace (the rest is zero): through the 64 LBA formats.
const NAMESPACE_BYTES: usize = 384;
const MAX_NAMESPACE_PAGES: usize = 8;
/// Namespaces whose I/O path is tried after a bring-up.
const IO_NAMESPACES: usize = 4;

/// What the stand-in answers instead of the `sim` controller.
#[derive(Debug, Default)]
struct Script {
    /// The admin SQ tail as last rung (0 after every CC write: enable, disable, shutdown).
    tail: u16,
    controller: Option<Vec<u8>>,
    list: Option<Vec<u8>>,
    /// Identify Namespace pages, in the order the driver asks (cycled); none: zeroes.
    namespaces: Vec<Vec<u8>>,
    namespaces_asked: usize,
    /// Active Namespace ID list fails (Invalid Field), as on NVMe 1.0 controllers.
    list_unsupported: bool,
    /// Identify Namespace goes to the `sim` with the driver's NSID (it fails those it lacks);
    /// otherwise it asks for namespace 1 and the answer is replaced.
    keep_nsid: bool,
    logs: HashMap<u8, Vec<u8>>,
}

impl Script {
    /// Rewrites `sqe` as the script says; returns the data to put in its buffer afterwards.
    fn answer(&mut self, sqe: &mut Sqe) -> Option<Vec<u8>> {
        match AdminOpcode::from_raw(sqe.opcode()) {
            Some(AdminOpcode::Identify) => match Cns::from_raw(sqe.cdw10 as u8) {
                Some(Cns::Controller) => self.controller.clone(),
                Some(Cns::ActiveNamespaceList) if self.list_unsupported => {
                    sqe.cdw10 |= 0xff; // a CNS the controller does not know
                    None
                }
                Some(Cns::ActiveNamespaceList) => self.list.clone(),
                Some(Cns::Namespace) => {
                    if !self.keep_nsid {
                        sqe.nsid = 1;
                    }
                    let page = self
                        .namespaces
                        .get(self.namespaces_asked % self.namespaces.len().max(1))
                        .cloned()
                        .unwrap_or_else(|| vec![0; 4096]);
                    self.namespaces_asked += 1;
                    Some(page)
                }
                _ => None,
            },
            Some(AdminOpcode::GetLogPage) => {
                let log = self.logs.get(&(sqe.cdw10 as u8))?;
                let dwords = (((sqe.cdw11 & 0xffff) << 16) | (sqe.cdw10 >> 16)) as usize + 1;
                let mut data = log.clone();
                data.resize(dwords * 4, 0);
                Some(data)
            }
            _ => None,
        }
    }
}

/// A `sim` controller's registers with a [`Script`] in front: on the admin SQ doorbell it reads
/// the new commands from the ring, rewrites them as the script says, lets the controller run
/// them (inline, in this thread), then overwrites their data buffers before the driver looks.
#[derive(Debug)]
struct Scripted {
    sim: Arc<SimController>,
    space: Arc<IovaSpace>,
    script: Mutex<Script>,
}

impl Registers for Scripted {
    fn read32(&self, offset: usize) -> u32 {
        self.sim.read32(offset)
    }

    fn write32(&self, offset: usize, value: u32) {
        if offset == reg::CC {
            self.script.lock().tail = 0;
        }
        if offset != sq_tail_doorbell(0, 0) {
            return self.sim.write32(offset, value);
        }
        let mem = self.space.memory();
        let entries = (self.sim.read32(reg::AQA) & 0xfff) as u16 + 1;
        let asq = self.sim.read64(reg::ASQ);
        let mut answers = Vec::new();
        {
            let mut script = self.script.lock();
            let mut at = script.tail;
            for _ in 0..entries {
                if at == value as u16 || at >= entries {
                    break;
                }
                let addr = GuestAddress(asq + at as u64 * 64);
                if let Ok(mut sqe) = mem.read_obj::<Sqe>(addr) {
                    if let Some(data) = script.answer(&mut sqe) {
                        answers.push((sqe.prp1, data));
                    }
                    let _ = mem.write_obj(sqe, addr);
                }
                at = (at + 1) % entries;
            }
            script.tail = value as u16;
        }
        self.sim.write32(offset, value);
        // the driver's admin data buffer is one IOVA-contiguous region starting at PRP1
        for (prp1, data) in answers {
            let _ = mem.write_slice(&data, GuestAddress(prp1));
        }
    }
}

fn options() -> ControllerOptions {
    ControllerOptions {
        io_queues: 2,
        admin_depth: 8,
        admin_timeout: Duration::from_secs(2),
        page: PageSize::Small4K,
        ..ControllerOptions::default()
    }
}

fn start(script: Script) -> (Result<Controller, Error>, Arc<Scripted>) {
    let space = crate::sim::iova_space();
    let sim = SimController::new(SimConfig::default(), space.clone());
    let regs = Arc::new(Scripted {
        sim,
        space: space.clone(),
        script: Mutex::new(script),
    });
    let ctrl = Controller::init(
        "sim:fuzz".into(),
        regs.clone(),
        None,
        space,
        None,
        None,
        options(),
    );
    (ctrl, regs)
}

/// What the identify target did (the unit tests look at it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct IdentifyReport {
    pub brought_up: bool,
    pub namespaces: Vec<u32>,
    pub ios: usize,
}

pub(super) fn run_identify(data: &[u8]) -> IdentifyReport {
    let mut input = Input::new(data);
    let flags = input.u8();
    let ids: Vec<u32> = (0..flags & 7).map(|_| input.u32()).collect();
    let controller: [u8; 4096] = padded(input.bytes(CONTROLLER_BYTES));
    let mut namespaces = Vec::new();
    while !input.is_empty() && namespaces.len() < MAX_NAMESPACE_PAGES {
        namespaces.push(padded::<4096>(input.bytes(NAMESPACE_BYTES)));
    }
    let list = NamespaceList::from_ids(ids.iter().copied());

    // the structures alone
    let id = IdentifyController::from_bytes(&controller);
    check_controller(&id);
    namespaces
        .iter()
        .for_each(|ns| check_namespace(&IdentifyNamespace::from_bytes(ns)));
    let listed: Vec<u32> = list.iter().collect();
    assert!(listed.len() <= 1024 && listed.iter().all(|&n| n != 0));
    assert_eq!(
        format!("{list:?}").matches(',').count(),
        listed.len().saturating_sub(1)
    );

    // through a bring-up
    let list_unsupported = flags & 0x08 != 0;
    let keep_nsid = flags & 0x10 != 0;
    let (ctrl, _regs) = start(Script {
        controller: Some(controller.to_vec()),
        list: Some(list.as_bytes().to_vec()),
        namespaces: namespaces.iter().map(|p| p.to_vec()).collect(),
        list_unsupported,
        keep_nsid,
        ..Script::default()
    });
    let ctrl = match ctrl {
        Ok(ctrl) => ctrl,
        // the sim lacks the namespace the driver asked for: an honest error
        Err(Error::Command { .. }) if keep_nsid => return IdentifyReport::default(),
        Err(e) => panic!("bring-up failed on fuzzed identify data: {e}"),
    };
    let mut report = IdentifyReport {
        brought_up: true,
        ..IdentifyReport::default()
    };
    assert_eq!(ctrl.identify().as_bytes(), &controller);
    let expected_max = id
        .mdts_bytes(PAGE)
        .unwrap_or(DRIVER_MAX_TRANSFER)
        .min(DRIVER_MAX_TRANSFER);
    assert_eq!(ctrl.max_transfer(), expected_max);
    assert!(ctrl.max_transfer() >= 2 * PAGE);
    // SGLs (asked for by default) exactly where the fuzzed SGLS field offers them
    assert_eq!(
        ctrl.uses_sgl(),
        matches!(id.sgl_support(), SglSupport::Any | SglSupport::DwordAligned),
        "SGLS {:#x}",
        id.sgls
    );

    // the namespaces: those of the list (or 1..=NN), in order, each with the page it was given
    let asked: Vec<u32> = if list_unsupported {
        (1..=id.nn.min(1024)).collect()
    } else {
        // ascending, each once, and only IDs the I/O path addresses
        let mut ids = listed;
        ids.sort_unstable();
        ids.dedup();
        ids.retain(|&nsid| nsid <= MAX_NSID);
        ids
    };
    let mut expected = Vec::new();
    for (i, &nsid) in asked.iter().enumerate() {
        let page = namespaces
            .get(i % namespaces.len().max(1))
            .copied()
            .unwrap_or([0; 4096]);
        let ns = IdentifyNamespace::from_bytes(&page);
        let size = ns.lba_size_bytes().filter(|b| (512..=1 << 16).contains(b));
        if let (Some(size), true) = (size, ns.nsze != 0) {
            expected.push((nsid, size as u32, ns.nsze, page));
        }
    }
    let got = ctrl.namespaces();
    for (i, n) in got.iter().enumerate() {
        assert!(
            got[..i].iter().all(|m| m.nsid != n.nsid),
            "namespace {} listed twice",
            n.nsid
        );
    }
    assert_eq!(got.len(), expected.len(), "namespaces kept");
    for (n, (nsid, size, blocks, page)) in got.iter().zip(&expected) {
        assert_eq!((n.nsid, n.block_size, n.blocks), (*nsid, *size, *blocks));
        assert!(n.block_size.is_power_of_two());
        assert_eq!(n.identify.as_bytes(), page);
        assert_eq!(n.metadata.size, n.identify.metadata_size());
        assert_eq!(n.metadata.extended, n.identify.metadata_extended());
        // protection information is kept only where its tuple fits the metadata
        if let Some(pi) = n.metadata.protection {
            assert!(pi.offset(n.metadata.size.into()).is_some());
        }
        let _ = n.capacity_bytes();
        assert_eq!(
            ctrl.namespace(n.nsid).map(|found| found.nsid).ok(),
            Some(n.nsid)
        );
        report.namespaces.push(n.nsid);
    }

    // the I/O path over what the driver made of them: whatever the sim answers, it answers
    report.ios = io_on_namespaces(&ctrl);
    report
}

/// A one-block read from each of the first namespaces; each command either is refused at
/// submission or completes.
fn io_on_namespaces(ctrl: &Controller) -> usize {
    let Ok(mut qp) = ctrl.create_queue_pair(QueuePairOptions {
        depth: 4,
        node: None,
        timeout: Some(Duration::from_millis(500)),
        interrupts: false,
    }) else {
        panic!("no I/O queue pair after a bring-up");
    };
    let mut pool = BufferPool::new(ctrl.iova_space(), 64 << 10, 1, PageSize::Small4K, None)
        .expect("fuzzing: a DMA buffer");
    let Some(buf) = pool.alloc() else {
        panic!("a fresh pool has a buffer");
    };
    let mut ios = 0;
    for n in ctrl.namespaces().iter().take(IO_NAMESPACES) {
        let len = n.block_size.min(64 << 10);
        let io = IoBuffer {
            iova: buf.iova(),
            len,
        };
        match qp.read(n.nsid, n.blocks - 1, io, n.nsid as u64) {
            Ok(()) => {}
            Err(SubmitError::ExceedsMdts { .. }) => continue,
            // a format with metadata is listed, and refused by name, never driven without it
            Err(SubmitError::Metadata { nsid, bytes })
                if nsid == n.nsid && bytes == n.metadata.size && bytes > 0 =>
            {
                continue
            }
            Err(e) => panic!("namespace {} is listed but refuses I/O: {e}", n.nsid),
        }
        let started = Instant::now();
        let mut done = None;
        while done.is_none() {
            qp.poll(|c| done = Some(c));
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "a read on namespace {} never completed",
                n.nsid
            );
        }
        assert_eq!(done.map(|c| c.token), Some(n.nsid as u64));
        ios += 1;
    }
    drop(qp);
    let _ = pool.free(buf);
    ios
}

/// What every accessor of Identify Controller makes of any bytes.
fn check_controller(id: &IdentifyController) {
    assert_clean_ascii("serial", &id.serial(), 20);
    assert_clean_ascii("model", &id.model(), 40);
    assert_clean_ascii("firmware", &id.firmware(), 8);
    assert_clean_ascii("subnqn", &id.subnqn(), 256);
    let _ = id.version().to_string();
    match id.mdts_bytes(PAGE) {
        None => assert!(id.mdts == 0 || id.mdts >= 52),
        Some(bytes) => assert_eq!(bytes, PAGE << id.mdts),
    }
    assert!(id.oacs().names().count() <= 16);
    assert!(id.oncs().names().count() <= 16);
    let _ = (id.sgl_support(), id.vwc_present(), id.total_capacity());
    let (sq, cq) = (id.sqes_range(), id.cqes_range());
    assert!(sq.0 < 16 && sq.1 < 16 && cq.0 < 16 && cq.1 < 16);
    assert!(format!("{id:?}").starts_with("IdentifyController"));
}

/// What every accessor of Identify Namespace makes of any bytes.
fn check_namespace(ns: &IdentifyNamespace) {
    let index = ns.formatted_lba_index();
    assert!(index < 64, "LBA format index {index}");
    let format = ns.lba_format();
    assert_eq!(format, Some(ns.lbaf[index]));
    if let Some(size) = ns.lba_size_bytes() {
        assert!(size.is_power_of_two() && size >= 512, "block size {size}");
        assert_eq!(ns.capacity_bytes(), ns.nsze.checked_mul(size));
    } else {
        assert_eq!(ns.capacity_bytes(), None);
    }
    assert!(ns.number_of_lba_formats() <= 256);
    let _ = (ns.metadata_size(), ns.metadata_extended());
    assert!(format!("{ns:?}").starts_with("IdentifyNamespace"));
}

/// What every accessor of the three log pages makes of any bytes.
fn check_logs(data: &[u8]) {
    let smart = SmartLog::from_bytes(&padded(data));
    let kelvin = smart.temperature_kelvin() as i32;
    assert_eq!(
        smart.temperature_celsius() as i32,
        (kelvin - 273).min(i16::MAX as i32),
        "{kelvin} K in Celsius"
    );
    for sensor in 0..=9 {
        match smart.sensor_celsius(sensor) {
            None => {}
            Some(c) => {
                assert!((1..=8).contains(&sensor), "sensor {sensor}");
                let k = smart.temperature_sensors[sensor - 1] as i32;
                assert_eq!(c as i32, (k - 273).min(i16::MAX as i32), "sensor {k} K");
            }
        }
    }
    let warnings = smart.critical_warnings();
    assert_eq!(
        warnings.names().count() as u32,
        (warnings.0 & 0x3f).count_ones()
    );
    let _ = warnings.contains(CriticalWarning::TEMPERATURE);
    assert!(smart.bytes_read() >= smart.data_units_read());
    assert!(smart.bytes_written() >= smart.data_units_written());
    let _ = (
        smart.host_read_commands(),
        smart.host_write_commands(),
        smart.controller_busy_time(),
        smart.power_cycles(),
        smart.power_on_hours(),
        smart.unsafe_shutdowns(),
        smart.media_errors(),
        smart.error_log_entries(),
    );
    assert!(format!("{smart:?}").starts_with("SmartLog"));

    for chunk in data.chunks(ErrorLogEntry::SIZE) {
        let entry = ErrorLogEntry::from_bytes(&padded(chunk));
        let status = entry.status();
        let text = status.to_string();
        assert!(text.starts_with(status.name()), "{text}");
        if let Some((_, bit)) = entry.parameter_error() {
            assert!(bit < 8, "bit {bit}");
        }
        let _ = (entry.is_empty(), status.code_type(), status.is_success());
    }

    let fw = FirmwareSlotLog::from_bytes(&padded(data));
    assert!(fw.active_slot() <= 7);
    assert!(fw.next_reset_slot().is_none_or(|s| (1..=7).contains(&s)));
    assert_eq!(fw.revision(0), None);
    assert_eq!(fw.revision(8), None);
    for (slot, revision) in fw.revisions() {
        assert!((1..=7).contains(&slot));
        assert_clean_ascii("firmware revision", &revision, 8);
    }

    if let Some(&lid) = data.first() {
        if let Some(id) = LogPageId::from_raw(lid) {
            assert_eq!(id.to_string(), id.name());
            assert_eq!(u8::from(id), lid);
        }
    }
}

/// One controller for every log page input: bring-up is not what this target tests.
fn log_controller() -> &'static (Controller, Arc<Scripted>) {
    static CONTROLLER: OnceLock<(Controller, Arc<Scripted>)> = OnceLock::new();
    CONTROLLER.get_or_init(|| {
        let (ctrl, regs) = start(Script::default());
        match ctrl {
            Ok(ctrl) => (ctrl, regs),
            Err(e) => panic!("fuzzing: the log page controller does not come up: {e}"),
        }
    })
}

/// What the log pages target did (the unit tests look at it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct LogReport {
    pub errors: usize,
    pub firmware_slots: usize,
    pub temperature: i16,
}

pub(super) fn run_log_pages(data: &[u8]) -> LogReport {
    check_logs(data);
    let (ctrl, regs) = log_controller();
    let count = data.first().map_or(1, |&b| b as usize);
    {
        let mut script = regs.script.lock();
        script.logs.clear();
        for lid in [
            LogPageId::ErrorInformation,
            LogPageId::SmartHealth,
            LogPageId::FirmwareSlot,
        ] {
            script.logs.insert(lid as u8, data.to_vec());
        }
    }
    let smart = match ctrl.smart_log() {
        Ok(smart) => smart,
        Err(e) => panic!("SMART log: {e}"),
    };
    assert_eq!(smart.as_bytes(), &padded::<512>(data));
    let fw = match ctrl.firmware_log() {
        Ok(fw) => fw,
        Err(e) => panic!("firmware slot log: {e}"),
    };
    assert_eq!(fw.as_bytes(), &padded::<512>(data));
    let errors = match ctrl.error_log(count) {
        Ok(errors) => errors,
        Err(e) => panic!("error log: {e}"),
    };
    let entries = count.clamp(1, 1 + ctrl.identify().elpe as usize);
    let mut page = data.to_vec();
    page.resize(entries * ErrorLogEntry::SIZE, 0);
    let expected: Vec<ErrorLogEntry> = page
        .chunks_exact(ErrorLogEntry::SIZE)
        .filter_map(ErrorLogEntry::from_slice)
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(errors, expected);
    regs.script.lock().logs.clear();
    LogReport {
        errors: errors.len(),
        firmware_slots: fw.revisions().count(),
        temperature: smart.temperature_celsius(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{put_ascii, LbaFormat};

    /// An input: flags, namespace ids, Identify Controller, then Identify Namespace pages.
    fn input(flags: u8, ids: &[u32], id: &IdentifyController, ns: &[IdentifyNamespace]) -> Vec<u8> {
        let mut data = vec![flags | ids.len() as u8];
        ids.iter()
            .for_each(|i| data.extend_from_slice(&i.to_le_bytes()));
        data.extend_from_slice(&id.as_bytes()[..CONTROLLER_BYTES]);
        for n in ns {
            data.extend_from_slice(&n.as_bytes()[..NAMESPACE_BYTES]);
        }
        data
    }

    fn namespace(lbads: u8, blocks: u64) -> IdentifyNamespace {
        let mut ns = IdentifyNamespace::zeroed();
        ns.nsze = blocks;
        ns.lbaf[0] = LbaFormat::new(lbads, 0);
        ns
    }

    fn controller() -> IdentifyController {
        let mut id = IdentifyController::zeroed();
        put_ascii(&mut id.sn, "FUZZ-1");
        put_ascii(&mut id.mn, "fuzzed \u{1} model");
        id.mdts = 5;
        id.nn = 3;
        id
    }

    #[test]
    fn a_bring_up_keeps_the_namespaces_with_usable_formats() {
        let ns = [namespace(9, 1 << 20), namespace(3, 100), namespace(12, 0)];
        let data = input(0, &[1, 2, 3], &controller(), &ns);
        let report = run_identify(&data);
        assert!(report.brought_up);
        assert_eq!(report.namespaces, [1], "bad format and size 0 are skipped");
        assert_eq!(report.ios, 1);
    }

    #[test]
    fn a_namespace_with_metadata_is_listed_and_takes_no_io() {
        let mut with_metadata = namespace(9, 1 << 10);
        with_metadata.lbaf[0] = LbaFormat::new(9, 8);
        let ns = [namespace(9, 1 << 10), with_metadata];
        let report = run_identify(&input(0, &[1, 2], &controller(), &ns));
        assert_eq!(report.namespaces, [1, 2]);
        assert_eq!(report.ios, 1, "only the namespace without metadata is read");
    }

    #[test]
    fn without_a_namespace_list_every_id_up_to_nn_is_asked() {
        let ns = [namespace(12, 8), namespace(9, 1 << 10)];
        let data = input(0x08, &[], &controller(), &ns);
        let report = run_identify(&data);
        assert_eq!(report.namespaces, [1, 2, 3]);
    }

    #[test]
    fn zeroes_and_garbage_bring_up_with_no_namespace() {
        assert_eq!(run_identify(&[]).namespaces, Vec::<u32>::new());
        let noise: Vec<u8> = (0..2000u32).map(|i| (i * 7919 % 251) as u8).collect();
        let report = run_identify(&noise);
        assert!(report.brought_up);
        // keep_nsid: the sim refuses a namespace ID above its NN (32), an honest error
        let data = input(0x10, &[40], &controller(), &[namespace(9, 8)]);
        assert!(!run_identify(&data).brought_up);
    }

    #[test]
    fn duplicate_and_huge_namespace_ids() {
        let ns = [namespace(9, 64)];
        let report = run_identify(&input(0, &[1, 1, 2], &controller(), &ns));
        assert_eq!(
            report.namespaces,
            [1, 2],
            "a namespace listed twice is kept once"
        );
        let report = run_identify(&input(0, &[3, 5000, u32::MAX], &controller(), &ns));
        assert_eq!(
            report.namespaces,
            [3],
            "IDs the I/O path cannot address are skipped"
        );
    }

    #[test]
    fn log_pages_come_back_through_the_controller() {
        let mut data = vec![0u8; 512];
        data[0] = 3; // critical warnings; also: three error entries asked for
        data[1..3].copy_from_slice(&300u16.to_le_bytes());
        data[8..16].copy_from_slice(b"2.0\0\0\0\0\0"); // firmware slot 1
        data[64] = 1; // error entry 1 in use
        data[128] = 9; // error entry 2 in use
        let report = run_log_pages(&data);
        assert_eq!(report.temperature, 27);
        assert_eq!(
            report.errors, 3,
            "count 3 (byte 0); all three entries in use"
        );
        assert_eq!(report.firmware_slots, 1);
        run_log_pages(&[]);
        run_log_pages(&[0xff; 700]);
    }

    #[test]
    fn absurd_temperatures_do_not_wrap() {
        let mut data = vec![0u8; 512];
        data[1..3].copy_from_slice(&0xffffu16.to_le_bytes());
        data[200..202].copy_from_slice(&40000u16.to_le_bytes());
        check_logs(&data);
    }
}
