#!/usr/bin/env bash
# The static checks CI runs before the tests: ruff (pyflakes, bugbear, isort, pyupgrade, complexity), ruff format and
# mypy --strict on the whole package, configured in pyproject.toml and pinned in requirements-ci.txt.
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
# mypy's incremental cache, kept beside the cached venvs for this venv's hash (the same pins, mypy config and
# Python): a fresh clone then checks only what differs from the last run (mypy compares each module's source hash),
# ~1 CPU-s instead of ~18 (most of it ray's 663 modules and numpy's, which mtpdiag's imports reach).
if [ "$VENV_CACHE" != off ] && [ -z "${MYPY_CACHE_DIR:-}" ]; then
  export MYPY_CACHE_DIR="$VENV_CACHE/../mypy/$(_venv_hash | cut -c1-20)"
  mkdir -p "$MYPY_CACHE_DIR" && touch "$MYPY_CACHE_DIR"  # the newest: kept by the pruning below
  ls -1dt "$VENV_CACHE"/../mypy/*/ 2>/dev/null | tail -n +4 | while read -r old; do rm -rf "$old"; done
fi
mypy || status=1
exit "$status"
