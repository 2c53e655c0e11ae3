"""``rollout.engine_kwargs``: vLLM engine args passed through, checked at startup."""

from __future__ import annotations

import logging

import pytest

from recipe.utils.config_check import ConfigError
from recipe.workers.config import RolloutConfig


@pytest.mark.model  # imports vLLM
def test_unknown_engine_args_fail_naming_them():
    from recipe.workers.rollout.engine_args import check_engine_kwargs

    cfg = RolloutConfig(engine_kwargs={"max_model_len": 1024, "max_num_batchd_tokens": 8})
    with pytest.raises(ValueError, match=r"no engine args max_num_batchd_tokens \("):
        check_engine_kwargs(cfg)
    ok = RolloutConfig(engine_kwargs={"max_model_len": 1024, "max_num_batched_tokens": 1024})
    assert check_engine_kwargs(ok) == {"max_model_len": 1024, "max_num_batched_tokens": 1024}


@pytest.mark.model  # imports vLLM
def test_chunked_prefill_on_a_cpu_engine_warns_why_it_is_off(caplog):
    from recipe.workers.rollout.engine_args import check_engine_kwargs, chunked_prefill_args

    assert chunked_prefill_args() == {"enable_chunked_prefill": False}  # this is a CPU host
    with caplog.at_level(logging.WARNING):
        check_engine_kwargs(RolloutConfig(engine_kwargs={"enable_chunked_prefill": True}))
    assert "fails on seeded requests" in caplog.text


def test_engine_args_need_the_vllm_backend():
    with pytest.raises(ConfigError, match=r"rollout.engine_kwargs"):
        RolloutConfig(backend="hf", engine_kwargs={"max_model_len": 64})


def test_tensor_parallel_ranks_run_as_processes_of_the_replicas_actor():
    from recipe.workers.rollout.engine_args import parallel_args

    assert parallel_args(RolloutConfig()) == {}
    tp = RolloutConfig(tensor_parallel_size=2)
    assert parallel_args(tp) == {"distributed_executor_backend": "mp"}


@pytest.mark.parametrize(
    ("num_ranks", "cpus", "binding"),
    [
        (2, [0, 1], "0|1"),
        (2, [4, 5, 6, 7, 3], "3,4|5,6"),  # sorted; a core left over stays unbound
        (4, range(8), "0,1|2,3|4,5|6,7"),
        (3, [2], "2|2|2"),  # fewer cores than ranks: they share
        (1, [0, 1], "0,1"),
    ],
)
def test_cpu_ranks_get_disjoint_slices_of_the_allowed_cores(num_ranks, cpus, binding):
    from recipe.workers.rollout.engine_args import cpu_thread_binding

    assert cpu_thread_binding(num_ranks, cpus) == binding


@pytest.mark.model  # imports vLLM
def test_a_cpu_tensor_parallel_engine_binds_its_ranks_unless_the_user_did(monkeypatch):
    import os

    from recipe.workers.rollout.engine_args import CPU_BIND_ENV, prepare_cpu_env

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv(CPU_BIND_ENV, raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    prepare_cpu_env(RolloutConfig(cpu_kv_cache_gib=1.5))
    assert CPU_BIND_ENV not in os.environ and os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
    prepare_cpu_env(RolloutConfig(tensor_parallel_size=2))
    assert os.environ[CPU_BIND_ENV] == "0,1|2,3"
    monkeypatch.setenv(CPU_BIND_ENV, "1|3")
    prepare_cpu_env(RolloutConfig(tensor_parallel_size=2))
    assert os.environ[CPU_BIND_ENV] == "1|3"


def test_an_engine_arg_this_vllm_lacks_is_dropped_unless_it_changes_numerics(caplog):
    from recipe.workers.rollout.engine_args import supported_engine_args

    kwargs = {"model": "m", "logprobs_mode": "raw_logprobs", "disable_log_stats": True}
    with caplog.at_level(logging.WARNING):
        kept = supported_engine_args(kwargs, {"model", "logprobs_mode"})
    assert kept == {"model": "m", "logprobs_mode": "raw_logprobs"}
    assert "disable_log_stats" in caplog.text
    with pytest.raises(RuntimeError, match="no engine args logprobs_mode: without them"):
        supported_engine_args(kwargs, {"model", "disable_log_stats"})
