"""Score responses to reasoning-gym tasks with reasoning-gym's own scorers.

reasoning-gym (Apache-2.0, ``pip install 'fully-async-rl[reasoning]'``) generates ~100
procedural tasks, and each task's dataset class scores an answer against the generated entry
(``score_answer(answer, entry)``, partial credit for some tasks). A record of the
``reasoning_gym`` data source (made by ``recipe.data.reasoning_gym``) carries in ``extra_info``
what that needs::

    {"dataset": "chain_sum",                 # reasoning-gym's name of the task
     "config": {..., "seed": s, "size": n},  # the create_dataset arguments of its set
     "index": i,                             # the entry's index in that set
     "entry": {"question", "answer", "metadata"}}   # the entry as reasoning-gym made it

Scoring is reasoning-gym's own evaluation: the answer is the text of the response's last
``<answer>...</answer>`` (``reasoning_gym.utils.extract_answer``); a response without one
scores 0 (the task is not asked); otherwise the task, built once per process from ``config``,
scores the answer on the entry. One data source serves every task: the registry maps exact
names, and this way it needs neither a list of reasoning-gym's tasks nor the package unless
such a record is scored.
"""

from __future__ import annotations

import functools
import json
from types import ModuleType
from typing import Any

DATA_SOURCE = "reasoning_gym"
INSTALL_HINT = "reasoning-gym is not installed: pip install 'fully-async-rl[reasoning]'"
EXTRA_INFO_KEYS = ("dataset", "config", "index", "entry")


def import_reasoning_gym() -> ModuleType:
    """The ``reasoning_gym`` package; ``ImportError`` saying how to install it if absent."""
    try:
        import reasoning_gym
    except ModuleNotFoundError as err:
        if err.name != "reasoning_gym":
            raise  # installed, but one of its own imports is broken: that error says which
        raise ImportError(INSTALL_HINT) from None
    return reasoning_gym


def extract_answer(solution_str: str) -> str | None:
    """The text of the last ``<answer>...</answer>`` of a response, as reasoning-gym reads it."""
    from reasoning_gym.utils import extract_answer as rg_extract_answer

    return rg_extract_answer(solution_str)


def reasoning_gym_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """reasoning-gym's score of the response's answer on the record's entry (0 without an
    ``<answer>`` tag). ``ValueError`` when ``extra_info`` lacks what a task needs."""
    missing = [key for key in EXTRA_INFO_KEYS if key not in (extra_info or {})]
    if missing:
        raise ValueError(
            f"a {DATA_SOURCE} record needs extra_info keys {', '.join(EXTRA_INFO_KEYS)} "
            f"(missing: {', '.join(missing)}); data.source=reasoning_gym makes such records"
        )
    assert extra_info is not None
    import_reasoning_gym()
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    # The cache key is the config's JSON text: dicts do not hash, and equal configs share a task.
    task = _task(extra_info["dataset"], json.dumps(extra_info["config"], sort_keys=True))
    return float(task.score_answer(answer, extra_info["entry"]))


@functools.lru_cache(maxsize=16)
def _task(name: str, config_json: str) -> Any:
    # Built once per process and config: some tasks load data or precompute in __init__ (s).
    from reasoning_gym import create_dataset

    return create_dataset(name, **json.loads(config_json))
