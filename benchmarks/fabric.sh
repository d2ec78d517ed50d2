# fabric benchmark, written by cargo xtask bench
NVME=/usr/sbin/nvme
FIO=/usr/bin/fio
USNVME=/work/bench/target/release/usnvme
SPDK=/work/bench/target/vm/work/bench-fabric/spdk_nvme_perf
OUT=/work/bench/target/vm/work/bench-fabric
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

echo '== round 1: usnvme serve, 1 drive(s)'
READY=0
: > $OUT/r1-serve-d1.log
rm -f /tmp/usnvme-serve-status.json
$USNVME serve $(first "$VDEVS" 1 | sed 's/^/-r /') -c 1 --listen 127.0.0.1:4420 --nqn nqn.2014-08.org.usnvme:bench --allow-any-host --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 > $OUT/r1-serve-d1.log 2>&1 &
SERVE=$!
# it prints what it serves, then "hosts: any", once listening
i=0
while [ $i -lt 120 ] && kill -0 $SERVE 2>/dev/null; do
  grep -q '^hosts:' $OUT/r1-serve-d1.log && { READY=1; break; }
  sleep 0.5; i=$((i + 1))
done
cat $OUT/r1-serve-d1.log
[ $READY = 1 ] && $NVME discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $HOSTNQN | grep -q nqn.2014-08.org.usnvme:bench || { READY=0; echo 'FAILED: usnvme serve does not serve'; }
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2014-08.org.usnvme:bench --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench 1 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench | head -n 1) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r1-serve-kfio-qd32-d1: Linux nvme-tcp + fio io_uring against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r1-serve-kfio-qd32-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd32-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd32-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-serve-kfio-qd32-d1.json; }
echo 'r1-serve-kfio-qd1-d1: Linux nvme-tcp + fio io_uring against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r1-serve-kfio-qd1-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd1-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd1-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-serve-kfio-qd1-d1.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r1-serve-perf-qd32-d1: usnvme perf against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-serve-perf-qd32-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 10 -a 1 --json $OUT/r1-serve-perf-qd32-d1.json > $OUT/r1-serve-perf-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-serve-perf-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r1-serve-perf-qd32-d1.json; }
echo 'r1-serve-perf-qd1-d1: usnvme perf against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-serve-perf-qd1-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 10 -a 1 --json $OUT/r1-serve-perf-qd1-d1.json > $OUT/r1-serve-perf-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-serve-perf-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r1-serve-perf-qd1-d1.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r1-serve-spdk-qd32-d1: spdk_nvme_perf against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-serve-spdk-qd32-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 32 -o 4096 -w randread -t 10 -a 1 > $OUT/r1-serve-spdk-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-serve-spdk-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r1-serve-spdk-qd32-d1.json; }
echo 'r1-serve-spdk-qd1-d1: spdk_nvme_perf against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-serve-spdk-qd1-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 1 -o 4096 -w randread -t 10 -a 1 > $OUT/r1-serve-spdk-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-serve-spdk-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r1-serve-spdk-qd1-d1.json; }
fi
kill -TERM $SERVE 2>/dev/null
i=0
while [ $i -lt 30 ] && kill -0 $SERVE 2>/dev/null; do sleep 1; i=$((i + 1)); done
kill -0 $SERVE 2>/dev/null && { echo 'usnvme serve still runs 30 s after SIGTERM: SIGKILL'; kill -KILL $SERVE; }
wait $SERVE; echo "usnvme serve exited $?" | tee -a $OUT/r1-serve-d1.log
rm -f /tmp/usnvme-serve-status.json

echo '== round 1: kernel nvmet-tcp, 1 drive(s)'
READY=0
S=$CFS/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
P=$CFS/ports/1
mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1
i=1
for d in $(first "$KDEVS" 1); do
  mkdir $S/namespaces/$i && echo /dev/$d > $S/namespaces/$i/device_path && echo 1 > $S/namespaces/$i/enable || READY=0
  i=$((i + 1))
done
mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo 127.0.0.1 > $P/addr_traddr && echo 4421 > $P/addr_trsvcid && ln -s $S $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet || READY=0
for f in $S/namespaces/*/device_path; do echo "$f: $(cat $f)"; done
[ $READY = 1 ] || echo 'FAILED: nvmet configuration'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4421 -n nqn.2014-08.org.usnvme:bench-nvmet --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench-nvmet 1 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench-nvmet | head -n 1) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench-nvmet'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r1-nvmet-kfio-qd32-d1: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r1-nvmet-kfio-qd32-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-nvmet-kfio-qd32-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-nvmet-kfio-qd32-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-nvmet-kfio-qd32-d1.json; }
echo 'r1-nvmet-kfio-qd1-d1: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r1-nvmet-kfio-qd1-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-nvmet-kfio-qd1-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-nvmet-kfio-qd1-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-nvmet-kfio-qd1-d1.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench-nvmet
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r1-nvmet-perf-qd32-d1: usnvme perf against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-perf-qd32-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 10 -a 1 --json $OUT/r1-nvmet-perf-qd32-d1.json > $OUT/r1-nvmet-perf-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-perf-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r1-nvmet-perf-qd32-d1.json; }
echo 'r1-nvmet-perf-qd1-d1: usnvme perf against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-perf-qd1-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 10 -a 1 --json $OUT/r1-nvmet-perf-qd1-d1.json > $OUT/r1-nvmet-perf-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-perf-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r1-nvmet-perf-qd1-d1.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r1-nvmet-spdk-qd32-d1: spdk_nvme_perf against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-spdk-qd32-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 32 -o 4096 -w randread -t 10 -a 1 > $OUT/r1-nvmet-spdk-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-spdk-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r1-nvmet-spdk-qd32-d1.json; }
echo 'r1-nvmet-spdk-qd1-d1: spdk_nvme_perf against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-spdk-qd1-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 1 -o 4096 -w randread -t 10 -a 1 > $OUT/r1-nvmet-spdk-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-spdk-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r1-nvmet-spdk-qd1-d1.json; }
fi
rm -f $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
rmdir $P
for n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done
rmdir $S

echo '== round 1: usnvme serve, 12 drive(s)'
READY=0
: > $OUT/r1-serve-d12.log
rm -f /tmp/usnvme-serve-status.json
$USNVME serve $(first "$VDEVS" 12 | sed 's/^/-r /') -c 1 --listen 127.0.0.1:4420 --nqn nqn.2014-08.org.usnvme:bench --allow-any-host --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 > $OUT/r1-serve-d12.log 2>&1 &
SERVE=$!
# it prints what it serves, then "hosts: any", once listening
i=0
while [ $i -lt 120 ] && kill -0 $SERVE 2>/dev/null; do
  grep -q '^hosts:' $OUT/r1-serve-d12.log && { READY=1; break; }
  sleep 0.5; i=$((i + 1))
done
cat $OUT/r1-serve-d12.log
[ $READY = 1 ] && $NVME discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $HOSTNQN | grep -q nqn.2014-08.org.usnvme:bench || { READY=0; echo 'FAILED: usnvme serve does not serve'; }
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2014-08.org.usnvme:bench --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench 12 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench | head -n 12) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r1-serve-kfio-qd8-d12: Linux nvme-tcp + fio io_uring against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=96 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r1-serve-kfio-qd8-d12.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd8-d12.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-serve-kfio-qd8-d12.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-serve-kfio-qd8-d12.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r1-serve-perf-qd8-d12: usnvme perf against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-serve-perf-qd8-d12.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 8 -o 4k -w randread -t 10 -a 1 --json $OUT/r1-serve-perf-qd8-d12.json > $OUT/r1-serve-perf-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-serve-perf-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r1-serve-perf-qd8-d12.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r1-serve-spdk-qd8-d12: spdk_nvme_perf against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-serve-spdk-qd8-d12.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 8 -o 4096 -w randread -t 10 -a 1 > $OUT/r1-serve-spdk-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-serve-spdk-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r1-serve-spdk-qd8-d12.json; }
fi
kill -TERM $SERVE 2>/dev/null
i=0
while [ $i -lt 30 ] && kill -0 $SERVE 2>/dev/null; do sleep 1; i=$((i + 1)); done
kill -0 $SERVE 2>/dev/null && { echo 'usnvme serve still runs 30 s after SIGTERM: SIGKILL'; kill -KILL $SERVE; }
wait $SERVE; echo "usnvme serve exited $?" | tee -a $OUT/r1-serve-d12.log
rm -f /tmp/usnvme-serve-status.json

echo '== round 1: kernel nvmet-tcp, 12 drive(s)'
READY=0
S=$CFS/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
P=$CFS/ports/1
mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1
i=1
for d in $(first "$KDEVS" 12); do
  mkdir $S/namespaces/$i && echo /dev/$d > $S/namespaces/$i/device_path && echo 1 > $S/namespaces/$i/enable || READY=0
  i=$((i + 1))
done
mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo 127.0.0.1 > $P/addr_traddr && echo 4421 > $P/addr_trsvcid && ln -s $S $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet || READY=0
for f in $S/namespaces/*/device_path; do echo "$f: $(cat $f)"; done
[ $READY = 1 ] || echo 'FAILED: nvmet configuration'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4421 -n nqn.2014-08.org.usnvme:bench-nvmet --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench-nvmet 12 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench-nvmet | head -n 12) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench-nvmet'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r1-nvmet-kfio-qd8-d12: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=96 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r1-nvmet-kfio-qd8-d12.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r1-nvmet-kfio-qd8-d12.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r1-nvmet-kfio-qd8-d12.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r1-nvmet-kfio-qd8-d12.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench-nvmet
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r1-nvmet-perf-qd8-d12: usnvme perf against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-perf-qd8-d12.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 8 -o 4k -w randread -t 10 -a 1 --json $OUT/r1-nvmet-perf-qd8-d12.json > $OUT/r1-nvmet-perf-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-perf-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r1-nvmet-perf-qd8-d12.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r1-nvmet-spdk-qd8-d12: spdk_nvme_perf against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-spdk-qd8-d12.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 8 -o 4096 -w randread -t 10 -a 1 > $OUT/r1-nvmet-spdk-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r1-nvmet-spdk-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r1-nvmet-spdk-qd8-d12.json; }
fi
rm -f $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
rmdir $P
for n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done
rmdir $S

echo '== round 2: kernel nvmet-tcp, 1 drive(s)'
READY=0
S=$CFS/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
P=$CFS/ports/1
mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1
i=1
for d in $(first "$KDEVS" 1); do
  mkdir $S/namespaces/$i && echo /dev/$d > $S/namespaces/$i/device_path && echo 1 > $S/namespaces/$i/enable || READY=0
  i=$((i + 1))
done
mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo 127.0.0.1 > $P/addr_traddr && echo 4421 > $P/addr_trsvcid && ln -s $S $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet || READY=0
for f in $S/namespaces/*/device_path; do echo "$f: $(cat $f)"; done
[ $READY = 1 ] || echo 'FAILED: nvmet configuration'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4421 -n nqn.2014-08.org.usnvme:bench-nvmet --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench-nvmet 1 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench-nvmet | head -n 1) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench-nvmet'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r2-nvmet-kfio-qd32-d1: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r2-nvmet-kfio-qd32-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-nvmet-kfio-qd32-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-nvmet-kfio-qd32-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-nvmet-kfio-qd32-d1.json; }
echo 'r2-nvmet-kfio-qd1-d1: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r2-nvmet-kfio-qd1-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-nvmet-kfio-qd1-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-nvmet-kfio-qd1-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-nvmet-kfio-qd1-d1.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench-nvmet
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r2-nvmet-perf-qd32-d1: usnvme perf against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-perf-qd32-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 10 -a 1 --json $OUT/r2-nvmet-perf-qd32-d1.json > $OUT/r2-nvmet-perf-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-perf-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r2-nvmet-perf-qd32-d1.json; }
echo 'r2-nvmet-perf-qd1-d1: usnvme perf against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-perf-qd1-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 10 -a 1 --json $OUT/r2-nvmet-perf-qd1-d1.json > $OUT/r2-nvmet-perf-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-perf-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r2-nvmet-perf-qd1-d1.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r2-nvmet-spdk-qd32-d1: spdk_nvme_perf against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-spdk-qd32-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 32 -o 4096 -w randread -t 10 -a 1 > $OUT/r2-nvmet-spdk-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-spdk-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r2-nvmet-spdk-qd32-d1.json; }
echo 'r2-nvmet-spdk-qd1-d1: spdk_nvme_perf against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-spdk-qd1-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 1 -o 4096 -w randread -t 10 -a 1 > $OUT/r2-nvmet-spdk-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-spdk-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r2-nvmet-spdk-qd1-d1.json; }
fi
rm -f $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
rmdir $P
for n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done
rmdir $S

echo '== round 2: usnvme serve, 1 drive(s)'
READY=0
: > $OUT/r2-serve-d1.log
rm -f /tmp/usnvme-serve-status.json
$USNVME serve $(first "$VDEVS" 1 | sed 's/^/-r /') -c 1 --listen 127.0.0.1:4420 --nqn nqn.2014-08.org.usnvme:bench --allow-any-host --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 > $OUT/r2-serve-d1.log 2>&1 &
SERVE=$!
# it prints what it serves, then "hosts: any", once listening
i=0
while [ $i -lt 120 ] && kill -0 $SERVE 2>/dev/null; do
  grep -q '^hosts:' $OUT/r2-serve-d1.log && { READY=1; break; }
  sleep 0.5; i=$((i + 1))
done
cat $OUT/r2-serve-d1.log
[ $READY = 1 ] && $NVME discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $HOSTNQN | grep -q nqn.2014-08.org.usnvme:bench || { READY=0; echo 'FAILED: usnvme serve does not serve'; }
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2014-08.org.usnvme:bench --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench 1 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench | head -n 1) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r2-serve-kfio-qd32-d1: Linux nvme-tcp + fio io_uring against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r2-serve-kfio-qd32-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-serve-kfio-qd32-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-serve-kfio-qd32-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-serve-kfio-qd32-d1.json; }
echo 'r2-serve-kfio-qd1-d1: Linux nvme-tcp + fio io_uring against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r2-serve-kfio-qd1-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-serve-kfio-qd1-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-serve-kfio-qd1-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-serve-kfio-qd1-d1.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r2-serve-perf-qd32-d1: usnvme perf against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-serve-perf-qd32-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 10 -a 1 --json $OUT/r2-serve-perf-qd32-d1.json > $OUT/r2-serve-perf-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-serve-perf-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r2-serve-perf-qd32-d1.json; }
echo 'r2-serve-perf-qd1-d1: usnvme perf against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-serve-perf-qd1-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 10 -a 1 --json $OUT/r2-serve-perf-qd1-d1.json > $OUT/r2-serve-perf-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-serve-perf-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r2-serve-perf-qd1-d1.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r2-serve-spdk-qd32-d1: spdk_nvme_perf against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-serve-spdk-qd32-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 32 -o 4096 -w randread -t 10 -a 1 > $OUT/r2-serve-spdk-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-serve-spdk-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r2-serve-spdk-qd32-d1.json; }
echo 'r2-serve-spdk-qd1-d1: spdk_nvme_perf against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-serve-spdk-qd1-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 1 -o 4096 -w randread -t 10 -a 1 > $OUT/r2-serve-spdk-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-serve-spdk-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r2-serve-spdk-qd1-d1.json; }
fi
kill -TERM $SERVE 2>/dev/null
i=0
while [ $i -lt 30 ] && kill -0 $SERVE 2>/dev/null; do sleep 1; i=$((i + 1)); done
kill -0 $SERVE 2>/dev/null && { echo 'usnvme serve still runs 30 s after SIGTERM: SIGKILL'; kill -KILL $SERVE; }
wait $SERVE; echo "usnvme serve exited $?" | tee -a $OUT/r2-serve-d1.log
rm -f /tmp/usnvme-serve-status.json

echo '== round 2: kernel nvmet-tcp, 12 drive(s)'
READY=0
S=$CFS/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
P=$CFS/ports/1
mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1
i=1
for d in $(first "$KDEVS" 12); do
  mkdir $S/namespaces/$i && echo /dev/$d > $S/namespaces/$i/device_path && echo 1 > $S/namespaces/$i/enable || READY=0
  i=$((i + 1))
done
mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo 127.0.0.1 > $P/addr_traddr && echo 4421 > $P/addr_trsvcid && ln -s $S $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet || READY=0
for f in $S/namespaces/*/device_path; do echo "$f: $(cat $f)"; done
[ $READY = 1 ] || echo 'FAILED: nvmet configuration'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4421 -n nqn.2014-08.org.usnvme:bench-nvmet --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench-nvmet 12 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench-nvmet | head -n 12) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench-nvmet'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r2-nvmet-kfio-qd8-d12: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=96 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r2-nvmet-kfio-qd8-d12.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-nvmet-kfio-qd8-d12.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-nvmet-kfio-qd8-d12.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-nvmet-kfio-qd8-d12.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench-nvmet
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r2-nvmet-perf-qd8-d12: usnvme perf against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-perf-qd8-d12.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 8 -o 4k -w randread -t 10 -a 1 --json $OUT/r2-nvmet-perf-qd8-d12.json > $OUT/r2-nvmet-perf-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-perf-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r2-nvmet-perf-qd8-d12.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r2-nvmet-spdk-qd8-d12: spdk_nvme_perf against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-spdk-qd8-d12.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 8 -o 4096 -w randread -t 10 -a 1 > $OUT/r2-nvmet-spdk-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-nvmet-spdk-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r2-nvmet-spdk-qd8-d12.json; }
fi
rm -f $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
rmdir $P
for n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done
rmdir $S

echo '== round 2: usnvme serve, 12 drive(s)'
READY=0
: > $OUT/r2-serve-d12.log
rm -f /tmp/usnvme-serve-status.json
$USNVME serve $(first "$VDEVS" 12 | sed 's/^/-r /') -c 1 --listen 127.0.0.1:4420 --nqn nqn.2014-08.org.usnvme:bench --allow-any-host --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 > $OUT/r2-serve-d12.log 2>&1 &
SERVE=$!
# it prints what it serves, then "hosts: any", once listening
i=0
while [ $i -lt 120 ] && kill -0 $SERVE 2>/dev/null; do
  grep -q '^hosts:' $OUT/r2-serve-d12.log && { READY=1; break; }
  sleep 0.5; i=$((i + 1))
done
cat $OUT/r2-serve-d12.log
[ $READY = 1 ] && $NVME discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $HOSTNQN | grep -q nqn.2014-08.org.usnvme:bench || { READY=0; echo 'FAILED: usnvme serve does not serve'; }
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2014-08.org.usnvme:bench --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench 12 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench | head -n 12) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r2-serve-kfio-qd8-d12: Linux nvme-tcp + fio io_uring against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=96 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r2-serve-kfio-qd8-d12.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r2-serve-kfio-qd8-d12.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r2-serve-kfio-qd8-d12.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r2-serve-kfio-qd8-d12.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r2-serve-perf-qd8-d12: usnvme perf against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-serve-perf-qd8-d12.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 8 -o 4k -w randread -t 10 -a 1 --json $OUT/r2-serve-perf-qd8-d12.json > $OUT/r2-serve-perf-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-serve-perf-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r2-serve-perf-qd8-d12.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r2-serve-spdk-qd8-d12: spdk_nvme_perf against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r2-serve-spdk-qd8-d12.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 8 -o 4096 -w randread -t 10 -a 1 > $OUT/r2-serve-spdk-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r2-serve-spdk-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r2-serve-spdk-qd8-d12.json; }
fi
kill -TERM $SERVE 2>/dev/null
i=0
while [ $i -lt 30 ] && kill -0 $SERVE 2>/dev/null; do sleep 1; i=$((i + 1)); done
kill -0 $SERVE 2>/dev/null && { echo 'usnvme serve still runs 30 s after SIGTERM: SIGKILL'; kill -KILL $SERVE; }
wait $SERVE; echo "usnvme serve exited $?" | tee -a $OUT/r2-serve-d12.log
rm -f /tmp/usnvme-serve-status.json

echo '== round 3: usnvme serve, 1 drive(s)'
READY=0
: > $OUT/r3-serve-d1.log
rm -f /tmp/usnvme-serve-status.json
$USNVME serve $(first "$VDEVS" 1 | sed 's/^/-r /') -c 1 --listen 127.0.0.1:4420 --nqn nqn.2014-08.org.usnvme:bench --allow-any-host --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 > $OUT/r3-serve-d1.log 2>&1 &
SERVE=$!
# it prints what it serves, then "hosts: any", once listening
i=0
while [ $i -lt 120 ] && kill -0 $SERVE 2>/dev/null; do
  grep -q '^hosts:' $OUT/r3-serve-d1.log && { READY=1; break; }
  sleep 0.5; i=$((i + 1))
done
cat $OUT/r3-serve-d1.log
[ $READY = 1 ] && $NVME discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $HOSTNQN | grep -q nqn.2014-08.org.usnvme:bench || { READY=0; echo 'FAILED: usnvme serve does not serve'; }
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2014-08.org.usnvme:bench --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench 1 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench | head -n 1) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r3-serve-kfio-qd32-d1: Linux nvme-tcp + fio io_uring against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r3-serve-kfio-qd32-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r3-serve-kfio-qd32-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r3-serve-kfio-qd32-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r3-serve-kfio-qd32-d1.json; }
echo 'r3-serve-kfio-qd1-d1: Linux nvme-tcp + fio io_uring against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r3-serve-kfio-qd1-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r3-serve-kfio-qd1-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r3-serve-kfio-qd1-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r3-serve-kfio-qd1-d1.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r3-serve-perf-qd32-d1: usnvme perf against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-serve-perf-qd32-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 10 -a 1 --json $OUT/r3-serve-perf-qd32-d1.json > $OUT/r3-serve-perf-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-serve-perf-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r3-serve-perf-qd32-d1.json; }
echo 'r3-serve-perf-qd1-d1: usnvme perf against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-serve-perf-qd1-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 10 -a 1 --json $OUT/r3-serve-perf-qd1-d1.json > $OUT/r3-serve-perf-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-serve-perf-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r3-serve-perf-qd1-d1.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r3-serve-spdk-qd32-d1: spdk_nvme_perf against usnvme serve, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-serve-spdk-qd32-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 32 -o 4096 -w randread -t 10 -a 1 > $OUT/r3-serve-spdk-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-serve-spdk-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r3-serve-spdk-qd32-d1.json; }
echo 'r3-serve-spdk-qd1-d1: spdk_nvme_perf against usnvme serve, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-serve-spdk-qd1-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 1 -o 4096 -w randread -t 10 -a 1 > $OUT/r3-serve-spdk-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-serve-spdk-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r3-serve-spdk-qd1-d1.json; }
fi
kill -TERM $SERVE 2>/dev/null
i=0
while [ $i -lt 30 ] && kill -0 $SERVE 2>/dev/null; do sleep 1; i=$((i + 1)); done
kill -0 $SERVE 2>/dev/null && { echo 'usnvme serve still runs 30 s after SIGTERM: SIGKILL'; kill -KILL $SERVE; }
wait $SERVE; echo "usnvme serve exited $?" | tee -a $OUT/r3-serve-d1.log
rm -f /tmp/usnvme-serve-status.json

echo '== round 3: kernel nvmet-tcp, 1 drive(s)'
READY=0
S=$CFS/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
P=$CFS/ports/1
mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1
i=1
for d in $(first "$KDEVS" 1); do
  mkdir $S/namespaces/$i && echo /dev/$d > $S/namespaces/$i/device_path && echo 1 > $S/namespaces/$i/enable || READY=0
  i=$((i + 1))
done
mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo 127.0.0.1 > $P/addr_traddr && echo 4421 > $P/addr_trsvcid && ln -s $S $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet || READY=0
for f in $S/namespaces/*/device_path; do echo "$f: $(cat $f)"; done
[ $READY = 1 ] || echo 'FAILED: nvmet configuration'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4421 -n nqn.2014-08.org.usnvme:bench-nvmet --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench-nvmet 1 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench-nvmet | head -n 1) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench-nvmet'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r3-nvmet-kfio-qd32-d1: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=32 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r3-nvmet-kfio-qd32-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r3-nvmet-kfio-qd32-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r3-nvmet-kfio-qd32-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r3-nvmet-kfio-qd32-d1.json; }
echo 'r3-nvmet-kfio-qd1-d1: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r3-nvmet-kfio-qd1-d1.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r3-nvmet-kfio-qd1-d1.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r3-nvmet-kfio-qd1-d1.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r3-nvmet-kfio-qd1-d1.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench-nvmet
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r3-nvmet-perf-qd32-d1: usnvme perf against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-perf-qd32-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 32 -o 4k -w randread -t 10 -a 1 --json $OUT/r3-nvmet-perf-qd32-d1.json > $OUT/r3-nvmet-perf-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-perf-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r3-nvmet-perf-qd32-d1.json; }
echo 'r3-nvmet-perf-qd1-d1: usnvme perf against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-perf-qd1-d1.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 1 -o 4k -w randread -t 10 -a 1 --json $OUT/r3-nvmet-perf-qd1-d1.json > $OUT/r3-nvmet-perf-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-perf-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r3-nvmet-perf-qd1-d1.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r3-nvmet-spdk-qd32-d1: spdk_nvme_perf against kernel nvmet-tcp, qd 32, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-spdk-qd32-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 32 -o 4096 -w randread -t 10 -a 1 > $OUT/r3-nvmet-spdk-qd32-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-spdk-qd32-d1.after '' || { echo FAILED; rm -f $OUT/r3-nvmet-spdk-qd32-d1.json; }
echo 'r3-nvmet-spdk-qd1-d1: spdk_nvme_perf against kernel nvmet-tcp, qd 1, 1 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-spdk-qd1-d1.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 1 -o 4096 -w randread -t 10 -a 1 > $OUT/r3-nvmet-spdk-qd1-d1.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-spdk-qd1-d1.after '' || { echo FAILED; rm -f $OUT/r3-nvmet-spdk-qd1-d1.json; }
fi
rm -f $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
rmdir $P
for n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done
rmdir $S

echo '== round 3: usnvme serve, 12 drive(s)'
READY=0
: > $OUT/r3-serve-d12.log
rm -f /tmp/usnvme-serve-status.json
$USNVME serve $(first "$VDEVS" 12 | sed 's/^/-r /') -c 1 --listen 127.0.0.1:4420 --nqn nqn.2014-08.org.usnvme:bench --allow-any-host --json-status /tmp/usnvme-serve-status.json --json-status-every 0.1 > $OUT/r3-serve-d12.log 2>&1 &
SERVE=$!
# it prints what it serves, then "hosts: any", once listening
i=0
while [ $i -lt 120 ] && kill -0 $SERVE 2>/dev/null; do
  grep -q '^hosts:' $OUT/r3-serve-d12.log && { READY=1; break; }
  sleep 0.5; i=$((i + 1))
done
cat $OUT/r3-serve-d12.log
[ $READY = 1 ] && $NVME discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $HOSTNQN | grep -q nqn.2014-08.org.usnvme:bench || { READY=0; echo 'FAILED: usnvme serve does not serve'; }
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2014-08.org.usnvme:bench --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench 12 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench | head -n 12) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r3-serve-kfio-qd8-d12: Linux nvme-tcp + fio io_uring against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=96 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r3-serve-kfio-qd8-d12.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r3-serve-kfio-qd8-d12.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r3-serve-kfio-qd8-d12.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r3-serve-kfio-qd8-d12.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r3-serve-perf-qd8-d12: usnvme perf against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-serve-perf-qd8-d12.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 8 -o 4k -w randread -t 10 -a 1 --json $OUT/r3-serve-perf-qd8-d12.json > $OUT/r3-serve-perf-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-serve-perf-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r3-serve-perf-qd8-d12.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4420/nqn.2014-08.org.usnvme:bench
echo 'r3-serve-spdk-qd8-d12: spdk_nvme_perf against usnvme serve, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-serve-spdk-qd8-d12.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.usnvme:bench hostnqn:'$HOSTNQN -c 0x1 -q 8 -o 4096 -w randread -t 10 -a 1 > $OUT/r3-serve-spdk-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-serve-spdk-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r3-serve-spdk-qd8-d12.json; }
fi
kill -TERM $SERVE 2>/dev/null
i=0
while [ $i -lt 30 ] && kill -0 $SERVE 2>/dev/null; do sleep 1; i=$((i + 1)); done
kill -0 $SERVE 2>/dev/null && { echo 'usnvme serve still runs 30 s after SIGTERM: SIGKILL'; kill -KILL $SERVE; }
wait $SERVE; echo "usnvme serve exited $?" | tee -a $OUT/r3-serve-d12.log
rm -f /tmp/usnvme-serve-status.json

echo '== round 3: kernel nvmet-tcp, 12 drive(s)'
READY=0
S=$CFS/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
P=$CFS/ports/1
mkdir $S && echo 1 > $S/attr_allow_any_host && READY=1
i=1
for d in $(first "$KDEVS" 12); do
  mkdir $S/namespaces/$i && echo /dev/$d > $S/namespaces/$i/device_path && echo 1 > $S/namespaces/$i/enable || READY=0
  i=$((i + 1))
done
mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo 127.0.0.1 > $P/addr_traddr && echo 4421 > $P/addr_trsvcid && ln -s $S $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet || READY=0
for f in $S/namespaces/*/device_path; do echo "$f: $(cat $f)"; done
[ $READY = 1 ] || echo 'FAILED: nvmet configuration'
if [ $READY = 1 ]; then
DEVS=
timeout 60 $NVME connect -t tcp -a 127.0.0.1 -s 4421 -n nqn.2014-08.org.usnvme:bench-nvmet --hostnqn $HOSTNQN && wait_devs nqn.2014-08.org.usnvme:bench-nvmet 12 && DEVS=$(fabric_devs nqn.2014-08.org.usnvme:bench-nvmet | head -n 12) || echo 'FAILED: nvme connect to nqn.2014-08.org.usnvme:bench-nvmet'
FILES=$(echo $DEVS | tr ' ' :)
echo "devices: $FILES"
echo 'r3-nvmet-kfio-qd8-d12: Linux nvme-tcp + fio io_uring against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && timeout -s INT 60 $FIO --name=fabric --ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=96 --numjobs=1 --cpus_allowed=0 --time_based --runtime=10 --ramp_time=1 --output-format=json --output=$OUT/r3-nvmet-kfio-qd8-d12.json --filename=$FILES "--exec_prerun=/bin/sh $OUT/snap.sh $OUT/r3-nvmet-kfio-qd8-d12.before $FILES" "--exec_postrun=/bin/sh $OUT/snap.sh $OUT/r3-nvmet-kfio-qd8-d12.after $FILES" > /dev/null || { echo FAILED; rm -f $OUT/r3-nvmet-kfio-qd8-d12.json; }
$NVME disconnect -n nqn.2014-08.org.usnvme:bench-nvmet
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r3-nvmet-perf-qd8-d12: usnvme perf against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-perf-qd8-d12.before '' && timeout -s INT 60 $USNVME perf -r $DEVS --hostnqn $HOSTNQN -c 0 -q 8 -o 4k -w randread -t 10 -a 1 --json $OUT/r3-nvmet-perf-qd8-d12.json > $OUT/r3-nvmet-perf-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-perf-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r3-nvmet-perf-qd8-d12.json; }
fi
if [ $READY = 1 ]; then
DEVS=tcp://127.0.0.1:4421/nqn.2014-08.org.usnvme:bench-nvmet
echo 'r3-nvmet-spdk-qd8-d12: spdk_nvme_perf against kernel nvmet-tcp, qd 8, 12 drive(s)'
[ -n "$DEVS" ] && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-spdk-qd8-d12.before '' && timeout -s INT 60 $SPDK -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2014-08.org.usnvme:bench-nvmet hostnqn:'$HOSTNQN -c 0x1 -q 8 -o 4096 -w randread -t 10 -a 1 > $OUT/r3-nvmet-spdk-qd8-d12.log 2>&1 && /bin/sh $OUT/snap.sh $OUT/r3-nvmet-spdk-qd8-d12.after '' || { echo FAILED; rm -f $OUT/r3-nvmet-spdk-qd8-d12.json; }
fi
rm -f $P/subsystems/nqn.2014-08.org.usnvme:bench-nvmet
rmdir $P
for n in $S/namespaces/*; do echo 0 > $n/enable; rmdir $n; done
rmdir $S
dmesg > $OUT/dmesg.txt; grep -iE 'nvme|tcp' $OUT/dmesg.txt | tail -n 40
