"""verl's command-line keys and what to pass here instead.

Users arrive with verl launch scripts (``actor_rollout_ref.actor.optim.lr=1e-6``
``trainer.n_gpus_per_node=8``). Keys that verl and this recipe spell alike
(``data.train_batch_size``, ``data.max_prompt_length``, ``algorithm.adv_estimator``,
``trainer.total_training_steps``, ``async_training.staleness_threshold`` ...) simply work; the
others fail at startup with one line that names our key, or says what to set where there is
no one-to-one equivalent. The names come from verl's ``ppo_trainer.yaml`` and its
fully_async recipe's ``fully_async_ppo_trainer.yaml``.

``VERL_KEYS`` is the table; tests/unit/test_overrides.py checks that every key of ours it
names exists in the schema, so the table cannot point at a renamed key. Keys of verl's own
sections that the table does not list are translated by prefix (``VERL_PREFIXES``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VerlKey:
    """One verl key and its counterpart here."""

    verl: str
    """The dotted key as verl spells it."""
    ours: tuple[str, ...]
    """Our keys that replace it (dotted, all in ``RecipeConfig``); may be empty."""
    how: str = ""
    """What to set when there is no one-to-one equivalent; ``{0}``, ``{1}`` name ``ours``.
    Empty: ``ours[0]`` is the same knob under another name."""


def _renamed(verl: str, ours: str) -> VerlKey:
    return VerlKey(verl, (ours,))


_ARA = "actor_rollout_ref.actor."
_ARR = "actor_rollout_ref.rollout."
VERL_KEYS: tuple[VerlKey, ...] = (
    # Optimizer: verl nests it under actor.optim, here the fields sit on actor.
    _renamed(_ARA + "optim.lr", "actor.lr"),
    _renamed("actor.optim.lr", "actor.lr"),
    _renamed(_ARA + "optim.weight_decay", "actor.weight_decay"),
    _renamed(_ARA + "optim.betas", "actor.betas"),
    _renamed(_ARA + "optim.lr_warmup_steps", "actor.lr_warmup_steps"),
    _renamed(_ARA + "optim.min_lr_ratio", "actor.min_lr_ratio"),
    _renamed(_ARA + "optim.warmup_style", "actor.lr_schedule"),
    _renamed(_ARA + "optim.lr_scheduler_type", "actor.lr_schedule"),
    # PPO update.
    _renamed(_ARA + "ppo_mini_batch_size", "actor.ppo_mini_batch_size"),
    _renamed(_ARA + "ppo_micro_batch_size_per_gpu", "actor.ppo_micro_batch_size_per_gpu"),
    VerlKey(
        _ARA + "ppo_micro_batch_size",
        ("actor.ppo_micro_batch_size_per_gpu",),
        "set the per-GPU size, {0}",
    ),
    VerlKey(
        _ARA + "policy_loss.loss_mode",
        ("algorithm.policy_loss",),
        "set {0}=ppo|gspo|cispo (verl's vanilla is ppo)",
    ),
    _renamed(_ARA + "use_dynamic_bsz", "actor.use_dynamic_bsz"),
    _renamed(_ARA + "ppo_max_token_len_per_gpu", "actor.ppo_max_token_len_per_gpu"),
    _renamed(_ARR + "log_prob_max_token_len_per_gpu", "actor.log_prob_max_token_len_per_gpu"),
    _renamed(
        "actor_rollout_ref.model.enable_gradient_checkpointing", "actor.gradient_checkpointing"
    ),
    _renamed(_ARA + "ppo_epochs", "actor.ppo_epochs"),
    _renamed(_ARA + "grad_clip", "actor.grad_clip"),
    _renamed(_ARA + "clip_ratio_low", "actor.clip_ratio_low"),
    _renamed(_ARA + "clip_ratio_high", "actor.clip_ratio_high"),
    VerlKey(
        _ARA + "clip_ratio",
        ("actor.clip_ratio_low", "actor.clip_ratio_high"),
        "set both bounds, {0} and {1}",
    ),
    _renamed(_ARA + "loss_agg_mode", "actor.loss_agg_mode"),
    _renamed(_ARA + "entropy_coeff", "actor.entropy_coeff"),
    _renamed(_ARA + "use_kl_loss", "actor.use_kl_loss"),
    _renamed(_ARA + "kl_loss_coef", "actor.kl_loss_coef"),
    _renamed(_ARA + "kl_loss_type", "actor.kl_loss_type"),
    # Rollout.
    _renamed(_ARR + "n", "rollout.n"),
    _renamed(_ARR + "name", "rollout.backend"),
    _renamed(_ARR + "temperature", "rollout.temperature"),
    _renamed(_ARR + "top_p", "rollout.top_p"),
    _renamed(_ARR + "top_k", "rollout.top_k"),
    _renamed(_ARR + "val_kwargs.temperature", "rollout.val_temperature"),
    _renamed(_ARR + "response_length", "rollout.response_length"),
    _renamed("data.max_response_length", "rollout.response_length"),
    _renamed(_ARR + "prompt_length", "data.max_prompt_length"),
    _renamed(_ARR + "gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    _renamed(_ARR + "tensor_model_parallel_size", "rollout.tensor_parallel_size"),
    _renamed("rollout.tensor_model_parallel_size", "rollout.tensor_parallel_size"),
    _renamed(_ARR + "max_num_seqs", "rollout.max_num_seqs"),
    _renamed(_ARR + "enforce_eager", "rollout.enforce_eager"),
    VerlKey(
        _ARR + "dtype", ("model.dtype",), "set {0}, the dtype of both the trainer and the engines"
    ),
    # Model.
    _renamed("actor_rollout_ref.model.path", "model.path"),
    _renamed("actor_rollout_ref.model.trust_remote_code", "model.trust_remote_code"),
    # Reward.
    VerlKey(
        "custom_reward_function.path",
        ("reward.custom_fn",),
        "set file and function in one key, {0}=path/to/file.py:compute_score",
    ),
    VerlKey(
        "custom_reward_function.name",
        ("reward.custom_fn",),
        "set file and function in one key, {0}=path/to/file.py:compute_score",
    ),
    VerlKey(
        "algorithm.use_kl_in_reward",
        ("actor.use_kl_loss", "actor.kl_loss_coef"),
        "there is no KL penalty in the reward; use the KL loss, {0}=true and {1}",
    ),
    # Trainer and resources: the trainer and the engines have GPUs of their own here.
    VerlKey(
        "trainer.n_gpus_per_node",
        ("actor.n_gpus_per_node", "rollout.n_gpus_per_node"),
        "set {0} (trainer ranks per node) and {1} (rollout GPUs per node)",
    ),
    VerlKey(
        "trainer.nnodes",
        ("actor.nnodes", "rollout.nnodes"),
        "set {0} (trainer nodes) and {1} (rollout nodes)",
    ),
    _renamed("trainer.logger", "logger.backends"),
    _renamed("trainer.project_name", "logger.project"),
    _renamed("trainer.experiment_name", "logger.experiment"),
    _renamed("trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    VerlKey(
        "trainer.resume_from_path",
        ("trainer.resume_mode",),
        "set {0}=PATH (a checkpoints/step_N directory)",
    ),
    VerlKey(
        "trainer.default_local_dir",
        ("trainer.save_freq",),
        "checkpoints go to <run dir>/checkpoints: set the run dir with hydra.run.dir=DIR "
        "and the interval with {0}",
    ),
    _renamed("ray_kwargs.ray_init.num_cpus", "ray.num_cpus"),
    # verl's fully_async recipe.
    _renamed("rollout.total_epochs", "trainer.total_epochs"),
    _renamed("rollout.test_freq", "trainer.test_freq"),
    _renamed("async_training.use_rollout_log_probs", "algorithm.rollout_correction.bypass_mode"),
    VerlKey(
        "async_training.compute_prox_log_prob",
        ("algorithm.rollout_correction.bypass_mode",),
        "{0}=false computes the old log-probs on the trainer (decoupled PPO)",
    ),
    VerlKey(
        "data.gen_batch_size",
        ("actor.ppo_mini_batch_size", "async_training.require_batches"),
        "drop it: prompts stream one group at a time (a fully_async step trains {0} x {1} prompts)",
    ),
)

VERL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.actor.optim.", "actor."),
    ("actor.optim.", "actor."),
    ("actor_rollout_ref.actor.", "actor."),
    ("actor_rollout_ref.rollout.", "rollout."),
    ("actor_rollout_ref.model.", "model."),
)
"""Where verl's sections live here (longest prefix first), for keys the table lacks."""

VERL_ONLY_SECTIONS = (
    "actor_rollout_ref",
    "critic",
    "reward_model",
    "custom_reward_function",
    "ray_kwargs",
    "global_profiler",
)
"""Top-level sections of verl's config that this recipe does not have."""

_BY_KEY = {entry.verl: entry for entry in VERL_KEYS}


def verl_hint(key: str, value: str, known: Collection[str]) -> str | None:
    """The error line for verl's ``key`` (given ``key=value``), or None if it is not verl's.

    ``known`` is the set of our dotted keys.
    """
    entry = _BY_KEY.get(key)
    if entry is not None:
        if not entry.how:
            return f"{key} is verl's name; here it is {entry.ours[0]} ({entry.ours[0]}={value})"
        how = entry.how.format(*entry.ours)
        return f"{key} is verl's name and has no one-to-one equivalent here: {how}"
    for verl_prefix, our_prefix in VERL_PREFIXES:
        if key.startswith(verl_prefix):
            ours = our_prefix + key.removeprefix(verl_prefix)
            if ours in known:
                return f"{key} is verl's name; here it is {ours} ({ours}={value})"
            break
    if key.split(".", 1)[0] in VERL_ONLY_SECTIONS:
        return (
            f"{key} is a verl key with no equivalent here "
            "(python -m recipe --cfg job lists every key)"
        )
    return None
