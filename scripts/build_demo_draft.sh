#!/usr/bin/env bash
# Rebuild the shipped demo EAGLE-3 draft (eagle_ms/assets/demo/draft) for the shipped demo teacher:
#   1. regenerate: the teacher's own greedy answers to the first user turn of ShareGPT conversations;
#   2. preprocess: teacher features (aux hidden states) of those samples, cached on disk;
#   3. build-vocab: the draft vocabulary (most frequent answer tokens);
#   4. train-draft: EAGLE-3 training-time test over a 2 048-token draft vocabulary, exported as fp16 EAGLE-3
#      safetensors + config.json (WORK/draft-2048);
#   5. narrow-draft: that draft restricted to the 512 most frequent answer tokens (build-vocab again; they
#      cover all but 0.005 % of the answer tokens), the LM-head rows it already has: the shipped draft.
#
#   bash scripts/build_demo_draft.sh [WORK_DIR] [--export DIR]   (default WORK_DIR: $HOME/eagle_ms_work/demo_draft)
#
# DEMO_DRAFT_TEACHER=DIR builds the draft for another teacher checkpoint of the same architecture (default:
# the config's model.checkpoint, the shipped teacher), e.g. the phase-1 teacher of MODEL_CARD.md's previous
# pair. Regeneration, features and the draft's shared embeddings all come from that teacher.
#
# DEMO_DRAFT_WORKERS=N (default 1) runs regenerate, preprocess and train-draft on N msrun workers
# (scripts/msrun_{regenerate,preprocess,train_draft}.sh; master port DEMO_DRAFT_PORT, default 8138):
# regenerate and preprocess write the same files as one process; train-draft splits the recipe's global
# batch of 4 over the workers (the gradients of the same global loss, docs/training.md). Their progress
# then goes to WORK/logs/<stage>/worker_<rank>.log.
#
# DEMO_DRAFT_MICRO_BATCH=b: train-draft runs the batch as micro-batches of b samples and sums their
# gradients (the same step, less memory). Default: the whole batch at ANSWER <= 256, 1 above (at 1 024-token
# answers, a batch of 4 in one graph does not fit in 24 GB; docs/training.md). Above 256 the length
# buckets are also cut to two, (PROMPT + ANSWER) / 2 and PROMPT + ANSWER: every compiled bucket graph keeps
# its own memory (one process at 1 280 tokens, micro-batch 1: 12.6 GiB peak with the 6 doubling buckets,
# 9.3 GiB with 640,1280, the same tokens/s). Train with one worker there: two took 2 x 9-10 GB for 1.1x the
# tokens/s of one.
#
# Every stage resumes: regenerate skips finished conversation ids, preprocess keeps finished shards,
# build-vocab keeps an existing mapping, train-draft resumes from its newest checkpoint. Rerun after an
# interruption. The numbers below are the recipe MODEL_CARD.md reports; change them only together.
# Long stages run in the foreground with progress on stdout; run the script under nohup for a long build.
# To keep editing the repository during a build, run a frozen copy (MindSpore re-reads Python source
# when it compiles): git archive HEAD | tar -x -C SNAP; copy the teacher into SNAP/eagle_ms/assets/demo;
# EAGLE_MS_PYTHON=$PWD/.venv/bin/python bash SNAP/scripts/build_demo_draft.sh W --export W/draft
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${EAGLE_MS_PYTHON:-}" ]; then bash scripts/setup.sh; fi
PY=${EAGLE_MS_PYTHON:-.venv/bin/python}
WORK=$HOME/eagle_ms_work/demo_draft
OUT=eagle_ms/assets/demo/draft
while [ $# -gt 0 ]; do
  case "$1" in
    --export) OUT=$2; shift 2 ;;
    *) WORK=$1; shift ;;
  esac
done
mkdir -p "$WORK"
export GLOG_v=${GLOG_v:-3}
CFG=configs/demo.yaml
LIMIT=${DEMO_DRAFT_LIMIT:-2400}     # ShareGPT conversations offered (long first prompts are skipped)
STEPS=${DEMO_DRAFT_STEPS:-1500}
# DEMO_DRAFT_ANSWER_TOKENS (default 1024, the shipped draft) sets the answer length the draft learns;
# acceptance falls past it (docs/results.md §4): set it to the answer length you serve. 256 was the
# previous pair's (MODEL_CARD.md), ~6x cheaper to build.
ANSWER=${DEMO_DRAFT_ANSWER_TOKENS:-1024}
PROMPT=256                          # first prompts longer than this are skipped
TEACHER=()
if [ -n "${DEMO_DRAFT_TEACHER:-}" ]; then
  [ -f "$DEMO_DRAFT_TEACHER/model.safetensors" ] || { echo "DEMO_DRAFT_TEACHER=$DEMO_DRAFT_TEACHER: no model.safetensors there" >&2; exit 2; }
  TEACHER=(--set "model.checkpoint=$(realpath "$DEMO_DRAFT_TEACHER")")
fi

WORKERS=${DEMO_DRAFT_WORKERS:-1}
PORT=${DEMO_DRAFT_PORT:-8138}
# stage COMMAND ARGS...: `eagle-ms COMMAND ARGS...`, on $WORKERS msrun workers when WORKERS > 1
stage() {
  local command=$1; shift
  if [ "$WORKERS" -gt 1 ]; then
    PATH="$(dirname "$PY"):$PATH" bash "scripts/msrun_${command//-/_}.sh" --workers "$WORKERS" --master-port "$PORT" \
      --log-dir "$WORK/logs/$command" -- "$@"
  else
    "$PY" -m eagle_ms.cli "$command" "$@"
  fi
}

# Regeneration needs at most 256 prompt + ANSWER tokens + one 128-token prefill chunk of scratch: a
# 640-slot cache at 256 (no attention windows) makes every decode call ~3x cheaper than the 2048 default.
stage regenerate --config "$CFG" "${TEACHER[@]}" --set runtime.seq_length=$((PROMPT + ANSWER + 128)) \
  --set runtime.attention_windows=null \
  --out "$WORK/regen.jsonl" --limit "$LIMIT" --max-new-tokens "$ANSWER" --batch-size 32 --max-turns 1 \
  --max-prompt-tokens "$PROMPT"
stage preprocess --config "$CFG" "${TEACHER[@]}" --data "$WORK/regen.jsonl" --out "$WORK/features" --max-len $((PROMPT + ANSWER))
"$PY" -m eagle_ms.cli build-vocab --data "$WORK/features" --draft-vocab-size 2048 --out "$WORK/vocab.safetensors"
MICRO=${DEMO_DRAFT_MICRO_BATCH:-}
if [ -z "$MICRO" ] && [ "$ANSWER" -gt 256 ]; then MICRO=1; fi
MICRO_ARGS=()
if [ -n "$MICRO" ]; then MICRO_ARGS=(--micro-batch "$MICRO"); fi
if [ "$ANSWER" -gt 256 ]; then MICRO_ARGS+=(--buckets "$(((PROMPT + ANSWER) / 2)),$((PROMPT + ANSWER))"); fi
stage train-draft --config "$CFG" "${TEACHER[@]}" --data "$WORK/features" --vocab "$WORK/vocab.safetensors" --out "$WORK/draft-2048" \
  --work-dir "$WORK/train" --steps "$STEPS" --batch-size 4 --max-len $((PROMPT + ANSWER)) --lr 1e-3 --warmup 50 \
  --eval-every 250 --save-every 100 --export-dtype float16 "${MICRO_ARGS[@]}"
"$PY" -m eagle_ms.cli build-vocab --data "$WORK/features" --draft-vocab-size 512 --out "$WORK/vocab-512.safetensors"
"$PY" -m eagle_ms.cli narrow-draft --draft "$WORK/draft-2048" --vocab "$WORK/vocab-512.safetensors" --out "$OUT"
