//! The engine on the test bed's 24 drives in a guest with two NUMA nodes (`cargo xtask vm-test`
//! boots it with `--numa-nodes 2`): drives 0–11 on node 0, 12–23 on node 1.

use std::sync::Arc;

use usnvme_driver::pci::Sysfs;
use usnvme_driver::{ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::topology::Topology;
use usnvme_engine::{attach, BlockDevice, Engine, EngineOptions, StripeDevice};
use usnvme_tests::verify::verify_job;
use usnvme_tests::{drive_index, vfio_controllers, VmBed};

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn each_node_serves_its_drives_and_two_stripes_of_twelve_verify() {
    let bed = VmBed::from_env();
    assert_eq!(bed.numa_nodes, 2, "vm-test boots two NUMA nodes");
    let specs: Vec<DeviceSpec> = vfio_controllers()
        .into_iter()
        .map(DeviceSpec::Pci)
        .collect();
    let started = std::time::Instant::now();
    let mut drives: Vec<_> = attach(
        &Opener::new("/sys"),
        &Sysfs::new(),
        &specs,
        &ControllerOptions::default(),
    )
    .into_iter()
    .map(|d| d.unwrap_or_else(|e| panic!("{e}")))
    .collect();
    eprintln!(
        "attached {} drives in {:?}",
        drives.len(),
        started.elapsed()
    );
    // drive k is the one with serial usnvme{k}
    drives.sort_by_key(|d| drive_index(&d.controller.identify().serial()));
    for (k, d) in drives.iter().enumerate() {
        assert_eq!(d.node, Some(u32::from(k >= 12)), "drive {k} ({})", d.spec);
    }
    let topology = Topology::from_sysfs("/".as_ref()).expect("topology");
    assert_eq!(topology.nodes.len(), 2);
    let engine = Engine::new(topology, drives, EngineOptions::default()).expect("engine");
    let placement = engine.placement().clone();
    eprintln!("{placement}");
    assert!(placement.remote.is_empty(), "{placement}");
    for r in &placement.reactors {
        let node = r.node.expect("every core has a node");
        let expect: Vec<usize> = if node == 0 {
            (0..12).collect()
        } else {
            (12..24).collect()
        };
        assert_eq!(r.drives, expect, "core {}", r.cpu);
    }
    let ns = engine.namespaces();
    let stripe = |name: &str, members: &[Arc<dyn BlockDevice>]| -> Arc<dyn BlockDevice> {
        Arc::new(StripeDevice::new(name, members.to_vec(), 128 << 10).expect("stripe"))
    };
    let stripes = vec![stripe("node0", &ns[..12]), stripe("node1", &ns[12..])];
    let run = engine
        .start(stripes, verify_job(300, 1, vec![4096, 64 << 10, 256 << 10]))
        .expect("start");
    for r in run.reactors() {
        assert_eq!(
            r.devices,
            vec![r.index],
            "each stripe on its own node's core"
        );
        assert_eq!(
            r.memory_node, r.node,
            "queue pairs and buffers on the reactor's node"
        );
    }
    for r in run.wait().expect("reactors") {
        let (done, mismatches, errors) = r.output;
        assert!(errors.is_empty(), "core {}: {errors:?}", r.info.cpu);
        assert_eq!((done, mismatches), (300, 0), "core {}", r.info.cpu);
    }
}
