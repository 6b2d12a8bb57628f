#!/usr/bin/env bash
# Data-parallel EAGLE-3 draft training: `eagle-ms train-draft` on N msrun workers.
#
#   bash scripts/msrun_train_draft.sh --workers N --master-port P --log-dir D [msrun options] -- <train-draft args>
#
# Example (4 workers on one node, global batch 16 = 4 per worker):
#   bash scripts/msrun_train_draft.sh --workers 4 --master-port 8128 --log-dir logs/train_draft -- \
#       --config configs/demo.yaml --data work/features --vocab work/draft_vocab.safetensors \
#       --out work/draft --work-dir work/train_draft --steps 2000 --batch-size 16
#
# msrun options for several nodes (every node runs this script; --work-dir and the data must be shared):
#   --local-workers K   workers on this node (default: N)
#   --node-rank R       this node's index, so ranks are R*K .. R*K+K-1 (default: 0)
#   --master-addr A     scheduler address (default: 127.0.0.1)
# Every worker joins the cluster (mindspore.communication.init; msrun's scheduler process, MS_ROLE=MS_SCHED,
# serves the rendezvous and exits), takes its slice of each global batch (--batch-size must be divisible
# by N) and averages gradients with the others (AllReduce). Rank 0 logs, checkpoints and exports.
# Rerunning the same command resumes from the newest checkpoint in --work-dir. Worker logs:
# D/worker_<rank>.log. See docs/training.md.
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
        *) echo "msrun_train_draft.sh: unknown option '$1' (train-draft arguments go after --)" >&2; usage ;;
    esac
done
[[ -n "$WORKERS" && -n "$PORT" && -n "$LOG_DIR" ]] || { echo "msrun_train_draft.sh: --workers, --master-port and --log-dir are required" >&2; usage; }
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "msrun_train_draft.sh: --workers must be a positive integer, got '$WORKERS'" >&2; exit 2; }
LOCAL="${LOCAL:-$WORKERS}"

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# msrun starts workers as `python ...` from PATH: put the project's venv first when there is one.
if [[ -x "$REPO/.venv/bin/python" ]]; then export PATH="$REPO/.venv/bin:$PATH"; fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export GLOG_v="${GLOG_v:-3}"
command -v msrun >/dev/null || { echo "msrun_train_draft.sh: msrun not found (install mindspore)" >&2; exit 2; }

exec msrun --worker_num "$WORKERS" --local_worker_num "$LOCAL" --node_rank "$NODE_RANK" \
    --master_addr "$ADDR" --master_port "$PORT" --log_dir "$LOG_DIR" --join True \
    python -m eagle_ms.cli train-draft "$@"
