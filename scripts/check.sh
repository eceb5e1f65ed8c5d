#!/usr/bin/env bash
# The static checks CI runs before the tests: ruff (pyflakes, bugbear, isort, pyupgrade), ruff format and mypy (strict on the
# model, the layout and the analysis), both configured in pyproject.toml and pinned in requirements-ci.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test
status=0
echo "check: ruff" >&2
ruff check . || status=1
echo "check: ruff format" >&2
ruff format --check . || status=1
echo "check: mypy" >&2
mypy || status=1
exit "$status"
