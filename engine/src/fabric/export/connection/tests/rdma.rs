//! The connection over NVMe/RDMA: capsules in as the transport hands them over, RDMA
//! operations out; the same commands and controllers as over TCP.

use vm_memory::Bytes;

use super::super::rdma::{Keyed, RdmaOp};
use super::*;

const KEY: u32 = 0x1234_5678;

/// An RDMA connection and its backend.
struct RdmaBed {
    conn: Connection,
    backend: MemoryBackend,
    sub: Arc<SubsystemInfo>,
}

impl RdmaBed {
    fn new(registry: Arc<Registry>) -> RdmaBed {
        let sub = Arc::new(test_subsystem(1));
        let backend = MemoryBackend::new(&sub);
        let conn = Connection::new(
            Subsystems::one(sub.clone()),
            registry,
            ConnectionLimits { maxh2cdata: 4096 },
            "rdma".into(),
        )
        .rdma();
        RdmaBed { conn, backend, sub }
    }

    /// A capsule as the transport receives it (with room for the header in front).
    fn capsule(&mut self, sqe: &Sqe, data: &[u8]) -> Vec<RdmaOp> {
        let mut sqe = *sqe;
        sqe.set_psdt(usnvme_driver::spec::command::PSDT_SGL);
        let mut bytes = vec![0u8; 8];
        bytes.extend_from_slice(sqe.as_bytes());
        bytes.extend_from_slice(data);
        self.conn.receive_capsule(&mut bytes, &mut self.backend);
        self.backend.complete_all(&mut self.conn);
        self.ops()
    }

    fn ops(&mut self) -> Vec<RdmaOp> {
        let mut ops = Vec::new();
        self.conn.take_rdma_ops(|op| ops.push(op));
        ops
    }

    fn connect(&mut self, qid: u16, cntlid: u16) -> Cqe {
        let mut sqe = Sqe::connect(qid, 16, 0, 0);
        sqe.set_sgl(SglDescriptor::in_capsule(ConnectData::SIZE as u32));
        let nqn = self.sub.nqn.clone();
        let data = ConnectData::new([0; 16], cntlid, &nqn, HOST).expect("NQNs that fit");
        match &self.capsule(&sqe, data.as_bytes())[..] {
            [RdmaOp::Respond(c)] => *c,
            other => panic!("one response expected: {other:?}"),
        }
    }
}

fn keyed(address: u64, length: u32) -> SglDescriptor {
    SglDescriptor::keyed(address, length, KEY)
}

fn io(opcode: IoOpcode, slba: u64, blocks: u32, sgl: SglDescriptor) -> Sqe {
    let mut sqe = Sqe::new(opcode as u8);
    sqe.nsid = 1;
    sqe.cdw10 = slba as u32;
    sqe.cdw12 = blocks - 1;
    sqe.set_sgl(sgl);
    sqe.set_cid(0x42);
    sqe
}

#[test]
fn over_rdma_admin_data_is_written_to_the_hosts_keyed_buffer_and_io_data_read_and_written() {
    let registry = Arc::new(Registry::new());
    let mut admin = RdmaBed::new(registry.clone());
    let connected = admin.connect(0, CNTLID_DYNAMIC);
    assert_eq!(connected.status(), Status::SUCCESS);
    let cntlid = connected.dw0 as u16;
    let cc = 1u64 | 6 << 16 | 4 << 20;
    let ops = admin.capsule(&Sqe::property_set(0x14, PropertySize::Four, cc), &[]);
    assert!(matches!(&ops[..], [RdmaOp::Respond(c)] if c.status() == Status::SUCCESS));

    // Identify: its 4 KiB by RDMA WRITE to the buffer the Keyed SGL names, then the response
    let mut identify = Sqe::identify(Cns::Controller, 0);
    identify.set_sgl(keyed(0xabc000, 4096));
    match &admin.capsule(&identify, &[])[..] {
        [RdmaOp::AdminData { data, remote }, RdmaOp::Respond(c)] => {
            assert_eq!(data.len(), 4096);
            // SGLS: Keyed SGL Data Blocks supported (bit 2), as the Linux RDMA host requires
            let id = usnvme_driver::spec::IdentifyController::from_slice(data).expect("4 KiB");
            assert_ne!(id.sgls & 4, 0, "SGLS {:#x}", id.sgls);
            assert_eq!(
                *remote,
                Keyed {
                    address: 0xabc000,
                    length: 4096,
                    key: KEY
                }
            );
            assert_eq!(c.status(), Status::SUCCESS);
        }
        other => panic!("{other:?}"),
    }
    // an admin command with data and no keyed buffer to put it in: refused by name
    let mut no_buffer = Sqe::identify(Cns::Controller, 0);
    no_buffer.set_sgl(SglDescriptor::transport(4096));
    match &admin.capsule(&no_buffer, &[])[..] {
        [RdmaOp::Respond(c)] => assert_eq!(c.status().code(), Status::DATA_SGL_LENGTH_INVALID),
        other => panic!("{other:?}"),
    }

    // an I/O queue of that controller
    let mut io_q = RdmaBed::new(registry);
    assert_eq!(io_q.connect(1, cntlid).status(), Status::SUCCESS);

    // a keyed write: the target asks to READ the host's buffer into the command's
    let written: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 1) as u8).collect();
    let ops = io_q.capsule(&io(IoOpcode::Write, 8, 16, keyed(0x10_0000, 8192)), &[]);
    let [RdmaOp::Read { token, len, remote }] = ops[..] else {
        panic!("one READ expected: {ops:?}")
    };
    assert_eq!((len, remote.address, remote.key), (8192, 0x10_0000, KEY));
    // the READ placed the data: the write goes to the drive and is answered
    let buf = io_q.backend.buffer(token).expect("its buffer");
    buf.write_slice(&written, 0).expect("the buffer");
    io_q.conn.rdma_read_done(token, true, &mut io_q.backend);
    io_q.backend.complete_all(&mut io_q.conn);
    match &io_q.ops()[..] {
        [RdmaOp::Respond(c)] => assert_eq!((c.status(), c.cid), (Status::SUCCESS, 0x42)),
        other => panic!("{other:?}"),
    }

    // a keyed read of the same blocks (the invalidate subtype, as the Linux host sends its
    // reads): WRITE from the command's buffer, then the response
    let mut invalidate = keyed(0x20_0000, 8192);
    invalidate.identifier |= 0x0f;
    let ops = io_q.capsule(&io(IoOpcode::Read, 8, 16, invalidate), &[]);
    let [RdmaOp::Write { token, len, remote }, RdmaOp::Respond(c)] = ops[..] else {
        panic!("a WRITE and a response expected: {ops:?}")
    };
    assert_eq!(
        (len, remote.address, c.status()),
        (8192, 0x20_0000, Status::SUCCESS)
    );
    let mut read = vec![0u8; 8192];
    let buf = io_q.backend.buffer(token).expect("its buffer");
    buf.read_slice(&mut read, 0).expect("the buffer");
    assert!(
        read == written,
        "the read's buffer holds other bytes than were written"
    );
    // its buffer is the WRITE's until the transport says it is over
    assert_eq!(io_q.backend.buffers_held(), 1);
    io_q.conn.rdma_written(token, &mut io_q.backend);
    assert_eq!(io_q.backend.buffers_held(), 0);

    // an in-capsule write goes as over TCP: straight into a buffer, answered
    let data = vec![7u8; 512];
    let ops = io_q.capsule(
        &io(IoOpcode::Write, 0, 1, SglDescriptor::in_capsule(512)),
        &data,
    );
    assert!(
        matches!(&ops[..], [RdmaOp::Respond(c)] if c.status() == Status::SUCCESS),
        "{ops:?}"
    );

    // a write whose READ failed fails as a data transfer error, and frees its buffer
    let ops = io_q.capsule(&io(IoOpcode::Write, 0, 1, keyed(0x30_0000, 512)), &[]);
    let [RdmaOp::Read { token, .. }] = ops[..] else {
        panic!("{ops:?}")
    };
    io_q.conn.rdma_read_done(token, false, &mut io_q.backend);
    match &io_q.ops()[..] {
        [RdmaOp::Respond(c)] => assert_eq!(c.status().code(), Status::DATA_TRANSFER_ERROR),
        other => panic!("{other:?}"),
    }
    assert_eq!(io_q.backend.buffers_held(), 0);

    // a keyed SGL whose length is not the blocks': refused by name
    let ops = io_q.capsule(&io(IoOpcode::Read, 0, 2, keyed(0x40_0000, 512)), &[]);
    assert!(
        matches!(&ops[..], [RdmaOp::Respond(c)] if c.status().code() == Status::DATA_SGL_LENGTH_INVALID),
        "{ops:?}"
    );
}
