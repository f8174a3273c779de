#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian 12 machine: system packages, the Python environment,
# the C kernels. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Packages the tool and its tests use. Kept in one place: scripts/debian-packages.txt.
mapfile -t packages < <(grep -v '^\s*#' scripts/debian-packages.txt | awk 'NF {print $1}')
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
as_root=()
[[ $(id -u) -eq 0 ]] || as_root=(sudo)
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    "${as_root[@]}" apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian enables NFS-Ganesha's system service, which would serve NFS on every interface; virtlab
# starts its own server per study, bound to its own network. Keep the system one off.
if command -v systemctl >/dev/null && systemctl is-enabled --quiet nfs-ganesha 2>/dev/null; then
    "${as_root[@]}" systemctl disable --now nfs-ganesha >/dev/null 2>&1 || true
fi
# Likewise the services Debian starts with the packages the web and database workloads use, when
# this script installed them (a host's own nginx or PostgreSQL is left as it is): nginx's default
# site (port 80 on every interface), the default PostgreSQL cluster (5432), fcgiwrap's socket and
# Redis (6379).
# virtlab starts its own servers, on its own network, per trial.
for pair in nginx:nginx postgresql:postgresql fcgiwrap:fcgiwrap.socket redis-server:redis-server; do
    package=${pair%%:*} service=${pair#*:}
    [[ " ${missing[*]} " == *" $package "* ]] || continue
    if command -v systemctl >/dev/null && systemctl is-enabled --quiet "$service" 2>/dev/null; then
        "${as_root[@]}" systemctl disable --now "$service" >/dev/null 2>&1 || true
    fi
done

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
stamp=.venv/.virtlab-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[dev,libvirt]'
    touch "$stamp"
fi
# Build the C kernels now, so that the first study does not pay for it.
.venv/bin/python -c "from virtlab.build import build_kernels; print('setup: kernels in', build_kernels().bin_dir)"
