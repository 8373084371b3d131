#!/usr/bin/env bash
# Install, then compare every available learning rule side by side on scikit-learn's digits
# (no download needed): prints the results table, writes runs/demo/comparison.md and curves.png.
# Extra arguments are passed to `inferlearn compare` (e.g. --epochs 5); every run starts afresh.
# MAC runs its documented recipe for long runs on small data (docs/methods/mac.md): mu_max=10, shown in the
# table's options column (at its default mu_max=1e4 the penalty outgrows the warm-started coordinates here: 8 %).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/inferlearn compare --data digits --arch 64-32-32-10 --act relu --epochs 30 --batch-size 50 \
    --lr 0.05 --rules all --rule-opt mac.mu_max=10 --out runs/demo --overwrite --quiet "$@"
