"""Facts about the process's host that the transports and the backend choice need.

Where shared memory lives (``shm_dir``), how peers on other hosts reach this one (``node_ip``, from
``recipe.utils.rendezvous``),
which processes can share memory (``host_id``) and how much memory is free; ``EndpointSite``
bundles them for one endpoint (what ``checkpoint_engine.backend=auto`` decides from). No
torch collectives and no engine state here: every transport and the synchronizer read these.
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import torch

from recipe.utils.rendezvous import node_ip


def shm_dir() -> str:
    """/dev/shm when usable (RAM-backed on Linux), else the temp dir (still mmap-shared)."""
    override = os.environ.get("RECIPE_SHM_DIR", "")
    if override:
        return override
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of ``device`` (host: MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # not Linux: fall back to the POSIX count
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


NODE_ID_ENV = "RECIPE_RAY_NODE_ID"
"""Set by a Ray actor for the processes it spawns (vLLM's engine core and workers are not
Ray workers and cannot ask Ray which node they are on)."""


def ray_node_id() -> str | None:
    """The Ray node this process runs on: Ray's own answer in a Ray worker or driver, else
    what the Ray actor that spawned it exported (``export_node_id``); None outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except ImportError:  # Ray is optional for in-process use
        pass
    return os.environ.get(NODE_ID_ENV) or None


def export_node_id() -> None:
    """Let the processes this Ray actor spawns from now on know its node (``ray_node_id``)."""
    node = ray_node_id()
    if node is not None:
        os.environ[NODE_ID_ENV] = node


def host_id() -> str:
    """Which processes can share memory: the Ray node id under Ray (two Ray nodes are two
    hosts to us even when they share a machine, as in a test cluster), else the machine's
    identity (hostname + boot id). Not an IP string: several nodes can share one address,
    and one host can have several."""
    node = ray_node_id()
    if node is not None:
        return f"ray-node/{node}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
    except OSError:  # not Linux
        boot_id = ""
    return f"{socket.gethostname()}/{boot_id}"


@dataclass(frozen=True, slots=True)
class EndpointSite:
    """Where one end of a weight push runs (travels as a plain dict: vLLM's
    ``collective_rpc`` carries nothing else intact)."""

    host: str
    """``host_id()``: equal exactly for processes that can share memory (same Ray node)."""
    ip: str
    """``node_ip()``: the address peers on other hosts reach."""
    pid: int
    device: str
    """The torch device the weights live on (``cpu``, ``cuda:0``)."""
    device_uuid: str | None
    """The CUDA device's UUID (None on CPU): equal for endpoints on one GPU."""
    free_bytes: int
    """Free memory of ``device`` (host: MemAvailable), for auto-sized buckets."""
    local_rank: int = 0
    """The engine worker's rank within its replica (receivers; the sender's is 0)."""

    @classmethod
    def here(cls, device: torch.device, *, local_rank: int = 0) -> EndpointSite:
        """This process, with its weights on ``device``."""
        cuda = device.type == "cuda"
        return cls(
            host=host_id(),
            ip=node_ip(),
            pid=os.getpid(),
            device=str(device),
            device_uuid=str(torch.cuda.get_device_properties(device).uuid) if cuda else None,
            free_bytes=free_memory_bytes(device),
            local_rank=local_rank,
        )

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> EndpointSite:
        return cls(
            host=str(wire["host"]),
            ip=str(wire["ip"]),
            pid=int(wire["pid"]),
            device=str(wire["device"]),
            device_uuid=wire["device_uuid"],
            free_bytes=int(wire["free_bytes"]),
            local_rank=int(wire.get("local_rank", 0)),
        )
