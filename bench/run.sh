#!/usr/bin/env bash
# Run virtlab's benchmarks against the reference tools in the same run and write bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python bench/run_bench.py "$@"
# Study bookkeeping at 100 and at 5,000 trials; it adds its part to the results above.
.venv/bin/python bench/bookkeeping_bench.py
# The libvirt domain's boot against the QMP VM's; it adds its part to the results above.
.venv/bin/python bench/boot_bench.py
# A VM's provision and boot phases against the bare kernel and a hand-made overlay; it adds its part too.
.venv/bin/python bench/provision_bench.py
# hosts check on 16 test hosts, a study on 4, each against one host; it adds its part to the results above.
.venv/bin/python bench/fanout_bench.py
# podman and docker containers' start to first command against runc's; it adds its part too.
.venv/bin/python bench/engines_bench.py
# zstd and a guest's sleep through the command workload vs by hand; it adds its part too.
.venv/bin/python bench/command_bench.py
# The ETA's error over the course of a study of unlike cells; it adds its part too.
.venv/bin/python bench/eta_bench.py --rounds 4
# The web and database servers through virtlab vs by hand; it adds its part to the results above.
exec .venv/bin/python bench/apps_bench.py
