#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export GLOG_v=${GLOG_v:-3}  # keep MindSpore's C++ logging to errors
exec .venv/bin/python -m pytest tests -q -p no:cacheprovider "$@"
