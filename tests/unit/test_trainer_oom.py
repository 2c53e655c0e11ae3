"""A trainer rank out of GPU memory ends the run with one line naming the knobs to lower
(``recipe.workers.trainer.out_of_memory``, ``recipe.faults.TrainerOutOfMemoryError``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ray.exceptions import RayTaskError

from recipe.faults import RunFailure, TrainerOutOfMemoryError, fails_cleanly
from recipe.observability.config import LoggerConfig
from recipe.observability.tracking import Tracker
from recipe.workers.config import ActorConfig
from recipe.workers.trainer.fsdp_utils import decoder_layers
from recipe.workers.trainer.out_of_memory import reports_out_of_memory
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.worker import TrainerWorker
from tests.helpers.batches import random_train_batch

GIB, MIB = 1024**3, 1024**2
# The H100 of the report: trainer and engines (rollout.gpu_memory_utilization=0.5) on one GPU.
SHARED_GPU = (int(544.56 * MIB), int(79.18 * GIB), int((35.34 + 1.48) * GIB))
OWN_GPU = (int(2 * GIB), int(79.18 * GIB), int(76.5 * GIB))
REPORTED_LINE = (
    "trainer rank 0 ran out of GPU memory in update_actor (36.8 GiB held by its PyTorch "
    "allocator, 0.5 GiB free of 79.2 GiB; the remaining 41.8 GiB is held by other processes, "
    "e.g. the engines at rollout.gpu_memory_utilization): lower actor.ppo_max_token_len_per_gpu "
    "(now 16384), set actor.gradient_checkpointing=true, or lower rollout.gpu_memory_utilization"
)


def _gpu(monkeypatch, figures: tuple[int, int, int]) -> None:
    """Make the current GPU read ``(free, total, reserved by this process)`` bytes."""
    free_bytes, total_bytes, reserved_bytes = figures
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_: (free_bytes, total_bytes))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *_: reserved_bytes)


def _out_of_memory(*_args, **_kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 594.00 MiB.")


class FakeRank:
    """What the decorator needs of a ``TrainerWorker``: its rank and ``actor.*`` config."""

    def __init__(self, actor: ActorConfig, rank: int = 0) -> None:
        self.actor, self.rank = actor, rank

    @reports_out_of_memory("update_actor")
    def update_actor(self) -> None:
        _out_of_memory()

    @reports_out_of_memory("compute_log_prob")
    def compute_log_prob(self) -> None:
        _out_of_memory()


def _fault_of(call) -> TrainerOutOfMemoryError:
    with pytest.raises(TrainerOutOfMemoryError) as caught:
        call()
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    return caught.value


# ---- the fault --------------------------------------------------------------------------


def test_an_update_out_of_memory_on_a_shared_gpu_names_the_figures_and_three_knobs(monkeypatch):
    _gpu(monkeypatch, SHARED_GPU)
    fault = _fault_of(FakeRank(ActorConfig()).update_actor)
    assert str(fault) == REPORTED_LINE
    assert (fault.rank, fault.phase) == (0, "update_actor")
    assert fault.detail.startswith("36.8 GiB held by its PyTorch allocator")


@pytest.mark.parametrize(
    ("actor", "phase", "remedy"),
    [
        (
            ActorConfig(log_prob_max_token_len_per_gpu=None),
            "compute_log_prob",
            "set actor.log_prob_max_token_len_per_gpu below its default, twice "
            "actor.ppo_max_token_len_per_gpu (32768)",
        ),
        (
            ActorConfig(log_prob_max_token_len_per_gpu=8192),
            "compute_log_prob",
            "lower actor.log_prob_max_token_len_per_gpu (now 8192)",
        ),
        (
            ActorConfig(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=8),
            "update_actor",
            "lower actor.ppo_micro_batch_size_per_gpu (now 8), "
            "or set actor.gradient_checkpointing=true",
        ),
        (
            ActorConfig(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=8),
            "compute_log_prob",
            "lower actor.ppo_micro_batch_size_per_gpu (now 8)",
        ),
        (
            ActorConfig(gradient_checkpointing=True, ppo_max_token_len_per_gpu=4096),
            "update_actor",
            "lower actor.ppo_max_token_len_per_gpu (now 4096)",
        ),
    ],
)
def test_the_knob_named_is_the_one_that_bounds_that_forward(monkeypatch, actor, phase, remedy):
    _gpu(monkeypatch, OWN_GPU)  # the GPU is the rank's own: no engine knob
    fault = _fault_of(getattr(FakeRank(actor, rank=3), phase))
    assert (fault.rank, fault.phase, fault.remedy) == (3, phase, remedy)
    assert str(fault) == (
        f"trainer rank 3 ran out of GPU memory in {phase} (76.5 GiB held by its PyTorch "
        f"allocator, 2.0 GiB free of 79.2 GiB): {remedy}"
    )


def test_figures_that_cannot_be_read_raise_no_second_error(monkeypatch):
    def broken_context(*_args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "mem_get_info", broken_context)
    fault = _fault_of(FakeRank(ActorConfig()).update_actor)
    assert fault.detail == "GPU memory figures unavailable"
    assert fault.remedy.endswith(", or lower rollout.gpu_memory_utilization")


def test_the_fault_keeps_its_fields_and_line_across_pickling(monkeypatch):
    _gpu(monkeypatch, SHARED_GPU)
    fault = _fault_of(FakeRank(ActorConfig()).update_actor)
    copy = pickle.loads(pickle.dumps(fault))
    assert type(copy) is TrainerOutOfMemoryError and str(copy) == REPORTED_LINE
    fields = ("rank", "phase", "detail", "remedy")
    assert [getattr(copy, f) for f in fields] == [getattr(fault, f) for f in fields]


# ---- ends the run -----------------------------------------------------------------------


def _as_ray_raises_it(fault: TrainerOutOfMemoryError) -> BaseException:
    """``fault`` as ``ray.get`` raises it on the driver: pickled across, then made an
    instance of its class too (``as_instanceof_cause``), its text Ray's traceback."""
    remote = RayTaskError(
        "TrainerWorker.update_actor", "Traceback (most recent call last):\n  ...", fault
    )
    return pickle.loads(pickle.dumps(remote)).as_instanceof_cause()


class Recipe:
    """A recipe whose ``fit`` (under ``fails_cleanly``) raises ``error``, with a tracker."""

    cfg = SimpleNamespace(mode="sync")

    def __init__(self, run_dir: Path, error: BaseException) -> None:
        self.run_dir, self.global_step, self.version, self.error = run_dir, 4, 4, error
        tracker = Tracker(LoggerConfig(backends=["jsonl"], quiet=True), run_dir)
        self.run = SimpleNamespace(tracker=tracker)

    @fails_cleanly
    def fit(self) -> None:
        raise self.error


@pytest.mark.parametrize("through_ray", [False, True])
def test_fails_cleanly_ends_the_run_with_the_line_and_the_resume_point(
    monkeypatch, tmp_path, through_ray
):
    _gpu(monkeypatch, SHARED_GPU)
    fault = _fault_of(FakeRank(ActorConfig()).update_actor)
    error = _as_ray_raises_it(fault) if through_ray else fault
    assert isinstance(error, TrainerOutOfMemoryError)
    recipe = Recipe(tmp_path, error)
    with pytest.raises(RunFailure) as caught:
        recipe.fit()
    recipe.run.tracker.close()
    message = str(caught.value)
    assert message.startswith(f"{REPORTED_LINE}; no checkpoint under {tmp_path / 'checkpoints'}")
    assert "\n" not in message and caught.value.__cause__ is error
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == message
    assert summary["steps"] == 4


# ---- a real TrainerWorker ---------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(tiny_model_path):
    actor = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=3)
    w = TrainerWorker(actor, TrainerSpec(str(tiny_model_path)))
    yield w
    w.close()


@pytest.mark.parametrize("phase", ["update_actor", "compute_log_prob"])
def test_a_worker_out_of_memory_in_a_forward_raises_the_fault_and_still_works(
    monkeypatch, worker, tiny_model_path, phase
):
    batch = random_train_batch(Path(tiny_model_path))
    _gpu(monkeypatch, SHARED_GPU)
    with monkeypatch.context() as patch:  # the first decoder layer's MLP runs out of memory
        patch.setattr(decoder_layers(worker._policy.lm)[0].mlp, "forward", _out_of_memory)
        with pytest.raises(TrainerOutOfMemoryError) as caught:
            getattr(worker, phase)(batch)
    assert (caught.value.rank, caught.value.phase) == (0, phase)
    assert str(caught.value).startswith(f"trainer rank 0 ran out of GPU memory in {phase} (36.8")
    logprob_bt, _ = worker.compute_log_prob(batch)  # the rank still runs (and closes)
    assert logprob_bt.shape == batch.input_ids_bt.shape
