#!/usr/bin/env bash
# The dev-prompt benchmarks recorded in BENCHMARKS.md. Run with nothing else on the machine; about 40 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPTS=${PROMPTS:-../shared/data/dev_prompts.jsonl}
OUT=${OUT:-benchmarks/results}
N=${N:-30}
mkdir -p "$OUT"
for spec in "ngram 8 --adaptive" "layers:4 4" "self 4"; do
  set -- $spec
  name=$(echo "$1" | tr ':' '-')
  hf-specdec bench --target default --assistant "$1" --prompts "$PROMPTS" --num-prompts "$N" \
    --max-new-tokens 128 --num-draft-tokens "$2" ${3:-} --json "$OUT/dev_$name.json" --plot "$OUT/dev_$name.png" \
    | tee "$OUT/dev_$name.txt"
done
