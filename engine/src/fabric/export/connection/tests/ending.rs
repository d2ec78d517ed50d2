//! Connections that end badly leave nothing held: the timers, a host that vanishes, mangled
//! and random bytes.

use std::time::Duration;

use usnvme_driver::spec::command::FeatureId;

use super::*;

#[test]
fn a_connection_without_an_icreq_is_closed_after_the_limit_and_a_half_sent_pdu_after_its_own() {
    let sub = Arc::new(test_subsystem(1));
    let mut backend = MemoryBackend::new(&sub);
    let registry = Arc::new(Registry::new());
    let limits = ConnectionLimits { maxh2cdata: 4096 };
    let t0 = Instant::now();
    let secs = |s: u64| t0 + Duration::from_secs(s);

    // no ICReq at all; then one begun (bytes come) but never finished: the limit counts
    // from the connection's opening either way
    for sent in [&[][..], &[0u8, 0, 128, 0][..]] {
        let mut conn = Connection::new(
            Subsystems::one(sub.clone()),
            registry.clone(),
            limits,
            "h".into(),
        );
        conn.tick(t0, &mut backend);
        conn.receive(sent, &mut backend);
        conn.tick(secs(9), &mut backend);
        assert_eq!(conn.finished(), None, "closed before the ICReq limit");
        conn.tick(secs(11), &mut backend);
        assert_eq!(conn.finished(), Some("no ICReq within 10 s"), "{sent:?}");
    }

    // Ready, between PDUs: quiet for as long as the host likes
    let mut bed = Bed::new(None, Digests::default());
    bed.conn.tick(t0, &mut bed.backend);
    bed.conn.tick(secs(3600), &mut bed.backend);
    assert_eq!(bed.conn.finished(), None, "a quiet connection between PDUs");
    // half a command capsule: closed once nothing more came for the stall limit
    let h = OutHeader::capsule_cmd(
        &Sqe::identify(usnvme_driver::spec::command::Cns::Controller, 0),
        0,
        bed.digests,
    );
    let half = &h.as_slice()[..30];
    bed.conn.receive(half, &mut bed.backend);
    bed.conn.tick(secs(3601), &mut bed.backend);
    bed.conn.tick(secs(3601 + 15), &mut bed.backend);
    assert_eq!(bed.conn.finished(), None, "closed before the stall limit");
    // a byte more starts the limit again
    bed.conn.receive(&h.as_slice()[30..31], &mut bed.backend);
    bed.conn.tick(secs(3601 + 20), &mut bed.backend);
    bed.conn.tick(secs(3601 + 35), &mut bed.backend);
    assert_eq!(
        bed.conn.finished(),
        None,
        "the limit restarts with each byte"
    );
    bed.conn.tick(secs(3601 + 36), &mut bed.backend);
    assert!(
        bed.conn
            .finished()
            .is_some_and(|why| why.starts_with("a PDU half received and nothing more for")),
        "{:?}",
        bed.conn.finished()
    );
}

#[test]
fn a_host_that_vanishes_mid_write_gives_every_buffer_back() {
    let mut io = Bed::io_queue(Digests::default());
    let sqe = io.io(IoOpcode::Write, 0, 16, 8192);
    io.capsule(&sqe, &[]);
    assert!(matches!(io.take()[..], [Got::R2T(_)]));
    assert_eq!(io.backend.buffers_held(), 1);
    io.conn.peer_gone("reset by peer", &mut io.backend);
    assert_eq!(io.backend.buffers_held(), 0);
    assert!(io.conn.finished().is_some());
}

#[test]
fn mutated_io_streams_never_panic_and_give_every_buffer_back() {
    let seed = std::env::var("USNVME_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(11);
    let rounds = std::env::var("USNVME_STRESS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..rounds {
        let digests = Digests {
            header: rng.bool(),
            data: rng.bool(),
        };
        let mut io = Bed::io_queue(digests);
        // a valid stream of writes (in-capsule and R2T, whose TTAG is the slot the
        // command gets: the lowest free one) and reads...
        let mut stream = Vec::new();
        for i in 0..rng.usize(1..12) {
            let cid = i as u16;
            let blocks = rng.u32(1..17);
            let slba = rng.u64(0..2000);
            let len = blocks * 512;
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let mut push_capsule = |sqe: &Sqe, data: &[u8]| {
                let h = OutHeader::capsule_cmd(sqe, data.len(), digests);
                stream.extend_from_slice(h.as_slice());
                stream.resize(stream.len() + h.pad(), 0);
                stream.extend_from_slice(data);
                if digests.data && !data.is_empty() {
                    stream.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
                }
            };
            match rng.u8(0..3) {
                0 => {
                    let mut sqe = io.io(IoOpcode::Write, slba, blocks, 0);
                    sqe.set_cid(cid);
                    push_capsule(&sqe, &data);
                }
                1 => {
                    let mut sqe = io.io(IoOpcode::Write, slba, blocks, len);
                    sqe.set_cid(cid);
                    push_capsule(&sqe, &[]);
                    stream.extend(h2c_pdu(cid, 0, 0, &data, true, digests));
                }
                _ => {
                    let mut sqe = io.io(IoOpcode::Read, slba, blocks, len);
                    sqe.set_cid(cid);
                    push_capsule(&sqe, &[]);
                }
            }
        }
        // ...with a few bytes changed, fed in pieces of any size
        for _ in 0..rng.usize(0..4) {
            let at = rng.usize(0..stream.len());
            stream[at] ^= 1 << rng.u8(0..8);
        }
        let mut rest = &stream[..];
        while !rest.is_empty() {
            let piece = rng.usize(1..=rest.len().min(9000));
            let n = io.conn.receive(&rest[..piece], &mut io.backend);
            if n == 0 {
                break; // closing (or paused: the stream is over anyway)
            }
            rest = &rest[n..];
            if rng.bool() {
                io.backend.complete_all(&mut io.conn);
            }
            if rng.bool() {
                io.take();
            }
        }
        io.conn.peer_gone("the stream ended", &mut io.backend);
        io.backend.complete_all(&mut io.conn);
        assert_eq!(
            io.backend.buffers_held(),
            0,
            "seed {seed}: every buffer back"
        );
        assert!(io.conn.finished().is_some(), "seed {seed}: drained");
    }
}

#[test]
fn random_bytes_never_panic_and_leave_nothing_held() {
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..300 {
        let len = rng.usize(0..600);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        // often start with a valid ICReq, so the fuzz reaches past it
        if rng.bool() {
            let ic = IcReq {
                pfv: 0,
                hpda: 0,
                digests: Digests::default(),
                maxr2t: 0,
            };
            let mut v = vec![0, 0, 0, 0];
            v.extend_from_slice(&ic.encode());
            v.extend_from_slice(&bytes);
            bytes = v;
        }
        crate::fabric::export::fuzz::fuzz_connection(&bytes);
    }
}

#[test]
fn io_on_any_queue_keeps_the_association_alive_and_silence_for_twice_kato_ends_it() {
    let (mut admin, cntlid) = Bed::admin_queue(Digests::default());
    let nqn = admin.sub.nqn.clone();
    admin.capsule(&Sqe::set_features(FeatureId::KeepAliveTimer, 1000), &[]);
    assert_eq!(admin.status(), Status::SUCCESS);
    let mut io = Bed::new(None, Digests::default());
    io.conn.registry = admin.conn.registry.clone();
    assert_eq!(io.connect(1, cntlid, &nqn, HOST).status(), Status::SUCCESS);
    let t0 = Instant::now();
    let ms = |m: u64| t0 + Duration::from_millis(m);
    admin.conn.tick(t0, &mut admin.backend);
    io.conn.tick(t0, &mut io.backend);

    // no admin command for 5 s, but writes on the I/O queue every second: alive
    for second in 1..=5 {
        let write = io.io(IoOpcode::Write, 0, 8, 0);
        io.capsule(&write, &[7; 4096]);
        match io.take().last() {
            // the SQ head counts the Connect and every write (data in the capsule or not)
            Some(Got::Resp(c)) => {
                assert_eq!((c.status(), c.sqhd), (Status::SUCCESS, 1 + second as u16))
            }
            other => panic!("no response: {other:?}"),
        }
        io.conn.tick(ms(second * 1000), &mut io.backend);
        admin.conn.tick(ms(second * 1000 + 1), &mut admin.backend);
        assert_eq!(
            admin.conn.finished(),
            None,
            "closed at {second} s with I/O flowing"
        );
    }
    // the I/O stops: an I/O queue's tick without new commands is no sign of life
    io.conn.tick(ms(6000), &mut io.backend);
    admin.conn.tick(ms(7000), &mut admin.backend);
    assert_eq!(admin.conn.finished(), None, "closed within twice KATO");
    admin.conn.tick(ms(7002), &mut admin.backend);
    assert_eq!(
        admin.conn.finished(),
        Some("no Keep Alive nor I/O within 2000 ms")
    );
    // and the I/O queue of the controller that went away closes on its next tick
    io.conn.tick(ms(7003), &mut io.backend);
    assert_eq!(
        io.conn.finished(),
        Some(&*format!("controller {cntlid} went away"))
    );
}
