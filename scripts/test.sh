#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Extra arguments go to pytest.
# Test files run on EAGLE_MS_TEST_WORKERS processes (default 2, the CI machine's cores; pytest-xdist,
# one file per worker at a time so module fixtures compile once); EAGLE_MS_TEST_WORKERS=0 runs serially.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export GLOG_v=${GLOG_v:-3}  # keep MindSpore's C++ logging to errors
workers=${EAGLE_MS_TEST_WORKERS:-2}
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
exec .venv/bin/python -m pytest tests -q -p no:cacheprovider "${parallel[@]}" "$@"
