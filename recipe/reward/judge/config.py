"""Config schema of the LLM judge (``reward.judge.*``): which model scores responses, how it is
asked, and the deadlines of its calls.

The judge is either the run's own engines loading ``model`` (a local HF folder or a catalog
name) or an external OpenAI-compatible server at ``base_url``; one of the two turns it on.
A ``template`` file is read once here, at startup, and its text travels with the config
(``template_text``), so a process on another node never needs the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from recipe.reward.judge.prompts import MODES, builtin_template, template_problem
from recipe.utils.config_check import (
    ConfigError,
    require,
    require_choice,
    require_fraction,
    require_non_negative,
    require_positive,
)

logger = logging.getLogger(__name__)

ENGINE_KNOBS = ("replicas", "gpu_memory_utilization", "max_model_len", "max_num_seqs")
"""Knobs of the run's own judge engines: no effect with an external ``base_url``."""


@dataclass
class JudgeConfig:
    """An LLM judge that scores responses where a task has no verifier."""

    model: str | None = None
    """A local HF model folder or a catalog name, served by the run's own judge engines."""
    base_url: str | None = None
    """Or an external OpenAI-compatible endpoint (``http://host:port/v1``)."""
    api_key_env: str = "JUDGE_API_KEY"
    """Environment variable that holds the endpoint's key (unset: the key ``EMPTY``)."""
    endpoint_model: str | None = None
    """The model name the endpoint serves (required with ``base_url``)."""
    mode: str = "pointwise"
    """``pointwise``: a score per response; ``pairwise``: every pair of a group compared."""
    both_orders: bool = False
    """Pairwise: ask each pair in both orders, each verdict worth half (no position bias for
    any ``rollout.n``, twice the calls); else once, the order alternating over pairs."""
    template: str | None = None
    """Path of a prompt template file (str.format placeholders); None: the mode's built-in."""
    score_min: float = 0.0
    """The lowest score the pointwise rubric allows (normalised to reward 0)."""
    score_max: float = 10.0
    """The highest score the pointwise rubric allows (normalised to reward 1)."""
    temperature: float = 0.0
    """The judge's sampling temperature (> 0: a retry samples with a new seed)."""
    top_p: float = 1.0
    """The judge's nucleus sampling mass."""
    max_tokens: int = 512
    """The judge's reply budget in tokens."""
    timeout_s: float = 120.0
    """Deadline of one judge call, in seconds."""
    retries: int = 2
    """Further attempts after a failed, late or unparsable call."""
    retry_temperature: float = 0.7
    """A greedy judge's (``temperature`` 0) temperature on a retry after an unreadable
    verdict, so that the retry can read differently (greedy, it would repeat the same reply);
    0 retries greedily. A retry after an error or a deadline keeps ``temperature``."""
    max_concurrency: int = 64
    """Judge calls in flight at once, per process."""
    replicas: int = 1
    """Engines serving ``model``."""
    gpu_memory_utilization: float = 0.25
    """Fraction of a GPU each judge engine takes (beside the policy's engine)."""
    max_model_len: int = 4096
    """Context of the judge engines in tokens: the rendered prompt plus ``max_tokens``; at
    most the judge model's own (``max_position_embeddings``, checked at startup)."""
    max_num_seqs: int = 64
    """Sequences one judge engine batches at once."""
    start_timeout_s: float = 600.0
    """Deadline for the judge engines to load, in seconds."""

    def __post_init__(self) -> None:
        self._check_source()
        require_choice("reward.judge.mode", self.mode, MODES)
        require(
            self.score_min < self.score_max,
            "reward.judge.score_min",
            self.score_min,
            f"a number < reward.judge.score_max={self.score_max!r}",
        )
        if self.both_orders and self.mode != "pairwise":
            logger.warning("reward.judge.both_orders has no effect with mode=%s", self.mode)
        require_non_negative("reward.judge.retries", self.retries)
        require_non_negative("reward.judge.temperature", self.temperature)
        require_non_negative("reward.judge.retry_temperature", self.retry_temperature)
        require_fraction("reward.judge.top_p", self.top_p)
        for name in ("timeout_s", "max_tokens", "max_concurrency", "replicas", "max_model_len"):
            require_positive(f"reward.judge.{name}", getattr(self, name))
        require_positive("reward.judge.max_num_seqs", self.max_num_seqs)
        require_positive("reward.judge.start_timeout_s", self.start_timeout_s)
        util = self.gpu_memory_utilization
        require(0 < util < 1, "reward.judge.gpu_memory_utilization", util, "a number in (0, 1)")
        # Read once: the text pickles with the config (a plain attribute, not a field, so the
        # schema stays primitive and the key set does not grow).
        self._template_text: str | None = None if self.template is None else self._read()

    @property
    def enabled(self) -> bool:
        """Whether a judge scores responses (``model`` or ``base_url`` is set)."""
        return self.model is not None or self.base_url is not None

    @property
    def template_text(self) -> str:
        """The template the judge renders: the file's text, read at startup, or the mode's
        built-in one."""
        text = self.__dict__.get("_template_text")
        return text if text is not None else builtin_template(self.mode)

    def _check_source(self) -> None:
        require(
            self.model is None or self.base_url is None,
            "reward.judge.base_url",
            self.base_url,
            "None with reward.judge.model set (the judge is the run's own model or an endpoint)",
        )
        if self.base_url is not None:
            require(
                bool(self.endpoint_model),
                "reward.judge.endpoint_model",
                self.endpoint_model,
                "the model name the endpoint serves, with reward.judge.base_url",
            )
            changed = [k for k in ENGINE_KNOBS if getattr(self, k) != getattr(JudgeConfig, k)]
            for key in changed:
                logger.warning(
                    "reward.judge.%s has no effect with reward.judge.base_url; it is ignored", key
                )

    def _read(self) -> str:
        assert self.template is not None
        try:
            text = Path(self.template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            why = getattr(err, "strerror", None) or type(err).__name__
            raise ConfigError(
                f"reward.judge.template={self.template!r} is invalid: allowed a readable "
                f"UTF-8 text file ({why})"
            ) from None
        problem = template_problem(text, self.mode)
        require(problem is None, "reward.judge.template", self.template, str(problem))
        return text
