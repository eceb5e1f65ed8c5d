#!/usr/bin/env bash
# The test suite: install everything requirements-ci.txt pins into .venv (once; from the cache of venvs built
# from the same pins, see scripts/venv.sh), then run pytest.
#   bash scripts/test.sh           everything: the unit tier (2 xdist workers), stopping at its first failure
#                                  (-x), and beside it the Ray tests (marked ray), in a PID namespace of their own
#                                  where one can be made (scripts/pid1.py), so that their `inspect --all` sees only
#                                  their Ray job; then the rest of the e2e tier on MTPDIAG_TEST_WORKERS (default
#                                  4) pytest-xdist workers, grouped as tests/conftest.py says (--dist loadgroup),
#                                  beside the Ray tests still running where CPU groups can be made (below), else
#                                  after them. Each lists its slowest tests. With MTPDIAG_CHECKS=DIR (.ci/run), the
#                                  static checks run beside the unit tier and write DIR/log and DIR/status; their
#                                  failure stops the run before the e2e tier.
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
workers="${MTPDIAG_TEST_WORKERS:-4}"  # 3 left both cores idle ~10% of the tier (CI-34: 131 core-s), every worker in a test that waits
started=$SECONDS
ray_log=$(mktemp "${TMPDIR:-/tmp}/mtpdiag-ray-tests.XXXXXX")
ray_tests_cmd=(python -m pytest -q -p no:cacheprovider -m "e2e and ray" --durations=10 tests/e2e)

# CPU groups (the cgroup v1 cpu controller, where this user may make them): the Ray tests in one with 8 times the
# weight of the e2e tier's. A Ray head's job server must start within a fixed 20 s of `ray start`; beside the e2e
# tier, whose every torchrun job is a session and so an autogroup of its own, it got a sliver of the CPU and
# missed it (2 runs of 2, even at nice 10 for the tier: nice does not reach across autogroups, a cgroup's weight
# does). In their group the Ray tests run beside the e2e tier as beside the unit tier; without groups, the e2e
# tier waits for them, as before.
cpu_root=/sys/fs/cgroup/cpu
ray_group="" e2e_group=""
if [ -w "$cpu_root" ] && mkdir "$cpu_root/mtpdiag-ray-$$" 2>/dev/null; then
  ray_group="$cpu_root/mtpdiag-ray-$$"
  if echo 8192 >"$ray_group/cpu.shares" && mkdir "$cpu_root/mtpdiag-e2e-$$" 2>/dev/null; then
    e2e_group="$cpu_root/mtpdiag-e2e-$$"
  fi
fi
if [ -z "$e2e_group" ] && [ -n "$ray_group" ]; then
  rmdir "$ray_group" 2>/dev/null || true
  ray_group=""
fi
remove_groups() {
  rm -f "$ray_log"
  local group
  for group in $ray_group $e2e_group; do  # empty once every task in it has ended
    for _ in 1 2 3 4 5; do rmdir "$group" 2>/dev/null && break; sleep 1; done
  done
}
trap remove_groups EXIT

# In a PID namespace of their own (where one can be made) the Ray tests' `inspect --all` sees their own Ray job
# and no other job on the host, and what a cluster leaves behind ends with the namespace.
start_ray_tests() {
  if [ -n "$ray_group" ]; then echo "$BASHPID" >"$ray_group/tasks"; fi  # everything it starts stays in the group
  if unshare --pid --fork --mount-proc --kill-child true 2>/dev/null; then
    exec unshare --pid --fork --mount-proc --kill-child python scripts/pid1.py "${ray_tests_cmd[@]}"
  fi
  exec "${ray_tests_cmd[@]}"
}
echo "test: unit tier (tests/unit, -x), and the Ray tests beside it (their output follows)" >&2
start_ray_tests >"$ray_log" 2>&1 &
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
report_ray_tests() {
  wait "$ray_tests" || status=$?
  cat "$ray_log"
  echo "test: the Ray tests ended after $((SECONDS - started)) s" >&2
}
if [ -z "$e2e_group" ]; then
  echo "test: no CPU groups can be made here: the e2e tier waits for the Ray tests" >&2
  report_ray_tests
fi
echo "test: the e2e tier on $workers workers$([ -n "$e2e_group" ] && echo ", beside the Ray tests")" >&2
e2e_started=$SECONDS
# tests/e2e alone: each worker then collects (imports) only the e2e modules
(
  if [ -n "$e2e_group" ]; then echo "$BASHPID" >"$e2e_group/tasks"; fi
  exec python -m pytest -q -p no:cacheprovider -m "e2e and not ray" -n "$workers" --dist loadgroup --no-loadscope-reorder --durations=30 \
    tests/e2e
) || status=$?
echo "test: e2e tier took $((SECONDS - e2e_started)) s" >&2
if [ -n "$e2e_group" ]; then
  report_ray_tests
fi
exit "$status"
