#!/usr/bin/env bash
# Nightly GPU job: the three benchmarks and a GPU end-to-end run, each checked against
# ci/thresholds_gpu.json by ci/check_gpu.py (summary table; exit 1 when a figure regresses).
#
#   ci/nightly_gpu.sh                 every stage, then the check
#   ci/nightly_gpu.sh STAGE [STAGE]   some stages only (smoke rollout trainer weight_sync
#                                     engine_push e2e run peers check)
#
# Needs a GPU machine with the `gpu` extra installed (vllm, ray); PYTHON picks the interpreter
# (default .venv/bin/python after `make venv EXTRA=gpu`). Results go to $NIGHTLY_OUT (default
# outputs/nightly_gpu/DATE). Schedule it like the CPU job, on a GPU runner, e.g.
# `30 2 * * * cd /path/to/repo && ci/nightly_gpu.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
out=${NIGHTLY_OUT:-outputs/nightly_gpu/$(date +%Y-%m-%d)}
mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(smoke rollout trainer weight_sync engine_push e2e run peers check)
ngpu=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
backends=cuda_ipc
[ "$ngpu" -ge 2 ] && backends=cuda_ipc,nccl
# Every mode gets the same GPUs: sync colocated on all, the async modes split (bench e2e gpus=N).
layout=""
[ "$ngpu" -ge 2 ] && layout="gpus=$ngpu"

for stage in "${stages[@]}"; do
  echo "== $stage ($(date +%H:%M:%S))"
  case $stage in
    smoke)
      "$PYTHON" -m pytest -q -m gpu tests 2>&1 | tee "$out/smoke.log" ;;
    rollout)
      "$PYTHON" -m recipe.tools.bench.rollout --device cuda --model 0.5B --prompts 64 --n 16 \
        --max-tokens 256 --max-num-seqs 512 --json "$out/rollout.json" 2>&1 \
        | tee "$out/rollout.log" ;;
    trainer)
      "$PYTHON" -m recipe.tools.bench.trainer --device cuda --model 0.5B --json "$out/trainer.json" \
        2>&1 | tee "$out/trainer.log" ;;
    weight_sync)
      "$PYTHON" -m recipe.tools.bench.weight_sync --device cuda --sizes 0.5B,1.5B,7B \
        --backends "$backends" --repeats 3 --json "$out/weight_sync.json" 2>&1 \
        | tee "$out/weight_sync.log" ;;
    engine_push)
      "$PYTHON" -m recipe.tools.bench.engine_push --model 0.5B --json "$out/engine_push.json" 2>&1 \
        | tee "$out/engine_push.log" ;;
    e2e)
      "$PYTHON" -m recipe.tools.bench.e2e model=0.5B workload=longtail steps=${E2E_STEPS:-16} $layout \
        trainer.device=cuda model.dtype=bfloat16 rollout.response_length=384 \
        rollout.max_num_seqs=512 json="$out/e2e.json" 2>&1 | tee "$out/e2e.log" ;;
    run)
      "$PYTHON" -m recipe trainer.device=cuda model.dtype=bfloat16 \
        trainer.total_training_steps=${RUN_STEPS:-80} trainer.test_freq=10 logger.quiet=true \
        hydra.run.dir="$out/run" 2>&1 | tee "$out/run.log" ;;
    peers)
      # verl's GRPO beside ours on the results page's terms (ci/peers_gpu.sh setup installs
      # verl's wheels first; the model from ci/real_models_gpu.sh setup or study_gpu.sh setup).
      MODEL=${PEERS_MODEL:-qwen2.5-coder-0.5b-instruct} PYTHON=$PYTHON PEERS_OUT="$out/peers" \
        ci/peers_gpu.sh run systems=verl,sync,fully_async data="${GSM8K_DATA:-../shared/data/gsm8k}" \
        steps=${PEERS_STEPS:-16} warmup_steps=2 response_length=512 lr=3e-6 val_rows=256 \
        json="$out/peers.json" 2>&1 | tee "$out/peers.log" ;;
    check)
      "$PYTHON" ci/check_gpu.py "$out" ;;
    *)
      echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
