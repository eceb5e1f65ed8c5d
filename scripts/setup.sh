#!/usr/bin/env bash
# Install mtpdiag (editable) and the pinned CPU-only dependencies the demo and tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -r requirements-ci.txt -e . 2>&1 \
  | grep -v -e "Running pip as the 'root' user" -e "pypi-more" || true
python3 -c "import torch, megatron.core, mtpdiag" 
