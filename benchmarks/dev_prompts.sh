#!/usr/bin/env bash
# The dev-prompt tables of BENCHMARKS.md: each drafter against plain decoding (and transformers' own equivalent where
# it has one), interleaved prompt by prompt in one process, first 30 dev prompts, 128 new tokens, greedy.
#   bash benchmarks/dev_prompts.sh                  # every table (about 1.5 hours on 2 cores; a quiet machine)
#   bash benchmarks/dev_prompts.sh default ngram    # only these (model-free: token recycling, alone and backing
#                                                   # n-gram, n-gram, the default, transformers' prompt lookup)
set -euo pipefail
cd "$(dirname "$0")/.."
P=${PROMPTS:-dev}
R=${OUT:-benchmarks/results}
mkdir -p "$R"
declare -A RUNS=(
  [default]="--assistant ngram+medusa:chain --num-draft-tokens 8"
  [model-free]="--assistant recycle,ngram+recycle,ngram,ngram+medusa:chain --num-draft-tokens 8 --adaptive"
  [ngram]="--assistant ngram --num-draft-tokens 8 --adaptive"
  [layers]="--assistant layers:4 --num-draft-tokens 4"
  [distilled]="--assistant distilled --num-draft-tokens 3 --adaptive"
  [self]="--assistant self --num-draft-tokens 4 --adaptive"
  [medusa]="--assistant medusa --num-draft-tokens 3"
  [medusa-chain]="--assistant medusa:chain --num-draft-tokens 3"
)
for name in ${@:-model-free default ngram layers distilled self medusa medusa-chain}; do
  hf-specdec bench --target default ${RUNS[$name]} --prompts "$P" --num-prompts 30 --max-new-tokens 128 \
    --json "$R/dev_$name.json" | tee "$R/dev_$name.txt"
done
