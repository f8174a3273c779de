#!/bin/sh
# virtlab guest init: PID 1 of the guest userland when it boots as a VM's disk. It sets up the
# little a benchmark needs (pseudo file systems, loopback, static network, guest agent, sshd),
# prints VIRTLAB-GUEST-READY on the console and waits. The same tree is a container's root,
# where this script is not used.
#
# Every program started before the guest agent costs its boot a fork and an exec, which under
# TCG is tens of milliseconds on a quiet host and up to a second on a loaded one: what the shell
# can do itself (read, echo, test) it does, and the rest comes in as few programs as it can.
#
# Kernel command line options read here:
#   virtlab.hostname=NAME         host name (default virtlab-guest)
#   virtlab.ip=ADDR/PREFIX        static address of the first network interface (or virtlab.iface)
#   virtlab.iface=NAME            interface for virtlab.ip
#   virtlab.gw=ADDR               default route
#   virtlab.dns=ADDR              name server written to /etc/resolv.conf
#   virtlab.qga=0                 do not start qemu-guest-agent
#   virtlab.sshd=0                do not start sshd
#   virtlab.run=BASE64            shell script run after READY; then VIRTLAB-RUN-EXIT=<status>
#   virtlab.poweroff=1            power off after the script (or right after READY without one)

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HOME=/root
export PATH HOME
umask 022
cd /

poweroff_now() {
    sync
    echo o > /proc/sysrq-trigger
    # Should the power-off not happen, ending PID 1 panics the kernel, and with panic=-1 and
    # QEMU's -no-reboot that ends QEMU as well.
    sleep 10
    exit 1
}

# The initramfs moved /proc, /sys and /dev here; mount them where it did not.
[ -e /proc/self ] || mount -t proc proc /proc
[ -d /sys/kernel ] || mount -t sysfs sysfs /sys
[ -e /dev/null ] || mount -t devtmpfs devtmpfs /dev
# virtlab's initramfs (init.sh) makes the rest with busybox, far cheaper than this tree's programs
# under TCG, and says so with /run/virtlab-guest; another initramfs leaves it to this script.
set_up=
[ -e /run/virtlab-guest ] && set_up=1
if [ -z "$set_up" ]; then
    mkdir -p /dev/pts /dev/shm
    mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
    mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
    mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs /run
    [ -e /sys/fs/cgroup/cgroup.procs ] || mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
    # devtmpfs lacks what udev would add; shells and tools expect these.
    [ -e /dev/fd ] || ln -sfn /proc/self/fd /dev/fd
    [ -e /dev/stdin ] || ln -sfn /proc/self/fd/0 /dev/stdin
    [ -e /dev/stdout ] || ln -sfn /proc/self/fd/1 /dev/stdout
    [ -e /dev/stderr ] || ln -sfn /proc/self/fd/2 /dev/stderr
    mkdir -p /run/lock /run/sshd /run/virtlab /dev/virtio-ports
    # Tells /sbin/shutdown (virtlab's) that it runs in a VM it may power off.
    : > /run/virtlab-guest
fi

hostname=virtlab-guest
ip_addr=
iface=
gateway=
dns=
qga=1
sshd=1
run=
poweroff=
read -r cmdline < /proc/cmdline
for opt in $cmdline; do
    case "$opt" in
        virtlab.hostname=*) hostname="${opt#*=}" ;;
        virtlab.ip=*) ip_addr="${opt#*=}" ;;
        virtlab.iface=*) iface="${opt#*=}" ;;
        virtlab.gw=*) gateway="${opt#*=}" ;;
        virtlab.dns=*) dns="${opt#*=}" ;;
        virtlab.qga=*) qga="${opt#*=}" ;;
        virtlab.sshd=*) sshd="${opt#*=}" ;;
        virtlab.run=*) run="${opt#*=}" ;;
        virtlab.poweroff=*) poweroff="${opt#*=}" ;;
    esac
done

echo "$hostname" > /proc/sys/kernel/hostname
# One ip for all links, the address and the route (ip -batch), where the initramfs did not.
links="link set lo up"
for dev in /sys/class/net/*; do
    name="${dev##*/}"
    [ "$name" = lo ] && continue
    [ -z "$iface" ] && iface="$name"
    links="$links
link set $name up"
done
if [ -n "$ip_addr" ] && [ -n "$iface" ]; then
    links="$links
addr add $ip_addr dev $iface"
    [ -n "$gateway" ] && links="$links
route add default via $gateway"
fi
# -force: a failing line does not stop the others, as when each was its own ip.
[ -n "$set_up" ] || ip -force -batch - <<LINKS
$links
LINKS
if [ -n "$dns" ] && [ -w /etc ]; then
    echo "nameserver $dns" > /etc/resolv.conf
fi

# No udev here: name the virtio-serial ports the way its rules would (the initramfs did, unless the
# port came later). Ports are announced by the device after the driver binds, so give a guest agent
# port a moment to show up.
link_virtio_ports() {
    for port in /sys/class/virtio-ports/*; do
        [ -r "$port/name" ] || continue
        read -r name < "$port/name"
        [ -n "$name" ] && [ ! -e "/dev/virtio-ports/$name" ] && ln -sfn "../${port##*/}" "/dev/virtio-ports/$name"
    done
}
qga_port=/dev/virtio-ports/org.qemu.guest_agent.0
if [ -d /sys/bus/virtio/drivers/virtio_console ]; then
    tries=40
    link_virtio_ports
    while [ ! -e "$qga_port" ] && [ "$tries" -gt 0 ]; do
        sleep 0.05
        link_virtio_ports
        tries=$((tries - 1))
    done
fi
if [ "$qga" = 1 ] && [ -e "$qga_port" ]; then
    qemu-ga --daemonize --method=virtio-serial --path="$qga_port" --pidfile=/run/qemu-ga.pid
fi

start_sshd() {
    # The image ships without host keys (they would make every build differ): make one per
    # guest, on the disk when it is writable. Making it waits for the kernel's random pool,
    # which under TCG without a virtio-rng device takes seconds: hence in the background.
    keydir=/etc/ssh
    [ -w "$keydir" ] || keydir=/run/virtlab
    [ -e "$keydir/ssh_host_ed25519_key" ] ||
        ssh-keygen -q -t ed25519 -N '' -f "$keydir/ssh_host_ed25519_key"
    set --
    for key in /etc/ssh/ssh_host_*_key; do
        [ -e "$key" ] && set -- "$@" -h "$key"
    done
    [ "$keydir" = /etc/ssh ] || set -- "$@" -h "$keydir/ssh_host_ed25519_key"
    /usr/sbin/sshd -E /run/virtlab/sshd.log "$@" && echo "VIRTLAB-SSHD-READY"
}
if [ "$sshd" = 1 ] && [ -x /usr/sbin/sshd ]; then
    start_sshd < /dev/null &
fi

read -r release < /proc/sys/kernel/osrelease
read -r uptime _ < /proc/uptime
echo "VIRTLAB-GUEST-READY kernel=$release uptime_s=$uptime"

if [ -n "$run" ]; then
    echo "$run" | base64 -d > /run/virtlab/run.sh
    sh /run/virtlab/run.sh < /dev/null
    echo "VIRTLAB-RUN-EXIT=$?"
fi
[ "$poweroff" = 1 ] && poweroff_now

trap poweroff_now TERM
# PID 1 also reaps the orphans; a waited-for background sleep keeps the trap responsive.
while :; do
    sleep 3600 &
    wait $!
done
