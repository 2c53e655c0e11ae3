"""``python -m fully_async_policy.bench [steps=N] [key=value ...]``: the three modes side by side
on the natural workload (responses end at EOS); ``recipe.bench.e2e`` with ``workload=natural``.
See that module for the keys and the printed table."""

from __future__ import annotations

import sys

from recipe.bench.e2e import main as e2e_main


def main(argv: list[str]) -> dict[str, float]:
    return e2e_main(["workload=natural", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
