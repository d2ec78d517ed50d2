//! Set/Get Features.

use super::*;

#[test]
fn features_number_of_queues_keep_alive_and_events() {
    let sub = subsystem(); // 8 I/O queues
    let mut f = Features::new(&sub);
    let current = |f: &Features, fid| f.get_feature(&get_features(fid, FeatureSelect::Current));
    assert_eq!(current(&f, FeatureId::NumberOfQueues), Ok(0x0007_0007));

    // asked for more than there are: granted the most
    let granted = f.set_feature(&Sqe::set_num_queues(16, 32));
    assert_eq!(granted, Ok(0x0007_0007));
    // asked for fewer: granted as asked
    assert_eq!(f.set_feature(&Sqe::set_num_queues(2, 4)), Ok(0x0003_0001));
    assert_eq!(f.io_queues_granted(), (2, 4));
    assert_eq!(current(&f, FeatureId::NumberOfQueues), Ok(0x0003_0001));
    let default = get_features(FeatureId::NumberOfQueues, FeatureSelect::Default);
    assert_eq!(f.get_feature(&default), Ok(0x0007_0007));
    let too_many = set_features(FeatureId::NumberOfQueues, 0x0000_ffff);
    assert_eq!(
        f.set_feature(&too_many).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );

    assert_eq!(
        f.set_feature(&set_features(FeatureId::KeepAliveTimer, 5000)),
        Ok(0)
    );
    assert_eq!(f.keep_alive_ms(), 5000);
    assert_eq!(current(&f, FeatureId::KeepAliveTimer), Ok(5000));

    // the drives' SMART warnings, namespace changes and ANA changes, until the host says
    // otherwise
    assert_eq!(current(&f, FeatureId::AsyncEventConfiguration), Ok(0x91f));
    let aec = set_features(FeatureId::AsyncEventConfiguration, 0xff);
    assert_eq!(f.set_feature(&aec), Ok(0));
    assert_eq!(current(&f, FeatureId::AsyncEventConfiguration), Ok(0xff));
    // a discovery controller's host asks for Discovery Log Page Change notices
    let discovery_changes = set_features(FeatureId::AsyncEventConfiguration, 1 << 31);
    assert_eq!(f.set_feature(&discovery_changes), Ok(0));
    let discovery_changed = crate::fabric::export::registry::DISCOVERY_LOG_CHANGED;
    assert!(super::super::event_enabled(1 << 31, discovery_changed));
    assert!(!super::super::event_enabled(0xff, discovery_changed));
    assert_eq!(f.set_feature(&aec), Ok(0));
    let firmware_notices = set_features(FeatureId::AsyncEventConfiguration, 1 << 9);
    assert_eq!(
        f.set_feature(&firmware_notices).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(f.async_event_config(), 0xff, "unchanged by a refused set");

    assert_eq!(current(&f, FeatureId::VolatileWriteCache), Ok(1));
    let vwc_off = set_features(FeatureId::VolatileWriteCache, 0);
    assert_eq!(
        f.set_feature(&vwc_off).map_err(|s| s.code()),
        Err(Status::FEATURE_NOT_CHANGEABLE)
    );

    let caps = |fid| f.get_feature(&get_features(fid, FeatureSelect::SupportedCapabilities));
    assert_eq!(caps(FeatureId::NumberOfQueues), Ok(1 << 2), "changeable");
    assert_eq!(caps(FeatureId::VolatileWriteCache), Ok(0));

    let mut saved = set_features(FeatureId::KeepAliveTimer, 1000);
    saved.cdw10 |= 1 << 31;
    assert_eq!(
        f.set_feature(&saved).map_err(|s| s.code()),
        Err(Status::FEATURE_NOT_SAVEABLE)
    );
    let mut reserved_select = get_features(FeatureId::KeepAliveTimer, FeatureSelect::Current);
    reserved_select.cdw10 |= 4 << 8;
    assert!(f.get_feature(&reserved_select).is_err());
    let arbitration = set_features(FeatureId::Arbitration, 0);
    assert_eq!(
        f.set_feature(&arbitration).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );
    let power = get_features(FeatureId::PowerManagement, FeatureSelect::Current);
    assert_eq!(
        f.get_feature(&power).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );
}
