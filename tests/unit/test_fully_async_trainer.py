"""``FullyAsyncTrainer.fit`` built in-process: the real trainer loop, rollouter, message queue,
admission, supervisor, served-weights copy and checkpoints, over scripted engines
(tests/helpers/fake_engines.py) and scripted trainer ranks and pushes
(tests/helpers/fake_ranks.py). The rollouter and its queue run on an event loop in a thread,
called through the trainer's typed clients as the driver calls the actors
(tests/helpers/local_actors.py).

The same loop runs against Ray, vLLM engines and FSDP ranks in
tests/integration/test_fully_async.py, test_faults.py and test_resume.py; these tests drive
it through syncs, stale groups, a restarted replica, a hung replica and a resume in seconds.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fully_async_policy.driver.clients import QueueClient, RolloutClient
from fully_async_policy.driver.served_weights import PUSHED_SLOT
from fully_async_policy.driver.trainer import FullyAsyncTrainer
from fully_async_policy.message_queue import MessageQueue
from fully_async_policy.messages import PromptGroup
from fully_async_policy.rollouter.actor import FullyAsyncRollouter
from recipe.checkpoint.ledger import read_ledger
from recipe.config import RecipeConfig
from recipe.faults import RunFailure
from recipe.run.inputs import RunInputs
from tests.helpers.fake_engines import LocalHandle, ScriptedEngines, ScriptedWorker
from tests.helpers.fake_ranks import ScriptedPush, ScriptedRanks
from tests.helpers.in_process import fully_async_config, scripted_inputs
from tests.helpers.local_actors import FutureWaits, LoopThread, ThreadHandle

pytestmark = pytest.mark.timeout(60)


class Run:
    """A fully async run in this process: ``FullyAsyncRecipe``'s wiring (fully_async_policy/
    main.py) with the scripted parts."""

    def __init__(
        self,
        cfg: RecipeConfig,
        run_dir: Path,
        ranks: ScriptedRanks | None = None,
        inputs: RunInputs | None = None,
        **worker: Any,
    ) -> None:
        self.loop = LoopThread()
        inputs = inputs or scripted_inputs(cfg)
        self.ranks = ranks or ScriptedRanks()
        self.trainer = FullyAsyncTrainer(cfg, run_dir, inputs=inputs, ranks=self.ranks)
        plan = self.trainer.plan
        queue: MessageQueue[PromptGroup] = MessageQueue(plan.budget)

        async def start() -> tuple[FullyAsyncRollouter, ScriptedEngines]:
            rollouter = FullyAsyncRollouter(
                cfg, run_dir, LocalHandle(queue), plan, None, inputs=inputs
            )
            engines = ScriptedEngines(cfg.rollout, lambda: ScriptedWorker(**worker))
            await rollouter.start(engines)
            return rollouter, engines

        self.rollouter, self.engines = self.loop.call(start)
        waits = FutureWaits()
        client = RolloutClient(ThreadHandle(self.rollouter, self.loop), waits)
        self.trainer.attach(client, QueueClient(ThreadHandle(queue, self.loop), waits))
        self.push = ScriptedPush(self.trainer.engines, self.ranks, self.loop)
        self.trainer.ppo.param_sync = self.push  # type: ignore[assignment]

    def fit(self) -> dict[str, Any]:
        try:
            return self.trainer.fit()
        finally:
            self.close()

    def close(self) -> None:
        self.trainer.close(release_placement=False)
        self.loop.call(self.rollouter.shutdown)
        self.loop.close()


def _balanced(ledger: dict[str, list[str]]) -> None:
    assert len(set(ledger["trained"])) == len(ledger["trained"])
    accounted = Counter(ledger["trained"]) + Counter(ledger["in_flight"])
    assert Counter(ledger["admitted"]) == accounted + Counter(ledger["filtered"])


def _rows(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_fit_trains_every_step_pushes_every_t_steps_and_accounts_for_every_prompt(tmp_path):
    cfg = fully_async_config()
    run = Run(cfg, tmp_path, tick_s=0.004)
    plan = run.trainer.plan
    summary = run.fit()
    assert run.trainer.global_step == plan.total_steps == 8
    assert run.trainer.version == plan.total_steps // plan.steps_per_sync == 4
    assert len(run.ranks.batches) == plan.total_steps
    assert all(b.rewards_b.numel() == plan.prompts_per_step * 4 for b in run.ranks.batches)
    _balanced(run.trainer.ledger)
    assert len(run.trainer.ledger["trained"]) == plan.total_steps * plan.prompts_per_step
    rows = _rows(tmp_path)
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    pushed_at = [int(r["step"]) for r in rows if "sync/pause_window_s" in r]
    assert pushed_at == [2, 4, 6, 8]
    assert all(r["staleness/max"] <= plan.staleness_bound for r in rows)
    assert max(r["sync/partial_groups"] for r in rows if "sync/partial_groups" in r) > 0
    assert summary["prompts/in_flight"] == len(run.trainer.ledger["in_flight"])
    assert run.push.pushed == {1: 2, 2: 4, 3: 6, 4: 8}  # version v holds 2v updates
    assert all(slot is None for slot, _ in run.ranks.forwards)  # bypass mode


class SyncSpy:
    """The rollouter's handle behind the trainer's client, recording for each push the
    rollouter calls from its start to ``end_sync`` (by name), and each replica's resumes
    (``resume:<replica>``) from its start to the trainer's next call after ``end_sync``
    (which waited for ``end_sync``'s answer, resumes in it included)."""

    def __init__(self, run: Run) -> None:
        client = run.trainer.rollouter
        self.handle, client.handle = client.handle, self
        self.syncs: list[list[str]] = []
        self.phase = "off"  # "sync": calls and resumes recorded; "closing": resumes only
        push = run.push.push

        def spied_push(version: int, *, timer: Any = None) -> Any:
            self.syncs.append([])
            self.phase = "sync"
            return push(version, timer=timer)

        run.push.push = spied_push  # type: ignore[method-assign]
        for replica, worker in enumerate(run.engines.workers):
            worker.worker.resume = self._resumes(replica, worker.worker.resume)

    def _resumes(self, replica: int, resume: Any) -> Any:
        async def counted() -> Any:
            if self.phase != "off":
                self.syncs[-1].append(f"resume:{replica}")
            return await resume()

        return counted

    def __getattr__(self, name: str) -> Any:
        if self.phase == "sync":
            self.syncs[-1].append(name)
            if name == "end_sync":
                self.phase = "closing"
        elif self.phase == "closing":
            self.phase = "off"
        return getattr(self.handle, name)


def test_a_sync_is_three_rollouter_calls_and_one_resume_per_replica(tmp_path):
    run = Run(fully_async_config(), tmp_path, tick_s=0.004)
    spy = SyncSpy(run)
    run.fit()
    assert len(spy.syncs) == run.trainer.version == 4
    for calls in spy.syncs:
        assert [c for c in calls if not c.startswith("resume:")] == [
            "open_sync",
            "resume_engines",
            "end_sync",
        ]
        assert sorted(c for c in calls if c.startswith("resume:")) == ["resume:0", "resume:1"]


def test_decoupled_old_log_probs_read_the_pushed_version_kept_on_the_first_step_of_a_window(
    tmp_path,
):
    cfg = fully_async_config(**{"algorithm.rollout_correction.bypass_mode": False})
    run = Run(cfg, tmp_path, tick_s=0.002)
    run.fit()
    # Local step 1 forwards the trainer's own weights (still the pushed ones), step 2 the
    # copy kept at step 1: every forward reads the pushed version's policy (2 updates each).
    assert [slot for slot, _ in run.ranks.forwards] == [None, PUSHED_SLOT] * 4
    assert [policy for _, policy in run.ranks.forwards] == [0, 0, 2, 2, 4, 4, 6, 6]


def test_a_slow_trainer_holds_the_rollouter_to_its_admission_budget(tmp_path):
    cfg = fully_async_config(**{"trainer.total_training_steps": 6})
    ranks = ScriptedRanks(on_update=lambda n: time.sleep(0.3))  # slower than generation
    run = Run(cfg, tmp_path, ranks, tick_s=0.002)
    plan = run.trainer.plan
    summary = run.fit()
    for row in _rows(tmp_path):  # polled after the step's sync: its window is open
        window = int(row["trainer/param_version"])
        assert row["prompts/admitted"] <= window * plan.window_demand + plan.budget
        assert row["queue/size"] <= plan.budget
    assert summary["rollouter/idle_ratio"] > 0.5
    assert summary["queue/max_size"] <= summary["queue/capacity"] == plan.budget
    assert summary["prompts/readmitted"] == 0
    _balanced(run.trainer.ledger)


def test_groups_older_than_max_staleness_go_back_and_are_generated_again(tmp_path):
    cfg = fully_async_config(
        **{"async_training.staleness_threshold": 1.0, "async_training.max_staleness": 0}
    )
    run = Run(cfg, tmp_path, tick_s=0.004)
    summary = run.fit()
    assert summary["prompts/readmitted"] > 0
    rows = _rows(tmp_path)
    assert all(r["staleness/max"] == 0 for r in rows)
    _balanced(run.trainer.ledger)
    assert len(run.trainer.ledger["trained"]) == 8 * run.trainer.plan.prompts_per_step


def test_a_replica_killed_after_a_push_is_restarted_on_the_served_version_not_the_trainers(
    tmp_path,
):
    cfg = fully_async_config(**{"rollout.max_restarts": 1})
    holder: dict[str, Run] = {}

    def kill_at_third_update(n: int) -> None:
        if n == 3:  # version 1 is served; the trainer's weights are already ahead (2 updates)
            run = holder["run"]
            run.loop.loop.call_soon_threadsafe(run.engines.workers[1].kill)

    ranks = ScriptedRanks(on_update=kill_at_third_update)
    run = holder["run"] = Run(cfg, tmp_path, ranks, tick_s=0.004)
    summary = run.fit()
    assert summary["faults/rollout_restarts"] == 1
    assert run.engines.restarted == [1]
    exports = [e for e in ranks.exports if e.slot == PUSHED_SLOT]
    assert exports, "the restarted replica was not given the kept copy"
    served = {e.updates for e in exports}
    assert served <= set(run.push.pushed.values()), "a restarted replica got unpushed weights"
    restarted = run.engines.workers[1].worker
    assert restarted.loaded and restarted.version == run.trainer.version
    _balanced(run.trainer.ledger)


def test_a_hung_replica_stops_the_run_at_the_batch_deadline_naming_it(tmp_path):
    cfg = fully_async_config(**{"rollout.generation_timeout_s": 1.0})
    run = Run(cfg, tmp_path, tick_s=60.0)  # one token a minute: nothing finishes
    with pytest.raises(RunFailure, match=r"rollout.generation_timeout_s=1 s .*replica\(s\) 0, 1"):
        run.fit()


def test_a_run_resumed_from_its_checkpoint_trains_every_prompt_exactly_once(tmp_path):
    cfg = fully_async_config(**{"trainer.save_freq": 2, "trainer.total_training_steps": 8})

    def crash_at_sixth_update(n: int) -> None:
        if n == 6:
            raise RuntimeError("trainer rank lost")

    first = Run(cfg, tmp_path, ScriptedRanks(on_update=crash_at_sixth_update), tick_s=0.004)
    with pytest.raises(RuntimeError, match="trainer rank lost"):
        first.fit()

    resumed = fully_async_config(**{"trainer.save_freq": 2, "trainer.resume_mode": "auto"})
    second = Run(resumed, tmp_path, tick_s=0.004)
    assert second.ranks.updates == 4  # the step-4 checkpoint's policy
    assert second.trainer.global_step == 4 and second.trainer.version == 2
    summary = second.fit()
    assert summary["startup/resume_s"] > 0  # loaded once the engines were up, and timed
    assert "startup/resume_s" not in first.trainer.run.startup.metrics()
    trained = [uid for row in read_ledger(tmp_path) for uid in row["trained"]]
    assert len(trained) == len(set(trained)) == 8 * second.trainer.plan.prompts_per_step
    _balanced(second.trainer.ledger)


def test_dynamic_sampling_filters_flat_groups_records_them_and_never_trains_them(tmp_path):
    cfg = fully_async_config(**{"algorithm.filter_groups.enable": True})
    # Even answers: half_flat gives every response of the group 1.0, no GRPO signal.
    run = Run(cfg, tmp_path, inputs=scripted_inputs(cfg, answer=lambda i: i), tick_s=0.002)
    summary = run.fit()
    for batch in run.ranks.batches:
        for group in batch.group_index_b.unique():
            rewards = batch.rewards_b[batch.group_index_b == group]
            assert rewards.max() > rewards.min(), "a flat group was trained"
    ledger = run.trainer.ledger
    _balanced(ledger)
    assert summary["prompts/filtered"] == len(ledger["filtered"]) > 0
    assert not set(ledger["filtered"]) & set(ledger["trained"])
    assert len(ledger["trained"]) == 8 * run.trainer.plan.prompts_per_step


LOOP_BOUND_REWARD = """
import asyncio

class Judge:  # a reward service's client: a lock bound to the loop that made it
    def __init__(self):
        self.lock = asyncio.Lock()
        self.loop = asyncio.get_running_loop()

    async def score(self, solution_str, ground_truth):
        assert asyncio.get_running_loop() is self.loop, "scored on another event loop"
        async with self.lock:  # held across an await, as a connection pool is
            await asyncio.sleep(0.001)
            return float(ground_truth in solution_str.split())

judge = None

async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global judge
    judge = judge or Judge()  # made on the first call's loop and kept for the run
    return await judge.score(solution_str, ground_truth)
"""


def test_an_async_reward_bound_to_its_first_loop_scores_training_and_validation(tmp_path):
    """Training groups and every validation are scored on the rollouter's one event loop,
    where a user's client made on the first call keeps working."""
    reward = tmp_path / "judge.py"
    reward.write_text(LOOP_BOUND_REWARD)
    cfg = fully_async_config(
        **{
            "reward.custom_fn": f"{reward}:compute_score",
            "trainer.val_before_train": True,
            "trainer.test_freq": 2,
        }
    )
    run = Run(cfg, tmp_path, inputs=scripted_inputs(cfg, val=6), tick_s=0.002)
    summary = run.fit()
    rows = _rows(tmp_path)
    # Version 2's validation came in during the run; version 4's is the final one.
    assert [int(r["val/param_version"]) for r in rows if "val/param_version" in r][:1] == [2]
    assert "initial/val_accuracy" in summary and "final/val_accuracy" in summary
    assert rows[0]["step"] == 0 and "val/accuracy" in rows[0]  # before training
    assert max(r["reward/mean"] for r in rows[1:]) > 0  # the judge found some answers


@pytest.mark.parametrize("after", [True, False])
def test_the_final_validation_runs_unless_val_after_train_is_off(tmp_path, after):
    """``trainer.val_after_train=false``: a run whose accuracy is measured elsewhere (a
    study's snapshots, a segment a resume goes on) ends without validating."""
    cfg = fully_async_config(
        **{"trainer.val_before_train": False, "trainer.test_freq": 0,
           "trainer.val_after_train": after}
    )  # fmt: skip
    summary = Run(cfg, tmp_path, inputs=scripted_inputs(cfg, val=6), tick_s=0.002).fit()
    assert (summary["final/val_accuracy"] is not None) is after
    assert not any("val/accuracy" in row for row in _rows(tmp_path))


def test_a_sync_waits_for_a_validation_longer_than_the_sync_phase_deadline(tmp_path):
    """The sync waits for the running validation (every val answer from one version) within
    the validation's deadline, rollout.generation_timeout_s, not the pause's 0.6 s."""
    cfg = fully_async_config(
        **{
            "checkpoint_engine.timeout_s": 0.6,
            "trainer.test_freq": 1,
            "trainer.total_training_steps": 4,
        }
    )
    inputs = scripted_inputs(cfg, val=4)
    # Training answers take one token, validation's twelve (1.8 s): version 1's validation
    # still runs when the sync after step 4 begins.
    slow_val = lambda p, i: 12 if p > len(inputs.train_records) else 1  # noqa: E731
    run = Run(cfg, tmp_path, inputs=inputs, tick_s=0.15, stop_after=slow_val)
    summary = run.fit()
    assert summary["status"] == "completed"
    val_rows = [r for r in _rows(tmp_path) if "val/param_version" in r]
    assert val_rows and all(r["val/skipped"] == 0 for r in val_rows)
    pause = next(r for r in _rows(tmp_path) if r["step"] == 4)["sync/quiesce_s"]
    assert pause > cfg.checkpoint_engine.timeout_s  # it did wait for the validation


def test_a_sync_without_partial_rollout_drains_groups_longer_than_the_sync_phase_deadline(
    tmp_path,
):
    """partial_rollout=false: the sync waits for the groups in flight to finish on the old
    weights within rollout.generation_timeout_s, not the pause's 0.4 s."""
    cfg = fully_async_config(
        **{
            "async_training.partial_rollout": False,
            "checkpoint_engine.timeout_s": 0.4,
            "trainer.total_training_steps": 4,
            "data.shuffle": False,
        }
    )
    # Prompts 9-12, admitted with steps 1-2's eight but not trained with them, take twelve
    # tokens (1.2 s): they are still generating when the first sync begins.
    slow_tail = lambda p, i: 12 if 9 <= p <= 12 else 1  # noqa: E731
    run = Run(cfg, tmp_path, tick_s=0.1, stop_after=slow_tail)
    summary = run.fit()
    assert summary["status"] == "completed"
    first_sync = next(r for r in _rows(tmp_path) if r["step"] == 2)
    assert first_sync["sync/drained_groups"] > 0
    assert first_sync["sync/quiesce_s"] > cfg.checkpoint_engine.timeout_s
    _balanced(run.trainer.ledger)
