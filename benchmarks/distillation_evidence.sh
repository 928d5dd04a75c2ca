#!/bin/bash
# The distillation comparison rows for the shipped recipe (2-layer token-only drafter, 8,192-token output vocabulary, 400
# steps of 16 sequences; the shipped `distilled` drafter is the forward-KL row, distilled against the 4-bit target):
#   (a) the same, distilled against the full-precision target (its own answers to the same 1,024 prompts);
#   (b) plain next-token cross-entropy on the dataset's own answers to the same prompts.
# Both train side by side (one thread each), then every row is measured against the 4-bit target on the dev prompts
# at k = 5 (tokens per target forward do not depend on timing).
set -x
COMMON="--target default --heldout-prompts 16 --max-new-tokens 128 --gen-batch-size 64 --num-hidden-layers 2 \
  --draft-vocab-size 8192 --max-steps 400 --batch-size 16 --eval-every 200 --save-every 100 --eval-max-new-tokens 64 \
  --learning-rate 1e-3 --warmup-steps 30 --threads 1 --log-every 10"
python training/distill.py $COMMON --target-quantization none --teacher-data generate --num-generate 1024 \
  --output-dir runs/smollm2-fp32teacher-selfgen > runs/smollm2-fp32teacher-selfgen.log 2>&1 &
python training/distill.py $COMMON --target-quantization 4bit --teacher-data score --num-score 1024 --loss ce \
  --output-dir runs/smollm2-4bit-ce-text > runs/smollm2-4bit-ce-text.log 2>&1 &
wait
python benchmarks/acceptance.py --target-quantization 4bit --drafters runs/smollm2-fp32teacher-selfgen \
  runs/smollm2-4bit-ce-text distilled --prompts dev --num-prompts 30 --max-new-tokens 128 \
  --num-draft-tokens 5 --threads 2 --json benchmarks/results/distill_rows_4bit.json
