#!/usr/bin/env bash
# Install mtpdiag (editable) and the pinned CPU-only dependencies the demo and tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
if ! python3 -m pip install -q --disable-pip-version-check -r requirements-ci.txt -e . >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup: pip install failed" >&2
  exit 1
fi
rm -f "$log"
python3 -W ignore -c "import torch, megatron.core, mtpdiag"
