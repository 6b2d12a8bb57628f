#!/usr/bin/env bash
# Create .venv (if missing) and install eagle_ms with its pinned dependencies. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.eagle_ms_installed
if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
  echo "[setup] installing dependencies (first run downloads MindSpore, ~800 MB)"
  log=.venv/install.log
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -e ".[test,train,bench]"; } \
      > "$log" 2>&1; then
    tail -n 40 "$log"
    echo "[setup] installation failed; full log: $log" >&2
    exit 1
  fi
  touch "$stamp"
fi
