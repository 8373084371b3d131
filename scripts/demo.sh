#!/usr/bin/env bash
# Install, then compare every available learning rule side by side on scikit-learn's digits
# (no download needed): prints the results table, writes runs/demo/comparison.md and curves.png.
# Extra arguments are passed to `inferlearn compare` (e.g. --epochs 5); every run starts afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/inferlearn compare --data digits --arch 64-32-32-10 --act relu --epochs 30 --batch-size 50 \
    --lr 0.05 --rules all --out runs/demo --overwrite --quiet "$@"
