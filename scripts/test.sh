#!/usr/bin/env bash
# The README's test command: set up, then run the default (fast) suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -m "not slow and not gpu" "$@"
