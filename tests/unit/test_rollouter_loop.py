"""The fully async rollouter's streaming loop, built in-process: scripted engines behind
actor-like handles (tests/helpers/fake_engines.py), the real MessageQueue, admission,
supervisor, snapshot and restore, and a trainer loop that takes batches and syncs as
``FullyAsyncTrainer`` does, through the product's ``RolloutClient`` (the push itself is the
rollouter's open_sync, a load on every receiver and its resume_engines, as
``ParameterSynchronizer``'s sequence is through ``RolloutEngines``).

The same loop runs against vLLM engines in tests/integration/test_fully_async.py (partial
rollout), test_faults.py (killed replicas) and test_resume.py (checkpoints); these tests drive
it through syncs, pauses, partial groups, restarts and snapshots in seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fully_async_policy.driver.clients import RolloutClient
from fully_async_policy.message_queue import MessageQueue
from fully_async_policy.messages import ROLLOUTER_STATE_FILE, PromptGroup
from fully_async_policy.rollouter.actor import FullyAsyncRollouter
from fully_async_policy.rollouter.snapshot import decode_group, decode_ticket
from fully_async_policy.run_plan import RunPlan, plan_run
from recipe.checkpoint.store import RUN_STATE_DIR
from recipe.config import RecipeConfig
from recipe.faults import RunFailure
from recipe.utils.weights_file import WeightsFile, file_sha256
from tests.helpers.fake_engines import LocalHandle, ScriptedEngines, ScriptedWorker
from tests.helpers.in_process import NUM_PROMPTS, fully_async_config, scripted_inputs


def _expected_tokens(prompt_first: int, sample_index: int, length: int) -> list[int]:
    """What ScriptedWorker emits for a response, however often it was cut and continued."""
    return [(prompt_first + sample_index + k) % 97 for k in range(length)]


class Trainer:
    """The trainer's side of the protocol (fully_async_policy/driver/trainer.py), without training:
    R groups per step from the queue, a sync every T steps."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path, **worker: Any) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.plan: RunPlan = plan_run(cfg, NUM_PROMPTS)
        self.inputs = scripted_inputs(cfg)
        self.queue_obj: MessageQueue[PromptGroup] = MessageQueue(self.plan.budget)
        self.queue = LocalHandle(self.queue_obj)
        self.worker = worker
        self.version = 0
        self.trained: list[PromptGroup] = []
        self.pauses: list[Any] = []
        self.recovered: list[list[int]] = []
        """The replicas each sync found coming back and recovered."""
        self.rollouter: FullyAsyncRollouter

    async def start(self, engines: type[ScriptedEngines] = ScriptedEngines) -> FullyAsyncRollouter:
        rollouter = FullyAsyncRollouter(
            self.cfg, self.run_dir, self.queue, self.plan, None, inputs=self.inputs
        )
        self.engines = engines(self.cfg.rollout, lambda: ScriptedWorker(**self.worker))
        await rollouter.start(self.engines)
        self.rollouter = rollouter
        self.client = RolloutClient(LocalHandle(rollouter))
        return rollouter

    async def take(self) -> list[PromptGroup]:
        got = await asyncio.wait_for(self.queue_obj.get_batch(self.plan.prompts_per_step), 30)
        assert isinstance(got, list), got
        self.trained += got
        return got

    async def sync(self, *, snapshot: bool = False) -> dict[str, Any] | None:
        """A push's conversation with the rollouter, through the product's client
        (``RolloutEngines``' calls): open_sync, the load on every receiver it names (paused),
        resume_engines; then (snapshot) and end_sync, whose answer is the pause's report."""
        opening = await self.client.open_sync()
        workers = opening.workers
        if opening.recovering:  # as ServedWeights.heal: back on the served version, paused
            waiting = await self.client.recover_replicas()
            for replica in waiting:
                served = _weights_file(self.run_dir)
                await self.client.install_weights(replica, served, self.version)
            self.recovered.append(waiting)
            workers = await self.client.engine_workers()
        self.version += 1
        for handle in workers:
            await handle.update_weights_from_file("pushed.safetensors", self.version)
        await self.client.resume_engines()
        state = await self.client.snapshot() if snapshot else None
        self.pauses.append(await self.client.end_sync(self.version, len(self.trained)))
        return state

    async def steps(self, first: int, last: int) -> None:
        for step in range(first, last + 1):
            await self.take()
            if step % self.plan.steps_per_sync == 0:
                await self.sync()

    async def finish(self, run: asyncio.Task) -> dict[str, Any]:
        ledger = await self.rollouter.stop()
        await asyncio.wait_for(run, 30)
        leftover = await self.queue_obj.drain()
        self.rollouter.close()
        return {
            "admitted": ledger.admitted_uids,
            "trained": [g.prompt_uid for g in self.trained],
            "in_flight": ledger.unreleased_uids + [g.prompt_uid for g in leftover],
        }


def _balanced(ledger: dict[str, list[str]]) -> None:
    assert len(set(ledger["trained"])) == len(ledger["trained"])
    accounted = Counter(ledger["trained"]) + Counter(ledger["in_flight"])
    assert Counter(ledger["admitted"]) == accounted


def _weights_file(tmp_path: Path) -> WeightsFile:
    """A file standing for the trainer's copy of the served weights (the fake engines only
    check its sha256)."""
    served = tmp_path / "served.safetensors"
    served.write_bytes(b"weights")
    return WeightsFile(str(served), 7, file_sha256(served))


def _check_tokens(groups: list[PromptGroup], trainer: Trainer) -> None:
    """Every response holds exactly the tokens its engine emitted, cut or not."""
    for group in groups:
        first = trainer.inputs.prompt_ids[group.prompt_uid][0]
        for traj in group.trajectories:
            assert traj.finish_reason in ("stop", "length")
            expected = _expected_tokens(first, traj.sample_index, len(traj.response_ids))
            assert traj.response_ids == expected
            assert traj.token_versions == sorted(traj.token_versions)


def test_a_sync_cuts_groups_that_continue_on_the_new_weights_within_the_staleness_bound(
    tmp_path,
):
    async def scenario() -> None:
        trainer = Trainer(fully_async_config(), tmp_path, tick_s=0.004)
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        await trainer.steps(1, trainer.plan.total_steps)
        ledger = await trainer.finish(run)
        assert trainer.version == trainer.plan.total_steps // trainer.plan.steps_per_sync
        assert sum(p.num_partial_groups for p in trainer.pauses) > 0
        _check_tokens(trainer.trained, trainer)
        trajs = [t for g in trainer.trained for t in g.trajectories]
        assert any(t.min_version < t.max_version for t in trajs), "none continued across a sync"
        assert any(g.num_resumes > 0 for g in trainer.trained)
        step_of = {}
        for i, group in enumerate(trainer.trained):
            step_of[group.prompt_uid] = i // trainer.plan.prompts_per_step + 1
        for group in trainer.trained:  # the version the trainer held at that group's step
            held = (step_of[group.prompt_uid] - 1) // trainer.plan.steps_per_sync
            assert held - group.min_version <= trainer.plan.staleness_bound
        _balanced(ledger)

    asyncio.run(scenario())


def test_without_partial_rollout_a_sync_waits_for_its_groups_on_the_old_weights(tmp_path):
    async def scenario() -> None:
        cfg = fully_async_config(**{"async_training.partial_rollout": False})
        trainer = Trainer(cfg, tmp_path, tick_s=0.004)
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        await trainer.steps(1, trainer.plan.total_steps)
        ledger = await trainer.finish(run)
        assert sum(p.num_drained_groups for p in trainer.pauses) > 0
        assert all(p.num_partial_groups == 0 for p in trainer.pauses)
        for traj in (t for g in trainer.trained for t in g.trajectories):
            assert traj.min_version == traj.max_version
        _check_tokens(trainer.trained, trainer)
        _balanced(ledger)

    asyncio.run(scenario())


def test_a_replica_that_dies_mid_group_is_restarted_and_its_prompts_generated_again(tmp_path):
    async def scenario() -> None:
        cfg = fully_async_config(**{"rollout.max_restarts": 1})
        trainer = Trainer(cfg, tmp_path, tick_s=0.004)
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        await trainer.steps(1, 2)  # one sync: the restarted replica must get version 1
        while not rollouter.busy_replicas() or 1 not in rollouter.busy_replicas():
            await asyncio.sleep(0.005)
        trainer.engines.workers[1].kill()
        await asyncio.wait_for(trainer.client.wait_replica_request(), 10)
        waiting = await trainer.client.recover_replicas()
        assert waiting == [1] and trainer.engines.restarted == [1]
        await trainer.client.install_weights(1, _weights_file(tmp_path), trainer.version)
        assert trainer.engines.workers[1].worker.version == trainer.version
        await trainer.steps(3, trainer.plan.total_steps)
        ledger = await trainer.finish(run)
        assert rollouter.poll().num_restarts == 1
        assert rollouter.admission.num_readmitted > 0  # the groups it lost
        _check_tokens(trainer.trained, trainer)
        _balanced(ledger)

    asyncio.run(scenario())


def test_a_sync_opened_while_a_replica_restarts_recovers_it_before_the_load(tmp_path):
    async def scenario() -> None:
        cfg = fully_async_config(**{"rollout.max_restarts": 1})
        trainer = Trainer(cfg, tmp_path, tick_s=0.004)
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        await trainer.steps(1, 2)  # one sync: the restarted replica must get version 1
        while 1 not in rollouter.busy_replicas():
            await asyncio.sleep(0.005)
        trainer.engines.workers[1].kill()
        while trainer.engines.restarted != [1]:
            await asyncio.sleep(0.005)
        await trainer.sync()  # opened while replica 1 restarts: the push waits for it
        assert trainer.recovered == [[1]]
        assert trainer.engines.workers[1].worker.version == trainer.version == 2
        await trainer.steps(3, trainer.plan.total_steps)
        ledger = await trainer.finish(run)
        _check_tokens(trainer.trained, trainer)
        _balanced(ledger)

    asyncio.run(scenario())


async def _resumed_run(
    cfg: RecipeConfig,
    tmp_path: Path,
    state: dict[str, Any],
    trained: list[PromptGroup],
    version: int,
) -> tuple[Trainer, dict[str, list[str]]]:
    """A second rollouter restored from ``state`` (a snapshot taken in step 4's sync, the
    trainer then at ``version`` with ``trained``), run from step 5 to the end; the trainer
    and the ledger."""
    checkpoint = tmp_path / "ckpt"
    (checkpoint / RUN_STATE_DIR).mkdir(parents=True)
    path = checkpoint / RUN_STATE_DIR / ROLLOUTER_STATE_FILE
    path.write_text(json.dumps(state), encoding="utf-8")
    second = Trainer(cfg, tmp_path / "b", tick_s=0.004)
    second.version, second.trained = version, trained
    resumed = await second.start()
    # As FullyAsyncTrainer.attach: the engines serve the checkpoint's weights, then restore.
    await second.client.load_weights(_weights_file(tmp_path), version)
    await second.client.restore(str(checkpoint))
    assert await second.client.end_sync(second.version, len(second.trained)) is None
    run = asyncio.create_task(resumed.run())
    await second.steps(5, second.plan.total_steps)
    return second, await second.finish(run)


def test_a_snapshot_taken_in_a_sync_restores_a_rollouter_that_loses_no_prompt(tmp_path):
    async def scenario() -> None:
        cfg = fully_async_config(**{"trainer.total_training_steps": 10})
        first = Trainer(cfg, tmp_path / "a", tick_s=0.004)
        rollouter = await first.start()
        run = asyncio.create_task(rollouter.run())
        await first.steps(1, 3)
        await first.take()  # step 4 ends with the checkpoint's sync
        state = await first.sync(snapshot=True)
        assert state is not None
        saved_trained, saved_version = list(first.trained), first.version
        await first.steps(5, 6)  # what the crash loses: trained again after the resume
        await first.finish(run)

        second, ledger = await _resumed_run(cfg, tmp_path, state, saved_trained, saved_version)
        _balanced(ledger)  # the resumed ledger counts the checkpoint's admissions too
        assert len(ledger["trained"]) == second.plan.total_steps * second.plan.prompts_per_step
        _check_tokens(second.trained, second)

    asyncio.run(scenario())


async def _generating(rollouter: FullyAsyncRollouter, num_groups: int) -> None:
    while len(rollouter.stream.in_flight) < num_groups:
        await asyncio.sleep(0.005)


def test_a_failed_run_cuts_its_groups_in_flight_instead_of_waiting_for_them(tmp_path):
    async def scenario() -> None:
        trainer = Trainer(fully_async_config(), tmp_path, tick_s=60.0)  # nothing finishes
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        await _generating(rollouter, trainer.plan.budget)
        rollouter.stream.fail(RuntimeError("the reward service is gone"))
        with pytest.raises(RuntimeError, match="the reward service is gone"):
            await asyncio.wait_for(run, 5)
        assert not rollouter.stream.in_flight
        assert trainer.queue_obj.stats().closed  # the trainer's batch wait ends at once
        rollouter.close()

    asyncio.run(scenario())


class _DeafEngines(ScriptedEngines):
    """Engines whose requests ignore the first cancellation: a wait that does not end when
    the rollouter cuts it."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        async def deaf() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await asyncio.sleep(3600)  # a second cancellation ends it

        return deaf()


def test_a_group_that_ignores_its_cut_ends_the_failed_run_at_the_deadline_naming_it(
    tmp_path, caplog
):
    async def scenario() -> None:
        cfg = fully_async_config(**{"checkpoint_engine.timeout_s": 0.3})
        trainer = Trainer(cfg, tmp_path)
        rollouter = await trainer.start(_DeafEngines)
        run = asyncio.create_task(rollouter.run())
        await _generating(rollouter, trainer.plan.budget)
        rollouter.stream.fail(RuntimeError("an engine failed"))
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="an engine failed"):
            await asyncio.wait_for(run, 10)
        assert 0.3 <= time.monotonic() - start < 5
        rollouter.close()

    with caplog.at_level(logging.ERROR, logger="fully_async_policy.rollouter.stream"):
        asyncio.run(scenario())
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert re.match(r"the rollouter ends with 12 prompt groups still in flight \(p\d{3}, ", line)
    assert "within checkpoint_engine.timeout_s=0.3 s of being cut" in line and "\n" not in line


class _FullQueue:
    """A message queue nobody takes from any more: every put waits for good."""

    def __init__(self) -> None:
        self.puts = 0

    async def put(self, group: PromptGroup) -> bool:
        self.puts += 1
        await asyncio.sleep(3600)
        return True

    async def close(self) -> None:
        return None


def test_a_stop_with_releases_the_queue_never_takes_ends_at_the_deadline_and_keeps_them(
    tmp_path, caplog
):
    async def scenario() -> None:
        cfg = fully_async_config(**{"checkpoint_engine.timeout_s": 0.3})
        trainer = Trainer(cfg, tmp_path, tick_s=0.001)
        trainer.queue = LocalHandle(_FullQueue())
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        while len(rollouter.book.releases) < 2:  # the first is stuck in its put
            await asyncio.sleep(0.005)
        start = time.monotonic()
        ledger = await asyncio.wait_for(rollouter.stop(), 10)
        assert time.monotonic() - start < 5
        await asyncio.wait_for(run, 1)
        unreleased = len(rollouter.book.releases)
        assert unreleased >= 2 and ledger.num_released == 0  # none was put: all in flight
        assert Counter(ledger.unreleased_uids) == Counter(ledger.admitted_uids)
        rollouter.close()

    with caplog.at_level(logging.ERROR, logger="fully_async_policy.rollouter.stream"):
        asyncio.run(scenario())
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "finished prompt groups were not put into the message queue within" in line


def test_a_drain_past_the_generation_deadline_fails_naming_the_groups_in_flight(tmp_path):
    async def scenario() -> None:
        cfg = fully_async_config(
            **{"async_training.partial_rollout": False, "rollout.generation_timeout_s": 0.3}
        )
        trainer = Trainer(cfg, tmp_path, tick_s=60.0)  # a hung engine: nothing finishes
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        await _generating(rollouter, trainer.plan.budget)
        with pytest.raises(RunFailure) as caught:
            await asyncio.wait_for(trainer.client.open_sync(), 5)
        assert str(caught.value) == (
            "hold_for_sync: 12 prompt groups in flight on version 0 (rollout replica(s) 0, 1; "
            "engine logs: RUN_DIR/engines/) did not finish within "
            "rollout.generation_timeout_s=0.3 s"
        )
        run.cancel()
        rollouter.close()

    asyncio.run(scenario())


SLOW_REWARD_S = 1.0
"""How long the slow reward (a judge's call, say) takes on every third prompt's responses;
the others take a twentieth of it, so a sync finds groups early in a long scoring."""


def _slow_reward(tmp_path: Path) -> str:
    path = tmp_path / "slow_reward.py"
    path.write_text(
        "import asyncio\n\n\n"
        "async def slow(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    slow = int(ground_truth) % 3 == 0\n"
        f"    await asyncio.sleep({SLOW_REWARD_S} if slow else {SLOW_REWARD_S / 20})\n"
        "    return 1.0\n"
    )
    return f"{path}:slow"


def test_a_sync_does_not_wait_for_groups_awaiting_their_reward(tmp_path):
    """A group generated and being scored (a judge's calls) is off the engines: the sync's
    pause cuts the groups still generating and does not wait for its verdict."""

    async def scenario() -> None:
        cfg = fully_async_config(**{"reward.custom_fn": _slow_reward(tmp_path)})
        trainer = Trainer(cfg, tmp_path, tick_s=0.004)
        rollouter = await trainer.start()
        run = asyncio.create_task(rollouter.run())
        judging_at_sync = []
        for step in range(1, trainer.plan.total_steps + 1):
            await trainer.take()
            if step % trainer.plan.steps_per_sync == 0:
                judging_at_sync.append(len(rollouter.stream.judging))
                await trainer.sync()
        ledger = await trainer.finish(run)
        assert any(judging_at_sync), "no sync found a group being scored"
        assert max(p.pause_s for p in trainer.pauses) < SLOW_REWARD_S / 4
        _balanced(ledger)
        assert all(t.reward == 1.0 for g in trainer.trained for t in g.trajectories)

    asyncio.run(scenario())


async def _judging(rollouter: FullyAsyncRollouter) -> None:
    while not rollouter.stream.judging:
        await asyncio.sleep(0.005)


def test_a_snapshot_keeps_groups_awaiting_their_reward_and_the_resume_scores_them(tmp_path):
    async def scenario() -> None:
        cfg = fully_async_config(
            **{"trainer.total_training_steps": 8, "reward.custom_fn": _slow_reward(tmp_path)}
        )
        first = Trainer(cfg, tmp_path / "a", tick_s=0.004)
        rollouter = await first.start()
        run = asyncio.create_task(rollouter.run())
        await first.steps(1, 3)
        await first.take()
        await asyncio.wait_for(_judging(rollouter), 30)  # a checkpoint while one is scored
        judged = {t.uid for t, _ in rollouter.stream.judging.values()}
        state = await first.sync(snapshot=True)
        assert state is not None
        # kept with their responses, to be scored again: not generated again from scratch
        kept = {decode_ticket(ticket).uid for ticket, _ in state["partials"]}
        restarted = {decode_ticket(ticket).uid for ticket in state["restart"]}
        assert judged <= kept | {decode_group(g).prompt_uid for g in state["releases"]}
        assert not judged & restarted
        saved_trained, saved_version = list(first.trained), first.version
        await first.finish(run)

        second, ledger = await _resumed_run(cfg, tmp_path, state, saved_trained, saved_version)
        _balanced(ledger)
        assert len(ledger["trained"]) == second.plan.total_steps * second.plan.prompts_per_step
        assert all(t.reward == 1.0 for g in second.trained for t in g.trajectories)

    asyncio.run(scenario())
