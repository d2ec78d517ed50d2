# fabric benchmark, written by cargo xtask bench
NVME=/usr/sbin/nvme
FIO=/usr/bin/fio
USNVME=/work/main/target/release/usnvme
SPDK=''
OUT=/work/main/target/vm/work/bench-fabric-rdma
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-62656e636866
CFS=/sys/kernel/config/nvmet
# fio's exec_prerun/postrun write their output into the working directory
cd $OUT
# before any fabric connection: the kernel's nvme block devices are the PCIe drives'
KDEVS=$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | sort -V)
VDEVS=$(ls /sys/bus/pci/drivers/vfio-pci | grep '^0000:' | sort)
first() { echo "$1" | head -n "$2"; }
# the kernel's block devices (heads) of subsystem $1, by NSID
fabric_devs() {
  for s in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat $s/subsysnqn 2>/dev/null)" = "$1" ] && ls $s | grep -E '^nvme[0-9]+n[0-9]+$' | sort -V | sed 's|^|/dev/|'
  done
}
wait_devs() { # NQN COUNT: until the kernel shows COUNT namespaces of NQN (30 s)
  i=0
  while [ $i -lt 60 ]; do
    [ $(fabric_devs "$1" | wc -l) -ge "$2" ] && return 0
    sleep 0.5; i=$((i + 1))
  done
  return 1
}
# spdk_nvme_perf wants a writable /var/tmp and /var/run/dpdk (the guest's root is read-only)
[ -n "$SPDK" ] && { mount -t tmpfs tmpfs /var/tmp; mkdir -p /var/run/dpdk; }
cat > $OUT/snap.sh <<'SNAP'
# snap.sh FILE DEV[:DEV...]: reads completed on the devices (their paths' counters, nvmeXcYnZ,
# under native multipath, else the head's), uptime, clock ticks per second, every CPU's
# /proc/stat line
n=0
for d in $(echo "$2" | tr : ' '); do
  b=${d#/dev/}; found=0
  for p in /sys/class/block/$(echo "$b" | sed 's/^\(nvme[0-9]*\)n/\1c*n/'); do
    [ -e "$p/stat" ] && { read r rest < "$p/stat"; n=$((n + r)); found=1; }
  done
  [ $found = 1 ] || { read r rest < /sys/block/$b/stat; n=$((n + r)); }
done
{ echo "ios $n"; echo "hz $(getconf CLK_TCK)"; echo "up $(cut -d' ' -f1 /proc/uptime)"; grep '^cpu' /proc/stat
  # usnvme serve's reactor time and the part of it in turns that did work, when it runs
  if [ -f /tmp/usnvme-serve-status.json ]; then sed -n 's/^ *"reactor_seconds": \([0-9.e+-]*\),*$/serve_reactor \1/p; s/^ *"reactor_busy_seconds": \([0-9.e+-]*\),*$/serve_busy \1/p' /tmp/usnvme-serve-status.json; fi
} > "$1"
SNAP
grep -c ^processor /proc/cpuinfo | sed 's/^/guest CPUs: /'
RDMA=/usr/bin/rdma
ADDR=169.254.77.1
NQN=nqn.2014-08.org.usnvme:bench-rdma
echo '== soft-RoCE: rxe0 on dummy0 (169.254.77.1)'
READY=0
[ -d /sys/class/infiniband/rxe0 ] || $RDMA link add rxe0 type rxe netdev dummy0 || echo 'FAILED: rdma link add rxe0 type rxe netdev dummy0'
i=0
while [ $i -lt 60 ]; do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | grep -q ':ffff:a9fe:4d01$' && { READY=1; break; }
  sleep 0.5; i=$((i + 1))
done
[ $READY = 1 ] && $RDMA link show rxe0/1 || echo 'FAILED: rxe0 port 1 is not ACTIVE with 169.254.77.1'
# the kernel's target: nvmet-rdma on the drive left on the kernel's nvme driver
S=$CFS/subsystems/$NQN
P=$CFS/ports/1
if [ $READY = 1 ]; then
  READY=0; D=$(first "$KDEVS" 1)
  [ -n "$D" ] && mkdir $S && echo 1 > $S/attr_allow_any_host && mkdir $S/namespaces/1 && echo /dev/$D > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable && mkdir $P && echo rdma > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo $ADDR > $P/addr_traddr && echo 4420 > $P/addr_trsvcid && ln -s $S $P/subsystems/$NQN && READY=1
  [ $READY = 1 ] && echo "nvmet-rdma: $ADDR:4420 $NQN, namespace 1 on /dev/$D" || echo 'FAILED: nvmet-rdma configuration'
fi
counters() { for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do echo "${f##*/} $(cat $f)"; done; }
[ $READY = 1 ] && counters > $OUT/rxe-before.txt

echo '== round 1: usnvme perf'
if [ $READY = 1 ]; then
DEVS=rdma://$ADDR:4420/$NQN
echo 'r1-perf-qd32: usnvme perf against kernel nvmet-rdma, qd 32'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-perf-qd32.before '' && timeout -s INT 45 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 5 -a 1 --json $OUT/r1-perf-qd32.json > $OUT/r1-perf-qd32.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-perf-qd32.after '' || { echo FAILED; rm -f $OUT/r1-perf-qd32.json; tail -n 20 $OUT/r1-perf-qd32.log 2>/dev/null; }
echo 'r1-perf-qd1: usnvme perf against kernel nvmet-rdma, qd 1'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-perf-qd1.before '' && timeout -s INT 45 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 5 -a 1 --json $OUT/r1-perf-qd1.json > $OUT/r1-perf-qd1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-perf-qd1.after '' || { echo FAILED; rm -f $OUT/r1-perf-qd1.json; tail -n 20 $OUT/r1-perf-qd1.log 2>/dev/null; }
fi

echo '== round 1: Linux nvme-rdma + fio io_uring'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t rdma -a $ADDR -s 4420 -n $NQN --hostnqn $HOSTNQN && wait_devs $NQN 1 && DEVS=$(fabric_devs $NQN | head -n 1) || echo 'FAILED: nvme connect -t rdma to nqn.2014-08.org.usnvme:bench-rdma'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r1-kfio-qd32: Linux nvme-rdma + fio io_uring against kernel nvmet-rdma, qd 32'
[ -n "$DEVS" ] && timeout -s INT 45 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=5 --ramp_time=1 --output-format=json --output=$OUT/r1-kfio-qd32.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-kfio-qd32.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-kfio-qd32.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-kfio-qd32.json; tail -n 20 $OUT/r1-kfio-qd32.log 2>/dev/null; }
echo 'r1-kfio-qd1: Linux nvme-rdma + fio io_uring against kernel nvmet-rdma, qd 1'
[ -n "$DEVS" ] && timeout -s INT 45 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=5 --ramp_time=1 --output-format=json --output=$OUT/r1-kfio-qd1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-kfio-qd1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-kfio-qd1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-kfio-qd1.json; tail -n 20 $OUT/r1-kfio-qd1.log 2>/dev/null; }
$NVME disconnect -n $NQN
fi

echo '== round 2: Linux nvme-rdma + fio io_uring'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t rdma -a $ADDR -s 4420 -n $NQN --hostnqn $HOSTNQN && wait_devs $NQN 1 && DEVS=$(fabric_devs $NQN | head -n 1) || echo 'FAILED: nvme connect -t rdma to nqn.2014-08.org.usnvme:bench-rdma'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r2-kfio-qd32: Linux nvme-rdma + fio io_uring against kernel nvmet-rdma, qd 32'
[ -n "$DEVS" ] && timeout -s INT 45 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=5 --ramp_time=1 --output-format=json --output=$OUT/r2-kfio-qd32.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-kfio-qd32.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-kfio-qd32.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-kfio-qd32.json; tail -n 20 $OUT/r2-kfio-qd32.log 2>/dev/null; }
echo 'r2-kfio-qd1: Linux nvme-rdma + fio io_uring against kernel nvmet-rdma, qd 1'
[ -n "$DEVS" ] && timeout -s INT 45 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=5 --ramp_time=1 --output-format=json --output=$OUT/r2-kfio-qd1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-kfio-qd1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-kfio-qd1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-kfio-qd1.json; tail -n 20 $OUT/r2-kfio-qd1.log 2>/dev/null; }
$NVME disconnect -n $NQN
fi

echo '== round 2: usnvme perf'
if [ $READY = 1 ]; then
DEVS=rdma://$ADDR:4420/$NQN
echo 'r2-perf-qd32: usnvme perf against kernel nvmet-rdma, qd 32'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-perf-qd32.before '' && timeout -s INT 45 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 5 -a 1 --json $OUT/r2-perf-qd32.json > $OUT/r2-perf-qd32.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-perf-qd32.after '' || { echo FAILED; rm -f $OUT/r2-perf-qd32.json; tail -n 20 $OUT/r2-perf-qd32.log 2>/dev/null; }
echo 'r2-perf-qd1: usnvme perf against kernel nvmet-rdma, qd 1'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-perf-qd1.before '' && timeout -s INT 45 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 5 -a 1 --json $OUT/r2-perf-qd1.json > $OUT/r2-perf-qd1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-perf-qd1.after '' || { echo FAILED; rm -f $OUT/r2-perf-qd1.json; tail -n 20 $OUT/r2-perf-qd1.log 2>/dev/null; }
fi

[ -f $OUT/rxe-before.txt ] && counters > $OUT/rxe-after.txt
rm -f $P/subsystems/$NQN; rmdir $P
[ -d $S/namespaces/1 ] && { echo 0 > $S/namespaces/1/enable; rmdir $S/namespaces/1; }
rmdir $S
dmesg > $OUT/dmesg.txt; grep -iE 'rdma|rxe|nvme' $OUT/dmesg.txt | tail -n 40
