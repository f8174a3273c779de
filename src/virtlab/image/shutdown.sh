#!/bin/sh
# virtlab: the guest has no init system to ask for a shutdown, yet qemu-guest-agent's
# guest-shutdown runs /sbin/shutdown (-P power off, -H halt, -r reboot). Installed as
# shutdown, poweroff and reboot; refuses to act outside a virtlab VM (e.g. in a container).
[ -e /run/virtlab-guest ] || {
    echo "${0##*/}: not running as a virtlab guest VM" >&2
    exit 1
}
action=o
case "${0##*/}" in reboot) action=b ;; esac
for arg in "$@"; do
    case "$arg" in -r | --reboot) action=b ;; esac
done
sync
# Answer the caller (qemu-ga waits for this process) before the machine goes away.
(
    sleep 1
    echo "$action" > /proc/sysrq-trigger
) > /dev/null 2>&1 &
exit 0
