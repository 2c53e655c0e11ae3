"""The weight-transport registry (recipe/checkpoint_engine/transports.py): a transport added
by one registry line and one engine file goes through the real seam (the config check, the
placement's fits check, the factory, a push through its engine), and a bad name is one
``error:`` line with exit code 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from recipe.checkpoint_engine import transports
from recipe.checkpoint_engine.base import TransferPlan
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.checkpoint_engine.factory import make_checkpoint_engine
from recipe.checkpoint_engine.host import EndpointSite
from recipe.checkpoint_engine.layout import PAGE_BYTES, BucketLayout
from recipe.checkpoint_engine.placement import resolve_backend
from recipe.checkpoint_engine.transports import BUCKETS, Transport
from recipe.utils.config_check import ConfigError

REPO = Path(__file__).resolve().parents[2]

ENGINE_FILE = """
from recipe.checkpoint_engine.shared_region import SharedRegionEngine

class LoopbackEngine(SharedRegionEngine):
    sent = 0

    def send(self, tensors, transfer_id):
        type(self).sent += 1
        return super().send(tensors, transfer_id)
"""


def _site(host: str) -> EndpointSite:
    return EndpointSite(
        host=host,
        ip="127.0.0.1",
        pid=1,
        device="cpu",
        device_uuid=None,
        free_bytes=1 << 30,
        local_rank=0,
    )


@pytest.fixture
def loopback(tmp_path, monkeypatch) -> Transport:
    """A new transport: one registry line, its engine in a new file."""
    engine_file = tmp_path / "loopback.py"
    engine_file.write_text(textwrap.dedent(ENGINE_FILE))
    line = Transport(
        "loopback", BUCKETS, f"{engine_file}:LoopbackEngine", lambda p: p.one_host, "one host"
    )
    monkeypatch.setattr(transports, "TRANSPORTS", (*transports.TRANSPORTS, line))
    return line


def test_a_registered_transport_is_a_config_choice_that_fits_builds_and_pushes(loopback):
    with pytest.raises(ConfigError, match=r"checkpoint_engine\.backend='nope'"):
        CheckpointEngineConfig(backend="nope")
    cfg = CheckpointEngineConfig(backend="loopback")  # the config check reads the registry
    here = _site("ray-node/a")
    assert resolve_backend(cfg.backend, here, [here]) == "loopback"
    with pytest.raises(ValueError, match="'loopback' does not fit this placement: it needs one"):
        resolve_backend(cfg.backend, here, [_site("ray-node/b")])
    assert resolve_backend("auto", here, [here]) == "shm"  # not an ``auto`` candidate

    weights = {"w": torch.arange(3000, dtype=torch.float32), "b": torch.ones(7)}
    metadata = [
        (n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in weights.items()
    ]
    layout = BucketLayout.build(metadata, PAGE_BYTES)
    plan = TransferPlan(cfg.backend, layout, num_receivers=1, timeout_s=10.0)
    sender, receiver = (
        make_checkpoint_engine(plan, rank=r, device=torch.device("cpu")) for r in (0, 1)
    )
    assert type(sender).__name__ == "LoopbackEngine"
    try:
        info = sender.prepare()
        receiver.prepare()
        receiver.init(info)
        sender.init(info)
        sent = sender.send(weights.items(), 1)
        assert receiver.receive(1).checksums == sent.checksums
        staged = dict(receiver.staged_tensors())
        assert all(torch.equal(staged[n], t) for n, t in weights.items())
        assert type(sender).sent == 1
    finally:
        receiver.finalize()
        sender.finalize()


def test_the_config_choices_are_the_registry_lines():
    names = [t.name for t in transports.TRANSPORTS if t.configurable]
    assert transports.backend_choices() == ("auto", *names)
    assert "adapter" not in names  # chosen by actor.lora, never by checkpoint_engine.backend
    assert transports.engine_backends() == ("cuda_ipc", "nccl", "shm", "gloo")


def test_cli_unknown_backend_exits_2_with_one_line_listing_the_registry(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipe",
            "checkpoint_engine.backend=bogus",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    error_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    allowed = ", ".join(repr(c) for c in transports.backend_choices())
    assert error_lines == [
        f"error: checkpoint_engine.backend='bogus' is invalid: allowed one of {allowed}"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
