#!/usr/bin/env bash
# The floor (BENCHMARKS.md, "Never slower than plain"): in each mode the default takes, plain decoding, hf_specdec's own
# loop with no drafts, `assistant="default"` and n-gram lookup alone as a call gets them (no draft_length: the
# default policy), interleaved prompt by prompt, each hf_specdec row's tokens/s over the no-drafts row's (and that row's
# over plain) with a 95% interval over prompts. 96 new tokens, cap k = 5, a fresh cache folder (the calibrations of the
# first call included, as a new user's first calls pay them).
#   bash benchmarks/floor.sh                    # every mode (about 45 minutes on 2 cores, a quiet machine)
#   bash benchmarks/floor.sh b4 t07             # only these
set -euo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-benchmarks/results}
mkdir -p "$R"
# a fresh cache folder (fresh calibrations), holding the converted default target of the usual one
kept=$(python -c "from hf_specdec.speed.machine import cache_dir; print(cache_dir())")
export HF_SPECDEC_CACHE=$(mktemp -d)
for item in "$kept"/*/; do
  case "$(basename "$item")" in cpu_matmul) ;; *) ln -s "$item" "$HF_SPECDEC_CACHE/$(basename "$item")" ;; esac
done
COMMON="--target default --max-new-tokens 96 --num-draft-tokens 5 --threads 2 --assistant ngram,default --draft-lengths default --policies-only"
declare -A RUNS=(
  [g1]="--prompts dev --num-prompts 24"
  [b4]="--prompts dev --num-prompts 64 --batch-size 4"
  [b8]="--prompts dev --num-prompts 96 --batch-size 8"
  [t07]="--prompts dev --num-prompts 16 --do-sample --temperature 0.7"
  [t10]="--prompts dev --num-prompts 16 --do-sample --temperature 1.0"
  [grounded]="--prompts examples/input_grounded_prompts.jsonl --num-prompts 16"
)
for name in ${@:-g1 b4 b8 t07 t10 grounded}; do
  hf-specdec bench $COMMON ${RUNS[$name]} --json "$R/floor_$name.json" | tee "$R/floor_$name.txt"
done
