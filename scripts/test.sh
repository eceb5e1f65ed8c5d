#!/usr/bin/env bash
# The test suite: install everything requirements-ci.txt pins into .venv (once), then run pytest with any
# arguments given (e.g. -m "not e2e", -k layout). The HTML tests install Chromium themselves when they run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test
exec python -m pytest -q -p no:cacheprovider "$@"
