//! Properties: the Linux enable and shutdown sequence, refused configurations.

use usnvme_driver::spec::fabrics::PropertySize::{Eight, Four};
use usnvme_driver::spec::registers::{Cap, Cc, ShutdownStatus};

use super::*;

#[test]
fn properties_follow_the_linux_enable_and_shutdown_sequence() {
    let sub = subsystem();
    let mut r = ControllerRegisters::new(&sub, false);
    let cap = Cap(r.property_get(0x0, Eight).expect("CAP"));
    assert_eq!(cap.mqes(), 127);
    assert!(cap.cqr() && cap.css_nvm() && !cap.css_io_command_sets());
    assert_eq!((cap.to(), cap.to_ms()), (15, 7500));
    assert_eq!(
        (cap.dstrd(), cap.mpsmin(), cap.mpsmax(), cap.ams()),
        (0, 0, 0, 0)
    );
    assert_eq!(r.property_get(0x8, Four), Ok(0x0001_0300));
    assert_eq!(r.property_get(0x14, Four), Ok(0));
    assert_eq!(r.property_get(0x1c, Four), Ok(0));
    // sizes must be the property's
    assert_eq!(
        r.property_get(0x0, Four).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        r.property_get(0x14, Eight).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        r.property_get(0x24, Four).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );

    // Linux: CC with the entry sizes, read back, then EN
    let cc = Cc::new().with_iosqes(6).with_iocqes(4);
    assert_eq!(r.property_set(0x14, Four, u64::from(cc.0)), Ok(()));
    assert!(!r.ready());
    assert_eq!(r.property_get(0x14, Four), Ok(u64::from(cc.0)));
    // the upper half of a 4-byte VALUE is ignored
    let enabled = cc.with_en(true);
    assert_eq!(
        r.property_set(0x14, Four, (0xdead << 32) | u64::from(enabled.0)),
        Ok(())
    );
    assert!(r.ready());
    assert_eq!(r.property_get(0x1c, Four), Ok(1), "CSTS.RDY");
    assert_eq!(r.property_get(0x14, Four), Ok(u64::from(enabled.0)));

    // shutdown: SHST occurring until the caller says it is complete (the drives'
    // caches flushed), written again meanwhile it stays so; RDY stays until EN clears
    let shutdown = enabled.with_shn(Cc::SHN_NORMAL);
    assert_eq!(r.property_set(0x14, Four, u64::from(shutdown.0)), Ok(()));
    assert!(r.shutdown_requested() && r.shutting_down());
    assert_eq!(r.property_get(0x1c, Four), Ok(0b0101));
    assert_eq!(r.property_set(0x14, Four, u64::from(shutdown.0)), Ok(()));
    assert_eq!(r.csts().shst(), ShutdownStatus::Occurring);
    r.shutdown_complete();
    assert_eq!(r.csts().shst(), ShutdownStatus::Complete);
    assert_eq!(r.property_get(0x1c, Four), Ok(0b1001));
    // reset after the shutdown: not ready, shutdown status normal
    assert_eq!(r.property_set(0x14, Four, u64::from(cc.0)), Ok(()));
    assert!(!r.ready() && !r.shutdown_requested());
    assert_eq!(r.property_get(0x1c, Four), Ok(0));
    // enabled again, then reset with EN 1→0
    assert_eq!(r.property_set(0x14, Four, u64::from(enabled.0)), Ok(()));
    assert!(r.ready());
    assert_eq!(r.property_set(0x14, Four, 0), Ok(()));
    assert!(!r.ready());

    // read-only properties, unknown offsets, 8-byte CC
    for (offset, size) in [
        (0x0, Eight),
        (0x8, Four),
        (0x1c, Four),
        (0x24, Four),
        (0x14, Eight),
    ] {
        let refused = r.property_set(offset, size, 1).expect_err("refused");
        assert_eq!(refused.code(), Status::INVALID_FIELD, "{offset:#x}");
        assert!(refused.dnr());
    }
}

#[test]
fn enabling_an_unsupported_configuration_is_refused() {
    let sub = subsystem();
    let good = Cc::new().with_iosqes(6).with_iocqes(4).with_en(true);
    let bad = [
        good.with_mps(1),
        good.with_css(Cc::CSS_ADMIN_ONLY),
        good.with_css(Cc::CSS_ALL_IO),
        good.with_ams(Cc::AMS_WEIGHTED_ROUND_ROBIN),
        good.with_iosqes(7),
        good.with_iocqes(0),
    ];
    for cc in bad {
        let mut r = ControllerRegisters::new(&sub, false);
        let refused = r.property_set(0x14, Four, u64::from(cc.0));
        assert_eq!(
            refused.map_err(|s| s.code()),
            Err(Status::INVALID_FIELD),
            "{cc:?}"
        );
        assert!(!r.ready());
        assert_eq!(r.cc(), Cc::new(), "CC unchanged");
    }
    // the discovery controller takes zero entry sizes (or the I/O ones)
    let mut d = ControllerRegisters::new(&sub, true);
    assert_eq!(
        d.property_set(0x14, Four, u64::from(Cc::new().with_en(true).0)),
        Ok(())
    );
    assert!(d.ready());
    let mut d = ControllerRegisters::new(&sub, true);
    assert_eq!(d.property_set(0x14, Four, u64::from(good.0)), Ok(()));
    // an I/O controller does not
    let mut r = ControllerRegisters::new(&sub, false);
    assert!(r
        .property_set(0x14, Four, u64::from(Cc::new().with_en(true).0))
        .is_err());
}
