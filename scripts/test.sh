#!/usr/bin/env bash
# The test suite: install, then run every test (real torchrun/gloo jobs, real py-spy, real verl wheels,
# headless Chromium for the HTML report).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-chromium.sh
exec python3 -m pytest -q -p no:cacheprovider "$@"
