VDEVS=$(ls /sys/bus/pci/drivers/vfio-pci | grep '^0000:' | sort)
LOCAL=$(echo "$VDEVS" | sed -n 1p); REMOTE=$(echo "$VDEVS" | sed -n 2p)
LOCAL_FIO=$(echo "$LOCAL" | tr : .)
# SPDK wants a writable /var/tmp and /var/run/dpdk (the guest sees the host's root read-only)
mount -t tmpfs tmpfs /var/tmp 2>/dev/null; mkdir -p /var/run/dpdk
run_perf() { o=$1; t=$2; qd=$3; timeout -s INT 80 /work/bench/target/release/usnvme perf -r "$t" -q $qd -o 4096 -w randread -t 10 -c 0x1 --json "$o" > "$o.log" 2>&1 || echo FAILED; }
# run_fio OUTPUT PRELOAD ENGINE FILE FLAGS...
run_fio() { o=$1; p=$2; e=$3; f=$4; shift 4; timeout -s INT 80 env LD_PRELOAD="$p" fio --name=bench --thread --ioengine="$e" --filename="$f" --rw=randread --bs=4k "$@" --time_based --runtime=10 --cpus_allowed=0 --output-format=json --output="$o" > "$o.log" 2>&1 || echo FAILED; rm -f /dev/hugepages/spdk*map_* /dev/hugepages/rtemap_*; }
echo 'round 1: local QD 32 perf'; run_perf /work/bench/target/vm/work/bench-fio/0-perf-1.json "$LOCAL" 32
echo 'round 1: local QD 32 engine'; run_fio /work/bench/target/vm/work/bench-fio/0-engine-1.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=32
echo 'round 1: local QD 32 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/0-spdk-plugin-1.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=32
echo 'round 2: local QD 32 engine'; run_fio /work/bench/target/vm/work/bench-fio/0-engine-2.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=32
echo 'round 2: local QD 32 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/0-spdk-plugin-2.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=32
echo 'round 2: local QD 32 perf'; run_perf /work/bench/target/vm/work/bench-fio/0-perf-2.json "$LOCAL" 32
echo 'round 3: local QD 32 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/0-spdk-plugin-3.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=32
echo 'round 3: local QD 32 perf'; run_perf /work/bench/target/vm/work/bench-fio/0-perf-3.json "$LOCAL" 32
echo 'round 3: local QD 32 engine'; run_fio /work/bench/target/vm/work/bench-fio/0-engine-3.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=32
echo 'round 1: local QD 32, fio batched perf'; run_perf /work/bench/target/vm/work/bench-fio/1-perf-1.json "$LOCAL" 32
echo 'round 1: local QD 32, fio batched engine'; run_fio /work/bench/target/vm/work/bench-fio/1-engine-1.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=32 --iodepth_batch_submit=32 --iodepth_batch_complete_min=16
echo 'round 1: local QD 32, fio batched spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/1-spdk-plugin-1.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=32 --iodepth_batch_submit=32 --iodepth_batch_complete_min=16
echo 'round 2: local QD 32, fio batched engine'; run_fio /work/bench/target/vm/work/bench-fio/1-engine-2.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=32 --iodepth_batch_submit=32 --iodepth_batch_complete_min=16
echo 'round 2: local QD 32, fio batched spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/1-spdk-plugin-2.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=32 --iodepth_batch_submit=32 --iodepth_batch_complete_min=16
echo 'round 2: local QD 32, fio batched perf'; run_perf /work/bench/target/vm/work/bench-fio/1-perf-2.json "$LOCAL" 32
echo 'round 3: local QD 32, fio batched spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/1-spdk-plugin-3.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=32 --iodepth_batch_submit=32 --iodepth_batch_complete_min=16
echo 'round 3: local QD 32, fio batched perf'; run_perf /work/bench/target/vm/work/bench-fio/1-perf-3.json "$LOCAL" 32
echo 'round 3: local QD 32, fio batched engine'; run_fio /work/bench/target/vm/work/bench-fio/1-engine-3.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=32 --iodepth_batch_submit=32 --iodepth_batch_complete_min=16
echo 'round 1: local QD 1 perf'; run_perf /work/bench/target/vm/work/bench-fio/2-perf-1.json "$LOCAL" 1
echo 'round 1: local QD 1 engine'; run_fio /work/bench/target/vm/work/bench-fio/2-engine-1.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=1
echo 'round 1: local QD 1 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/2-spdk-plugin-1.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=1
echo 'round 2: local QD 1 engine'; run_fio /work/bench/target/vm/work/bench-fio/2-engine-2.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=1
echo 'round 2: local QD 1 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/2-spdk-plugin-2.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=1
echo 'round 2: local QD 1 perf'; run_perf /work/bench/target/vm/work/bench-fio/2-perf-2.json "$LOCAL" 1
echo 'round 3: local QD 1 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/2-spdk-plugin-3.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk "trtype=PCIe traddr=$LOCAL_FIO ns=1" --iodepth=1
echo 'round 3: local QD 1 perf'; run_perf /work/bench/target/vm/work/bench-fio/2-perf-3.json "$LOCAL" 1
echo 'round 3: local QD 1 engine'; run_fio /work/bench/target/vm/work/bench-fio/2-engine-3.json '' external:/work/bench/target/fio/libusnvme_fio.so "$LOCAL_FIO" --iodepth=1
/work/bench/target/release/usnvme serve -c 1 --nqn nqn.2024-01.io.usnvme:bench-fio --allow-any-host --listen 127.0.0.1:4420 -r "$REMOTE" > /work/bench/target/vm/work/bench-fio/serve.log 2>&1 &
i=0; until grep -q '^hosts:' /work/bench/target/vm/work/bench-fio/serve.log || [ $i -ge 1200 ]; do sleep 0.1; i=$((i+1)); done
echo 'round 1: TCP QD 32 perf'; run_perf /work/bench/target/vm/work/bench-fio/3-perf-1.json tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:bench-fio 32
echo 'round 1: TCP QD 32 engine'; run_fio /work/bench/target/vm/work/bench-fio/3-engine-1.json '' external:/work/bench/target/fio/libusnvme_fio.so 'tcp\://127.0.0.1\:4420/nqn.2024-01.io.usnvme\:bench-fio' --iodepth=32
echo 'round 1: TCP QD 32 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/3-spdk-plugin-1.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk 'trtype=tcp adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2024-01.io.usnvme\:bench-fio ns=1' --iodepth=32
echo 'round 2: TCP QD 32 engine'; run_fio /work/bench/target/vm/work/bench-fio/3-engine-2.json '' external:/work/bench/target/fio/libusnvme_fio.so 'tcp\://127.0.0.1\:4420/nqn.2024-01.io.usnvme\:bench-fio' --iodepth=32
echo 'round 2: TCP QD 32 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/3-spdk-plugin-2.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk 'trtype=tcp adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2024-01.io.usnvme\:bench-fio ns=1' --iodepth=32
echo 'round 2: TCP QD 32 perf'; run_perf /work/bench/target/vm/work/bench-fio/3-perf-2.json tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:bench-fio 32
echo 'round 3: TCP QD 32 spdk-plugin'; run_fio /work/bench/target/vm/work/bench-fio/3-spdk-plugin-3.json /work/bench/target/vm/work/bench-fio/spdk_nvme spdk 'trtype=tcp adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2024-01.io.usnvme\:bench-fio ns=1' --iodepth=32
echo 'round 3: TCP QD 32 perf'; run_perf /work/bench/target/vm/work/bench-fio/3-perf-3.json tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:bench-fio 32
echo 'round 3: TCP QD 32 engine'; run_fio /work/bench/target/vm/work/bench-fio/3-engine-3.json '' external:/work/bench/target/fio/libusnvme_fio.so 'tcp\://127.0.0.1\:4420/nqn.2024-01.io.usnvme\:bench-fio' --iodepth=32
