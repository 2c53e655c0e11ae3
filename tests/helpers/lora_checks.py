"""Checks of a real LoRA run's adapter-only pushes, shared by the LoRA integration tests."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.runs import read_metrics
from tests.helpers.trace_checks import load_checked, slices


def check_adapter_pushes(run_dir: Path, model_bytes: int, *, ahead: bool) -> int:
    """Every push of the run moved the adapter alone (``sync/backend/adapter``, its bytes under
    a fifth of the model's ``model_bytes``), every replica's probe saw the adapter and not the
    base, and read back the pushed tensors; then each push's folder was written (transfer) and
    checked by every replica (verify) before its pause where the engines serve while a push
    stages (``ahead``: fully_async), after it elsewhere. Returns how many pushes there were."""
    pushes = [r for r in read_metrics(run_dir) if "sync/bytes" in r]
    assert pushes, "no push recorded"
    for record in pushes:
        assert record["sync/backend/adapter"] == 1.0
        assert 0 < record["sync/bytes"] < model_bytes / 5
        assert record["sync/adapter_probe_diff"] > 0
        assert record["sync/adapter_readback_s"] > 0
    events = load_checked(run_dir)
    pauses, transfers, verifies = (slices(events, n) for n in ("pause", "transfer", "verify"))
    assert len(pauses) == len(transfers) == len(verifies) == len(pushes)
    for pause, transfer, verify in zip(pauses, transfers, verifies, strict=True):
        if ahead:
            assert transfer["ts"] + transfer["dur"] <= verify["ts"] <= pause["ts"] - verify["dur"]
        else:
            assert pause["ts"] <= transfer["ts"] <= verify["ts"]
    return len(pushes)
