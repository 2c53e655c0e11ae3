"""``RunInputs``: what every recipe and the fully async rollouter read before any worker starts.

    RunInputs.load(cfg)
      data       train/val records (``build_datasets``: a bad file or row is named)
      reward     ``RewardFunction`` with a scorer for every ``data_source`` in the data
      model      the model directory (config, weights, tokenizer files checked)
      prompts    every prompt through the chat template, within ``data.max_prompt_length``
      agents     multi-turn import paths, arguments and chat-template deltas

Each check raises a ValueError (or ``ModelPathError``) naming the key, file or row, so bad
input fails at startup with one line, before Ray starts. Each process loads them once: the
batch recipes in their one process (``BatchTrainer`` keeps them all); fully_async in the
driver, which keeps the model and the prompt sets' fingerprints (``FullyAsyncTrainer``) and
hands the whole to the rollouter actor through Ray (the reward function travels as its
config, ``RewardFunction.__reduce__``). A test that brings its own engines builds
``RunInputs`` by hand without a model.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    def load(cls, cfg: RecipeConfig) -> RunInputs:
        """Read and check everything ``cfg`` names (the module docstring's order: the cheap
        checks first, the model's tokenizer last)."""
        train_records, val_records = build_datasets(cfg.data)
        reward_fn = RewardFunction(cfg.reward, cfg.rollout.response_length)
        reward_fn.check_data_sources({r.data_source for r in train_records + val_records})
        # Last: reading the model's config imports much of transformers (seconds).
        model = HFModelConfig.from_config(cfg.model)
        check_judge_model(cfg)
        records = train_records + val_records
        ids = encode_prompts(model.tokenizer, records, max_prompt_length=cfg.data.max_prompt_length)
        if cfg.rollout.multi_turn.enable:
            # Import paths, constructor arguments and the chat template's deltas: checked
            # here, once, instead of inside every rollout worker.
            EpisodeRunner(cfg.rollout.multi_turn, model.tokenizer, model.eos_token_ids)
        prompt_ids = {r.uid: p for r, p in zip(records, ids, strict=True)}
        return cls(train_records, val_records, reward_fn, prompt_ids, model)


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
