"""Pure decisions the synchronizer makes from where its peers run (unit-tested alone).

- ``order_receivers``: global receiver ranks across data-parallel engine groups. Engine-local
  ranks (tensor-parallel workers of one replica) are unique only within their group, so each
  group is sorted by local rank and groups are concatenated in worker-group order; global
  ranks start at 1 (rank 0 is the sender).
- ``resolve_backend``: ``auto`` -> the fastest transport the placement allows; an explicit
  choice the placement cannot serve is a ``ValueError`` naming ``checkpoint_engine.backend``.
- ``resolve_bucket_bytes``: explicit MiB, or a fraction of the sender's free memory.
- ``describe_backend_choice``: the line logged when the backend is chosen (once per run,
  again only if a restart changes it).
"""

from __future__ import annotations

from collections.abc import Sequence

from recipe.checkpoint_engine.host import EndpointSite
from recipe.checkpoint_engine.transports import Placement, choose_transport

MIB = 1 << 20
MIN_AUTO_BUCKET_BYTES = 1 * MIB
MAX_AUTO_BUCKET_BYTES = 1024 * MIB


def order_receivers(groups: Sequence[Sequence[EndpointSite]]) -> list[list[list[int]]]:
    """Per group (in worker-group order), ``[[local_rank, global_rank], ...]`` sorted by
    local rank; global ranks run 1..N over the concatenation."""
    mapping: list[list[list[int]]] = []
    next_rank = 1
    for index, workers in enumerate(groups):
        local = sorted(w.local_rank for w in workers)
        if len(set(local)) != len(local):
            raise ValueError(f"rollout replica {index} reports duplicate local ranks {local}")
        if not local:
            raise ValueError(f"rollout replica {index} reports no engine workers")
        mapping.append([[rank, next_rank + i] for i, rank in enumerate(local)])
        next_rank += len(local)
    return mapping


def resolve_backend(requested: str, sender: EndpointSite, receivers: Sequence[EndpointSite]) -> str:
    """The transport for this placement (see the module docstring; the candidates and what
    each needs are the registry's, transports.py)."""
    cuda = sender.device_uuid is not None and all(r.device_uuid for r in receivers)
    placement = Placement(
        one_host=all(r.host == sender.host for r in receivers),
        cuda=cuda,
        same_gpu=cuda and all(r.device_uuid == sender.device_uuid for r in receivers),
    )
    return choose_transport(requested, placement)


def describe_backend_choice(
    backend: str, sender: EndpointSite, receivers: Sequence[EndpointSite]
) -> str:
    """``weight sync backend gloo: trainer rank 0 on host ray-node/ab12cd34, 2 receivers on
    2 other hosts``."""
    others = {r.host for r in receivers if r.host != sender.host}
    local = sum(r.host == sender.host for r in receivers)
    where = []
    if local:
        where.append(f"{local} on the same host")
    if others:
        where.append(f"{len(receivers) - local} on {len(others)} other host(s)")
    return (
        f"weight sync backend {backend}: trainer rank 0 on host {_short(sender.host)}, "
        f"{len(receivers)} receivers ({', '.join(where)})"
    )


def _short(host: str) -> str:
    prefix, _, rest = host.rpartition("/")
    return f"{prefix}/{rest[:8]}" if prefix else host


def resolve_bucket_bytes(
    bucket_size_mb: int, memory_fraction: float, free_bytes: int, model_bytes: int
) -> int:
    """Explicit ``bucket_size_mb``, else ``memory_fraction`` of free memory clamped to
    [1 MiB, 1 GiB]; never larger than the model (rounded up to a MiB)."""
    if bucket_size_mb > 0:
        wanted = bucket_size_mb * MIB
    else:
        wanted = int(free_bytes * memory_fraction)
        wanted = min(max(wanted, MIN_AUTO_BUCKET_BYTES), MAX_AUTO_BUCKET_BYTES)
    model_cap = -(-max(model_bytes, 1) // MIB) * MIB
    return min(wanted, model_cap)
