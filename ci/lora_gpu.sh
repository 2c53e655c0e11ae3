#!/usr/bin/env bash
# LoRA evidence on a GPU machine (issue: LoRA with adapter-only sync), each figure beside its
# full fine-tuning counterpart, run by the same command:
#
#   ci/lora_gpu.sh memory OUT [SIZES] [KEY=VALUE ...]
#       fully_async on random-init Qwen2.5 shapes (recipe/tools/bench/models.py; SIZES default
#       0.5B,7B), LoRA (actor.lora.rank=LORA_RANK, default 32) and full fine-tuning each
#       (VARIANTS, default "lora full": one of them fits a call of its own), STEPS steps
#       (default 4), rewarded for any decoded text (recipe/tools/bench/rewards.py: a random
#       model's groups vary on it, so updates and the adapter move): the run's summary
#       (samples/s, push bytes, start-up) in
#       OUT/<size>-<lora|full>/run/ (summary.json and metrics.jsonl copied up beside its
#       run.log), and the peak GPU memory of the trainer and the engine
#       (python -m recipe.tools.study.gpu_memory) in its gpu_memory.csv; a run that fails (a
#       full fine-tuning that does not fit beside its engine) keeps its log and the memory each
#       side held up to the failure
#   ci/lora_gpu.sh gsm8k [MODES]
#       Qwen2.5-Coder-0.5B-Instruct (MODEL: another catalog model, e.g.
#       qwen2.5-coder-1.5b-instruct) on GSM8K (ci/real_models_gpu.sh gsm8k), LoRA and full
#       fine-tuning (VARIANTS, default "lora full") at equal samples, SEEDS (default 0,1) in
#       MODES (default sync,fully_async); LoRA at LORA_LR (default 1e-4), 33 times full
#       fine-tuning's LR (default 3e-6): at alpha 16, rank 32 (the update scaled by 0.5) the
#       adapter at 3e-5 reached 0.046 where full fine-tuning reached 0.304, at 1e-4 0.294
#       (one H200, 2026-12-06, docs/notes/lora.md); records under docs/study/real/gsm8k_lora
#       and gsm8k_full (MODEL's name appended for another model), then both compared per
#       mode (python -m recipe.tools.study.variants)
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
  local size variant dir model status=0
  for size in ${sizes//,/ }; do
    model=$("$PYTHON" -c "from recipe.tools.bench.models import random_model_path as p; print(p('$size'))")
    for variant in ${VARIANTS:-lora full}; do
      dir=$out/$size-$variant
      mkdir -p "$dir"
      local lora=()
      [ "$variant" = lora ] && lora=(actor.lora.rank="$RANK")
      # fully_async alone (the bench's e2e always runs sync beside it); one GPU shared by the
      # trainer and the engine, which takes 0.35 of it; activations bounded for a 7B model.
      # A reward a random model's groups vary on, so the adapter moves (its pushes and
      # probes as a learning run's; recipe/tools/bench/rewards.py).
      "$PYTHON" -m recipe.tools.study.gpu_memory "$dir/gpu_memory.csv" -- \
        timeout "${RUN_TIMEOUT_S:-900}" "$PYTHON" -m recipe mode=fully_async \
        model.path="$model" trainer.device=cuda model.dtype=bfloat16 \
        rollout.response_length=384 rollout.max_num_seqs=512 rollout.gpu_memory_utilization=0.35 \
        actor.gradient_checkpointing=true actor.ppo_max_token_len_per_gpu=8192 \
        actor.log_prob_max_token_len_per_gpu=8192 actor.ppo_mini_batch_size=16 \
        trainer.total_training_steps="${STEPS:-4}" trainer.test_freq=0 \
        trainer.val_before_train=false data.num_val_prompts=32 logger.quiet=true \
        async_training.trigger_parameter_sync_step=2 async_training.require_batches=1 \
        reward.custom_fn=recipe.tools.bench.rewards:decodes_to_text \
        hydra.run.dir="$dir/run" "${lora[@]}" "$@" > "$dir/run.log" 2>&1 || status=1
      # The records beside the log too: a machine that hands back only shallow files keeps them.
      cp -f "$dir"/run/summary.json "$dir"/run/metrics.jsonl "$dir"/ 2>/dev/null || true
      echo "$size $variant: $(tail -1 "$dir/run.log")"  # the peaks, as gpu_memory prints them
      grep -E "^error:|OutOfMemoryError: CUDA" "$dir/run.log" | head -1 || true
    done
  done
  return $status
}

case ${1:-} in
  memory) shift; memory "$@" ;;
  gsm8k)
    modes=${2:-sync,fully_async}
    suffix=""
    [ -n "${MODEL:-}" ] && suffix="_${MODEL}"
    for variant in ${VARIANTS:-lora full}; do
      if [ "$variant" = lora ]; then
        SEEDS=${SEEDS:-0,1} LR=${LORA_LR:-1e-4} STUDY_NAME=gsm8k_lora$suffix \
          ci/real_models_gpu.sh gsm8k "$modes" actor.lora.rank="$RANK"
      else
        SEEDS=${SEEDS:-0,1} STUDY_NAME=gsm8k_full$suffix ci/real_models_gpu.sh gsm8k "$modes"
      fi
    done
    records=${RECORDS:-docs/study/real}
    if [ -f "$records/gsm8k_full$suffix/results.json" ] && [ -f "$records/gsm8k_lora$suffix/results.json" ]; then
      "$PYTHON" -m recipe.tools.study.variants "$records/gsm8k_full$suffix" \
        "$records/gsm8k_lora$suffix" out="$records/gsm8k_lora$suffix/against_full.json" || true
    fi ;;
  *)
    echo "usage: $0 memory OUT [SIZES] [KEY=VALUE ...] | gsm8k [MODES]" >&2
    exit 2 ;;
esac
