#!/usr/bin/env bash
# Set up (if needed) and run the demo: teacher-only vs speculative greedy generation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export GLOG_v=${GLOG_v:-3}
exec .venv/bin/python -m eagle_ms.demo "$@"
