#!/bin/busybox sh
# virtlab initramfs /init: load the drivers of QEMU's virtual hardware, mount the guest
# userland's disk and hand PID 1 over to the guest init inside it.
#
# Kernel command line options read here:
#   virtlab.root=DEV        root block device (default /dev/vda; /dev/sda for IDE or virtio-scsi)
#   virtlab.rootfstype=FS   its file system (default ext4)
#   virtlab.rootwait=S      seconds to wait for the device to appear (default 30)
#   virtlab.init=PATH       program to run as PID 1 in the tree (default /opt/virtlab/guest-init)
#   virtlab.skip=A,B        modules not loaded (drivers of hardware this VM does not have)
#   virtlab.ip=, virtlab.iface=, virtlab.gw=   the guest's network, as guest-init.sh reads them
#   virtlab.debug=1         drop to a shell instead of failing
#   ro                      mount the root read-only

/bin/busybox mkdir -p /proc /sys /dev /newroot /run /tmp
# No `busybox --install`: this busybox's shell runs its applets by name without their links
# (FEATURE_SH_STANDALONE), and the 400 links cost the boot up to a second under TCG. It runs an
# applet that is not built into the shell as /proc/self/exe: until /proc is there, by its path.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
/bin/busybox mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null

root=/dev/vda
rootfstype=ext4
rootwait=30
guest_init=/opt/virtlab/guest-init
rootmode=rw
debug=
skip=
ip_addr=
iface=
gateway=
read -r cmdline < /proc/cmdline
for opt in $cmdline; do
    case "$opt" in
        virtlab.root=*) root="${opt#*=}" ;;
        virtlab.rootfstype=*) rootfstype="${opt#*=}" ;;
        virtlab.rootwait=*) rootwait="${opt#*=}" ;;
        virtlab.init=*) guest_init="${opt#*=}" ;;
        virtlab.debug=1) debug=1 ;;
        virtlab.skip=*) skip="${opt#*=}" ;;
        virtlab.ip=*) ip_addr="${opt#*=}" ;;
        virtlab.iface=*) iface="${opt#*=}" ;;
        virtlab.gw=*) gateway="${opt#*=}" ;;
        ro) rootmode=ro ;;
    esac
done

fail() {
    echo "VIRTLAB-INITRAMFS-ERROR: $*"
    if [ -n "$debug" ]; then
        exec sh
    fi
    # Let the serial line drain first: the panic that follows init's exit is printed (and the
    # guest reset) synchronously, and could otherwise overtake the message above in the tty.
    sleep 1
    # With panic=-1 and QEMU's -no-reboot the guest's end becomes QEMU's exit, instead of a
    # VM hanging on a panic until its caller's timeout.
    exit 1
}

# Dependencies first: the builder wrote this list in load order. Drivers for hardware the VM
# does not have are skipped when the command line names them (each load costs the boot), else
# they load and stay idle; a missing one is not fatal, a missing disk is.
while read -r module; do
    name="${module##*/}"
    case ",$skip," in *",${name%.ko},"*) continue ;; esac
    [ -n "$module" ] && insmod "/lib/modules/$module" 2>/dev/null
done < /etc/virtlab-modules

# Disks on a SCSI or ATA bus are found asynchronously; poll rather than guess a delay.
tries=$((rootwait * 20))
while [ ! -b "$root" ] && [ "$tries" -gt 0 ]; do
    usleep 50000
    tries=$((tries - 1))
done
[ -b "$root" ] || fail "root device $root did not appear within ${rootwait}s"

mount -t "$rootfstype" -o "$rootmode" "$root" /newroot || fail "cannot mount $root ($rootfstype)"
[ -x "/newroot$guest_init" ] || fail "$guest_init is missing from $root"

# What guest init would otherwise do with the tree's own programs: each of those is a dynamically
# linked exec (util-linux's mount loads five libraries), which under TCG costs 0.1-0.5 s, where a
# busybox applet here costs a few milliseconds. The same mounts, links and network as guest init
# makes (guest-init.sh), which skips them when /run/virtlab-guest says they are done.
# What udev would add to /dev:
ln -sfn /proc/self/fd /dev/fd
ln -sfn /proc/self/fd/0 /dev/stdin
ln -sfn /proc/self/fd/1 /dev/stdout
ln -sfn /proc/self/fd/2 /dev/stderr
mkdir -p /dev/pts /dev/shm /dev/virtio-ports
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
[ -e /sys/fs/cgroup/cgroup.procs ] || mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
# The network: every link up, the first (or virtlab.iface) addressed, the default route.
ip link set lo up
for dev in /sys/class/net/*; do
    name="${dev##*/}"
    [ "$name" = lo ] && continue
    [ -z "$iface" ] && iface="$name"
    ip link set "$name" up
done
if [ -n "$ip_addr" ] && [ -n "$iface" ]; then
    ip addr add "$ip_addr" dev "$iface"
    [ -n "$gateway" ] && ip route add default via "$gateway"
fi
# No udev: name the virtio-serial ports the way its rules would. A port is announced by the
# device after its driver binds, so give the guest agent's a moment to show up (as guest init did).
link_virtio_ports() {
    for port in /sys/class/virtio-ports/*; do
        [ -r "$port/name" ] || continue
        read -r name < "$port/name"
        [ -n "$name" ] && [ ! -e "/dev/virtio-ports/$name" ] && ln -sfn "../${port##*/}" "/dev/virtio-ports/$name"
    done
}
if [ -d /sys/bus/virtio/drivers/virtio_console ]; then
    tries=40
    link_virtio_ports
    while [ ! -e /dev/virtio-ports/org.qemu.guest_agent.0 ] && [ "$tries" -gt 0 ]; do
        usleep 50000
        link_virtio_ports
        tries=$((tries - 1))
    done
fi
# /run, and in it the file that tells guest init that the above is done (without it, guest init
# does it all itself) and /sbin/shutdown (virtlab's) that it runs in a VM it may power off.
if mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs /newroot/run; then
    mkdir -p /newroot/run/lock /newroot/run/sshd /newroot/run/virtlab
    : > /newroot/run/virtlab-guest
fi

# /proc moves first: from here on the applets by their path (see above).
mount --move /proc /newroot/proc
/bin/busybox mount --move /sys /newroot/sys
/bin/busybox mount --move /dev /newroot/dev
exec /bin/busybox switch_root /newroot "$guest_init"
