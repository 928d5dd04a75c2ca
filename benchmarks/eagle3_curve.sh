#!/usr/bin/env bash
# The EAGLE-3 data curve and the comparison rows of BENCHMARKS.md ("What training buys"): teacher
# data prepared once (ShareGPT answers scored teacher-forced by the fp32 SmolLM2, top-32 log-probs, and in the same
# forward the states entering layers 2, 15 and 27), then one recipe on nested subsets of N target tokens (--max-train-tokens), and each drafter
# measured on the first 30 dev prompts at k = 5 (tokens per target forward: timing-free).
#   NUM_SCORE=1024 SIZES="62500 125000 250000" bash benchmarks/eagle3_curve.sh     # this machine, one sitting
#   TEACHER=bfloat16 NUM_SCORE=8192 SIZES="2000000" TAG=fkl-bf16 bash benchmarks/eagle3_curve.sh   # the 2M point
#                                   (a bf16 copy of the target scores: twice the rate, benchmarks/teacher_dtype.py)
# Every step resumes: the preparation from its last part, a training run from its last checkpoint (--resume).
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_SCORE=${NUM_SCORE:-1024}
SIZES=${SIZES:-62500 125000 250000}
RUNS=${RUNS:-$HOME/.cache/hf_specdec/runs}
EXTRA=${EXTRA:-}   # e.g. "--loss ce" for a comparison row (then set TAG)
TAG=${TAG:-fkl}
DATA="--target default --teacher-data score --num-generate 0 --num-score $NUM_SCORE --heldout-prompts 16 \
  --max-seq-len 512 --data-cache-dir $HOME/.cache/hf_specdec/distill-data --threads 2 ${TEACHER:+--teacher-dtype $TEACHER}"
RECIPE="--drafter eagle3 --ttt-steps 3 --batch-size 8 --max-steps ${STEPS:-100} --learning-rate 1e-3 --warmup-steps 10 \
  --eval-every ${STEPS:-100} --eval-prompts 8 --eval-max-new-tokens 64 --save-every 25 --log-every 5"
mkdir -p "$RUNS"
python training/distill.py $DATA --drafter eagle3 --prepare-only --output-dir "$RUNS/prep-eagle3-$NUM_SCORE${TEACHER:+-$TEACHER}" --resume
drafters=(${BASELINES:-})   # e.g. BASELINES=ngram: a model-free row measured the same way
for n in $SIZES; do
  out="$RUNS/eagle3-$TAG-$n"
  if [ ! -f "$out/training_summary.json" ]; then
    python training/distill.py $DATA $RECIPE $EXTRA --max-train-tokens "$n" --output-dir "$out" --resume
  fi
  drafters+=("$out")
done
python benchmarks/acceptance.py --drafters "${drafters[@]}" --prompts dev --num-prompts 30 \
  --max-new-tokens 128 --num-draft-tokens 5 --threads 2 --json "benchmarks/results/eagle3_curve_$TAG.json"
