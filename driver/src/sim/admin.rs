//! Admin commands: Identify, Set/Get Features, Create/Delete I/O SQ/CQ, Get Log Page, Doorbell
//! Buffer Config, Abort, Asynchronous Event Request.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::queue::{Cq, Sq, CQE_BYTES, SQE_BYTES};
use super::{
    firmware, io, live, maintenance, namespaces, Ctx, Outcome, ShadowBuf, SimConfig, SimNamespace,
    ERROR_LOG_ENTRIES,
};
use crate::protection::Guard;
use crate::spec::command::{Cns, FeatureId};
use crate::spec::identify::{ControllerList, Oacs, Oncs};
use crate::spec::{
    put_ascii, AdminOpcode, ErrorLogEntry, IdentifyController, LogPageId, SmartLog, Sqe, Status,
};

/// Features kept as plain values (Set stores, Get returns).
const PLAIN_FEATURES: [u8; 9] = [0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0a, 0x0b];
/// Asynchronous Event Requests held at most (AERL + 1).
const ASYNC_EVENTS: u32 = 4;
/// Composite temperature reported, in kelvin (40 °C).
const TEMPERATURE: u16 = 313;

pub(super) fn execute(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Outcome {
    if sqe.fuse() != 0 || sqe.psdt() != 0 {
        // admin commands over PCIe use PRPs and are never fused
        return Outcome::fail(Status::INVALID_FIELD).at(1);
    }
    let result = match AdminOpcode::from_raw(sqe.opcode()) {
        Some(AdminOpcode::Identify) => identify(ctx, sq, sqe),
        Some(AdminOpcode::SetFeatures) => set_features(ctx, sqe),
        Some(AdminOpcode::GetFeatures) => get_features(ctx, sqe),
        Some(AdminOpcode::CreateIoCq) => create_cq(ctx, sqe),
        Some(AdminOpcode::CreateIoSq) => create_sq(ctx, sqe),
        Some(AdminOpcode::DeleteIoSq) => delete_sq(ctx, sqe),
        Some(AdminOpcode::DeleteIoCq) => delete_cq(ctx, sqe),
        Some(AdminOpcode::GetLogPage) => get_log_page(ctx, sq, sqe),
        Some(AdminOpcode::DoorbellBufferConfig) if ctx.inner.config.doorbell_buffer => {
            doorbell_buffer_config(ctx, sqe)
        }
        Some(AdminOpcode::Abort) => abort(ctx, sqe),
        Some(AdminOpcode::AsyncEventRequest) => async_event(ctx, sqe),
        Some(AdminOpcode::Sanitize) => maintenance::sanitize(ctx, sqe),
        Some(AdminOpcode::FirmwareDownload) => firmware_download(ctx, sq, sqe),
        Some(AdminOpcode::FirmwareCommit) => firmware::commit(ctx, sqe),
        Some(AdminOpcode::DeviceSelfTest) => maintenance::self_test(ctx, sqe),
        Some(AdminOpcode::NamespaceManagement) => namespaces::management(ctx, sq, sqe),
        Some(AdminOpcode::NamespaceAttachment) => namespaces::attachment(ctx, sq, sqe),
        _ => Err(Outcome::fail(Status::INVALID_OPCODE).at(0)),
    };
    if matches!(
        AdminOpcode::from_raw(sqe.opcode()),
        Some(
            AdminOpcode::CreateIoCq
                | AdminOpcode::CreateIoSq
                | AdminOpcode::DeleteIoSq
                | AdminOpcode::DeleteIoCq
                | AdminOpcode::DoorbellBufferConfig
        )
    ) {
        ctx.inner.io_queues_changed(ctx.run);
    }
    if sqe.opcode() != AdminOpcode::AsyncEventRequest as u8 {
        // an event raised while this queue was busy (`Inner::raise_event_while_busy`)
        ctx.inner.deliver_events(ctx, sq);
    }
    result.unwrap_or_else(|e| e)
}

/// Sends `bytes` to the host buffer of `sqe`.
fn send(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe, bytes: &[u8]) -> Result<Outcome, Outcome> {
    if bytes.len() as u64 > ctx.inner.config.max_transfer(ctx.run.page) {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(40));
    }
    io::data_segments(ctx, sqe, bytes.len() as u64, &mut sq.segs)?;
    io::scatter(ctx, &sq.segs, bytes)?;
    Ok(Outcome::ok(0))
}

/// A stable 64-bit value per drive and namespace, for NGUID / EUI-64.
fn unique(config: &SimConfig, nsid: u32) -> [u8; 8] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in config.serial.bytes().chain(nsid.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h.to_be_bytes()
}

pub(super) fn identify_controller(config: &SimConfig) -> IdentifyController {
    let mut id = IdentifyController::zeroed();
    id.vid = 0x1b36;
    id.ssvid = 0x1af4;
    put_ascii(&mut id.sn, &config.serial);
    put_ascii(&mut id.mn, &config.model);
    put_ascii(&mut id.fr, &config.firmware);
    id.rab = 6;
    id.ieee = [0x00, 0x54, 0x52];
    id.mdts = config.mdts;
    id.ver = 0x0001_0400;
    id.cntrltype = 1;
    id.oacs = Oacs::DEVICE_SELF_TEST
        | Oacs::FIRMWARE
        | Oacs::NS_MANAGEMENT
        | if config.doorbell_buffer {
            Oacs::DOORBELL_BUFFER_CONFIG
        } else {
            0
        };
    id.edstt = 1; // minutes, at most
    id.sanicap = maintenance::SANICAP;
    id.acl = 3;
    id.aerl = (ASYNC_EVENTS - 1) as u8;
    id.frmw = firmware::FRMW;
    id.fwug = 1; // 4 KiB
    id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
    id.wctemp = 343;
    id.cctemp = 373;
    id.tnvmcap = config.capacity().to_le_bytes();
    id.cntlid = namespaces::CNTLID;
    id.oaes = 1 << 8; // Namespace Attribute Notices
    id.sqes = 0x66;
    id.cqes = 0x44;
    id.nn = config.namespaces.len().max(namespaces::NAMESPACE_SLOTS) as u32;
    id.mnan = id.nn;
    id.oncs = Oncs::DATASET_MANAGEMENT | Oncs::WRITE_ZEROES;
    id.vwc = 0b111; // present; Flush with NSID FFFFFFFFh flushes every namespace
    id.sgls = config.sgl as u32; // supported, no alignment or granularity rule
    put_ascii(
        &mut id.subnqn,
        &format!("nqn.2024-01.io.usnvme:sim:{}", config.serial),
    );
    id.psd[0][0..2].copy_from_slice(&2500u16.to_le_bytes()); // 25 W
    id
}

fn identify(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let config = &ctx.inner.config;
    let table = ctx.inner.namespaces.read();
    let invalid_ns = || Outcome::fail(Status::INVALID_NAMESPACE).at(4);
    // a namespace ID the controller supports (1 to NN), or the error to answer
    let supported = |nsid: u32| match nsid {
        n if n == 0 || n > table.nn() => Err(invalid_ns()),
        n => Ok(n),
    };
    let identify_ns =
        |nsid: u32, ns: &SimNamespace| namespaces::identify(ns, unique(config, nsid), nsid);
    let mut page = [0u8; 4096];
    match Cns::from_raw(sqe.cdw10 as u8) {
        Some(Cns::Controller) => {
            // FR: the firmware running now; the capacity no namespace holds
            let mut id = *ctx.inner.identify;
            id.fr = ctx.inner.firmware.revision();
            id.unvmcap = (config.capacity() - table.allocated_bytes()).to_le_bytes();
            page.copy_from_slice(id.as_bytes());
        }
        // an inactive namespace ID reads as zeroes
        Some(Cns::Namespace) if sqe.nsid == u32::MAX => {
            page.copy_from_slice(namespaces::identify_common().as_bytes())
        }
        Some(Cns::Namespace) => {
            if let Some((_, ns)) = table.active(supported(sqe.nsid)?) {
                page.copy_from_slice(identify_ns(sqe.nsid, &ns).as_bytes());
            }
        }
        Some(Cns::AllocatedNamespace) => {
            if let Some(a) = table.allocated(supported(sqe.nsid)?) {
                page.copy_from_slice(identify_ns(sqe.nsid, &a.ns).as_bytes());
            }
        }
        Some(cns @ (Cns::ActiveNamespaceList | Cns::AllocatedNamespaceList)) => {
            if sqe.nsid >= 0xffff_fffe {
                return Err(invalid_ns());
            }
            let active = cns == Cns::ActiveNamespaceList;
            let list = table.ids(sqe.nsid, |a| a.attached || !active);
            page.copy_from_slice(list.as_bytes());
        }
        Some(Cns::NvmNamespace) => {
            let (_, ns) = table.active(sqe.nsid).ok_or_else(invalid_ns)?;
            // ELBAF of format 0 (at byte 12): the Protection Information Format
            if ns
                .metadata
                .protection
                .is_some_and(|p| p.guard == Guard::Crc64)
            {
                page[12..16].copy_from_slice(&(2u32 << 7).to_le_bytes());
            }
        }
        Some(Cns::NamespaceDescriptorList) => {
            let (_, ns) = table.active(supported(sqe.nsid)?).ok_or_else(invalid_ns)?;
            page[0] = 2; // NIDT: NGUID
            page[1] = 16;
            page[4..20].copy_from_slice(&identify_ns(sqe.nsid, &ns).nguid);
        }
        // CDW10 bits 31:16: the lowest controller ID to list
        Some(cns @ (Cns::NamespaceControllerList | Cns::ControllerList)) => {
            let listed = match cns {
                Cns::ControllerList => true,
                _ => {
                    let nsid = supported(sqe.nsid)?;
                    table.allocated(nsid).ok_or_else(invalid_ns)?.attached
                }
            };
            let from = (sqe.cdw10 >> 16) as u16;
            let ids = (listed && namespaces::CNTLID >= from).then_some(namespaces::CNTLID);
            page.copy_from_slice(ControllerList::from_ids(ids).as_bytes());
        }
        None => return Err(Outcome::fail(Status::INVALID_FIELD).at(40)),
    }
    drop(table);
    send(ctx, sq, sqe, &page)
}

/// Firmware Image Download: its data from the host, then into the image being put together.
fn firmware_download(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let len = firmware::download_bytes(sqe);
    if len > ctx.inner.config.max_transfer(ctx.run.page) {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(40));
    }
    io::data_segments(ctx, sqe, len, &mut sq.segs)?;
    io::gather(ctx, &sq.segs, len, &mut sq.data)?;
    firmware::download(ctx, sqe, &sq.data)
}

fn set_features(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let fid = sqe.cdw10 as u8;
    if sqe.cdw10 & (1 << 31) != 0 {
        return Err(Outcome::fail(Status::FEATURE_NOT_SAVEABLE).at(43));
    }
    let mut features = ctx.run.features.lock();
    if fid == FeatureId::NumberOfQueues as u8 {
        let (nsqr, ncqr) = (sqe.cdw11 & 0xffff, sqe.cdw11 >> 16);
        if nsqr == 0xffff || ncqr == 0xffff {
            return Err(Outcome::fail(Status::INVALID_FIELD).at(44));
        }
        let table = ctx.run.table.read();
        if live(&table.sqs) + live(&table.cqs) > 0 {
            return Err(Outcome::fail(Status::COMMAND_SEQUENCE_ERROR));
        }
        let most = ctx.inner.config.io_queues as u32;
        features.nsq = (nsqr + 1).min(most) as u16;
        features.ncq = (ncqr + 1).min(most) as u16;
        return Ok(Outcome::ok(
            ((features.ncq as u32 - 1) << 16) | (features.nsq as u32 - 1),
        ));
    }
    if !PLAIN_FEATURES.contains(&fid) {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(40));
    }
    features.values[fid as usize] = sqe.cdw11;
    Ok(Outcome::ok(0))
}

fn get_features(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let fid = sqe.cdw10 as u8;
    let select = (sqe.cdw10 >> 8) & 7;
    let features = ctx.run.features.lock();
    let queues = fid == FeatureId::NumberOfQueues as u8;
    if !queues && !PLAIN_FEATURES.contains(&fid) {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(40));
    }
    let most = ctx.inner.config.io_queues as u32 - 1;
    let dw0 = match select {
        3 => 0b100, // changeable, not saveable, not namespace specific
        0 if queues => ((features.ncq as u32 - 1) << 16) | (features.nsq as u32 - 1),
        1 | 2 if queues => (most << 16) | most,
        0 => features.values[fid as usize],
        1 | 2 => match fid {
            0x04 => 343,
            0x06 => 1,
            _ => 0,
        },
        _ => return Err(Outcome::fail(Status::INVALID_FIELD).at(41)),
    };
    Ok(Outcome::ok(dw0))
}

/// The checks both queue creations share: entries and base address.
fn check_queue(ctx: &Ctx, sqe: &Sqe, entry_bytes: u64) -> Result<(u16, u16), Outcome> {
    let entries = (sqe.cdw10 >> 16) + 1;
    if entries < 2 || entries > ctx.inner.cap.max_queue_entries() {
        return Err(Outcome::fail(Status::INVALID_QUEUE_SIZE).at(42));
    }
    if sqe.prp1 == 0 || !sqe.prp1.is_multiple_of(ctx.run.page) {
        return Err(Outcome::fail(Status::PRP_OFFSET_INVALID).at(24));
    }
    if sqe.cdw11 & 1 == 0 {
        // CAP.CQR: queues must be physically contiguous
        return Err(Outcome::fail(Status::INVALID_FIELD).at(44));
    }
    let len = entries as u64 * entry_bytes;
    if !ctx.mem.check_range(GuestAddress(sqe.prp1), len as usize) {
        ctx.inner.dma_fault(sqe.prp1, "new queue");
        return Err(Outcome::fail(Status::DATA_TRANSFER_ERROR));
    }
    Ok((sqe.cdw10 as u16, entries as u16))
}

/// A Ctx that sees the shadow buffers as they are in `shadow` now.
fn with_shadow<'a>(ctx: &Ctx<'a>, shadow: Option<ShadowBuf>) -> Ctx<'a> {
    Ctx {
        inner: ctx.inner,
        run: ctx.run,
        mem: ctx.mem,
        shadow,
        now: ctx.now,
    }
}

fn create_cq(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let qid = sqe.cdw10 as u16;
    let granted = ctx.run.features.lock().ncq;
    let mut table = ctx.run.table.write();
    if qid == 0 || qid > granted || table.cqs[qid as usize].is_some() {
        return Err(Outcome::fail(Status::INVALID_QID).at(40));
    }
    let (qid, entries) = check_queue(ctx, sqe, CQE_BYTES)?;
    let (ien, iv) = (sqe.cdw11 & 2 != 0, (sqe.cdw11 >> 16) as usize);
    let mut cq = Cq::new(qid, sqe.prp1, entries);
    if ien {
        let msix = ctx.inner.msix.lock();
        // beyond the MSI-X table, or a vector other than 0 (pin-based) while MSI-X is off
        if iv >= usize::from(ctx.inner.config.msix_vectors) || (iv != 0 && msix.is_empty()) {
            return Err(Outcome::fail(Status::INVALID_INTERRUPT_VECTOR).at(46));
        }
        // (IV 0 without MSI-X is the pin interrupt, which the host keeps disabled: nothing)
        cq.irq = msix.get(iv).cloned();
    }
    let c = with_shadow(ctx, table.shadow);
    if let Some(v) = c.read_shadow(qid, true) {
        if v != 0 {
            log::debug!(
                "{}: CQ {qid} created with a stale shadow head doorbell {v}: ignored until MMIO is rung",
                ctx.inner.config.serial
            );
        }
        c.write_event_idx(qid, true, 0);
    }
    table.cqs[qid as usize] = Some(Arc::new(Mutex::new(cq)));
    Ok(Outcome::ok(0))
}

fn create_sq(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let qid = sqe.cdw10 as u16;
    let cqid = (sqe.cdw11 >> 16) as u16;
    let granted = ctx.run.features.lock().nsq;
    let mut table = ctx.run.table.write();
    let Some(cq) = table
        .cqs
        .get(cqid as usize)
        .filter(|_| cqid != 0)
        .cloned()
        .flatten()
    else {
        return Err(Outcome::fail(Status::CQ_INVALID).at(46));
    };
    if qid == 0 || qid > granted || table.sqs[qid as usize].is_some() {
        return Err(Outcome::fail(Status::INVALID_QID).at(40));
    }
    let (qid, entries) = check_queue(ctx, sqe, SQE_BYTES)?;
    let sq = Sq::new(qid, sqe.prp1, entries, cqid, cq);
    let c = with_shadow(ctx, table.shadow);
    if let Some(v) = c.read_shadow(qid, false) {
        if v != 0 {
            log::debug!(
                "{}: SQ {qid} created with a stale shadow tail doorbell {v}: ignored until MMIO is rung",
                ctx.inner.config.serial
            );
        }
        c.write_event_idx(qid, false, 0);
    }
    table.sqs[qid as usize] = Some(Arc::new(Mutex::new(sq)));
    Ok(Outcome::ok(0))
}

fn delete_sq(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let qid = sqe.cdw10 as u16;
    let taken = {
        let mut table = ctx.run.table.write();
        match table.sqs.get_mut(qid as usize) {
            Some(slot) if qid != 0 => slot.take(),
            _ => None,
        }
    };
    let Some(sq) = taken else {
        return Err(Outcome::fail(Status::INVALID_QID).at(40));
    };
    let mut sq = sq.lock();
    sq.deleted = true;
    // commands still in the controller are aborted, their completions posted first
    let pending = std::mem::take(&mut sq.pending);
    let aborted = Outcome::status(Status::ABORTED_SQ_DELETION);
    for p in &pending {
        ctx.inner.post(ctx, &sq, p.sqe.cid(), &aborted, 1);
    }
    Ok(Outcome::ok(0))
}

fn delete_cq(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let qid = sqe.cdw10 as u16;
    let mut table = ctx.run.table.write();
    if qid == 0 || table.cqs.get(qid as usize).is_none_or(Option::is_none) {
        return Err(Outcome::fail(Status::INVALID_QID).at(40));
    }
    if table
        .sqs
        .iter()
        .skip(1)
        .flatten()
        .any(|sq| sq.lock().cqid == qid)
    {
        return Err(Outcome::fail(Status::INVALID_QUEUE_DELETION).at(40));
    }
    if let Some(cq) = table.cqs[qid as usize].take() {
        cq.lock().deleted = true;
    }
    Ok(Outcome::ok(0))
}

fn get_log_page(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let lid = sqe.cdw10 as u8;
    let dwords = (((sqe.cdw11 & 0xffff) << 16) | (sqe.cdw10 >> 16)) as u64 + 1;
    let len = (dwords * 4) as usize;
    let offset = ((sqe.cdw13 as u64) << 32) | sqe.cdw12 as u64;
    if len as u64 > ctx.inner.config.max_transfer(ctx.run.page).min(2 << 20) {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(42));
    }
    if !offset.is_multiple_of(4) {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(48));
    }
    let inner = ctx.inner;
    let log: Vec<u8> = match LogPageId::from_raw(lid) {
        Some(LogPageId::ErrorInformation) => {
            let errors = inner.errors.lock();
            let mut bytes = vec![0u8; ERROR_LOG_ENTRIES * ErrorLogEntry::SIZE];
            for (slot, e) in bytes
                .chunks_exact_mut(ErrorLogEntry::SIZE)
                .zip(errors.entries.iter())
            {
                slot.copy_from_slice(e.as_bytes());
            }
            bytes
        }
        Some(LogPageId::SmartHealth) => {
            if sqe.nsid != 0 && sqe.nsid != u32::MAX {
                return Err(Outcome::fail(Status::INVALID_FIELD).at(4));
            }
            smart(ctx).as_bytes().to_vec()
        }
        Some(LogPageId::FirmwareSlot) => inner.firmware.slot_log().as_bytes().to_vec(),
        Some(LogPageId::SanitizeStatus) => maintenance::sanitize_log(ctx),
        Some(LogPageId::ChangedNamespaceList) => {
            let retain = sqe.cdw10 & 1 << 15 != 0; // RAE
            ctx.inner
                .namespaces
                .write()
                .changed_log(retain)
                .as_bytes()
                .to_vec()
        }
        Some(LogPageId::DeviceSelfTest) => maintenance::self_test_log(ctx),
        _ => return Err(Outcome::fail(Status::INVALID_LOG_PAGE).at(40)),
    };
    if offset > log.len() as u64 {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(48));
    }
    let mut out = vec![0u8; len];
    let from = &log[offset as usize..];
    let n = from.len().min(len);
    out[..n].copy_from_slice(&from[..n]);
    send(ctx, sq, sqe, &out)
}

fn smart(ctx: &Ctx) -> SmartLog {
    let c = &ctx.inner.counters;
    let units = |bytes: u64| (bytes.div_ceil(512).div_ceil(1000) as u128).to_le_bytes();
    let mut log = SmartLog::zeroed();
    log.critical_warning = ctx.inner.critical_warning.load(Ordering::Relaxed);
    log.composite_temperature = TEMPERATURE.to_le_bytes();
    log.available_spare = 100;
    log.available_spare_threshold = 10;
    log.data_units_read = units(c.bytes_read.load(Ordering::Relaxed));
    log.data_units_written = units(c.bytes_written.load(Ordering::Relaxed));
    log.host_read_commands = (c.reads.load(Ordering::Relaxed) as u128).to_le_bytes();
    log.host_write_commands = (c.writes.load(Ordering::Relaxed) as u128).to_le_bytes();
    log.power_cycles = 1u128.to_le_bytes();
    log.error_log_entries = (ctx.inner.errors.lock().count as u128).to_le_bytes();
    log.temperature_sensors[0] = TEMPERATURE;
    log
}

fn doorbell_buffer_config(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let page = ctx.run.page;
    for (addr, byte) in [(sqe.prp1, 24), (sqe.prp2, 32)] {
        if addr == 0 || addr % page != 0 {
            return Err(Outcome::fail(Status::INVALID_FIELD).at(byte));
        }
        if !ctx.mem.check_range(GuestAddress(addr), page as usize) {
            ctx.inner.dma_fault(addr, "doorbell buffer");
            return Err(Outcome::fail(Status::DATA_TRANSFER_ERROR).at(byte));
        }
    }
    let mut table = ctx.run.table.write();
    table.shadow = Some(ShadowBuf {
        dbs: sqe.prp1,
        eis: sqe.prp2,
    });
    // queues that exist already: what the shadow holds now is not a doorbell write
    let c = with_shadow(ctx, table.shadow);
    for sq in table.sqs.iter().skip(1).flatten() {
        let mut sq = sq.lock();
        sq.shadow.armed = false;
        c.write_event_idx(sq.qid, false, sq.tail);
    }
    for cq in table.cqs.iter().skip(1).flatten() {
        let mut cq = cq.lock();
        cq.shadow.armed = false;
        c.write_event_idx(cq.qid, true, cq.head);
    }
    Ok(Outcome::ok(0))
}

/// Aborts a command the controller still holds (pending in threaded mode, or delayed); dword 0
/// bit 0 is clear when it was aborted.
fn abort(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let (sqid, cid) = (sqe.cdw10 as u16, (sqe.cdw10 >> 16) as u16);
    let target = match sqid {
        0 => None,
        q => ctx.run.table.read().sqs.get(q as usize).cloned().flatten(),
    };
    let Some(target) = target else {
        return Ok(Outcome::ok(1));
    };
    let mut sq = target.lock();
    let Some(i) = sq.pending.iter().position(|p| p.sqe.cid() == cid) else {
        return Ok(Outcome::ok(1));
    };
    let p = sq.pending.swap_remove(i);
    ctx.inner.finish(
        ctx,
        &mut sq,
        &p.sqe,
        Outcome::status(Status::ABORT_REQUESTED),
        None,
    );
    Ok(Outcome::ok(0))
}

/// Asynchronous Event Request: completed with an event waiting, else held up to the limit
/// (until [`SimController::raise_event`](super::SimController::raise_event)).
fn async_event(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    if let Some(dw0) = {
        let mut pending = ctx.inner.pending_events.lock();
        (!pending.is_empty()).then(|| pending.remove(0))
    } {
        return Ok(Outcome::ok(dw0));
    }
    let mut features = ctx.run.features.lock();
    if features.async_events.len() >= ASYNC_EVENTS as usize {
        return Err(Outcome::fail(Status::AER_LIMIT_EXCEEDED));
    }
    features.async_events.push(sqe.cid());
    Ok(Outcome {
        hold: true,
        ..Outcome::ok(0)
    })
}
