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
exec bash "$(dirname "$0")/msrun_launch.sh" "$0" preprocess "$@"
