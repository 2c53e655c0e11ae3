"""``rollout.engine_kwargs``: vLLM engine args passed through, checked at startup."""

from __future__ import annotations

import logging

import pytest

from recipe.utils.config_check import ConfigError
from recipe.workers.config import RolloutConfig


@pytest.mark.model  # imports vLLM
def test_unknown_engine_args_fail_naming_them():
    from recipe.workers.rollout.vllm_worker import check_engine_kwargs

    cfg = RolloutConfig(engine_kwargs={"max_model_len": 1024, "max_num_batchd_tokens": 8})
    with pytest.raises(ValueError, match=r"no engine args max_num_batchd_tokens \("):
        check_engine_kwargs(cfg)
    ok = RolloutConfig(engine_kwargs={"max_model_len": 1024, "max_num_batched_tokens": 1024})
    assert check_engine_kwargs(ok) == {"max_model_len": 1024, "max_num_batched_tokens": 1024}


@pytest.mark.model  # imports vLLM
def test_chunked_prefill_on_a_cpu_engine_warns_why_it_is_off(caplog):
    from recipe.workers.rollout.vllm_worker import check_engine_kwargs, chunked_prefill_args

    assert chunked_prefill_args() == {"enable_chunked_prefill": False}  # this is a CPU host
    with caplog.at_level(logging.WARNING):
        check_engine_kwargs(RolloutConfig(engine_kwargs={"enable_chunked_prefill": True}))
    assert "fails on seeded requests" in caplog.text


def test_engine_args_need_the_vllm_backend():
    with pytest.raises(ConfigError, match=r"rollout.engine_kwargs"):
        RolloutConfig(backend="hf", engine_kwargs={"max_model_len": 64})
