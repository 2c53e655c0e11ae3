"""LoRA on a world-size-1 TrainerWorker (in-process, gloo, the tiny model): only the adapter
trains and holds optimizer state, the exported PEFT folder is the trained policy for
``peft.PeftModel``, a checkpoint resumes it, and a resume onto another base is refused."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from recipe.utils.adapter_file import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from recipe.workers.config import ActorConfig, LoraConfig
from recipe.workers.trainer.fsdp_utils import PolicyModule, iter_full_tensors, reshard_all
from recipe.workers.trainer.lora import is_adapter_name
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.worker import TrainerWorker
from tests.helpers.batches import random_train_batch

pytest.importorskip("peft")

LORA = LoraConfig(rank=8, alpha=16)


@pytest.fixture(scope="module")
def model_dir(tiny_model_path):
    return Path(tiny_model_path)


def _worker(model_path: Path | str, compute_dtype: str = "float32") -> TrainerWorker:
    actor = ActorConfig(lr=1e-2, ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=6, lora=LORA)
    spec = TrainerSpec(str(model_path), total_optimizer_steps=4, compute_dtype=compute_dtype)
    return TrainerWorker(actor, spec)


def _train(worker: TrainerWorker, batch) -> dict[str, float]:
    logprob_bt = worker.compute_log_prob(batch)[0]
    # Rollout log-probs off by +0.3 so that the update has a gradient to follow.
    rollout_bt = (logprob_bt + 0.3) * batch.response_mask_bt
    return worker.update_actor(dataclasses.replace(batch, rollout_logprobs_bt=rollout_bt))


def _live_params(worker: TrainerWorker) -> dict[str, torch.Tensor]:
    """Base and adapter tensors under their live names (``iter_full_params`` merges them)."""
    reshard_all(worker._policy)
    return {name: t.clone() for name, t in iter_full_tensors(worker._policy.lm)}


def test_only_the_adapter_trains_and_holds_optimizer_state(model_dir):
    worker = _worker(model_dir)
    try:
        batch = random_train_batch(model_dir, seed=1)
        before = _live_params(worker)
        adapters = {n for n in before if is_adapter_name(n)}
        assert adapters and len(adapters) < len(before)
        _train(worker, batch)
        after = _live_params(worker)
        changed = {n for n in before if not torch.equal(before[n], after[n])}
        assert changed <= adapters  # the frozen base never moves
        # lora_B starts at zero (the adapted model is the base), so B moves first.
        assert {n for n in adapters if ".lora_B." in n} <= changed
        optimizer_params = [p for g in worker._optimizer.param_groups for p in g["params"]]
        trainable = [p for p in worker._policy.parameters() if p.requires_grad]
        assert len(optimizer_params) == len(adapters) == len(trainable)
        assert len(worker._optimizer.state) == len(adapters)
    finally:
        worker.close()


def test_the_exported_folder_is_the_trained_policy_for_peft(model_dir, tmp_path):
    import peft
    from transformers import AutoModelForCausalLM

    worker = _worker(model_dir)
    try:
        batch = random_train_batch(model_dir, seed=2)
        _train(worker, batch)
        _train(worker, batch)
        trained_bt = worker.compute_log_prob(batch, with_entropy=False)[0]
        base_bt = _plain_logprobs(AutoModelForCausalLM.from_pretrained(model_dir), batch)
        record = worker.export_adapter(str(tmp_path / "adapter"))
        merged = worker.full_state_dict()  # what a full-weights push sends: the merged policy
        metadata = worker.weight_metadata()
    finally:
        worker.close()
    assert record is not None and record.rank == LORA.rank
    assert sorted(p.name for p in Path(record.path).iterdir()) == [
        ADAPTER_CONFIG_NAME,
        ADAPTER_WEIGHTS_NAME,
    ]
    assert not (tmp_path / "adapter.partial").exists()
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    served = peft.PeftModel.from_pretrained(base, record.path).merge_and_unload()
    served_bt = _plain_logprobs(served, batch)
    mask = batch.response_mask_bt.bool()
    mask[:, 0] = False
    torch.testing.assert_close(served_bt[mask], trained_bt[mask], rtol=1e-5, atol=1e-5)
    assert (served_bt[mask] - base_bt[mask]).abs().max() > 1e-3  # the adapter did something
    assert [(n, tuple(t.shape)) for n, t in merged.items()] == [(n, s) for n, s, _ in metadata]
    assert merged.keys() == served.state_dict().keys() - {"lm_head.weight"}  # tied: sent once
    base.load_state_dict(merged, strict=False)  # the merged push, loaded as an engine would
    torch.testing.assert_close(_plain_logprobs(base, batch)[mask], trained_bt[mask])


def test_a_push_sends_the_adapter_in_the_engines_dtype_and_a_checkpoint_keeps_float32(
    model_dir, tmp_path
):
    """A bfloat16 engine casts an adapter to bfloat16 on load: the push sends it so (half
    the bytes, the same served weights); the checkpoint keeps the float32 master weights."""
    from safetensors import safe_open

    worker = _worker(model_dir, compute_dtype="bfloat16")
    try:
        _train(worker, random_train_batch(model_dir, seed=3))
        master = worker.adapter_state_dict()
        pushed = worker.export_adapter(str(tmp_path / "push"))
        worker.save_hf(tmp_path / "ckpt")
    finally:
        worker.close()
    assert pushed is not None
    assert pushed.num_bytes * 2 == sum(t.numel() * t.element_size() for t in master.values())
    with safe_open(pushed.weights_path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            assert torch.equal(f.get_tensor(name), master[name].to(torch.bfloat16)), name
    saved = next((tmp_path / "ckpt").rglob(ADAPTER_WEIGHTS_NAME))
    with safe_open(str(saved), framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            assert torch.equal(f.get_tensor(name), master[name]), name


def _other_base(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the base with one weight changed: another base of the same shape."""
    from safetensors.torch import load_file, save_file

    other_base = tmp_path / "other_base"
    shutil.copytree(model_dir, other_base)
    weights = next(other_base.glob("*.safetensors"))
    tensors = load_file(weights)
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    return other_base


def _plain_logprobs(lm: torch.nn.Module, batch) -> torch.Tensor:
    with torch.no_grad():
        logprob_bt, _ = PolicyModule(lm.float().eval())(
            batch.input_ids_bt,
            batch.attention_mask_bt,
            batch.position_ids_bt,
            batch.response_mask_bt,
            chunk_size=64,
            with_entropy=False,
        )
    return logprob_bt


def test_a_checkpoint_resumes_the_adapter_and_refuses_another_base(model_dir, tmp_path):
    first, second = random_train_batch(model_dir, seed=3), random_train_batch(model_dir, seed=4)
    original = _worker(model_dir)
    try:
        _train(original, first)
        ckpt = tmp_path / "step_1"
        original.save_hf(ckpt)
        original.save_train_state(ckpt / "run_state")
        assert sorted(p.name for p in ckpt.iterdir()) == ["adapter", "base_model.json", "run_state"]
        metrics = _train(original, second)
        expected = _live_params(original)

        resumed = _worker(model_dir)
        resumed.load_hf(ckpt)
        resumed.load_train_state(ckpt / "run_state")
        resumed_metrics = _train(resumed, second)
        got = _live_params(resumed)
        assert resumed_metrics["actor/pg_loss"] == pytest.approx(metrics["actor/pg_loss"])
        for name, tensor in expected.items():
            torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=1e-7)

        other_base = _other_base(model_dir, tmp_path)
        stranger = _worker(other_base)
        with pytest.raises(ValueError, match=r"adapter of the base .* not of model\.path="):
            stranger.load_hf(ckpt)
    finally:
        original.close()


def test_python_m_recipe_export_writes_the_adapter_and_the_merged_model(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from recipe.tools.export import main as export

    batch = random_train_batch(model_dir, seed=5)
    worker = _worker(model_dir)
    try:
        _train(worker, batch)
        trained_bt = worker.compute_log_prob(batch, with_entropy=False)[0]
        ckpt = tmp_path / "step_1"
        worker.save_hf(ckpt)
    finally:
        worker.close()
    assert export([str(ckpt), "--adapter", str(tmp_path / "adapter")]) == 0
    assert (tmp_path / "adapter" / ADAPTER_WEIGHTS_NAME).is_file()
    assert export([str(ckpt), "--merged", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    mask = batch.response_mask_bt.bool()
    mask[:, 0] = False
    torch.testing.assert_close(_plain_logprobs(merged, batch)[mask], trained_bt[mask])
    # Bad input: one line, exit code 2.
    assert export([str(ckpt), "--merged", str(tmp_path / "merged")]) == 2  # exists
    assert export([str(model_dir), "--adapter", str(tmp_path / "a2")]) == 2  # no adapter
    assert export([str(tmp_path / "nowhere"), "--adapter", str(tmp_path / "a3")]) == 2


def test_a_run_refuses_at_startup_to_resume_a_checkpoint_of_another_kind_or_base(
    model_dir, tmp_path
):
    import json

    from recipe.checkpoint.store import write_checkpoint
    from recipe.config import load_config
    from recipe.protocol import PromptRecord
    from recipe.run.checkpointing import RunCheckpointer
    from recipe.workers.trainer.lora import BASE_RECORD_NAME, base_record

    prompts = [PromptRecord(f"train:p{i}", "1+1=", "2", "arithmetic") for i in range(4)]
    other_base = _other_base(model_dir, tmp_path)

    def checkpoint(run_dir: Path, base: Path | None) -> Path:
        def fill(partial: Path) -> None:
            state = {"mode": "fully_async", "num_train_prompts": 4, "global_step": 2}
            (partial / "trainer_state.json").write_text(json.dumps(state | {"param_version": 2}))
            if base is not None:
                (partial / BASE_RECORD_NAME).write_text(json.dumps(base_record(str(base))))

        return write_checkpoint(run_dir, 2, 2, fill)

    def resume(run_dir: Path, ckpt: Path, rank: int, base: Path) -> RunCheckpointer:
        cfg = load_config(
            {
                "mode": "fully_async",
                "model": {"path": str(base)},
                "actor": {"lora": {"rank": rank}},
                "trainer": {"resume_mode": str(ckpt)},
            }
        )
        return RunCheckpointer(cfg, run_dir, train=prompts, val=[])

    lora_ckpt = checkpoint(tmp_path / "lora_run", model_dir)
    assert resume(tmp_path / "lora_run", lora_ckpt, 8, model_dir).resume_from == lora_ckpt
    with pytest.raises(ValueError, match=r"holds a LoRA adapter but this run has actor\.lora"):
        resume(tmp_path / "lora_run", lora_ckpt, 0, model_dir)
    with pytest.raises(ValueError, match=rf"base {model_dir} .*not of model\.path={other_base}"):
        resume(tmp_path / "lora_run", lora_ckpt, 8, other_base)
    full_ckpt = checkpoint(tmp_path / "full_run", None)
    with pytest.raises(ValueError, match=r"holds the whole model but this run has actor\.lora"):
        resume(tmp_path / "full_run", full_ckpt, 8, model_dir)


def test_adapter_dropout_acts_in_training_forwards_only(model_dir):
    from recipe.workers.trainer.lora import adapter_dropout

    actor = ActorConfig(lr=1e-2, ppo_mini_batch_size=3, lora=dataclasses.replace(LORA, dropout=0.5))
    worker = TrainerWorker(actor, TrainerSpec(str(model_dir)))
    try:
        batch = random_train_batch(model_dir, seed=6)
        _train(worker, batch)  # lora_B no longer zero: the adapter's input matters
        old_a, old_b = (worker.compute_log_prob(batch, with_entropy=False)[0] for _ in "ab")
        assert torch.equal(old_a, old_b)  # old log-probs: a deterministic function
        with adapter_dropout(worker._policy.lm):
            train_a, train_b = (worker.compute_log_prob(batch, with_entropy=False)[0] for _ in "ab")
        assert not torch.equal(train_a, train_b)
    finally:
        worker.close()
