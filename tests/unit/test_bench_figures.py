"""The benchmarks' derived figures: model FLOPs, MFU, and the e2e bench's step shares."""

import json

import pytest

from recipe.tools.bench.e2e import phase_shares, trainer_rates
from recipe.tools.bench.flops import ModelFlops, mfu


def _config(tmp_path, **overrides):
    cfg = {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    } | overrides
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_qwen_0_5b_matmul_params_are_its_parameters_without_norms(tmp_path):
    flops = ModelFlops.from_config(_config(tmp_path))
    # Qwen2.5-0.5B has 494,032,768 parameters (tied head); norms and biases are ~0.1M.
    assert flops.matmul_params == pytest.approx(494_032_768, rel=1e-3)
    assert flops.train_flops(1000) == 3 * flops.forward_flops(1000)
    assert flops.forward_flops(10, sum_sq_lengths=100) > flops.forward_flops(10)


def test_mfu_needs_a_known_peak():
    assert mfu(1e12, 1.0, 1e13) == pytest.approx(0.1)
    assert mfu(1e12, 1.0, None) is None


def test_phase_shares_split_each_mode_s_step_time():
    sync_rows = [
        {"timing/step_s": 10.0, "timing/gen_s": 6.0, "timing/old_log_prob_s": 1.0,
         "timing/update_s": 2.0, "throughput/tokens": 100.0},
    ] * 2  # fmt: skip
    shares = phase_shares(sync_rows)
    assert shares == pytest.approx(
        {
            "gen": 0.6,
            "wait": 0.0,
            "old_log_prob": 0.1,
            "update": 0.2,
            "sync": 0.0,
            "save_to_cpu": 0.0,
            "other": 0.1,
        }
    )
    async_rows = [
        {"timing/step_s": 4.0, "trainer/idle_ratio": 0.5, "timing/update_s": 1.0},
        {"timing/step_s": 4.0, "trainer/idle_ratio": 0.25, "timing/update_s": 1.0,
         "timing/sync_s": 1.0, "timing/save_to_cpu_s": 0.5},
    ]  # fmt: skip
    shares = phase_shares(async_rows)
    assert shares["wait"] == pytest.approx(3.0 / 8)
    assert shares["sync"] == pytest.approx(1.0 / 8)
    assert shares["save_to_cpu"] == pytest.approx(0.5 / 8)
    assert shares["other"] == pytest.approx(1 - 3 / 8 - 2 / 8 - 1 / 8 - 0.5 / 8)
    one_step_off = [{"timing/step_s": 2.0, "timing/wait_prev_gen_s": 0.5}]
    assert phase_shares(one_step_off)["wait"] == pytest.approx(0.25)


def test_trainer_rates_count_tokens_over_busy_time(tmp_path):
    flops = ModelFlops.from_config(_config(tmp_path))
    rows = [
        {"throughput/tokens": 1000.0, "timing/old_log_prob_s": 0.5, "timing/update_s": 1.5},
        {"throughput/tokens_per_s": 500.0, "timing/step_s": 2.0, "timing/update_s": 2.0},
    ]
    rates = trainer_rates(rows, flops, peak=1e15)
    assert rates["trainer_tokens_per_s"] == pytest.approx(2000.0 / 4.0)
    assert rates["trainer_mfu"] == pytest.approx(8 * flops.matmul_params * 2000 / 4.0 / 1e15)
    assert trainer_rates([], flops, None)["trainer_tokens_per_s"] is None


def test_the_multiturn_workload_composes_in_every_mode_with_given_keys_winning():
    from recipe.tools.bench.e2e import MODES, bench_config, multiturn_overrides

    overrides = multiturn_overrides({"rollout.response_length": 96})
    assert overrides["rollout.multi_turn.max_turn_tokens"] == 24
    assert (
        multiturn_overrides({"rollout.multi_turn.max_turn_tokens": 7})[
            "rollout.multi_turn.max_turn_tokens"
        ]
        == 7
    )
    for mode in MODES:
        cfg = bench_config(mode, 4, overrides)
        assert cfg.rollout.multi_turn.enable and cfg.rollout.response_length == 96
        assert cfg.rollout.multi_turn.environment == "tool_latency"


def test_the_agent_workload_runs_the_same_episodes_through_the_endpoint():
    from recipe.tools.bench.e2e import MODES, agent_overrides, bench_config, multiturn_overrides

    overrides = agent_overrides({"rollout.response_length": 96})
    episodes = multiturn_overrides({"rollout.response_length": 96})
    assert "rollout.multi_turn.environment" not in overrides
    for key in ("rollout.response_length", "rollout.multi_turn.max_turn_tokens"):
        assert overrides[key] == episodes[key]
    for mode in MODES:
        cfg = bench_config(mode, 4, overrides)
        assert cfg.rollout.multi_turn.endpoint_agent and cfg.rollout.multi_turn.environment is None
        assert cfg.rollout.multi_turn.agent.endswith("tool_latency_agent:run")


@pytest.mark.parametrize(
    ("gpus", "sync", "split"),
    [(1, (1, 1), (1, 1)), (2, (2, 2), (1, 1)), (4, (4, 4), (2, 2)), (3, (3, 3), (1, 2))],
)
def test_equal_gpus_colocate_sync_and_split_the_async_modes(gpus, sync, split):
    from recipe.tools.bench.e2e import MODES, bench_config

    for mode in MODES:
        cfg = bench_config(mode, 4, {}, gpus=gpus)
        trainer_ranks, replicas = cfg.actor.world_size, cfg.rollout.replicas
        assert (trainer_ranks, replicas) == (sync if mode == "sync" else split), mode
    tp = bench_config("fully_async", 4, {"rollout.tensor_parallel_size": 2}, gpus=4)
    assert (tp.actor.world_size, tp.rollout.replicas) == (2, 1)  # one engine on 2 GPUs
    given = bench_config("sync", 4, {"actor.n_gpus_per_node": 1}, gpus=2)
    assert given.actor.world_size == 1  # keys given win


def test_tool_latency_draws_a_long_tail_seeded_per_prompt_and_episode():
    import asyncio

    from recipe.agent.builtin import ToolLatency
    from recipe.protocol import PromptRecord

    async def latencies(uid: str, episodes: int) -> list[list[float]]:
        out = []
        for _ in range(episodes):
            env = ToolLatency(turns=3, short_s=0.0, long_s=0.0, long_p=0.1)
            await env.reset(PromptRecord(uid, "q", "1", "arithmetic"))
            steps = [await env.step("a") for _ in range(3)]
            assert [s.done for s in steps] == [False, False, True]
            out.append([s.info["long"] for s in steps])
        return out

    many = asyncio.run(latencies("bench-uid", 400))
    share = sum(sum(x) for x in many) / (3 * len(many))
    assert 0.05 < share < 0.15  # about one step in ten is long
    ToolLatency._episodes.pop("bench-uid")
    assert asyncio.run(latencies("bench-uid", 400)) == many  # same prompt, same draws
