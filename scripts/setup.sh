#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian 12 machine: system packages, the Python environment,
# the C kernels. Safe to run again; it only installs what is missing.
#   scripts/setup.sh           everything: every environment kind, workload and test
#   scripts/setup.sh --study   only what the built-in default study needs (run-default-study.sh):
#                              about a third of the packages, and virtlab without its test tools
#   scripts/setup.sh --list [--study]   print the packages it would install, install nothing
set -euo pipefail
cd "$(dirname "$0")/.."

scope=all list=no
for argument in "$@"; do
    case $argument in
        --study) scope=study ;;
        --list) list=yes ;;
        *) echo "setup: unknown option $argument (options: --study, --list)" >&2; exit 2 ;;
    esac
done

# Packages the tool and its tests use. Kept in one place: scripts/debian-packages.txt, where a
# second word "study" marks what the default study needs.
mapfile -t packages < <(grep -v '^\s*#' scripts/debian-packages.txt |
    awk -v scope="$scope" 'NF && (scope == "all" || $2 == "study") {print $1}')
if [[ $list == yes ]]; then
    printf '%s\n' "${packages[@]}"
    exit 0
fi
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
# The default study needs virtlab alone; everything adds the tests' tools, libvirt's binding (built
# against libvirt-dev), ansible-core (inventories) and the Kubernetes client (kind = "pod").
# A full set-up after a study one installs the rest.
if [[ $scope == study ]]; then
    stamp=.venv/.virtlab-installed-study requirement=.
else
    stamp=.venv/.virtlab-installed requirement='.[dev,libvirt,lab,pod]'
fi
full=.venv/.virtlab-installed
fresh() { [[ -f $1 && ! pyproject.toml -nt $1 ]]; }
if ! fresh "$stamp" && ! fresh "$full"; then
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e "$requirement"
    touch "$stamp"
fi
# Build the C kernels now, so that the first study does not pay for it.
.venv/bin/python -c "from virtlab.build import build_kernels; print('setup: kernels in', build_kernels().bin_dir)"
