#!/usr/bin/env bash
# Sampled chat and batches (BENCHMARKS.md, "What speed-up on my kind of prompts"): the default draft-length policy of
# each setting against plain decoding, hf_specdec with no drafts, and the same drafter at a constant length,
# interleaved prompt by prompt in one process; the first 16 dev prompts (32 for batches of 8), 96 new tokens, cap k = 5.
#   bash benchmarks/sampling_and_batches.sh                 # every setting (about 25 minutes on 2 cores, a quiet machine)
#   bash benchmarks/sampling_and_batches.sh t07 b4          # only these
set -euo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-benchmarks/results}
mkdir -p "$R"
COMMON="--target default --prompts dev --max-new-tokens 96 --num-draft-tokens 5 --threads 2"
declare -A RUNS=(
  [t07]="--assistant ngram,default --do-sample --temperature 0.7 --draft-lengths default --num-prompts 16"
  [t10]="--assistant ngram,default --do-sample --temperature 1.0 --draft-lengths default --num-prompts 16"
  [b4]="--assistant ngram,default --batch-size 4 --draft-lengths default --num-prompts 16"
  [b8]="--assistant ngram,default --batch-size 8 --draft-lengths default --num-prompts 32"
  [greedy]="--assistant default --draft-lengths adaptive,calibrated --num-prompts 16"
)
for name in ${@:-t07 t10 b4 b8 greedy}; do
  hf-specdec bench $COMMON ${RUNS[$name]} --json "$R/sampling_and_batches_$name.json" \
    | tee "$R/sampling_and_batches_$name.txt"
done
