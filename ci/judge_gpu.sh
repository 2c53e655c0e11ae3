#!/usr/bin/env bash
# LLM-judge evidence on a GPU machine (reward.judge), Qwen2.5-Coder-0.5B-Instruct judging GSM8K
# answers against the reference answer, beside the policy (the same model) on one GPU:
#
#   ci/judge_gpu.sh agreement DATA OUT [KEY=VALUE ...]
#       PROMPTS (default 128) held-out GSM8K test problems x 4 responses of the policy at
#       temperature 1 (python -m recipe.tools.study.lengths), then the judge scores SAMPLES
#       (default 400) of them (python -m recipe.tools.study.judge_agreement): agreement with the
#       rule in OUT/agreement/agreement.json. The rule reads the final answer in whichever form
#       the response gives it (recipe.reward.scorers:gsm8k_answer_score): the untrained model
#       boxes its answers and never writes the "####" the strict scorer needs, so against that
#       scorer every response is wrong and agreement measures nothing.
#   ci/judge_gpu.sh throughput DATA OUT [KEY=VALUE ...]
#       fully_async with the rule reward, then with the judge as the reward (pointwise), STEPS
#       (default 12) steps of 32 prompts x 8 each, REPEATS (default 1) pairs in alternating
#       order: each run in OUT/<rule|judge>-<i>/run, a line per run with samples/s over the
#       wall clock (the final validation on DATA/test.jsonl's first 64 rows included), over the
#       steps' time alone, and steady (python -m recipe.tools.study.timing, the first 2 steps
#       skipped); REWARDS=rule or REWARDS=judge runs one side only (a pair split over two
#       calls); once both sides of a pair have run, python -m recipe.tools.study.pair
#       prints them step by step
#   ci/judge_gpu.sh modes DATA OUT [KEY=VALUE ...]
#       sync (pairwise) and one_step_off (pointwise), MODE_STEPS (default 3) steps each with the
#       judge as the reward: the run works end to end on the GPU in each batch mode
#
# DATA: GSM8K rows as {train,test}.jsonl (ci/study_gpu.sh data). Needs the GPU stack (vllm, ray)
# importable and the model built (ci/study_gpu.sh setup WHEELS) first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-qwen2.5-coder-0.5b-instruct}  # MODEL, DEVICE, DTYPE: a CPU dry run
export RECIPE_CACHE_DIR=${RECIPE_CACHE_DIR:-$HOME/.cache/fully_async_rl}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}

# The policy's settings (ci/real_models_gpu.sh gsm8k's) and the judge's, shared by every command.
# One GPU holds the policy's engine (POLICY_GMU of it), the judge's (JUDGE_GMU) and the
# trainer (up to 40.4 GB at its peak here): the defaults fit an 80 GB H100 as well as an H200
# (0.3 + 0.15 ran out of memory at the trainer's peak on an H100), and the rule runs keep the
# same policy share as the judge runs.
policy() {  # policy DATA
  echo model.path=$MODEL trainer.device=${DEVICE:-cuda} model.dtype=${DTYPE:-bfloat16} \
    data.train_files="[$1/train.jsonl]" data.val_files="[$1/test.jsonl]" \
    data.max_prompt_length=512 rollout.n=8 rollout.response_length=512 \
    data.train_batch_size=32 actor.ppo_mini_batch_size=32 actor.lr=3e-6 \
    rollout.gpu_memory_utilization=${POLICY_GMU:-0.25}
}
JUDGE=(reward.judge.model=$MODEL reward.judge.gpu_memory_utilization=${JUDGE_GMU:-0.12}
  reward.judge.max_num_seqs=128 reward.judge.max_concurrency=128)

run() {  # run DIR MODE OVERRIDES...: one training run, its summary line
  local dir=$1 mode=$2
  shift 2
  mkdir -p "$dir"
  local status=0
  timeout "${RUN_TIMEOUT_S:-900}" "$PYTHON" -m recipe mode="$mode" logger.quiet=true \
    trainer.val_before_train=false trainer.test_freq=0 data.val_max_samples=64 \
    hydra.run.dir="$dir/run" "$@" > "$dir/run.log" 2>&1 || status=$?
  "$PYTHON" - "$dir" "$status" <<'EOF'
import json, sys
from pathlib import Path
from recipe.tools.study.timing import steady_samples_per_s
d, status = Path(sys.argv[1]), sys.argv[2]
summary = d / "run" / "summary.json"
if not summary.exists() or status != "0":
    tail = (d / "run.log").read_text(errors="replace").strip().splitlines()[-3:]
    print(f"{d.name}: failed (exit {status}): {' | '.join(tail)}")
    sys.exit(0)
s = json.loads(summary.read_text())
rows = [json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines() if x]
steady = steady_samples_per_s(rows)
# The steps alone: wall samples/s also holds the final validation, judged when the judge rewards.
training = s["samples/trained"] / sum(r["timing/step_s"] for r in rows)
judge = {}  # over the run's records: counts summed, latencies at their worst, shares averaged
for key, fold in (("calls", sum), ("parse_failures", sum), ("failures", sum), ("retries", sum),
                  ("latency_p50_s", max), ("latency_p99_s", max), ("trainer_wait_share", None)):
    vals = [r[f"judge/{key}"] for r in rows if f"judge/{key}" in r]
    if vals:
        judge[key] = round(fold(vals) if fold else sum(vals) / len(vals), 3)
print(f"{d.name}: {s['mode']} steps={s['steps']} wall samples/s="
      f"{s['throughput/samples_per_s']:.1f} training samples/s={training:.1f} "
      f"steady samples/s={steady:.1f} "
      f"wall_s={s['wall_s']:.0f} {json.dumps(judge)}")
EOF
  return "$status"
}

case ${1:-} in
  agreement)
    data=${2:?agreement DATA OUT} out=${3:?agreement DATA OUT}
    shift 3
    # Held-out: the test problems as the prompts the policy answers.
    read -ra pol <<< "$(policy "$data")"
    held=("${pol[@]}" data.train_files="[$data/test.jsonl]"
      reward.custom_fn=recipe.reward.scorers:gsm8k_answer_score)
    "$PYTHON" -m recipe.tools.study.lengths out="$out/lengths" prompts="${PROMPTS:-128}" \
      "${held[@]}" rollout.n=4 "$@"
    "$PYTHON" -m recipe.tools.study.judge_agreement responses="$out/lengths/responses.jsonl" \
      samples="${SAMPLES:-400}" out="$out/agreement" "${held[@]}" "${JUDGE[@]}" "$@" ;;
  throughput)
    data=${2:?throughput DATA OUT} out=${3:?throughput DATA OUT}
    shift 3
    read -ra pol <<< "$(policy "$data")"
    steps=(trainer.total_training_steps="${STEPS:-12}")
    status=0
    for i in $(seq 1 "${REPEATS:-1}"); do
      order="rule judge"
      [ $((i % 2)) -eq 0 ] && order="judge rule"
      order=${REWARDS:-$order}
      for reward in $order; do
        extra=()
        [ "$reward" = judge ] && extra=("${JUDGE[@]}" reward.judge.mode=pointwise)
        run "$out/$reward-$i" fully_async "${pol[@]}" "${steps[@]}" "${extra[@]}" "$@" \
          || status=1
      done
      # Once both sides of pair i have run (here or in an earlier call): step by step. Its
      # error line (a run too short for a steady window) leaves the runs' status alone.
      [ -f "$out/rule-$i/run/metrics.jsonl" ] && [ -f "$out/judge-$i/run/metrics.jsonl" ] \
        && { "$PYTHON" -m recipe.tools.study.pair "$out/rule-$i/run" "$out/judge-$i/run" || true; }
    done
    exit $status ;;
  modes)
    data=${2:?modes DATA OUT} out=${3:?modes DATA OUT}
    shift 3
    read -ra pol <<< "$(policy "$data")"
    status=0
    for spec in sync:pairwise one_step_off:pointwise; do
      IFS=: read -r mode judge_mode <<< "$spec"
      # A greedy retry asks the same question with the same seed: pairwise verdicts, which a
      # small judge misses more often, are sampled so that a retry can read another one.
      temp=()
      [ "$judge_mode" = pairwise ] && temp=(reward.judge.temperature=0.6)
      run "$out/$mode-$judge_mode" "$mode" "${pol[@]}" "${JUDGE[@]}" \
        reward.judge.mode="$judge_mode" "${temp[@]}" trainer.total_training_steps="${MODE_STEPS:-3}" "$@" \
        || status=1
    done
    exit $status ;;
  *)
    echo "usage: $0 agreement|throughput|modes DATA OUT [KEY=VALUE ...]" >&2
    exit 2 ;;
esac
