#!/usr/bin/env bash
# The test suite: install everything requirements-ci.txt pins into .venv (once; from the cache of venvs built
# from the same pins, see scripts/venv.sh), then run pytest.
#   bash scripts/test.sh           everything: the unit tier first, stopping at its first failure (-x), then the
#                                  e2e tier on MTPDIAG_TEST_WORKERS (default 4) pytest-xdist workers, grouped as
#                                  tests/conftest.py says (--dist loadgroup), then the Ray tests alone (marked
#                                  ray: they need the host to themselves); the slowest tests are listed.
#   bash scripts/test.sh ARGS...   one pytest run with ARGS (e.g. -m "not e2e", -k layout, -n 4 --dist loadgroup).
# The HTML tests install Chromium themselves when they run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test
if [ "$#" -gt 0 ]; then
  exec python -m pytest -q -p no:cacheprovider "$@"
fi
workers="${MTPDIAG_TEST_WORKERS:-4}"
started=$SECONDS
echo "test: unit tier (tests/unit, -x)" >&2
python -m pytest -q -p no:cacheprovider -m "not e2e" --ignore=tests/e2e -x --durations=10
echo "test: unit tier took $((SECONDS - started)) s; e2e tier on $workers workers" >&2
started=$SECONDS
status=0
# tests/e2e alone: each worker then collects (imports) only the e2e modules
python -m pytest -q -p no:cacheprovider -m "e2e and not ray" -n "$workers" --dist loadgroup --durations=30 \
  tests/e2e || status=$?
echo "test: e2e tier took $((SECONDS - started)) s; the Ray tests alone" >&2
started=$SECONDS
python -m pytest -q -p no:cacheprovider -m "e2e and ray" --durations=10 tests/e2e || status=$?
echo "test: Ray tests took $((SECONDS - started)) s" >&2
exit "$status"
