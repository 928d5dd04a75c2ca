#!/bin/bash
# Issue 4's comparison rows: the shipped recipe (2-layer token-only drafter, 8,192-token output vocabulary, 400 steps)
# trained (a) against the full-precision target instead of the 4-bit one, and (b) with plain next-token cross-entropy
# on the dataset's own answers to the same prompts; then all of them measured against the 4-bit target on the dev
# prompts at k = 5 (tokens per target forward do not depend on timing, so this may run beside other work).
set -ex
COMMON="--target default --heldout-prompts 16 --max-new-tokens 128 --gen-batch-size 64 --drafter-layers 2 \
  --draft-vocab-size 8192 --max-steps 400 --batch-size 16 --eval-every 200 --save-every 200 --eval-max-new-tokens 64 \
  --learning-rate 1e-3 --warmup-steps 30 --threads 2 --log-every 10"
# (a) distilled against the fp32 target, on the fp32 target's own answers to the same 1,024 prompts
python training/distill.py $COMMON --target-quantization none --teacher-data generate --num-generate 1024 \
  --output-dir runs/smollm2-fp32teacher-selfgen
# (b) plain next-token cross-entropy on the ShareGPT answers to the same prompts, 4-bit target for its evaluation
python training/distill.py $COMMON --target-quantization 4bit --teacher-data score --num-score 1024 --loss ce \
  --output-dir runs/smollm2-4bit-ce-text
python benchmarks/acceptance.py --target-quantization 4bit --drafters distilled runs/smollm2-fp32teacher-selfgen \
  runs/smollm2-4bit-ce-text --prompts ../shared/data/dev_prompts.jsonl --num-prompts 30 --max-new-tokens 128 \
  --num-draft-tokens 5 --threads 2 --json benchmarks/results/distill_rows_4bit.json
