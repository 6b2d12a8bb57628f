#!/usr/bin/env bash
# Phase 2 of the shipped demo teacher: continue the phase-1 (1024-token window) teacher's training on
# 2048-token windows, in the background, from a frozen copy of the code. Resumable: rerun the same command
# after a stop; a finished run is a no-op.
#
#   TEACHER2048_INIT=PHASE1_DIR bash scripts/train_demo_teacher_2048.sh [WORK_DIR]
#                                                                   start or resume (default $HOME/eagle_ms_work/teacher2048)
#   bash scripts/train_demo_teacher_2048.sh --export DIR [WORK_DIR] export the newest checkpoint (fp16) and exit
#   bash scripts/train_demo_teacher_2048.sh --eval [WORK_DIR]       held-out loss by position band of the newest
#                                                                   checkpoint -> WORK_DIR/bands-step-N.json
#                                                                   (not while training runs: memory)
#
# Recipe (eagle_ms/assets/demo/MODEL_CARD.md, "Phase 2"): model configs/demo.yaml, weights initialised from
# TEACHER2048_INIT, the phase-1 teacher's fp16 export (scripts/train_demo_teacher.sh --export, or the
# phase-1 weights in git history as the card says; needed until the work dir has a checkpoint, ignored
# after; its training optimiser state does not exist any more, so AdamW starts fresh), random windows of 1 x 2048
# tokens (max_position_embeddings = runtime.seq_length), AdamW (0.9/0.95, wd 0.1) peak lr 1e-3, 100 warmup
# steps, cosine decay to 10 %, grad clip 1.0, seed 13 (other windows than the original run's seed 0),
# checkpoints every 50 steps. Batch 1 x 2048 is the smallest batch of 2048-token windows; its train graph
# holds ~15 GB of host memory here (MindSpore CPU), so there are no evals inside the training process (an
# eval graph there would add ~4.5 GB): when training ends, a separate process evaluates the final checkpoint
# (held-out loss by position band, 48 windows of 2048, bands of 512) into WORK_DIR/bands-step-N.json.
# The training process sets its oom_score_adj to 1000: under memory pressure the kernel kills it (it
# resumes from its last checkpoint) rather than someone else's process.
#
# The code snapshot (git archive of HEAD at first start) lives in WORK_DIR/code: MindSpore re-reads Python
# source when it compiles a graph, so editing the working tree under a long-running job breaks it.
# Python: $EAGLE_MS_PYTHON if set (e.g. a venv shared by several worktrees), else this checkout's .venv
# (created by scripts/setup.sh). The job runs under `nice -n 19`: it only takes idle CPU.
# Progress (loss, tok/s, ETA, evals): WORK_DIR/train.log.
set -euo pipefail
if [ -n "${TEACHER2048_INIT:-}" ]; then TEACHER2048_INIT=$(realpath -m "$TEACHER2048_INIT"); fi  # before any cd
cd "$(dirname "$0")/.."
STEPS=${TEACHER2048_STEPS:-900}
MODE=train
EXPORT=""
if [ "${1:-}" = "--export" ]; then MODE=export; EXPORT=$(realpath -m "$2"); shift 2
elif [ "${1:-}" = "--eval" ]; then MODE=eval; shift; fi
WORK=$(realpath -m "${1:-$HOME/eagle_ms_work/teacher2048}")
if [ -n "${EAGLE_MS_PYTHON:-}" ]; then PY=$EAGLE_MS_PYTHON; else bash scripts/setup.sh; PY=$(pwd)/.venv/bin/python; fi
mkdir -p "$WORK"
if [ ! -d "$WORK/code" ]; then
  mkdir -p "$WORK/code.tmp"
  git archive HEAD | tar -x -C "$WORK/code.tmp"
  git rev-parse HEAD > "$WORK/code.tmp/COMMIT"
  mv "$WORK/code.tmp" "$WORK/code"
fi
cd "$WORK/code"
export GLOG_v=3
running() { pgrep -f "train_demo_teacher.py.*--work-dir $WORK( |$)" >/dev/null; }
case $MODE in
  export)
    exec "$PY" scripts/train_demo_teacher.py --work-dir "$WORK" --export "$EXPORT" --export-only ;;
  eval)
    if running && [ -z "${FORCE:-}" ]; then  # a second ~6 GB graph next to the ~15 GB training one
      echo "training is running (its log: $WORK/train.log); stop it first or set FORCE=1" >&2; exit 1
    fi
    step=$(ls "$WORK/checkpoints" | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | tail -1)
    exec nice -n 19 "$PY" scripts/eval_teacher_bands.py --checkpoint "$WORK" --seq-len 2048 --windows 48 \
      --cache-dir "$WORK/cache" --out "$WORK/bands-step-$step.json" ;;
esac
if running; then
  echo "already running: tail -f $WORK/train.log"; exit 0
fi
INIT=()
if [ -n "${TEACHER2048_INIT:-}" ]; then
  [ -f "$TEACHER2048_INIT/model.safetensors" ] || { echo "TEACHER2048_INIT=$TEACHER2048_INIT: no model.safetensors there" >&2; exit 2; }
  INIT=(--init-from "$TEACHER2048_INIT")
elif [ ! -d "$WORK/checkpoints" ]; then
  echo "set TEACHER2048_INIT to the phase-1 teacher directory (eagle_ms/assets/demo/MODEL_CARD.md, Phase 2): $WORK has no checkpoint to resume" >&2
  exit 2
fi
ARGS=(--config configs/demo.yaml --work-dir "$WORK" "${INIT[@]}"
      --batch-size 1 --seq-len 2048 --steps "$STEPS" --lr 1e-3 --warmup 100 --seed 13
      --save-every 50 --eval-every 0)
EVAL=(--checkpoint "$WORK" --seq-len 2048 --windows 48 --cache-dir "$WORK/cache" --out "$WORK/bands-step-$STEPS.json")
echo "[$(date -Is)] start/resume: $PY scripts/train_demo_teacher.py ${ARGS[*]} (code $(cat COMMIT))" >> "$WORK/train.log"
nohup nice -n 19 bash -c 'echo 1000 > /proc/self/oom_score_adj; py=$1; n=$2; shift 2
                          "$py" scripts/train_demo_teacher.py "${@:1:$n}" &&
                          "$py" scripts/eval_teacher_bands.py "${@:$((n + 1))}"' \
  _ "$PY" "${#ARGS[@]}" "${ARGS[@]}" "${EVAL[@]}" >> "$WORK/train.log" 2>&1 &
echo "training in the background (pid $!): tail -f $WORK/train.log"
