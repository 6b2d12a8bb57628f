#!/usr/bin/env bash
# Distributed teacher-feature preprocessing: `eagle-ms preprocess` on N msrun workers.
#
#   bash scripts/msrun_preprocess.sh --workers N --master-port P --log-dir D [msrun options] -- <preprocess args>
#
# Example (8 workers on one node):
#   bash scripts/msrun_preprocess.sh --workers 8 --master-port 8118 --log-dir logs/preprocess -- \
#       --config configs/demo.yaml --data work/regen.jsonl --out work/features --shard-size 64
#
# msrun options for several nodes (every node runs this script; the output directory must be shared):
#   --local-workers K   workers on this node (default: N)
#   --node-rank R       this node's index, so ranks are R*K .. R*K+K-1 (default: 0)
#   --master-addr A     scheduler address (default: 127.0.0.1)
# Each worker reads its rank from RANK_ID/RANK_SIZE (exported by msrun) and writes the shards with
# id % N == rank; rank 0 then waits (--wait-timeout, default 600 s) for all shards and writes
# manifest.json, or names the missing shards and exits with code 3. Rerunning the same command
# recomputes only missing shards. Worker logs: D/worker_<rank>.log. See docs/training.md.
set -euo pipefail

usage() { sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

WORKERS="" PORT="" LOG_DIR="" LOCAL="" NODE_RANK=0 ADDR=127.0.0.1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --workers) WORKERS="$2"; shift 2 ;;
        --master-port) PORT="$2"; shift 2 ;;
        --log-dir) LOG_DIR="$2"; shift 2 ;;
        --local-workers) LOCAL="$2"; shift 2 ;;
        --node-rank) NODE_RANK="$2"; shift 2 ;;
        --master-addr) ADDR="$2"; shift 2 ;;
        -h|--help) usage 0 ;;
        --) shift; break ;;
        *) echo "msrun_preprocess.sh: unknown option '$1' (preprocess arguments go after --)" >&2; usage ;;
    esac
done
[[ -n "$WORKERS" && -n "$PORT" && -n "$LOG_DIR" ]] || { echo "msrun_preprocess.sh: --workers, --master-port and --log-dir are required" >&2; usage; }
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "msrun_preprocess.sh: --workers must be a positive integer, got '$WORKERS'" >&2; exit 2; }
LOCAL="${LOCAL:-$WORKERS}"

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# msrun starts workers as `python ...` from PATH: put the project's venv first when there is one.
if [[ -x "$REPO/.venv/bin/python" ]]; then export PATH="$REPO/.venv/bin:$PATH"; fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export GLOG_v="${GLOG_v:-3}"
command -v msrun >/dev/null || { echo "msrun_preprocess.sh: msrun not found (install mindspore)" >&2; exit 2; }

exec msrun --worker_num "$WORKERS" --local_worker_num "$LOCAL" --node_rank "$NODE_RANK" \
    --master_addr "$ADDR" --master_port "$PORT" --log_dir "$LOG_DIR" --join True \
    python -m eagle_ms.cli preprocess "$@"
