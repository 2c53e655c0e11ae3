"""Placement by role on a Ray cluster: each role gets its own placement group, reserved
before any of its actors starts.

    reserve_role(role)                 the driver, once per role, before building its group
      trainer  actor.world_size bundles     {CPU: 1, GPU: share}   + ray.trainer_resources
      rollout  rollout.replicas bundles     {CPU: 1, GPU: TP x share} + ray.rollout_resources
      strategy ray.trainer_strategy / ray.rollout_strategy (PACK, SPREAD, STRICT_*)
      ready within ray.placement_timeout_s, else PlacementError: one line naming the role,
      its bundles and what the cluster has

The custom resources let a user pin a role to nodes (``ray start --resources='{"rollout_host":
1}'`` on the engine nodes, ``ray.rollout_resources={rollout_host:1}``: one engine per such
node). ``bundle_nodes`` tells which node holds each bundle (logged once per role, and what
a restart waits for: a bundle whose node is gone is placed again only where the cluster has
room, within the same deadline, ``wait_for_bundle``). ``check_shared_dir``: on a cluster of
several nodes, every node must see the run directory.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_POLL_S = 0.2


class PlacementError(ValueError):
    """The cluster cannot hold a role's bundles (bad input: the run stops with exit code 2)."""


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What one role asks of the cluster."""

    role: str
    """``trainer`` or ``rollout``: named in errors and logs."""
    bundles: tuple[Mapping[str, float], ...]
    """One bundle per trainer rank / engine replica, in rank / replica order."""
    strategy: str
    """Ray's placement strategy for the bundles."""

    def describe(self) -> str:
        """``2 x {CPU: 1, rollout_host: 1} (SPREAD)``."""
        shapes: dict[str, int] = {}
        for bundle in self.bundles:
            shape = "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(bundle.items())) + "}"
            shapes[shape] = shapes.get(shape, 0) + 1
        parts = [f"{count} x {shape}" for shape, count in shapes.items()]
        return f"{' + '.join(parts)} ({self.strategy})"


def role_bundle(num_cpus: float, num_gpus: float, extra: Mapping[str, float]) -> dict[str, float]:
    """One bundle: CPUs, GPUs when any, and the role's custom resources."""
    bundle = {"CPU": float(num_cpus)}
    if num_gpus > 0:
        bundle["GPU"] = float(num_gpus)
    for name, amount in extra.items():
        bundle[str(name)] = float(amount)
    return bundle


def replica_gpus(tensor_parallel_size: int, gpu_fraction: float) -> float:
    """GPUs one engine replica's bundle asks for: ``gpu_fraction`` of one GPU, or
    ``tensor_parallel_size`` whole GPUs (Ray hands an actor several devices only as whole
    GPUs, so a tensor-parallel engine cannot share its GPUs with the trainer)."""
    if tensor_parallel_size == 1:
        return gpu_fraction
    if gpu_fraction < 1.0:
        raise ValueError(
            f"rollout.tensor_parallel_size={tensor_parallel_size} needs whole GPUs, but the "
            f"engines share GPUs with the trainer here ({gpu_fraction:g} of a GPU each: "
            "mode=sync, or fewer GPUs than trainer ranks + engine GPUs); use "
            "rollout.tensor_parallel_size=1 with more rollout.num_replicas"
        )
    return float(tensor_parallel_size)


def reserve(spec: RoleSpec, timeout_s: float) -> Any:
    """A ready placement group for ``spec``; ``PlacementError`` when it is not ready within
    ``timeout_s`` (the group is removed again: nothing waits forever)."""
    import ray
    from ray.exceptions import GetTimeoutError

    group = ray.util.placement_group([dict(b) for b in spec.bundles], strategy=spec.strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except GetTimeoutError:
        ray.util.remove_placement_group(group)
        raise PlacementError(
            f"the Ray cluster cannot hold the {spec.role} role's placement group "
            f"{spec.describe()} within ray.placement_timeout_s={timeout_s:g}: "
            f"{_cluster_summary()}"
        ) from None
    nodes = bundle_nodes(group)
    logger.info(
        "%s placement: %s",
        spec.role,
        ", ".join(f"bundle {i} on node {node[:8]}" for i, node in enumerate(nodes)),
    )
    return group


def bundle_nodes(group: Any) -> list[str]:
    """The node id (hex) holding each bundle of ``group``, in bundle order ("" while one is
    not placed)."""
    from ray.util import placement_group_table

    table = placement_group_table(group)
    by_index = table.get("bundles_to_node_id", {})
    return [str(by_index.get(i, "") or "") for i in range(len(table.get("bundles", {})))]


def alive_nodes() -> dict[str, dict[str, Any]]:
    """Alive nodes of the cluster by node id: their address and resources."""
    import ray

    return {
        n["NodeID"]: {"ip": n["NodeManagerAddress"], "resources": n["Resources"]}
        for n in ray.nodes()
        if n["Alive"]
    }


def wait_for_bundle(group: Any, index: int, timeout_s: float) -> str:
    """The alive node that holds bundle ``index`` of ``group``, waiting up to ``timeout_s``
    for Ray to place it again after its node died; ``PlacementError`` naming the lost node
    when the cluster has no room for it."""
    deadline = time.monotonic() + timeout_s
    first = bundle_nodes(group)[index]
    while True:
        node = bundle_nodes(group)[index]
        if node and node in alive_nodes():
            return node
        if time.monotonic() >= deadline:
            lost = f"node {first[:8]} is gone and " if first and first != node else ""
            raise PlacementError(
                f"bundle {index}: {lost}the Ray cluster has no room to place it again within "
                f"ray.placement_timeout_s={timeout_s:g}: {_cluster_summary()}"
            )
        time.sleep(_POLL_S)


def _cluster_summary() -> str:
    """``3 alive nodes, available {CPU: 2, GPU: 0}`` for error lines."""
    import ray

    available = ray.available_resources()
    keys = sorted(
        k
        for k in available
        if not k.startswith(("node:", "memory", "object_store")) and "_group_" not in k
    )  # Ray's own per-node and per-placement-group resources left out
    shown = ", ".join(f"{k}: {available[k]:g}" for k in keys)
    return f"{len(alive_nodes())} alive nodes, available {{{shown}}}"


SHARED_MARKER = ".shared_check"


def check_shared_dir(path: Path) -> None:
    """Every node of a multi-node cluster sees ``path`` (the run directory: checkpoints,
    engine logs and the rollouter's state are written there from several nodes). The driver
    writes a marker with a fresh token; one task per alive node reads it; a node that cannot
    is named in a ``PlacementError``. Nothing to check on a single node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes()
    if len(nodes) < 2:
        return
    marker = Path(path).resolve() / SHARED_MARKER
    token = uuid.uuid4().hex
    marker.write_text(token, encoding="utf-8")
    read = ray.remote(num_cpus=0)(_read_marker)
    refs = {
        node: read.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote(str(marker))
        for node in nodes
    }
    try:
        seen = dict(zip(refs, ray.get(list(refs.values()), timeout=60), strict=True))
    finally:
        marker.unlink(missing_ok=True)
    error = unshared_dir_error(marker, token, seen, nodes)
    if error is not None:
        raise error


def unshared_dir_error(
    marker: Path, token: str, seen: Mapping[str, str | None], nodes: Mapping[str, Any]
) -> PlacementError | None:
    """The error naming the first node that did not read ``token`` from ``marker``."""
    for node, text in seen.items():
        if text != token:
            return PlacementError(
                f"the run directory {marker.parent} is not on a filesystem every node sees: "
                f"node {node[:8]} ({nodes[node]['ip']}) cannot read {marker.name} written "
                "there by the driver (put the run directory on a shared filesystem: "
                "hydra.run.dir=/shared/...)"
            )
    return None


def _read_marker(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return None


class ReadyClock:
    """When all of ``refs`` (Ray refs that end once a role is up) ended, seen from a thread:
    a caller blocked in starting another role meanwhile still learns when this one came up.
    A ref that failed counts as ended; the role's own wait raises its error."""

    def __init__(self, refs: list[Any]) -> None:
        self._ended_at: float | None = None
        self._thread = threading.Thread(target=self._watch, args=(refs,), daemon=True)
        self._thread.start()

    def _watch(self, refs: list[Any]) -> None:
        import ray

        ray.wait(refs, num_returns=len(refs), timeout=None)
        self._ended_at = time.perf_counter()

    def ended_at(self, timeout_s: float = 5.0) -> float:
        """``time.perf_counter()`` when the refs ended; call once the role's own wait
        returned (then the watcher ends at once; ``timeout_s`` bounds it all the same, and
        past it the time is now)."""
        self._thread.join(timeout_s)
        return time.perf_counter() if self._ended_at is None else self._ended_at


def on_driver_node() -> Any:
    """Scheduling for the run's coordinating actors (the rollouter, the message queue):
    beside the driver, whose node lives as long as the run, rather than wherever Ray finds
    room (an engine node may leave the cluster)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def wait_started(
    starts: Mapping[str, list[Any]], on_failure: Mapping[str, Callable[[], object]]
) -> dict[str, float]:
    """Wait for roles that start side by side: ``starts`` maps a role to the Ray refs that
    end once it is up (an engine start, each trainer rank's ``__ray_ready__``). Returns when
    each role was up (``time.perf_counter()``). The first ref that fails is raised at once,
    without waiting for the other roles: through ``on_failure[role]()`` where given (the
    role's own wait, which cleans up and raises its error), else as Ray raises it."""
    import ray

    role_of = {ref: role for role, refs in starts.items() for ref in refs}
    left = {role: len(refs) for role, refs in starts.items()}
    ended_at = {role: time.perf_counter() for role, count in left.items() if count == 0}
    pending = list(role_of)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        role = role_of[done[0]]
        try:
            ray.get(done[0])
        except Exception:
            if role in on_failure:
                on_failure[role]()
            raise
        left[role] -= 1
        if left[role] == 0:
            ended_at[role] = time.perf_counter()
    return ended_at
