#!/usr/bin/env bash
# Set everything up (idempotent) and run the test suite: one worker per core (pytest-xdist), each
# test module on one worker (--dist loadfile), so that a module's booted guests stay shared, handed
# out in the order tests/conftest.py gives (the heaviest first), not re-sorted by their number of tests.
# --durations: the slowest tests listed at the end, where the suite's time goes (issue 29).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=40 "$@"
