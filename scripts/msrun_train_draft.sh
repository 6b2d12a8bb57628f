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
exec bash "$(dirname "$0")/msrun_launch.sh" "$0" train-draft "$@"
