"""``python -m recipe.tools.bench.engine_push`` and vLLM's pickle switch: set only by the bench's
entrypoint, only when vLLM's own methods run, and restored after (no vLLM is started here:
the engine and the run are fakes that record the environment they saw)."""

from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from recipe.tools.bench import engine_push

KEY = "VLLM_ALLOW_INSECURE_SERIALIZATION"


@pytest.fixture(autouse=True)
def _key_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # setenv first so that the key's absence is what monkeypatch restores after the test.
    monkeypatch.setenv(KEY, "unset by the fixture")
    monkeypatch.delenv(KEY)


def test_building_the_engine_leaves_the_process_environment_alone(monkeypatch, tmp_path):
    seen: list[str | None] = []
    fake_vllm = types.ModuleType("vllm")
    fake_vllm.LLM = lambda **kwargs: seen.append(os.environ.get(KEY))
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    args = argparse.Namespace(device="cpu", gpu_memory_utilization=0.3)
    engine_push.build_engine(Path(tmp_path), args)
    assert seen == [None] and KEY not in os.environ


@pytest.mark.parametrize(
    ("argv", "during"),
    [
        (["--methods", "vllm_ipc,ours"], "1"),
        (["--methods", "ours,ours_noverify"], None),
        (["--device", "cpu", "--methods", "ours"], None),
    ],
)
def test_the_entrypoint_allows_pickle_only_for_vllms_methods_and_only_while_they_run(
    monkeypatch, capsys, argv, during
):
    seen: list[str | None] = []

    def fake_run(args: argparse.Namespace) -> list[dict[str, object]]:
        seen.append(os.environ.get(KEY))
        return []

    monkeypatch.setattr(engine_push, "run", fake_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    engine_push.main(argv)
    assert seen == [during] and KEY not in os.environ
    capsys.readouterr()


def test_a_value_the_user_set_is_back_after_the_run(monkeypatch):
    monkeypatch.setenv(KEY, "0")
    with engine_push.pickle_over_vllm_rpc(True):
        assert os.environ[KEY] == "1"
    assert os.environ[KEY] == "0"
