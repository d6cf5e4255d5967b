#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. GPU tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest -q --timeout=900 "$@"
