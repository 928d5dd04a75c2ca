#!/usr/bin/env bash
# Issue 28's equal-time table (BENCHMARKS.md, "What training buys"): SmolLM2's own greedy answers
# to 512 ShareGPT prompts (fp32: the bf16 copy generates slower on a CPU), with the states entering layers 2, 15 and
# 27; then the block drafter, the EAGLE-3-style drafter and the token-only drafter trained on them for the same
# time (HOURS, default 0.15 h each), each measured by its final eval through the real loop; then all of them on the
# first 6 dev prompts beside plain decoding, n-gram lookup and the default, alone and behind n-gram lookup.
# Every run resumes (--resume): run it again to continue them for another HOURS (the long run's sittings).
#   bash benchmarks/block_equal_time.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/hf_specdec/runs}
HOURS=${HOURS:-0.15}
DATA="--teacher-data generate --num-generate 512 --max-new-tokens 192 --gen-batch-size 32"
python training/distill.py --drafter eagle3 $DATA --prepare-only --output-dir "$RUNS/prep-onpolicy" --resume
for kind in block eagle3 new; do
  python training/distill.py --drafter $kind $DATA --max-steps 20000 --time-budget "$HOURS" --eval-every 0 \
    --save-every 50 --eval-max-new-tokens 64 --output-dir "$RUNS/eq-$kind" --resume
done
b="$RUNS/eq-block" e="$RUNS/eq-eagle3" t="$RUNS/eq-new"
hf-specdec bench --target default --assistant "ngram,default,$b,$e,$t,ngram+$b" --prompts dev \
  --num-prompts 6 --max-new-tokens 128 --num-draft-tokens 5 --threads 2 \
  --json benchmarks/results/block_equal_time.json
