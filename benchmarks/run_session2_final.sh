#!/bin/bash
# Dev-prompt benchmarks, run on a quiet machine one after the other (session 2, second block).
set -x
P=../shared/data/dev_prompts.jsonl
R=benchmarks/results
mkdir -p $R
hf-specdec bench --target default --assistant distilled --prompts $P --num-prompts 32 --max-new-tokens 128 \
    --num-draft-tokens 3 --json $R/dev_distilled_b1.json
hf-specdec bench --target default --assistant ngram+distilled --prompts $P --num-prompts 30 --max-new-tokens 128 \
    --num-draft-tokens 8 --adaptive --json $R/dev_ngram+distilled.json --plot $R/dev_ngram+distilled.png
hf-specdec bench --target default --assistant medusa --prompts $P --num-prompts 30 --max-new-tokens 128 \
    --num-draft-tokens 3 --json $R/dev_medusa_tree.json --plot $R/dev_medusa_tree.png
hf-specdec bench --target default --assistant medusa:chain --prompts $P --num-prompts 30 --max-new-tokens 128 \
    --num-draft-tokens 3 --adaptive --json $R/dev_medusa_chain.json --plot $R/dev_medusa_chain.png
