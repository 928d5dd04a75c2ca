#!/usr/bin/env bash
# Issue 28's 4-bit row (BENCHMARKS.md, "What training buys"): the token-only drafter trained for the same
# steps on the same number of target tokens from (a) the deployed 4-bit (bitsandbytes) SmolLM2's own greedy answers,
# distilled against the 4-bit target, or (b) the fp32 SmolLM2's own answers (the on-policy set of
# block_equal_time.sh), distilled against fp32; then both measured against the 4-bit target on the dev prompts,
# beside n-gram lookup. Resumable: rerun it after an interruption.
#   bash benchmarks/quantized_own_answers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/hf_specdec/runs}
STEPS=${STEPS:-100}
TOKENS=${TOKENS:-18000}
COMMON="--drafter new --max-steps $STEPS --max-train-tokens $TOKENS --eval-every 0 --save-every 50 --eval-max-new-tokens 64"
python training/distill.py $COMMON --target-quantization 4bit --teacher-data generate --num-generate 192 \
  --max-new-tokens 128 --gen-batch-size 32 --output-dir "$RUNS/own-4bit" --resume
python training/distill.py $COMMON --teacher-data generate --num-generate 512 --max-new-tokens 192 --gen-batch-size 32 \
  --output-dir "$RUNS/own-fp32" --resume
python benchmarks/acceptance.py --target-quantization 4bit --drafters ngram "$RUNS/own-4bit" "$RUNS/own-fp32" \
  --prompts dev --num-prompts 20 --max-new-tokens 128 --num-draft-tokens 5 \
  --json benchmarks/results/quantized_own_answers.json
