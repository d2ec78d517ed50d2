# SPDK wants a writable /var/tmp and /var/run/dpdk: the guest sees the host's root read-only,
# with its own tmpfs on /tmp and /run (where /var/run leads); hugetlbfs is on /dev/hugepages
mount -t tmpfs tmpfs /var/tmp || echo 'cannot mount a tmpfs on /var/tmp'
mkdir -p /var/run/dpdk
VDEVS=$(ls /sys/bus/pci/drivers/vfio-pci | grep '^0000:' | sort)
first() { echo "$1" | head -n "$2"; }
# run_usnvme OUTPUT DRIVES FLAGS...: usnvme perf on the first DRIVES controllers
run_usnvme() {
  out=$1; n=$2; shift 2
  for d in $(first "$VDEVS" "$n"); do set -- "$@" -r "$d"; done
  timeout -s INT 110 /work/bench/target/release/usnvme perf "$@" --json "$out" > "$out.log" 2>&1 || echo FAILED
}
# run_spdk OUTPUT DRIVES FLAGS...: spdk_nvme_perf on the same controllers
run_spdk() {
  out=$1; n=$2; shift 2
  for d in $(first "$VDEVS" "$n"); do set -- "$@" -r "trtype:PCIe traddr:$d"; done
  timeout -s INT 110 /work/bench/target/vm/work/bench-spdk/spdk_nvme_perf "$@" > "$out" 2>&1 || echo FAILED
  # hugepage files DPDK may leave behind would keep their pages from usnvme
  rm -f /dev/hugepages/spdk*map_* /dev/hugepages/rtemap_*
}
# the counted runs ask the host to count QEMU's nvme trace events
TRACE_DIR=/work/bench/target/vm/work/bench-spdk
count_device_ops() {
  echo "$1" > "$TRACE_DIR/trace.req.tmp" && mv "$TRACE_DIR/trace.req.tmp" "$TRACE_DIR/trace.req"
  while [ ! -e "$TRACE_DIR/trace.ack" ]; do sleep 0.1; done
  rm -f "$TRACE_DIR/trace.ack"
}
echo 'round 1: A usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/A-usnvme-1.json 1 -q 32 -o 4096 -w randread -t 10 -c 0x1
echo 'round 1: A spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/A-spdk-1.txt 1 -q 32 -o 4096 -w randread -t 10 -c 0x1
echo 'round 1: Q1 usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/Q1-usnvme-1.json 1 -q 1 -o 4096 -w randread -t 10 -c 0x1
echo 'round 1: Q1 spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/Q1-spdk-1.txt 1 -q 1 -o 4096 -w randread -t 10 -c 0x1
echo 'round 1: B usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/B-usnvme-1.json 24 -q 128 -o 4096 -w randread -t 10 -c 0x1
echo 'round 1: B spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/B-spdk-1.txt 24 -q 128 -o 4096 -w randread -t 10 -c 0x1
echo 'round 1: D usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/D-usnvme-1.json 1 -q 32 -o 4096 -w randwrite -t 10 -c 0x1
echo 'round 1: D spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/D-spdk-1.txt 1 -q 32 -o 4096 -w randwrite -t 10 -c 0x1
echo 'round 1: E usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/E-usnvme-1.json 1 -q 32 -o 131072 -w read -t 10 -c 0x1
echo 'round 1: E spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/E-spdk-1.txt 1 -q 32 -o 131072 -w read -t 10 -c 0x1
echo 'round 2: A spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/A-spdk-2.txt 1 -q 32 -o 4096 -w randread -t 10 -c 0x1
echo 'round 2: A usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/A-usnvme-2.json 1 -q 32 -o 4096 -w randread -t 10 -c 0x1
echo 'round 2: Q1 spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/Q1-spdk-2.txt 1 -q 1 -o 4096 -w randread -t 10 -c 0x1
echo 'round 2: Q1 usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/Q1-usnvme-2.json 1 -q 1 -o 4096 -w randread -t 10 -c 0x1
echo 'round 2: B spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/B-spdk-2.txt 24 -q 128 -o 4096 -w randread -t 10 -c 0x1
echo 'round 2: B usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/B-usnvme-2.json 24 -q 128 -o 4096 -w randread -t 10 -c 0x1
echo 'round 2: D spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/D-spdk-2.txt 1 -q 32 -o 4096 -w randwrite -t 10 -c 0x1
echo 'round 2: D usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/D-usnvme-2.json 1 -q 32 -o 4096 -w randwrite -t 10 -c 0x1
echo 'round 2: E spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/E-spdk-2.txt 1 -q 32 -o 131072 -w read -t 10 -c 0x1
echo 'round 2: E usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/E-usnvme-2.json 1 -q 32 -o 131072 -w read -t 10 -c 0x1
echo 'round 3: A usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/A-usnvme-3.json 1 -q 32 -o 4096 -w randread -t 10 -c 0x1
echo 'round 3: A spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/A-spdk-3.txt 1 -q 32 -o 4096 -w randread -t 10 -c 0x1
echo 'round 3: Q1 usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/Q1-usnvme-3.json 1 -q 1 -o 4096 -w randread -t 10 -c 0x1
echo 'round 3: Q1 spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/Q1-spdk-3.txt 1 -q 1 -o 4096 -w randread -t 10 -c 0x1
echo 'round 3: B usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/B-usnvme-3.json 24 -q 128 -o 4096 -w randread -t 10 -c 0x1
echo 'round 3: B spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/B-spdk-3.txt 24 -q 128 -o 4096 -w randread -t 10 -c 0x1
echo 'round 3: D usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/D-usnvme-3.json 1 -q 32 -o 4096 -w randwrite -t 10 -c 0x1
echo 'round 3: D spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/D-spdk-3.txt 1 -q 32 -o 4096 -w randwrite -t 10 -c 0x1
echo 'round 3: E usnvme'; run_usnvme /work/bench/target/vm/work/bench-spdk/E-usnvme-3.json 1 -q 32 -o 131072 -w read -t 10 -c 0x1
echo 'round 3: E spdk'; run_spdk /work/bench/target/vm/work/bench-spdk/E-spdk-3.txt 1 -q 32 -o 131072 -w read -t 10 -c 0x1
echo 'counted: A spdk'; count_device_ops A-spdk; run_spdk /work/bench/target/vm/work/bench-spdk/A-spdk-0.txt 1 -q 32 -o 4096 -w randread -t 2 -c 0x1; count_device_ops off
echo 'counted: A usnvme'; count_device_ops A-usnvme; run_usnvme /work/bench/target/vm/work/bench-spdk/A-usnvme-0.json 1 -q 32 -o 4096 -w randread -t 2 -c 0x1; count_device_ops off
echo 'counted: Q1 spdk'; count_device_ops Q1-spdk; run_spdk /work/bench/target/vm/work/bench-spdk/Q1-spdk-0.txt 1 -q 1 -o 4096 -w randread -t 2 -c 0x1; count_device_ops off
echo 'counted: Q1 usnvme'; count_device_ops Q1-usnvme; run_usnvme /work/bench/target/vm/work/bench-spdk/Q1-usnvme-0.json 1 -q 1 -o 4096 -w randread -t 2 -c 0x1; count_device_ops off
echo 'counted: B spdk'; count_device_ops B-spdk; run_spdk /work/bench/target/vm/work/bench-spdk/B-spdk-0.txt 24 -q 128 -o 4096 -w randread -t 2 -c 0x1; count_device_ops off
echo 'counted: B usnvme'; count_device_ops B-usnvme; run_usnvme /work/bench/target/vm/work/bench-spdk/B-usnvme-0.json 24 -q 128 -o 4096 -w randread -t 2 -c 0x1; count_device_ops off
echo 'counted: D spdk'; count_device_ops D-spdk; run_spdk /work/bench/target/vm/work/bench-spdk/D-spdk-0.txt 1 -q 32 -o 4096 -w randwrite -t 2 -c 0x1; count_device_ops off
echo 'counted: D usnvme'; count_device_ops D-usnvme; run_usnvme /work/bench/target/vm/work/bench-spdk/D-usnvme-0.json 1 -q 32 -o 4096 -w randwrite -t 2 -c 0x1; count_device_ops off
echo 'counted: E spdk'; count_device_ops E-spdk; run_spdk /work/bench/target/vm/work/bench-spdk/E-spdk-0.txt 1 -q 32 -o 131072 -w read -t 2 -c 0x1; count_device_ops off
echo 'counted: E usnvme'; count_device_ops E-usnvme; run_usnvme /work/bench/target/vm/work/bench-spdk/E-usnvme-0.json 1 -q 32 -o 131072 -w read -t 2 -c 0x1; count_device_ops off
