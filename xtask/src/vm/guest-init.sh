#!/bin/sh
# /init of the usnvme test-bed guest (busybox). Built into the initramfs by `cargo xtask vm-setup`.
# Kernel command line knobs, all set by `cargo xtask vm-run`:
#   usnvme.kernel_nvme=K  leave the first K NVMe controllers (BDF order) to the kernel nvme driver (-1: all)
#   usnvme.work=DIR       host folder shared read-write (9p tag "work"), mounted at the same path
#   usnvme.run=FILE       shell script (on the work share) run in `chroot /host`, then power off
#   usnvme.keep=DIR       (repeated) host folder under /tmp, /run or /dev that the guest's own
#                         mounts there would hide (a workspace cloned into /tmp): shown anyway
# Lines starting with "USNVME-VM:" are harness messages that vm-run parses and hides.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/hugepages /dev/pts
mount -t hugetlbfs none /dev/hugepages
mount -t devpts devpts /dev/pts
up() { cut -d' ' -f1 /proc/uptime; }
T_INIT=$(up)
arg() { for w in $(cat /proc/cmdline); do case "$w" in "$1="*) echo "${w#*=}";; esac; done; }
KNVME=$(arg usnvme.kernel_nvme); RUN=$(arg usnvme.run); WORK=$(arg usnvme.work); KEEP=$(arg usnvme.keep)
[ -n "$KNVME" ] || KNVME=0

# Modules in dependency order (insmod resolves nothing); the kernel nvme driver only when asked.
FABRICS="nvme-fabrics.ko nvme-tcp.ko nvmet.ko nvmet-tcp.ko nvme-rdma.ko nvmet-rdma.ko"
for m in $(cat /mods/order); do
  case " nvme.ko nvme-core.ko dummy.ko $FABRICS " in *" $m "*) continue;; esac
  insmod /mods/$m 2>/dev/null || echo "USNVME-VM: warning: insmod $m failed"
done

T_MODULES=$(up)
# Every NVMe controller (class 0x0108xx) past the first K goes to vfio-pci, before nvme.ko can claim it.
i=0; nvfio=0; nkern=0
for d in /sys/bus/pci/devices/*; do
  case "$(cat $d/class)" in 0x0108*) ;; *) continue;; esac
  a=${d##*/}
  if [ "$KNVME" = -1 ] || [ $i -lt "$KNVME" ]; then
    nkern=$((nkern+1))
  else
    [ -e $d/driver ] && echo $a > $d/driver/unbind
    echo vfio-pci > $d/driver_override
    echo $a > /sys/bus/pci/drivers_probe
    nvfio=$((nvfio+1))
  fi
  i=$((i+1))
done
if [ $nkern -gt 0 ]; then
  # two poll queues per controller, so that io_uring polled I/O (fio --hipri) can be compared too
  insmod /mods/nvme-core.ko && insmod /mods/nvme.ko poll_queues=2 || echo "USNVME-VM: warning: loading the nvme driver failed"
  # namespaces appear asynchronously: wait (bounded) until every kernel controller has its block
  # device; with native multipath (QEMU 10 marks namespaces shared) the hidden path devices
  # (nvme0c0n1) come before their heads (nvme0n1), which are what gets used: count heads only
  t=0; while [ "$(ls /sys/block | grep -cE '^nvme[0-9]+n[0-9]+$')" -lt $nkern ] && [ $t -lt 100 ]; do sleep 0.1; t=$((t+1)); done
fi

# NVMe/TCP over loopback: the kernel's initiator and target (nvme-core without nvme.ko binds no
# PCI device).
ifconfig lo 127.0.0.1 up || echo "USNVME-VM: warning: no loopback"
[ -e /sys/module/nvme_core ] || insmod /mods/nvme-core.ko
for m in $FABRICS; do
  [ -e /mods/$m ] && { insmod /mods/$m || echo "USNVME-VM: warning: insmod $m failed"; }
done
mount -t configfs none /sys/kernel/config 2>/dev/null
# NVMe over RDMA on soft-RoCE: a dummy netdev (no wire: it sends nothing anywhere, and rxe loops
# what goes to its own address back inside) with a link-local address, on which the tests add
# the rxe device (tests/src/rdma.rs: RDMA_NETDEV, RDMA_ADDRESS).
if [ -e /mods/dummy.ko ]; then
  insmod /mods/dummy.ko numdummies=1 && ifconfig dummy0 169.254.77.1 netmask 255.255.255.0 up ||
    echo "USNVME-VM: warning: no dummy0 for RDMA"
fi

# Host root read-only and the writable work folder, over virtio-9p.
if mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose hostroot /host; then
  # A second view of the host root that the guest's own mounts below do not cover.
  mkdir -p /hostroot && mount --bind /host /hostroot
  for d in dev proc sys; do mount --rbind /$d /host/$d; done
  mount -t tmpfs tmpfs /host/tmp
  mount -t tmpfs tmpfs /host/run 2>/dev/null
  # Folders those mounts hid, bound back from the second view (parents come first).
  for d in $KEEP; do
    [ -d "/host$d" ] && continue
    mkdir -p "/host$d" && mount --bind "/hostroot$d" "/host$d" || echo "USNVME-VM: error: cannot show the host's $d in the guest"
  done
  if [ -n "$WORK" ]; then
    mkdir -p "/host$WORK" 2>/dev/null
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 work "/host$WORK" || echo "USNVME-VM: error: cannot mount the work share at $WORK"
  fi
else
  echo "USNVME-VM: error: cannot mount the host root over 9p"
fi
echo "USNVME-VM: ready vfio=$nvfio nvme=$nkern init=$T_INIT modules=$T_MODULES uptime=$(up)"

if [ -n "$RUN" ]; then
  chroot /host /bin/sh $RUN </dev/null
  rc=$?
  echo "USNVME-VM: exit code=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
  sync
  # Fallback channel when the rc file cannot be written: isa-debug-exit makes QEMU exit with (rc<<1)|1.
  [ $rc -gt 127 ] && rc=127
  printf "\\$(printf %o $rc)" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
  poweroff -f
fi
setsid cttyhack sh
poweroff -f
