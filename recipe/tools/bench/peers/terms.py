"""The terms every system of the peer benchmark runs under, stated once.

``Terms`` is what the table's header prints and what each system's command is written from:
the same model folder, the same parquet files (verl's row schema,
``python -m recipe.tools.prepare gsm8k``), prompts per step, responses per prompt, lengths,
learning rate, no KL, no entropy bonus, bf16, CUDA graphs, greedy validation at the end
and the same number of trained samples (``steps`` x ``prompts`` x ``n``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEVICES = ("cuda", "cpu")


@dataclass(frozen=True, slots=True)
class Terms:
    """One benchmark's shared settings (each field is a ``key=value`` of the command line)."""

    model: Path
    """A Hugging Face model folder (config, weights, tokenizer with a chat template)."""
    train_file: Path
    """Training prompts: parquet in verl's row schema."""
    val_file: Path
    """Validation prompts, same schema; the first ``val_rows`` are scored greedily at the end."""
    steps: int = 12
    """Trainer steps (one optimizer step each) per system."""
    warmup_steps: int = 2
    """Steps left out of the steady-state rates (compilation, CUDA graphs, caches)."""
    prompts: int = 32
    """Prompts per step."""
    n: int = 8
    """Responses per prompt (GRPO group size)."""
    max_prompt_length: int = 512
    response_length: int = 256
    lr: float = 1e-6
    val_rows: int = 256
    gpu_memory_utilization: float = 0.5
    """The rollout engine's share of the GPU; trainer and engine share one GPU here."""
    seed: int = 0
    timeout_s: float = 1800.0
    """Deadline of one system's run."""
    device: str = "cuda"
    """Where our systems run: ``cuda`` (bf16, the benchmark), or ``cpu`` (float32, ours only:
    the harness end to end on a machine without a GPU; verl trains on GPUs only)."""
    verl_extra: tuple[str, ...] = ()
    """More Hydra overrides for verl alone (``verl:KEY=VALUE`` on the command line), for a
    variant of its settings; each replaces the benchmark's value of its key."""

    def __post_init__(self) -> None:
        for key in ("steps", "prompts", "n", "max_prompt_length", "response_length"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)}: must be at least 1")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps}: must be in [0, steps)")
        if not 0.0 < self.gpu_memory_utilization < 1.0:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization}: in (0, 1)")
        if self.device not in DEVICES:
            raise ValueError(f"device={self.device}: must be one of {', '.join(DEVICES)}")
        if self.lr <= 0 or self.val_rows < 1:
            raise ValueError(f"lr={self.lr}, val_rows={self.val_rows}: must be positive")

    @property
    def samples(self) -> int:
        """Trained samples per system."""
        return self.steps * self.prompts * self.n

    def describe(self) -> dict[str, Any]:
        out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        out["verl_extra"] = list(self.verl_extra)
        return out
