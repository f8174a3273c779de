#!/usr/bin/env bash
# Set up what the built-in default study needs (idempotent; scripts/test.sh sets up the rest) and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --study
exec .venv/bin/virtlab run "$@"
