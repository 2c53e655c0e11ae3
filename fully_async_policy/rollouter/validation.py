"""``VersionValidation``: each weights version validated on the engines, beside training.

    end_sync(v), v % trainer.test_freq == 0  -->  start(v): a task validates v on the serving
                                                  replicas while training generation goes on
    hold_for_sync / stop                     -->  finish(): wait for it (within
                                                  rollout.generation_timeout_s), so every val
                                                  answer comes from one version
    the trainer's poll                       -->  take_unreported(): results not sent yet
    validate(v) (initial and final weights)  -->  once per version: a result already there
                                                  is reused

A validation that cannot run (no replica in service: they are restarting) or that a dying
replica cut is skipped: one warning names the version and why, and its result is
``{"val/skipped": 1.0}`` (a validation that ran has ``val/skipped`` 0), never an empty dict
that looks like one ran. A dead replica is restarted by the supervisor; training is not held
up by it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from fully_async_policy.deadlines import Deadline, bounded
from fully_async_policy.rollouter.engine_replicas import EngineReplicas
from fully_async_policy.rollouter.replicas import ReplicaSupervisor
from recipe.faults import RolloutWorkerError, RunFailure
from recipe.protocol import PromptRecord
from recipe.reward import RewardFunction
from recipe.run.metrics import val_metrics, val_sampling
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.requests import GroupRequest

logger = logging.getLogger(__name__)


class VersionValidation:
    """Validation results by version (see the module docstring)."""

    def __init__(
        self,
        validate: Callable[[], Awaitable[dict[str, float]]],
        replicas: ReplicaSupervisor,
        test_freq: int,
        deadline: Deadline,
    ) -> None:
        """``await validate()``: generate and score the val set on the engines, on the
        rollouter's event loop (no thread: the supervisor and a user's async reward function
        see one loop); ``deadline``: how long a wait for a running validation may take
        (``rollout.generation_timeout_s``, which bounds a validation's generation)."""
        self._validate, self.replicas, self.test_freq = validate, replicas, test_freq
        self.deadline = deadline
        self._task: asyncio.Task | None = None
        self._task_version = 0
        self._results: dict[int, dict[str, float]] = {}
        self._unreported: dict[int, dict[str, float]] = {}

    def start(self, version: int) -> None:
        """Begin validating ``version`` if ``trainer.test_freq`` says so."""
        if self.test_freq > 0 and version % self.test_freq == 0:
            self._task = asyncio.create_task(self._run(version))
            self._task_version = version

    async def finish(self, phase: str) -> None:
        """Wait for the running validation, if any, within ``deadline``; past it
        ``RunFailure`` names ``phase`` (the rollouter call waiting) and the version."""
        if self._task is None:
            return
        try:
            what = f"{phase}: the validation of version {self._task_version}"
            await bounded(self._task, self.deadline, what)
        finally:
            self._task = None

    async def result(self, version: int) -> dict[str, float]:
        """Validation metrics of ``version`` (the one served now), validating it if no
        result exists yet; it is then reported here, not by ``take_unreported``."""
        await self.finish("validate")
        if version not in self._results:
            await self._run(version)
        self._unreported.pop(version, None)
        return self._results[version]

    def take_unreported(self) -> dict[int, dict[str, float]]:
        """Results not reported before, by version."""
        results, self._unreported = self._unreported, {}
        return results

    async def _run(self, version: int) -> None:
        states = self.replicas.states
        if not any(self.replicas.in_service):
            named = ", ".join(f"replica {i} {states[i].value}" for i in range(len(states)))
            results = _skipped(version, f"no rollout replica is in service ({named})")
        else:
            try:
                results = await self._validate()
                results |= {"val/skipped": 0.0} if results else {}  # {}: no val set
            except RolloutWorkerError as exc:  # a dead replica is restarted
                results = _skipped(version, str(exc))
                await self.replicas.check_all()
        self._results[version] = self._unreported[version] = results


def _skipped(version: int, why: str) -> dict[str, float]:
    """The result of a validation that did not run: said once, and marked in the metrics."""
    logger.warning("validation of version %d skipped: %s", version, why)
    return {"val/skipped": 1.0}


async def score_val_set(
    engines: EngineReplicas,
    records: Sequence[PromptRecord],
    prompt_ids: Mapping[str, list[int]],
    reward_fn: RewardFunction,
    rollout: RolloutConfig,
    *,
    version: int,
) -> dict[str, float]:
    """``val/*`` of ``records`` answered on the serving replicas (``version``; greedy by
    default) and scored, on the caller's event loop: the replica supervisor is touched by the
    rollouter's loop only, and a user's async reward function runs on the one loop it always
    runs on (``RewardFunction``). A hung engine stops it within
    ``rollout.generation_timeout_s``; a dead replica raises ``RolloutWorkerError``."""
    if not records:
        return {}
    start = time.perf_counter()
    sampling = val_sampling(version, rollout.val_temperature)
    refs = [
        engines.submit(GroupRequest(r.uid, prompt_ids[r.uid], record=r, **sampling), track=False)
        for r in records
    ]
    timeout_s = rollout.generation_timeout_s
    try:
        groups = await asyncio.wait_for(asyncio.gather(*(_awaited(ref) for ref in refs)), timeout_s)
    except TimeoutError:
        raise RunFailure(
            f"validation got no answer within rollout.generation_timeout_s={timeout_s:g} s "
            "(a hung engine process; the engine logs are RUN_DIR/engines/replica_R.log)"
        ) from None
    except Exception as exc:
        error = await engines.worker_error(exc)
        if error is None:
            raise
        raise error from exc
    for record, trajs in zip(records, groups, strict=True):
        await reward_fn.ascore_group(record, trajs)
    return val_metrics(groups, start, rollout.response_length)


async def _awaited(ref: Any) -> Any:
    """A Ray ObjectRef as a coroutine (what ``asyncio.gather`` takes)."""
    return await ref
