"""The engine's own output: a log file per engine, and the root error read back from it.

vLLM runs its engine core (and, with a multiprocess executor, its model workers) in child
processes that inherit the rollout worker's stdout and stderr. When one of them fails,
vLLM logs the traceback there and the worker only sees ``EngineDeadError: EngineCore
encountered an issue. See stack trace (above) for the root cause``; the cause itself exists
only as text. So the worker points file descriptors 1 and 2 at a log file while it starts
the engine (the children keep them; the worker's own output goes back where it went), and on
a failure reads the root error back out of that file::

    (Worker pid=2754) ERROR ... [multiproc_executor.py:1063] RuntimeError: CPU Generator ...
    (EngineCore pid=2740) ERROR ... RuntimeError: Worker failed with error 'CPU Generator ...'
        --> root_engine_error() == "RuntimeError: CPU Generator does not use offset"

The run's log stays free of engine tracebacks (a failure names the file instead), which is
also what keeps a deterministic engine failure down to one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

WORKER_START_LINE = "rollout worker start"
"""How the worker's own start-up line in its engine log begins (``write_start_line``):
``rollout worker start: process 9.8 s, import 5.1 s, build 20.3 s``."""

logger = logging.getLogger(__name__)

TAIL_BYTES = 256 * 1024
"""How much of the end of an engine log ``read_root_error`` looks at."""

# "[file.py:123] RuntimeError: text", "ValueError: text", "vllm.x.EngineDeadError: text".
_EXCEPTION_LINE = re.compile(
    r"(?:^|\]\s)((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)):\s*(.*)$"
)
# vLLM's wrappers around the real error: they point at it, they are not it.
_WRAPPERS = (
    re.compile(r"^Worker failed with error '(?P<inner>.*)', please check the stack trace"),
    re.compile(r"^EngineCore encountered an issue"),
    re.compile(r"^Engine core initialization failed"),
)


@contextlib.contextmanager
def engine_output_to(path: Path | None) -> Iterator[None]:
    """Point stdout/stderr (fds 1, 2) at ``path`` (appended) for the block: processes
    started inside it write there for good. ``None``: leave them as they are."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)


def write_start_line(path: Path | None, process_s: float, import_s: float, build_s: float) -> None:
    """Append the worker's start-up seconds to its engine log (``WORKER_START_LINE``), where
    the run's start-up summary reads them beside vLLM's own lines; logged without a file."""
    line = (
        f"{WORKER_START_LINE}: process {process_s:.1f} s, import {import_s:.1f} s, "
        f"build {build_s:.1f} s"
    )
    if path is None:
        logger.info("%s", line)
        return
    try:
        with path.open("a", encoding="utf-8") as log:
            log.write(line + "\n")
    except OSError:  # a summary figure, not worth failing the engine for
        logger.warning("could not write the start-up line to %s", path)


def route_vllm_logging(path: Path | None) -> None:
    """Send this process's ``vllm`` log records to ``path`` too, instead of stderr: vLLM
    logs an engine death here as well (its output handler's ``EngineDeadError``)."""
    if path is None:
        return
    vllm_logger = logging.getLogger("vllm")
    for handler in list(vllm_logger.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            vllm_logger.removeHandler(handler)
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(logging.Formatter("(worker) %(levelname)s %(name)s: %(message)s"))
    vllm_logger.addHandler(file_handler)
    vllm_logger.propagate = False


def root_engine_error(text: str) -> str | None:
    """The root error in an engine's log text, as ``"Type: message"``; None if it has none.

    A model worker's failure reaches the log twice: as itself, then quoted by the engine
    core's wrapper ("Worker failed with error '...'"). The last wrapper names the fatal
    error; the worker's own line before it with that message gives its type. Without a
    wrapper, the last exception line that is not one of vLLM's pointers is the root.
    """
    errors: list[tuple[str, str]] = []  # (type, message) of non-wrapper exception lines
    for line in text.splitlines():
        match = _EXCEPTION_LINE.search(line.rstrip())
        if match is None:
            continue
        name, message = match.group(1).rsplit(".", 1)[-1], match.group(2).strip()
        wrapper = next((m for w in _WRAPPERS if (m := w.match(message))), None)
        if wrapper is None:
            errors.append((name, message))
        elif "inner" in wrapper.groupdict():
            inner = wrapper.group("inner")
            name = next((n for n, m in reversed(errors) if m == inner), name)
            errors.append((name, inner))
    if not errors:
        return None
    name, message = errors[-1]
    return f"{name}: {message}" if message else name


def read_root_error(path: Path | None) -> str | None:
    """``root_engine_error`` of the end of the log at ``path`` (None if it has none)."""
    if path is None or not path.is_file():
        return None
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return root_engine_error(f.read().decode("utf-8", errors="replace"))


def describe_engine_failure(failure: dict | None, fallback: str) -> str:
    """One line on a failed engine from ``RolloutWorker.engine_failure()``: its root error
    and log file, or ``fallback`` (e.g. the exception type) where the log has no error."""
    failure = failure or {}
    error = failure.get("error") or fallback
    log = failure.get("log")
    return f"its engine failed: {error}" + (f" (engine log: {log})" if log else "")
