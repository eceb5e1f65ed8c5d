#!/usr/bin/env bash
# Run the e2e tier N times (default 3) beside two busy loops, as `stress --cpu 2` would load the machine, and
# print each run's pass/fail counts and time: a test that fails only under load is a race to fix at its cause.
# The tier is CI's (scripts/test.sh): the e2e tests not marked ray, on MTPDIAG_TEST_WORKERS (4) workers. The Ray
# tests need a PID namespace of their own (their `inspect --all`), and run under load in every CI run, beside
# the tier.
#   bash scripts/stress-e2e.sh [N] [pytest args...]     logs in ${MTPDIAG_STRESS_LOGS:-/tmp/mtpdiag-stress}/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test
runs="${1:-3}"
shift || true
logs="${MTPDIAG_STRESS_LOGS:-/tmp/mtpdiag-stress}"
mkdir -p "$logs"
loops=()
cleanup() {
  for pid in "${loops[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
for _ in 1 2; do
  python3 -c 'while True: pass' &
  loops+=("$!")
done
status=0
for run in $(seq 1 "$runs"); do
  started=$SECONDS
  code=0
  python -m pytest -q -p no:cacheprovider -m "e2e and not ray" -n "${MTPDIAG_TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder -rfE \
    --durations=30 tests/e2e "$@" >"$logs/run-$run.log" 2>&1 || code=$?
  [ "$code" -eq 0 ] || status=1
  echo "stress run $run/$runs: exit $code in $((SECONDS - started)) s, load $(cut -d' ' -f1-3 /proc/loadavg):" \
    "$(grep -E '[0-9]+ (passed|failed|errors?)' "$logs/run-$run.log" | tail -1 | tr -d '=')"
  grep -E '^(FAILED|ERROR) ' "$logs/run-$run.log" || true
done
exit "$status"
