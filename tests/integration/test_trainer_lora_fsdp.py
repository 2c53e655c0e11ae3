"""LoRA (``actor.lora``) on real Ray trainer ranks: FSDP2 at world size 2 shards the frozen base
and the adapter together and computes the same adapter update as world size 1; the adapter
exported by the sharded ranks (gathered on rank 0) is that update, the CPU slot holds the
adapter that was pushed, and a checkpoint of the sharded ranks restores the adapter and its
optimizer. Tolerances as in test_trainer_fsdp.py (float32 reassociation only)."""

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recipe.utils.adapter_file import verify_adapter_folder
from recipe.workers.config import ActorConfig, LoraConfig
from recipe.workers.trainer.ranks import TrainerRanks
from recipe.workers.trainer.spec import TrainerSpec
from tests.helpers.batches import random_train_batch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

LR = 1e-3


@pytest.fixture(scope="module")
def model_dir(tiny_model_path):
    return Path(tiny_model_path)


def run_lora_update(model_dir, world_size, batch, out: Path):
    """Log-probs before, metrics of one update, the adapter after (exported by the ranks);
    on the way, the slot and a checkpoint round trip of this world size."""
    actor = ActorConfig(
        lr=LR,
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=2,
        lora=LoraConfig(rank=8, alpha=16),
    )
    group = TrainerRanks(actor, TrainerSpec(str(model_dir)), world_size=world_size, use_gpu=False)
    try:
        logprob_bt, _ = group.compute_log_prob(batch)
        group.save_model_to_cpu("pushed")
        initial = group.export_adapter(out / "initial")
        gen = torch.Generator().manual_seed(1)
        noise_bt = 0.3 * (torch.randint(0, 2, logprob_bt.shape, generator=gen) * 2 - 1)
        rollout_bt = (logprob_bt + noise_bt) * batch.response_mask_bt
        metrics = group.update_actor(dataclasses.replace(batch, rollout_logprobs_bt=rollout_bt))
        trained = group.export_adapter(out / "trained")
        verify_adapter_folder(trained)
        # The slot holds the adapter that was pushed: its log-probs are the ones before.
        slot = group.export_adapter(out / "slot", slot="pushed")
        assert slot.sha256 == initial.sha256
        slot_bt = group.compute_log_prob(batch, slot="pushed")[0]
        torch.testing.assert_close(slot_bt, logprob_bt, rtol=1e-6, atol=1e-5)
        # A checkpoint of these ranks puts the adapter back over another one.
        group.save_hf(out / "ckpt")
        group.save_train_state(out / "ckpt" / "run_state")
        group.update_actor(dataclasses.replace(batch, rollout_logprobs_bt=rollout_bt))
        group.load_hf(out / "ckpt")
        group.load_train_state(out / "ckpt" / "run_state")
        assert group.export_adapter(out / "reloaded").sha256 == trained.sha256
        return logprob_bt, metrics, load_file(trained.weights_path)
    finally:
        group.shutdown()


def test_world_size_two_trains_the_same_adapter_as_world_size_one(model_dir, tmp_path):
    batch = random_train_batch(model_dir, num_prompts=4)
    logprob_1, metrics_1, adapter_1 = run_lora_update(model_dir, 1, batch, tmp_path / "ws1")
    logprob_2, metrics_2, adapter_2 = run_lora_update(model_dir, 2, batch, tmp_path / "ws2")
    torch.testing.assert_close(logprob_2, logprob_1, rtol=1e-5, atol=1e-5)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert metrics_2[key] == pytest.approx(metrics_1[key], rel=1e-5, abs=1e-7), key
    assert adapter_1.keys() == adapter_2.keys()
    assert all(k.startswith("base_model.model.") for k in adapter_1)
    for name, tensor in adapter_1.items():
        torch.testing.assert_close(adapter_2[name], tensor, rtol=0, atol=LR / 10)
    moved = max(t.abs().max().item() for k, t in adapter_1.items() if ".lora_B." in k)
    assert moved > LR / 2  # lora_B starts at zero: the update moved it
