#!/usr/bin/env bash
# The test suite: install everything requirements-ci.txt pins into .venv (once; from the cache of venvs built
# from the same pins, see scripts/venv.sh), then run pytest.
#   bash scripts/test.sh           everything: the unit tier, stopping at its first failure (-x), and beside it the
#                                  Ray tests (marked ray), in a PID namespace of their own (scripts/pid1.py), so
#                                  that their `inspect --all` sees only their Ray job; then, while they go on, the
#                                  rest of the e2e tier on MTPDIAG_TEST_WORKERS (default 3) pytest-xdist workers,
#                                  grouped as tests/conftest.py says (--dist loadgroup). Without a PID namespace
#                                  the e2e tier waits for the Ray tests.
#                                  Each lists its slowest tests. With MTPDIAG_CHECKS=DIR (.ci/run), the static
#                                  checks run beside the unit tier and write DIR/log and DIR/status; their failure
#                                  stops the run before the e2e tier.
#   bash scripts/test.sh ARGS...   one pytest run with ARGS (e.g. -m "not e2e", -k layout, -n 4 --dist loadgroup).
# The HTML tests install Chromium themselves when they run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test
# Bytecode for our own code, as an installed package has it: every CLI run and every rank of a test job imports
# mtpdiag and the examples' modules, and without it (PYTHONDONTWRITEBYTECODE, as some sandboxes set) each
# recompiles them (~0.1 CPU-s a process, hundreds of processes).
python -m compileall -q -j 0 mtpdiag examples tests benchmarks >/dev/null
if [ "$#" -gt 0 ]; then
  exec python -m pytest -q -p no:cacheprovider "$@"
fi
workers="${MTPDIAG_TEST_WORKERS:-3}"
started=$SECONDS
ray_log=$(mktemp "${TMPDIR:-/tmp}/mtpdiag-ray-tests.XXXXXX")
trap 'rm -f "$ray_log"' EXIT
ray_tests_cmd=(python -m pytest -q -p no:cacheprovider -m "e2e and ray" --durations=10 tests/e2e)
# The Ray tests' `inspect --all` must see their own Ray job's ranks and no other job's: in a PID namespace of
# their own they do, and can run beside the e2e tier. Where one cannot be made (no unshare, no privilege), they
# run beside the unit tier alone, and the e2e tier waits for them.
own_pids=0
if unshare --pid --fork --mount-proc --kill-child true 2>/dev/null; then
  own_pids=1
  unshare --pid --fork --mount-proc --kill-child python scripts/pid1.py "${ray_tests_cmd[@]}" >"$ray_log" 2>&1 &
  echo "test: unit tier (tests/unit, -x); beside it the Ray tests, in a PID namespace of their own (their output" \
    "follows the e2e tier's)" >&2
else
  "${ray_tests_cmd[@]}" >"$ray_log" 2>&1 &
  echo "test: unit tier (tests/unit, -x), and the Ray tests beside it (no PID namespace can be made here, so the" \
    "e2e tier waits for them; their output follows the unit tier's)" >&2
fi
ray_tests=$!
stop_ray_tests() {
  kill -- "$ray_tests" 2>/dev/null || true
  wait "$ray_tests" 2>/dev/null || true
}
if ! python -m pytest -q -p no:cacheprovider -m "not e2e" --ignore=tests/e2e -x -n 2 --durations=10; then
  stop_ray_tests
  exit 1
fi
echo "test: unit tier took $((SECONDS - started)) s" >&2
if [ -n "${MTPDIAG_CHECKS:-}" ]; then  # .ci/run's static checks, run beside the unit tier
  while [ ! -e "$MTPDIAG_CHECKS/status" ]; do sleep 1; done
  cat "$MTPDIAG_CHECKS/log"
  if [ "$(cat "$MTPDIAG_CHECKS/status")" != 0 ]; then
    echo "test: the static checks failed (above); no e2e tier" >&2
    stop_ray_tests
    exit 1
  fi
fi
status=0
ray_status=0
if [ "$own_pids" = 0 ]; then
  wait "$ray_tests" || ray_status=$?
  cat "$ray_log"
  echo "test: the Ray tests ended after $((SECONDS - started)) s" >&2
fi
e2e_started=$SECONDS
# Beside the Ray tests the e2e tier runs at nice 10: a Ray head starts a dozen processes within its own timeouts
# (its job agent, its dashboard's modules), which it missed under the tier's load at equal priority; the Ray
# tests mostly wait, so the tier loses little.
niceness=()
if [ "$own_pids" = 1 ]; then
  niceness=(nice -n 10)
fi
echo "test: the e2e tier on $workers workers${niceness:+ (at nice 10, beside the Ray tests)}" >&2
# tests/e2e alone: each worker then collects (imports) only the e2e modules
"${niceness[@]}" python -m pytest -q -p no:cacheprovider -m "e2e and not ray" -n "$workers" --dist loadgroup \
  --durations=30 tests/e2e || status=$?
echo "test: e2e tier took $((SECONDS - e2e_started)) s" >&2
if [ "$own_pids" = 1 ]; then
  wait "$ray_tests" || ray_status=$?
  cat "$ray_log"
  echo "test: the Ray tests ended $((SECONDS - started)) s after they started" >&2
fi
[ "$ray_status" = 0 ] || status=$ray_status
exit "$status"
