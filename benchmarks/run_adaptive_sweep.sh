#!/bin/bash
# Issue 7: adaptive draft length against each constant length, per drafter, on the dev prompts (30 prompts, 128 new
# tokens, greedy). Each command interleaves plain, each constant k and adaptive (capped at the largest k) prompt by
# prompt. Run on a quiet machine.
set -x
P=../shared/data/dev_prompts.jsonl
R=benchmarks/results
mkdir -p $R
for spec in "distilled 1,2,3" "ngram 2,4,8" "medusa:chain 1,2,3" "self 1,2"; do
    set -- $spec
    hf-specdec bench --target default --assistant $1 --prompts $P --num-prompts 30 --max-new-tokens 128 \
        --num-draft-tokens $2 --adaptive --json "$R/sweep_${1//:/-}.json"
done
