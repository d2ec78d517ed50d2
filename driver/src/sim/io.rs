//! NVM I/O commands (Read, Write, Flush, Write Zeroes, Dataset Management) and the data pointers:
//! PRP1/PRP2 and PRP lists, SGL data blocks and segments, translated through the IOVA space.

use vm_memory::{Bytes, GuestAddress};

use super::queue::Sq;
use super::{Ctx, FaultAction, Outcome, SimNamespace};
use crate::protection::{PiFields, PiType};
use crate::spec::command::{DSM_DEALLOCATE, SGL_DATA_BLOCK, SGL_LAST_SEGMENT, SGL_SEGMENT};
use crate::spec::{DsmRange, IoOpcode, SglDescriptor, Sqe, Status};

/// Bytes of the command where the fields are (for Error Information entries).
const BYTE_NSID: u16 = 4;
const BYTE_PRP1: u16 = 24;
const BYTE_PRP2: u16 = 32;
const BYTE_CDW10: u16 = 40;
const BYTE_CDW12: u16 = 48;
const BYTE_CDW14: u16 = 56;
const BYTE_MPTR: u16 = 16;

/// The most SGL descriptors one command may use, and segments it may chain.
const MAX_SGL_DESCRIPTORS: u32 = 4096;

/// `fault`: the fault that hit the command, if any (those that change how data moves act here).
pub(super) fn execute(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe, fault: Option<FaultAction>) -> Outcome {
    if sqe.fuse() != 0 {
        return Outcome::fail(Status::INVALID_FIELD).at(1);
    }
    if ctx.inner.maintenance.sanitizing() {
        return Outcome::fail(Status::SANITIZE_IN_PROGRESS);
    }
    let op = IoOpcode::from_raw(sqe.opcode());
    let result = match op {
        Some(IoOpcode::Flush) => flush(ctx, sqe),
        Some(IoOpcode::Read) => read_write(ctx, sq, sqe, false, fault),
        Some(IoOpcode::Write) => read_write(ctx, sq, sqe, true, None),
        Some(IoOpcode::WriteZeroes) => write_zeroes(ctx, sqe),
        Some(IoOpcode::DatasetManagement) => dataset_management(ctx, sq, sqe),
        _ => Err(Outcome::fail(Status::INVALID_OPCODE).at(0)),
    };
    result.unwrap_or_else(|e| e)
}

/// The namespace `nsid` names: its index and geometry.
fn namespace(ctx: &Ctx, nsid: u32) -> Result<(usize, SimNamespace), Outcome> {
    ctx.inner
        .namespaces
        .read()
        .active(nsid)
        .ok_or_else(|| Outcome::fail(Status::INVALID_NAMESPACE).at(BYTE_NSID))
}

/// Checks that `blocks` blocks from `slba` lie in the namespace.
fn in_range(ns: &SimNamespace, slba: u64, blocks: u64) -> Result<(), Outcome> {
    match slba.checked_add(blocks) {
        Some(end) if end <= ns.blocks => Ok(()),
        _ => Err(Outcome::fail(Status::LBA_OUT_OF_RANGE)
            .at(BYTE_CDW10)
            .lba(slba)),
    }
}

fn flush(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    if sqe.nsid != u32::MAX {
        namespace(ctx, sqe.nsid)?; // 0xffffffff: every namespace (VWC bits 2:1 say so)
    }
    Ok(Outcome::ok(0))
}

fn read_write(
    ctx: &Ctx,
    sq: &mut Sq,
    sqe: &Sqe,
    write: bool,
    fault: Option<FaultAction>,
) -> Result<Outcome, Outcome> {
    let (index, ns) = namespace(ctx, sqe.nsid)?;
    if ns.metadata.size > 0 {
        return read_write_metadata(ctx, sq, sqe, (write, fault), index, &ns);
    }
    let (slba, blocks) = (sqe.slba(), sqe.blocks() as u64);
    let len = blocks * ns.block_size as u64;
    if len > ctx.inner.config.max_transfer(ctx.run.page) {
        return Err(Outcome::fail(Status::INVALID_FIELD)
            .at(BYTE_CDW12)
            .lba(slba));
    }
    in_range(&ns, slba, blocks)?;
    data_segments(ctx, sqe, len, &mut sq.segs).map_err(|e| e.lba(slba))?;
    let store = &ctx.inner.stores[index];
    let offset = slba * ns.block_size as u64;
    let counters = &ctx.inner.counters;
    if write {
        if store.keeps_data() {
            gather(ctx, &sq.segs, len, &mut sq.data).map_err(|e| e.lba(slba))?;
            store.write(offset, &sq.data);
        } else {
            check_mapped(ctx, &sq.segs).map_err(|e| e.lba(slba))?;
        }
        counters
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        counters
            .bytes_written
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
    } else {
        // (faults on every read from the Nth on: a warning each would bury the output)
        if fault == Some(FaultAction::ReadNoData) {
            log::debug!(
                "{}: fault: read at LBA {slba} completes without moving data",
                ctx.inner.config.serial
            );
        }
        if store.keeps_data() && fault != Some(FaultAction::ReadNoData) {
            sq.data.clear();
            sq.data.resize(len as usize, 0);
            store.read(offset, &mut sq.data);
            if fault == Some(FaultAction::CorruptRead) {
                // one byte, in the middle of the first block: past any header a check may read
                let middle = ns.block_size as usize / 2;
                if let Some(byte) = sq.data.get_mut(middle) {
                    *byte ^= 0x20;
                }
                log::debug!(
                    "{}: fault: read at LBA {slba} delivers byte {middle} flipped",
                    ctx.inner.config.serial
                );
            }
            scatter(ctx, &sq.segs, &sq.data).map_err(|e| e.lba(slba))?;
        } else {
            // like null_blk (or a read a fault keeps from moving data): the buffer keeps what
            // it held
            check_mapped(ctx, &sq.segs).map_err(|e| e.lba(slba))?;
        }
        counters
            .reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        counters
            .bytes_read
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(Outcome::ok(0))
}

/// A read or write on a namespace formatted with metadata, as QEMU's controller does it: the
/// data and the metadata as the format lays them out (after each block's data, or apart at
/// MPTR), the protection information inserted (PRACT on a write), stripped (PRACT on a read,
/// where the tuple is all the metadata) and checked (PRCHK; every block before any data moves
/// on a read), a failed check completing the command with its end-to-end status at its LBA.
/// A read fault acts on the way to the host, after the checks.
fn read_write_metadata(
    ctx: &Ctx,
    sq: &mut Sq,
    sqe: &Sqe,
    (write, fault): (bool, Option<FaultAction>),
    index: usize,
    ns: &SimNamespace,
) -> Result<Outcome, Outcome> {
    let (slba, blocks) = (sqe.slba(), sqe.blocks() as u64);
    let format = ns.metadata;
    let pi = format.protection;
    // PRINFO means nothing on a namespace without protection information
    let fields = pi.map_or(PiFields::default(), |p| {
        PiFields::from_command(sqe.cdw12, sqe.cdw14, sqe.cdw3, sqe.cdw15, p.guard)
    });
    let (bs, ms) = (ns.block_size as usize, format.size as usize);
    let (per_block, apart) = format.bytes_per_block(ns.block_size, fields.action);
    let len = blocks * per_block;
    if len > ctx.inner.config.max_transfer(ctx.run.page) {
        return Err(Outcome::fail(Status::INVALID_FIELD)
            .at(BYTE_CDW12)
            .lba(slba));
    }
    in_range(ns, slba, blocks)?;
    if let Some(p) = pi {
        // type 1: the command's reference tag is its LBA's; type 3: a host's own, not checked
        let type1_mismatch =
            p.pi_type == PiType::Type1 && fields.ref_tag != slba & p.ref_tag_mask();
        if fields.checks.ref_tag && (type1_mismatch || p.pi_type == PiType::Type3) {
            return Err(Outcome::fail(Status::INVALID_PROTECTION_INFORMATION)
                .at(BYTE_CDW14)
                .lba(slba));
        }
    }
    data_segments(ctx, sqe, len, &mut sq.segs).map_err(|e| e.lba(slba))?;
    let n = blocks as usize;
    let (mut data, mut metadata) = (vec![0u8; n * bs], vec![0u8; n * ms]);
    let (store, metadata_store) = (&ctx.inner.stores[index], &ctx.inner.metadata_stores[index]);
    let wire_md = per_block as usize - bs; // metadata bytes after each block's data
    if write {
        gather(ctx, &sq.segs, len, &mut sq.data).map_err(|e| e.lba(slba))?;
        for (i, wire) in sq.data.chunks_exact(per_block as usize).enumerate() {
            data[i * bs..][..bs].copy_from_slice(&wire[..bs]);
            metadata[i * ms..][..wire_md].copy_from_slice(&wire[bs..]);
        }
        if apart > 0 {
            ctx.mem
                .read_slice(&mut metadata, GuestAddress(sqe.mptr))
                .map_err(|_| dma_error(ctx, sqe.mptr, "metadata buffer").at(BYTE_MPTR))?;
        }
        if let Some(p) = pi {
            for i in 0..n {
                let (d, m) = (&data[i * bs..][..bs], &mut metadata[i * ms..][..ms]);
                let tag = p.ref_tag_at(fields.ref_tag, i as u64);
                if fields.action {
                    p.generate(d, m, tag, fields.app_tag);
                } else {
                    p.check(d, m, &fields, tag)
                        .map_err(|e| Outcome::fail(e.status()).lba(slba + i as u64))?;
                }
            }
        }
        store.write(slba * bs as u64, &data);
        invert(&mut metadata);
        metadata_store.write(slba * ms as u64, &metadata);
    } else {
        store.read(slba * bs as u64, &mut data);
        metadata_store.read(slba * ms as u64, &mut metadata);
        invert(&mut metadata);
        if let Some(p) = pi {
            for i in 0..n {
                let (d, m) = (&data[i * bs..][..bs], &metadata[i * ms..][..ms]);
                p.check(d, m, &fields, p.ref_tag_at(fields.ref_tag, i as u64))
                    .map_err(|e| Outcome::fail(e.status()).lba(slba + i as u64))?;
            }
        }
        if fault == Some(FaultAction::CorruptRead) {
            data[bs / 2] ^= 0x20; // the middle of the first block, as on the plain path
        }
        sq.data.clear();
        for i in 0..n {
            sq.data.extend_from_slice(&data[i * bs..][..bs]);
            sq.data.extend_from_slice(&metadata[i * ms..][..wire_md]);
        }
        if fault == Some(FaultAction::ReadNoData) {
            return Ok(Outcome::ok(0));
        }
        scatter(ctx, &sq.segs, &sq.data).map_err(|e| e.lba(slba))?;
        if apart > 0 {
            ctx.mem
                .write_slice(&metadata, GuestAddress(sqe.mptr))
                .map_err(|_| dma_error(ctx, sqe.mptr, "metadata buffer").at(BYTE_MPTR))?;
        }
    }
    let counters = &ctx.inner.counters;
    let (ops, bytes) = if write {
        (&counters.writes, &counters.bytes_written)
    } else {
        (&counters.reads, &counters.bytes_read)
    };
    ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
    Ok(Outcome::ok(0))
}

/// Metadata is kept inverted (see `Inner::metadata_stores`).
fn invert(bytes: &mut [u8]) {
    bytes.iter_mut().for_each(|b| *b = !*b);
}

/// Zeroes `blocks` blocks at `slba` of namespace `index`; their metadata reads as all ones
/// again (tuples that escape checks, as after Write Zeroes on QEMU's controller).
fn zero_blocks(ctx: &Ctx, index: usize, ns: &SimNamespace, slba: u64, blocks: u64) {
    let (bs, ms) = (ns.block_size as u64, u64::from(ns.metadata.size));
    ctx.inner.stores[index].zero(slba * bs, blocks * bs);
    ctx.inner.metadata_stores[index].zero(slba * ms, blocks * ms);
}

fn write_zeroes(ctx: &Ctx, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let (index, ns) = namespace(ctx, sqe.nsid)?;
    let (slba, blocks) = (sqe.slba(), sqe.blocks() as u64);
    in_range(&ns, slba, blocks)?;
    zero_blocks(ctx, index, &ns, slba, blocks);
    Ok(Outcome::ok(0))
}

fn dataset_management(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let (index, ns) = namespace(ctx, sqe.nsid)?;
    let ranges = (sqe.cdw10 & 0xff) as u64 + 1;
    let len = ranges * DsmRange::SIZE as u64;
    data_segments(ctx, sqe, len, &mut sq.segs)?;
    gather(ctx, &sq.segs, len, &mut sq.data)?;
    // every range is checked before any is applied
    for chunk in sq.data.chunks_exact(DsmRange::SIZE) {
        let r = DsmRange::from_slice(chunk).unwrap_or_default();
        in_range(&ns, r.slba, r.blocks as u64)?;
    }
    if sqe.cdw11 & DSM_DEALLOCATE != 0 {
        for chunk in sq.data.chunks_exact(DsmRange::SIZE) {
            let r = DsmRange::from_slice(chunk).unwrap_or_default();
            zero_blocks(ctx, index, &ns, r.slba, r.blocks as u64);
        }
    }
    Ok(Outcome::ok(0))
}

/// The data pointer of `sqe` for `len` bytes as IOVA segments in `out`: PRPs, or an SGL where the
/// controller supports them.
pub(super) fn data_segments(
    ctx: &Ctx,
    sqe: &Sqe,
    len: u64,
    out: &mut Vec<(u64, u32)>,
) -> Result<(), Outcome> {
    out.clear();
    match sqe.psdt() {
        0 => prp_segments(ctx, sqe.prp1, sqe.prp2, len, out),
        1 | 2 if ctx.inner.config.sgl => sgl_segments(ctx, sqe.sgl(), len, out),
        _ => Err(Outcome::fail(Status::INVALID_FIELD).at(1)),
    }
}

fn push(out: &mut Vec<(u64, u32)>, addr: u64, len: u64) {
    match out.last_mut() {
        Some((a, l)) if *a + *l as u64 == addr && *l as u64 + len <= u32::MAX as u64 => {
            *l += len as u32
        }
        _ => out.push((addr, len as u32)),
    }
}

fn dma_error(ctx: &Ctx, iova: u64, what: &str) -> Outcome {
    ctx.inner.dma_fault(iova, what);
    Outcome::fail(Status::DATA_TRANSFER_ERROR)
}

/// PRP1 (dword aligned, may start mid-page), then PRP2 as the second page (page aligned) or a
/// PRP list pointer (qword aligned); every list entry page aligned; the last entry of a full list
/// page points to the next list page.
fn prp_segments(
    ctx: &Ctx,
    prp1: u64,
    prp2: u64,
    len: u64,
    out: &mut Vec<(u64, u32)>,
) -> Result<(), Outcome> {
    let page = ctx.run.page;
    let bad = |byte| Outcome::fail(Status::PRP_OFFSET_INVALID).at(byte);
    if !prp1.is_multiple_of(4) {
        return Err(bad(BYTE_PRP1));
    }
    let first = (page - prp1 % page).min(len);
    push(out, prp1, first);
    let mut left = len - first;
    if left == 0 {
        return Ok(());
    }
    if left <= page {
        if !prp2.is_multiple_of(page) {
            return Err(bad(BYTE_PRP2));
        }
        push(out, prp2, left);
        return Ok(());
    }
    if !prp2.is_multiple_of(8) {
        return Err(bad(BYTE_PRP2));
    }
    let mut entry = prp2;
    while left > 0 {
        let value = super::dma::read_obj::<u64>(ctx.mem, entry)
            .ok_or_else(|| dma_error(ctx, entry, "PRP list"))?;
        if value % page != 0 {
            return Err(bad(BYTE_PRP2));
        }
        let last_in_page = (entry + 8).is_multiple_of(page);
        if last_in_page && left > page {
            entry = value; // the next list page
            continue;
        }
        let n = left.min(page);
        push(out, value, n);
        left -= n;
        entry += 8;
    }
    Ok(())
}

/// An SGL: one data block descriptor, or segments of data blocks, each segment but the last
/// ending with a (last) segment descriptor. The data blocks must add up to exactly `len`.
fn sgl_segments(
    ctx: &Ctx,
    first: SglDescriptor,
    len: u64,
    out: &mut Vec<(u64, u32)>,
) -> Result<(), Outcome> {
    let type_invalid = || Outcome::fail(Status::SGL_DESCRIPTOR_TYPE_INVALID).at(BYTE_PRP1);
    let segment_invalid = || Outcome::fail(Status::INVALID_SGL_SEGMENT_DESCRIPTOR).at(BYTE_PRP1);
    let length_invalid = || Outcome::fail(Status::DATA_SGL_LENGTH_INVALID).at(BYTE_PRP1);
    let mut total = 0u64;
    let mut data = |d: &SglDescriptor, out: &mut Vec<(u64, u32)>| {
        if d.subtype() != 0 {
            return Err(type_invalid());
        }
        total += d.length as u64;
        if total > len {
            return Err(length_invalid());
        }
        if d.length > 0 {
            push(out, d.address, d.length as u64);
        }
        Ok(())
    };
    let mut desc = first;
    let mut budget = MAX_SGL_DESCRIPTORS;
    match desc.kind() {
        SGL_DATA_BLOCK => data(&desc, out)?,
        SGL_SEGMENT | SGL_LAST_SEGMENT => loop {
            if desc.subtype() != 0 || desc.length == 0 || !desc.length.is_multiple_of(16) {
                return Err(segment_invalid());
            }
            let last_segment = desc.kind() == SGL_LAST_SEGMENT;
            let count = desc.length / 16;
            let mut next = None;
            for i in 0..count {
                budget = budget.checked_sub(1).ok_or_else(|| {
                    Outcome::fail(Status::INVALID_SGL_DESCRIPTOR_COUNT).at(BYTE_PRP1)
                })?;
                let addr = desc.address + i as u64 * 16;
                let d = ctx
                    .mem
                    .read_obj::<SglDescriptor>(GuestAddress(addr))
                    .map_err(|_| dma_error(ctx, addr, "SGL segment"))?;
                match d.kind() {
                    SGL_DATA_BLOCK => data(&d, out)?,
                    SGL_SEGMENT | SGL_LAST_SEGMENT if i == count - 1 && !last_segment => {
                        next = Some(d)
                    }
                    SGL_SEGMENT | SGL_LAST_SEGMENT => return Err(segment_invalid()),
                    _ => return Err(type_invalid()),
                }
            }
            match next {
                Some(d) => desc = d,
                None => break,
            }
        },
        _ => return Err(type_invalid()),
    }
    if total != len {
        return Err(length_invalid());
    }
    Ok(())
}

/// Copies the host's data from `segs` into `data` (`len` bytes).
pub(super) fn gather(
    ctx: &Ctx,
    segs: &[(u64, u32)],
    len: u64,
    data: &mut Vec<u8>,
) -> Result<(), Outcome> {
    data.clear();
    data.resize(len as usize, 0);
    let mut at = 0usize;
    for &(addr, n) in segs {
        let n = n as usize;
        ctx.mem
            .read_slice(&mut data[at..at + n], GuestAddress(addr))
            .map_err(|_| dma_error(ctx, addr, "data buffer"))?;
        at += n;
    }
    Ok(())
}

/// Copies `data` to the host's `segs`.
pub(super) fn scatter(ctx: &Ctx, segs: &[(u64, u32)], data: &[u8]) -> Result<(), Outcome> {
    let mut at = 0usize;
    for &(addr, n) in segs {
        let n = n as usize;
        ctx.mem
            .write_slice(&data[at..at + n], GuestAddress(addr))
            .map_err(|_| dma_error(ctx, addr, "data buffer"))?;
        at += n;
    }
    Ok(())
}

/// Checks that the host's `segs` are mapped (a write to the null backend reads nothing).
fn check_mapped(ctx: &Ctx, segs: &[(u64, u32)]) -> Result<(), Outcome> {
    for &(addr, n) in segs {
        if !super::dma::mapped(ctx.mem, addr, n as usize) {
            return Err(dma_error(ctx, addr, "data buffer"));
        }
    }
    Ok(())
}
