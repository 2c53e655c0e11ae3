"""reasoning-gym prompts are the same in every process: some tasks draw from the order of a set
of strings, which follows Python's per-process hash seed, so the prompt sets are generated under
a pinned one (``recipe.data.reasoning_gym_entries``). Skipped where reasoning-gym is missing."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip(
    "reasoning_gym", reason="reasoning-gym not installed: pip install 'fully-async-rl[reasoning]'"
)

from reasoning_gym import create_dataset

from recipe.data import reasoning_gym_entries
from recipe.data.loaders import DataError
from recipe.data.reasoning_gym_entries import EntryJob, generate_entries, task_entries

REPO = Path(__file__).resolve().parents[2]
# Tasks whose entries followed the hash seed with reasoning-gym 0.1.19 (a scan of every task
# under three seeds), and set sizes at which two seeds gave different prompts.
HASH_DEPENDENT_TASKS = {
    "isomorphic_strings": 4,
    "knight_swap": 2,  # ~0.5 s an entry
    "list_functions": 4,
    "polynomial_multiplication": 4,
    "ransom_note": 4,
    "word_ladder": 4,
}
_PRINT_PROMPTS = """
import json, sys
from recipe.data.reasoning_gym import ReasoningGymConfig, make_reasoning_gym_records

for name, num in json.loads(sys.argv[1]).items():
    records = make_reasoning_gym_records(ReasoningGymConfig(dataset=name), split="train", num=num)
    print(json.dumps([name, [[r.uid, r.prompt, r.ground_truth] for r in records]]))
"""


def _start_printing_prompts(hash_seed: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_PRINT_PROMPTS), json.dumps(HASH_DEPENDENT_TASKS)],
        cwd=REPO,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        stdout=subprocess.PIPE,
        text=True,
    )


def test_prompts_are_the_same_in_processes_of_different_hash_seeds() -> None:
    procs = [_start_printing_prompts(seed) for seed in ("1", "2")]  # side by side
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    first, second = (dict(json.loads(line) for line in out.splitlines()) for out in outputs)
    assert set(first) == set(HASH_DEPENDENT_TASKS)
    differ = [name for name in HASH_DEPENDENT_TASKS if first[name] != second[name]]
    assert not differ, f"prompts differ between PYTHONHASHSEED=1 and =2 for {differ}"


def test_entries_come_back_from_the_child_as_the_task_made_them() -> None:
    # arc_agi's grids are tuples, which its scorer needs as tuples (a JSON trip makes lists).
    job = EntryJob("arc_agi", {"seed": 3, "size": 2}, "train")
    (entries,) = generate_entries([job])
    task = create_dataset("arc_agi", seed=3, size=2)
    assert entries == [task[0], task[1]]
    assert isinstance(entries[0]["metadata"]["input"], tuple)


def test_a_task_that_fails_in_the_child_is_an_error_naming_the_task_and_set() -> None:
    bad = EntryJob("chain_sum", {"min_terms": 5, "max_terms": 2, "seed": 1, "size": 2}, "val")
    with pytest.raises(DataError, match=r"^reasoning-gym task 'chain_sum' \(val set\): Assert"):
        generate_entries([EntryJob("chain_sum", {"seed": 1, "size": 2}, "train"), bad])


def test_a_child_silent_past_the_deadline_is_stopped_and_named(monkeypatch) -> None:
    monkeypatch.setattr(reasoning_gym_entries, "FRAME_TIMEOUT_S", 0.05)  # its start takes ~1 s
    with pytest.raises(DataError, match=r"nothing within 0.05 s \(stuck at entry 0 of the tr"):
        generate_entries([EntryJob("chain_sum", {"seed": 1, "size": 2}, "train")])


def test_an_entry_does_not_depend_on_the_entries_made_before_it(monkeypatch) -> None:
    # list_functions draws from the unseeded global random: each entry reseeds it.
    job = EntryJob("list_functions", {"seed": 5, "size": 6}, "train")
    assert list(task_entries(job)) == list(task_entries(job))
    monkeypatch.setattr(reasoning_gym_entries, "hash_seed_is_pinned", lambda: True)
    random.seed(11)
    before = random.getstate()
    generate_entries([job])  # in this process: its global random is put back
    assert random.getstate() == before


def test_a_child_that_ends_without_its_entries_is_an_error_naming_the_set(monkeypatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits at once, writes nothing
    with pytest.raises(DataError, match=r"the generator process ended at entry 0 of the val set"):
        generate_entries([EntryJob("chain_sum", {"seed": 1, "size": 2}, "val")])
