#!/usr/bin/env bash
# Nightly CPU convergence: the `nightly` tests (50-100 step learning checks of each mode), then
# each mode trains the embedded default for a full epoch (8,000 prompts), and each built-in
# multi-turn environment for its preset's epoch (2,048 prompts), each over the number of seeds
# its entry in ci/thresholds.json asks for, and the mean must beat the thresholds there
# (`ci/check_run.py`: how they were derived from measured runs). Schedule it with cron or a CI
# scheduler on a CPU runner, e.g. `0 3 * * * cd /path/to/repo && ci/nightly_cpu.sh`.
# The real-data checks read GSM8K and MATH from ../shared/data beside the checkout, or from
# RECIPE_SHARED_DATA (a folder holding gsm8k/ and math/); without either they skip.
set -euo pipefail
cd "$(dirname "$0")/.."
make venv
out=${NIGHTLY_OUT:-outputs/nightly/$(date +%Y-%m-%d)}
status=0
# The checks left out of `make test` (minutes each): short learning runs of every mode, and
# slower variants of integration tests.
.venv/bin/python -m pytest -q -m nightly tests || status=1
seeds_of() {  # KEY -> the number of seeds its check averages
  .venv/bin/python -c 'import json, sys; print(json.load(open("ci/thresholds.json"))[sys.argv[1]].get("seeds", 1))' "$1"
}
# KEY (mode or env/mode), then the run's overrides: one run per seed, checked on their mean.
check_key() {
  local key=$1 name=${1//\//-} dirs=() seeds
  shift
  seeds=$(seeds_of "$key")
  for ((seed = 0; seed < seeds; seed++)); do
    dirs+=("$out/$name-t$seed")
    .venv/bin/python -m recipe "$@" trainer.seed=$seed rollout.seed=$seed logger.quiet=true hydra.run.dir="$out/$name-t$seed" || status=1
  done
  .venv/bin/python ci/check_run.py check "$key" "${dirs[@]}" || status=1
}
for mode in sync one_step_off fully_async; do
  check_key "$mode" mode=$mode
done
# The built-in multi-turn environments (configs/env/), a default-length run in every mode.
for env in calculator retry; do
  for mode in sync one_step_off fully_async; do
    check_key "$env/$mode" env=$env mode=$mode
  done
done
exit $status
