"""``TrainerSpec``: what every rank of the policy trainer needs to build the same trainer,
beside its ``actor.*`` config (``recipe.workers.trainer.worker.TrainerWorker``)."""

from __future__ import annotations

from dataclasses import dataclass

from recipe.algo.registry import POLICY_LOSS
from recipe.utils.config_check import require_choice, require_positive


@dataclass(slots=True)
class TrainerSpec:
    """What every rank needs to build the same trainer (besides ``actor.*``)."""

    model_path: str
    """Local HF causal-LM directory to load the policy (and reference) from."""
    total_optimizer_steps: int | None = None
    """Optimizer steps of the whole run; sizes the LR schedule (required for cosine)."""
    policy_loss: str = "ppo"
    """``algorithm.policy_loss`` (``recipe.algo.policy_loss``)."""
    response_length: int = 1
    """``rollout.response_length``: the constant of Dr.GRPO's ``seq-mean-token-sum-norm``."""
    logits_temperature: float = 1.0
    """Logits are divided by this before log-softmax (match the rollout sampling temperature
    when the engine reports log-probs of the tempered distribution)."""
    compute_dtype: str = "float32"
    """FSDP2 forward/backward dtype (``bfloat16`` on GPU); master weights stay float32."""
    seed: int = 0
    """Torch seed set before the model is built."""

    def __post_init__(self) -> None:
        require_positive("logits_temperature", self.logits_temperature)
        POLICY_LOSS.check(self.policy_loss)
        require_positive("response_length", self.response_length)
        require_choice("compute_dtype", self.compute_dtype, ("float32", "bfloat16", "float16"))
        if self.total_optimizer_steps is not None:
            require_positive("total_optimizer_steps", self.total_optimizer_steps)
