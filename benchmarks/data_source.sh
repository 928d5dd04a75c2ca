#!/usr/bin/env bash
# Issue 28's data-source row (BENCHMARKS.md, "What training buys"): the token-only drafter trained for
# the same steps on the same number of target tokens from (a) SmolLM2's own greedy answers to ShareGPT prompts (the
# on-policy set of block_equal_time.sh) or (b) ShareGPT's own (ChatGPT) answers scored by SmolLM2, each measured by its
# final eval through the real loop on the same held-out prompts. Resumable: rerun it after an interruption.
#   bash benchmarks/data_source.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/hf_specdec/runs}
STEPS=${STEPS:-150}
TOKENS=${TOKENS:-70000}  # the scored set of 256 ShareGPT answers holds 70,393 target tokens
COMMON="--drafter new --max-steps $STEPS --max-train-tokens $TOKENS --eval-every 0 --save-every 50 --eval-max-new-tokens 64"
python training/distill.py $COMMON --teacher-data score --num-score 256 --output-dir "$RUNS/src-scored" --resume
python training/distill.py $COMMON --teacher-data generate --num-generate 512 --max-new-tokens 192 --gen-batch-size 32 \
  --output-dir "$RUNS/src-onpolicy" --resume
for run in src-scored src-onpolicy; do
  python -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[2], s['final_step'], json.dumps(s['best']))" \
    "$RUNS/$run/training_summary.json" "$run"
done
