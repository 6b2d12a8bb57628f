#!/usr/bin/env bash
# Data-parallel benchmark with msrun (MindSpore 2.9): N worker processes on this node, turns sharded by
# question_id % N, each rank writing its own traces into the same run directory; rank 0 waits (bounded,
# --merge-timeout) for the others and writes the merged summary a single process would write.
#
# Usage:   scripts/msrun_bench.sh N [bench|sweep] --out RUN_DIR [other eagle-ms bench/sweep options]
# Example: scripts/msrun_bench.sh 8 bench --config configs/demo.yaml --draft eagle3 --draft-path D \
#              --data-dir ../shared/data --out runs/full-240
# Env:     MASTER_PORT (default: a free port), LOG_DIR (default: RUN_DIR/msrun_logs),
#          GLOG_v (default 3: MindSpore C++ errors only).
# --overwrite is handled here: an earlier run in RUN_DIR is deleted before any worker starts.
# --resume goes to every worker: each keeps its finished turns of an interrupted run (docs/metrics.md).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
if [[ $# -lt 2 ]]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
N=$1
shift
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "msrun_bench.sh: N must be a positive integer, got '$N'" >&2; exit 2; }
CMD=bench
if [[ "$1" == bench || "$1" == sweep ]]; then CMD=$1; shift; fi

OUT=""
OVERWRITE=0
RESUME=0
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; ARGS+=("$1" "$2"); shift 2 ;;
    --out=*) OUT="${1#--out=}"; ARGS+=("$1"); shift ;;
    --overwrite) OVERWRITE=1; shift ;;
    --resume) RESUME=1; ARGS+=("$1"); shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[[ -n "$OUT" ]] || { echo "msrun_bench.sh: --out RUN_DIR is required" >&2; exit 2; }
if [[ -x "$REPO/.venv/bin/python" ]]; then export PATH="$REPO/.venv/bin:$PATH"; fi  # msrun starts `python`

if [[ $RESUME -eq 1 && $OVERWRITE -eq 1 ]]; then
  echo "msrun_bench.sh: --resume keeps the run in $OUT and --overwrite replaces it: give one" >&2
  exit 2
fi
if [[ $RESUME -eq 0 && -d "$OUT" && -n "$(ls -A "$OUT")" ]]; then
  if [[ $OVERWRITE -eq 0 ]]; then
    echo "msrun_bench.sh: $OUT is not empty: use a new --out, --resume or --overwrite" >&2
    exit 2
  fi
  if [[ ! -e "$OUT/manifest.json" && ! -e "$OUT/sweep.json" && ! -d "$OUT/ranks" && ! -d "$OUT/traces" ]]; then
    echo "msrun_bench.sh: refusing to delete $OUT: it does not look like a run directory" >&2
    exit 2
  fi
  # a run still writing there holds a rank lock (eagle_ms/locks.py): never delete under it
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python - "$OUT" <<'PY' || exit 2
import sys
from eagle_ms.locks import describe, holders
busy = holders(sys.argv[1])
for lock, holder in busy.items():
    print(f"msrun_bench.sh: refusing to delete {sys.argv[1]}: a run is writing it ({describe(holder)}; {lock})",
          file=sys.stderr)
sys.exit(1 if busy else 0)
PY
  rm -rf "$OUT"
fi
mkdir -p "$OUT"

export GLOG_v="${GLOG_v:-3}"
PORT="${MASTER_PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
LOG_DIR="${LOG_DIR:-$OUT/msrun_logs}"

exec msrun --worker_num "$N" --local_worker_num "$N" --master_port "$PORT" --log_dir "$LOG_DIR" --join True \
  "$REPO/scripts/bench_entry.py" "$CMD" "${ARGS[@]}"
