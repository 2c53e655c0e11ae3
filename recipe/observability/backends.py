"""Metric sinks behind ``tracking.Tracker``: console, jsonl, wandb, tensorboard.

Each sink is a small ``Backend`` (``log``, ``summary``, ``close``) built by ``make_backend`` from
its name in ``logger.backends``. Components never see these classes: they call the Tracker, which
hands every sink the same already-validated ``{key: float}`` record, so no code branches on which
sinks are on. Heavy or optional imports (wandb, torch's tensorboard writer) happen only when that
sink is built.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from recipe.observability.config import BACKEND_NAMES, LoggerConfig
from recipe.observability.progress import bar_paused

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_RUN_ID_FILE = "wandb_run_id"
"""Holds the wandb run id in the run directory, so a resumed run continues the same wandb run."""
HEADLINE_KEYS = ("reward/mean", "val/accuracy", "actor/pg_loss", "staleness/mean", "timing/step_s")
"""Keys the console line shows by value when present; the rest are only counted."""


NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How non-finite floats are written: as these strings, so the output stays strict JSON and
a reader still sees that a value was NaN or infinite (``float()`` parses them back)."""


def json_safe(value: Any) -> Any:
    """Non-finite floats become the strings of ``NON_FINITE``, recursively: strict JSON in
    which a NaN loss or gradient norm stays visible."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        # numpy / torch scalars: plain Python numbers first, then the non-finite rule.
        return json_safe(value.item())
    return value


class Backend(ABC):
    """One metric sink. ``log`` gets finite-or-not floats under validated slash-namespaced keys."""

    @abstractmethod
    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record one step's metrics."""

    def summary(self, summary: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Record end-of-run values; sinks without a summary notion ignore them."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release files/processes. Called once by the Tracker."""


PARAM_VERSION_KEY = "trainer/param_version"


class JsonlBackend(Backend):
    """``run_dir/metrics.jsonl``: one JSON object per step, ``step`` first, NaN/inf as the
    strings ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"``.

    Opened in append mode so a resumed run continues the file; every line is flushed so a crash
    loses nothing already logged.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / METRICS_FILE
        needs_newline = _ends_mid_line(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        if needs_newline:
            # A previous process died mid-write; start our records on a fresh line.
            self._file.write("\n")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        record: dict[str, Any] = {"step": step}
        if PARAM_VERSION_KEY in metrics:
            # The run-directory contract: every line names the weights version at top level.
            record["param_version"] = int(metrics[PARAM_VERSION_KEY])
        record.update(json_safe(dict(metrics)))
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _ends_mid_line(path: Path) -> bool:
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


class ConsoleBackend(Backend):
    """A compact rich line per ``console_every`` steps: the headline values, each the mean over
    the steps since the previous line (one step's value would mislead: ``staleness/mean``
    alternates 0 and 1 at T = 2, and every tenth step is even), plus a count of the rest.

    Lines go through ``progress.bar_paused``, so each starts on a line of its own even while the
    step bar is drawn on the same terminal or log file.
    """

    def __init__(self, every: int, quiet: bool, console: Any = None) -> None:
        from rich.console import Console

        self.every = every
        self.quiet = quiet
        self.console = console if console is not None else Console(highlight=False)
        self._since_last: dict[str, list[float]] = {}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.quiet:
            return
        for key in HEADLINE_KEYS:
            if key in metrics:
                self._since_last.setdefault(key, []).append(float(metrics[key]))
        if step % self.every != 0:
            return
        means = {key: sum(values) / len(values) for key, values in self._since_last.items()}
        self._since_last = {}
        line = format_console_line({**metrics, **means}, step)
        with bar_paused(self.console.file):
            self.console.print(line, markup=False, soft_wrap=True)

    def summary(self, summary: Mapping[str, Any]) -> None:
        if self.quiet or not summary:
            return
        from rich.table import Table

        table = Table(title="summary", show_header=False)
        for key, value in summary.items():
            table.add_row(str(key), _format_value(value))
        with bar_paused(self.console.file):
            self.console.print(table)

    def close(self) -> None:
        """Nothing buffered: each line is printed when logged."""


def format_console_line(metrics: Mapping[str, float], step: int) -> str:
    shown = [f"{key} {_format_value(metrics[key])}" for key in HEADLINE_KEYS if key in metrics]
    num_other = len(metrics) - len(shown)
    parts = [f"step {step}", *shown]
    if num_other:
        parts.append(f"+{num_other} more")
    return " | ".join(parts)


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class TensorboardBackend(Backend):
    """``run_dir/tensorboard``: one scalar per key; flushed each step for crash safety."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbBackend(Backend):
    """A wandb run under ``run_dir/wandb``; offline unless ``logger.wandb.mode=online``.

    The run id is kept in ``run_dir/wandb_run_id`` and reused with ``resume="allow"``, so a
    resumed run (same run directory) continues the same wandb run instead of starting a new one.
    ``close`` returns once the run's files are complete.
    """

    def __init__(self, cfg: LoggerConfig, run_dir: Path, run_config: dict | None) -> None:
        import wandb

        id_file = run_dir / WANDB_RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        # silent + console capture off: wandb's banner and stdout mirroring would drown the
        # console line; the run files hold everything that matters.
        settings = wandb.Settings(silent=True, console="off")
        self._run = wandb.init(
            project=cfg.project,
            name=cfg.experiment,
            entity=cfg.wandb.entity,
            dir=str(run_dir),
            mode=cfg.wandb.mode,  # type: ignore[arg-type]  # checked by WandbConfig
            config=run_config,
            id=run_id,
            resume="allow",
            reinit="create_new",
            settings=settings,
        )
        id_file.write_text(run_id + "\n")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def summary(self, summary: Mapping[str, Any]) -> None:
        self._run.summary.update(dict(summary))

    def close(self) -> None:
        import wandb

        self._run.finish()
        # finish() returns before wandb's service has written the run file (seen offline with
        # wandb 0.31); teardown waits for it and ends the service process. The Tracker is the
        # only wandb user of its process, so no other run is cut short.
        wandb.teardown()


BACKEND_FACTORIES: dict[str, Callable[[LoggerConfig, Path, dict | None], Backend]] = {
    "console": lambda cfg, run_dir, run_config: ConsoleBackend(cfg.console_every, cfg.quiet),
    "jsonl": lambda cfg, run_dir, run_config: JsonlBackend(run_dir),
    "wandb": WandbBackend,
    "tensorboard": lambda cfg, run_dir, run_config: TensorboardBackend(run_dir),
}
assert tuple(BACKEND_FACTORIES) == BACKEND_NAMES, "one factory per name in logger.backends"


def make_backend(
    name: str, cfg: LoggerConfig, run_dir: Path, run_config: dict | None = None
) -> Backend:
    """Build the sink registered under ``name`` (one of ``BACKEND_NAMES``)."""
    if name not in BACKEND_FACTORIES:
        raise ValueError(
            f"logger.backends: unknown backend {name!r}; allowed: {', '.join(BACKEND_NAMES)}"
        )
    return BACKEND_FACTORIES[name](cfg, run_dir, run_config)
