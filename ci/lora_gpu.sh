#!/usr/bin/env bash
# LoRA evidence on a GPU machine (issue: LoRA with adapter-only sync), each figure beside its
# full fine-tuning counterpart, run by the same command:
#
#   ci/lora_gpu.sh memory OUT [SIZES] [KEY=VALUE ...]
#       fully_async on random-init Qwen2.5 shapes (recipe/tools/bench/models.py; SIZES default
#       0.5B,7B), LoRA (actor.lora.rank=LORA_RANK, default 32) and full fine-tuning each:
#       samples/s, push bytes and pause (medians), and the peak GPU memory of the trainer and
#       the engine (python -m recipe.tools.study.gpu_memory), into OUT/<size>-<lora|full>/; a run
#       that fails (a full fine-tuning that does not fit beside its engine) keeps its log and
#       the memory each side held up to the failure
#   ci/lora_gpu.sh gsm8k [MODES]
#       Qwen2.5-Coder-0.5B-Instruct on GSM8K (ci/real_models_gpu.sh gsm8k), LoRA and full
#       fine-tuning at equal samples, SEEDS (default 0,1) in MODES (default sync,fully_async);
#       records under docs/study/real/gsm8k_lora and gsm8k_full
#
# Needs the GPU stack (vllm, ray) importable first: on an offline machine, source the GPU kit's
# env; for gsm8k, `ci/real_models_gpu.sh setup WHEELS` first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RANK=${LORA_RANK:-32}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0
# vLLM's own start-up lines (load, compile, graph capture) are INFO: the summary's
# startup/engine_* figures need them.
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}

memory() {  # memory OUT [SIZES] [KEY=VALUE ...]
  local out=${1:?memory OUT [SIZES]} sizes=${2:-0.5B,7B}
  shift $(( $# >= 2 ? 2 : 1 ))
  local size variant dir status=0
  for size in ${sizes//,/ }; do
    for variant in lora full; do
      dir=$out/$size-$variant
      mkdir -p "$dir"
      local lora=()
      [ "$variant" = lora ] && lora=(actor.lora.rank="$RANK")
      "$PYTHON" -m recipe.tools.study.gpu_memory "$dir/gpu_memory.csv" -- \
        timeout "${RUN_TIMEOUT_S:-900}" "$PYTHON" -m recipe.tools.bench.e2e model="$size" \
        modes=fully_async steps="${STEPS:-8}" trainer.device=cuda model.dtype=bfloat16 \
        rollout.response_length=384 rollout.max_num_seqs=512 json="$dir/result.json" \
        "${lora[@]}" "$@" > "$dir/bench.log" 2>&1 || status=1
      echo "$size $variant: $(tail -1 "$dir/bench.log")"
      grep -E "^error:" "$dir/bench.log" | head -1 || true
    done
  done
  return $status
}

case ${1:-} in
  memory) shift; memory "$@" ;;
  gsm8k)
    modes=${2:-sync,fully_async}
    SEEDS=${SEEDS:-0,1} STUDY_NAME=gsm8k_lora ci/real_models_gpu.sh gsm8k "$modes" \
      actor.lora.rank="$RANK"
    SEEDS=${SEEDS:-0,1} STUDY_NAME=gsm8k_full ci/real_models_gpu.sh gsm8k "$modes" ;;
  *)
    echo "usage: $0 memory OUT [SIZES] [KEY=VALUE ...] | gsm8k [MODES]" >&2
    exit 2 ;;
esac
