#!/usr/bin/env bash
# The demo: install, start a real CPU-only deadlocked 4-rank job, inspect it, print the diagnosis.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec python3 examples/demo.py "$@"
