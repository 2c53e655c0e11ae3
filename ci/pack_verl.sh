#!/usr/bin/env bash
# ci/pack_verl.sh OUT_DIR [PART_MIB]
#
# On a machine that reaches the package registry: downloads the wheels pinned in
# ci/peers/verl-kit.txt (cp312, manylinux x86_64: the GPU machine's Python), checks that each
# pinned one is there, tars them and splits the tar into parts of at most PART_MIB MiB
# (default 55), one per folder, OUT_DIR/p01, p02, ..., each with SHA256SUMS. Carry one folder
# per transfer; on the GPU machine `ci/peers_gpu.sh setup PARTS_DIR` checks and installs them.
# About 17 MiB in all (one part); the download cache is OUT_DIR/.cache.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: ci/pack_verl.sh OUT_DIR [PART_MIB]}
PART_MIB=${2:-55}
PY=${PYTHON:-python3}
LIST=ci/peers/verl-kit.txt
mkdir -p "$OUT/.cache/wheels"
OUT=$(cd "$OUT" && pwd)
CACHE=$OUT/.cache

PLAT=()
for p in manylinux_2_17_x86_64 manylinux_2_28_x86_64 manylinux2014_x86_64; do
  PLAT+=(--platform "$p")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLAT[@]}" -d "$CACHE/wheels" -r "$LIST" 2> "$CACHE/pip.err" \
  || { grep -v 'is ignored' "$CACHE/pip.err" >&2; exit 1; }

# exactly the pinned files (the cache may hold other versions)
rm -rf "$CACHE/stage" && mkdir -p "$CACHE/stage/wheels"
"$PY" - "$LIST" "$CACHE/wheels" "$CACHE/stage/wheels" <<'PYEOF'
import os, re, sys
req, src, dst = sys.argv[1:]
norm = lambda name: re.sub(r"[-_.]+", "_", name).lower()
want = {}
for line in open(req):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        want[norm(name)] = version
found = {}
for f in sorted(os.listdir(src)):
    name, version = f.split("-")[:2]
    if f.endswith(".whl") and want.get(norm(name)) == version:
        found.setdefault(norm(name), f)
if missing := sorted(set(want) - set(found)):
    sys.exit(f"pack_verl.sh: missing wheels {missing}")
for f in found.values():
    os.link(os.path.join(src, f), os.path.join(dst, f))
print(f"{len(found)} wheels")
PYEOF

(cd "$CACHE/stage" && tar cf "$CACHE/verlkit.tar" wheels)
rm -rf "$OUT"/p[0-9][0-9] "$CACHE/parts" && mkdir -p "$CACHE/parts"
split -b "${PART_MIB}M" -d -a 2 --numeric-suffixes=1 "$CACHE/verlkit.tar" "$CACHE/parts/verlkit.tar.part"
(cd "$CACHE" && sha256sum verlkit.tar > parts/SHA256SUMS)
(cd "$CACHE/parts" && sha256sum verlkit.tar.part* >> SHA256SUMS)
for f in "$CACHE"/parts/verlkit.tar.part*; do
  k=${f##*.part}
  mkdir -p "$OUT/p$k" && mv "$f" "$OUT/p$k/" && cp "$CACHE/parts/SHA256SUMS" "$OUT/p$k/"
done
du -sh "$OUT"/p[0-9][0-9]
