#!/usr/bin/env bash
# The teacher-quantization row of BENCHMARKS.md: the same 1,024 ShareGPT answers scored teacher-forced by the deployed
# 4-bit (bitsandbytes) SmolLM2 instead of the fp32 one, the token-only drafter trained on it with the kinds table's
# recipe and subset, then both token-only drafters (fp32 teacher: benchmarks/kinds_table.sh's; 4-bit teacher: this
# one) measured against the 4-bit target, beside n-gram lookup.
#   bash benchmarks/kinds_table.sh && bash benchmarks/teacher_quantization.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/hf_specdec/runs}
TOKENS=${TOKENS:-250000}
DATA="--target default --teacher-data score --num-generate 0 --num-score 1024 --heldout-prompts 16 \
  --max-seq-len 512 --data-cache-dir $HOME/.cache/hf_specdec/distill-data --threads 2 --max-train-tokens $TOKENS"
RECIPE="--drafter new --batch-size 8 --max-steps ${STEPS:-100} --learning-rate 1e-3 --warmup-steps 10 \
  --eval-every ${STEPS:-100} --eval-prompts 8 --eval-max-new-tokens 64 --save-every 25 --log-every 5"
out="$RUNS/kinds-token-only-4bit-teacher-$TOKENS"
if [ ! -f "$out/training_summary.json" ]; then
  python -m training.distill $DATA $RECIPE --target-quantization 4bit --output-dir "$out" --resume
fi
python benchmarks/acceptance.py --target-quantization 4bit --drafters ngram "$RUNS/kinds-token-only-$TOKENS" "$out" \
  --prompts ../shared/data/dev_prompts.jsonl --num-prompts 30 --max-new-tokens 128 --num-draft-tokens 5 --threads 2 \
  --json benchmarks/results/teacher_quantization.json
