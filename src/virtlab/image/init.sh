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
#   virtlab.debug=1         drop to a shell instead of failing
#   ro                      mount the root read-only

/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin /proc /sys /dev /newroot /run /tmp
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null

root=/dev/vda
rootfstype=ext4
rootwait=30
guest_init=/opt/virtlab/guest-init
rootmode=rw
debug=
skip=
read -r cmdline < /proc/cmdline
for opt in $cmdline; do
    case "$opt" in
        virtlab.root=*) root="${opt#*=}" ;;
        virtlab.rootfstype=*) rootfstype="${opt#*=}" ;;
        virtlab.rootwait=*) rootwait="${opt#*=}" ;;
        virtlab.init=*) guest_init="${opt#*=}" ;;
        virtlab.debug=1) debug=1 ;;
        virtlab.skip=*) skip="${opt#*=}" ;;
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

# What udev would add to /dev, made here by busybox (cheaper than the tree's own programs).
ln -sfn /proc/self/fd /dev/fd
ln -sfn /proc/self/fd/0 /dev/stdin
ln -sfn /proc/self/fd/1 /dev/stdout
ln -sfn /proc/self/fd/2 /dev/stderr

mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot "$guest_init"
