#!/usr/bin/env bash
# verl's GRPO and ours side by side on a GPU machine (python -m recipe.tools.bench.peers).
#
#   ci/peers_gpu.sh setup PARTS_DIR     reassemble and check the parts of ci/pack_verl.sh found
#                                       under PARTS_DIR, install them into VERL_SITE
#                                       (default /tmp/verlsite) with --no-deps
#   ci/peers_gpu.sh run [KEY=VALUE ...] the benchmark (model=, systems=, steps=, ... as
#                                       `python -m recipe.tools.bench.peers` takes them)
#
# Needs our GPU stack (vllm, ray, hydra) importable first: on an offline machine, source the
# GPU kit's env (../shared/gpu/README.md). Defaults: SmolLM2-135M-Instruct (catalog model,
# built by ci/real_models_gpu.sh setup), GSM8K from ../shared/data/gsm8k, PEERS_OUT=outputs/bench/peers.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VERL_SITE=${VERL_SITE:-/tmp/verlsite}
export RECIPE_CACHE_DIR=${RECIPE_CACHE_DIR:-$HOME/.cache/fully_async_rl}

case ${1:-} in
  setup)
    parts=${2:?setup PARTS_DIR}
    work=$(mktemp -d)
    find "$parts" -name 'verlkit.tar.part*' -exec cp -f {} "$work/" \;
    cp -f "$(find "$parts" -name SHA256SUMS | head -1)" "$work/"
    (cd "$work" && cat verlkit.tar.part* > verlkit.tar && sha256sum -c --ignore-missing SHA256SUMS)
    tar xf "$work/verlkit.tar" -C "$work"
    "$PYTHON" -m pip install -q --no-index --no-deps --target "$VERL_SITE" "$work"/wheels/*.whl
    rm -rf "$work"
    PYTHONPATH=$VERL_SITE:${PYTHONPATH:-} "$PYTHON" -c \
      'import verl, transformers, tensordict; print("verl", verl.__version__, "transformers", transformers.__version__)' ;;
  run)
    shift
    "$PYTHON" -m recipe.tools.bench.peers model="${MODEL:-smollm2-135m-instruct}" \
      verl_site="$VERL_SITE" out="${PEERS_OUT:-outputs/bench/peers}" "$@" ;;
  *)
    echo "usage: $0 setup PARTS_DIR | run [KEY=VALUE ...]" >&2
    exit 2 ;;
esac
