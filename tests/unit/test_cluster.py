"""Placement by role without a cluster: the bundles each role asks for, how they read in an
error, the host identity the weight sync decides from, and the line that logs its choice.

The same paths run on a 3-node Ray cluster in tests/integration/test_multi_node.py.
"""

from __future__ import annotations

import socket

import pytest

from recipe.checkpoint_engine.host import NODE_ID_ENV, EndpointSite, host_id, ray_node_id
from recipe.checkpoint_engine.placement import describe_backend_choice, resolve_backend
from recipe.config import RayConfig, RecipeConfig, TrainerConfig
from recipe.run.placement import Placement
from recipe.utils.config_check import ConfigError
from recipe.workers.cluster import RoleSpec, role_bundle, unshared_dir_error
from recipe.workers.config import ActorConfig, RolloutConfig


def _cfg(**kwargs) -> RecipeConfig:
    return RecipeConfig(trainer=TrainerConfig(device="cpu"), **kwargs)


def test_a_bundle_holds_cpus_gpus_only_when_asked_and_the_roles_custom_resources():
    assert role_bundle(1, 0.0, {}) == {"CPU": 1.0}
    assert role_bundle(1, 0.5, {"rollout_host": 1}) == {
        "CPU": 1.0,
        "GPU": 0.5,
        "rollout_host": 1.0,
    }


def test_a_role_spec_reads_as_counted_bundle_shapes_with_the_strategy():
    spec = RoleSpec("rollout", ({"CPU": 1.0, "rollout_host": 1.0},) * 2, "SPREAD")
    assert spec.describe() == "2 x {CPU: 1, rollout_host: 1} (SPREAD)"
    mixed = RoleSpec("trainer", ({"CPU": 1.0}, {"CPU": 2.0}), "PACK")
    assert mixed.describe() == "1 x {CPU: 1} + 1 x {CPU: 2} (PACK)"


def test_cpu_roles_get_one_bundle_per_rank_and_per_replica_with_their_knobs():
    cfg = _cfg(
        actor=ActorConfig(nnodes=2, n_gpus_per_node=2, ppo_mini_batch_size=4),
        rollout=RolloutConfig(num_replicas=3),
        ray=RayConfig(
            rollout_strategy="SPREAD",
            trainer_resources={"trainer_host": 0.25},
            rollout_resources={"rollout_host": 1},
        ),
    )
    placement = Placement(cfg)
    trainer, rollout = placement.role_spec("trainer"), placement.role_spec("rollout")
    assert trainer.bundles == ({"CPU": 1.0, "trainer_host": 0.25},) * 4
    assert trainer.strategy == "PACK"
    assert rollout.bundles == ({"CPU": 1.0, "rollout_host": 1.0},) * 3
    assert rollout.strategy == "SPREAD"


def test_gpu_roles_ask_for_their_share_of_a_gpu_and_tensor_parallel_gpus_per_replica():
    cfg = _cfg(rollout=RolloutConfig(n_gpus_per_node=4, gpu_memory_utilization=0.4))
    placement = Placement(cfg)
    placement.device = "cuda"
    placement.__dict__["shares_gpus"] = False  # a cluster with GPUs for both roles
    assert placement.role_spec("trainer").bundles == ({"CPU": 1.0, "GPU": 1.0},)
    assert placement.role_spec("rollout").bundles == ({"CPU": 1.0, "GPU": 1.0},) * 4
    placement.__dict__["shares_gpus"] = True  # one GPU for both: split as vLLM is capped
    assert placement.role_spec("trainer").bundles[0]["GPU"] == pytest.approx(0.6)
    assert placement.role_spec("rollout").bundles[0]["GPU"] == pytest.approx(0.4)


def test_shared_gpus_are_one_group_of_whole_gpus_with_rank_i_and_replica_i_on_bundle_i():
    cfg = _cfg(
        mode="sync",
        actor=ActorConfig(n_gpus_per_node=2, ppo_mini_batch_size=4),
        rollout=RolloutConfig(n_gpus_per_node=3),
        ray=RayConfig(trainer_resources={"box": 1}, rollout_resources={"box": 0.5, "fast": 1}),
    )
    placement = Placement(cfg)
    assert not placement.one_group  # CPU: no GPUs to share
    placement.device = "cuda"
    assert placement.one_group  # sync: colocated
    spec = placement.shared_spec()
    assert spec.bundles == (
        {"CPU": 2.0, "GPU": 1.0, "box": 1.5, "fast": 1.0},
        {"CPU": 2.0, "GPU": 1.0, "box": 1.5, "fast": 1.0},
        {"CPU": 1.0, "GPU": 1.0, "box": 0.5, "fast": 1.0},  # replica 2 alone on GPU 2
    )
    assert spec.strategy == "PACK"
    placement.__dict__["shares_gpus"] = False  # async modes on enough GPUs: two groups
    assert not placement.one_group


def test_a_tensor_parallel_replica_asks_for_whole_gpus_and_cannot_share_them():
    rollout = RolloutConfig(n_gpus_per_node=4, tensor_parallel_size=2)
    placement = Placement(_cfg(rollout=rollout))
    placement.device = "cuda"
    placement.__dict__["shares_gpus"] = False
    assert placement.role_spec("rollout").bundles == ({"CPU": 1.0, "GPU": 2.0},) * 2
    placement.__dict__["shares_gpus"] = True  # mode=sync, or too few GPUs: fractions
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size=2 needs whole GPUs"):
        placement.role_spec("rollout")
    placement.device = "cpu"  # CPU engines: ranks are processes, no GPUs asked
    assert placement.role_spec("rollout").bundles == ({"CPU": 1.0},) * 2


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"placement_timeout_s": 0}, "ray.placement_timeout_s"),
        ({"rollout_strategy": "spread"}, "ray.rollout_strategy"),
        ({"trainer_resources": {"GPU": 1}}, "ray.trainer_resources.GPU"),
        ({"rollout_resources": {"rollout_host": 0}}, "ray.rollout_resources.rollout_host"),
    ],
)
def test_bad_placement_knobs_fail_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        RayConfig(**kwargs)


def test_the_host_is_the_ray_node_a_spawning_actor_exported_else_the_machine(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # a vLLM worker process
    monkeypatch.delenv(NODE_ID_ENV, raising=False)
    assert ray_node_id() is None
    machine = host_id()
    assert machine.startswith(socket.gethostname() + "/")
    monkeypatch.setenv(NODE_ID_ENV, "ab" * 28)
    assert host_id() == "ray-node/" + "ab" * 28 != machine


def _site(host: str) -> EndpointSite:
    return EndpointSite(host, "10.0.0.1", 1, "cpu", None, 1 << 30)


def test_ray_nodes_on_one_machine_are_different_hosts_to_the_backend_choice():
    sender = _site("ray-node/aaaa1111")
    same, other = _site("ray-node/aaaa1111"), _site("ray-node/bbbb2222")
    assert resolve_backend("auto", sender, [same, same]) == "shm"
    assert resolve_backend("auto", sender, [same, other]) == "gloo"
    with pytest.raises(ValueError, match=r"backend='shm' does not fit"):
        resolve_backend("shm", sender, [other])


def test_the_backend_choice_is_described_by_where_the_receivers_are():
    sender = _site("ray-node/aaaa1111cccc")
    line = describe_backend_choice(
        "gloo", sender, [_site("ray-node/bbbb"), _site("ray-node/dddd"), sender]
    )
    assert line == (
        "weight sync backend gloo: trainer rank 0 on host ray-node/aaaa1111, 3 receivers "
        "(1 on the same host, 2 on 2 other host(s))"
    )


def test_a_node_that_cannot_read_the_drivers_marker_is_named(tmp_path):
    marker = tmp_path / ".shared_check"
    nodes = {"aa" * 28: {"ip": "10.0.0.1"}, "bb" * 28: {"ip": "10.0.0.2"}}
    assert unshared_dir_error(marker, "t0k", {"aa" * 28: "t0k", "bb" * 28: "t0k"}, nodes) is None
    stale = {"aa" * 28: "t0k", "bb" * 28: "an older token"}
    for seen in (stale, {"aa" * 28: "t0k", "bb" * 28: None}):
        error = unshared_dir_error(marker, "t0k", seen, nodes)
        assert error is not None and "\n" not in str(error)
        assert str(error).startswith(
            f"the run directory {tmp_path} is not on a filesystem every node sees: node "
            "bbbbbbbb (10.0.0.2) cannot read .shared_check"
        )
