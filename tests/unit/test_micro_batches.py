"""Token-budget micro-batches, the chunked log-prob head's gradients, and a trainer whose
update does not depend on how its mini-batches are cut."""

import dataclasses
import random

import pytest
import torch

from recipe.workers.config import ActorConfig
from recipe.workers.trainer.logprob_head import chunked_logprob_entropy
from recipe.workers.trainer.micro_batches import (
    fixed_plan,
    padded_tokens,
    split_to_count,
    token_budget_plan,
)
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.worker import TrainerWorker
from tests.helpers.batches import random_train_batch

# ---- plans ------------------------------------------------------------------------------


def _longtail(num_rows: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [
        rng.randint(300, 420) if rng.random() < 0.1 else rng.randint(20, 70)
        for _ in range(num_rows)
    ]


@pytest.mark.parametrize("budget", [512, 4096, 16384])
def test_token_budget_plan_covers_every_row_once_within_the_budget(budget):
    lengths = _longtail(256)
    plan = token_budget_plan(lengths, budget)
    assert sorted(r for rows in plan for r in rows) == list(range(256))
    assert all(padded_tokens(rows, lengths) <= budget for rows in plan)
    longest_first = [lengths[rows[0]] for rows in plan]
    assert longest_first == sorted(longest_first, reverse=True)
    # Sorting makes padding small: far fewer slots than fixed chunks of 32 rows.
    fixed = sum(padded_tokens(rows, lengths) for rows in fixed_plan(256, 32))
    ours = sum(padded_tokens(rows, lengths) for rows in plan)
    assert ours < 0.5 * fixed


def test_a_row_longer_than_the_budget_goes_alone():
    plan = token_budget_plan([50, 900, 40, 30], 100)
    assert plan == [[1], [0, 2], [3]]  # 2 x 50 fills the budget exactly


def test_split_to_count_halves_the_costliest_then_adds_dummies():
    lengths = [10, 10, 10, 10, 5]
    plan = token_budget_plan(lengths, 100)
    assert plan == [[0, 1, 2, 3, 4]]
    assert split_to_count(plan, lengths, 2) == [[0, 1, 2], [3, 4]]
    assert split_to_count([[0], [1]], lengths, 4) == [[0], [1], [], []]
    assert split_to_count(plan, lengths, 1) == plan


def test_plans_reject_empty_budgets():
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_plan([3], 0)
    with pytest.raises(ValueError, match="rows_per_micro"):
        fixed_plan(3, 0)


# ---- chunked log-prob head ----------------------------------------------------------------


def _reference(hidden_nh, weight_vh, bias_v, targets_n, temperature):
    logits_nv = (hidden_nh @ weight_vh.T + bias_v) / temperature
    logp_nv = logits_nv.log_softmax(-1)
    entropy_n = -(logp_nv.exp() * logp_nv).sum(-1)
    return logp_nv.gather(-1, targets_n[:, None]).squeeze(-1), entropy_n


@pytest.mark.parametrize("entropy_weight", [0.0, 0.3])
def test_chunked_head_matches_autograd_values_and_gradients(entropy_weight):
    gen = torch.Generator().manual_seed(0)
    num_rows, hidden, vocab = 13, 8, 37
    head = torch.nn.Linear(hidden, vocab, dtype=torch.float64)
    hidden_nh = torch.randn(num_rows, hidden, dtype=torch.float64, generator=gen)
    targets_n = torch.randint(0, vocab, (num_rows,), generator=gen)
    weights_n = torch.randn(num_rows, dtype=torch.float64, generator=gen)

    def run(fn):
        head.zero_grad()
        h_nh = hidden_nh.clone().requires_grad_(True)
        lp_n, ent_n = fn(h_nh)
        loss = (weights_n * lp_n).sum()
        if entropy_weight:
            loss = loss + entropy_weight * (weights_n * ent_n).sum()
        loss.backward()
        return lp_n.detach(), ent_n.detach(), h_nh.grad, head.weight.grad.clone(), head.bias.grad

    ours = run(lambda h: chunked_logprob_entropy(h, head, targets_n, 4, temperature=0.7))
    ref = run(lambda h: _reference(h, head.weight, head.bias, targets_n, 0.7))
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_chunked_head_without_targets_keeps_the_graph_connected():
    head = torch.nn.Linear(4, 9)
    hidden_nh = torch.zeros(0, 4, requires_grad=True)
    lp_n, ent_n = chunked_logprob_entropy(hidden_nh, head, torch.zeros(0, dtype=torch.long), 2)
    assert lp_n.shape == ent_n.shape == (0,)
    lp_n.sum().backward()
    assert head.weight.grad is not None and head.weight.grad.eq(0).all()


# ---- the trainer: dynamic micro-batches change nothing but speed --------------------------


@pytest.mark.parametrize(
    "changed",
    [
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 40},
        {"gradient_checkpointing": True},
    ],
    ids=["token-budget", "gradient-checkpointing"],
)
def test_speed_settings_give_the_same_update(tiny_model_path, changed):
    batch = random_train_batch(tiny_model_path, num_prompts=4, n=4, seed=3)
    base = ActorConfig(
        lr=1e-5, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=3,
        entropy_coeff=0.01, logprob_chunk_size=8, use_dynamic_bsz=False,
    )  # fmt: skip
    other = dataclasses.replace(base, **changed)
    results, workers = [], []
    try:
        for actor in (base, other):
            worker = TrainerWorker(actor, TrainerSpec(str(tiny_model_path)))
            workers.append(worker)
            if actor.gradient_checkpointing:
                assert worker._policy.lm.is_gradient_checkpointing
            logprob_bt = worker.compute_log_prob(batch)[0]
            old = dataclasses.replace(batch, old_logprobs_bt=logprob_bt)
            metrics = worker.update_actor(old)
            results.append((logprob_bt, metrics, worker.full_state_dict()))
    finally:
        for worker in reversed(workers):
            worker.close()
    (lp_a, m_a, w_a), (lp_b, m_b, w_b) = results
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-5)
    assert m_a.keys() == m_b.keys()
    for key in m_a:
        assert m_a[key] == pytest.approx(m_b[key], rel=1e-4, abs=1e-6), key
    for name in w_a:
        torch.testing.assert_close(w_a[name], w_b[name], rtol=0, atol=1e-6)


def test_a_dummy_micro_batch_adds_nothing(tiny_model_path, monkeypatch):
    """Ranks with fewer rows than another rank's micro-batches run fully masked dummies."""
    batch = random_train_batch(tiny_model_path, num_prompts=2, n=2, seed=4)
    actor = ActorConfig(lr=1e-5, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2)
    worker = TrainerWorker(actor, TrainerSpec(str(tiny_model_path)))
    try:
        worker.save_model_to_cpu("start")
        plain = worker.compute_log_prob(batch), worker.update_actor(batch)
        weights = worker.full_state_dict()
        worker.restore_model_from_cpu("start")
        planned = TrainerWorker._micro_plan
        monkeypatch.setattr(
            worker,
            "_micro_plan",
            lambda lengths, grad: [[], *planned(worker, lengths, grad=grad), []],
        )
        padded = worker.compute_log_prob(batch), worker.update_actor(batch)
        for a, b in zip(plain[0], padded[0], strict=True):
            assert torch.equal(a, b)
        assert padded[1] == pytest.approx(plain[1], rel=1e-6)
        for name, tensor in worker.full_state_dict().items():
            torch.testing.assert_close(tensor, weights[name], rtol=0, atol=1e-7)
    finally:
        worker.close()
