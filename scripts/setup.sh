#!/usr/bin/env bash
# Create .venv with the pinned torch (the build pip's index serves), then install SpecPilot (with test extras).
# Idempotent: a second run only re-installs the project itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0 ..."
  .venv/bin/python -m pip install -q torch==2.13.0
fi
echo "setup: installing specpilot and its dependencies ..."
.venv/bin/python -m pip install -q -e ".[test,llm]"
echo "setup: done (.venv ready)"
