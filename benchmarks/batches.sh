#!/usr/bin/env bash
# Throughput at batch 1, 4 and 8 with the distilled drafter against plain batched generate() (BENCHMARKS.md,
# "What speed-up on my kind of prompts"): 32 dev prompts in left-padded batches, 128 new tokens, greedy, k = 3.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${PROMPTS:-dev}
R=${OUT:-benchmarks/results}
mkdir -p "$R"
for B in 1 4 8; do
  hf-specdec bench --target default --assistant distilled --prompts "$P" --num-prompts 32 --max-new-tokens 128 \
    --num-draft-tokens 3 --batch-size $B --json "$R/batch_distilled_b$B.json"
done
