"""An episode of several linear segments (an agent that edited its history): each segment is
a row of its episode's GRPO group, sharing the episode's reward and advantage, while the
group's baseline stays over episodes. No model, no Ray."""

import contextlib
import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from recipe.algo.advantages import compute_advantages, share_episode_advantages
from recipe.algo.config import AlgorithmConfig
from recipe.checkpoint.codec import decode_groups, decode_trajectory, encode_groups
from recipe.ppo_step import PPOStep
from recipe.protocol import ENV_TOKEN_VERSION, Trajectory, TrajectorySegment
from recipe.run.metrics import staleness_metrics
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.micro_batches import device_micro_batches, token_budget_plan

PAD = 99


def _segment(prompt: list[int], response: list[int], *, version: int = 0) -> TrajectorySegment:
    """Model tokens except the second one (an observation); log-probs -0.1 * (k + 1)."""
    mask = [0 if k == 1 else 1 for k in range(len(response))]
    return TrajectorySegment(
        prompt_ids=prompt,
        response_ids=response,
        rollout_logprobs=[-0.1 * (k + 1) if m else 0.0 for k, m in enumerate(mask)],
        token_versions=[version if m else ENV_TOKEN_VERSION for m in mask],
        loss_mask=mask,
    )


def _episode(
    uid: str,
    index: int,
    reward: float,
    segments: list[TrajectorySegment] | None = None,
    *,
    finish_reason: str = "stop",
    version: int = 0,
) -> Trajectory:
    response = [10 + index, 11 + index, 12 + index]
    return Trajectory(
        prompt_uid=uid,
        sample_index=index,
        prompt_ids=[1, 2],
        response_ids=response,
        rollout_logprobs=[-1.0, -2.0, -3.0],
        token_versions=[version] * 3,
        finish_reason=finish_reason,
        reward=reward,
        loss_mask=[1, 1, 1],
        segments=segments or [],
    )


def _trajs() -> list[Trajectory]:
    """Group a: episode 0 (2 segments, the second the longest row), episode 1 (none);
    group b: episode 2 (1 segment). Rows: e0 e0.s0 e0.s1 e1 e2 e2.s0."""
    e0 = _episode("a", 0, 1.0, [_segment([3], [20, 21]), _segment([4, 5, 6], [22, 23, 24, 25])])
    e1 = _episode("a", 1, 0.0)
    e2 = _episode("b", 0, 0.5, [_segment([7, 8], [26, 27, 28])])
    return [e0, e1, e2]


def _trainer(estimator: str = "grpo") -> SimpleNamespace:
    """What ``PPOStep.advantages`` reads of its step."""
    tracer = SimpleNamespace(span=lambda *args, **kwargs: contextlib.nullcontext())
    cfg = SimpleNamespace(algorithm=AlgorithmConfig(adv_estimator=estimator))
    return SimpleNamespace(cfg=cfg, tracer=tracer)


def _advantages_b(batch: TrainBatch, estimator: str = "grpo") -> torch.Tensor:
    """Per-row advantage the trainer gives ``batch`` (read off its first response column)."""
    out = PPOStep.advantages(_trainer(estimator), batch)
    assert out.advantages_bt is not None
    first_b = out.response_mask_bt.float().argmax(dim=1)
    return out.advantages_bt.gather(1, first_b[:, None]).squeeze(1)


# ---- packing --------------------------------------------------------------------------------


def test_segments_are_rows_right_after_their_episode_with_tokens_masks_and_logprobs_in_place():
    trajs = _trajs()
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=PAD)
    assert batch.batch_size == 6
    assert batch.seq_len == 3 + 4  # the longest row is a segment
    seg = trajs[0].segments[1]
    assert batch.input_ids_bt[2].tolist() == seg.prompt_ids + seg.response_ids
    assert batch.input_ids_bt[1].tolist() == [3, 20, 21] + [PAD] * 4
    assert batch.attention_mask_bt[1].tolist() == [1, 1, 1, 0, 0, 0, 0]
    # column t scores token t: the segment's response starts after its own prompt
    assert batch.response_mask_bt[2].tolist() == [False] * 3 + [True, False, True, True]
    torch.testing.assert_close(
        batch.rollout_logprobs_bt[2], torch.tensor([0.0] * 3 + seg.rollout_logprobs)
    )
    assert batch.input_ids_bt[0].tolist()[:5] == trajs[0].prompt_ids + trajs[0].response_ids
    assert batch.input_ids_bt[5].tolist()[:5] == [7, 8, 26, 27, 28]
    assert batch.group_index_b.tolist() == [0, 0, 0, 0, 1, 1]
    assert batch.episode_b is not None and batch.episode_b.tolist() == [0, 0, 0, 1, 2, 2]
    assert batch.counted_b is not None
    assert batch.counted_b.tolist() == [True, False, False, True, True, False]
    assert batch.rewards_b.tolist() == [1.0, 1.0, 1.0, 0.0, 0.5, 0.5]


def test_without_segments_a_batch_has_no_episode_ids():
    trajs = [dataclasses.replace(t, segments=[]) for t in _trajs()]
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=PAD)
    assert batch.batch_size == 3
    assert batch.episode_b is None and batch.counted_b is None


def test_episode_ids_follow_their_rows_through_select_shards_and_micro_batches():
    batch = TrainBatch.from_trajectories(_trajs(), pad_token_id=PAD)
    picked = batch.select([5, 0, 2])
    assert picked.episode_b is not None and picked.episode_b.tolist() == [2, 0, 0]
    assert picked.counted_b is not None and picked.counted_b.tolist() == [False, True, False]
    # an episode's segments shard and split with their group
    assert batch.shard_rows(0, 2) == [0, 1, 2, 3]
    assert batch.shard_rows(1, 2) == [4, 5]
    split = batch.split_groups(1)
    assert [b.episode_b.tolist() for b in split if b.episode_b is not None] == [
        [0, 0, 0, 1],
        [2, 2],
    ]
    lengths = batch.attention_mask_bt.sum(dim=1).tolist()
    plan = token_budget_plan(lengths, max_tokens=10)
    micro = device_micro_batches(batch, plan, lengths, torch.device("cpu"))
    for rows, mb in micro:
        assert mb.episode_b is not None
        assert mb.episode_b.tolist() == [[0, 0, 0, 1, 2, 2][r] for r in rows]


# ---- advantages -----------------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_every_segment_takes_its_episode_advantage_and_the_baseline_is_over_episodes(estimator):
    """An episode with 3 segments weighs once in its group's mean and std."""
    many = [_segment([3], [20, 21, 22]) for _ in range(3)]
    trajs = [_episode("a", 0, 1.0, many), _episode("a", 1, 0.0), _episode("a", 2, 0.0)]
    adv_b = _advantages_b(TrainBatch.from_trajectories(trajs, pad_token_id=PAD), estimator)
    plain = [dataclasses.replace(t, segments=[]) for t in trajs]
    expected_e = _advantages_b(TrainBatch.from_trajectories(plain, pad_token_id=PAD), estimator)
    assert expected_e[0] > 0
    torch.testing.assert_close(adv_b, expected_e[[0, 0, 0, 0, 1, 2]])


def test_advantages_reach_every_trained_token_of_a_segment_and_no_other():
    batch = TrainBatch.from_trajectories(_trajs(), pad_token_id=PAD)
    out = PPOStep.advantages(_trainer(), batch)
    assert out.advantages_bt is not None
    adv0 = float(out.advantages_bt[0, 2])
    assert adv0 > 0
    assert out.advantages_bt[2].tolist() == pytest.approx([0.0] * 3 + [adv0, 0.0, adv0, adv0])


def test_share_episode_advantages_reads_the_primary_row_in_any_order():
    adv_b = torch.tensor([0.0, 0.7, 0.0, -0.3, 0.0])
    episode_b = torch.tensor([9, 9, 4, 4, 6])  # ids as a select leaves them: sparse, unsorted
    primary_b = torch.tensor([False, True, False, True, False])  # episode 6: none (env_error)
    shared = share_episode_advantages(adv_b, episode_b, primary_b)
    torch.testing.assert_close(shared, torch.tensor([0.7, 0.7, -0.3, -0.3, 0.0]))
    assert share_episode_advantages(adv_b, None, primary_b) is adv_b
    with pytest.raises(AssertionError, match="more than one counted row"):
        share_episode_advantages(adv_b, episode_b, torch.ones(5, dtype=torch.bool))


def test_an_env_error_episode_trains_none_of_its_segments_and_stays_out_of_the_baseline():
    segments = [_segment([3], [20, 21]), _segment([4], [22, 23])]
    trajs = [
        _episode("a", 0, 0.0, segments, finish_reason="env_error"),
        _episode("a", 1, 1.0),
        _episode("a", 2, 0.0),
    ]
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=PAD)
    assert batch.response_mask_bt.sum(dim=1).tolist() == [0, 0, 0, 3, 3]
    assert batch.counted_b is not None
    assert batch.counted_b.tolist() == [False, False, False, True, True]
    out = PPOStep.advantages(_trainer(), batch)
    assert out.advantages_bt is not None
    assert out.advantages_bt[:3].abs().sum() == 0
    two = compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), AlgorithmConfig())
    torch.testing.assert_close(out.advantages_bt[3:, 2], two)


# ---- versions, codec, validation ------------------------------------------------------------


def test_versions_cover_every_segment_and_staleness_sees_the_oldest_token():
    old = _segment([3], [20, 21, 22], version=2)
    traj = _episode("a", 0, 1.0, [old], version=5)
    assert (traj.min_version, traj.max_version) == (2, 5)
    assert sorted(set(traj.model_versions)) == [2, 5]  # observation tokens left out
    assert traj.num_response_tokens == 3  # the last segment's own
    assert traj.num_episode_tokens == (2 + 3) + (1 + 3)
    metrics = staleness_metrics([traj], trainer_version=6)
    assert metrics["staleness/max"] == 4.0
    assert metrics["partial/max_span"] == 3.0


def test_partial_and_single_version_responses_report_their_rewards_apart():
    cut = _episode("a", 0, 1.0, [_segment([3], [20, 21, 22], version=2)], version=3)
    whole = [_episode("b", 1, 0.0, version=3), _episode("c", 2, 0.5, version=2)]
    metrics = staleness_metrics([cut, *whole], trainer_version=3)
    assert metrics["partial/reward_mean"] == 1.0
    assert metrics["partial/whole_reward_mean"] == 0.25
    assert metrics["partial/response_length_mean"] == cut.num_response_tokens
    # A step that trained only one kind has no split (not a mean over nothing written as 0).
    assert "partial/reward_mean" not in staleness_metrics(whole, trainer_version=3)
    assert "partial/whole_reward_mean" not in staleness_metrics([cut], trainer_version=3)


def test_trajectories_with_segments_round_trip_exactly_through_json():
    groups = [_trajs()[:2], _trajs()[2:]]
    groups[0][0].segments[0].rollout_logprobs[0] = -0.1234567890123456
    back = decode_groups(json.loads(json.dumps(encode_groups(groups))))
    assert back == groups
    assert isinstance(back[0][0].segments[1], TrajectorySegment)


def test_a_checkpoint_from_before_segments_decodes_with_none():
    data = dataclasses.asdict(_episode("a", 0, 1.0))
    del data["segments"]
    assert decode_trajectory(data).segments == []


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"rollout_logprobs": [0.0]}, "2 response_ids, 1 rollout_logprobs and 2 token_versions"),
        ({"token_versions": [0, 0, 0]}, "2 response_ids, 2 rollout_logprobs and 3 token_versions"),
        ({"loss_mask": [1]}, "loss_mask has 1 entries for 2 response tokens"),
    ],
)
def test_a_segment_whose_lengths_differ_is_refused(fields, named):
    values = {
        "prompt_ids": [1],
        "response_ids": [5, 6],
        "rollout_logprobs": [-0.5, 0.0],
        "token_versions": [0, ENV_TOKEN_VERSION],
        "loss_mask": [1, 0],
    }
    with pytest.raises(ValueError, match=f"trajectory segment: {named}"):
        TrajectorySegment(**(values | fields))


def test_a_segment_that_is_no_trajectory_segment_is_refused_naming_the_prompt():
    raw = dataclasses.asdict(_segment([3], [20, 21]))
    with pytest.raises(TypeError, match="'a': segments must be TrajectorySegment"):
        dataclasses.replace(_episode("a", 0, 1.0), segments=[raw])
