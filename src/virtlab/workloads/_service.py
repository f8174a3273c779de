"""What the web and database workloads share: a server virtlab starts in the environment measured, as
a system user rather than root, in a directory of its own in the environment's working directory.

PostgreSQL refuses to run as root, and a web server's workers and CGI programs should not; Debian's
packages bring the users (``postgres``, ``www-data``) to the host and to the guest image alike. The
shell functions below, given to every server-side script, decide at run time, in the environment:

- commands that do not run as root (an SSH host's user) run the server as that user;
- root runs it as the system user (``setpriv``, no shell, no PAM session) when that user can reach
  the server's directory (enter the working directory it is in), after handing the directory to it
  (``chown``): a container's /mnt, a guest's /;
- where the user cannot (natively, a working directory under a directory others may not enter,
  such as /root or pytest's temporary directories), the server runs in a user namespace of its own
  in which it *is* that user (not root: PostgreSQL checks) and which maps that user to root outside,
  the owner of those directories: the path, the files and their modes stay as they are, and the
  server has no capability outside its namespace.

A workload knows nothing of where it runs: which case applies is the environment's to tell, by what
its commands find.
"""

from __future__ import annotations

import re
import secrets

from virtlab.samples import ParseError

RUN_AS = r"""
# what root writes for the server (its listen addresses, the CGI program) must be readable by it,
# whatever umask the environment's commands get (a guest agent's is 077)
umask 022
# reaches USER: whether USER can reach the server's directory (this one), i.e. enter its parent:
# the directory itself is handed to USER
reaches() { setpriv --reuid="$1" --regid="$1" --clear-groups -- test -x "${PWD%/*}/" 2>/dev/null; }
# own USER: hand the server's directory to USER where the server will run as USER itself
own() {
    if [ "$(id -u)" = 0 ] && reaches "$1"; then chown -R "$1:" . || return 1; fi
}
# run_as USER PROGRAM ARGS...: replace this shell by PROGRAM (an absolute path) run as USER
run_as() {
    user=$1
    shift
    [ "$(id -u)" = 0 ] || exec "$@"
    if reaches "$user"; then
        exec setpriv --reuid="$user" --regid="$user" --init-groups --reset-env -- "$@"
    fi
    exec unshare --user --map-user="$user" --map-group="$user" -- "$@"
}
"""


def with_run_as(script: str) -> str:
    """``script`` with the functions above defined first."""
    return RUN_AS + script


def study_token() -> str:
    """Names a workload's directories: studies (and workloads) running at once never share one."""
    return secrets.token_hex(4)


# A client's own directory in the working directory, removed when the client ends (or is stopped):
# "$dir" after it. Another client of the same workload measured at once (consolidation tiles) has
# its own, and no trial's clean-up removes another's.
PRIVATE_DIR = r"""
dir=$(mktemp -d "$PWD/virtlab-client.XXXXXX") || exit 1
trap 'rm -rf -- "$dir"' EXIT
trap 'exit 143' TERM INT HUP
"""

_SECTION = re.compile(r"^=== (.+?)(?: (\S+=\S+.*))?$")


def split_sections(output: str) -> dict[str, str]:
    """The client's output by its ``=== name`` lines: name -> the text up to the next one (a
    section line's own ``key=value`` words stay with it)."""
    sections: dict[str, str] = {}
    name = None
    for line in output.splitlines():
        match = _SECTION.match(line)
        if match:
            name = match.group(1)
            sections[name] = (match.group(2) or "") + "\n"
        elif name is not None:
            sections[name] += line + "\n"
    return sections


_TIMES = re.compile(r"^(\d+)m\s*([\d.]+)s\s+(\d+)m\s*([\d.]+)s\s*$", re.M)


def client_cpu_seconds(text: str) -> dict[str, float]:
    """The CPU time a client script's programs took, from the shell's ``times`` (its second line:
    the children's user and system time): the load generator's own cost on its host."""
    found = _TIMES.findall(text)
    if len(found) != 2:
        raise ParseError("the client's CPU times (the shell's `times`) are not in its output")
    minutes_user, user, minutes_system, system = found[1]
    return {
        "client_user_s": round(int(minutes_user) * 60 + float(user), 3),
        "client_system_s": round(int(minutes_system) * 60 + float(system), 3),
    }
