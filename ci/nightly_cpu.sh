#!/usr/bin/env bash
# Nightly CPU convergence: the `nightly` tests (50-100 step learning checks of each mode), then
# each mode trains the embedded default for a full epoch (8,000 prompts), and each built-in
# multi-turn environment for its preset's epoch (2,048 prompts), and must beat the
# thresholds in ci/thresholds.json. Schedule it with cron or a CI
# scheduler on a CPU runner, e.g. `0 3 * * * cd /path/to/repo && ci/nightly_cpu.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
make venv
out=${NIGHTLY_OUT:-outputs/nightly/$(date +%Y-%m-%d)}
status=0
# The checks left out of `make test` (minutes each): short learning runs of every mode, and
# slower variants of integration tests.
.venv/bin/python -m pytest -q -m nightly tests || status=1
for mode in sync one_step_off fully_async; do
  .venv/bin/python -m recipe mode=$mode logger.quiet=true hydra.run.dir="$out/$mode"
  .venv/bin/python ci/check_run.py "$out/$mode" "$mode" || status=1
done
# The built-in multi-turn environments (configs/env/), a default-length run in every mode.
for env in calculator retry; do
  for mode in sync one_step_off fully_async; do
    .venv/bin/python -m recipe env=$env mode=$mode logger.quiet=true hydra.run.dir="$out/$env-$mode"
    .venv/bin/python ci/check_run.py "$out/$env-$mode" "$env/$mode" || status=1
  done
done
exit $status
