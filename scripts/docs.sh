#!/usr/bin/env bash
# Build the documentation site (strict: broken links and docstring errors fail), then serve it at
# http://127.0.0.1:8000 (pass `build` to only build into site/).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export NO_MKDOCS_2_WARNING=1
.venv/bin/mkdocs build --strict
if [ "${1:-serve}" != "build" ]; then
    exec .venv/bin/mkdocs serve --strict
fi
