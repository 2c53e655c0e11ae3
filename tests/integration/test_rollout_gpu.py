"""Seeded sampling on a GPU engine with chunked prefill (vLLM's default there).

On CPU engines chunked prefill is off (recipe/workers/rollout/vllm_worker.py says why); on
GPUs it stays on and vLLM rewinds a request's Philox generator when it discards the token
sampled for a partly prefilled prompt. This checks that path: a step's prompts exceed the
engine's token budget many times over, every request has its own seed, and a response
sampled in that crowd is the one the same seed gives alone. A generator that was not
rewound would shift every later draw of the request and change the response.
"""

from __future__ import annotations

import pytest

from recipe.model import ModelConfig
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout import GenerationRequest, make_rollout_worker_cls

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

RAY_NUM_CPUS = 4  # three engine actors at once (tests/integration/conftest.py)

BUDGET_TOKENS = 128
PROMPT_TOKENS = 200


@pytest.fixture(scope="module")
def gpu_worker(ray_for_module, rollout_model_path):
    ray = ray_for_module
    actor_cls = ray.remote(num_cpus=1, num_gpus=0.3)(make_rollout_worker_cls("vllm"))
    config = RolloutConfig(
        gpu_memory_utilization=0.3,
        max_num_seqs=64,
        engine_kwargs={"max_num_batched_tokens": BUDGET_TOKENS, "max_model_len": 512},
    )
    # float32: batch shapes barely move the logits, so a seed decides the response.
    actor = actor_cls.remote(ModelConfig(path=str(rollout_model_path), dtype="float32"), config)
    try:
        assert ray.get(actor.get_version.remote(), timeout=600) == 0
        yield ray, actor
    finally:
        ray.get(actor.shutdown.remote(), timeout=120)


def _request(index: int) -> GenerationRequest:
    prompt = [(7 * index + 13 * k) % 290 + 1 for k in range(PROMPT_TOKENS)]
    return GenerationRequest(f"p{index}", prompt, n=4, max_tokens=16, temperature=1.0, seed=index)


def test_seeded_responses_are_the_same_alone_and_in_a_crowd_past_the_token_budget(gpu_worker):
    ray, worker = gpu_worker
    crowd = [_request(i) for i in range(8)]  # 8 x 4 x 200 prefill tokens = 50x the budget
    crowded = ray.get([worker.generate.remote(r) for r in crowd], timeout=600)
    alone = [ray.get(worker.generate.remote(r), timeout=600) for r in crowd[:3]]
    pairs = [
        (a.response_ids, c.response_ids)
        for group_alone, group_crowd in zip(alone, crowded[:3], strict=False)
        for a, c in zip(group_alone, group_crowd, strict=True)
    ]
    same = sum(a == c for a, c in pairs) / len(pairs)
    # Kernels still differ a little with the batch shape, so a near tie may flip a token;
    # an un-rewound generator changes nearly every response.
    assert same >= 0.9, f"only {same:.0%} of seeded responses reproduced"
    assert all(len(t.response_ids) > 0 for g in crowded for t in g)


# ---- CUDA graphs (the GPU default) read the pushed weights ----------------------------------


def _perturbed_weights(model_dir, out_path) -> None:
    """The model's weights, each moved by noise of a tenth of its own spread (a push that
    changes what greedy decoding picks)."""
    import torch
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(5)
    weights = load_file(str(model_dir / "model.safetensors"))
    moved = {}
    for name, tensor in weights.items():
        noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
        moved[name] = (tensor.float() + 0.1 * tensor.float().std() * noise).to(tensor.dtype)
    save_file(moved, str(out_path))


def _greedy(ray, worker) -> list[list[int]]:
    requests = [
        GenerationRequest(f"g{i}", [(11 * i + 5 * k) % 290 + 1 for k in range(24)], 2, 24, 0.0)
        for i in range(6)
    ]
    groups = ray.get([worker.generate.remote(r) for r in requests], timeout=600)
    return [t.response_ids for g in groups for t in g]


def test_cuda_graphs_by_default_decode_the_pushed_weights_as_eager_does(
    ray_for_module, rollout_model_path, tmp_path
):
    ray = ray_for_module
    # Beside the module's first engine (0.3 of the GPU); started one after the other, so
    # each engine's memory profile sees only finished neighbours.
    actor_cls = ray.remote(num_cpus=1, num_gpus=0.3)(make_rollout_worker_cls("vllm"))
    model = ModelConfig(path=str(rollout_model_path), dtype="float32")
    workers = {}
    try:
        for name, eager in (("graphs", None), ("eager", True)):
            config = RolloutConfig(gpu_memory_utilization=0.25, enforce_eager=eager)
            workers[name] = actor_cls.remote(model, config)
            assert ray.get(workers[name].get_version.remote(), timeout=600) == 0
        before = {k: _greedy(ray, w) for k, w in workers.items()}
        path = tmp_path / "pushed.safetensors"
        _perturbed_weights(rollout_model_path, path)
        ray.get([w.update_weights_from_file.remote(str(path), 1) for w in workers.values()])
        after = {k: _greedy(ray, w) for k, w in workers.items()}
    finally:
        ray.get([w.shutdown.remote() for w in workers.values()], timeout=120)
    # Graphs pad a batch to a captured size, so a near tie may decode differently from eager
    # even on the same weights; stale weights would change nearly every response instead.
    assert _agreement(before["graphs"], before["eager"]) >= 0.9
    assert _agreement(after["graphs"], after["eager"]) >= 0.9
    assert _agreement(after["graphs"], before["graphs"]) <= 0.5, "the push changed too little"


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
