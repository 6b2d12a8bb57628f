#!/usr/bin/env bash
# Distributed teacher regeneration: `eagle-ms regenerate` on N msrun workers.
#
#   bash scripts/msrun_regenerate.sh --workers N --master-port P --log-dir D [msrun options] -- <regenerate args>
#
# Example (2 workers on one node):
#   bash scripts/msrun_regenerate.sh --workers 2 --master-port 8138 --log-dir logs/regen -- \
#       --config configs/demo.yaml --out work/regen.jsonl --limit 2400 --batch-size 32 --max-turns 1
#
# msrun options for several nodes (every node runs this script; the output's directory must be shared):
#   --local-workers K   workers on this node (default: N)
#   --node-rank R       this node's index, so ranks are R*K .. R*K+K-1 (default: 0)
#   --master-addr A     scheduler address (default: 127.0.0.1)
# Each worker reads its rank from RANK_ID/RANK_SIZE (exported by msrun), answers the conversations with
# index % N == rank into <out>.part<rank>-of-<N>, and leaves a receipt when its share is done; rank 0 then
# waits (--wait-timeout, default 3600 s) for every receipt and merges the parts into <out>, sorted by
# conversation index (the same bytes as a one-process run), or names the missing ranks and exits with
# code 3. Rerunning the same command answers only what is missing. Worker logs: D/worker_<rank>.log.
# See docs/training.md.
set -euo pipefail
exec bash "$(dirname "$0")/msrun_launch.sh" "$0" regenerate "$@"
