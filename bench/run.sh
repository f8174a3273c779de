#!/usr/bin/env bash
# Run virtlab's benchmarks against the reference tools in the same run and write bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python bench/run_bench.py "$@"
