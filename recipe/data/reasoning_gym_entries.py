"""reasoning-gym entries generated under a pinned hash seed: the same in every process.

Some reasoning-gym tasks draw from the iteration order of a set of strings (``isomorphic_strings``
and ``ransom_note`` pick ``rng.choice(list(letters - used))``; ``word_ladder``, ``knight_swap``
and ``polynomial_multiplication`` differ the same way), and that order follows the hash seed
Python draws per process (``PYTHONHASHSEED``). Entry i of a seed would then be another question
in another process, and its uid another prompt: after a resume the prompt ledger and the resumed
groups would name prompts the run never saw, and the fully async rollouter (which builds its own
sets) would disagree with its trainer. Rather than patch the tasks one by one (and again for each
reasoning-gym release), every entry is generated where string hashing is fixed:

    sys.flags.hash_randomization == 0   (this process runs under PYTHONHASHSEED=0)  in process
    otherwise                           python -m recipe.data.reasoning_gym_entries,
                                        PYTHONHASHSEED=0
        stdin:  pickle [EntryJob, ...]
        stdout: one pickle frame per entry ("entry", job, entry), then ("done", ...);
                a task that fails: ("error", job, message naming the task and the entry)

A task may also draw from the global ``random`` (``list_functions`` does, unseeded), so it is
reseeded before each entry from the set's seed and the entry's index, as the tasks seed their own
``Random``: entry i depends on the task, its config, the seed and i, not on the entries made
before it. Every frame must come within ``FRAME_TIMEOUT_S`` (a task stuck in a loop is an error
naming it, not a hung startup). Entries travel as pickles, so tuples stay tuples for the scorers.
Cost: one child per call, ~0.9 s more than generating in process (4,096 + 256 ``chain_sum``
prompts: 0.97 s instead of 0.12 s), most of it reasoning-gym's import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import random
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from recipe.data.loaders import DataError

logger = logging.getLogger(__name__)

PINNED_HASH_SEED = "0"
"""The ``PYTHONHASHSEED`` entries are generated under (0: no randomization)."""
FRAME_TIMEOUT_S = 300.0
"""Longest wait for the child's next frame: its start and reasoning-gym's import (~1 s), a task's
setup (word lists, ARC files: under 1 s here), one entry (``knight_swap``, the slowest, ~0.5 s).
A child silent this long is stuck, and the error names the entry it was on."""
READER_JOIN_S = 10.0
"""Wait for the reader thread once the child has ended (its stdout is closed by then)."""
Frame = tuple[str, int, Any]
"""(kind, job index, payload): ``entry`` (the entry), ``error`` (a message), ``done``."""


@dataclass(frozen=True, slots=True)
class EntryJob:
    """One set of entries to generate."""

    name: str
    """reasoning-gym's name of the task."""
    task_args: dict[str, Any]
    """``create_dataset`` keyword arguments; ``seed`` and ``size`` among them."""
    label: str
    """The set, in error messages: ``train``, ``val``, ``few-shot``."""


def generate_entries(jobs: Sequence[EntryJob]) -> list[list[dict[str, Any]]]:
    """Entries ``0..size-1`` of each job, the same in every process (module docstring);
    ``DataError`` naming the task and the entry when one fails or the generator stops."""
    if hash_seed_is_pinned():
        with _global_rngs_kept():
            return [list(task_entries(job)) for job in jobs]
    return _generate_in_child(jobs)


def hash_seed_is_pinned() -> bool:
    """Whether this process hashes strings as the child does (it runs under
    ``PYTHONHASHSEED=0``), so that entries made here are the child's."""
    return sys.flags.hash_randomization == 0


def task_entries(job: EntryJob) -> Iterator[dict[str, Any]]:
    """The job's entries, generated in this process; ``DataError`` naming the task and entry.
    Reseeds the global ``random`` before each entry (module docstring)."""
    from reasoning_gym import create_dataset

    # Broad catches: the task's own code raises anything; the message names task and entry.
    try:
        task = create_dataset(job.name, **job.task_args)
    except Exception as err:
        raise DataError(
            f"reasoning-gym task {job.name!r} ({job.label} set): {_reason(err)}"
        ) from err
    for index in range(job.task_args["size"]):
        random.seed(job.task_args["seed"] + index)  # as the tasks seed their own Random
        try:
            entry = task[index]
        except Exception as err:
            raise DataError(
                f"reasoning-gym task {job.name!r} failed on entry {index} of the {job.label} set "
                f"(seed {job.task_args['seed']}): {_reason(err)}"
            ) from err
        yield entry


@contextlib.contextmanager
def _global_rngs_kept() -> Iterator[None]:
    """This process's global ``random`` and numpy states, put back after the entries (which
    reseed them): the driver's RNG is part of its checkpoints."""
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def _generate_in_child(jobs: Sequence[EntryJob]) -> list[list[dict[str, Any]]]:
    env = {**os.environ, "PYTHONHASHSEED": PINNED_HASH_SEED}
    command = [sys.executable, "-m", __name__]
    # stderr is inherited: reasoning-gym's warnings, and a crashed child's traceback, show.
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    frames: queue.Queue[Frame] = queue.Queue()
    reader = threading.Thread(target=_read_frames, args=(proc.stdout, frames), daemon=True)
    reader.start()
    try:
        try:
            with proc.stdin:
                pickle.dump(list(jobs), proc.stdin)
        except BrokenPipeError:
            pass  # the child ended at once: the end of its output says so, below
        return _collect(jobs, frames)
    finally:
        if proc.poll() is None:
            proc.kill()  # our own child: stuck, or abandoned after an error
        proc.wait()  # killed or exited: returns at once
        reader.join(timeout=READER_JOIN_S)  # its input ended with the child
        if not reader.is_alive():
            proc.stdout.close()


def _collect(jobs: Sequence[EntryJob], frames: queue.Queue[Frame]) -> list[list[dict[str, Any]]]:
    results: list[list[dict[str, Any]]] = [[] for _ in jobs]
    while True:
        # The set being generated: the first one short of its size.
        job, num_done = next(
            (
                (j, len(r))
                for j, r in zip(jobs, results, strict=True)
                if len(r) < j.task_args["size"]
            ),
            (jobs[-1], len(results[-1])),
        )
        try:
            kind, index, payload = frames.get(timeout=FRAME_TIMEOUT_S)
        except queue.Empty:
            raise DataError(
                f"reasoning-gym task {job.name!r}: nothing within {FRAME_TIMEOUT_S:g} s (stuck "
                f"at entry {num_done} of the {job.label} set); the generator was stopped"
            ) from None
        if kind == "entry":
            results[index].append(payload)
        elif kind == "error":
            raise DataError(payload)
        elif kind == "done":
            return results
        else:  # "eof": the child ended without its last frame
            raise DataError(
                f"reasoning-gym task {job.name!r}: the generator process ended at entry "
                f"{num_done} of the {job.label} set ({payload}); its traceback is on stderr above"
            )


def _read_frames(stream: IO[bytes], frames: queue.Queue[Frame]) -> None:
    while True:
        try:
            frames.put(pickle.load(stream))
        except (EOFError, pickle.UnpicklingError, ValueError) as err:
            frames.put(("eof", -1, _reason(err) if str(err) else "no output"))
            return


def _reason(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def main() -> None:
    """The child's side: read the jobs, write each entry as it comes (module docstring)."""
    # The protocol owns the real stdout; anything a task prints goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    jobs: list[EntryJob] = pickle.load(sys.stdin.buffer)
    with out:
        for job_index, job in enumerate(jobs):
            try:
                for entry in task_entries(job):
                    _write(out, ("entry", job_index, entry))
            except DataError as err:
                _write(out, ("error", job_index, str(err)))
                return
        _write(out, ("done", -1, None))


def _write(out: IO[bytes], frame: Frame) -> None:
    pickle.dump(frame, out)
    out.flush()  # frame by frame: the parent's deadline is per entry


if __name__ == "__main__":
    main()
