#!/usr/bin/env bash
# Set everything up (idempotent) and run virtlab's built-in default study.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/virtlab run "$@"
