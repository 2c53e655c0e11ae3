"""A hung (not dead) engine process stops a run within its deadlines (nightly: one run per
mode).

The engine's vLLM core is SIGSTOPped once the first step is logged: the next wait on it is
either the step's generation (``rollout.generation_timeout_s``: in fully_async the trainer's
wait for a batch) or a part of the weight push (``checkpoint_engine.timeout_s``: the engines'
pause or resume, a transfer phase, a rollouter call), whichever the stop lands in. Any of
those is a correct ending (``ENDINGS``): the run must stop with one line naming the deadline
that fired (and the replica, where it names the engine's wait), exit code 1 and summary.json
``failed``, and its teardown must not wait on the hung process a second time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.nightly]

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 15

ENDINGS = {
    "the step's generation, or fully_async's wait for a batch": (
        rf"generation_timeout_s={DEADLINE_S} s"
    ),
    "a rollouter call or a replica's pause (the deadline's config key named)": (
        rf"checkpoint_engine\.timeout_s={DEADLINE_S} s"
    ),
    "the push's pause or resume of the engines": (
        rf"weight sync phase '(pause|resume)' failed at [^:]*rollout replica 0[^:]*: "
        rf"no answer within {DEADLINE_S}\.0 s"
    ),
    "a transfer phase of the push (the driver waits 2 s past the peers' deadline)": (
        rf"weight sync phase '\w+' failed at [^:]*rollout replica 0[^:]*: "
        rf"no answer within {DEADLINE_S + 2}\.0 s"
    ),
}
"""Every correct way for the run to end, by what the stop landed in: the one error line must
match one of these (checkpoint_engine.timeout_s and rollout.generation_timeout_s are both
``DEADLINE_S``)."""


def _first_step_logged(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return False
    lines = [line for line in metrics.read_text().splitlines() if line.strip()]
    return any(json.loads(line)["step"] >= 1 for line in lines)


NO_PUSH_BEFORE_THE_END = "async_training.trigger_parameter_sync_step=200"
"""fully_async with no push due before step 200, in a run of 200 steps: more than the engine
generates before the stop (the first step), so the stop can only land in the trainer's wait
for a batch once the groups generated before it are trained."""


@pytest.mark.parametrize(
    ("mode", "steps", "extra"),
    [
        ("sync", 30, ""),
        ("one_step_off", 30, ""),
        ("fully_async", 30, ""),
        pytest.param("fully_async", 200, NO_PUSH_BEFORE_THE_END, id="fully_async-batch-wait"),
    ],
)
def test_a_stopped_engine_ends_a_run_within_its_deadline(tmp_path, mode, steps, extra):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "recipe", f"mode={mode}", f"trainer.total_training_steps={steps}",
           f"rollout.generation_timeout_s={DEADLINE_S}",
           f"checkpoint_engine.timeout_s={DEADLINE_S}", "trainer.val_before_train=false",
           "trainer.test_freq=0", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
           "rollout.n=4", "logger.quiet=true", f"hydra.run.dir={run_dir}"]  # fmt: skip
    cmd += [extra] if extra else []
    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    stopped: list[psutil.Process] = []
    try:
        start = time.monotonic()
        while not _first_step_logged(run_dir):
            assert proc.poll() is None and time.monotonic() - start < 600, log.read_text()[-3000:]
            time.sleep(0.1)
        children = psutil.Process(proc.pid).children(recursive=True)
        stopped = [p for p in children if "EngineCore" in p.name()]
        assert stopped, [p.name() for p in children]
        for core in stopped:
            core.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        returncode = proc.wait(timeout=10 * DEADLINE_S)
        took_s = time.monotonic() - frozen_at
    finally:
        for core in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.send_signal(signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert returncode == 1 and len(errors) == 1, text[-3000:]
    ended_on = [what for what, pattern in ENDINGS.items() if re.search(pattern, errors[0])]
    assert ended_on, errors[0]  # a deadline of the step or of the push, named
    if "generation_timeout_s" in errors[0]:  # the engine was generating: it is named
        assert re.search(r"replica(\(s\))? 0", errors[0]), errors[0]
    if extra == NO_PUSH_BEFORE_THE_END:  # the trainer's batch wait is what fired
        assert "no batch of" in errors[0], errors[0]
    # one deadline, then a bounded teardown (the engines' graceful shutdown: 60 s at most)
    assert took_s < 2 * DEADLINE_S + 60 + 30, took_s
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] in errors[0]
