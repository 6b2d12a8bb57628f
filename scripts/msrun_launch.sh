#!/usr/bin/env bash
# Shared msrun launcher behind scripts/msrun_regenerate.sh, scripts/msrun_preprocess.sh and scripts/msrun_train_draft.sh:
#
#   bash scripts/msrun_launch.sh CALLER_SCRIPT EAGLE_MS_COMMAND --workers N --master-port P --log-dir D \
#       [--local-workers K --node-rank R --master-addr A] -- <command args>
#
# Puts the project's venv first on PATH (msrun starts workers as `python` from PATH), then runs
# `msrun ... python -m eagle_ms.cli EAGLE_MS_COMMAND <command args>` with --join True.
set -euo pipefail
CALLER="$1" COMMAND="$2"; shift 2
NAME="$(basename "$CALLER")"

usage() { sed -n '2,/^set /{/^#/p}' "$CALLER" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

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
        *) echo "$NAME: unknown option '$1' ($COMMAND arguments go after --)" >&2; usage ;;
    esac
done
[[ -n "$WORKERS" && -n "$PORT" && -n "$LOG_DIR" ]] || { echo "$NAME: --workers, --master-port and --log-dir are required" >&2; usage; }
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "$NAME: --workers must be a positive integer, got '$WORKERS'" >&2; exit 2; }
LOCAL="${LOCAL:-$WORKERS}"

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# msrun starts workers as `python ...` from PATH: put the project's venv first when there is one.
if [[ -x "$REPO/.venv/bin/python" ]]; then export PATH="$REPO/.venv/bin:$PATH"; fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export GLOG_v="${GLOG_v:-3}"
command -v msrun >/dev/null || { echo "$NAME: msrun not found (install mindspore)" >&2; exit 2; }

exec msrun --worker_num "$WORKERS" --local_worker_num "$LOCAL" --node_rank "$NODE_RANK" \
    --master_addr "$ADDR" --master_port "$PORT" --log_dir "$LOG_DIR" --join True \
    python -m eagle_ms.cli "$COMMAND" "$@"
