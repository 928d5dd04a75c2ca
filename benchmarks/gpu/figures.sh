#!/usr/bin/env bash
# The first figures on a GPU, in the two commands of one lease of a GPU machine (payload.py's plan: the first command
# carries .gpu/common and .gpu/part-0, the second .gpu/part-1). Each part ends inside 9 minutes; every step has its
# own time limit, so a slow one leaves the next ones their time. Results in $OUT (default benchmarks/results/gpu).
#   bash benchmarks/gpu/figures.sh loop   # 1st command, no target needed: the loop on 1B and 8B shapes (bf16), and
#                                         # the sampling distribution tests on CUDA
#   bash benchmarks/gpu/figures.sh text   # 2nd command: SmolLM2 rebuilt from the GGUF parts and checked; the dev
#                                         # prompts fp32 and bf16 against plain, plain in a compiled static cache,
#                                         # transformers' prompt lookup and assisted decoding with the same draft model;
#                                         # the trainer on CUDA (bf16 mixed precision, a checkpoint, a resume)
#   bash benchmarks/gpu/figures.sh tiny   # what CI runs on the CPU: the same steps at tiny sizes
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/gpu}
WORK=${WORK:-/tmp/hf_specdec_figures}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
step() { echo "== $1 ($(date +%T))"; }

case "${1:-}" in
loop)
  step "device"; nvidia-smi -L 2>&1 | tee "$OUT/device.txt"
  step "the loop on 1B and 8B shapes"
  timeout 330 $PY benchmarks/gpu/run.py --shapes 1b,8b --json "$OUT/loop.json" > "$OUT/loop.log" 2>&1; echo "status $?"
  tail -30 "$OUT/loop.log"
  step "sampling distribution tests on CUDA"
  HF_SPECDEC_TEST_DEVICE=$DEVICE timeout 150 $PY -m pytest -q -p no:cacheprovider tests/test_sampling_exact.py \
    > "$OUT/sampling.log" 2>&1; echo "status $?"
  tail -5 "$OUT/sampling.log"
  ;;
text|tiny)
  if [ "$1" = tiny ]; then  # the trainer tests' offline world and the tiny shapes, on the CPU
    DEVICE=cpu
    TARGET=$($PY -c "from pathlib import Path; from tests.distill_world import build_tiny_world as b; w = b(Path('$WORK/world')); print(w['target'], w['data'], w['dev'])")
    read -r TARGET PROMPTS DEV <<< "$TARGET"
    ASSISTANTS="ngram,layers:1"; NUM=1; NEW=8; DATA="--num-generate 16 --exclude-ids $DEV"; STEPS=4; DTYPES=float32
  else
    step "the target, rebuilt and checked"
    eval "$($PY benchmarks/gpu/payload.py target --work "$WORK")" || exit 1
    TARGET=default PROMPTS=$SHIPPED_PROMPTS DEV=dev
    ASSISTANTS="ngram,default,distilled,layers:4"; NUM=8; NEW=128; DATA="--num-generate 1024 --gen-batch-size 512"; STEPS=40
    DTYPES="float32 bfloat16"
  fi
  for dtype in $DTYPES; do
    step "dev prompts, $dtype"
    timeout 200 $PY -m hf_specdec.cli bench --target "$TARGET" --device "$DEVICE" --dtype "$dtype" --assistant "$ASSISTANTS" \
      --prompts "$DEV" --num-prompts $NUM --max-new-tokens $NEW --num-draft-tokens 5 --adaptive --static-plain \
      --json "$OUT/text-$dtype.json" > "$OUT/text-$dtype.log" 2>&1; echo "status $?"
    grep "^|" "$OUT/text-$dtype.log"
  done
  step "the trainer: $STEPS steps in bf16 mixed precision, checkpointed, then resumed for $((STEPS / 2)) more"
  TRAIN=(--target "$TARGET" --data "$PROMPTS" --teacher-data generate $DATA --max-new-tokens 128 --drafter new
         --batch-size 16 --eval-every $STEPS --eval-prompts 4 --eval-max-new-tokens 32 --save-every $((STEPS / 2))
         --mixed-precision $([ "$DEVICE" = cpu ] && echo no || echo bf16) --data-cache-dir "$WORK/data"
         --output-dir "$WORK/trainer" --log-every 5)
  [ "$1" = tiny ] && TRAIN+=(--num-hidden-layers 1 --heldout-prompts 2 --max-prompt-tokens 64)
  rm -rf "$WORK/trainer"
  timeout 200 $PY training/distill.py "${TRAIN[@]}" --max-steps $STEPS > "$OUT/trainer.log" 2>&1; echo "status $?"
  timeout 100 $PY training/distill.py "${TRAIN[@]}" --max-steps $((STEPS * 3 / 2)) --resume >> "$OUT/trainer.log" 2>&1
  echo "status $?"
  cp "$WORK/trainer/training_log.jsonl" "$OUT/trainer_log.jsonl" 2>/dev/null
  grep -E '"event": "(resume|done)"' "$OUT/trainer.log" | cut -c1-300
  ;;
*)
  echo "usage: bash benchmarks/gpu/figures.sh loop|text|tiny" >&2; exit 2 ;;
esac
