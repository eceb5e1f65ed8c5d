#!/usr/bin/env bash
# The demo: install mtpdiag[verify] into .venv (once), start a real CPU-only deadlocked 4-rank job, inspect it,
# print the diagnosis.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv demo
exec python examples/demo.py "$@"
