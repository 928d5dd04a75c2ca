#!/usr/bin/env bash
# The kinds table of BENCHMARKS.md ("What training buys"): token-only, EAGLE-1-style and Medusa
# drafters trained with the EAGLE-3 curve's recipe (batches of 8, lr 1e-3) on the same 250k-token subset of the same
# prepared set, for 100 steps (the EAGLE-3 row's steps) and, for the cheaper kinds, for about the EAGLE-3 row's
# training time (token-only: 300 steps; Medusa: 900), then measured like the curve (first 30 dev prompts, greedy,
# k = 5, 128 new tokens). The EAGLE-3 row is the curve's eagle3-fkl-250000 (benchmarks/eagle3_curve.sh). ROWS adds
# assistants to the same measurement, e.g. ROWS="ngram+medusa:chain". Last, the teacher's quantization: the same texts
# scored by the deployed 4-bit (bitsandbytes) target, the 100-step token-only recipe trained on them, and both
# teachers' token-only drafters measured against the 4-bit target, beside n-gram lookup.
#   bash benchmarks/kinds_table.sh
# Every run resumes from its last checkpoint; a finished one is not retrained.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/hf_specdec/runs}
TOKENS=${TOKENS:-250000}
DATA="--target default --teacher-data score --num-generate 0 --num-score 1024 --heldout-prompts 16 \
  --max-seq-len 512 --data-cache-dir $HOME/.cache/hf_specdec/distill-data --threads 2 --max-train-tokens $TOKENS"
RECIPE="--batch-size 8 --learning-rate 1e-3 --warmup-steps 10 --eval-prompts 8 --eval-max-new-tokens 64 \
  --save-every 25 --log-every 5"
declare -A KIND=([token-only]="--drafter new" [eagle1]="--drafter eagle" [medusa]="--drafter medusa --num-heads 5")
drafters=()
for spec in ${SPECS:-token-only:100 eagle1:100 medusa:100 token-only:300 medusa:900}; do
  name=${spec%:*} steps=${spec#*:}
  out="$RUNS/kinds-$name-$TOKENS"
  if [ "$steps" != 100 ]; then out+="-${steps}steps"; fi
  if [ ! -f "$out/training_summary.json" ]; then
    python training/distill.py $DATA $RECIPE ${KIND[$name]} --max-steps "$steps" --eval-every "$steps" \
      --output-dir "$out" --resume
  fi
  # Medusa's five heads drafting their top-1 chain: five tokens per forward, like the others at k = 5
  if [ "$name" = medusa ]; then drafters+=("$out:chain"); else drafters+=("$out"); fi
done
python benchmarks/acceptance.py --drafters "${drafters[@]}" ${ROWS:-} --prompts dev \
  --num-prompts 30 --max-new-tokens 128 --num-draft-tokens 5 --threads 2 --json benchmarks/results/kinds_table.json
out="$RUNS/kinds-token-only-4bit-teacher-$TOKENS"
if [ ! -f "$out/training_summary.json" ]; then
  python training/distill.py $DATA $RECIPE ${KIND[token-only]} --max-steps 100 --eval-every 100 --target-quantization 4bit \
    --output-dir "$out" --resume
fi
python benchmarks/acceptance.py --target-quantization 4bit --drafters ngram "$RUNS/kinds-token-only-$TOKENS" "$out" \
  --prompts dev --num-prompts 30 --max-new-tokens 128 --num-draft-tokens 5 --threads 2 \
  --json benchmarks/results/teacher_quantization.json
