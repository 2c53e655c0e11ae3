"""Config schema of the weight-sync link between trainer and rollout engines
(``checkpoint_engine.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from recipe.checkpoint_engine.transports import backend_choices
from recipe.utils.config_check import (
    require,
    require_choice,
    require_fraction,
    require_non_negative,
    require_positive,
)

ON_FAILURE = ("stop", "retry")


@dataclass
class CheckpointEngineConfig:
    backend: str = "auto"
    """Transport: ``auto`` picks the fastest available for the placement (shm on one CPU host,
    cuda_ipc colocated on one GPU, nccl across GPUs); ``file`` writes a safetensors file. The
    choices are the registry's (recipe/checkpoint_engine/transports.py)."""
    bucket_size_mb: int = 0
    """Bucket size in MiB; 0 sizes it from free memory."""
    bucket_memory_fraction: float = 0.05
    """With ``bucket_size_mb=0``: a bucket is this fraction of the sender device's free memory
    (clamped to [1 MiB, 1 GiB] and to the model size)."""
    timeout_s: float = 120.0
    """Deadline of every sync phase; a peer that misses it fails the sync with the phase named."""
    verify: bool = True
    """Compare per-bucket checksums on both sides after each push."""
    release_buffers: bool = False
    """Free staging buffers and process groups after every sync (less resident memory, a
    rebuild per sync); for colocated runs where memory is tight."""
    on_failure: str = "stop"
    """A failed or timed-out push (engines keep the old version): ``stop`` ends the
    run cleanly, naming the phase; ``retry`` rebuilds the transport and pushes again, up to
    ``max_retries`` times, then stops. A push cut by a rollout worker that died is retried
    after its restart either way (``rollout.max_restarts``)."""
    max_retries: int = 2
    """Pushes retried per sync with ``on_failure=retry``."""

    def __post_init__(self) -> None:
        require_choice("checkpoint_engine.backend", self.backend, backend_choices())
        require(
            self.bucket_size_mb >= 0,
            "checkpoint_engine.bucket_size_mb",
            self.bucket_size_mb,
            "0 (auto) or a size in MiB > 0",
        )
        require_fraction("checkpoint_engine.bucket_memory_fraction", self.bucket_memory_fraction)
        require_positive("checkpoint_engine.timeout_s", self.timeout_s)
        require_choice("checkpoint_engine.on_failure", self.on_failure, ON_FAILURE)
        require_non_negative("checkpoint_engine.max_retries", self.max_retries)
