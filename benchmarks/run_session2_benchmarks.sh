#!/bin/bash
# Dev-prompt benchmarks of the drafters added in session 2 (run on a quiet machine, one after the other).
set -x
P=../shared/data/dev_prompts.jsonl
R=benchmarks/results
mkdir -p $R
hf-specdec bench --target default --assistant distilled --prompts $P --num-prompts 30 --max-new-tokens 128 \
    --num-draft-tokens 3 --adaptive --json $R/dev_distilled.json --plot $R/dev_distilled.png
hf-specdec bench --target default --assistant distilled --prompts $P --num-prompts 32 --max-new-tokens 128 \
    --num-draft-tokens 3 --batch-size 4 --json $R/dev_distilled_b4.json
hf-specdec bench --target default --assistant distilled --prompts $P --num-prompts 32 --max-new-tokens 128 \
    --num-draft-tokens 3 --batch-size 8 --json $R/dev_distilled_b8.json
hf-specdec bench --target default --assistant self --prompts $P --num-prompts 30 --max-new-tokens 128 \
    --num-draft-tokens 4 --adaptive --json $R/dev_self.json --plot $R/dev_self.png
