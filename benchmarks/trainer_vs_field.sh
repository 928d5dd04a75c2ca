#!/usr/bin/env bash
# Our trainer against the field's: one EAGLE-3 drafter trained by `training/distill.py` and one by speculators' own
# trainer (vllm-project/speculators 0.9, in the peers' environment), from the same initial weights (speculators'
# `--dry-run`), on the same data (the default target's own answers to NUM_GENERATE prompts and the states entering its
# layers 2, 15 and 27, prepared once by distill.py and written in speculators' offline layout), for the same steps,
# target tokens per step and cosine learning-rate schedule; at each budget of answer tokens (nested subsets), then both
# measured through hf_specdec's loop on the first NUM_PROMPTS dev prompts.
#   bash benchmarks/trainer_vs_field.sh                      # BUDGETS="20000 100000" EPOCHS=2
# Each trainer keeps its own recipe otherwise (loss, training-time-test weighting, optimizer, what it freezes): that is
# what is compared. Every stage is skipped when its output exists: run it again to continue.
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_GENERATE=${NUM_GENERATE:-1024}
BUDGETS=${BUDGETS:-20000 100000}
EPOCHS=${EPOCHS:-2}               # passes over each budget's answers
STEP_TOKENS=${STEP_TOKENS:-2048}  # tokens per step: speculators packs them in one row; distill.py takes the batch of
                                  # sequences that holds as many on average
NUM_PROMPTS=${NUM_PROMPTS:-20}
NEW_TOKENS=${NEW_TOKENS:-96}
WORK=${WORK:-$HOME/.cache/hf_specdec/trainer-vs-field}
PEERS=${PEERS:-$HOME/.cache/hf_specdec/peers-venv}
SPEC_EXTRA=${SPEC_EXTRA:-}        # e.g. "--optimizer adamw" for a row with AdamW (then set TAG)
TAG=${TAG:-}
bash tests/published/peers_env.sh "$PEERS"
mkdir -p "$WORK"
verifier=$(python -c "from hf_specdec.default_model import default_target_files; print(default_target_files())")

# 1. The data, once: the target's greedy answers and the states entering layers 2, 15, 27 (distill.py's own preparation)
python training/distill.py --target default --teacher-data generate --num-generate "$NUM_GENERATE" --num-score 0 \
  --heldout-prompts 16 --max-new-tokens 128 --max-seq-len 512 --gen-batch-size 32 --drafter eagle3 \
  --data-cache-dir "$WORK/data" --threads 2 --prepare-only --output-dir "$WORK/prepare" --resume
prepared=$(dirname "$(ls "$WORK"/data/*/meta.json | head -1)")

# 2. speculators' layout of each budget's subset (the records distill.py's --max-train-tokens picks)
largest=0
for n in $BUDGETS; do
  [ -f "$WORK/spec-data-$n/split.json" ] || python benchmarks/to_speculators_data.py --prepared "$prepared" \
    --max-train-tokens "$n" --out "$WORK/spec-data-$n"
  [ "$n" -gt "$largest" ] && largest=$n
done

# 3. The initial drafter: speculators' own (its EAGLE-3 defaults, draft vocabulary of the 8,192 answer tokens most
# frequent in the largest budget), written by its --dry-run; both trainers start from it.
d2t="$WORK/spec-data-$largest/dataset/d2t-8192.npy"
t2d="$WORK/spec-data-$largest/dataset/t2d-8192.npy"
SPEC_COMMON="--verifier-name-or-path $verifier --draft-vocab-size 8192 --hidden-states-dtype float32 \
  --loss-implementation eager --draft-attn-impl sdpa --num-workers 0 --on-missing raise --mask-token-id 0 --seed 0"
if [ ! -f "$WORK/init/config.json" ]; then
  "$PEERS/bin/python" benchmarks/speculators_train_cpu.py $SPEC_COMMON --data-path "$WORK/spec-data-$largest/dataset" \
    --hidden-states-path "$WORK/spec-data-$largest/hidden_states" --token-freq-path "$WORK/spec-data-$largest/token_freq.pt" \
    --save-path "$WORK/init" --dry-run
fi

# 4. Both trainers at each budget
drafters=()
for n in $BUDGETS; do
  read -r steps batch ratio < <(python -c "
import json, math; s = json.load(open('$WORK/spec-data-$n/split.json'))
steps = math.ceil($EPOCHS * s['train_tokens'] / $STEP_TOKENS)
print(steps, max(1, round($STEP_TOKENS * s['train_rows'] / s['train_tokens'])), s['train_ratio'])")
  warmup=$(( steps / 20 + 1 ))
  ours="$WORK/ours-$n"
  if [ ! -f "$ours/training_summary.json" ]; then
    python training/distill.py --target default --teacher-data generate \
      --num-generate "$NUM_GENERATE" --num-score 0 --heldout-prompts 16 --max-new-tokens 128 --max-seq-len 512 \
      --data-cache-dir "$WORK/data" --threads 2 --drafter "$WORK/init" --max-train-tokens "$n" --max-steps "$steps" \
      --batch-size "$batch" --learning-rate 1e-3 --warmup-steps "$warmup" --min-lr-ratio 0 --eval-every "$steps" \
      --eval-prompts 8 --save-every "$steps" --log-every 5 --output-dir "$ours" --resume 2>&1 | tee "$WORK/ours-$n.log"
  fi
  theirs="$WORK/speculators$TAG-$n"
  if ! ls "$theirs"/[0-9]*/config.json > /dev/null 2>&1; then
    "$PEERS/bin/python" benchmarks/speculators_train_cpu.py $SPEC_COMMON $SPEC_EXTRA \
      --data-path "$WORK/spec-data-$n/dataset" --hidden-states-path "$WORK/spec-data-$n/hidden_states" \
      --d2t-path "$d2t" --t2d-path "$t2d" --from-pretrained "$WORK/init" --total-seq-len "$STEP_TOKENS" \
      --train-data-ratio "$ratio" --epochs $(( EPOCHS + 1 )) --max-steps "$steps" --lr 1e-3 --scheduler-type cosine \
      --scheduler-warmup-steps "$warmup" --log-freq 5 --save-path "$theirs" --no-resume-from-checkpoint \
      2>&1 | tee "$WORK/speculators$TAG-$n.log"
  fi
  if [ ! -f "$theirs/final/config.json" ]; then  # its last checkpoint (saved in bf16), in fp32 as distill.py saves:
    # the same dtype for both in the loop (a drafter in bf16 drafts faster on CPUs with AVX512-BF16, whoever trained it)
    python -c "import sys, hf_specdec; from hf_specdec.default_model import load_target
drafter = hf_specdec.AutoDrafter.from_pretrained(sys.argv[1], target=load_target('default')[0]).float()
drafter.config.published['config']['dtype'] = 'float32'  # (a layout is written back in the dtype it was read in)
drafter.save_pretrained(sys.argv[2])" \
      "$(ls -d "$theirs"/[0-9]* | sort -V | tail -1)" "$theirs/final"
  fi
  drafters+=("$ours" "$theirs/final")
done

# 5. All of them through hf_specdec's loop, interleaved with plain generate() in one run: tokens per target forward,
# acceptance by position and wall clock at k = 5 and with adaptive length; then the table
hf-specdec bench --assistant "$(IFS=,; echo "${drafters[*]}")" --adaptive --prompts dev --num-prompts "$NUM_PROMPTS" \
  --max-new-tokens "$NEW_TOKENS" --num-draft-tokens 5 --threads 2 --json "$WORK/bench$TAG.json"
python benchmarks/trainer_vs_field_table.py --work "$WORK" --budgets $BUDGETS --tag "$TAG" \
  --json "benchmarks/results/trainer_vs_field$TAG.json"
