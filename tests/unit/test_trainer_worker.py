"""TrainBatch packing / sharding and a world-size-1 TrainerWorker driven in-process (gloo)."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from recipe.algo.losses import ppo_clip_loss
from recipe.workers.config import ActorConfig
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.fsdp_utils import lr_factor
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.worker import TrainerWorker
from tests.helpers.batches import random_train_batch, random_trajectories

METRIC_KEYS = {
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/lr",
    "actor/entropy",
    "actor/ppo_kl",
    "actor/clipfrac",
    "actor/optimizer_steps",
    "actor/skipped_steps",
}


@pytest.fixture(scope="module")
def model_dir(tiny_model_path):
    return Path(tiny_model_path)


@pytest.fixture(scope="module")
def worker(model_dir):
    # A small lr keeps one update in the linear regime: Adam's first step moves every weight by
    # ~lr whatever its gradient, which overshoots on the warm-started model at lr >= 1e-4.
    actor = ActorConfig(
        lr=1e-5, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=3, logprob_chunk_size=4
    )
    w = TrainerWorker(actor, TrainerSpec(str(model_dir)))
    yield w
    w.close()


# ---- TrainBatch -------------------------------------------------------------------------


def test_train_batch_aligns_values_with_the_token_they_score():
    trajs = random_trajectories(50, num_prompts=1, n=2)
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=7)
    row1 = trajs[1]
    prompt_len, resp_len = len(row1.prompt_ids), len(row1.response_ids)
    assert batch.seq_len == prompt_len + resp_len
    assert batch.input_ids_bt[1].tolist() == row1.prompt_ids + row1.response_ids
    assert batch.response_mask_bt[1].nonzero().flatten().tolist() == list(
        range(prompt_len, prompt_len + resp_len)
    )
    torch.testing.assert_close(
        batch.rollout_logprobs_bt[1, prompt_len:], torch.tensor(row1.rollout_logprobs)
    )
    row0_len = len(trajs[0].prompt_ids) + len(trajs[0].response_ids)
    assert batch.input_ids_bt[0, row0_len:].eq(7).all()
    assert batch.attention_mask_bt[0].sum() == row0_len
    assert batch.group_index_b.tolist() == [0, 0]


def test_an_env_error_episode_has_no_trained_tokens_and_does_not_count():
    trajs = random_trajectories(50, num_prompts=1, n=3)
    assert TrainBatch.from_trajectories(trajs, pad_token_id=7).counted_b is None
    trajs[1] = dataclasses.replace(trajs[1], finish_reason="env_error")
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=7)
    assert batch.counted_b.tolist() == [True, False, True]
    assert batch.response_mask_bt.sum(dim=1).tolist() == [2, 0, 6]
    assert batch.select([1, 2]).counted_b.tolist() == [False, True]


def test_shard_interleaves_mini_batches_so_every_rank_gets_its_slice_of_each():
    trajs = random_trajectories(50, num_prompts=4, n=2)
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=0)
    # mini-batches {g0, g1}, {g2, g3}: rank 0 gets g0 and g2, rank 1 gets g1 and g3
    assert batch.shard_rows(0, 2, groups_per_mini_batch=2) == [0, 1, 4, 5]
    assert batch.shard_rows(1, 2, groups_per_mini_batch=2) == [2, 3, 6, 7]
    assert batch.shard_rows(1, 2) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="cannot be split evenly"):
        batch.shard_rows(0, 3)
    assert [b.batch_size for b in batch.split_groups(3)] == [6, 2]
    assert [b.batch_size for b in batch.split(3)] == [3, 3, 2]


# ---- TrainerWorker ----------------------------------------------------------------------


def test_log_probs_match_a_plain_hf_forward(worker, model_dir):
    from transformers import AutoModelForCausalLM

    batch = random_train_batch(model_dir)
    logprob_bt, entropy_bt = worker.compute_log_prob(batch)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = lm(
            input_ids=batch.input_ids_bt,
            attention_mask=batch.attention_mask_bt,
            position_ids=batch.position_ids_bt,
        ).logits
    logp_all = logits[:, :-1].log_softmax(-1)
    expected_bt = torch.zeros_like(logprob_bt)
    expected_bt[:, 1:] = logp_all.gather(-1, batch.input_ids_bt[:, 1:, None]).squeeze(-1)
    expected_bt *= batch.response_mask_bt
    torch.testing.assert_close(logprob_bt, expected_bt, rtol=0, atol=1e-5)
    expected_entropy = -(logp_all.exp() * logp_all).sum(-1)
    mask = batch.response_mask_bt[:, 1:]
    torch.testing.assert_close(entropy_bt[:, 1:][mask], expected_entropy[mask], rtol=0, atol=1e-5)
    assert entropy_bt[~batch.response_mask_bt].eq(0).all()


def test_chunked_and_unchunked_log_probs_are_equal(worker, model_dir):
    batch = random_train_batch(model_dir)
    chunked = worker.compute_log_prob(batch)
    worker.actor.logprob_chunk_size = 1_000_000
    try:
        whole = worker.compute_log_prob(batch)
    finally:
        worker.actor.logprob_chunk_size = 4
    # Chunking changes GEMM shapes, hence float32 summation order: rounding-level differences
    # (~1e-6 on log-probs of magnitude ~10) and nothing more.
    for a, b in zip(chunked, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_cpu_copy_restores_bitwise_and_does_not_move_with_training(worker, model_dir):
    batch = random_train_batch(model_dir)
    before = worker.full_state_dict()
    worker.save_model_to_cpu("pushed")
    worker.update_actor(batch)
    trained = worker.full_state_dict()
    assert any(not torch.equal(before[k], trained[k]) for k in before)
    # old log-probs from the saved copy equal a fresh forward of the saved weights
    from_slot = worker.compute_log_prob(batch, slot="pushed")[0]
    assert torch.equal(worker.full_state_dict()["model.norm.weight"], trained["model.norm.weight"])
    worker.restore_model_from_cpu("pushed")
    restored = worker.full_state_dict()
    assert all(torch.equal(before[k], restored[k]) for k in before)
    assert torch.equal(worker.compute_log_prob(batch)[0], from_slot)
    with pytest.raises(ValueError, match="no weights saved"):
        worker.restore_model_from_cpu("missing")


def test_one_update_lowers_the_surrogate_loss_and_reports_metrics(worker, model_dir):
    batch = random_train_batch(model_dir, seed=1)
    old_bt = worker.compute_log_prob(batch)[0]
    batch = dataclasses.replace(batch, rollout_logprobs_bt=old_bt)

    def surrogate():
        logp_bt = worker.compute_log_prob(batch)[0]
        return ppo_clip_loss(
            logp_bt, old_bt, batch.advantages_bt, batch.response_mask_bt,
            clip_low=0.2, clip_high=0.28, agg_mode="token-mean",
        )[0].item()  # fmt: skip

    loss_before = surrogate()
    metrics = worker.update_actor(batch)
    assert surrogate() < loss_before - 1e-3
    assert set(metrics) == METRIC_KEYS
    assert metrics["actor/lr"] == pytest.approx(1e-5)
    assert metrics["actor/grad_norm"] > 0


@pytest.mark.parametrize("loss", ["ppo", "gspo", "cispo"])
def test_each_policy_loss_trains_a_decoupled_batch_with_importance_weights(worker, model_dir, loss):
    batch = random_train_batch(model_dir)
    old_bt = worker.compute_log_prob(batch)[0]
    weights_bt = torch.where(batch.response_mask_bt, 0.5, 0.0)
    batch = dataclasses.replace(batch, old_logprobs_bt=old_bt, is_weights_bt=weights_bt)
    spec = TrainerSpec(str(model_dir), policy_loss=loss)
    variant = worker if loss == "ppo" else TrainerWorker(worker.actor, spec)  # same group
    metrics = variant.update_actor(batch)
    assert set(metrics) == METRIC_KEYS and metrics["actor/grad_norm"] > 0


def test_kl_loss_is_zero_while_the_policy_equals_the_reference(worker, model_dir):
    actor = ActorConfig(use_kl_loss=True, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4)
    kl_worker = TrainerWorker(actor, TrainerSpec(str(model_dir)))  # joins the existing group
    batch = random_train_batch(model_dir)
    metrics = kl_worker.update_actor(batch)
    assert metrics["actor/kl_loss"] == 0.0
    assert kl_worker.update_actor(batch)["actor/kl_loss"] > 0


def test_save_hf_round_trips_the_full_state_dict(worker, tmp_path):
    from transformers import AutoModelForCausalLM

    worker.save_hf(tmp_path / "hf")
    full = worker.full_state_dict()
    assert "lm_head.weight" not in full  # tied to the embedding
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert all(torch.equal(t, loaded.state_dict()[k]) for k, t in full.items())
    names = [name for name, _, _ in worker.weight_metadata()]
    assert names == list(full)
    worker.load_hf(tmp_path / "hf")
    assert all(torch.equal(t, worker.full_state_dict()[k]) for k, t in full.items())


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine():
    cfg = ActorConfig(lr_schedule="cosine", lr_warmup_steps=2, min_lr_ratio=0.1)
    factors = [lr_factor(step, cfg, total_steps=6) for step in range(7)]
    assert factors[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert factors[4] == pytest.approx(0.1 + 0.9 * 0.5)
    assert factors[6] == pytest.approx(0.1)
    assert lr_factor(100, ActorConfig(), total_steps=None) == 1.0


def test_pushes_are_sent_in_the_engines_dtype(worker, model_dir):
    """A bfloat16 engine gets bfloat16 tensors (half the bytes), cast from the master weights;
    float32 runs send float32 unchanged."""
    full = worker.full_state_dict()
    assert [d for _, _, d in worker.weight_metadata()] == ["float32"] * len(full)
    assert all(torch.equal(t, full[n]) for n, t in worker.iter_push_params())
    spec = dataclasses.replace(worker.spec, compute_dtype="bfloat16")
    worker.spec, saved = spec, worker.spec
    try:
        meta = worker.weight_metadata()
        pushed = dict(worker.iter_push_params())
    finally:
        worker.spec = saved
    assert [d for _, _, d in meta] == ["bfloat16"] * len(full)
    assert [n for n, _, _ in meta] == list(pushed) == list(full)
    for name, tensor in pushed.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, full[name].to(torch.bfloat16))


def test_old_log_probs_from_the_saved_copy_leave_training_where_it_was(model_dir):
    """Decoupled local step 2: a forward with the pushed copy swapped in must not undo step 1.
    At world size 1 the decoder layers keep their gathered weights after a forward, so the
    swap must write the trained weights back to the shards the optimizer steps, not to the
    gathered copies (which the next backward frees)."""
    first = random_train_batch(model_dir, seed=5)
    second = random_train_batch(model_dir, seed=6)
    actor = ActorConfig(lr=1e-5, ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=3)
    weights = []
    for use_slot in (False, True):
        w = TrainerWorker(actor, TrainerSpec(str(model_dir)))
        try:
            w.save_model_to_cpu("pushed")
            old_bt = w.compute_log_prob(first)[0]
            pushed_bt = w.compute_log_prob(second)[0]
            w.update_actor(dataclasses.replace(first, old_logprobs_bt=old_bt))
            # both runs forward here and then train on the same old log-probs
            forward_bt = w.compute_log_prob(second, slot="pushed" if use_slot else None)[0]
            assert torch.equal(forward_bt, pushed_bt) == use_slot
            w.update_actor(dataclasses.replace(second, old_logprobs_bt=pushed_bt))
            weights.append(w.full_state_dict())
        finally:
            w.close()
    plain, swapped = weights
    moved = [k for k in plain if not torch.equal(plain[k], swapped[k])]
    assert not moved, f"{len(moved)} tensors differ, e.g. {moved[:3]}"


def test_a_diverging_learning_rate_skips_non_finite_steps_and_counts_them(model_dir, caplog):
    """Adam moves every weight by ~lr: at lr=1e8 the first update blows the logits up, and the
    next updates' gradients are not finite; they are skipped (weights left as they were) and
    counted, the grad norm reported as the non-finite value it was, and the warning names
    the parameters whose gradients were not finite."""
    batch = random_train_batch(model_dir, seed=7)
    actor = ActorConfig(lr=1e8, ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=3)
    w = TrainerWorker(actor, TrainerSpec(str(model_dir)))
    try:
        first = w.update_actor(batch)
        assert first["actor/skipped_steps"] == 0 and math.isfinite(first["actor/grad_norm"])
        before = w.full_state_dict()
        second = w.update_actor(batch)
        after = w.full_state_dict()
    finally:
        w.close()
    assert second["actor/optimizer_steps"] == 1 and second["actor/skipped_steps"] == 1
    assert not math.isfinite(second["actor/grad_norm"])
    assert all(torch.equal(before[k], after[k]) for k in before)
    (warning,) = [r.getMessage() for r in caplog.records if "step skipped" in r.getMessage()]
    named = warning.split("first: ")[1].split(", ")
    assert named and all(name in before for name in named), warning


def test_the_probe_finds_a_nan_that_arises_on_padding_and_names_its_layer(model_dir, caplog):
    """A NaN written into the first decoder layer's output on padding positions only (what an
    attention kernel that mishandles padded rows would do) makes the step non-finite; with
    ``actor.probe_non_finite`` the skipped step's micro-batches are run again one at a time
    and the warning names the micro-batch, the layer and that only padding was hit, then the
    verdict per attention kernel."""
    from recipe.workers.trainer.fsdp_utils import decoder_layers

    batch = random_train_batch(model_dir, seed=7)
    assert not bool(batch.attention_mask_bt.bool().all())  # some rows are padded
    actor = ActorConfig(
        lr=1e-5, ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=6, probe_non_finite=True
    )
    w = TrainerWorker(actor, TrainerSpec(str(model_dir)))
    seen: dict[str, torch.Tensor] = {}

    def keep_mask(_module, _args, kwargs):
        seen["mask"] = kwargs["attention_mask"]

    def nan_on_padding(_module, _inputs, output):
        hidden = output[0] if isinstance(output, tuple) else output
        pad_bt = ~seen["mask"].bool()
        hidden = hidden.masked_fill(pad_bt[..., None], float("nan"))
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    backbone = getattr(w._policy.lm, w._policy.lm.base_model_prefix)
    hooks = [
        backbone.register_forward_pre_hook(keep_mask, with_kwargs=True),
        decoder_layers(w._policy.lm)[0].register_forward_hook(nan_on_padding),
    ]
    try:
        metrics = w.update_actor(batch)
    finally:
        for hook in hooks:
            hook.remove()
        w.close()
    assert metrics["actor/skipped_steps"] == 1
    lines = [r.getMessage() for r in caplog.records if "non-finite probe" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "micro-batch 0 (6 rows x " in lines[0]
    assert lines[0].endswith("decoder layer 0 output is not finite on padding only"), lines[0]
    assert "per attention kernel: math: non-finite" in lines[1], lines[1]


def test_exported_weights_are_a_private_file_under_the_run_directory(worker, tmp_path):
    """A resume or a restarted replica loads the weights from a file every node can read
    (the run directory, not rank 0's /dev/shm), that only the run's user can read."""
    import stat

    from safetensors.torch import load_file

    from recipe.run.checkpointing import EXPORT_DIR, exported_weights
    from recipe.utils.weights_file import file_sha256

    with exported_weights(worker, tmp_path, "resume-v3") as first:
        with exported_weights(worker, tmp_path, "resume-v3") as second:
            assert first.path != second.path  # a name no other process can guess
        path = Path(first.path)
        assert path.parent == tmp_path / EXPORT_DIR
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert load_file(path).keys() == worker.full_state_dict().keys()
        assert first.sha256 == file_sha256(path) and first.num_bytes > 0
    assert not path.exists() and not Path(second.path).exists()


@pytest.mark.gpu
@pytest.mark.parametrize("allowed", [False, True])
def test_a_cuda_rank_leaves_cudnn_attention_out_unless_asked(model_dir, allowed):
    """cuDNN's attention backward gave NaN gradients on real padded batches (H200, where
    the memory-efficient and math kernels were finite on the same micro-batch): a CUDA rank
    turns it off in its process unless ``actor.cudnn_attention``, and still trains."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    actor = ActorConfig(
        lr=1e-5, ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=6, cudnn_attention=allowed
    )
    w = TrainerWorker(actor, TrainerSpec(str(model_dir)), device="cuda")
    try:
        assert torch.backends.cuda.cudnn_sdp_enabled() is allowed
        metrics = w.update_actor(random_train_batch(model_dir, seed=9).to("cpu"))
    finally:
        w.close()
        torch.backends.cuda.enable_cudnn_sdp(True)
    assert math.isfinite(metrics["actor/grad_norm"])
