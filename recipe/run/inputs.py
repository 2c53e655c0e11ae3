"""``RunInputs``: what every recipe and the fully async rollouter read before any worker starts.

    RunInputs.load(cfg)
      data       train/val records (``build_datasets``: a bad file or row is named)
      reward     ``RewardFunction`` with a scorer for every ``data_source`` in the data
      model      the model directory (config, weights, tokenizer files checked)
      agents     multi-turn import paths, arguments and chat-template deltas
      prompts    every prompt through the chat template, within ``data.max_prompt_length``

Each check raises a ValueError (or ``ModelPathError``) naming the key, file or row, so bad
input fails at startup with one line. The data and reward checks run first, alone; the model
and the prompts may be checked while Ray starts (the fully async driver starts it ``beside``
them: reading the model's config and tokenizer takes seconds), and their error still wins;
the agents last, in the caller's thread. Each process loads them once: the
batch recipes in their one process (``BatchTrainer`` keeps them all); fully_async in the
driver, which keeps the model and the prompt sets' fingerprints (``FullyAsyncTrainer``) and
hands the whole to the rollouter actor through Ray (the reward function travels as its
config, ``RewardFunction.__reduce__``). A test that brings its own engines builds
``RunInputs`` by hand without a model.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from recipe.agent.runner import EpisodeRunner
from recipe.config import RecipeConfig
from recipe.data.dataset import build_datasets
from recipe.data.prompts import encode_prompts
from recipe.model import HFModelConfig, ModelConfig, ModelPathError
from recipe.protocol import PromptRecord
from recipe.reward import RewardFunction
from recipe.utils.config_check import require


@dataclass(frozen=True, slots=True)
class RunInputs:
    """Checked data, reward function, model and token ids of a run (module docstring)."""

    train_records: list[PromptRecord]
    val_records: list[PromptRecord]
    reward_fn: RewardFunction
    prompt_ids: dict[str, list[int]]
    """Token ids of every train and val prompt, by uid."""
    model: HFModelConfig | None
    """The model the engines and trainer ranks load; None only where the caller brings
    engines of its own (tests)."""

    @classmethod
    def load(cls, cfg: RecipeConfig, *, beside: Callable[[], object] | None = None) -> RunInputs:
        """Read and check everything ``cfg`` names (the module docstring's order: the cheap
        checks first, then the model's tokenizer and the prompts, the agents last).
        ``beside``: called in this thread while the model and prompts are checked in another,
        once the data and reward checks passed (the fully async driver starts Ray there); an
        error of either is raised once both ended, the checks' first."""
        train_records, val_records = build_datasets(cfg.data)
        reward_fn = RewardFunction(cfg.reward, cfg.rollout.response_length)
        reward_fn.check_data_sources({r.data_source for r in train_records + val_records})
        records = train_records + val_records
        model, ids = run_beside(lambda: _model_and_prompts(cfg, records), beside)
        if cfg.rollout.multi_turn.enable:
            # Import paths, constructor arguments and the chat template's deltas: checked
            # here, once, instead of inside every rollout worker; in this thread, as the
            # workers import them (a user's module may need the main thread, e.g. signals).
            EpisodeRunner(cfg.rollout.multi_turn, model.tokenizer, model.eos_token_ids)
        prompt_ids = {r.uid: p for r, p in zip(records, ids, strict=True)}
        return cls(train_records, val_records, reward_fn, prompt_ids, model)


def _model_and_prompts(
    cfg: RecipeConfig, records: list[PromptRecord]
) -> tuple[HFModelConfig, list[list[int]]]:
    """The model (its config and tokenizer: reading them imports much of transformers, the
    slowest check), the judge's check, and every prompt's token ids."""
    model = HFModelConfig.from_config(cfg.model)
    check_judge_model(cfg)
    limit = cfg.data.max_prompt_length
    return model, encode_prompts(model.tokenizer, records, max_prompt_length=limit)


T = TypeVar("T")


def run_beside(work: Callable[[], T], beside: Callable[[], object] | None) -> T:
    """``work()``'s result, with ``beside()`` run in this thread meanwhile (``work`` in a
    thread of its own; None: ``work`` alone, here). Both end before anything is raised:
    ``work``'s error first, else ``beside``'s."""
    if beside is None:
        return work()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inputs") as pool:
        future = pool.submit(work)
        try:
            beside()
        finally:
            error = future.exception()  # waits for the work to end
            if error is not None:
                raise error
    return future.result()


def check_judge_model(cfg: RecipeConfig) -> None:
    """``reward.judge.model`` is a model the judge's engines can load (a folder, a catalog
    name, a GGUF file) whose context holds ``reward.judge.max_model_len``, checked here,
    before any process starts: ``ModelPathError`` or ``ConfigError`` naming the key
    otherwise."""
    judge = cfg.reward.judge
    if not judge.model:
        return
    try:
        loaded = HFModelConfig.from_config(ModelConfig(path=judge.model, dtype=cfg.model.dtype))
    except ModelPathError as err:
        raise ModelPathError(str(err).replace("model.path=", "reward.judge.model=", 1)) from None
    # vLLM refuses a context past the model's own positions, deep inside the engine's start.
    context = getattr(loaded.hf_config, "max_position_embeddings", None)
    require(
        not isinstance(context, int) or judge.max_model_len <= context,
        "reward.judge.max_model_len",
        judge.max_model_len,
        f"at most the judge model's context, {context} tokens (max_position_embeddings)",
    )
