"""HFRolloutWorker on a random tiny Qwen2 (tests/helpers/models.py), driven in-process.

Logprobs are checked against a teacher-forced forward of the same weights: both sides are
float32 on CPU, so they differ only by KV-cache vs full-sequence summation order (~1e-6).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from recipe.model import ModelConfig
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout import GenerationRequest, make_rollout_worker_cls
from recipe.workers.rollout.hf_worker import HFRolloutWorker

PROMPT = [5, 17, 42, 9, 64]


@pytest.fixture(scope="module")
def model_dir(rollout_model_path: Path) -> Path:
    return rollout_model_path


LOGPROB_ATOL = 5e-5
"""Incremental decoding (KV cache) against one teacher-forced forward, both float32: the sums
run in another order, and log-probs of magnitude ~5 differ by up to ~1.3e-5 (seen on a
loaded 2-core machine)."""


def _worker(path: Path) -> HFRolloutWorker:
    return HFRolloutWorker(ModelConfig(path=str(path)), RolloutConfig(backend="hf"))


def _teacher_forced_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # (P+R, V)
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (R, V)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]


def _perturbed_weights_file(worker: HFRolloutWorker, path: Path) -> Path:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    tensors = {
        name: (p + 0.5 * p.std() * torch.randn(p.shape, generator=gen)).contiguous()
        for name, p in worker._model.state_dict().items()
        if name != "lm_head.weight"  # tied to the embedding
    }
    save_file(tensors, str(path))
    return path


def test_factory_picks_the_backend_and_rejects_unknown_ones():
    assert make_rollout_worker_cls("hf") is HFRolloutWorker
    with pytest.raises(ValueError, match=r"rollout\.backend='sglang'"):
        make_rollout_worker_cls("sglang")


def test_request_rejects_a_resume_group_of_the_wrong_size(model_dir):
    worker = _worker(model_dir)
    group = asyncio.run(worker.generate(GenerationRequest("p", PROMPT, n=2, max_tokens=3)))
    with pytest.raises(ValueError, match="expected n=3"):
        GenerationRequest("p", PROMPT, n=3, max_tokens=3, resume=group)


def test_resume_plan_passes_finished_responses_through_and_closes_spent_budgets():
    from recipe.protocol import Trajectory
    from recipe.workers.rollout.requests import SampleJob, plan_group

    def traj(i: int, num_tokens: int, reason: str) -> Trajectory:
        return Trajectory(
            "p", i, PROMPT, [7] * num_tokens, [-1.0] * num_tokens, [0] * num_tokens, reason
        )

    group = [traj(0, 2, "stop"), traj(1, 3, "aborted"), traj(2, 6, "aborted")]
    plan = plan_group(GenerationRequest("p", PROMPT, n=3, max_tokens=6, seed=0, resume=group))
    assert plan[0] is group[0]
    assert isinstance(plan[1], SampleJob)
    assert plan[1].context_ids == [*PROMPT, 7, 7, 7] and plan[1].max_new_tokens == 3
    assert (
        plan[1].seed is not None
        and plan[1].seed
        != plan_group(GenerationRequest("p", PROMPT, n=3, max_tokens=6, seed=0))[1].seed
    ), "a resumed response must not replay its fresh sampling stream"
    assert isinstance(plan[2], Trajectory) and plan[2].finish_reason == "length"


def test_greedy_generate_returns_n_aligned_trajectories(model_dir):
    worker = _worker(model_dir)
    request = GenerationRequest("p0", PROMPT, n=3, max_tokens=12, temperature=0.0)
    group = asyncio.run(worker.generate(request))
    assert [t.sample_index for t in group] == [0, 1, 2]
    for traj in group:
        assert traj.prompt_uid == "p0" and traj.prompt_ids == PROMPT
        assert len(traj.response_ids) == len(traj.rollout_logprobs) == len(traj.token_versions)
        assert traj.token_versions == [0] * len(traj.response_ids)
        assert traj.reward == 0.0
        assert traj.response_text == worker._tokenizer.decode(
            traj.response_ids, skip_special_tokens=True
        )
    # Greedy: every response of the group is the same.
    assert group[0].response_ids == group[1].response_ids == group[2].response_ids
    assert group[0].finish_reason == "length" and len(group[0].response_ids) == 12


def test_sampled_logprobs_equal_a_teacher_forced_forward(model_dir):
    worker = _worker(model_dir)
    request = GenerationRequest("p1", PROMPT, n=4, max_tokens=16, temperature=1.0, seed=7)
    group = asyncio.run(worker.generate(request))
    assert len({tuple(t.response_ids) for t in group}) > 1, "sampling gave identical responses"
    for traj in group:
        expected = _teacher_forced_logprobs(worker._model, PROMPT, traj.response_ids)
        torch.testing.assert_close(
            torch.tensor(traj.rollout_logprobs), expected, atol=LOGPROB_ATOL, rtol=0
        )


def test_generation_stops_at_an_eos_token_and_includes_it(model_dir, tmp_path):
    greedy = asyncio.run(
        _worker(model_dir).generate(
            GenerationRequest("p", PROMPT, n=1, max_tokens=8, temperature=0)
        )
    )[0].response_ids
    # A copy of the model whose generation_config names the 3rd greedy token as a stop id.
    stop_token = greedy[2]
    stop_dir = shutil.copytree(model_dir, tmp_path / "stop_model")
    gen_cfg = json.loads((stop_dir / "generation_config.json").read_text())
    gen_cfg["eos_token_id"] = [gen_cfg["eos_token_id"], stop_token]
    (stop_dir / "generation_config.json").write_text(json.dumps(gen_cfg))

    group = asyncio.run(
        _worker(stop_dir).generate(GenerationRequest("p", PROMPT, n=2, max_tokens=8, temperature=0))
    )
    cut = greedy.index(stop_token) + 1
    for traj in group:
        assert traj.response_ids == greedy[:cut]
        assert traj.finish_reason == "stop"
        assert len(traj.rollout_logprobs) == len(traj.token_versions) == cut


def test_paused_worker_starts_no_new_work_until_resumed(model_dir):
    worker = _worker(model_dir)

    async def scenario() -> list:
        await worker.pause()
        task = asyncio.create_task(worker.generate(GenerationRequest("p", PROMPT, 1, 4)))
        await asyncio.sleep(0.3)
        assert not task.done(), "a paused worker started a group"
        await worker.resume()
        return await asyncio.wait_for(task, timeout=30)

    group = asyncio.run(scenario())
    assert group[0].finish_reason == "length" and len(group[0].response_ids) == 4


def _hold_at_step(worker: HFRolloutWorker, step: int) -> threading.Event:
    """Make the model's ``step``-th forward wait until the worker is paused; returns an event
    set when that step is reached (so the test pauses at a known point, not after a sleep)."""
    reached = threading.Event()
    forward = worker._model.forward
    calls = 0

    def held_forward(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == step:
            reached.set()
            deadline = time.monotonic() + 30
            while not worker.is_paused() and time.monotonic() < deadline:
                time.sleep(0.001)
        return forward(*args, **kwargs)

    worker._model.forward = held_forward
    return reached


def test_pause_aborts_partials_and_resume_continues_them_under_the_new_version(model_dir, tmp_path):
    worker = _worker(model_dir)
    weights = _perturbed_weights_file(worker, tmp_path / "v1.safetensors")
    reached = _hold_at_step(worker, step=5)
    request = GenerationRequest("p", PROMPT, n=2, max_tokens=20, temperature=0)

    async def scenario():
        task = asyncio.create_task(worker.generate(request))
        await asyncio.to_thread(reached.wait, 30)
        await worker.pause()
        partial = await task
        old_model_logprobs = [
            _teacher_forced_logprobs(worker._model, PROMPT, t.response_ids) for t in partial
        ]
        await worker.update_weights_from_file(str(weights), version=1)
        assert worker.is_paused() and worker.version == 1
        await worker.resume()
        done = await worker.generate(
            GenerationRequest("p", PROMPT, n=2, max_tokens=20, temperature=0, resume=partial)
        )
        return partial, old_model_logprobs, done

    partial, old_lps, done = asyncio.run(scenario())
    for cut, old_lp, full in zip(partial, old_lps, done, strict=True):
        assert cut.finish_reason == "aborted" and len(cut.response_ids) == 5
        torch.testing.assert_close(
            torch.tensor(cut.rollout_logprobs), old_lp, atol=LOGPROB_ATOL, rtol=0
        )
        assert full.response_ids[:5] == cut.response_ids
        assert full.token_versions == [0] * 5 + [1] * 15
        assert full.finish_reason == "length" and full.min_version == 0 and full.max_version == 1
        # The continuation was scored by the new weights.
        new_lp = _teacher_forced_logprobs(worker._model, PROMPT, full.response_ids)[5:]
        torch.testing.assert_close(
            torch.tensor(full.rollout_logprobs[5:]), new_lp, atol=LOGPROB_ATOL, rtol=0
        )


def test_bad_weights_file_is_rejected_whole_and_leaves_the_worker_paused(model_dir, tmp_path):
    from safetensors.torch import save_file

    worker = _worker(model_dir)
    before = {k: v.clone() for k, v in worker._model.state_dict().items()}
    tensors = {k: torch.zeros_like(v) for k, v in before.items() if k != "lm_head.weight"}
    tensors["model.not_a_layer.weight"] = torch.zeros(2)
    save_file(tensors, str(tmp_path / "bad.safetensors"))

    with pytest.raises(ValueError, match=r"unknown \['model.not_a_layer.weight'\]"):
        asyncio.run(worker.update_weights_from_file(str(tmp_path / "bad.safetensors"), 1))
    assert worker.is_paused() and worker.version == 0
    for name, value in worker._model.state_dict().items():
        assert torch.equal(value, before[name]), name
    with pytest.raises(ValueError, match="versions must increase"):
        asyncio.run(worker.update_weights_from_file(str(tmp_path / "bad.safetensors"), 0))


def test_a_weights_file_that_differs_from_its_writers_record_is_refused_while_serving_on(
    model_dir, tmp_path
):
    """A file read with the checksum its writer recorded (a resume, a restarted replica,
    ``backend=file``) is verified before the worker pauses: one cut or rewritten since, or
    missing on this node, is refused naming it, and the worker keeps serving its version."""
    from recipe.utils.weights_file import WeightsFileError, file_sha256

    worker = _worker(model_dir)
    path = _perturbed_weights_file(worker, tmp_path / "v1.safetensors")
    recorded = file_sha256(path)
    with path.open("r+b") as stream:  # one byte of the last tensor changes
        stream.seek(-1, 2)
        last = stream.read(1)
        stream.seek(-1, 2)
        stream.write(bytes([last[0] ^ 1]))
    with pytest.raises(WeightsFileError, match=r"has sha256 .* here but .* as written") as bad:
        asyncio.run(worker.update_weights_from_file(str(path), 1, sha256=recorded))
    assert str(path) in str(bad.value) and "\n" not in str(bad.value)
    missing = tmp_path / "elsewhere.safetensors"
    with pytest.raises(WeightsFileError, match="does not exist on this node"):
        asyncio.run(worker.update_weights_from_file(str(missing), 1, sha256=recorded))
    assert not worker.is_paused() and worker.version == 0
    asyncio.run(worker.update_weights_from_file(str(path), 1, sha256=file_sha256(path)))
    assert worker.version == 1


def test_diverged_weights_fail_sampling_with_one_line_naming_the_cause(model_dir, tmp_path):
    """Weights that make the next-token distribution NaN (a diverged run) end sampling with
    an error that says so, naming the version, instead of torch's sampling traceback."""
    from safetensors.torch import save_file

    worker = _worker(model_dir)
    tensors = {
        k: torch.full_like(v, float("nan")) if k == "model.norm.weight" else v.clone()
        for k, v in worker._model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(tensors, str(tmp_path / "nan.safetensors"))

    async def scenario():
        await worker.pause()
        await worker.update_weights_from_file(str(tmp_path / "nan.safetensors"), version=3)
        await worker.resume()
        await worker.generate(GenerationRequest("p", PROMPT, n=2, max_tokens=4, temperature=1))

    with pytest.raises(RuntimeError, match="weights of version 3 give non-finite") as caught:
        asyncio.run(scenario())
    assert "training diverged" in str(caught.value) and "\n" not in str(caught.value)
