#!/usr/bin/env bash
# Install, then run the default test suite (slow tests excluded; add `-m slow` to run those).
# Offline data: MNIST from ../shared/data when present (else $INFERLEARN_DATA), Fashion-MNIST from
# Debian's dataset-fashion-mnist package. Exit code 5 ("no tests collected") counts as success.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
if [ -z "${INFERLEARN_DATA:-}" ] && [ -d ../shared/data ]; then
    export INFERLEARN_DATA="$(cd ../shared/data && pwd)"
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
.venv/bin/python -m pytest -q -n "${TEST_WORKERS:-2}" "$@"
rc=$?
[ "$rc" -eq 5 ] && rc=0
exit "$rc"
